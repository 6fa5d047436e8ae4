#!/usr/bin/env bash
# Checks that bench/results/README.md indexes every file of bench/results/ and names none that is missing:
# each file has a table row whose first cell names it (a cell may name several files, separated by ", ").
set -euo pipefail
cd "$(dirname "$0")/../bench/results"
listed=$(awk -F'|' '/^\| / && $2 !~ /^ *file *$/ && $2 !~ /^-+$/ {
  n = split($2, names, ",")
  for (i = 1; i <= n; ++i) { gsub(/^ +| +$/, "", names[i]); print names[i] }
}' README.md | sort)
present=$(find . -maxdepth 1 -type f ! -name README.md -printf '%f\n' | sort)
unlisted=$(comm -13 <(echo "$listed") <(echo "$present"))
missing=$(comm -23 <(echo "$listed") <(echo "$present"))
[ -z "$unlisted" ] || printf 'bench/results/README.md has no row for:\n%s\n' "$unlisted" >&2
[ -z "$missing" ] || printf 'bench/results/README.md names files that are not there:\n%s\n' "$missing" >&2
[ -z "$unlisted$missing" ] || exit 1
echo "check_results_index: $(echo "$present" | wc -l) files, each indexed"
