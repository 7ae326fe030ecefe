"""bench/fp8_quality_corpus.py and bench/fp8_quality_plot.py, the FP8 quality comparison's corpus
and curves (docs/FP8.md), kept working off the GPU machine: the corpus holds both sources, shuffled
by the seed and the same for the same seed; the plot names each run by its header, draws one line
per run and panel, and its table gives each run's last validation loss over bf16's."""
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_corpus_mixes_both_sources_shuffled_by_the_seed(tmp_path):
    gcide = tmp_path / "g.dict.dz"
    with gzip.open(gcide, "wt") as f:
        f.write("\n\n".join(f"entry {i}\nsense of entry {i}" for i in range(50)) + "\n")
    pubmed = tmp_path / "p.json"
    pubmed.write_text(json.dumps({str(i): {"QUESTION": f"question {i}?", "CONTEXTS": ["a.", "b."],
                                           "LONG_ANSWER": "yes."} for i in range(10)}))
    outs = []
    for seed, name in ((0, "a.txt"), (0, "b.txt"), (1, "c.txt")):
        p = run(ROOT / "bench" / "fp8_quality_corpus.py", tmp_path / name, "--gcide", gcide,
                "--pubmedqa", pubmed, "--seed", seed)
        assert p.returncode == 0, p.stderr
        assert "60 documents" in p.stdout
        outs.append((tmp_path / name).read_text())
    assert outs[0] == outs[1] and outs[0] != outs[2]
    docs = outs[0].strip().split("\n\n")
    assert len(docs) == 60
    assert sum(d.startswith("question") for d in docs) == 10
    # Shuffled: the questions are not all at the end.
    assert not all(d.startswith("question") for d in docs[-10:])
    p = run(ROOT / "bench" / "fp8_quality_corpus.py", tmp_path / "x.txt", "--gcide", tmp_path / "none")
    assert p.returncode != 0 and "fp8_quality_corpus: error" in p.stderr


def write_run(path, recipe, final):
    rows = [{"step": 0, "split": "header", "precision": "fp8", "fp8_recipe": recipe}] if recipe else []
    for s in range(20, 201, 20):
        rows.append({"step": s, "split": "train", "loss": 5.0 - s / 100})
    rows += [{"step": 100, "split": "valid", "loss": final + 1}, {"step": 200, "split": "valid", "loss": final}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plot_draws_each_run_and_tables_the_ratio(tmp_path):
    write_run(tmp_path / "b.jsonl", None, 4.0)
    write_run(tmp_path / "t.jsonl", "tensorwise", 4.04)
    svg = tmp_path / "q.svg"
    p = run(ROOT / "bench" / "fp8_quality_plot.py", svg, tmp_path / "b.jsonl", tmp_path / "t.jsonl")
    assert p.returncode == 0, p.stderr
    text = svg.read_text()
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
    assert len(re.findall("<polyline", text)) == 4  # two runs, two panels
    assert ">bf16<" in text and ">tensorwise<" in text
    line = [l for l in p.stdout.splitlines() if l.startswith("tensorwise")][0]
    assert "(200, 4.04)" in line and "1.0100" in line
