#!/usr/bin/env bash
# The device script: on a GPU machine, build (or use a carried build), run the bench and every GPU test
# (C++, the dead-peer test, Python with torch where it is installed), and end with a short table. Logs
# and the bench JSON go to $OUT (or ./device-out); the logs' machine paths are replaced (<site-packages>,
# <out>, <repo>), as they are committed under bench/results.
#
#   scripts/device_check.sh [--kind NAME] [--commit SHA] [--tests FILTER] [--bench "ARGS"] [--no-bench]
#                           [--no-sanitizers] [--only-sanitizers] [--sanitizer-tests FILTER] [--pack]
#
# Defaults: every GPU test, the bench with --ht-tune --ll-tune, and the sanitizers.
#   --tests        a gtest filter; --bench the bench's arguments (a quicker look at one part)
#   --no-bench     the tests alone (on a machine whose bench already ran)
#   --only-sanitizers  the sanitizers alone (they take minutes: a call of their own where time is limited)
#   --sanitizer-tests  the gtest filter the sanitizers run (default: the small-shape filter below)
#   --pack         leaves only bench.json, summary.txt and logs.tar.gz (every log) in the output
#                  folder, for machines that return few files
#
# NCCL: see scripts/nccl_env.sh (the wheel's library at run time; a build made here compiles against it).
set -uo pipefail
cd "$(dirname "$0")/.."

kind="" commit="${EPX_COMMIT:-unknown}" tests="*" bench_args="--ht-tune --ll-tune" run_bench=1 sanitizers=1 only_sanitizers=0 pack=0
sanitizer_tests=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kind) kind="$2"; shift 2 ;;
    --commit) commit="$2"; shift 2 ;;
    --tests) tests="$2"; shift 2 ;;
    --bench) bench_args="$2"; shift 2 ;;
    --no-bench) run_bench=0; shift ;;
    --no-sanitizers) sanitizers=0; shift ;;
    --only-sanitizers) only_sanitizers=1; shift ;;
    --sanitizer-tests) sanitizer_tests="$2"; shift 2 ;;
    --pack) pack=1; shift ;;
    *) echo "usage: $0 [--kind NAME] [--commit SHA] [--tests FILTER] [--bench \"ARGS\"] [--no-bench] [--no-sanitizers] [--only-sanitizers] [--sanitizer-tests FILTER] [--pack]" >&2; exit 2 ;;
  esac
done
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
build="${EPX_BUILD_DIR:-build}"

source scripts/nccl_env.sh

{
  echo "== machine"
  nvidia-smi -L
  nvidia-smi topo -m 2>/dev/null | head -12
  echo "NCCL wheel: ${nccl_wheel:-none}"
} 2>&1 | tee "$out/machine.txt"

if [ ! -x "$build/tests/epx_gpu_tests" ] || [ ! -x "$build/tests/epx_dead_peer_test" ] || [ ! -x "$build/bench/epx-bench" ]; then
  echo "== building in $build"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${nccl_wheel:+-DNCCL_ROOT="$nccl_wheel"} >"$out/build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
ldd "$build/tests/epx_gpu_tests" | grep -E "nccl|cudart" | tee -a "$out/machine.txt"

# Each step sets its exit status (rc_*) and one line for the summary (line_*); a step not run keeps "not run".
rc_tests=0 rc_one_queue=0 rc_dead_peer=0 rc_python=0 rc_bench=0
line_tests="not run" line_one_queue="not run" line_dead_peer="not run" line_python="not run" line_bench="not run"

gpu_tests() {
  echo "== GPU tests"
  local start=$(date +%s)
  "$build/tests/epx_gpu_tests" --gtest_filter="$tests" 2>&1 | tee "$out/gpu-tests.log"
  rc_tests=${PIPESTATUS[0]}
  local passed skipped failed
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$out/gpu-tests.log" | grep -oE '[0-9]+$' | tail -1)
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+' "$out/gpu-tests.log" | grep -oE '[0-9]+$' | tail -1)
  failed=$(grep -oE '^\[  FAILED  \] [0-9]+' "$out/gpu-tests.log" | grep -oE '[0-9]+$' | tail -1)
  line_tests="passed ${passed:-0}, failed ${failed:-0}, skipped ${skipped:-0}; exit $rc_tests; $(( $(date +%s) - start ))s"
}

