"""bench/align_quality.py, the quality study of docs/ALIGN.md ("Quality"), kept working in CI.

What is checked:
  * `--tiny` on a 1 MiB slice of GCIDE runs every step of the study on the CPU (source model,
    medical tokenizer, both targets, the four initialisations, the align + FVT hybrid, the four
    default blends (`align apply --align-weight`, which the binary must have), both fine-tuning
    stages from the --finetune-init init (blend-0.5-0.5) and from the FVT init) and its
    results table has every cell filled: results.json holds a finite bits-per-byte number for
    every (target, held-out set, column), results.md no "—"; the models really differ (the
    random, mean, FVT and align rows give four different numbers per target, and each blend,
    neither pure gather nor pure FVT, differs from both); the summary names the init with the
    lowest GCIDE bits per byte and says whether it beats FVT and random on PubMedQA;
  * a second run with the same options redoes nothing (no lathe command but the always-run,
    stage-cached `align run`) and writes the same numbers;
  * `lathe align run`'s `terms.corpus` (the study mines medical terms from the medical text while
    the embeddings read GCIDE + medical): the terms are those `lathe align terms` mines from
    terms.corpus alone, and not those of corpus.inputs; a missing file is an error naming the key.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LATHE = os.environ.get("LATHE_BIN", str(REPO / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", REPO.parent / "shared"))
PUBMED = SHARED / "corpora" / "pubmedqa_ori_pqal.json"
TOKENIZERS = SHARED / "tokenizers"
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")


@pytest.fixture(scope="module", autouse=True)
def required_data():
    """PubMedQA and the tokenizers of ../shared and dict-gcide are required test data: a missing
    file fails every test here, naming it."""
    for path in (PUBMED, GCIDE, TOKENIZERS / "qwen3.json", TOKENIZERS / "gpt-neox-20b.json"):
        assert path.exists(), f"{path} is missing (../shared, or dict-gcide: scripts/install-deps.sh)"


def study(out, *extra):
    """Runs the tiny study into `out`; returns its stderr (where the commands are printed)."""
    cmd = [sys.executable, str(REPO / "bench" / "align_quality.py"), "--tiny", "--lathe", LATHE,
           "--gcide", str(GCIDE), "--pubmedqa", str(PUBMED), "--tokenizers", str(TOKENIZERS),
           "--out", str(out), "--max-gcide-mb", "1", "--train-steps", "8", "--stage1-steps", "3",
           "--stage2-steps", "3", "--eval-docs", "2", "--gcide-eval-docs", "4", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-6000:]}"
    return p.stdout, p.stderr


def test_align_apply_takes_the_blend_weights():
    """The study's blends need `align apply --align-weight` and `--align-head-weight`."""
    p = subprocess.run([LATHE, "align", "apply", "--help"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    for option in ("--align-weight", "--align-head-weight"):
        assert option in p.stdout + p.stderr, f"lathe align apply has no {option}:\n{p.stdout}"


def test_tiny_study_fills_every_cell_and_resumes(tmp_path):
    out = tmp_path / "q"
    ft = "blend-0.5-0.5"
    args = ("--finetune-fvt", "--finetune-init", ft)
    stdout, err = study(out, *args)
    res = json.loads((out / "results.json").read_text())
    blend_cols = ["blend 0.5/0.5", "blend 1/0", "blend 0.5/0", "blend 0/1"]
    cols = ["random rows", "mean rows", "FVT", "TokAlign gather", "align + FVT below q0.5",
            *blend_cols, f"after stage 1 ({ft})", f"after stage 2 ({ft})",
            "FVT + stage 1", "FVT + stage 2"]
    inits = cols[:5 + len(blend_cols)]
    assert "skipping --blends" not in err, err[-3000:]
    assert set(res["targets"]) == {"qwen3", "medical"}
    for held in ("medical", "gcide"):
        assert math.isfinite(res["source"][held]) and res["source"][held] > 0
        for t, r in res["targets"].items():
            row = r["bits_per_byte"][held]
            assert list(row) == cols
            for c in cols:
                assert row[c] is not None and math.isfinite(row[c]) and row[c] > 0, (t, held, c, row)
            # Four initialisations, four models: a script that evaluated one model four times
            # would give equal numbers.
            assert len({row[c] for c in cols[:4]}) == 4, (t, held, row)
            for c in blend_cols:
                assert row[c] not in (row["TokAlign gather"], row["FVT"]), (t, held, c, row)
    for t, r in res["targets"].items():
        assert 0 < r["alignment_bleu1"] <= 1
        assert r["tokens_per_byte_source"] > 0 and r["tokens_per_byte_target"] > 0
        assert r["map_decisions"].get("gold", 0) > 0, r["map_decisions"]
        assert isinstance(r["align_beats_fvt_and_random"], bool)
        assert isinstance(r["hybrid_beats_fvt_and_random"], bool)
        # The selection: the init column with the lowest GCIDE number, judged on PubMedQA.
        g, m = r["bits_per_byte"]["gcide"], r["bits_per_byte"]["medical"]
        best = min(inits, key=lambda c: g[c])
        assert r["best_init_gcide"] == best, (t, g)
        assert r["best_init_beats_fvt_and_random"] == (m[best] < m["FVT"] and m[best] < m["random rows"])
    # The medical target is the trained tokenizer plus 100 mined terms (tiny's --terms-top-k).
    assert res["targets"]["medical"]["map_decisions"].get("term") == 100
    md = (out / "results.md").read_text()
    assert "—" not in md, md
    assert md.count("| qwen3 |") == 4 and md.count("| medical |") == 4, md
    yn = lambda b: "yes" if b else "no"
    for t, r in res["targets"].items():
        assert f"| {r['best_init_gcide']}: {yn(r['best_init_beats_fvt_and_random'])} |" in md, md
    for t, r in res["targets"].items():  # `align run`'s own stage times
        want = {"prepare source", "prepare target", "embed source", "embed target", "map", "apply"}
        assert want <= set(r["align_stages_s"]), r
    assert res["targets"]["qwen3"]["align_stages_s"]["terms"] == "n/a"
    assert res["targets"]["medical"]["align_stages_s"]["terms"] > 0
    for step in ("source-train", "qwen3-align", "medical-align", f"qwen3-{ft}-stage1",
                 "medical-fvt-stage2", "medical-eval-init"):
        assert res["timings_s"][step] > 0, res["timings_s"]
    assert "| TokAlign gather |" in md and md in stdout

    # A second run redoes nothing: the only lathe command it runs is `align run`, whose stages
    # all say up to date; the numbers are the same.
    _, err = study(out, *args)
    commands = [line for line in err.splitlines() if line.startswith("+ ")]
    assert all(" align run " in c for c in commands) and len(commands) == 2, commands
    assert json.loads((out / "results.json").read_text())["targets"] == res["targets"]


def lathe(*args, check=True):
    p = subprocess.run([LATHE, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def test_align_run_mines_terms_from_terms_corpus(tmp_path):
    data = json.loads(PUBMED.read_text(encoding="utf-8"))
    docs = ["\n".join([v["QUESTION"], *v["CONTEXTS"], v["LONG_ANSWER"]]) for v in data.values()]
    medical = tmp_path / "medical.jsonl"
    medical.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:200]))
    # "General" text that shares no phrase with the medical one often enough to be a term
    # candidate on its own, but would add to the counts if it were mined: the medical documents'
    # own first sentences, repeated.
    general = tmp_path / "general.jsonl"
    general.write_text("".join(json.dumps({"text": d.split("\n")[0]}) + "\n" for d in docs[200:400]) * 5)
    neox = TOKENIZERS / "gpt-neox-20b.json"
    common = ["--set", "terms.top_k=30", "--set", "embed.dim=8", "--set", "embed.iters=1",
              "--set", "map.device=cpu", "--set", "embed.device=cpu", "--set", "map.pivots=20",
              "--no-progress"]

    def run(work, *sets):
        cfg = tmp_path / f"{work}.yaml"
        cfg.write_text(f"align: {{work_dir: {tmp_path / work}, threads: 2}}\n"
                       f"source: {{tokenizer: {neox}}}\n"
                       f"corpus: {{inputs: [{general}, {medical}]}}\n")
        lathe("align", "run", cfg, *common, *sets)
        return (tmp_path / work / "target" / "tokenizer.terms.tsv").read_text()

    split = run("split", "--set", f"terms.corpus=[{medical}]")
    both = run("both")
    lathe("align", "terms", "--tokenizer", neox, "--corpus", medical, "--top-k", "30",
          "--output", tmp_path / "alone" / "tokenizer.json", "--no-progress")
    alone = (tmp_path / "alone" / "tokenizer.terms.tsv").read_text()
    assert split == alone
    assert split != both  # the general text's first sentences changed counts when mined
    # The token files (stage 2) still hold the whole corpus.inputs.
    info = lathe("data", "info", tmp_path / "split" / "tokens" / "source").stdout
    assert "documents: 1200" in info, info
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"align: {{work_dir: {tmp_path / 'w'}}}\nsource: {{tokenizer: {neox}}}\n"
                   f"corpus: {{inputs: [{medical}]}}\nterms: {{corpus: [{tmp_path / 'nope.jsonl'}]}}\n")
    p = lathe("align", "run", bad, check=False)
    assert p.returncode != 0 and "terms.corpus (" in p.stderr and "nope.jsonl does not exist" in p.stderr, p.stderr
