#!/usr/bin/env bash
# Session 38 device call 13 (nvidia-h200-x2): phase traces of the LL kernels at EP=2 (a -DEPX_PHASE_TRACE=ON build).
set -u
cd "$(dirname "$0")/.."
source scripts/nccl_env.sh >/dev/null
export NCCL_NVLS_ENABLE=0
cd "$OUT" && timeout 60 "$OLDPWD/build-trace/bench/epx-bench" --skip-ht --trace > trace.txt 2>&1
echo "exit $?"; grep -n -i -A40 'trace' trace.txt | head -90
