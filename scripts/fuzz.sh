#!/usr/bin/env bash
# Builds the libFuzzer target over the host-side checks and sizing (tests/fuzz/) with clang's
# address and undefined-behaviour sanitizers, and runs it for a bounded time.
# Usage: scripts/fuzz.sh [seconds]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev >/dev/null ||
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
  else
    echo "fuzz: clang with libFuzzer is not installed and cannot be installed here; skipping" >&2
    exit 0
  fi
fi
cuda_include="${CUDA_HOME:-/usr/local/cuda}/include"
out=build-fuzz
mkdir -p "$out/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I include -I src -I tests -I "$cuda_include" \
  tests/fuzz/host_inputs_fuzzer.cpp src/core/validate.cpp src/core/ht_areas.cpp src/core/ll_areas.cpp \
  src/core/tensor.cpp src/core/error.cpp \
  -o "$out/host_inputs_fuzzer"
"$out/host_inputs_fuzzer" -max_total_time="$seconds" -print_final_stats=1 "$out/corpus" 2>&1 | tail -n 12
echo "fuzz: no crash in $seconds s"
