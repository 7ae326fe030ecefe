#!/usr/bin/env python3
"""Run-to-run noise of the quality study's inits: several results.json of bench/align_quality.py
that differ only in --align-seed (same source model), summarised per target and held-out set.

    python3 bench/align_quality_seeds.py runs/quality/results-seed1.json runs/quality/results-seed2.json ...

For each init column: the mean bits per byte over the seeds, the sample standard deviation, the
range; and for each of lathe's inits its margin against FVT (init - FVT, negative = better) per
seed, with the mean, the standard deviation and the number of seeds where it is below FVT. FVT,
mean and random rows do not read the map, so they do not move with the seed (their deviation is
printed as a check). Writes the tables as Markdown on stdout.
"""
import json
import statistics
import sys


def main():
    paths = sys.argv[1:]
    if len(paths) < 2:
        sys.exit("usage: align_quality_seeds.py RESULTS.json RESULTS.json [...] (two or more seeds)")
    runs = [json.load(open(p)) for p in paths]
    seeds = [r["settings"].get("embed_seed", "?") for r in runs]
    out = [f"{len(runs)} runs, align seeds {', '.join(map(str, seeds))} (embed.seed = map.seed); "
           f"source model PubMedQA {runs[0]['source']['medical']:.4f}, "
           f"GCIDE {runs[0]['source']['gcide']:.4f} bits/byte in the first run"]
    for r in runs[1:]:
        if r["source"] != runs[0]["source"]:
            out.append(f"note: the source model's numbers differ between runs: {r['source']}")
    for held, title in (("medical", "held-out PubMedQA"), ("gcide", "held-out GCIDE")):
        for target in runs[0]["targets"]:
            cols = [c for c, v in runs[0]["targets"][target]["bits_per_byte"][held].items()
                    if v is not None and not c.startswith("after stage")]
            out += ["", f"{target}, {title}: bits per byte over the seeds", "",
                    "| init | " + " | ".join(f"seed {s}" for s in seeds) +
                    " | mean | std | range | − FVT: mean ± std | below FVT |",
                    "| --- |" + " --- |" * (len(seeds) + 5)]
            for c in cols:
                v = [r["targets"][target]["bits_per_byte"][held][c] for r in runs]
                fvt = [r["targets"][target]["bits_per_byte"][held]["FVT"] for r in runs]
                d = [a - b for a, b in zip(v, fvt)]
                margin, below = "", ""
                if c not in ("FVT", "random rows", "mean rows"):
                    margin = f"{statistics.mean(d):+.4f} ± {statistics.stdev(d):.4f}"
                    below = f"{sum(x < 0 for x in d)}/{len(d)}"
                out.append(f"| {c} | " + " | ".join(f"{x:.4f}" for x in v) +
                           f" | {statistics.mean(v):.4f} | {statistics.stdev(v):.4f} | "
                           f"{max(v) - min(v):.4f} | {margin} | {below} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
