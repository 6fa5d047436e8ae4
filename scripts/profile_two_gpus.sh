#!/usr/bin/env bash
# Profiles one launch of a kernel (HT or LL) with Nsight Compute on a machine with 2 GPUs: two bench
# ranks started torchrun-style, rank 1 plainly and rank 0 under ncu, both with the same bench arguments.
# Writes the report and its details page to $OUT (or ./device-out).
#
#   scripts/profile_two_gpus.sh [--kernel REGEX] [--skip N] [--metrics LIST] [-- epx-bench arguments]
#
# A kernel that waits for its peer cannot be replayed: a replay restores this rank's memory and waits
# again for signals the peer sent once, until the bounded wait expires. So only metrics that ncu
# collects in one pass may be asked for; the script prints ncu's pass count, and a run that needed more
# than one is not to be trusted (its kernel time includes an expired wait).
# Caches are left as the launches before left them (--cache-control none), as in the bench.
# Defaults: the HT dispatch kernel (bench arguments --skip-ll), its 21st launch (after the bench's checks
# and warm-up), the kernel time and two throughputs of the speed-of-light section (how many passes these
# take is not seen yet).
# With the ten warp-state stall reasons (smsp__average_warps_issue_stalled_<reason>_per_issue_active.
# ratio) added, ncu needed 7 passes on an H200 (2026-11-22) and no report came back: ask for them a
# few at a time with --metrics, and believe a run only when ncu says "1 pass". A run that needs more
# passes ends within 150 s: each rank waits at most 20 s for the other. Warp-state sampling
# (smsp__pcsamp_*) took 3 passes for the HT combine and 5 for the LL dispatch even when asked for alone
# (2026-11-28): it needs one rank (scripts/profile_one_gpu.sh). So did the L2 hit rate and the DRAM
# bytes of the LL combine (lts__t_sector_op_read_hit_rate.pct, dram__bytes_read.sum: 3 passes, 2026-11-29).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

kernel="regex:dispatch_kernel" skip=20 bench_args=(--skip-ll)
metrics="gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel) kernel="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    --metrics) metrics="$2"; shift 2 ;;
    --) shift; bench_args=("$@"); break ;;
    *) echo "usage: $0 [--kernel REGEX] [--skip N] [--metrics LIST] [-- epx-bench arguments]" >&2; exit 2 ;;
  esac
done
source scripts/profile_env.sh
export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + RANDOM % 20000))

bench=("$build/bench/epx-bench" "${bench_args[@]}" --timeout-ms 20000)
RANK=1 LOCAL_RANK=1 timeout 150 "${bench[@]}" --json "$out/profile-rank1.json" >"$out/profile-rank1.log" 2>&1 &
RANK=0 LOCAL_RANK=0 timeout 150 ncu --clock-control none --cache-control none --replay-mode kernel -k "$kernel" \
  --launch-skip "$skip" --launch-count 1 --metrics "$metrics" -o "$out/profile" -f \
  "${bench[@]}" --json "$out/profile-rank0.json" >"$out/profile-rank0.log" 2>&1
rc0=$?
wait
rc1=$?
echo "rank 0 (under ncu): exit $rc0; rank 1: exit $rc1"
grep -E "==PROF==|pass" "$out/profile-rank0.log" | head -10
if [ -f "$out/profile.ncu-rep" ]; then
  ncu --import "$out/profile.ncu-rep" --page details >"$out/profile-details.txt" 2>&1
  cat "$out/profile-details.txt"
fi
