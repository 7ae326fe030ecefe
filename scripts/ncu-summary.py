#!/usr/bin/env python3
"""Kernel time per kernel name from an `ncu --csv --metrics gpu__time_duration.sum` log.

    python3 scripts/ncu-summary.py profile.csv [TOP]

Prints the total and the TOP (default 40) kernels by summed time, with call counts: the table
docs/PERF.md's profile breakdowns are read from.
"""
import collections
import csv
import re
import sys

UNIT_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
              "second": 1e6, "s": 1e6}


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if not line.startswith("==")))
    if not rows:
        sys.exit(f"{path}: no ncu rows (did the profiled command fail?)")
    header = rows[0]
    name_col, value_col, unit_col = (header.index(k) for k in ("Kernel Name", "Metric Value", "Metric Unit"))
    per_kernel = collections.defaultdict(lambda: [0.0, 0])
    for row in rows[1:]:
        if len(row) <= max(name_col, value_col, unit_col):
            continue
        try:
            us = float(row[value_col].replace(",", "")) * UNIT_TO_US[row[unit_col]]
        except (ValueError, KeyError):
            continue
        name = re.sub(r"\(.*", "", row[name_col])[:90]
        per_kernel[name][0] += us
        per_kernel[name][1] += 1
    total = sum(us for us, _ in per_kernel.values())
    count = sum(n for _, n in per_kernel.values())
    print(f"== {path}: {total / 1000:.2f} ms in {count} kernels")
    for name, (us, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{us / 1000:8.2f} ms {100 * us / total:5.1f}% {n:5d}x  {name}")


if __name__ == "__main__":
    main()
