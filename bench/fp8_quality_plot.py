#!/usr/bin/env python3
"""Curves of the FP8 quality comparison (bench/fp8_quality.sh): the training loss (mean of each
five logged steps) and the validation loss of each run's metrics.jsonl against the step, as one
SVG, and a table on stdout: each run's last validation loss and its ratio to the bf16 run's.

    python3 bench/fp8_quality_plot.py OUT.svg q-bf16.metrics.jsonl q-tensorwise.metrics.jsonl ...

A run is named by its header row (fp8_recipe, or bf16 when it has none). Written without plotting
libraries (plain SVG polylines), so it runs wherever python3 does."""
import json
import os
import sys

COLORS = {"bf16": "#000000", "tensorwise": "#d62728", "delayed": "#1f77b4", "blockwise": "#2ca02c"}


def load(path):
    name, train, valid = "bf16", [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("split") == "header":
                name = r.get("fp8_recipe", name) if r.get("precision") == "fp8" else name
            elif r.get("split") == "train" and "loss" in r:
                train.append((r["step"], r["loss"]))
            elif r.get("split") == "valid" and "loss" in r:
                valid.append((r["step"], r["loss"]))
    smooth = [(train[i + 4][0], sum(v for _, v in train[i:i + 5]) / 5) for i in range(0, len(train) - 4, 5)]
    return name, smooth, valid


def panel(runs, key, x0, title, w=420, h=300):
    pts = [p for r in runs for p in r[key]]
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xmax = max(xs)
    ylo, yhi = min(ys), max(ys)
    if key == 1:  # the training loss: the second half, where the recipes differ
        half = [p[1] for r in runs for p in r[1] if p[0] >= xmax / 2]
        ylo, yhi = min(half), max(half)
    pad = (yhi - ylo) * 0.05 or 0.01
    ylo, yhi = ylo - pad, yhi + pad
    X = lambda s: x0 + 50 + (w - 60) * s / xmax
    Y = lambda v: 30 + (h - 60) * (1 - (v - ylo) / (yhi - ylo))
    out = [f'<text x="{x0 + w / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>',
           f'<rect x="{x0 + 50}" y="30" width="{w - 60}" height="{h - 60}" fill="none" stroke="#888"/>']
    for i in range(5):
        v = ylo + (yhi - ylo) * i / 4
        out.append(f'<text x="{x0 + 46}" y="{Y(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.3f}</text>')
    out.append(f'<text x="{x0 + w - 10}" y="{h - 14}" text-anchor="end" font-size="10">step {xmax}</text>')
    for name, *series in runs:
        s = [p for p in series[key - 1] if ylo <= p[1] <= yhi]
        line = " ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in s)
        out.append(f'<polyline fill="none" stroke="{COLORS.get(name, "#777")}" stroke-width="1.4" points="{line}"/>')
    return "\n".join(out)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    runs = [load(p) for p in sys.argv[2:]]
    legend = "\n".join(f'<text x="{60 + 110 * i}" y="{322}" font-size="12" fill="{COLORS.get(n, "#777")}">{n}</text>'
                       for i, (n, _, _) in enumerate(runs))
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="860" height="330" font-family="sans-serif">\n'
           f'<rect width="100%" height="100%" fill="white"/>\n'
           f'{panel(runs, 1, 0, "training loss (mean of 5 logged steps), second half")}\n'
           f'{panel(runs, 2, 430, "validation loss")}\n{legend}\n</svg>\n')
    with open(sys.argv[1] + ".tmp", "w", encoding="utf-8") as f:
        f.write(svg)
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    base = {n: v for n, _, v in runs}.get("bf16")
    for n, _, v in runs:
        last = v[-1] if v else None
        ratio = f"{last[1] / base[-1][1]:.4f}" if last and base and base[-1][0] == last[0] else "-"
        print(f"{n:11s} last validation {last}  / bf16 {ratio}")


if __name__ == "__main__":
    main()