# Every stream of the process shares one hardware queue: a call that left a kernel queued behind a
# kernel waiting for peers would block the other ranks' launches (the HT single-GPU timeouts of 2026-11).
# The 33-rank team is left out: on one queue its first dispatch timed out in one of two repeats at
# aa0251f (2026-11-22; the waits saw ranks whose kernels had not started; 3 of 3 passed at 8ea0788). The
# cause is not established; without the one-queue setting it passed every run since 8ea0788.
one_queue() {
  echo "== single-GPU teams on one hardware queue"
  local start=$(date +%s)
  CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 300 "$build/tests/epx_gpu_tests" --gtest_repeat=2 \
    --gtest_filter='Cases/HtExchange.*SingleGpu*:Cases/LlExchange.*SingleGpu*:Teams/LlModes.*SingleGpu*:LlMask.*-*SingleGpu33*:LlMask.World*' \
    >"$out/one-queue.log" 2>&1
  rc_one_queue=$?
  line_one_queue="exit $rc_one_queue; $(grep -c '^\[       OK' "$out/one-queue.log") passed on rank 0, $(grep -c 'timed out' "$out/one-queue.log") timeouts on all ranks (2 repeats); $(( $(date +%s) - start ))s"
  echo "$line_one_queue"
}

dead_peer() {
  echo "== dead-peer test"
  local start=$(date +%s)
  timeout 300 "$build/tests/epx_dead_peer_test" >"$out/dead-peer.log" 2>&1
  rc_dead_peer=$?
  local verdict
  verdict=$(grep -E '^dead-peer test: ' "$out/dead-peer.log" | tail -1)
  line_dead_peer="exit $rc_dead_peer (0: passed, 77: skipped); ${verdict:-no verdict line}; $(( $(date +%s) - start ))s"
  [ "$rc_dead_peer" -eq 77 ] && rc_dead_peer=0
  tail -5 "$out/dead-peer.log"
}

python_tests() {
  echo "== Python GPU tests"
  line_python="not run: no torch"
  python3 -c "import torch" 2>/dev/null || return 0
  # From another directory, so that `import epx` finds the source tree only through PYTHONPATH.
  local repo=$PWD library
  library="$(cd "$build" && pwd)/src/libepx.so"
  (cd "$(mktemp -d)" && EPX_LIBRARY="$library" PYTHONPATH="$repo/python" timeout 300 \
    python3 -m pytest -q -rs -p no:cacheprovider "$repo/tests/python") >"$out/pytest.log" 2>&1
  rc_python=$?
  line_python="$(tail -1 "$out/pytest.log"); exit $rc_python"
  tail -15 "$out/pytest.log"
}

bench() {
  echo "== bench"
  # shellcheck disable=SC2086  # bench_args is a list of arguments
  "$build/bench/epx-bench" $bench_args --json "$out/bench.json" ${kind:+--device-kind "$kind"} --commit "$commit" 2>&1 |
    tee "$out/bench.log"
  rc_bench=${PIPESTATUS[0]}
  line_bench="exit $rc_bench; bench.json"
}

