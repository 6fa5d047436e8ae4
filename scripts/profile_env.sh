# Sourced by the profiling scripts (profile_two_gpus.sh, profile_one_gpu.sh), from the repository root: $out
# (where the reports go: $OUT, or ./device-out) and $build (the build profiled: $EPX_BUILD_DIR, or build),
# checks that the bench is built and ncu is there, and sets up NCCL as every GPU script does.
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
build="${EPX_BUILD_DIR:-build}"
[ -x "$build/bench/epx-bench" ] || { echo "no $build/bench/epx-bench: build first" >&2; exit 1; }
command -v ncu >/dev/null || { echo "ncu is not on PATH" >&2; exit 1; }
source scripts/nccl_env.sh
