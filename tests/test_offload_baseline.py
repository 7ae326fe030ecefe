"""bench/offload_baseline.py, the PyTorch optimizer-offload baseline beside `lathe bench --offload
cpu`, kept working off the GPU machine: the tiny shape on the CPU with accumulation and recompute
prints one JSON line with the fields it shares with `lathe bench`, and the counts in it follow
from the arguments; a missing torch_baseline.py is an error without a traceback.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "offload_baseline.py"
SHARED_BENCH = Path(os.environ.get("LATHE_SHARED_DIR", ROOT.parent / "shared")) / "bench"

# The fields of `lathe bench --offload cpu`'s line that the baseline reports with their meaning.
BENCH_KEYS = {"model", "device", "batch", "seq", "accum", "params", "flop_params", "flops_per_token",
              "recompute", "offload", "state_dtype", "offload_schedule", "steps", "warmup",
              "tokens_per_s", "step_ms_median", "s_per_it", "mfu", "peak_memory_bytes",
              "peak_memory_source", "host_peak_rss_bytes", "loss_first", "loss_last",
              "grad_norm_last"}


def run(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_tiny_on_the_cpu_prints_one_json_line_with_the_bench_keys():
    if not (SHARED_BENCH / "torch_baseline.py").is_file():
        pytest.skip(f"no torch_baseline.py in {SHARED_BENCH} (LATHE_SHARED_DIR)")
    p = run("--preset", "tiny", "--batch", "2", "--seq", "32", "--accum", "2", "--layers", "3",
            "--steps", "2", "--warmup", "1", "--recompute", "--device", "cpu",
            "--torch-baseline-dir", SHARED_BENCH)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, p.stdout
    r = json.loads(lines[0])
    assert BENCH_KEYS <= set(r), BENCH_KEYS - set(r)
    assert (r["batch"], r["seq"], r["accum"], r["layers"], r["steps"]) == (2, 32, 2, 3, 2)
    assert r["recompute"] == "full" and r["offload"] == "cpu" and r["mfu"] is None
    # tiny, tied, 3 blocks: V C + 3 (2 C + C (H + 2 Hkv) D + C C + 3 C F) + C
    C, F, V = 64, 192, 512
    block = 2 * C + C * (4 + 2 * 2) * 16 + C * C + 3 * C * F
    assert r["params"] == V * C + 3 * block + C
    assert r["flops_per_token"] == 6 * r["flop_params"] + 12 * 3 * C * 32
    # tokens_per_s = K B T / median step, s_per_it the same median in seconds
    assert r["tokens_per_s"] == pytest.approx(2 * 2 * 32 / r["s_per_it"], rel=1e-9)
    assert r["s_per_it"] == pytest.approx(r["step_ms_median"] / 1e3, rel=1e-12)
    assert r["peak_memory_bytes"] > 0 and r["host_peak_rss_bytes"] > 0
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert r[key] == r[key] and abs(r[key]) < float("inf"), r  # finite
    assert r["loss_last"] != r["loss_first"]  # the optimizer stepped


def test_a_missing_torch_baseline_is_an_error(tmp_path):
    p = run("--preset", "tiny", "--batch", "1", "--seq", "8", "--device", "cpu",
            "--torch-baseline-dir", tmp_path)
    assert p.returncode != 0
    assert f"offload_baseline.py: error: torch_baseline.py not found in {tmp_path}" in p.stderr
    assert "Traceback" not in p.stderr
