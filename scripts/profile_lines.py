#!/usr/bin/env python3
"""Where the sampled warps of one profiled kernel stalled: by reason, by instruction and by source line.

    profile_lines.py SASS_CSV [DISASSEMBLY ...] [--top N]

SASS_CSV is ncu's source view of one kernel (--page source --csv --print-source sass): a row per
instruction with its warp-state samples and instructions executed. Each DISASSEMBLY is nvdisasm -g
output of the build's cubins; the one function whose instructions are those of the CSV, in order,
gives each instruction its source line (file:line of the innermost inlined code, as nvdisasm says it).
Without a disassembly, or when none matches, only the reasons and the instructions are printed.
"""
import argparse
import collections
import csv
import re

SAMPLES = 'Warp Stall Sampling (All Samples)'
REASON = 'stall_'  # the prefix of a stall reason's column


def number(text):
    try:
        return float(text.replace(',', ''))
    except ValueError:
        return 0.0


def opcode(sass):
    words = sass.replace(';', '').split()
    while words and words[0].startswith('@'):
        words = words[1:]
    return words[0] if words else ''


def read_view(path):
    rows = list(csv.reader(open(path)))
    head = next((i for i, r in enumerate(rows) if SAMPLES in r), None)
    if head is None:
        raise SystemExit('%s: no source view with warp samples (%s)' % (path, ' | '.join(' '.join(r) for r in rows[:2])))
    cols = rows[head]
    return cols, [r for r in rows[head + 1:] if len(r) == len(cols)]


def read_functions(path):
    """{function: [(file:line, opcode), ...]} of an nvdisasm -g listing."""
    functions, body, where = {}, None, ''
    for line in open(path):
        start = re.match(r'^\.text\.(\S+):', line)
        if start:
            body = functions.setdefault(start.group(1), [])
            continue
        at = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if at:
            where = '%s:%s' % (at.group(1).split('/')[-1], at.group(2))
            continue
        instruction = re.match(r'\s*/\*[0-9a-f]{4,}\*/\s+(.*)', line)
        if instruction and body is not None:
            body.append((where, opcode(instruction.group(1))))
    return functions


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('view')
    parser.add_argument('disassembly', nargs='*')
    parser.add_argument('--top', type=int, default=30)
    args = parser.parse_args()
    cols, body = read_view(args.view)
    samples, executed, text = cols.index(SAMPLES), cols.index('Instructions Executed'), cols.index('Source')
    # (column, reason) of every stall reason's all-samples column
    reasons = [(i, c[len(REASON):]) for i, c in enumerate(cols) if c.startswith(REASON) and 'Not Issued' not in c]
    total = sum(number(r[samples]) for r in body) or 1.0

    def summary(rows_samples, rows_reasons):
        top = sorted(((n, name) for name, n in rows_reasons.items() if n > 0), reverse=True)[:3]
        return '%5.1f%%  %-38s' % (100 * rows_samples / total, ' '.join('%s %d' % (name, n) for n, name in top))

    by_reason = collections.Counter()
    for r in body:
        for i, name in reasons:
            by_reason[name] += number(r[i])
    print('%d samples, %d instructions; by reason: %s' % (total, len(body), ', '.join(
        '%s %.1f%%' % (name, 100 * n / total) for name, n in by_reason.most_common() if n > 0)))
    print('instructions with the most samples:')
    for r in sorted(body, key=lambda r: -number(r[samples]))[:args.top]:
        print(summary(number(r[samples]), {name: number(r[i]) for i, name in reasons}), r[text].strip()[:70])

    ops = [opcode(r[text]) for r in body]
    lines = None
    for path in args.disassembly:
        for name, instructions in read_functions(path).items():
            if [op for _, op in instructions] == ops:
                lines, function = [where for where, _ in instructions], name
    if lines is None:
        print('no disassembly holds these instructions: no source lines')
        return
    per_line = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
    for r, where in zip(body, lines):
        entry = per_line[where]
        entry[0] += number(r[samples])
        entry[1] += number(r[executed])
        for i, name in reasons:
            entry[2][name] += number(r[i])
    print('source lines with the most samples (%s; executed: warp-instructions, share of the kernel\'s):' % function)
    all_executed = sum(e[1] for e in per_line.values()) or 1.0
    for where, (n, x, rs) in sorted(per_line.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(summary(n, rs), 'executed %4.1f%%  %s' % (100 * x / all_executed, where))


if __name__ == '__main__':
    main()
