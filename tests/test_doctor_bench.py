"""End-to-end tests of `lathe doctor` and `lathe bench`.

Checked here, through the `lathe` binary (LATHE_BIN):
  - doctor: the table and --json agree on the verdict, which is the table's last line; on a
    machine without a usable GPU (CI, or CUDA_VISIBLE_DEVICES="" anywhere) it says "ready: CPU
    only", lists what still works and exits 0; the cuDNN and NCCL versions it reports are those
    the libraries themselves return when loaded here through ctypes (or "not found" when they do
    not load); with a GPU, every self-test comparison passed and the exit code is 0;
  - bench: presets have the published parameter counts (GPT-2 small 124,439,808; Llama-3.2-1B
    1,235,814,400) and the FLOPs per token of torch_baseline.py's convention (--plan-only runs
    nothing); a tiny model trains on the CPU in well under a second per step and prints one JSON
    line whose values are consistent (tokens/s from the median step, loss at init near ln V,
    measured memory at least the arenas'); runs are reproducible from the seed and differ
    across seeds; a config.json path works like a preset; bad requests exit non-zero naming the
    option.
"""
import ctypes
import json
import math
import os
import platform
import shutil
import subprocess

import pytest
from conftest import NEEDS_CUDA

LATHE = os.environ.get("LATHE_BIN", "build/lathe")


