#!/usr/bin/env bash
# Profiles a kernel of a one-GPU bench run (a team of one rank) with Nsight Compute: the full sections,
# warp-state sampling included, and where the sampled warps stalled most.
#
#   scripts/profile_one_gpu.sh [--kernel REGEX] [--skip N] [--replay kernel|application]
#                              [--sections "NAME ..."] [-- epx-bench arguments]
#
# With one rank every flag a kernel waits for lies in this process's memory, so ncu may replay a kernel
# (it restores the memory between passes, and the kernel finds what it found the first time); with a
# peer it may not (scripts/profile_two_gpus.sh). What such a run shows is the local chain of a kernel: at
# EP=1 the LL dispatch sends every message to its own rank and the LL combine sends nothing.
# Kernel replay (the default) also leaves the kernel's code out of the instruction caches (the bench's
# "cold" column); application replay runs the whole bench once per pass and profiles the launch as it
# comes (warm caches), so it wants few sections.
# The build needs line information for the source lines (-DCMAKE_CUDA_FLAGS=-lineinfo; the kernels'
# instructions stay the same). Writes to $OUT (or ./device-out): details.txt, sass.csv (the source view, one row per
# instruction; the report too with KEEP_REPORT=1) and lines.txt (scripts/profile_lines.py: the stall
# reasons, and the instructions and source lines with the most samples), and prints the last two.
# Defaults: the LL dispatch kernel (FP8), its 41st launch (past the bench's checks and warm-up).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

kernel="regex:ll::.*dispatch_kernel<.bool.1>" skip=40 replay=kernel bench_args=(--skip-ht)
section_names="SpeedOfLight MemoryWorkloadAnalysis SchedulerStats WarpStateStats SourceCounters LaunchStats Occupancy"
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel) kernel="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    --replay) replay="$2"; shift 2 ;;
    --sections) section_names="$2"; shift 2 ;;
    --) shift; bench_args=("$@"); break ;;
    *) echo "usage: $0 [--kernel REGEX] [--skip N] [--replay kernel|application] [--sections \"NAME ...\"] [-- epx-bench arguments]" >&2; exit 2 ;;
  esac
done
source scripts/profile_env.sh

sections=()
for s in $section_names; do
  sections+=(--section "$s")
done
# Warp-state samples every 2^5 cycles (the finest), so that a kernel of a few microseconds gets thousands.
timeout 500 ncu --clock-control none --cache-control none --kernel-name-base demangled -k "$kernel" \
  --launch-skip "$skip" --launch-count 1 --replay-mode "$replay" "${sections[@]}" --warp-sampling-interval 0 --import-source yes \
  -o "$out/profile" -f "$build/bench/epx-bench" "${bench_args[@]}" --json "$out/profile.json" >"$out/bench.log" 2>&1
echo "ncu: exit $?"
grep -E "==PROF==|==ERROR==|==WARNING==" "$out/bench.log" | head -10
[ -f "$out/profile.ncu-rep" ] || exit 1
ncu --import "$out/profile.ncu-rep" --page details >"$out/details.txt" 2>&1
ncu --import "$out/profile.ncu-rep" --page source --csv --print-source sass >"$out/sass.csv" 2>&1
[ -n "${KEEP_REPORT:-}" ] || rm -f "$out/profile.ncu-rep" "$out/profile.json"
# The build's device code with line information, so that each sampled instruction gets its source line: from
# the bench itself, which links the library statically (so a carried build needs nothing but bench/epx-bench).
listings=$(mktemp -d) bench_binary=$(realpath "$build/bench/epx-bench")
(cd "$listings" && cuobjdump -xelf all "$bench_binary" >/dev/null &&
  for cubin in *.cubin; do nvdisasm -g -c "$cubin" >"${cubin%.cubin}.sass"; done) || echo "no disassembly: no source lines"
python3 scripts/profile_lines.py "$out/sass.csv" "$listings"/*.sass | tee "$out/lines.txt"
rm -rf "$listings"
