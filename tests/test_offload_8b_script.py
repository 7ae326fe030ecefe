"""bench/offload_8b.sh, the optimizer-offload reference job, checked off the GPU machine with a
stub lathe and a stub nvidia-smi: each row takes the first schedule (selective recompute at
micro-batch 1 before full recompute at larger ones, the same sequences a step), bf16 moments before
fp32, and the smallest offload fraction (only where `lathe bench --help` lists --offload-fraction)
whose plan fits the GPU's free memory and the host's; a run that fails hands over to the next
setting; a row without one is written as an error; every row lands in OUT/rows.jsonl.
"""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "offload_8b.sh"
GIB = 2**30

# lathe bench, as the script calls it: --help, --plan-only (plan_bytes: B x STUB_GIB_PER_SEQ GiB with
# full recompute, STUB_GIB_SELECTIVE GiB for selective at B 1, plus the device part's masters and
# moments, (1 - f) P (8 or 12 B); host_pinned_bytes = f P (14 or 18 B)), a run (its arguments back as
# JSON, or a failure for fp8 with selective recompute when STUB_FAIL_SELECTIVE_FP8 is set).
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
rc = arg("--recompute")
if "--plan-only" in a:
    act = float(os.environ["STUB_GIB_SELECTIVE"]) if rc == "selective" else \
        B * float(os.environ["STUB_GIB_PER_SEQ"])
    device_part = (1 - f) * P * (8 if dtype == "bf16" else 12)
    print(json.dumps({"plan_bytes": act * 2**30 + device_part,
                      "host_pinned_bytes": f * P * (18 if dtype == "fp32" else 14)}))
    sys.exit(0)
if rc == "selective" and arg("--precision") == "fp8" and os.environ.get("STUB_FAIL_SELECTIVE_FP8"):
    print("lathe: error: CUDA out of memory", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"model": arg("--preset"), "batch": B, "seq": int(arg("--seq")),
                  "accum": int(arg("--accum")), "state_dtype": dtype, "fraction": f,
                  "precision": arg("--precision", "bf16"), "recompute": rc,
                  "steps": int(arg("--steps")), "warmup": int(arg("--warmup")),
                  "offload_schedule": arg("--offload-schedule", "overlapped")}))
'''


def run_script(tmp_path, fraction, schedule=None):
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
               STUB_GIB_SELECTIVE="60", STUB_FAIL_SELECTIVE_FP8="1",
               STUB_FRACTION="1" if fraction else "0")
    if schedule is not None:
        env["OFFLOAD_SCHEDULE"] = schedule
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


def test_rows_take_the_first_schedule_and_the_moments_that_fit(tmp_path):
    bf16, fp8, big = run_script(tmp_path, fraction=False)
    # selective at B 1 (60 GiB) fits 0.98 x 78.1 GiB; bf16 moments come first: 8e9 x 14 B (104
    # GiB) fits 120 - 4 GiB
    assert bf16 == {"model": "llama3-8b", "batch": 1, "seq": 4096, "accum": 24,
                    "state_dtype": "bf16", "fraction": 1.0, "precision": "bf16",
                    "recompute": "selective", "steps": 2, "warmup": 1,
                    "offload_schedule": "overlapped"}
    # fp8 at selective B 1 fails (bf16 moments; fp32's 134 GiB pinned does not fit): the next
    # schedule, full B 6 x 4 (72 GiB)
    assert fp8["precision"] == "fp8" and fp8["recompute"] == "full"
    assert (fp8["batch"], fp8["accum"], fp8["state_dtype"]) == (6, 4, "bf16")
    # 13e9 x 14 B = 169 GiB of pinned memory fits no setting without fractions
    assert "no setting's plan fits" in big["error"], big
    assert "fraction 1 alone" not in big["error"], big


def test_the_smallest_fraction_that_fits_where_the_bench_has_them(tmp_path):
    bf16, _, big = run_script(tmp_path, fraction=True)
    # 8B selective B 1: 60 GiB + (1 - f) 8e9 x 8 B fits 76.5 GiB from f 0.8 (71.9 GiB) on
    assert (bf16["recompute"], bf16["batch"], bf16["accum"]) == ("selective", 1, 24)
    assert bf16["state_dtype"] == "bf16" and bf16["fraction"] == 0.8
    # 13B: selective leaves the host short at every fraction the GPU holds (f 0.9: 152 GiB
    # pinned); full B 2 x 4 at f 0.5: 24 + 48.4 GiB on the GPU, 84.8 GiB pinned
    assert big["model"] == "llama2-13b" and big["seq"] == 2048
    assert (big["recompute"], big["batch"], big["accum"]) == ("full", 2, 4)
    assert big["state_dtype"] == "bf16" and big["fraction"] == 0.5


def test_the_delayed_schedule_takes_fraction_one_alone(tmp_path):
    """OFFLOAD_SCHEDULE=delayed passes --offload-schedule delayed and tries the fraction 1 only,
    even where the bench has --offload-fraction: the 13B row then fits no setting."""
    bf16, fp8, big = run_script(tmp_path, fraction=True, schedule="delayed")
    for row in (bf16, fp8):
        assert row["offload_schedule"] == "delayed" and row["fraction"] == 1.0, row
    assert (bf16["recompute"], bf16["batch"]) == ("selective", 1)
    assert "no setting's plan fits" in big["error"], big
    # The error says what the least demanding plan needs of the host, and why only fraction 1
    assert "--preset llama2-13b" in big["error"] and "B of pinned host memory" in big["error"], big
    assert "tries the offload fraction 1 alone" in big["error"], big


def test_an_unknown_schedule_stops_before_any_row(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True,
                       env=dict(os.environ, LATHE="/bin/true", OFFLOAD_SCHEDULE="eager"),
                       timeout=60)
    assert p.returncode == 2
    assert "OFFLOAD_SCHEDULE=eager: choose serial, overlapped or delayed" in p.stderr, p.stderr
    assert not out.exists()