def run(args, env=None, timeout=120):
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run([LATHE] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def doctor_json(env=None):
    p = run(["doctor", "--json"], env=env)
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout
    return p, json.loads(lines[0])


def bench(*args, env=None):
    p = run(["bench", *args], env=env)
    assert p.returncode == 0, f"lathe bench {args} failed ({p.returncode}):\n{p.stderr}"
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line, got:\n{p.stdout}"
    return json.loads(lines[0])


# ---- doctor ----

def library_version(names, symbol, by_pointer):
    """The version a library reports of itself, loaded as the dynamic loader finds it."""
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if by_pointer:
            v = ctypes.c_int(0)
            assert getattr(lib, symbol)(ctypes.byref(v)) == 0
            code = v.value
            if code < 10000:  # NCCL before 2.9
                return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
        else:
            fn = getattr(lib, symbol)
            fn.restype = ctypes.c_size_t
            code = fn()
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return None


def test_doctor_json_and_table_agree():
    p, j = doctor_json()
    for key in ["cuda_build", "driver_version", "driver_cuda_version", "runtime_cuda_version", "devices",
                "libraries", "self_test", "status", "verdict", "no_gpu"]:
        assert key in j, key
    assert j["status"] in ("gpu_ready", "cpu_only", "not_ready")
    text = run(["doctor"])
    assert text.returncode == p.returncode
    assert text.stdout.strip().splitlines()[-1] == j["verdict"]
    assert j["verdict"].startswith("not ready:" if j["status"] == "not_ready" else "ready:")
    assert p.returncode == (1 if j["status"] == "not_ready" else 0), p.stderr
    if j["cuda_build"]:
        assert j["runtime_cuda_version"] is not None
        assert j["libraries"]["cublaslt"]["found"]
        major, minor, patch = map(int, j["libraries"]["cublaslt"]["version"].split("."))
        assert major >= 11


def test_doctor_library_versions_are_the_libraries_own():
    _, j = doctor_json()
    for key, names, symbol, by_pointer in [
            ("cudnn", ["libcudnn.so.9", "libcudnn.so"], "cudnnGetVersion", False),
            ("nccl", ["libnccl.so.2", "libnccl.so"], "ncclGetVersion", True)]:
        want = library_version(names, symbol, by_pointer)
        lib = j["libraries"][key]
        if want is None:
            assert not lib["found"] and lib["version"] is None, lib
            assert "not found" in lib["detail"]
        else:
            assert lib["found"], lib
            assert lib["version"] == want, (key, lib, want)


def test_doctor_without_gpu_says_what_still_works():
    # Hiding every device makes any machine one without a GPU.
    p, j = doctor_json(env={"CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 0, p.stderr
    assert j["status"] == "cpu_only" and j["no_gpu"]
    assert j["devices"] == [] and j["self_test"] == []
    assert j["verdict"].startswith("ready: CPU only")
    for works in ["tokenize", "prepare", "convert", "train"]:
        assert works in j["verdict"]
    text = run(["doctor"], env={"CUDA_VISIBLE_DEVICES": ""})
    assert text.returncode == 0
    assert "GPU        none" in text.stdout
    assert text.stdout.strip().splitlines()[-1] == j["verdict"]


def test_doctor_on_a_gpu_runs_the_self_test():
    p, j = doctor_json()
    if not j["devices"]:
        pytest.skip(NEEDS_CUDA + "no GPU here: " + str(j["device_error"]))
    for d in j["devices"]:
        assert d["compute_capability"].count(".") == 1 and d["sm_count"] > 0
        assert 0 < d["free_memory_bytes"] <= d["memory_bytes"]
        cc = tuple(map(int, d["compute_capability"].split(".")))
        assert d["bf16"] == (cc >= (8, 0)) and d["fp8"] == (cc >= (8, 9))
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.split()
        assert j["driver_version"] == smi[0]
    usable = [d for d in j["devices"] if d["bf16"] and d["kernels"]]
    names = {t["name"].split(" ")[0] for t in j["self_test"]}
    assert {"linear_forward", "linear_backward", "rmsnorm_forward", "grad_norm_l2"} <= names
    assert len({t["device"] for t in j["self_test"]}) == len(usable)
    for t in j["self_test"]:
        assert t["passed"], t
        assert t["failing_elements"] == 0 and t["max_abs_error"] is not None
    # The FP8 line of every usable GPU: one FP8 GEMM against the CPU reference where it has FP8
    # tensor cores, "fp8: none (...)" naming the GPU where it has not.
    for d in j["devices"]:
        if not (d["bf16"] and d["kernels"]):
            continue
        f = d["fp8_self_test"]
        assert f["line"].startswith("fp8: ok" if d["fp8"] else "fp8: none"), f
        assert f["passed"] == d["fp8"], f
    assert j["status"] == "gpu_ready" and p.returncode == 0


def test_doctor_coherent_memory_line():
    """Without a GPU: "coherent CPU-GPU memory: no GPU" and null in JSON. With one: a yes/no
    answer per GPU with the attributes behind it and the pinned host->device bandwidth measured;
    an x86-64 host has no coherent CPU-GPU link (GH200's NVLink-C2C is aarch64 only)."""
    p, j = doctor_json(env={"CUDA_VISIBLE_DEVICES": ""})
    assert j["coherent_cpu_gpu_memory"] is None
    text = run(["doctor"], env={"CUDA_VISIBLE_DEVICES": ""}).stdout.splitlines()
    assert "           coherent CPU-GPU memory: no GPU" in text

    p, j = doctor_json()
    if not j["devices"]:
        pytest.skip(NEEDS_CUDA + "no GPU here: " + str(j["device_error"]))
    text = run(["doctor"]).stdout
    for d in j["devices"]:
        link = d["host_link"]
        assert link["error"] is None, link
        assert link["coherent"] == (link["pageable_memory_access"] and link["uses_host_page_tables"])
        assert link["summary"].startswith("yes (" if link["coherent"] else "no (")
        assert link["host_memory_path"] == ("system_allocated" if link["coherent"] else "page_locked")
        assert link["pinned_copy_bytes"] > 0 and link["pinned_h2d_bytes_per_s"] > 1e9, link
        assert "coherent CPU-GPU memory: " + link["summary"] in text
        assert f"pinned host->device {link['pinned_h2d_bytes_per_s'] / 1e9:.1f} GB/s" in text
        if platform.machine() == "x86_64":
            assert not link["coherent"], link
    assert j["coherent_cpu_gpu_memory"] == all(d["host_link"]["coherent"] for d in j["devices"])


# ---- bench ----

def llama_params(V, C, L, H, Hkv, F, tied=True):
    D = C // H
    layer = 2 * C + C * (H + 2 * Hkv) * D + H * D * C + 3 * C * F
    return V * C * (1 if tied else 2) + L * layer + C


def gpt2_params(V, P, C, L):
    layer = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return V * C + P * C + L * layer + 2 * C


def test_bench_plan_only_published_shapes():
    g = bench("--model", "gpt2-124m", "--batch", 32, "--seq", 1024, "--plan-only")
    assert g["params"] == 124_439_808 == gpt2_params(50257, 1024, 768, 12)
    # N of 6N: without the token and position tables, with the (tied) head.
    assert g["flop_params"] == 124_439_808 - 1024 * 768
    assert g["flops_per_token"] == 6 * g["flop_params"] + 12 * 12 * 768 * 1024
    assert g["plan_only"] and g["plan_bytes"] > 4 * 4 * g["params"]
    l1 = bench("--model", "llama-1b", "--batch", 8, "--seq", 2048, "--plan-only")
    assert l1["params"] == 1_235_814_400 == llama_params(128256, 2048, 16, 32, 8, 8192)
    assert l1["flop_params"] == l1["params"]  # tied, no position table
    assert l1["flops_per_token"] == 6 * l1["params"] + 12 * 16 * 2048 * 2048
    # torch_baseline.py pads GPT-2's vocabulary to 50304.
    padded = bench("--model", "gpt2-124m", "--batch", 32, "--seq", 1024, "--plan-only",
                   "--vocab-size", 50304)
    assert padded["params"] == g["params"] + (50304 - 50257) * 768


def test_bench_tiny_on_cpu():
    B, T, steps = 2, 32, 3
    r = bench("--model", "tiny", "--batch", B, "--seq", T, "--steps", steps, "--warmup", 1,
              "--device", "cpu")
    assert r["model"] == "tiny" and r["device"] == "cpu" and r["device_name"].startswith("cpu (")
    assert (r["batch"], r["seq"], r["steps"], r["warmup"]) == (B, T, steps, 1)
    assert r["params"] == llama_params(512, 64, 2, 4, 2, 192)
    assert r["flops_per_token"] == 6 * r["params"] + 12 * 2 * 64 * T
    assert r["mfu"] is None and r["peak_flops"] is None
    assert 0 < r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"] < 1000
    assert r["step_ms_min"] <= r["step_ms_mean"] <= r["step_ms_max"]
    assert r["tokens_per_s"] == pytest.approx(B * T / (r["step_ms_median"] / 1e3), rel=1e-9)
    # Random init (std 0.02): the logits are near zero, so the loss is near ln V.
    assert abs(r["loss_first"] - math.log(512)) < 0.1
    assert math.isfinite(r["loss_last"]) and r["grad_norm_last"] > 0
    # Measured: the process's peak resident set, which holds every arena the plan counts.
    assert r["peak_memory_source"] == "max_rss"
    assert r["peak_memory_bytes"] >= r["plan_bytes"] > 0


def test_bench_tiny_gpt2_on_cpu():
    r = bench("--model", "tiny-gpt2", "--batch", 2, "--seq", 16, "--steps", 2, "--warmup", 0,
              "--device", "cpu")
    assert r["params"] == gpt2_params(512, 256, 64, 2)
    assert r["flop_params"] == r["params"] - 256 * 64
    assert abs(r["loss_first"] - math.log(512)) < 0.1


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt2"])
def test_bench_auto_device_without_a_gpu_is_the_cpu(model):
    """auto takes the CPU where no device is visible."""
    r = bench("--model", model, "--batch", 2, "--seq", 16, "--steps", 1, "--warmup", 0,
              env={"CUDA_VISIBLE_DEVICES": ""})
    assert (r["requested_device"], r["device"]) == ("auto", "cpu")


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt2"])
def test_bench_auto_device_on_a_gpu(model):
    """auto takes the GPU when doctor says it is usable; there the step matches the CPU's."""
    doctor = doctor_json()[1]
    if doctor["status"] != "gpu_ready":
        pytest.skip(NEEDS_CUDA + "lathe doctor says: " + doctor["verdict"])
    args = ["--model", model, "--batch", 2, "--seq", 64, "--steps", 3, "--warmup", 1]
    r = bench(*args)
    assert r["requested_device"] == "auto"
    gpu = doctor["devices"][0]
    assert r["device"] == "cuda" and r["device_name"] == gpu["name"]
    if gpu["compute_capability"].startswith("9."):
        assert r["peak_flops"] == 989.4e12
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 989.4e12)
    assert r["peak_memory_source"] == "cuda_mem_get_info"
    # Measured device memory holds at least the planned arenas (cudaMalloc rounds up).
    assert r["peak_memory_bytes"] >= 0.9 * r["plan_bytes"] > 0
    # Same init and batches as the CPU reference: the same losses within bf16 accuracy.
    cpu = bench(*args, "--device", "cpu")
    assert r["params"] == cpu["params"]
    assert r["loss_first"] == pytest.approx(cpu["loss_first"], rel=1e-2)
    assert r["loss_last"] == pytest.approx(cpu["loss_last"], rel=2e-2)
    assert r["grad_norm_last"] == pytest.approx(cpu["grad_norm_last"], rel=5e-2)


def test_bench_plan_only_on_the_cpu():
    """--plan-only plans the CPU run of GPT-2 small: f32 masters, gradients and both moments
    are 16 bytes per parameter at least."""
    cpu = bench("--model", "gpt2-124m", "--batch", 8, "--seq", 1024, "--plan-only",
                "--device", "cpu")
    assert cpu["device"] == "cpu" and cpu["params"] == 124_439_808
    assert cpu["plan_bytes"] > 16 * cpu["params"]


def test_bench_plan_only_follows_the_device():
    """The CUDA plan (bf16 activations and weight copy, CudaState buffers) needs no GPU, only a
    CUDA build."""
    if not doctor_json()[1]["cuda_build"]:
        pytest.skip(NEEDS_CUDA + "this lathe is built without CUDA")
    args = ["--model", "gpt2-124m", "--batch", 8, "--seq", 1024, "--plan-only"]
    cpu = bench(*args, "--device", "cpu")
    cuda = bench(*args, "--device", "cuda")
    assert (cpu["device"], cuda["device"]) == ("cpu", "cuda")
    # Masters, gradients and both moments are f32 on both: 16 bytes per parameter at least.
    assert cuda["plan_bytes"] > 16 * cuda["params"]
    # bf16 activations: well under the CPU's f32 plan at this size.
    assert cuda["plan_bytes"] < cpu["plan_bytes"]


def test_bench_is_reproducible_from_the_seed():
    args = ["--model", "tiny", "--batch", 2, "--seq", 16, "--steps", 3, "--warmup", 0,
            "--device", "cpu"]
    a = bench(*args)
    b = bench(*args)
    c = bench(*args, "--seed", 99)
    for key in ["loss_first", "loss_last", "grad_norm_last"]:
        assert a[key] == b[key], key
    assert a["loss_first"] != c["loss_first"]


def test_bench_config_json_path(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300,
           "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
           "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for model in [tmp_path, tmp_path / "config.json"]:
        r = bench("--model", model, "--batch", 1, "--seq", 8, "--steps", 1, "--warmup", 0,
                  "--device", "cpu")
        assert r["params"] == llama_params(300, 32, 1, 2, 1, 64, tied=False)
        assert r["flop_params"] == r["params"] - 300 * 32  # untied: the input table is a lookup
        assert abs(r["loss_first"] - math.log(300)) < 0.1


def test_bench_errors_name_the_option():
    p = run(["bench", "--model", "gpt5", "--batch", 1, "--seq", 8])
    assert p.returncode == 2 and "gpt2-124m" in p.stderr and "llama-1b" in p.stderr
    p = run(["bench", "--model", "tiny", "--batch", 1, "--seq", 300, "--device", "cpu"])
    assert p.returncode == 2 and "max_position_embeddings" in p.stderr, p.stderr
    p = run(["bench", "--model", "tiny", "--batch", 0, "--seq", 8, "--device", "cpu"])
    assert p.returncode == 2 and "--batch" in p.stderr
    p = run(["bench", "--model", "tiny", "--batch", 1, "--seq", 8, "--steps", 0])
    assert p.returncode == 2 and "--steps" in p.stderr
    p = run(["bench", "--model", "tiny", "--batch", 1, "--seq", 8, "--device", "tpu"])
    assert p.returncode != 0 and "--device" in p.stderr
    # No GPU (hidden): --device cuda refuses instead of falling back.
    p = run(["bench", "--model", "tiny", "--batch", 1, "--seq", 8, "--device", "cuda"],
            env={"CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 1 and "--device: cuda, but" in p.stderr and "use auto or cpu" in p.stderr, p.stderr


def test_bench_kernel_breakdown_is_a_gpu_option():
    p = run(["bench", "--model", "tiny", "--batch", 1, "--seq", 8, "--device", "cpu",
             "--kernel-breakdown", 2])
    assert p.returncode != 0 and "--kernel-breakdown profiles GPU kernels" in p.stderr, p.stderr
    p = run(["bench", "--model", "tiny", "--generate", "--prefill", 16, "--prompt-len", 8,
             "--decode-steps", 2, "--device", "cpu", "--kernel-breakdown", 2])
    assert p.returncode != 0 and "it takes CUDA and --decode-batches" in p.stderr, p.stderr
    # --kernel-trace writes the breakdown's records: without --kernel-breakdown it is refused
    # before any step runs, and --generate does not take it.
    p = run(["bench", "--model", "tiny", "--batch", 1, "--seq", 8, "--device", "cpu",
             "--kernel-trace", "t.json"])
    assert p.returncode != 0 and "add --kernel-breakdown 1 or more" in p.stderr, p.stderr
    p = run(["bench", "--model", "tiny", "--batch", 1, "--seq", 8, "--device", "cpu",
             "--kernel-breakdown", 1, "--kernel-trace", "/nonexistent-folder/t.json"])
    assert p.returncode != 0 and "the folder /nonexistent-folder does not exist" in p.stderr, p.stderr
    p = run(["bench", "--model", "tiny", "--generate", "--prefill", 16, "--prompt-len", 8,
             "--decode-steps", 2, "--device", "cpu", "--kernel-trace", "t.json"])
    assert p.returncode != 0 and "--kernel-trace is a training bench option" in p.stderr, p.stderr


def test_bench_kernel_breakdown_on_a_gpu(tmp_path):
    """The CUPTI breakdown: every step's GEMMs, attention, norms and optimizer are seen, busy <=
    span, and the timed numbers are the timed steps' (the same loss as a run without it)."""
    doctor = doctor_json()[1]
    if doctor["status"] != "gpu_ready":
        pytest.skip(NEEDS_CUDA + "lathe doctor says: " + doctor["verdict"])
    args = ["--model", "tiny", "--batch", 2, "--seq", 64, "--steps", 2, "--warmup", 1,
            "--device", "cuda"]
    trace = tmp_path / "trace.json"
    r = bench(*args, "--kernel-breakdown", 2, "--kernel-trace", trace)
    k = r["kernels"]
    assert k["steps"] == 2
    # The trace: one event per record on its stream's track, the groups the breakdown counts.
    assert k["trace"] == str(trace)
    events = json.loads(trace.read_text())["traceEvents"]
    records = [e for e in events if e["ph"] == "X"]
    assert records and all(e["dur"] >= 0 and e["ts"] >= 0 for e in records)
    assert {e["cat"] for e in records} >= {"gemm", "attention", "norms", "optimizer"}
    assert {e["tid"] for e in records} == {e["tid"] for e in events if e["ph"] == "M"}
    assert 0 < k["busy_ms_per_step"] <= k["span_ms_per_step"] + 1e-9
    assert k["gaps_ms_per_step"] == pytest.approx(k["span_ms_per_step"] - k["busy_ms_per_step"])
    groups = {g["name"]: g for g in k["groups"]}
    for g in ("gemm", "attention", "norms", "optimizer"):
        assert g in groups and groups[g]["ms_per_step"] > 0, (g, sorted(groups))
    assert len(k["top"]) > 0
    plain = bench(*args)
    assert r["loss_last"] == plain["loss_last"]
