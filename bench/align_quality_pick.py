#!/usr/bin/env python3
"""Which of lathe's initialisations the quality study fine-tunes: the one with the lowest held-out
GCIDE bits per byte, averaged over the targets (GCIDE is the selection set; PubMedQA, the judging
set, plays no part in this choice; docs/ALIGN.md says which candidates were designed after which
results had been seen).

    python3 bench/align_quality_pick.py runs/quality/results.json   # prints e.g. blend-0.5-0.5

Candidates are lathe's own inits only: "TokAlign gather" (apply --align-weight 1, TokAlign's rule), the hybrid ("align + FVT
below qX") and the blends ("blend W/H"); the baselines (random, mean, FVT) are what they must beat.
"""
import json
import re
import sys


def init_name(column):
    if column == "TokAlign gather":
        return "align"
    if column.startswith("align + FVT below"):
        return "hybrid"
    m = re.fullmatch(r"blend (\S+)/(\S+)", column)
    if m:
        return f"blend-{m[1]}-{m[2]}"
    return None


def main():
    results = json.load(open(sys.argv[1]))
    totals = {}
    for target in results["targets"].values():
        for column, bpb in target["bits_per_byte"]["gcide"].items():
            name = init_name(column)
            if name is None or bpb is None:
                continue
            totals.setdefault(name, []).append(bpb)
    n = len(results["targets"])
    complete = {k: sum(v) / n for k, v in totals.items() if len(v) == n}
    if not complete:
        sys.exit(f"{sys.argv[1]}: no lathe init was evaluated on GCIDE for every target")
    for name, mean in sorted(complete.items(), key=lambda kv: kv[1]):
        print(f"{name}\t{mean:.4f}", file=sys.stderr)
    print(min(complete, key=complete.get))


if __name__ == "__main__":
    main()
