"""lathe train with optimizer.offload: cpu (optim/host_optimizer.h): the f32 masters and AdamW
moments in host memory, stepped by CpuAdamW, whose math is ops' AdamW exactly. On the CPU
backend an offloaded run's losses, gradient norms and checkpoint (weights and optimizer state)
equal the device optimizer's bit for bit; a checkpoint of either resumes under the other with
the same bits; bf16 moments train and resume exactly; the overlapped schedule (the default) and
the serial one give the same bits and resume each other's checkpoints; with
optimizer.offload_fraction below 1 (the last units offloaded, the rest stepped by the device AdamW)
the bits are those of offload none and of offload 1, and a checkpoint of a run at fraction 0.5
resumes at fraction 1 and without offload as the unstopped run goes on. The delayed schedule
(each step computes with the weights before the last update) trains, differs from the serial
bits from step 2 on, and resumes exactly from its own checkpoint (where the update in flight was
applied). The gpu cases do the same on CUDA (skipped without a GPU)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lathe_cli import TINY_MODEL_48, run, tiny_training_folder, train_cmd

ROOT = Path(__file__).resolve().parent.parent

TINY = TINY_MODEL_48 + """
train:
  steps: 6
  micro_batch_size: 4
  gradient_accumulation_steps: 2
  log_interval: 1
  eval_interval: 3
  eval_iters: 2
  threads: 2
optimizer:
  lr: 3.0e-3
  weight_decay: 0.1
lr:
  warmup: 0.1
checkpoint:
  interval: 3
  keep_last: 0
"""

OFFLOAD = "optimizer.offload=cpu"
SERIAL = "optimizer.offload_schedule=serial"
CKPT_FILES = ("model.safetensors", "optimizer.safetensors")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_training_folder(tmp_path_factory.mktemp("offload_train_corpus"), TINY, 300_000)


def metric_lines(run_dir):
    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        j = json.loads(line)
        for measured in ("tokens_per_s", "mfu", "memory_bytes"):
            j.pop(measured, None)
        out.append(j)
    return out


def checkpoint_bytes(run_dir, step):
    d = Path(run_dir) / "checkpoints" / f"step-{step:08d}"
    return {f: (d / f).read_bytes() for f in CKPT_FILES}


def rewind(src, dst, step):
    """A copy of run `src` as a run stopped after checkpoint `step`: the later checkpoints gone,
    `latest` naming it."""
    shutil.copytree(src, dst)
    ck = Path(dst) / "checkpoints"
    for d in ck.iterdir():
        if d.name.startswith("step-") and int(d.name.split("-")[1]) > step:
            shutil.rmtree(d)
    (ck / "latest").write_text(f"step-{step:08d}\n")


def assert_resume_goes_on(corpus, ref, resumed, step, last, *sets):
    """Run `ref` rewound to its checkpoint `step` as `resumed` and trained on with `sets` goes on
    as `ref` did: the same metrics and step-`last` checkpoint."""
    rewind(ref, resumed, step)
    run(train_cmd(corpus, resumed, *sets))
    assert metric_lines(resumed) == metric_lines(ref)
    assert checkpoint_bytes(resumed, last) == checkpoint_bytes(ref, last)


def test_offload_equals_device_optimizer_bit_for_bit(corpus, tmp_path):
    plain, off = tmp_path / "plain", tmp_path / "off"
    run(train_cmd(corpus, plain))
    p = run(train_cmd(corpus, off, OFFLOAD))
    assert "host memory plan (optimizer offload" in p.stderr, p.stderr
    assert "AdamW state in host memory" in p.stderr, p.stderr
    assert metric_lines(off) == metric_lines(plain)
    for step in (3, 6):
        assert checkpoint_bytes(off, step) == checkpoint_bytes(plain, step), step


def test_offload_with_frozen_groups_equals_device_optimizer(corpus, tmp_path):
    """train.freeze: the frozen entries are left out of the host step's segments as out of the
    device step's: the same bits."""
    freeze = "train.freeze=[model.embed_tokens.*, model.layers.0.mlp.*]"
    plain, off = tmp_path / "plain", tmp_path / "off"
    run(train_cmd(corpus, plain, freeze, "train.steps=3"))
    run(train_cmd(corpus, off, freeze, "train.steps=3", OFFLOAD))
    assert metric_lines(off) == metric_lines(plain)
    assert checkpoint_bytes(off, 3) == checkpoint_bytes(plain, 3)