# Small shapes, every kernel: HT on single-GPU teams and the world team, LL and its rank masking on the
# world team and on single-GPU teams (FP8 rows of 640 columns: a partial send item of lines), the layout
# kernel, the timeout paths. Single-GPU teams get ten
# times the wait timeout: under the tools their ranks' kernels, sharing one GPU, run many times slower.
# LL exchanges between live ranks of one GPU timed out under the tools until the tests submitted each
# call together (tests/gpu/single_gpu_ranks.hpp): a rank's kernel started only after another rank's
# wait for it had expired. Since then memcheck passed three of them (2026-11-22, a5ece11).
# Reported, not part of the exit status (a sanitizer's exit status also counts test failures under
# its slowdown).
sanitizers_run() {
  echo "== compute-sanitizer (small shapes)"
  local small="$sanitizer_tests"
  if [ -z "$small" ]; then
    small='Cases/HtExchange.MatchesReference/SingleGpu2_Uniform:Cases/HtExchange.MatchesReference/SingleGpu4_Zipf_Fp8_Int32'
    small+=':Cases/HtExchange.MatchesReference/World_Zipf_Aligned4_TwoBiases:TransportTimeout.*:HtTimeout.*'
    small+=':Cases/HtLayoutTest.MatchesReference/OneTokenIntoTheSecondTile:Cases/HtLayoutTest.MatchesReference/NineSlots_Int32'
    small+=':Cases/LlExchange.MatchesReference/World_SmallerThanBuffer_Ue8m0'
    small+=':Cases/LlExchange.MatchesReference/World_RepeatedExperts_Fp8RoundScale_ColumnMajorScales'
    small+=':LlTimeout.*:LlMask.WorldRanksMaskEachOtherThenRejoin'
    small+=':Cases/LlExchange.MatchesReference/SingleGpu2_Uniform_Fp8:LlMask.SingleGpuRanksMaskEachOtherThenRejoin'
    small+=':Cases/LlExchange.MatchesReference/SingleGpu4_OneToken_ExpertsEqualRanks'
    small+=':Cases/LlExchange.MatchesReference/SingleGpu2_Hidden640_Fp8'
    small+=':Cases/LlExchange.MatchesReference/SingleGpu2_OneToken_ExpertsEqualRanks'
  fi
  # synccheck (barriers and warp collectives with a wrong mask or reached by part of a block) and initcheck
  # (reads of device memory nothing wrote: the protocols' polled words start zeroed) ran first on
  # 2026-11-29 (session 36): 0 errors on the single-GPU part of this set, in 14 and 68 s. initcheck runs
  # the single-GPU tests only: with two processes (2026-11-29, compute-sanitizer 2025.3.1, NCCL 2.28.9)
  # NCCL's own launch inside ncclCommWindowRegister fails under it ("unspecified launch failure", 0 errors
  # reported), before any epx kernel; memcheck, racecheck and synccheck pass the same world tests.
  for tool in memcheck racecheck synccheck initcheck; do
    local filter="$small"
    if [ "$tool" = initcheck ]; then
      case "$small" in *-*) filter="$small:*World*" ;; *) filter="$small:-*World*" ;; esac  # gtest: one '-' part
    fi
    EPX_TEST_TIMEOUT_SCALE=10 timeout 300 compute-sanitizer --tool "$tool" --report-api-errors no --target-processes all \
      "$build/tests/epx_gpu_tests" --gtest_filter="$filter" >"$out/$tool.log" 2>&1
    echo "$tool: exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | sort | uniq -c | tr -s ' ' | paste -sd ';'); failed tests: $(grep -cE '^\[  FAILED  \] [A-Z]' "$out/$tool.log")"
  done | tee "$out/sanitizers.txt"
}

# Machine paths out of every log (they are committed under bench/results): the Python packages' folder becomes
# <site-packages>, the output folder <out>, this tree's path (absolute, or relative as pytest prints it) <repo>.
strip_machine_paths() {
  local tree outdir f
  tree="$(printf '%s' "${PWD#/}" | sed 's/[].[*^$()+?{}|]/\\&/g')"
  outdir="$(cd "$out" && pwd | sed 's/[].[*^$()+?{}|]/\\&/g')"
  for f in "$out"/*.txt "$out"/*.log; do
    [ -f "$f" ] || continue
    sed -i -E -e "s#$outdir([^A-Za-z0-9_.+-]|\$)#<out>\1#g" -e "s#[^ \"'(=]*/site-packages#<site-packages>#g" \
      -e "s#(/|(\.\./)+)$tree([^A-Za-z0-9_.+-]|\$)#<repo>\3#g" "$f"
  done
}

: >"$out/sanitizers.txt"
# The bench first: it is the main job, and on a machine with a time limit its numbers come back even
# when a later step runs out of time.
if [ "$only_sanitizers" -eq 0 ]; then
  [ "$run_bench" -eq 1 ] && bench
  gpu_tests
  one_queue
  dead_peer
  python_tests
fi
[ "$sanitizers" -eq 1 ] && sanitizers_run

{
  echo "== summary ($(date -u +%Y-%m-%d), commit $commit, ${kind:-unnamed device})"
  printf '%-28s %s\n' "GPU tests (rank 0)" "$line_tests"
  printf '%-28s %s\n' "one hardware queue" "$line_one_queue"
  printf '%-28s %s\n' "dead-peer test" "$line_dead_peer"
  printf '%-28s %s\n' "Python tests" "$line_python"
  printf '%-28s %s\n' "bench" "$line_bench"
  sed 's/^/sanitizer                    /' "$out/sanitizers.txt"
} >"$out/summary.txt"
echo
cat "$out/summary.txt"
strip_machine_paths
if [ "$pack" -eq 1 ]; then
  (cd "$out" && find . -maxdepth 1 -type f ! -name bench.json ! -name summary.txt ! -name logs.tar.gz -printf '%P\n' |
    tar czf logs.tar.gz -T - --remove-files)
fi
[ "$rc_tests" -eq 0 ] && [ "$rc_one_queue" -eq 0 ] && [ "$rc_dead_peer" -eq 0 ] && [ "$rc_python" -eq 0 ] &&
  [ "$rc_bench" -eq 0 ]
