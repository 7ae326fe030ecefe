"""bench/generate_baseline.py, the transformers inference baseline `lathe bench --generate` is
compared with on the GPU, kept working off it: a CPU smoke run on the tiny shape (eager decode)
prints one JSON line whose keys are those of lathe's line (plus the baseline's decode_mode and
compile_error), whose numbers follow the definitions both share (bytes per decode step from the
lengths, FLOPs of a prefill), and bad requests exit 2 with an error naming the option. On a GPU (skipped without one) the
tiny shape runs in bf16 and the line carries the copy bandwidth and each batch's fraction of it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NEEDS_CUDA

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "generate_baseline.py"
LATHE = os.environ.get("LATHE_BIN", "build/lathe")
SMOKE = ["--prefill", "64,128", "--decode-batches", "1,4", "--prompt-len", "32",
         "--decode-steps", "6", "--decode-warmup", "2"]


def run(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke():
    p = run("--preset", "tiny", "--device", "cpu", "--compile", "off", *SMOKE)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout
    return json.loads(lines[0])


def test_smoke_run_reports_prefill_and_decode(smoke):
    r = smoke
    assert r["framework"] == "transformers" and r["device"] == "cpu" and r["precision"] == "fp32"
    assert r["decode_mode"] == "eager" and r["compile_error"] is None
    # tiny: V 512, C 64, 2 layers of 4 heads (2 KV heads) of 16, F 192, tied.
    layer = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 192 + 2 * 64
    assert r["params"] == r["flop_params"] == 2 * layer + 64 + 512 * 64
    assert [row["tokens"] for row in r["prefill"]] == [64, 128]
    body = r["flop_params"] - 512 * 64
    for row in r["prefill"]:
        T = row["tokens"]
        assert row["seconds"] > 0 and row["tokens_per_s"] == pytest.approx(T / row["seconds"])
        assert row["flops"] == 2 * body * T + 2 * 512 * 64 + 2 * 2 * 4 * 16 * T * (T + 1)
        assert row["mfu"] is None
    assert r["kv_bytes_per_position"] == 2 * 2 * 2 * 16 * 4
    assert r["weight_bytes"] == r["flop_params"] * 4
    for row, B in zip(r["decode"], [1, 4]):
        assert row["batch"] == B and row["tokens_per_step"] == B
        assert row["ms_per_step"] > 0
        assert row["tokens_per_s"] == pytest.approx(B / (row["ms_per_step"] / 1e3))
        # Lengths after the timed steps k = 2..7: 32 + k + 1, every row.
        lengths = sum(32 + k + 1 for k in range(2, 8)) / 6
        assert row["bytes_per_step"] == pytest.approx(
            r["weight_bytes"] + r["kv_bytes_per_position"] * B * lengths)
        assert row["bandwidth_fraction"] is None
    assert r["copy_bandwidth"] is None and r["peak_memory_bytes"] > 0


def test_keys_are_those_of_lathe_bench_generate(smoke):
    if not Path(LATHE).exists():
        pytest.fail(f"LATHE_BIN {LATHE} not found: build the lathe target")
    p = subprocess.run([LATHE, "bench", "--generate", "--preset", "tiny", "--device", "cpu", *SMOKE],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lathe = json.loads(p.stdout.strip().splitlines()[-1])
    # decode_mode/compile_error are the baseline's, kv_block_size/cuda_graphs/decode_gemv/
    # peer_reduce/decode_output lathe's engine options.
    assert set(smoke) - {"decode_mode", "compile_error"} == set(lathe) - {
        "kv_block_size", "cuda_graphs", "decode_gemv", "peer_reduce", "decode_output"}
    assert set(smoke["prefill"][0]) == set(lathe["prefill"][0])
    # inputs_ms/forward_ms/widen_ms: lathe's engine split of a step.
    assert set(smoke["decode"][0]) - {"decode_mode"} == set(lathe["decode"][0]) - {
        "inputs_ms", "forward_ms", "widen_ms"}
    assert all(row["decode_mode"] == smoke["decode_mode"] for row in smoke["decode"])
    # The shared definitions give the same model-derived numbers.
    for key in ("params", "flop_params", "weight_bytes", "kv_bytes_per_position", "max_len"):
        assert smoke[key] == lathe[key], key
    for mine, theirs in zip(smoke["prefill"], lathe["prefill"]):
        assert mine["flops"] == theirs["flops"]
    for mine, theirs in zip(smoke["decode"], lathe["decode"]):
        assert mine["bytes_per_step"] == pytest.approx(theirs["bytes_per_step"], rel=1e-12)


@pytest.mark.parametrize("args,needle", [
    (["--decode-batches", "1,0"], "--decode-batches"),
    (["--prefill", "1000"], "--prefill 1000"),
    (["--prefill", "", "--prompt-len", "250", "--decode-steps", "8"], "--prompt-len 250"),
    (["--prefill", "", "--decode-batches", ""], "nothing to measure"),
])
def test_bad_requests_exit_2_naming_the_option(args, needle):
    p = run("--preset", "tiny", "--device", "cpu", *args)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr


def test_cuda_smoke_run_measures_the_copy_bandwidth():
    # Asked in a child: torch loaded here would bring its own CUDA libraries into this process.
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != "True":
        pytest.skip(NEEDS_CUDA + "torch sees no GPU here")
    p = run("--preset", "tiny", "--device", "cuda", "--compile", "off", *SMOKE)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["device"] == "cuda" and r["precision"] == "bf16" and r["copy_bandwidth"] > 1e10
    assert r["weight_bytes"] == 2 * r["flop_params"]
    for row in r["decode"]:
        assert row["bandwidth_fraction"] == pytest.approx(
            row["bytes_per_step"] / (row["ms_per_step"] / 1e3) / r["copy_bandwidth"])