def test_serial_and_overlapped_schedules_give_the_same_bits(corpus, tmp_path):
    """optimizer.offload_schedule: the overlapped step (gradients copied unit by unit from the
    backward's hook, the update on a worker thread while the next forward waits per unit) and the
    serial one give the same losses, norms and checkpoints, with a frozen group too; a checkpoint
    of the overlapped run resumes under the serial schedule bit-exactly."""
    freeze = "train.freeze=[model.layers.0.mlp.*]"
    over, serial = tmp_path / "over", tmp_path / "serial"
    run(train_cmd(corpus, over, OFFLOAD, freeze))
    run(train_cmd(corpus, serial, OFFLOAD, SERIAL, freeze))
    assert metric_lines(over) == metric_lines(serial)
    for step in (3, 6):
        assert checkpoint_bytes(over, step) == checkpoint_bytes(serial, step), step
    assert_resume_goes_on(corpus, over, tmp_path / "resumed", 3, 6, OFFLOAD, SERIAL, freeze)


DELAYED = "optimizer.offload_schedule=delayed"


def test_delayed_schedule_trains_one_update_behind_and_resumes_exactly(corpus, tmp_path):
    """optimizer.offload_schedule: delayed: step 1's loss is the serial run's, step 2 computes
    with the initial weights again (another loss); the checkpoint and the validation at step 3
    apply the update in flight, and a run stopped there goes on as the unstopped one."""
    delayed, serial = tmp_path / "delayed", tmp_path / "serial"
    p = run(train_cmd(corpus, delayed, OFFLOAD, DELAYED))
    assert "delayed schedule (each step computes with the weights before the last update)" \
        in p.stderr, p.stderr
    run(train_cmd(corpus, serial, OFFLOAD, SERIAL))
    d = [m for m in metric_lines(delayed) if m["split"] == "train"]
    s = [m for m in metric_lines(serial) if m["split"] == "train"]
    assert d[0]["loss"] == s[0]["loss"]
    assert d[1]["loss"] != s[1]["loss"]
    assert d[-1]["loss"] < d[0]["loss"], (d[0], d[-1])
    assert_resume_goes_on(corpus, delayed, tmp_path / "resumed", 3, 6, OFFLOAD, DELAYED)


@pytest.mark.parametrize("first,then", [((OFFLOAD,), (OFFLOAD,)), ((OFFLOAD,), ()), ((), (OFFLOAD,))])
def test_resume_is_exact_with_and_across_offload(corpus, tmp_path, first, then):
    ref = tmp_path / "ref"
    run(train_cmd(corpus, ref, *first))
    assert_resume_goes_on(corpus, ref, tmp_path / "resumed", 3, 6, *then)


def test_bf16_moments_train_and_resume_exactly(corpus, tmp_path):
    bf16 = (OFFLOAD, "optimizer.state_dtype=bf16", "train.steps=12", "checkpoint.interval=6")
    ref = tmp_path / "ref"
    p = run(train_cmd(corpus, ref, *bf16))
    assert "moments in bf16" in p.stderr, p.stderr
    lines = [m for m in metric_lines(ref) if m["split"] == "train"]
    assert lines[-1]["loss"] < lines[0]["loss"] - 0.3, (lines[0], lines[-1])
    fp32 = tmp_path / "fp32"
    run(train_cmd(corpus, fp32, OFFLOAD, "train.steps=12", "checkpoint.interval=6"))
    assert metric_lines(fp32) != metric_lines(ref)  # the moments carry 8 bits between steps
    assert_resume_goes_on(corpus, ref, tmp_path / "resumed", 6, 12, *bf16)


