"""Errors a user can meet at the top of `lathe`, and the checkpoint paths every command takes.

Checked here, through the `lathe` binary (LATHE_BIN):
  - every command that reads a checkpoint (`eval loss --checkpoint`, `convert INPUT_DIR`,
    `train --set checkpoint.init_from=`, `align apply --checkpoint`, `align run`'s
    source.checkpoint) takes the checkpoint folder,
    the run folder, its checkpoints/ folder and checkpoints/latest, and reads the same weights
    through each;
  - a path that names no checkpoint, a `latest` naming a missing folder, and a step folder whose
    number does not fit in 64 bits are `lathe: error:` lines naming the argument and the path,
    with a non-zero exit, never a crash;
  - a file of the wrong kind (a YAML train config as `bench --model`, a JSONL file as token files
    or as a checkpoint) is an error naming the argument and what it takes;
  - numbers in chat templates beyond what 64 bits hold render as jinja2 renders them (or fail as
    jinja2 fails), never end the process;
  - a command line CLI11 cannot parse (a missing or unknown option, a value of the wrong type) is
    one `lathe: error:` line and exit code 2, as every bad argument;
  - --threads past its bound is an argument error; convert does not carry a damaged JSON file
    of the checkpoint; a config.json that ties the head over a checkpoint with its own head is
    refused by eval (as by convert);
  - an output that names an input file (by any path) is refused and the input kept; an output
    that is a FIFO is written into, not replaced by a file;
  - an exception no Status describes (here: memory running out under an address-space limit)
    ends as one `lathe: error:` line and exit code 1, not std::terminate.
"""
import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from corpus import write_gcide_jsonl
from lathe_cli import LATHE, TINY_MODEL, run, tokenize_corpus

ROOT = Path(__file__).resolve().parent.parent

TINY = TINY_MODEL + """
train:
  steps: 4
  micro_batch_size: 2
  gradient_accumulation_steps: 1
  log_interval: 1
  eval_interval: 0
  threads: 2
  device: cpu
optimizer:
  lr: 3.0e-3
checkpoint:
  interval: 2
  keep_last: 0
"""


def fails(args, *needles, rc=None):
    """Runs lathe expecting an error: one `lathe: error:` line holding every needle, no crash."""
    p = run(args, check=False)
    assert p.returncode not in (0, -6, 134, -11, 139), (p.returncode, p.stderr)  # 134/-6: abort
    if rc is not None:
        assert p.returncode == rc, (p.returncode, p.stderr)
    errors = [line for line in p.stderr.splitlines() if line.startswith("lathe: error: ")]
    assert len(errors) == 1, p.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])
    assert "terminate called" not in p.stderr and "what():" not in p.stderr, p.stderr
    return errors[0]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tokenizer, token files, and a 4-step CPU run with checkpoints at steps 2 and 4."""
    d = tmp_path_factory.mktemp("cli_errors")
    write_gcide_jsonl(d / "c.jsonl", 200_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 300)
    (d / "tiny.yaml").write_text(TINY + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    run(["train", d / "tiny.yaml", "--run-dir", d / "run"])
    ck = d / "run" / "checkpoints"
    assert (ck / "latest").read_text().strip() == "step-00000004"
    assert (ck / "step-00000002").is_dir() and (ck / "step-00000004").is_dir()
    return d


def forms(d):
    """The four ways to name the run's newest checkpoint."""
    run_dir = d / "run"
    return {"run": run_dir, "checkpoints": run_dir / "checkpoints",
            "latest": run_dir / "checkpoints" / "latest",
            "step": run_dir / "checkpoints" / "step-00000004"}


# ---- one resolver, every command ----

def test_eval_loss_takes_every_checkpoint_form(made):
    outs = {}
    for name, path in forms(made).items():
        p = run(["eval", "loss", "--device", "cpu", "--checkpoint", path, "--data", made / "gc",
                 "--seq-len", 16, "--batches", 4])
        outs[name] = json.loads(p.stdout)
    for name, out in outs.items():
        assert Path(out["checkpoint"]).name == "step-00000004", (name, out)
        assert out["loss"] == outs["step"]["loss"], (name, out, outs["step"])


