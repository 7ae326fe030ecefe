"""End-to-end tests of `lathe train` and `lathe eval loss` on a tiny Llama-family model.

The contract checked here (issue: training engine):
  - exact resume: a run killed with SIGKILL and started again with the same command logs the same
    losses, learning rates and gradient norms, bit for bit, as a run that was never stopped;
  - SIGTERM saves a checkpoint and exits 143; the rerun continues from it, again exactly;
  - a bad configuration fails before any work with a message naming the key;
  - the loss falls; checkpoints are complete Hugging Face folders; keep_last prunes;
  - `lathe eval loss` follows its stream-of-windows definition.
"""
import json
import signal
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from corpus import write_gcide_jsonl
from lathe_cli import LATHE, TINY_MODEL_48, run, tokenize_corpus, train_cmd, wait_for_step


TINY = TINY_MODEL_48 + """
train:
  steps: 14
  micro_batch_size: 4
  gradient_accumulation_steps: 2
  log_interval: 1
  eval_interval: 5
  eval_iters: 2
  threads: 2
optimizer:
  lr: 3.0e-3
lr:
  warmup: 0.1
checkpoint:
  interval: 4
  keep_last: 2
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_corpus")
    write_gcide_jsonl(d / "c.jsonl", 600_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 384)
    (d / "tiny.yaml").write_text(TINY + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    return d


def metric_lines(run_dir):
    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        j = json.loads(line)
        for measured in ("tokens_per_s", "mfu", "memory_bytes"):  # timing and memory, not results
            j.pop(measured, None)
        out.append(j)
    return out


def test_trains_and_loss_falls(corpus, tmp_path):
    run(train_cmd(corpus, tmp_path / "r"))
    lines = [m for m in metric_lines(tmp_path / "r") if m["split"] == "train"]
    assert [m["step"] for m in lines] == list(range(1, 15))
    assert lines[-1]["loss"] < lines[0]["loss"] - 0.5, (lines[0], lines[-1])
    for key in ("step", "split", "loss", "lr", "grad_norm", "tokens"):
        assert key in lines[0]
    assert lines[-1]["tokens"] == 14 * 4 * 2 * 32
    valid = [m for m in metric_lines(tmp_path / "r") if m["split"] == "valid"]
    assert [m["step"] for m in valid] == [5, 10, 14]
    ck = tmp_path / "r" / "checkpoints"
    steps = sorted(p.name for p in ck.iterdir() if p.name.startswith("step-"))
    assert steps == ["step-00000012", "step-00000014"]  # keep_last 2
    assert (ck / "latest").read_text().strip() == "step-00000014"
    last = ck / "step-00000014"
    for f in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.safetensors",
              "trainer_state.json"):
        assert (last / f).exists(), f
    cfg = json.loads((last / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["vocab_size"] == 384  # 384 is a multiple of 128
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["step"] == 14 and state["adam_step"] == 14


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_trains_the_same_bits(corpus, tmp_path, mode):
    # train.recompute: selective recomputes the norm and activation outputs, full all but each
    # layer's input: the same losses, gradient norms and checkpoint, to the bit (deterministic
    # ops), with a smaller plan (full smaller than selective).
    plain, recompute = tmp_path / "plain", tmp_path / "recompute"
    a = run(train_cmd(corpus, plain, "train.steps=4"))
    b = run(train_cmd(corpus, recompute, "train.steps=4", f"train.recompute={mode}"))
    assert metric_lines(plain) == metric_lines(recompute)
    assert f"{mode} recompute" in b.stderr and f"{mode} recompute" not in a.stderr

    def activations(stderr):
        return int(next(l for l in stderr.splitlines() if l.strip().startswith("activations")).split()[1])
    assert activations(b.stderr) < activations(a.stderr)
    if mode == "full":
        c = run(train_cmd(corpus, tmp_path / "selective", "train.steps=1", "train.recompute=selective"))
        assert activations(b.stderr) < activations(c.stderr)
    ck = "checkpoints/step-00000004/model.safetensors"
    assert (plain / ck).read_bytes() == (recompute / ck).read_bytes()


@pytest.mark.parametrize("kill_at", [6, 9])
def test_sigkill_resume_is_exact(corpus, tmp_path, kill_at):
    # Long enough that the kill always lands mid-run, however fast the machine.
    long_run = ("train.steps=60", "train.eval_interval=20")
    reference = tmp_path / "ref"
    run(train_cmd(corpus, reference, *long_run))
    resumed = tmp_path / "killed"
    p = subprocess.Popen([LATHE] + [str(a) for a in train_cmd(corpus, resumed, *long_run)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(resumed, kill_at, p)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (resumed / "checkpoints" / "step-00000060").exists()
    run(train_cmd(corpus, resumed, *long_run))
    assert metric_lines(resumed) == metric_lines(reference)


def test_sigterm_saves_and_rerun_continues_exactly(corpus, tmp_path):
    long_run = ("train.steps=60", "train.eval_interval=20")
    reference = tmp_path / "ref"
    run(train_cmd(corpus, reference, *long_run))
    r = tmp_path / "term"
    p = subprocess.Popen([LATHE] + [str(a) for a in train_cmd(corpus, r, *long_run)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(r, 5, p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 143, err  # 128 + SIGTERM: stopped early, checkpoint saved
    assert "SIGTERM" in err
    saved = [d.name for d in (r / "checkpoints").iterdir() if d.name.startswith("step-")]
    stopped_at = max(int(n.split("-")[1]) for n in saved)
    assert 5 <= stopped_at < 60
    run(train_cmd(corpus, r, *long_run))
    assert metric_lines(r) == metric_lines(reference)


@pytest.mark.parametrize("sets,needle", [
    (["train.stpes=3"], "unknown key 'train.stpes', did you mean 'train.steps'?"),
    (["data.seq_length=128"], "'data.seq_length' is 128 but the model allows at most 64"),
    (["train.micro_batch_size=zero"], "key 'train.micro_batch_size' must be an integer"),
    (["data.path=/nonexistent/prefix"], "'data.path' names '/nonexistent/prefix'"),
    (["lr.decay_style=cosin"], "lr.decay_style"),
    (["train.freeze=[nothing.*]"], "train.freeze: 'nothing.*' matches no parameter"),
    (["train.device=tpu"], "'train.device' is 'tpu'; choose auto, cpu or cuda"),
    (["train.precision=fp32", "train.device=cuda"], "the CUDA backend trains in bf16"),
    (["train.precision=fp8", "train.device=cpu"],
     "'train.precision: fp8' with 'train.device: cpu': the CPU backend has no fp8 linear"),
    (["train.precision=fp8", "model.intermediate_size=40"],
     "the mlp_down linear of llama is 40 x 48 (in x out); the FP8 GEMMs need"),
    (["train.recompute=some"], "'train.recompute' is 'some'; choose none, selective or full"),
])
def test_bad_config_fails_before_work_naming_the_key(corpus, tmp_path, sets, needle):
    p = run(train_cmd(corpus, tmp_path / "bad", *sets), check=False)
    assert p.returncode != 0
    assert needle in p.stderr, p.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(corpus, tmp_path):
    p = run(train_cmd(corpus, tmp_path / "cuda", "train.device=cuda"), check=False)
    assert p.returncode != 0
    assert "train.device: cuda, but" in p.stderr, p.stderr
    assert not (tmp_path / "cuda" / "checkpoints").exists()


def test_unknown_key_in_file_names_file_and_line(corpus, tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("train:\n  steps: 3\n  lerning_rate: 1\n")
    p = run(["train", corpus / "tiny.yaml", extra, "--run-dir", tmp_path / "x"], check=False)
    assert p.returncode == 2
    assert f"{extra}:3: unknown key 'train.lerning_rate'" in p.stderr, p.stderr


def test_freeze_keeps_parameters(corpus, tmp_path):
    r = tmp_path / "frozen"
    run(train_cmd(corpus, r, "train.steps=3", "train.freeze=[model.embed_tokens.*]",
                  "train.eval_interval=0"))
    from safetensors.numpy import load_file
    start = tmp_path / "start"
    run(train_cmd(corpus, start, "train.steps=1", "optimizer.lr=0", "train.eval_interval=0"))
    a = load_file(str(r / "checkpoints" / "step-00000003" / "model.safetensors"))
    b = load_file(str(start / "checkpoints" / "step-00000001" / "model.safetensors"))
    np.testing.assert_array_equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])
    assert not np.array_equal(a["model.layers.0.mlp.down_proj.weight"], b["model.layers.0.mlp.down_proj.weight"])


def test_eval_loss_definition(corpus, tmp_path):
    r = tmp_path / "r"
    run(train_cmd(corpus, r, "train.steps=4", "train.eval_interval=0"))
    ck = r / "checkpoints" / "step-00000004"
    out = json.loads(run(["eval", "loss", "--device", "cpu", "--checkpoint", ck, "--data", corpus / "gc",
                          "--seq-len", 16, "--batches", 6, "--micro-batch", 4]).stdout)
    assert out["tokens"] == 6 * 16 and out["windows"] == 6
    assert abs(out["perplexity"] - np.exp(out["loss"])) < 1e-6 * out["perplexity"]
    # The micro-batch only changes memory, not the result.
    again = json.loads(run(["eval", "loss", "--device", "cpu", "--checkpoint", ck, "--data", corpus / "gc",
                            "--seq-len", 16, "--batches", 6, "--micro-batch", 1]).stdout)
    assert abs(again["loss"] - out["loss"]) < 1e-5
    p = run(["eval", "loss", "--device", "cpu", "--checkpoint", ck, "--data", corpus / "gc", "--seq-len", 16,
             "--batches", 10**9], check=False)
    assert p.returncode != 0 and "fewer than --batches" in p.stderr


def test_init_from_checkpoint_finetune_and_continue(corpus, tmp_path):
    # The sample order and the schedule depend on train.steps (as in GPT-NeoX), so "continue" is
    # checked against the same run's own step-4 checkpoint.
    ref = tmp_path / "ref8"
    run(train_cmd(corpus, ref, "train.steps=8", "train.eval_interval=0", "checkpoint.interval=4",
                  "checkpoint.keep_last=0"))
    ck = ref / "checkpoints" / "step-00000004"
    cont = tmp_path / "cont"
    run(train_cmd(corpus, cont, "train.steps=8", "train.eval_interval=0", "checkpoint.interval=0",
                  f"checkpoint.init_from={ck}", "checkpoint.init_mode=continue"))
    ref_lines = [m for m in metric_lines(ref) if m["step"] > 4]
    assert metric_lines(cont) == ref_lines
    # finetune: weights only, from step 0: the first loss is the trained model's, below a fresh start.
    ft = tmp_path / "ft"
    run(train_cmd(corpus, ft, "train.steps=2", "train.eval_interval=0", f"checkpoint.init_from={ck}"))
    fresh = metric_lines(ref)[0]["loss"]
    tuned = metric_lines(ft)
    assert tuned[0]["step"] == 1 and tuned[0]["loss"] < fresh - 0.3
    # model.* keys may stay in the config, but must agree with the checkpoint's config.json.
    p = run(train_cmd(corpus, tmp_path / "x", f"checkpoint.init_from={ck}", "model.hidden_size=64"),
            check=False)
    assert p.returncode != 0 and "'model.hidden_size' is 64 but the checkpoint" in p.stderr, p.stderr


# ---- the console ----

def test_quiet_prints_warnings_only(corpus, tmp_path):
    # --quiet: no memory plan, no step or validation lines; the run's files are the same.
    p = run(["-q"] + train_cmd(corpus, tmp_path / "r", "train.steps=4"))
    assert p.stderr == "", p.stderr
    assert [m["step"] for m in metric_lines(tmp_path / "r") if m["split"] == "train"] == [1, 2, 3, 4]
    assert (tmp_path / "r" / "memory_plan.txt").read_text().startswith("memory plan:")


def test_a_terminal_gets_a_progress_line_and_a_log_plain_lines(corpus, tmp_path):
    # On a terminal (script(1) gives the run one) a progress line is redrawn in place after each
    # step and cleared before each interval line; into a file or pipe only the plain lines go.
    cmd = " ".join(f"'{a}'" for a in [LATHE] + [str(x) for x in train_cmd(
        corpus, tmp_path / "tty", "train.steps=6", "train.log_interval=3")])
    # Bytes: text mode would turn the carriage returns into newlines.
    p = subprocess.run(["script", "-qfec", cmd, "/dev/null"], capture_output=True, timeout=300)
    out = p.stdout.decode(errors="replace").replace("\r\n", "\n")
    assert p.returncode == 0, out
    assert "\r\x1b[Kstep 1/6 [=====" in out, out
    assert "\r\x1b[Kstep 3/6 | loss " in out, out  # the bar cleared before the interval line
    piped = subprocess.run([LATHE] + [str(x) for x in train_cmd(
        corpus, tmp_path / "log", "train.steps=6", "train.log_interval=3")], capture_output=True,
        timeout=300)
    err = piped.stderr.decode()
    assert piped.returncode == 0, err
    assert "\x1b[K" not in err and "\r" not in err
    assert "step 3/6 | loss " in err
