#!/usr/bin/env bash
# The device script: on a GPU machine, build (or use a carried build), run every GPU test (C++, the
# dead-peer test, Python with torch where it is installed) and the bench, and end with a short table. Logs and the bench JSON go to $OUT (or ./device-out).
#
#   scripts/device_check.sh [--kind NAME] [--commit SHA] [--tests FILTER] [--bench "ARGS"] [--no-sanitizers]
#
# Defaults: every GPU test, the bench with --ht-tune --ll-tune, and the sanitizers. --tests takes a
# gtest filter and --bench the bench's arguments (for a quicker look at one part).
#
# NCCL: the device API needs the NCCL library at run time to be the version epx was compiled against
# (2.28.9). Where PyTorch's nvidia-nccl wheel is installed, its lib/ is put first on LD_LIBRARY_PATH.
set -uo pipefail
cd "$(dirname "$0")/.."

kind="" commit="${EPX_COMMIT:-unknown}" tests="*" bench_args="--ht-tune --ll-tune" sanitizers=1
while [ $# -gt 0 ]; do
  case "$1" in
    --kind) kind="$2"; shift 2 ;;
    --commit) commit="$2"; shift 2 ;;
    --tests) tests="$2"; shift 2 ;;
    --bench) bench_args="$2"; shift 2 ;;
    --no-sanitizers) sanitizers=0; shift ;;
    *) echo "usage: $0 [--kind NAME] [--commit SHA] [--tests FILTER] [--bench \"ARGS\"] [--no-sanitizers]" >&2; exit 2 ;;
  esac
done
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
build="${EPX_BUILD_DIR:-build}"

export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared machines
wheel_lib=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null || true)
if [ -n "$wheel_lib" ] && [ -d "$wheel_lib" ]; then
  export LD_LIBRARY_PATH="$wheel_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

{
  echo "== machine"
  nvidia-smi -L
  nvidia-smi topo -m 2>/dev/null | head -12
  echo "NCCL wheel lib: ${wheel_lib:-none}"
} 2>&1 | tee "$out/machine.txt"

if [ ! -x "$build/tests/epx_gpu_tests" ] || [ ! -x "$build/tests/epx_dead_peer_test" ] || [ ! -x "$build/bench/epx-bench" ]; then
  echo "== building in $build"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${wheel_lib:+-DNCCL_ROOT="$(dirname "$wheel_lib")"} >"$out/build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
ldd "$build/tests/epx_gpu_tests" | grep -E "nccl|cudart" | tee -a "$out/machine.txt"

echo "== GPU tests"
start=$(date +%s)
"$build/tests/epx_gpu_tests" --gtest_filter="$tests" 2>&1 | tee "$out/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
tests_s=$(( $(date +%s) - start ))

echo "== single-GPU teams on one hardware queue"
# Every stream of the process shares one hardware queue: a call that left a kernel queued behind a
# kernel waiting for peers would block the other ranks' launches (the HT single-GPU timeouts of 2026-11).
start=$(date +%s)
CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 150 "$build/tests/epx_gpu_tests" --gtest_repeat=2 \
  --gtest_filter='Cases/HtExchange.*SingleGpu*:Cases/LlExchange.*SingleGpu*' >"$out/one-queue.log" 2>&1
one_queue_rc=$?
one_queue_s=$(( $(date +%s) - start ))
one_queue="exit $one_queue_rc; $(grep -c '^\[       OK' "$out/one-queue.log") passed on rank 0, $(grep -c 'timed out' "$out/one-queue.log") timeouts on all ranks (2 repeats); ${one_queue_s}s"
echo "$one_queue"

echo "== dead-peer test"
start=$(date +%s)
timeout 300 "$build/tests/epx_dead_peer_test" >"$out/dead-peer.log" 2>&1
dead_peer_rc=$?
dead_peer_s=$(( $(date +%s) - start ))
tail -5 "$out/dead-peer.log"

echo "== Python GPU tests"
python_summary="not run: no torch"
if python3 -c "import torch" 2>/dev/null; then
  # From another directory, so that `import epx` finds the source tree only through PYTHONPATH.
  repo=$PWD library="$(cd "$build" && pwd)/src/libepx.so"
  (cd "$(mktemp -d)" && EPX_LIBRARY="$library" PYTHONPATH="$repo/python" timeout 300 \
    python3 -m pytest -q -rs -p no:cacheprovider "$repo/tests/python") >"$out/pytest.log" 2>&1
  python_rc=$?
  python_summary="$(tail -1 "$out/pytest.log"); exit $python_rc"
  tail -15 "$out/pytest.log"
fi

echo "== bench"
# shellcheck disable=SC2086  # bench_args is a list of arguments
"$build/bench/epx-bench" $bench_args --json "$out/bench.json" ${kind:+--device-kind "$kind"} --commit "$commit" 2>&1 |
  tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}

echo "== compute-sanitizer (small shapes)"
small='Cases/HtExchange.MatchesReference/SingleGpu2_Uniform:Cases/HtExchange.MatchesReference/SingleGpu4_Zipf_Fp8_Int32:Cases/HtExchange.MatchesReference/World_Zipf_Aligned4:TransportTimeout.*'
small+=':Cases/LlExchange.MatchesReference/SingleGpu2_Zipf_Ue8m0_ColumnMajorScales_Int32:Cases/LlExchange.MatchesReference/World_SmallerThanBuffer_Ue8m0:LlErrors.*'
small+=':LlMask.*'
: >"$out/sanitizers.txt"
[ "$sanitizers" -eq 1 ] && for tool in memcheck racecheck; do
  EPX_TEST_TIMEOUT_SCALE=10 timeout 300 compute-sanitizer --tool "$tool" --report-api-errors no --target-processes all \
    "$build/tests/epx_gpu_tests" --gtest_filter="$small" >"$out/$tool.log" 2>&1
  echo "$tool: exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | sort | uniq -c | tr -s ' ' | paste -sd ';')"
done | tee "$out/sanitizers.txt"

passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$out/gpu-tests.log" | grep -oE '[0-9]+$' | tail -1)
skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+' "$out/gpu-tests.log" | grep -oE '[0-9]+$' | tail -1)
failed=$(grep -oE '^\[  FAILED  \] [0-9]+' "$out/gpu-tests.log" | grep -oE '[0-9]+$' | tail -1)
echo
echo "== summary ($(date -u +%Y-%m-%d), commit $commit, ${kind:-unnamed device})"
printf '%-28s %s\n' "GPU tests (rank 0)" "passed ${passed:-0}, failed ${failed:-0}, skipped ${skipped:-0}; exit $tests_rc; ${tests_s}s"
printf '%-28s %s\n' "one hardware queue" "$one_queue"
printf '%-28s %s\n' "dead-peer test" "exit $dead_peer_rc (0 passed, 77 skipped); ${dead_peer_s}s"
printf '%-28s %s\n' "Python tests" "$python_summary"
printf '%-28s %s\n' "bench" "exit $bench_rc; $out/bench.json"
sed 's/^/sanitizer                    /' "$out/sanitizers.txt"
[ "$tests_rc" -eq 0 ] && [ "$one_queue_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "${python_rc:-0}" -eq 0 ] &&
  { [ "$dead_peer_rc" -eq 0 ] || [ "$dead_peer_rc" -eq 77 ]; }