def test_convert_takes_every_checkpoint_form(made, tmp_path):
    written = {}
    for name, path in forms(made).items():
        out = tmp_path / name
        res = json.loads(run(["convert", path, out, "--to", "hf", "--dtype", "fp32"]).stdout.strip().splitlines()[-1])
        assert res, name
        written[name] = (out / "model.safetensors").read_bytes()
    step = (made / "run" / "checkpoints" / "step-00000004" / "model.safetensors").read_bytes()
    for name, data in written.items():
        assert data == written["step"], name
    assert len(step) > 0


def test_train_init_from_takes_every_checkpoint_form(made, tmp_path):
    first = {}
    for name, path in forms(made).items():
        r = tmp_path / name
        run(["train", made / "tiny.yaml", "--run-dir", r, "--set", "train.steps=1",
             "--set", "checkpoint.interval=0", "--set", f"checkpoint.init_from={path}"])
        lines = [json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines()]
        first[name] = [m["loss"] for m in lines if m["split"] == "train"][0]
    # finetune from step 4: the same weights through every form, so the same first loss
    assert len(set(first.values())) == 1, first


def test_align_apply_takes_every_checkpoint_form(made, tmp_path):
    written = {}
    for name, path in forms(made).items():
        out = tmp_path / name
        run(["align", "apply", "--checkpoint", path, "--target-tokenizer", made / "tok.json",
             "--output", out, "--init", "mean", "--seed", 3])
        written[name] = (out / "model.safetensors").read_bytes()
    for name, data in written.items():
        assert data == written["step"], name


def align_config(made, tmp_path, checkpoint):
    """An `align run` configuration of small stages whose source model is `checkpoint`."""
    docs = [json.loads(line)["text"] for line in (made / "c.jsonl").read_text().splitlines()[:40]]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    (tmp_path / "held.txt").write_text("\n".join(docs[:3]) + "\n")
    (tmp_path / "general.txt").write_text("the cat sat on the mat\n" * 20)
    config = tmp_path / "align.yaml"
    config.write_text(f"""align:
  work_dir: {tmp_path / "work"}
  threads: 2
source:
  tokenizer: {made / "tok.json"}
  checkpoint: {checkpoint}
corpus:
  inputs: [{tmp_path / "corpus.jsonl"}]
terms:
  top_k: 5
  min_count: 2
  general: [{tmp_path / "general.txt"}]
embed:
  dim: 8
  iters: 1
  min_count: 1
  device: cpu
map:
  pivots: 20
  device: cpu
eval:
  documents: {tmp_path / "held.txt"}
  seq_len: 16
  batch: 2
  device: cpu
""")
    return config


def test_align_run_takes_every_checkpoint_form(made, tmp_path):
    written = {}
    for name, path in forms(made).items():
        d = tmp_path / name
        d.mkdir()
        run(["align", "run", align_config(made, d, path), "--no-progress"])
        models = sorted((d / "work").rglob("model.safetensors"))
        assert len(models) == 1, models
        written[name] = models[0].read_bytes()
    for name, data in written.items():
        assert data == written["step"], name


def test_paths_that_name_no_checkpoint(made, tmp_path):
    data = ["--data", made / "gc", "--seq-len", 8, "--batches", 1, "--device", "cpu"]
    fails(["eval", "loss", "--checkpoint", tmp_path / "nope", *data],
          "--checkpoint", str(tmp_path / "nope"), "no such folder", "checkpoints/latest")
    fails(["convert", tmp_path / "nope", tmp_path / "out", "--to", "hf"],
          "INPUT_DIR", "no such folder")
    # A random folder: not a checkpoint, a run folder or a checkpoints folder.
    (tmp_path / "random" / "sub").mkdir(parents=True)
    (tmp_path / "random" / "notes.txt").write_text("hello\n")
    for args, arg in ((["eval", "loss", "--checkpoint", tmp_path / "random", *data], "--checkpoint"),
                      (["convert", tmp_path / "random", tmp_path / "out", "--to", "hf"], "INPUT_DIR")):
        fails(args, arg, "no config.json", "a run folder")
    assert not (tmp_path / "out").exists()
    # A run that has not written a checkpoint yet.
    (tmp_path / "young" / "checkpoints").mkdir(parents=True)
    fails(["eval", "loss", "--checkpoint", tmp_path / "young", *data],
          "a run folder with no complete checkpoint")
    # A file inside a checkpoint: say which folder to pass.
    cfg = made / "run" / "checkpoints" / "step-00000002" / "config.json"
    fails(["eval", "loss", "--checkpoint", cfg, *data], "a file, not a checkpoint",
          "pass the folder that holds it")
    fails(["train", made / "tiny.yaml", "--run-dir", tmp_path / "t", "--set", f"checkpoint.init_from={tmp_path / 'nope'}"],
          "checkpoint.init_from", "no such folder")
    assert not (tmp_path / "t" / "checkpoints").exists()


