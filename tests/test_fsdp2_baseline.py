"""bench/fsdp2_baseline.py, the PyTorch FSDP2 + torch.compile baseline that scripts/gpu-check.sh's
scaling part runs on the GPU machine, kept working off it: its --help, its error when
torch_baseline.py (the shared bench folder's model) is not found, and two-rank runs under torchrun
on the CPU (gloo, the tiny shape; eager, unsharded after the forward, compiled, and the untied
head with each block recomputed in the backward) that print one JSON line with ddp_baseline.py's
keys; and the parameter count of its MFU for a tied and an untied head.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "fsdp2_baseline.py"
SHARED_BENCH = Path(os.environ.get("LATHE_SHARED_DIR", ROOT.parent / "shared")) / "bench"


def run(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_help_names_the_models_and_the_launcher():
    p = run(SCRIPT, "--help")
    assert p.returncode == 0, p.stderr
    assert "torchrun" in p.stdout
    for model in ("gpt2", "llama1b", "llama8b", "tiny"):
        assert model in p.stdout


def test_a_missing_torch_baseline_is_an_error(tmp_path):
    p = run(SCRIPT, "tiny", "--device", "cpu", "--torch-baseline-dir", tmp_path)
    assert p.returncode != 0
    assert f"torch_baseline.py not found in {tmp_path}" in p.stderr
    assert "Traceback" not in p.stderr


def ddp_keys():
    """The keys of ddp_baseline.py's JSON line, read from its json.dumps({...}) call."""
    text = (SHARED_BENCH / "ddp_baseline.py").read_text()
    call = text[text.index("json.dumps({"):]
    return set(re.findall(r'"(\w+)":', call[: call.index("})")]))


# --compile: the GPU runs' form (each block compiled, then sharded), here through inductor's CPU
# backend (about a minute on two cores).
def load_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("fsdp2_baseline", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_mfu_counts_a_tied_head_once_and_an_untied_head_once():
    if not (SHARED_BENCH / "torch_baseline.py").is_file():
        pytest.skip(f"no torch_baseline.py in {SHARED_BENCH} (LATHE_SHARED_DIR)")
    sys.path.insert(0, str(SHARED_BENCH))
    import torch_baseline as tb
    fb = load_script()
    c = fb.TINY
    d, v, f, L = c["d"], c["vocab"], c["ff"], c["layers"]
    hd = d // c["heads"]
    # per block: q, o (d x d), k, v (d x kv*hd), gate, up, down (d x f), two RMSNorm weights
    block = 2 * d * d + 2 * d * c["kv"] * hd + 3 * d * f + 2 * d
    for name, tied in (("tiny", True), ("tiny-untied", False)):
        shape = fb.shape_of(tb, name)
        assert shape.get("tied", True) == tied
        model = tb.GPT(shape)
        # the blocks, the final norm and the head (v x d, once either way); no embedding lookup
        assert fb.flop_params(model, shape) == L * block + d + v * d, name
    big = fb.shape_of(tb, "llama8b")
    assert (big["layers"], big["T"], big["d"], big.get("tied", True)) == (32, 8192, 4096, False)


@pytest.mark.parametrize("extra", [[], ["--no-reshard"], ["--compile"], ["--checkpoint", "--untied"]])
def test_two_ranks_on_the_cpu_print_one_json_line(extra):
    if not (SHARED_BENCH / "torch_baseline.py").is_file():
        pytest.skip(f"no torch_baseline.py in {SHARED_BENCH} (LATHE_SHARED_DIR)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    model = "tiny-untied" if "--untied" in extra else "tiny"
    extra = [x for x in extra if x != "--untied"]
    p = run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", SCRIPT, model,
            "--device", "cpu", "--torch-baseline-dir", SHARED_BENCH, "--steps", "3", "--warmup", "1",
            *extra, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, p.stdout  # rank 0 alone prints
    r = json.loads(lines[0])
    assert ddp_keys() <= set(r), (ddp_keys(), r)
    assert r["what"] == ("fsdp2+compile " if "--compile" in extra else "fsdp2 ") + model and r["world"] == 2
    assert r["B"] == 2 and r["T"] == 64 and r["reshard"] == ("--no-reshard" not in extra)
    assert r["checkpoint"] == ("--checkpoint" in extra)
    assert r["tok_s_per_gpu"] > 0 and r["step_ms"] > 0
    # total = world * B * T / median step, per GPU = B * T / median step (rounded each)
    assert abs(r["tok_s_total"] - 2 * r["tok_s_per_gpu"]) <= 2
    # step_ms is rounded to 0.1 ms: up to 0.05 ms off, a relative 0.05 / step_ms of the rate.
    rounding = r["tok_s_per_gpu"] * 0.05 / r["step_ms"]
    assert abs(r["tok_s_per_gpu"] - 2 * 64 / (r["step_ms"] / 1e3)) <= rounding + 1
