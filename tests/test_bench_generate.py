"""`lathe bench --generate`, the inference speed bench (src/run/bench_generate.h), on the CPU with
the tiny preset: one JSON line with the prefill rows (seconds, tokens/s, FLOPs of the formula,
mfu null without a peak) and the decode rows (ms per step, tokens/s, bytes read per step from the
lengths, bandwidth fraction null without a measured copy); batch 4 decodes 4 tokens a step where
batch 1 decodes 1; the preset and config.json spellings agree; bad lists, lengths beyond the
model's positions and options of the other mode are `lathe: error:` lines naming the option.
On a GPU (skipped without one): the measured copy bandwidth, the bandwidth fraction of each decode
batch and, on Hopper, the prefill MFU are in the line.
"""
import json
import os
import subprocess

import pytest
from conftest import NEEDS_CUDA

LATHE = os.environ.get("LATHE_BIN", "build/lathe")
SMOKE = ["--prefill", "64,128", "--decode-batches", "1,4", "--prompt-len", "32",
         "--decode-steps", "6", "--decode-warmup", "2", "--device", "cpu"]


def run(*args, timeout=120):
    return subprocess.run([LATHE, "bench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def bench(*args):
    p = run("--generate", *args)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line, got:\n{p.stdout}"
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def tiny():
    return bench("--preset", "tiny", *SMOKE)


def test_keys_and_positive_numbers(tiny):
    r = tiny
    for key in ("framework", "model", "device", "device_name", "precision", "params",
                "flop_params", "seed", "peak_flops", "copy_bytes", "copy_bandwidth",
                "prefill_chunk", "prefill_repeats", "prefill", "prompt_len", "decode_steps",
                "decode_warmup", "weight_bytes", "kv_bytes_per_position", "decode",
                "peak_memory_bytes", "peak_memory_source", "setup_s"):
        assert key in r, key
    assert r["setup_s"] > 0
    assert r["framework"] == "lathe" and r["device"] == "cpu" and r["precision"] == "fp32"
    assert r["peak_flops"] is None and r["copy_bandwidth"] is None and r["copy_bytes"] is None
    assert r["prefill_chunk"] == 128  # min(4096, the longest prefill)
    assert [row["tokens"] for row in r["prefill"]] == [64, 128]
    # tiny: V 512, C 64, 2 layers, 4 heads (2 KV) of 16, F 192, tied.
    layer = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 192 + 2 * 64
    assert r["params"] == r["flop_params"] == 2 * layer + 64 + 512 * 64
    body = r["flop_params"] - 512 * 64
    for row in r["prefill"]:
        T = row["tokens"]
        assert row["seconds"] > 0
        assert row["tokens_per_s"] == pytest.approx(T / row["seconds"])
        assert row["flops"] == 2 * body * T + 2 * 512 * 64 + 2 * 2 * 4 * 16 * T * (T + 1)
        assert row["mfu"] is None
    assert r["weight_bytes"] == 4 * r["flop_params"]  # f32 weights on the CPU
    assert r["kv_bytes_per_position"] == 2 * 2 * 2 * 16 * 4
    assert r["peak_memory_bytes"] > 0 and r["peak_memory_source"] == "max_rss"


def test_decode_rows_follow_the_batch(tiny):
    one, four = tiny["decode"]
    assert one["batch"] == 1 and four["batch"] == 4
    assert one["tokens_per_step"] == 1 and four["tokens_per_step"] == 4
    assert four["tokens_per_step"] == 4 * one["tokens_per_step"]
    for row in (one, four):
        B = row["batch"]
        assert row["ms_per_step"] > 0
        assert row["tokens_per_s"] == pytest.approx(B / (row["ms_per_step"] / 1e3))
        # The timed steps k = 2..7 leave each row at 32 + k + 1 positions.
        mean_len = sum(32 + k + 1 for k in range(2, 8)) / 6
        assert row["bytes_per_step"] == pytest.approx(
            tiny["weight_bytes"] + tiny["kv_bytes_per_position"] * B * mean_len)
        assert row["bandwidth_fraction"] is None
        # The engine's parts of the step (medians): each part lies inside every step, so its
        # median is at most the steps' median.
        assert row["inputs_ms"] >= 0 and row["forward_ms"] > 0 and row["widen_ms"] >= 0
        for part in ("inputs_ms", "forward_ms", "widen_ms"):
            assert row[part] <= row["ms_per_step"], part
    # Four rows read the same weights and four times the cache.
    assert four["bytes_per_step"] - tiny["weight_bytes"] == pytest.approx(
        4 * (one["bytes_per_step"] - tiny["weight_bytes"]))


def test_config_file_and_model_spelling_match_the_preset(tmp_path, tiny):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
        "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-05, "hidden_act": "silu", "rope_theta": 10000.0,
        "tie_word_embeddings": True}))
    for spelling in (["--config", cfg], ["--model", "tiny"]):
        r = bench(*spelling, "--prefill", "16", "--decode-batches", "2", "--prompt-len", "8",
                  "--decode-steps", "2", "--device", "cpu")
        assert r["params"] == tiny["params"]
        assert r["prefill"][0]["flops"] == 2 * (r["flop_params"] - 512 * 64) * 16 + 2 * 512 * 64 \
            + 2 * 2 * 4 * 16 * 16 * 17
        assert r["decode"][0]["tokens_per_step"] == 2