# Clipping at 0.25 (the tiny run's norms are above it: checked), so that both optimizers scale
# every gradient by the norm they read.
CLIP = "optimizer.gradient_clipping=0.25"
HALF = "optimizer.offload_fraction=0.5"


def train_norms(run_dir):
    return [m["grad_norm"] for m in metric_lines(run_dir) if m["split"] == "train"]


def test_fraction_equals_offload_none_and_offload_one_bit_for_bit(corpus, tmp_path):
    """offload_fraction 0.5 and 0.01 (the back unit and the last layer on the host, the rest on
    the device AdamW) under both schedules, and 0.5 with a frozen group in each part: losses,
    norms and both checkpoint files equal offload none's and offload 1's."""
    runs = {}
    for name, sets in (("none", ()), ("one", (OFFLOAD,)), ("half", (OFFLOAD, HALF)),
                       ("half-serial", (OFFLOAD, HALF, SERIAL)),
                       ("small", (OFFLOAD, "optimizer.offload_fraction=0.01"))):
        runs[name] = tmp_path / name
        p = run(train_cmd(corpus, runs[name], CLIP, *sets))
        if name == "half":
            assert "master mirror (f32, GPU part)" in p.stderr, p.stderr
            assert "offload_fraction 0.5" in p.stderr, p.stderr
    assert min(train_norms(runs["none"])) > 0.25  # the clip is exercised at every step
    for name in ("one", "half", "half-serial", "small"):
        assert metric_lines(runs[name]) == metric_lines(runs["none"]), name
        for step in (3, 6):
            assert checkpoint_bytes(runs[name], step) == checkpoint_bytes(runs["none"], step), \
                (name, step)
    freeze = "train.freeze=[model.embed_tokens.*, model.layers.1.mlp.*]"
    plain, half = tmp_path / "freeze-none", tmp_path / "freeze-half"
    run(train_cmd(corpus, plain, CLIP, freeze, "train.steps=3"))
    run(train_cmd(corpus, half, CLIP, freeze, "train.steps=3", OFFLOAD, HALF))
    assert metric_lines(half) == metric_lines(plain)
    assert checkpoint_bytes(half, 3) == checkpoint_bytes(plain, 3)


@pytest.mark.parametrize("then", [(OFFLOAD,), (), (OFFLOAD, HALF, SERIAL)],
                         ids=["at-one", "at-none", "at-half-serial"])
def test_fraction_checkpoint_resumes_exactly_across_fractions(corpus, tmp_path, then):
    """A run at fraction 0.5 stopped after step 3 and resumed at fraction 1, without offload and
    at 0.5 under the serial schedule goes on as the unstopped run: the same metrics and step-6
    checkpoint; and a checkpoint of offload 1 resumes at 0.5."""
    ref = tmp_path / "ref"
    run(train_cmd(corpus, ref, CLIP, OFFLOAD, HALF))
    assert_resume_goes_on(corpus, ref, tmp_path / "resumed", 3, 6, CLIP, *then)
    if then == (OFFLOAD,):
        one = tmp_path / "one"
        run(train_cmd(corpus, one, CLIP, OFFLOAD))
        back = tmp_path / "back"
        rewind(one, back, 3)
        run(train_cmd(corpus, back, CLIP, OFFLOAD, HALF))
        assert metric_lines(back) == metric_lines(ref)
        assert checkpoint_bytes(back, 6) == checkpoint_bytes(ref, 6)


