"""The folders of src/ are layers whose includes point down only (docs/ARCHITECTURE.md).

Each folder may include its own headers and those of the layers below it in LAYERS; `fuzz` (the
reader fuzzing harness) sits beside `model`, over the readers it fuzzes (config.json is read by
the model families). A folder of src/ that is not
listed here fails the test, so a new folder has to take its place in the order.

src/cli/ (the binary's argument parsing) is the top: nothing includes it.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

# Lowest first: a folder may include itself and anything before it.
LAYERS = ["core", "io", "tokenizer", "data", "ops", "dist", "model", "optim", "infer", "run", "align", "cli"]
# Folders outside the chain, with the layer they sit on.
BESIDE = {"fuzz": "model"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z0-9_]+)/([^"]+)"', re.M)


def allowed(folder):
    top = BESIDE.get(folder, folder)
    below = set(LAYERS[: LAYERS.index(top) + 1])
    return below | {folder}


def sources():
    for path in sorted(SRC.rglob("*")):
        if path.suffix in {".h", ".cpp", ".cu", ".cuh"}:
            yield path


def includes(path):
    for m in INCLUDE.finditer(path.read_text(encoding="utf-8", errors="replace")):
        yield m.group(1), m.group(2)


def test_every_folder_has_a_layer():
    folders = sorted(p.name for p in SRC.iterdir() if p.is_dir())
    unknown = [f for f in folders if f not in LAYERS and f not in BESIDE]
    assert not unknown, f"src/ folders without a place in LAYERS or BESIDE: {unknown}"
    assert "core" in folders and "cli" in folders


def test_includes_point_down():
    upward = []
    checked = 0
    for path in sources():
        folder = path.relative_to(SRC).parts[0]
        ok = allowed(folder)
        for target, rest in includes(path):
            if not (SRC / target).is_dir():
                continue  # a third-party header such as "nlohmann/json.hpp"
            checked += 1
            if target not in ok:
                upward.append(f"{path.relative_to(ROOT)} includes {target}/{rest}")
    assert checked > 500, f"only {checked} project includes found: is the pattern right?"
    assert not upward, "includes that point up a layer:\n" + "\n".join(upward)


def test_rule_catches_an_upward_include():
    # The rule itself: a core file including a model header would be refused.
    assert "model" not in allowed("core")
    assert "run" not in allowed("model")
    assert "data" in allowed("fuzz") and "run" not in allowed("fuzz")
    assert "ops" in allowed("dist") and "model" not in allowed("dist")
