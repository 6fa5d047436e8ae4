#!/usr/bin/env bash
# Compiles the kernels of the build-time experiments (CMakeLists.txt options that are off by default:
# EPX_LL_BULK_LINES), so that a change that breaks one fails CI instead of the next GPU session.
# Usage: scripts/compile_experiments.sh [build-dir]   (default: build-experiments)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-experiments}"
cmake -S . -B "$build" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DEPX_BUILD_TESTS=OFF -DEPX_BUILD_BENCH=OFF \
  -DEPX_LL_BULK_LINES=ON >/dev/null
make -C "$build/src" -j "$(nproc)" kernels/ll/dispatch.cu.o kernels/ll/combine.cu.o
