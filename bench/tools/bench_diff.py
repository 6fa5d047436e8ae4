#!/usr/bin/env python3
"""Compares two epx-bench JSON files (DESIGN.md section 3): one line per op that both measured.

    bench/tools/bench_diff.py BEFORE.json AFTER.json [--threshold PCT]

Prints each op's time before and after, the change in microseconds and percent, and marks changes
larger than the threshold (default 2%) as faster or slower. It also says whether the two runs used the
same device and team size (a comparison across machines means little). Exit status: 0, or 1
when an op got slower than the threshold or was checked in BEFORE and not in AFTER.
"""

import argparse
import json
import sys


def op_key(row):
    return (row.get("mode", ""), row.get("op", ""), row.get("dtype", ""), row.get("order", ""))


def op_name(key):
    mode, op, dtype, order = key
    return " ".join(part for part in (mode, op, dtype, order) if part)


def load(path):
    with open(path) as f:
        run = json.load(f)
    rows = {}
    for row in run.get("results", []):
        rows[op_key(row)] = row
    return run, rows


def compare(before, after, threshold_pct):
    """Returns (lines, regressed): the report and whether any op got slower or lost its check."""
    run_a, rows_a = before
    run_b, rows_b = after
    lines = []
    for field in ("device", "ranks"):
        if run_a.get(field) != run_b.get(field):
            lines.append(f"note: {field} differs: {run_a.get(field)} vs {run_b.get(field)}")
    lines.append(f"{run_a.get('commit', '?')} -> {run_b.get('commit', '?')} on {run_b.get('device', '?')}, "
                 f"{run_b.get('ranks', '?')} rank(s)")
    lines.append(f"{'op':32} {'before us':>10} {'after us':>10} {'change us':>10} {'change %':>9}")
    regressed = False
    for key in rows_a:
        if key not in rows_b:
            lines.append(f"{op_name(key):32} {rows_a[key]['time_us']:10.1f} {'-':>10}   (not in AFTER)")
            continue
        a, b = rows_a[key], rows_b[key]
        delta = b["time_us"] - a["time_us"]
        pct = 100.0 * delta / a["time_us"] if a["time_us"] > 0 else 0.0
        mark = ""
        if pct <= -threshold_pct:
            mark = "faster"
        elif pct >= threshold_pct:
            mark = "SLOWER"
            regressed = True
        if a.get("checked") and not b.get("checked"):
            mark += " NOT CHECKED"
            regressed = True
        lines.append(f"{op_name(key):32} {a['time_us']:10.1f} {b['time_us']:10.1f} {delta:+10.1f} {pct:+8.1f}%"
                     f" {mark}".rstrip())
    for key in rows_b:
        if key not in rows_a:
            lines.append(f"{op_name(key):32} {'-':>10} {rows_b[key]['time_us']:10.1f}   (new)")
    return lines, regressed


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--threshold", type=float, default=2.0, help="percent (default 2)")
    args = parser.parse_args(argv)
    lines, regressed = compare(load(args.before), load(args.after), args.threshold)
    print("\n".join(lines))
    return 1 if regressed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