def test_only_prefill_or_only_decode():
    r = bench("--preset", "tiny", "--prefill", "32", "--decode-batches", "", "--device", "cpu")
    assert len(r["prefill"]) == 1 and r["decode"] == []
    r = bench("--preset", "tiny", "--prefill", "", "--decode-batches", "3", "--prompt-len", "8",
              "--decode-steps", "2", "--device", "cpu")
    assert r["prefill"] == [] and r["decode"][0]["batch"] == 3 and r["prefill_chunk"] is None


def test_max_len_gives_the_decode_engine_a_longer_context():
    # tiny's 256 positions: the steps need 8 + 4 + 2 = 14; --max-len 200 sizes the engine as a
    # server of 200-token sequences would; the bytes read per step follow the lengths alone.
    args = ["--preset", "tiny", "--prefill", "", "--decode-batches", "2", "--prompt-len", "8",
            "--decode-steps", "2", "--device", "cpu"]
    short, long = bench(*args), bench(*args, "--max-len", "200")
    assert short["max_len"] == 14 and long["max_len"] == 200
    assert long["decode"][0]["bytes_per_step"] == short["decode"][0]["bytes_per_step"]
    assert bench(*args, "--max-len", "3")["max_len"] == 14  # below what the steps need: theirs


@pytest.mark.parametrize("args,needle", [
    (["--preset", "tiny", "--decode-batches", "1,0"], "--decode-batches"),
    (["--preset", "tiny", "--decode-batches", "1,x"], "--decode-batches"),
    (["--preset", "tiny", "--prefill", "4096"], "--prefill 4096"),
    (["--preset", "tiny", "--prefill", "", "--prompt-len", "250", "--decode-steps", "8"],
     "--prompt-len 250"),
    (["--preset", "tiny", "--prefill", "", "--decode-batches", ""], "nothing to measure"),
    (["--preset", "tiny", "--decode-steps", "0"], "--decode-steps"),
    (["--preset", "tiny", "--prefill", "", "--max-len", "257"], "--max-len 257"),
    (["--preset", "tiny", "--prefill", "", "--max-len", "-1"], "--max-len -1"),
    (["--preset", "tiny", "--batch", "2"], "--batch is a training bench option"),
    (["--preset", "nope"], "--preset 'nope'"),
    (["--preset", "tiny", "--model", "tiny"], "exactly one of --model, --preset and --config"),
    (["--config", "/no/such/config.json"], "--config /no/such/config.json"),
])
def test_bad_requests_are_errors_naming_the_option(args, needle):
    p = run("--generate", *args, "--device", "cpu")
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr and needle in p.stderr, p.stderr
    assert p.stdout == ""


def test_not_enough_memory_says_how_much_is_needed(tmp_path):
    # 2e9 tied embeddings of 65536 f32: 477 TiB of weights, more than any machine has, refused
    # before anything is allocated.
    cfg = tmp_path / "huge.json"
    cfg.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2_000_000_000,
        "hidden_size": 65536, "intermediate_size": 131072, "num_hidden_layers": 2,
        "num_attention_heads": 512, "num_key_value_heads": 8, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": True}))
    p = run("--generate", "--config", cfg, "--prefill", 16, "--decode-batches", 1,
            "--prompt-len", 8, "--decode-steps", 2, "--device", "cpu")
    assert p.returncode == 2 and p.stdout == ""
    assert "lathe: error:" in p.stderr and "needs about 477.10 TiB of memory" in p.stderr, p.stderr


