"""bench/offload_8b.sh, the optimizer-offload reference job, checked off the GPU machine with a
stub lathe and a stub nvidia-smi: each row takes the largest micro-batch whose plan fits the GPU's
free memory, fp32 moments where the host holds them and bf16 where it does not, offload fractions
below 1 only where `lathe bench --help` lists --offload-fraction; a run that fails hands over to
the next setting; a row without one is written as an error; every row lands in OUT/rows.jsonl.
"""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "offload_8b.sh"
GIB = 2**30

# lathe bench, as the script calls it: --help, --plan-only (plan_bytes = B x STUB_GIB_PER_SEQ GiB,
# host_pinned_bytes = f P (18 or 14 B)), a run (its arguments back as JSON, or a failure at
# STUB_FAIL_BATCH).
STUB_LATHE = r'''#!/usr/bin/env python3
import json, os, sys
a = sys.argv[1:]
if "--help" in a:
    print("--accum" + (" --offload-fraction" if os.environ.get("STUB_FRACTION") == "1" else ""))
    sys.exit(0)
def arg(k, d=None):
    return a[a.index(k) + 1] if k in a else d
P = {"llama3-8b": 8.0e9, "llama2-13b": 13.0e9}[arg("--preset")]
B, dtype, f = int(arg("--batch")), arg("--state-dtype"), float(arg("--offload-fraction", "1"))
if "--plan-only" in a:
    print(json.dumps({"plan_bytes": B * float(os.environ["STUB_GIB_PER_SEQ"]) * 2**30,
                      "host_pinned_bytes": f * P * (18 if dtype == "fp32" else 14)}))
    sys.exit(0)
if str(B) == os.environ.get("STUB_FAIL_BATCH") and arg("--precision") == "fp8":
    print("lathe: error: CUDA out of memory", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"model": arg("--preset"), "batch": B, "seq": int(arg("--seq")),
                  "accum": int(arg("--accum")), "state_dtype": dtype, "fraction": f,
                  "precision": arg("--precision", "bf16"), "recompute": arg("--recompute"),
                  "steps": int(arg("--steps")), "warmup": int(arg("--warmup"))}))
'''


def run_script(tmp_path, fraction):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    lathe = bindir / "lathe"
    lathe.write_text(STUB_LATHE)
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 80000\n")  # MiB free: 78.1 GiB
    for f in (lathe, smi):
        f.chmod(0o755)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {128 * 2**20} kB\nMemAvailable: {120 * 2**20} kB\n")
    out = tmp_path / "out"
    env = dict(os.environ, LATHE=str(lathe), MEMINFO=str(meminfo),
               PATH=f"{bindir}:{os.environ['PATH']}", STUB_GIB_PER_SEQ="12",
               STUB_FAIL_BATCH="6", STUB_FRACTION="1" if fraction else "0")
    p = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 3, rows
    for name, row in zip(("8b-bf16", "8b-fp8", "13b-bf16"), rows):
        assert json.loads((out / f"{name}.json").read_text()) == row
        assert row["row"] == name
        if "error" not in row:
            assert 0 <= row.pop("wall_s") < 60
        row.pop("row")
    return rows


def test_rows_take_the_largest_batch_and_the_moments_that_fit(tmp_path):
    bf16, fp8, big = run_script(tmp_path, fraction=False)
    # 6 x 12 GiB fits 0.98 x 78.1 GiB; 8e9 x 18 B (134 GiB) does not fit 120 - 4 GiB, 14 B does.
    assert bf16 == {"model": "llama3-8b", "batch": 6, "seq": 4096, "accum": 4,
                    "state_dtype": "bf16", "fraction": 1.0, "precision": "bf16",
                    "recompute": "full", "steps": 2, "warmup": 1}
    # the fp8 run at B 6 fails: the next micro-batch runs
    assert fp8["precision"] == "fp8" and fp8["batch"] == 4 and fp8["state_dtype"] == "bf16"
    # 13e9 x 14 B = 169 GiB of pinned memory fits no setting without fractions
    assert "no setting's plan fits" in big["error"], big


def test_fractions_below_one_where_the_bench_has_them(tmp_path):
    bf16, _, big = run_script(tmp_path, fraction=True)
    # 8B: fp32 moments at f 0.75 (8e9 x 0.75 x 18 B = 101 GiB) come before bf16 moments
    assert bf16["state_dtype"] == "fp32" and bf16["fraction"] == 0.75 and bf16["batch"] == 6
    # 13B: fp32 at f 0.5 (109 GiB)
    assert big["model"] == "llama2-13b" and big["seq"] == 2048 and big["batch"] == 2
    assert big["state_dtype"] == "fp32" and big["fraction"] == 0.5