def test_latest_naming_a_missing_checkpoint(made, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(made / "run", run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "step-00000004")
    latest = run_dir / "checkpoints" / "latest"
    fails(["eval", "loss", "--checkpoint", latest, "--data", made / "gc", "--seq-len", 8, "--batches", 1,
           "--device", "cpu"], "--checkpoint", "names step-00000004, which is not a complete checkpoint",
          f"pass the run folder {run_dir}")
    # The run folder itself still means its newest complete checkpoint.
    p = run(["eval", "loss", "--checkpoint", run_dir, "--data", made / "gc", "--seq-len", 8, "--batches", 1,
             "--device", "cpu"])
    assert Path(json.loads(p.stdout)["checkpoint"]).name == "step-00000002"
    latest.write_text("../../elsewhere\n")
    fails(["convert", latest, tmp_path / "out", "--to", "hf"], "INPUT_DIR", "not a checkpoint folder name")


def test_step_folder_beyond_64_bits_is_an_error_not_a_crash(made, tmp_path):
    """No run writes such a folder; taking an older checkpoint instead would silently resume or
    evaluate something other than what the folder names suggest, so each command says so."""
    run_dir = tmp_path / "run"
    shutil.copytree(made / "run", run_dir)
    huge = run_dir / "checkpoints" / "step-99999999999999999999"
    huge.mkdir()
    shutil.copy(run_dir / "checkpoints" / "step-00000004" / "config.json", huge / "config.json")
    needles = (str(huge), "does not fit in 64 bits", "rename or remove")
    fails(["eval", "loss", "--checkpoint", run_dir, "--data", made / "gc", "--seq-len", 8, "--batches", 1,
           "--device", "cpu"], "--checkpoint", *needles, rc=2)
    fails(["convert", run_dir, tmp_path / "out", "--to", "hf"], "INPUT_DIR", *needles, rc=2)
    fails(["train", made / "tiny.yaml", "--run-dir", run_dir, "--set", "train.steps=6"], *needles, rc=2)
    fails(["align", "apply", "--checkpoint", run_dir, "--target-tokenizer", made / "tok.json",
           "--output", tmp_path / "aligned", "--init", "mean"], *needles)
    fails(["train", made / "tiny.yaml", "--run-dir", tmp_path / "other", "--set", f"checkpoint.init_from={run_dir}"],
          "checkpoint.init_from", *needles, rc=2)
    (tmp_path / "a").mkdir()
    fails(["align", "run", align_config(made, tmp_path / "a", run_dir), "--no-progress"], "source.checkpoint",
          *needles)
    assert not (tmp_path / "a" / "work").exists()
    # The marker still names a checkpoint precisely, whatever else the folder holds.
    p = run(["eval", "loss", "--checkpoint", run_dir / "checkpoints" / "latest", "--data", made / "gc",
             "--seq-len", 8, "--batches", 1, "--device", "cpu"])
    assert Path(json.loads(p.stdout)["checkpoint"]).name == "step-00000004"


# ---- files of the wrong kind ----

def test_bench_model_given_a_train_config():
    err = fails(["bench", "--model", ROOT / "configs" / "tiny.yaml", "--batch", 1, "--seq", 8, "--plan-only"],
                "--model", "a YAML file", "not a model's config.json", "a preset (", "checkpoints/step-N/config.json",
                rc=2)
    assert "last read" not in err


def test_bench_model_given_other_files(made, tmp_path):
    err = fails(["bench", "--model", made / "c.jsonl", "--batch", 1, "--seq", 8, "--plan-only"],
                "--model", "not one JSON document (a JSONL file?)", "a preset (")
    assert "parse error" not in err
    (tmp_path / "notes.txt").write_text("some notes\n")
    err = fails(["bench", "--model", tmp_path / "notes.txt", "--batch", 1, "--seq", 8, "--plan-only"],
                "--model", "not JSON, so not a Hugging Face config.json", "a preset (")
    assert "last read" not in err
    # JSON, but not a model config: the config reader's message, naming --model.
    fails(["bench", "--model", made / "tok.json", "--batch", 1, "--seq", 8, "--plan-only"], "--model", "tok.json")
    # A checkpoint's config.json is what --model takes.
    p = run(["bench", "--model", made / "run" / "checkpoints" / "step-00000004" / "config.json", "--batch", 1,
             "--seq", 8, "--plan-only", "--device", "cpu"])
    assert json.loads(p.stdout.strip().splitlines()[-1])


def test_token_file_arguments_given_other_files(made, tmp_path):
    ck = made / "run" / "checkpoints" / "step-00000004"
    common = ["--seq-len", 8, "--batches", 1, "--device", "cpu"]
    # The corpus itself instead of token files.
    err = fails(["eval", "loss", "--checkpoint", ck, "--data", made / "c.jsonl", *common],
                "--data", str(made / "c.jsonl"), "lathe prepare")
    assert "c.jsonl.idx" not in err or "prefix" in err
    # The .bin or .idx file instead of the prefix.
    for suffix in (".bin", ".idx"):
        fails(["eval", "loss", "--checkpoint", ck, "--data", f"{made / 'gc'}{suffix}", *common],
              "--data", "without .bin/.idx", str(made / "gc"))
        fails(["data", "info", f"{made / 'gc'}{suffix}"], "without .bin/.idx", str(made / "gc"))
    fails(["data", "info", tmp_path / "nothing"], str(tmp_path / "nothing"), "no token files")
    fails(["data", "dump", made / "c.jsonl", "--doc", 0], "lathe prepare")
    # A checkpoint given where token files go, and token files where a checkpoint goes.
    fails(["eval", "loss", "--checkpoint", made / "gc.bin", "--data", made / "gc", *common],
          "--checkpoint", "a file, not a checkpoint")


# ---- numbers beyond 64 bits in chat templates ----

# ---- the command line ----

@pytest.mark.parametrize("args,needle", [
    (["tokenize"], "--tokenizer is required"),
    (["runs", "--bogus"], "not expected: --bogus"),
    (["eval", "loss", "--checkpoint", "x", "--seq-len", "abc"], "--seq-len = abc"),
    ([], "subcommand is required"),
])
def test_a_bad_argument_is_an_error_line_and_exit_code_2(args, needle):
    fails(args, needle, "--help", rc=2)


def test_thread_counts_past_the_bound_are_argument_errors(made, tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "hello"}\n')
    fails(["tokenize", "--tokenizer", made / "tok.json", "--input", src, "--threads", "200000"],
          "--threads", rc=2)
    fails(["prepare", "--tokenizer", made / "tok.json", "--input", src, "--output-prefix",
           tmp_path / "p", "--threads", "200000"], "--threads", rc=2)


def test_a_damaged_json_file_is_not_carried_by_convert(made, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(made / "run" / "checkpoints" / "step-00000004", ck)
    text = (ck / "tokenizer.json").read_text()
    (ck / "tokenizer.json").write_text(text[: len(text) // 2])
    fails(["convert", ck, tmp_path / "hf", "--to", "hf"], "tokenizer.json: not valid JSON",
          "fix or remove it", rc=2)
    assert not (tmp_path / "hf").exists()


def test_a_tied_config_over_a_separate_head_is_refused_by_eval(made, tmp_path):
    # An untied run's checkpoint, its config.json edited to say the head is the embedding.
    cfg = made / "untied.yaml"
    cfg.write_text((made / "tiny.yaml").read_text().replace("tie_word_embeddings: true",
                                                            "tie_word_embeddings: false"))
    run(["train", cfg, "--run-dir", tmp_path / "run", "--set", "train.steps=2"])
    ck = tmp_path / "run" / "checkpoints" / "step-00000002"
    config = json.loads((ck / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (ck / "config.json").write_text(json.dumps(config))
    fails(["eval", "loss", "--checkpoint", ck, "--data", made / "gc", "--seq-len", "16",
           "--batches", "1", "--device", "cpu"], "tie_word_embeddings true",
          "has its own 'lm_head.weight'", rc=2)


# ---- an output never replaces an input ----

def test_an_output_that_is_an_input_is_refused_and_the_input_kept(made, tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "hello"}\n{"text": "world"}\n')
    (tmp_path / "link.jsonl").symlink_to(src)
    before = src.read_bytes()
    tok = made / "tok.json"
    fails(["tokenize", "--tokenizer", tok, "--input", src, "--output", tmp_path / "link.jsonl"],
          "is the --input file", rc=2)
    # The input named as one of the outputs of the prefix.
    shutil.copy(src, tmp_path / "docs.bin")
    fails(["prepare", "--tokenizer", tok, "--input", tmp_path / "docs.bin", "--output-prefix",
           tmp_path / "docs", "--format", "jsonl"], "--output-prefix", "is the --input file", rc=2)
    assert (tmp_path / "docs.bin").read_bytes() == before
    run_dir = tmp_path / "run"
    shutil.copytree(made / "run", run_dir)
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    fails(["report", run_dir, "-o", run_dir / "metrics.jsonl"], "is the run's file", rc=2)
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    assert src.read_bytes() == before


def test_an_output_fifo_stays_a_fifo(made, tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "hello"}\n')
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    run(["tokenize", "--tokenizer", made / "tok.json", "--input", src, "--output", fifo])
    out, _ = reader.communicate(timeout=30)
    assert json.loads(out)["ids"], out
    assert fifo.is_fifo()


def render(tmp_path, template, messages):
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": template}))
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"messages": messages}) + "\n")
    return run(["chat", "render", "--tokenizer-config", cfg, "--input", inp], check=False)


def jinja2_render(template, messages):
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages)


@pytest.mark.parametrize("template", [
    "{{ 1e999 }}|{{ -1e999 }}|{{ 1e-999 }}|{{ 2.5e-320 }}",
    "{{ messages | map(attribute='99999999999999999999') | list | length }}",
    "{{ messages | map(attribute='content') | join(',') }}{{ messages[0]['99999999999999999999'] is defined }}",
])
def test_chat_template_numbers_beyond_64_bits_render_as_jinja2(tmp_path, template):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    p = render(tmp_path, template, messages)
    assert p.returncode == 0, p.stderr
    want = jinja2_render(template, messages)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    got_text = got.get("text", got) if isinstance(got, dict) else got
    assert got_text == want, (got, want)


def test_chat_template_format_index_beyond_64_bits_is_a_template_error(tmp_path):
    p = render(tmp_path, "{{ '{99999999999999999999}'.format(1) }}", [{"role": "user", "content": "hi"}])
    assert p.returncode != 0
    errors = [line for line in p.stderr.splitlines() if line.startswith("lathe: error: ")]
    assert len(errors) == 1 and "out of range" in errors[0], p.stderr
    assert "terminate called" not in p.stderr


# ---- exceptions no Status describes ----

def test_memory_running_out_is_an_error_line_not_terminate(tmp_path):
    """A 2 GiB config.json (sparse: no disk used) read under a 1 GiB address-space limit: the
    string that holds it cannot grow, std::bad_alloc reaches main, which says memory ran out."""
    ck = tmp_path / "ck"
    ck.mkdir()
    with open(ck / "config.json", "wb") as f:
        f.truncate(2 << 30)
    (tmp_path / "d.bin").write_bytes(b"")
    limit = 1 << 30

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    p = subprocess.run([LATHE, "eval", "loss", "--checkpoint", ck, "--data", tmp_path / "d", "--seq-len", "8",
                        "--batches", "1", "--device", "cpu", "--threads", "1"],
                       capture_output=True, text=True, timeout=300, preexec_fn=cap,
                       env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    assert p.returncode == 1, (p.returncode, p.stderr)
    errors = [line for line in p.stderr.splitlines() if line.startswith("lathe: error: ")]
    assert len(errors) == 1 and "out of memory" in errors[0], p.stderr
    assert "terminate called" not in p.stderr
