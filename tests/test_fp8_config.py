"""The fp8.* keys of lathe train: each bad value stops before any work, naming the key, the value
and what to choose (run/train_settings.cpp through model/fp8_state.h's fp8_settings_parse); and
train.precision fp8 where it cannot run (the CPU backend, an LM head ops/linear has no fp8 GEMM
for, token counts cuBLASLt's FP8 GEMMs do not take) stops before step 1, naming the backend or
the key (run/trainer.cpp, model/model.h's model_check_fp8)."""

import json
import math
import shutil
from pathlib import Path

import pytest

from lathe_cli import TINY_MODEL_2L, run, tiny_training_folder, train_cmd

TINY = TINY_MODEL_2L + """train:
  steps: 2
  micro_batch_size: 2
  threads: 2
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_training_folder(tmp_path_factory.mktemp("fp8_corpus"), TINY, 200_000)


@pytest.mark.parametrize("sets,needle", [
    (["fp8.recipe=rowwise"], "'fp8.recipe' is 'rowwise'; choose tensorwise, delayed or blockwise"),
    (["fp8.grad_format=e3m4"], "'fp8.grad_format' is 'e3m4'; choose auto, e4m3 or e5m2"),
    (["fp8.recipe=blockwise", "fp8.grad_format=e5m2"], "set fp8.grad_format: e4m3"),
    (["fp8.recipe=delayed", "fp8.amax_history=0"], "'fp8.amax_history' is 0; choose 1 to 4096"),
    (["fp8.amax_reduction=mean"], "'fp8.amax_reduction' is 'mean'; choose max or most_recent"),
    (["fp8.lm_head=maybe"], "fp8.lm_head"),
])
def test_bad_fp8_keys_fail_before_work_naming_the_key(corpus, tmp_path, sets, needle):
    p = run(train_cmd(corpus, tmp_path / "bad", *sets), check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr, p.stderr
    assert needle in p.stderr, p.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_valid_fp8_keys_are_accepted_with_bf16(corpus, tmp_path):
    """fp8.* keys that are valid do not stop a run that does not use them: the CPU run trains."""
    p = run(train_cmd(corpus, tmp_path / "ok", "train.precision=fp32", "fp8.recipe=delayed",
                      "fp8.grad_format=e4m3", "fp8.amax_history=32", "fp8.amax_reduction=most_recent",
                      "fp8.lm_head=true"), check=False)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "ok" / "metrics.jsonl").exists()


@pytest.mark.parametrize("sets,needle", [
    (["fp8.lm_head=true", "fp8.recipe=blockwise", "fp8.grad_format=e4m3"],
     "fp8.lm_head: true with fp8.recipe: blockwise"),
    (["data.seq_length=15"], "(micro-batch 2 x sequence length 15 = 30) must be a multiple of 16"),
])
def test_fp8_what_the_linears_cannot_run_stops_before_work(corpus, tmp_path, sets, needle):
    p = run(train_cmd(corpus, tmp_path / "bad", "train.precision=fp8", *sets), check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr and "'train.precision: fp8'" in p.stderr, p.stderr
    assert needle in p.stderr, p.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "blockwise"])
def test_fp8_on_the_cpu_backend_is_an_error_naming_it(corpus, tmp_path, recipe):
    """train.device cpu asked for by name, on any machine (with a GPU or without): fp8 stops
    before any work, naming both keys and what to set."""
    p = run(train_cmd(corpus, tmp_path / "cpu", "train.precision=fp8", f"fp8.recipe={recipe}",
                      "train.device=cpu"), check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr, p.stderr
    assert "'train.precision: fp8' with 'train.device: cpu'" in p.stderr, p.stderr
    assert "the CPU backend has no fp8 linear" in p.stderr, p.stderr
    assert not (tmp_path / "cpu" / "checkpoints").exists()
    assert not (tmp_path / "cpu" / "metrics.jsonl").exists()


def fp8_gpu():
    """Whether `lathe doctor` lists a usable GPU with FP8 tensor cores."""
    p = run(["doctor", "--json"], check=False)
    try:
        devices = json.loads(p.stdout)["devices"]
    except (ValueError, KeyError):
        return False
    return any(d["fp8"] and d["bf16"] and d["kernels"] for d in devices)


def fp8_metric_lines(run_dir):
    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        j = json.loads(line)
        for measured in ("tokens_per_s", "mfu", "memory_bytes"):  # timing and memory
            j.pop(measured, None)
        out.append(j)
    return out


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "blockwise"])
def test_fp8_trains_says_so_counts_its_gemms_and_resumes_exactly(corpus, tmp_path, recipe):
    """On a GPU with FP8 tensor cores (skipped elsewhere): the first log line and metrics.jsonl's
    header name the precision and recipe, every train line has fp8_gemms equal to the header's
    fp8_gemms_per_step (2 layers x 4 linears x 3 GEMMs), and a run stopped at its step-3
    checkpoint and resumed logs the same lines, bit for bit, as one that ran straight through
    (delayed scaling: its state travels in the checkpoint). The validation pass runs at steps 3
    and 6, before the checkpoints: its forwards record no amax, so the straight run's step 4 is
    the resumed run's."""
    if not fp8_gpu():
        pytest.skip("needs a GPU with FP8 tensor cores (lathe doctor)")
    sets = ["train.precision=fp8", f"fp8.recipe={recipe}", "train.device=cuda",
            "train.log_interval=1", "checkpoint.interval=3", "train.eval_interval=3",
            "train.eval_iters=2"]
    straight = tmp_path / "straight"
    p = run(train_cmd(corpus, straight, *sets, "train.steps=6"))
    assert f"in fp8 (recipe {recipe}" in p.stderr, p.stderr
    lines = fp8_metric_lines(straight)
    header = lines[0]
    assert header["split"] == "header" and header["step"] == 0, header
    assert header["precision"] == "fp8" and header["fp8_recipe"] == recipe, header
    assert header["fp8_grad_format"] == ("e4m3" if recipe == "blockwise" else "e5m2"), header
    assert header["fp8_gemms_per_step"] == 2 * 6 * 3, header
    train = [l for l in lines if l["split"] == "train"]
    assert [l["step"] for l in train] == [1, 2, 3, 4, 5, 6]
    assert all(l["fp8_gemms"] == 36 for l in train), train
    assert all(math.isfinite(l["loss"]) for l in train), train
    valid = [l for l in lines if l["split"] == "valid"]
    assert [l["step"] for l in valid] == [3, 6], valid
    ckpt = straight / "checkpoints" / "step-00000003"
    if recipe == "delayed":
        assert (ckpt / "fp8_scaling.json").exists()
    # The run as if stopped after its step-3 checkpoint: the same command resumes from it.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000006")
    run(train_cmd(corpus, resumed, *sets, "train.steps=6"))
    assert fp8_metric_lines(resumed) == lines
