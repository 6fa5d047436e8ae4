#!/usr/bin/env bash
# The main job: builds epx and runs epx-bench on every local GPU (one process each) with the default
# DeepSeek-V3-like shapes, every result checked against the CPU reference, next to the NVLink limits
# measured in the same run. Writes epx-bench.json (or the file given with --json).
# Usage: scripts/bench.sh [epx-bench arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${EPX_BUILD_DIR:-build}"
bash scripts/install_deps.sh
export NCCL_NVLS_ENABLE=0  # epx never uses NVLink multicast
# NCCL's device API needs the run-time library to match the compile-time one: prefer PyTorch's wheel.
wheel=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null || true)
if [ -n "$wheel" ] && [ -f "$wheel/include/nccl_device.h" ]; then
  export NCCL_ROOT="${NCCL_ROOT:-$wheel}"
  export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [ -n "$wheel" ]; then
  export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DEPX_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target epx-bench
exec "$build/bench/epx-bench" "$@"