def test_bf16_moments_without_offload_give_the_offloaded_bits(corpus, tmp_path):
    # The device optimizer's bf16 moments (ops/adamw.h) and CpuAdamW's (optim/cpu_adamw.h) are
    # the same widen, f32 update, round: the same losses and checkpoints, and a resume across
    # the two is exact.
    bf16 = ("optimizer.state_dtype=bf16", "train.steps=12", "checkpoint.interval=6")
    dev, off = tmp_path / "dev", tmp_path / "off"
    p = run(train_cmd(corpus, dev, *bf16))
    assert "optimizer state (m, v in bf16)" in p.stderr, p.stderr
    run(train_cmd(corpus, off, OFFLOAD, *bf16))
    assert metric_lines(dev) == metric_lines(off)
    for step in (6, 12):
        assert checkpoint_bytes(dev, step) == checkpoint_bytes(off, step), step
    assert_resume_goes_on(corpus, off, tmp_path / "resumed", 6, 12, *bf16)


def test_bf16_moments_at_a_fraction_give_the_same_bits(corpus, tmp_path):
    """With bf16 moments the device part of offload_fraction 0.5 keeps its moments in bf16 too
    (the plan says so and counts 2 B a moment): losses, norms and checkpoints equal offload
    none's with bf16 moments under both schedules, and a resume from offload 1 at 0.5 is
    exact."""
    bf16 = ("optimizer.state_dtype=bf16", CLIP)
    none, half = tmp_path / "none", tmp_path / "half"
    run(train_cmd(corpus, none, *bf16))
    p = run(train_cmd(corpus, half, OFFLOAD, HALF, *bf16))
    assert "optimizer state (m, v in bf16)" in p.stderr, p.stderr
    assert "offload_fraction 0.5" in p.stderr, p.stderr
    serial = tmp_path / "half-serial"
    run(train_cmd(corpus, serial, OFFLOAD, HALF, SERIAL, *bf16))
    for r in (half, serial):
        assert metric_lines(r) == metric_lines(none), r.name
        for step in (3, 6):
            assert checkpoint_bytes(r, step) == checkpoint_bytes(none, step), (r.name, step)
    one = tmp_path / "one"
    run(train_cmd(corpus, one, OFFLOAD, *bf16))
    assert_resume_goes_on(corpus, one, tmp_path / "resumed", 3, 6, OFFLOAD, HALF, *bf16)


