#!/usr/bin/env bash
# Builds epx and runs every test: the CPU tests, and the GPU tests where a GPU is visible (elsewhere
# they are reported as skipped). Usage: scripts/test.sh [build-dir]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
bash scripts/install_deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