def test_decode_gemv_is_in_the_line_and_checked():
    r = bench("--preset", "tiny", *SMOKE, "--decode-gemv", "off")
    assert r["decode_gemv"] == "off"
    assert bench("--preset", "tiny", *SMOKE)["decode_gemv"] == "auto"
    p = run("--generate", "--preset", "tiny", *SMOKE, "--decode-gemv", "sometimes")
    assert p.returncode != 0 and "--decode-gemv" in p.stderr, p.stderr


def test_decode_output_tokens_times_greedy_picks():
    r = bench("--preset", "tiny", *SMOKE, "--decode-output", "tokens", "--kv-block-size", "8")
    assert r["decode_output"] == "tokens" and [row["batch"] for row in r["decode"]] == [1, 4]
    assert all(row["ms_per_step"] > 0 and row["forward_ms"] > 0 for row in r["decode"])
    assert bench("--preset", "tiny", *SMOKE)["decode_output"] == "logits"
    p = run("--generate", "--preset", "tiny", *SMOKE, "--decode-output", "probabilities")
    assert p.returncode != 0 and "--decode-output" in p.stderr, p.stderr


def test_generate_options_need_generate():
    p = run("--model", "tiny", "--batch", 1, "--seq", 8, "--prefill", "16", "--device", "cpu")
    assert p.returncode != 0 and "--prefill needs --generate" in p.stderr
    for option, value in (("--max-len", 64), ("--peer-reduce", "on"), ("--decode-gemv", "on")):
        p = run("--model", "tiny", "--batch", 1, "--seq", 8, option, value, "--device", "cpu")
        assert p.returncode != 0 and f"{option} needs --generate" in p.stderr, p.stderr
    p = run("--model", "tiny", "--seq", 8, "--device", "cpu")
    assert p.returncode != 0 and "--batch is required" in p.stderr


def gpu_or_skip():
    p = subprocess.run([LATHE, "doctor", "--json"], capture_output=True, text=True, timeout=300)
    j = json.loads(p.stdout.strip().splitlines()[-1])
    if not j["devices"]:
        pytest.skip(NEEDS_CUDA + "no GPU here: " + str(j["device_error"]))
    return j["devices"][0]


def test_cuda_line_has_bandwidth_and_mfu():
    d = gpu_or_skip()
    r = bench("--preset", "tiny", *[a for a in SMOKE if a != "cpu" and a != "--device"],
              "--device", "cuda")
    assert r["device"] == "cuda" and r["precision"] == "bf16"
    assert r["copy_bytes"] == 2**30 and r["copy_bandwidth"] > 1e10
    assert r["weight_bytes"] == 2 * r["flop_params"]  # bf16 weights
    assert r["kv_bytes_per_position"] == 2 * 2 * 2 * 16 * 2
    hopper = d["compute_capability"].startswith("9.")
    assert (r["peak_flops"] == 989.4e12) if hopper else r["peak_flops"] is None
    for row in r["prefill"]:
        assert row["seconds"] > 0 and ((row["mfu"] > 0) if hopper else row["mfu"] is None)
    for row in r["decode"]:
        assert row["ms_per_step"] > 0 and row["bandwidth_fraction"] > 0
        assert row["bandwidth_fraction"] == pytest.approx(
            row["bytes_per_step"] / (row["ms_per_step"] / 1e3) / r["copy_bandwidth"])
    assert r["peak_memory_source"] == "cuda_mem_get_info" and r["peak_memory_bytes"] > 0


def test_cuda_decode_kernel_breakdown_and_gemv():
    """--kernel-breakdown with --generate: each decode batch's row has the CUPTI breakdown of its
    decode steps (GEMMs and attention seen, busy <= span); --decode-gemv on gives the same line
    keys, its GEMMs under the gemm group (the skinny kernel's name holds "gemv")."""
    gpu_or_skip()
    args = ["--preset", "tiny", "--prefill", "", "--decode-batches", "1,4", "--prompt-len", 32,
            "--decode-steps", 4, "--decode-warmup", 1, "--kv-block-size", 16, "--device", "cuda"]
    for mode in ("off", "on"):
        r = bench(*args, "--kernel-breakdown", 2, "--decode-gemv", mode)
        assert r["decode_gemv"] == mode
        for row in r["decode"]:
            k = row["kernels"]
            assert k["steps"] == 2
            assert 0 < k["busy_ms_per_step"] <= k["span_ms_per_step"] + 1e-9
            groups = {g["name"]: g for g in k["groups"]}
            for g in ("gemm", "attention"):
                assert g in groups and groups[g]["ms_per_step"] > 0, (g, sorted(groups))
            if mode == "on":
                assert any("gemv" in t["name"] for t in k["top"]), k["top"]
