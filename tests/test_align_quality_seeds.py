"""The seed knob of bench/align_quality.py and bench/align_quality_seeds.py, which summarises
several seeds' results.json into the noise and the margins against FVT that docs/ALIGN.md quotes.

The summary is checked on results made up here, where every number is known: the mean, the
sample standard deviation, the range, the margin init - FVT and the count of seeds below FVT.
"""
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "align_quality.py"
SEEDS = ROOT / "bench" / "align_quality_seeds.py"


def results(seed, blend, fvt=2.25, gather=2.33):
    bpb = {"random rows": 4.0, "mean rows": 3.9, "FVT": fvt, "TokAlign gather": gather,
           "blend 0.25/0.25": blend, "after stage 1 (align)": None}
    return {"settings": {"embed_seed": seed, "map_seed": seed},
            "source": {"medical": 1.6, "gcide": 1.2},
            "targets": {"qwen3": {"bits_per_byte": {"medical": dict(bpb), "gcide": dict(bpb)}}}}


def row(table, name):
    lines = [line for line in table.splitlines() if line.startswith(f"| {name} |")]
    assert lines, (name, table)
    return [c.strip() for c in lines[0].strip("|").split("|")]


def test_summary_of_three_seeds(tmp_path):
    blends = [2.2319, 2.2340, 2.2290]
    paths = []
    for seed, b in zip((1, 2, 3), blends):
        p = tmp_path / f"results-seed{seed}.json"
        p.write_text(json.dumps(results(seed, b)))
        paths.append(p)
    out = subprocess.run([sys.executable, str(SEEDS), *map(str, paths)], capture_output=True,
                         text=True, check=True).stdout
    assert "align seeds 1, 2, 3" in out, out
    medical = out.split("qwen3, held-out PubMedQA")[1].split("qwen3, held-out GCIDE")[0]
    cells = row(medical, "blend 0.25/0.25")
    assert cells[1:4] == [f"{b:.4f}" for b in blends]
    assert cells[4] == f"{statistics.mean(blends):.4f}"
    assert cells[5] == f"{statistics.stdev(blends):.4f}"
    assert cells[6] == f"{max(blends) - min(blends):.4f}"
    d = [b - 2.25 for b in blends]
    assert cells[7] == f"{statistics.mean(d):+.4f} ± {statistics.stdev(d):.4f}"
    assert cells[8] == "3/3"
    gather = row(medical, "TokAlign gather")
    assert gather[8] == "0/3" and gather[7].startswith("+0.0800")
    fvt = row(medical, "FVT")
    assert fvt[5] == "0.0000" and fvt[7] == ""  # FVT reads no map: no noise, no margin
    assert "after stage 1" not in out  # columns never filled are left out


def test_one_run_is_not_a_noise_measurement(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(results(1, 2.23)))
    r = subprocess.run([sys.executable, str(SEEDS), str(p)], capture_output=True, text=True)
    assert r.returncode != 0 and "two or more" in r.stderr


def test_align_seed_is_checked_before_any_work(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path / "q"),
                        "--align-seed", "x1"], capture_output=True, text=True)
    assert r.returncode != 0 and "--align-seed: 'x1'" in r.stderr, r.stderr
    assert not (tmp_path / "q").exists()


def test_align_seed_reaches_the_align_runs_config(tmp_path):
    # The config `lathe align run` gets, as the study writes it, for a seed and for the default.
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import align_quality
    finally:
        sys.path.pop(0)
    argv = ["--tiny", "--out", str(tmp_path / "q"), "--lathe", sys.executable]
    for seed, embed, mapped in (("7", 7, 7), (None, 1, 0)):
        o = align_quality.parse_args(argv + (["--align-seed", seed] if seed else []))
        o.lathe, o.gcide, o.pubmedqa = sys.executable, __file__, __file__
        o.tokenizers = str(tmp_path)
        for t in ("gpt-neox-20b", "qwen3"):
            (tmp_path / f"{t}.json").write_text("{}")
        o = align_quality.settle(o)
        text = align_quality.align_yaml(o, tmp_path / "w", tmp_path / "qwen3", "/ckpt", tmp_path / "data")
        assert f"embed: {{device: cpu, seed: {embed}}}" in text, text
        assert f"map: {{device: cpu, seed: {mapped}}}" in text, text
        assert o.map_seed == mapped  # the hybrid's own map takes --seed o.map_seed
