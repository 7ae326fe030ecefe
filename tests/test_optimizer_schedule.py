"""optimizer.schedule (optim/adamw_optimizer.h, "Schedules"): the device AdamW run unit by unit
after the gradient norm (on CUDA on a low-priority stream while the next forward waits per unit;
on the CPU each unit when a forward first needs it) gives the serial schedule's losses, norms,
validation losses and checkpoints bit for bit, with gradient accumulation 2, clipping, a frozen
group and validation between steps; a checkpoint of either resumes under the other exactly;
offload and a bad value are refused naming the key, as is optimizer.overlap_sms (the SMs the
forward's GEMMs leave to the update on CUDA) out of range or without the overlapped schedule;
lathe bench --optimizer-schedule steps the same bits and names the schedule in its line, and
--optimizer-sms, read on CUDA alone, leaves the CPU's bits as they are. The gpu cases do the same on CUDA in bf16 and fp8
tensorwise (skipped without a GPU)."""

import json

import pytest

from lathe_cli import run, tiny_training_folder, train_cmd
from test_offload_train import (TINY, assert_train_refused, checkpoint_bytes, gpu_present,
                                gpu_train_args, metric_lines, rewind)

OVERLAPPED = "optimizer.schedule=overlapped"
SERIAL = "optimizer.schedule=serial"
FREEZE = "train.freeze=[model.layers.0.mlp.*]"
CLIP = "optimizer.gradient_clipping=0.05"
# Validation after step 4 alone: the checkpoint after step 3 follows an update that no forward
# has needed yet (on the CPU its units are still pending there).
EVAL = "train.eval_interval=4"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_training_folder(tmp_path_factory.mktemp("schedule_corpus"), TINY, 300_000)


def test_overlapped_gives_the_serial_bits_and_resumes_across(corpus, tmp_path):
    over, serial = tmp_path / "over", tmp_path / "serial"
    run(train_cmd(corpus, over, OVERLAPPED, FREEZE, CLIP, EVAL))
    run(train_cmd(corpus, serial, SERIAL, FREEZE, CLIP, EVAL))
    lines = metric_lines(serial)
    assert any(m["split"] != "train" for m in lines), lines  # validation between the steps
    assert metric_lines(over) == lines
    for step in (3, 6):
        assert checkpoint_bytes(over, step) == checkpoint_bytes(serial, step), step
    for src, then in ((over, SERIAL), (serial, OVERLAPPED)):
        resumed = tmp_path / f"resumed-{src.name}"
        rewind(src, resumed, 3)
        run(train_cmd(corpus, resumed, then, FREEZE, CLIP, EVAL))
        assert metric_lines(resumed) == metric_lines(src)
        assert checkpoint_bytes(resumed, 6) == checkpoint_bytes(src, 6)


@pytest.mark.parametrize("sets,needle", [
    (("optimizer.schedule=eager",), "'optimizer.schedule' is 'eager'; choose serial or overlapped"),
    ((OVERLAPPED, "optimizer.offload=cpu"), "set optimizer.offload_schedule instead"),
    (("optimizer.overlap_sms=8",), "'optimizer.overlap_sms' 8 is read by the overlapped schedule"),
    ((OVERLAPPED, "optimizer.overlap_sms=65"), "'optimizer.overlap_sms' must be the SMs"),
    ((OVERLAPPED, "optimizer.overlap_sms=-1"), "'optimizer.overlap_sms' must be the SMs"),
])
def test_bad_schedules_are_refused_naming_the_key(corpus, tmp_path, sets, needle):
    assert_train_refused(corpus, tmp_path, sets, needle)


def test_bench_optimizer_schedule_steps_the_same_bits():
    def bench(*extra, check=True):
        return run(["bench", "--preset", "tiny", "--batch", "2", "--seq", "32", "--steps", "3",
                    "--warmup", "1", "--device", "cpu", *extra], check=check)
    plain = json.loads(bench().stdout)
    assert plain["optimizer_schedule"] == "serial"
    over = json.loads(bench("--optimizer-schedule", "overlapped").stdout)
    assert over["optimizer_schedule"] == "overlapped"
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert over[key] == plain[key], key
    assert over["optimizer_sms"] == 0
    # The SMs left to the update are read on CUDA alone: the CPU steps the same bits.
    sms = json.loads(bench("--optimizer-schedule", "overlapped", "--optimizer-sms", "8").stdout)
    assert sms["optimizer_sms"] == 8
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert sms[key] == plain[key], key
    p = bench("--optimizer-sms", "8", check=False)
    assert p.returncode != 0 and "needs --optimizer-schedule overlapped" in p.stderr, p.stderr
    p = bench("--optimizer-schedule", "overlapped", "--optimizer-sms", "65", check=False)
    assert p.returncode != 0 and "optimizer.overlap_sms is 65; choose 0 to 64" in p.stderr, p.stderr
    off = json.loads(bench("--offload", "cpu").stdout)
    assert "optimizer_schedule" not in off  # offload_schedule names that optimizer's
    p = bench("--offload", "cpu", "--optimizer-schedule", "overlapped", check=False)
    assert p.returncode != 0 and "use --offload-schedule" in p.stderr, p.stderr


@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU (nvidia-smi -L)")
@pytest.mark.parametrize("precision", [(), ("train.precision=fp8", "fp8.recipe=tensorwise")],
                         ids=["bf16", "fp8-tensorwise"])
def test_gpu_overlapped_gives_the_serial_bits_and_resumes_across(corpus, tmp_path, precision):
    over, serial = tmp_path / "over", tmp_path / "serial"
    run(gpu_train_args(corpus, over, OVERLAPPED, FREEZE, CLIP, EVAL, *precision))
    run(gpu_train_args(corpus, serial, SERIAL, FREEZE, CLIP, EVAL, *precision))
    assert metric_lines(over) == metric_lines(serial)
    for step in (3, 6):
        assert checkpoint_bytes(over, step) == checkpoint_bytes(serial, step), step
    resumed = tmp_path / "resumed"
    rewind(over, resumed, 3)
    run(gpu_train_args(corpus, resumed, SERIAL, FREEZE, CLIP, EVAL, *precision))
    assert metric_lines(resumed) == metric_lines(over)
    assert checkpoint_bytes(resumed, 6) == checkpoint_bytes(over, 6)


@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU (nvidia-smi -L)")
def test_gpu_bench_overlapped_steps_the_same_bits():
    def bench(*extra):
        p = run(["bench", "--preset", "tiny", "--batch", "4", "--seq", "128", "--steps", "4",
                 "--warmup", "1", "--device", "cuda", *extra])
        return json.loads(p.stdout)
    serial = bench("--optimizer-schedule", "serial")
    over = bench("--optimizer-schedule", "overlapped")
    assert over["optimizer_schedule"] == "overlapped"
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert over[key] == serial[key], key