def assert_train_refused(corpus, tmp_path, sets, needle):
    """lathe train with `sets` stops before its first checkpoint with an error holding `needle`."""
    p = run(train_cmd(corpus, tmp_path / "r", *sets), check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr and needle in p.stderr, p.stderr
    assert not (tmp_path / "r" / "checkpoints").exists()


# ---- GPU: the same bits on CUDA ---------------------------------------------------------------

def gpu_present():
    return shutil.which("nvidia-smi") is not None and \
        subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def gpu_train_args(corpus, run_dir, *sets):
    """configs/tiny.yaml on cuda with deterministic kernels, 6 steps of accumulation 2."""
    return ["train", ROOT / "configs" / "tiny.yaml", "--run-dir", run_dir,
            "--set", f"data.path={corpus / 'gc'}", "--set", f"data.tokenizer={corpus / 'tok.json'}",
            "--set", "train.device=cuda", "--set", "train.deterministic=true",
            "--set", "train.steps=6", "--set", "train.gradient_accumulation_steps=2",
            "--set", "train.log_interval=1", "--set", "train.eval_interval=3",
            "--set", "checkpoint.interval=3", "--set", "checkpoint.keep_last=0",
            *[a for s in sets for a in ("--set", s)]]


@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU (nvidia-smi -L)")
def test_gpu_offload_equals_device_optimizer_and_resumes_exactly(corpus, tmp_path):
    # The offloaded step (overlapped: gradients D2H per unit during the backward, CpuAdamW on the
    # worker, bf16 weights H2D per unit before each layer's forward) against the CUDA AdamW
    # kernel, same bits; resume across both ways.
    def args(run_dir, *sets):
        return gpu_train_args(corpus, run_dir, *sets)
    plain, off = tmp_path / "plain", tmp_path / "off"
    run(args(plain))
    run(args(off, OFFLOAD))
    assert metric_lines(off) == metric_lines(plain)
    for step in (3, 6):
        assert checkpoint_bytes(off, step) == checkpoint_bytes(plain, step), step
    for src, then in ((off, ()), (plain, (OFFLOAD,))):
        resumed = tmp_path / f"resumed-{src.name}"
        rewind(src, resumed, 3)
        run(args(resumed, *then))
        assert metric_lines(resumed) == metric_lines(src)
        assert checkpoint_bytes(resumed, 6) == checkpoint_bytes(src, 6)
    bf16 = tmp_path / "bf16"
    run(args(bf16, OFFLOAD, "optimizer.state_dtype=bf16"))
    lines = [m for m in metric_lines(bf16) if m["split"] == "train"]
    assert lines[-1]["loss"] < lines[0]["loss"], (lines[0], lines[-1])
    # The CUDA AdamW kernel over bf16 moments: CpuAdamW's bits.
    dev16 = tmp_path / "dev16"
    run(args(dev16, "optimizer.state_dtype=bf16"))
    assert metric_lines(dev16) == metric_lines(bf16)
    for step in (3, 6):
        assert checkpoint_bytes(dev16, step) == checkpoint_bytes(bf16, step), step


@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU (nvidia-smi -L)")
def test_gpu_delayed_schedule_resumes_exactly(corpus, tmp_path):
    # The delayed schedule on CUDA (each update's bf16 weights H2D during the next step's last
    # backward): step 1 is the serial run's, step 2 computes with the initial weights again, and
    # a run stopped at the checkpoint of step 3 goes on as the unstopped one.
    delayed, serial = tmp_path / "delayed", tmp_path / "serial"
    run(gpu_train_args(corpus, delayed, OFFLOAD, DELAYED))
    run(gpu_train_args(corpus, serial, OFFLOAD, SERIAL))
    d = [m for m in metric_lines(delayed) if m["split"] == "train"]
    s = [m for m in metric_lines(serial) if m["split"] == "train"]
    assert d[0]["loss"] == s[0]["loss"] and d[1]["loss"] != s[1]["loss"]
    resumed = tmp_path / "resumed"
    rewind(delayed, resumed, 3)
    run(gpu_train_args(corpus, resumed, OFFLOAD, DELAYED))
    assert metric_lines(resumed) == metric_lines(delayed)
    assert checkpoint_bytes(resumed, 6) == checkpoint_bytes(delayed, 6)


@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU (nvidia-smi -L)")
def test_gpu_schedules_and_frozen_groups_give_the_device_bits(corpus, tmp_path):
    # With a frozen group (its weights copied back to the GPU by neither schedule): the serial
    # and the overlapped schedule give the CUDA AdamW kernel's bits; an overlapped checkpoint
    # resumes under the serial schedule exactly.
    freeze = "train.freeze=[model.layers.0.mlp.*]"
    plain, over, serial = tmp_path / "plain", tmp_path / "over", tmp_path / "serial"
    run(gpu_train_args(corpus, plain, freeze))
    run(gpu_train_args(corpus, over, freeze, OFFLOAD))
    run(gpu_train_args(corpus, serial, freeze, OFFLOAD, SERIAL))
    assert metric_lines(over) == metric_lines(plain)
    assert metric_lines(serial) == metric_lines(plain)
    for step in (3, 6):
        assert checkpoint_bytes(over, step) == checkpoint_bytes(plain, step), step
        assert checkpoint_bytes(serial, step) == checkpoint_bytes(plain, step), step
    resumed = tmp_path / "resumed"
    rewind(over, resumed, 3)
    run(gpu_train_args(corpus, resumed, freeze, OFFLOAD, SERIAL))
    assert metric_lines(resumed) == metric_lines(over)
    assert checkpoint_bytes(resumed, 6) == checkpoint_bytes(over, 6)


@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU (nvidia-smi -L)")
def test_gpu_fraction_gives_the_device_bits_and_resumes_across_fractions(corpus, tmp_path):
    # offload_fraction 0.5 under both schedules (the first units stepped by the CUDA AdamW kernel
    # over their device masters, the last ones by CpuAdamW) with clipping: the bits of offload
    # none and of offload 1; a checkpoint at 0.5 resumes at 1 and without offload as the
    # unstopped run goes on.
    def args(run_dir, *sets):
        return gpu_train_args(corpus, run_dir, CLIP, *sets)
    plain, one, half, serial = (tmp_path / n for n in ("plain", "one", "half", "serial"))
    run(args(plain))
    run(args(one, OFFLOAD))
    p = run(args(half, OFFLOAD, HALF))
    assert "master mirror (f32, GPU part)" in p.stderr, p.stderr
    run(args(serial, OFFLOAD, HALF, SERIAL))
    for other in (one, half, serial):
        assert metric_lines(other) == metric_lines(plain), other.name
        for step in (3, 6):
            assert checkpoint_bytes(other, step) == checkpoint_bytes(plain, step), (other.name, step)
    for then in ((OFFLOAD,), ()):
        resumed = tmp_path / f"resumed-{len(then)}"
        rewind(half, resumed, 3)
        run(args(resumed, *then))
        assert metric_lines(resumed) == metric_lines(half)
        assert checkpoint_bytes(resumed, 6) == checkpoint_bytes(half, 6)
    # bf16 moments on both sides of the split: the device kernel's and CpuAdamW's bf16 bits.
    bf16 = "optimizer.state_dtype=bf16"
    plain16, half16 = tmp_path / "plain16", tmp_path / "half16"
    run(args(plain16, bf16))
    p = run(args(half16, OFFLOAD, HALF, bf16))
    assert "optimizer state (m, v in bf16)" in p.stderr, p.stderr
    assert metric_lines(half16) == metric_lines(plain16)
    for step in (3, 6):
        assert checkpoint_bytes(half16, step) == checkpoint_bytes(plain16, step), step


def test_bench_offload_fraction_plans_and_steps_the_same_bits():
    """lathe bench --offload cpu --offload-fraction F: the device optimizer's losses and norm on
    the CPU backend at several fractions; the plans count the split: the GPU plan of the 8B shape
    adds 12 B (f32 master and moments) per element kept on the device, the host plan holds 18 B
    per offloaded element and a 4 B mirror of the rest."""
    def bench(*extra):
        p = run(["bench", "--preset", "tiny", "--batch", "2", "--seq", "32", "--steps", "3",
                 "--warmup", "1", "--accum", "2", "--device", "cpu", *extra])
        return json.loads(p.stdout)
    plain = bench()
    for f in ("1", "0.5", "0.01"):
        off = bench("--offload", "cpu", "--offload-fraction", f)
        assert off["offload_fraction"] == float(f)
        for key in ("loss_first", "loss_last", "grad_norm_last"):
            assert off[key] == plain[key], (f, key)

    def plan(*extra):
        p = run(["bench", "--preset", "llama3-8b", "--batch", "1", "--seq", "4096", "--recompute",
                 "full", "--device", "cuda", "--plan-only", *extra])
        return json.loads(p.stdout)
    whole = plan("--offload", "cpu")
    half = plan("--offload", "cpu", "--offload-fraction", "0.5")
    P = whole["params"]
    kept = P - half["offloaded_params"]  # elements on the device (the arena has no padding here)
    assert whole["offloaded_params"] == P and 0 < kept <= P // 2
    assert half["plan"]["optimizer"] == 8 * kept
    assert half["plan"]["parameters"] == whole["plan"]["parameters"] + 4 * kept
    assert half["plan_bytes"] == whole["plan_bytes"] + 12 * kept
    assert half["host_pinned_bytes"] == 18 * (P - kept) + 4 * kept
    p = run(["bench", "--preset", "tiny", "--batch", "2", "--seq", "32", "--device", "cpu",
             "--offload-fraction", "0.5"], check=False)
    assert p.returncode != 0 and "--offload-fraction 0.5 needs --offload cpu" in p.stderr, p.stderr
    p = run(["bench", "--preset", "tiny", "--batch", "2", "--seq", "32", "--device", "cpu",
             "--offload", "cpu", "--offload-fraction", "0"], check=False)
    assert p.returncode != 0 and "--offload-fraction must be in (0, 1], got 0" in p.stderr, p.stderr


def test_bench_offload_steps_the_same_bits():
    """lathe bench --offload cpu times the offloaded step: on the CPU backend its losses and norm
    equal the device optimizer's; the plan and the host memory plan are printed."""
    def bench(*extra):
        p = run(["bench", "--preset", "tiny", "--batch", "2", "--seq", "32", "--steps", "3",
                 "--warmup", "1", "--device", "cpu", *extra])
        return json.loads(p.stdout), p.stderr
    plain, _ = bench()
    off, err = bench("--offload", "cpu")
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert off[key] == plain[key], key
    assert off["offload"] == "cpu" and off["host_pinned_bytes"] > 0
    assert off["offload_schedule"] == "overlapped" and off["host_peak_rss_bytes"] > 0
    assert "gpu_busy_fraction" not in off and "gpu_weight_wait_ms" not in off  # CUDA only
    # the overlapped worker's time for each of the 3 timed steps' updates, none other
    assert off["host_updates"] == 3
    assert 0 < off["host_update_ms"] <= off["host_update_ms_max"] < 1e5
    # One timed step after one warmup: its update alone, however fast the tiny update finishes
    # against the main thread (each update is taken by its AdamW step number).
    for _ in range(10):
        one = json.loads(run(["bench", "--preset", "tiny", "--batch", "2", "--seq", "32",
                              "--steps", "1", "--warmup", "1", "--device", "cpu", "--offload",
                              "cpu"]).stdout)
        assert one["host_updates"] == 1, one
    assert "host memory plan (optimizer offload" in err, err
    serial, _ = bench("--offload", "cpu", "--offload-schedule", "serial")
    assert serial["offload_schedule"] == "serial" and "host_update_ms" not in serial
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert serial[key] == plain[key], key
    # delayed: the warmup's update runs during the first timed step, which computes with the
    # initial weights as the warmup did; each timed step's update is timed
    delayed, _ = bench("--offload", "cpu", "--offload-schedule", "delayed")
    assert delayed["offload_schedule"] == "delayed" and delayed["host_updates"] == 3
    assert delayed["loss_last"] != plain["loss_last"]
    p = run(["bench", "--preset", "tiny", "--batch", "2", "--seq", "32", "--device", "cpu",
             "--offload", "cpu", "--offload-schedule", "delayed", "--offload-fraction", "0.5"],
            check=False)
    assert p.returncode != 0 and "--offload-schedule delayed runs every optimizer update on " \
        "the host" in p.stderr, p.stderr
    # accumulation: the offloaded step of 2 micro-batches, the device optimizer's bits
    accum, _ = bench("--accum", "2")
    off_accum, _ = bench("--accum", "2", "--offload", "cpu")
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert off_accum[key] == accum[key], key
    assert accum["loss_last"] != plain["loss_last"]
    bf16, _ = bench("--offload", "cpu", "--state-dtype", "bf16")
    assert bf16["state_dtype"] == "bf16"
    # bf16 moments on the device optimizer: the offloaded bf16 step's bits, another update than
    # f32 moments give
    dev16, err16 = bench("--state-dtype", "bf16")
    assert dev16["state_dtype"] == "bf16" and "optimizer state (m, v in bf16)" in err16, err16
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert dev16[key] == bf16[key], key
    assert dev16["loss_last"] != plain["loss_last"]
    p = run(["bench", "--preset", "tiny", "--batch", "2", "--seq", "32", "--device", "cpu",
             "--offload-schedule", "serial"], check=False)
    assert p.returncode != 0 and "--offload-schedule serial needs --offload cpu" in p.stderr, \
        p.stderr
