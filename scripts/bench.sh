#!/usr/bin/env bash
# The main job: builds epx and runs epx-bench on every local GPU (one process each) with the default
# DeepSeek-V3-like shapes, every result checked against the CPU reference, next to the NVLink limits
# measured in the same run. Writes epx-bench.json (or the file given with --json).
# Usage: scripts/bench.sh [epx-bench arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${EPX_BUILD_DIR:-build}"
bash scripts/install_deps.sh
source scripts/nccl_env.sh
# Compile against the wheel's NCCL too where it has the device API's headers: then both match.
if [ -n "$nccl_wheel" ] && [ -f "$nccl_wheel/include/nccl_device.h" ]; then
  export NCCL_ROOT="${NCCL_ROOT:-$nccl_wheel}"
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DEPX_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target epx-bench
exec "$build/bench/epx-bench" "$@"
