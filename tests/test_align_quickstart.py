"""docs/ALIGN.md's quick start, run as the page writes it.

The first ```sh block under "## Quick start" is read from the page and run with bash in a fresh
folder laid out like the repository root (configs/ and ../shared/ linked, `lathe` on the PATH).
Only sizes change, each by a `--set` appended to its command: fewer training steps, small
embeddings, five held-out documents; every command, path and key is the page's. Checked: every
command succeeds, the source model exists where the align run reads it, every stage of the run
ran (apply and eval included), and the adapted model holds the mined terms.
"""
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LATHE = os.environ.get("LATHE_BIN", str(ROOT / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", ROOT.parent / "shared"))
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")

# Sizes for a CI machine, appended to the page's commands (a later --set wins).
SMALLER = {
    "lathe train": ["train.steps=4", "train.micro_batch_size=2", "data.seq_length=32",
                    "checkpoint.interval=4", "train.log_interval=1"],
    "lathe align run": ["embed.dim=8", "embed.iters=1", "embed.device=cpu", "map.pivots=50",
                        "map.device=cpu", "eval.max_documents=5", "eval.seq_len=64",
                        "eval.device=cpu", "align.threads=2"],
}


def quick_start_block():
    text = (ROOT / "docs" / "ALIGN.md").read_text(encoding="utf-8")
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert m, "docs/ALIGN.md: no ```sh block under ## Quick start"
    return m.group(1)


def smaller(block):
    """The block with each sized command's --set list appended (after joining its continuation
    lines); fails when a command the sizes are for is missing from the page."""
    joined = re.sub(r"\\\n\s*", "", block)
    out, seen = [], set()
    for line in joined.split("\n"):
        for prefix, sets in SMALLER.items():
            if line.startswith(prefix + " "):
                line += "".join(f" --set {s}" for s in sets)
                seen.add(prefix)
        out.append(line)
    assert seen == set(SMALLER), f"the quick start lost a command: {set(SMALLER) - seen}"
    return "\n".join(out)


def test_block_is_the_pages_commands():
    block = quick_start_block()
    assert "lathe train configs/align-source-small.yaml --run-dir runs/align-source" in block
    assert "source.checkpoint=runs/align-source" in block
    assert (ROOT / "configs" / "align-source-small.yaml").exists()


def test_quick_start_runs_as_written(tmp_path):
    assert (SHARED / "corpora" / "pubmedqa_ori_pqal.json").exists(), f"{SHARED} lacks the PubMedQA json"
    assert (SHARED / "tokenizers" / "gpt-neox-20b.json").exists(), f"{SHARED} lacks gpt-neox-20b.json"
    assert GCIDE.exists(), f"{GCIDE} is missing (Debian's dict-gcide; scripts/install-deps.sh)"
    root = tmp_path / "repo"
    root.mkdir()
    (root / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "shared").symlink_to(SHARED.resolve())
    env = dict(os.environ, PATH=f"{Path(LATHE).resolve().parent}:{os.environ['PATH']}")
    script = "set -euo pipefail\n" + smaller(quick_start_block()) + "\n"
    p = subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr[-6000:]}"
    work = root / "runs" / "align-neox-medical"  # configs/align-example.yaml's align.work_dir
    summary = p.stdout[p.stdout.index("align run: done"):]
    for stage in ("terms", "prepare source", "prepare target", "embed source", "embed target", "map",
                  "apply", "eval"):
        assert re.search(rf"^\s+{stage}\s+ran\s", summary, re.M), (stage, summary)
    ev = json.loads((work / "eval.json").read_text())
    assert ev["documents"] == 5 and len(ev["models"]) == 2, ev
    new_tokens = json.loads((work / "target" / "tokenizer.new_tokens.json").read_text())
    config = json.loads((work / "model" / "config.json").read_text())
    assert len(new_tokens["tokens"]) > 0
    assert config["vocab_size"] >= new_tokens["target_vocab_size"], config["vocab_size"]
