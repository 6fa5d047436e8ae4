#!/usr/bin/env bash
# A/B of builds on a GPU machine: runs epx-bench of each build in turn, `runs` rounds (A B A B ...), so
# that drift over the run falls on every build alike, and prints each run's table rows. The builds are
# folders with bench/epx-bench (made here or carried), relative to the repository root; every run
# checks its outputs against the CPU reference before it times anything. Each run's JSON and full
# output go to $OUT (or ./device-out) as <build>-<round>.json and .txt, <build> being the build's path
# with every character other than letters, digits, - and _ made _. With several builds and rounds
# that is many files, so a machine that returns few files gets the tables from this script's output.
#
#   scripts/ab_bench.sh [--runs N] BUILD [BUILD ...] [-- epx-bench arguments]
#
# Example: scripts/ab_bench.sh --runs 2 build build-next -- --skip-ll
set -uo pipefail
cd "$(dirname "$0")/.."

runs=2 builds=() bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --) shift; bench_args=("$@"); break ;;
    *) builds+=("$1"); shift ;;
  esac
done
if [ ${#builds[@]} -eq 0 ] || ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [--runs N] BUILD [BUILD ...] [-- epx-bench arguments]" >&2
  exit 2
fi
for b in "${builds[@]}"; do
  [ -x "$b/bench/epx-bench" ] || { echo "$b/bench/epx-bench: not found (build it first)" >&2; exit 2; }
done
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
source scripts/nccl_env.sh

status=0
for round in $(seq 1 "$runs"); do
  for b in "${builds[@]}"; do
    name="${b//[^A-Za-z0-9_-]/_}-$round"
    echo "== $b, round $round"
    timeout 300 "$b/bench/epx-bench" ${bench_args[@]+"${bench_args[@]}"} --json "$out/$name.json" >"$out/$name.txt" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { echo "exit $rc"; tail -5 "$out/$name.txt"; status=1; }
    grep -E "checked in|^(layout|dispatch|combine)|^op " "$out/$name.txt"
  done
done
exit $status
