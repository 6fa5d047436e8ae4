#!/usr/bin/env bash
# CI's Python step: `pip install .` into a fresh virtual environment (building libepx from source, as a
# user's install does), then the Python tests. On a machine without GPUs the GPU tests report
# "skipped: no GPU"; the CPU tests run: import and library loading without a GPU (and without
# torch), the C ABI's struct layouts and errors, size hints, DeepEP's signatures, and the argument checks
# that fail before any GPU work. torch is not installed here (PyPI's wheel pulls gigabytes of CUDA
# libraries): the tests that need torch report "skipped: needs torch" and run where torch is (the GPU
# machines).
# Usage: tests/python/run_ci.sh [venv-dir]   (default: a new temporary directory)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-$(mktemp -d)/venv}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q pytest numpy
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/python" -m pip install -q .
cd "$(mktemp -d)"  # run from elsewhere, so that `import epx` can only find the installed package
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs "$OLDPWD/tests/python"
