"""End-to-end tests of `lathe train`'s crash paths and resume rules, through the `lathe` binary.

Checked here:
  - an empty `data.path` list is an error naming the key; a micro-batch that cannot fit is
    refused before the data's index caches are built;
  - token ids outside the model's vocabulary (data prepared with another tokenizer, or a label
    file with a bad id) are an error when the data is opened, naming the file, the id, where it is
    and the vocabulary size; label files may hold negative labels (-100: no loss);
  - a resume that changes a key an exact resume depends on is refused before anything is
    written (RUN/config.yaml, metrics.jsonl and the checkpoints stay byte for byte), naming each
    key with its old and new value; a compatible change (learning rate, steps) resumes and logs
    every changed key;
  - a run stopped by SIGINT / SIGTERM saves a checkpoint and exits 130 / 143, so `lathe train ...
    && lathe convert ...` does not convert a half-trained model; `lathe train --help` says so;
  - `lathe doctor` reports whether this build runs attention on CUDA, in the table and in --json,
    as the build was configured;
  - checkpoint.init_from takes a checkpoint folder, a run folder and RUN/checkpoints/latest;
  - weights holding NaN or infinity are refused by a resume (naming the checkpoint before it),
    by checkpoint.init_from, `lathe eval loss` and `lathe generate`, each naming the file, the
    tensor, the count and the first element; `lathe convert` reads them; NaN or infinite AdamW
    moments are refused by a resume.
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from corpus import write_gcide_jsonl
from lathe_cli import LATHE, run, tokenize_corpus, wait_for_step

BUILD_DIR = os.environ.get("LATHE_BUILD_DIR", "build")

TINY = """
model:
  family: llama
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 1
  num_attention_heads: 2
  max_position_embeddings: 64
  tie_word_embeddings: true
data:
  split: "90,10,0"
  seq_length: 32
train:
  steps: 4
  micro_batch_size: 2
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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_errors")
    write_gcide_jsonl(d / "c.jsonl", 300_000)
    for vocab in (384, 1024):
        tokenize_corpus(d / "c.jsonl", d / f"tok{vocab}.json", d / f"gc{vocab}", vocab)
    (d / "tiny.yaml").write_text(TINY + f"\ndata.path: {d / 'gc384'}\ndata.tokenizer: {d / 'tok384.json'}\n")
    return d


def train_cmd(corpus, run_dir, *sets):
    args = ["train", corpus / "tiny.yaml", "--run-dir", run_dir]
    for s in sets:
        args += ["--set", s]
    return args


def write_token_file(prefix, docs, dtype):
    """A GPT-NeoX/Megatron .bin/.idx pair (docs/formats/token-files.md), one sequence per document."""
    codes = {np.uint16: 8, np.int32: 4}
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    item = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64) * item)]).astype(np.int64)
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype="<u8").tobytes())
        f.write(bytes([codes[dtype]]))
        f.write(np.array([len(docs), len(docs) + 1], dtype="<u8").tobytes())
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())


def documents(n_docs=40, length=70, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 384, size=length).tolist() for _ in range(n_docs)]


def tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def assert_clean_error(p):
    # An error message and exit code, never a check failure, abort or signal.
    assert p.returncode in (1, 2), (p.returncode, p.stderr)
    assert "lathe: error:" in p.stderr, p.stderr
    assert "Check failed" not in p.stderr and "terminate" not in p.stderr, p.stderr


# ---- token ids against the vocabulary ----

def test_data_from_another_tokenizer_is_refused_at_open(corpus, tmp_path):
    # Token files prepared with the 1024-entry tokenizer, trained with the 384-entry one.
    r = tmp_path / "mismatch"
    p = run(train_cmd(corpus, r, f"data.path={corpus / 'gc1024'}"), check=False)
    assert_clean_error(p)
    ids = np.fromfile(f"{corpus / 'gc1024'}.bin", dtype=np.uint16)
    first_bad = int(ids[np.argmax(ids >= 384)])
    err = p.stderr
    assert f"lathe: error: data.path: '{corpus / 'gc1024'}': {corpus / 'gc1024'}.bin, document " in err, err
    assert f"token id {first_bad} is outside the model's vocabulary of 384 ids" in err, err
    assert f"lathe prepare --tokenizer {corpus / 'tok384.json'}" in err, err
    assert not (r / "checkpoints").exists()


def test_token_id_position_is_named(corpus, tmp_path):
    docs = documents()
    docs[3][7] = 5000
    docs[5][2] = 6000
    write_token_file(tmp_path / "bad", docs, np.uint16)
    p = run(train_cmd(corpus, tmp_path / "r", f"data.path={tmp_path / 'bad'}"), check=False)
    assert_clean_error(p)
    assert "document 3, position 7: token id 5000 is outside the model's vocabulary of 384 ids (0 to 383)" \
        in p.stderr, p.stderr
    # The same file with every id in range trains.
    docs[3][7] = 383
    docs[5][2] = 0
    write_token_file(tmp_path / "good", docs, np.uint16)
    run(train_cmd(corpus, tmp_path / "ok", f"data.path={tmp_path / 'good'}", "train.steps=1"))


def test_an_empty_data_path_list_is_an_error(corpus, tmp_path):
    p = run(train_cmd(corpus, tmp_path / "r", "data.path=[]"), check=False)
    assert_clean_error(p)
    assert "'data.path' is an empty list" in p.stderr, p.stderr
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_batch_that_cannot_fit_is_refused_before_the_index_caches(corpus, tmp_path):
    # The caches beside the token files grow with the batch: the memory plan is checked first.
    for ext in (".bin", ".idx"):
        shutil.copy(f"{corpus / 'gc384'}{ext}", tmp_path / f"d{ext}")
    p = run(train_cmd(corpus, tmp_path / "r", f"data.path={tmp_path / 'd'}",
                      "train.micro_batch_size=30000000"), check=False)
    assert_clean_error(p)
    assert "train.micro_batch_size 30000000 x data.seq_length 32 needs" in p.stderr, p.stderr
    assert not list(tmp_path.glob("d_*indexmap*")), list(tmp_path.iterdir())


def sft_sets(tokens, labels):
    return [f"data.path=[{tokens}]", f"data.label_path=[{labels}]", f"data.valid_path=[{tokens}]",
            f"data.valid_label_path=[{labels}]"]


def test_label_files_allow_minus_100_but_not_ids_past_the_vocabulary(corpus, tmp_path):
    docs = documents()
    write_token_file(tmp_path / "tok", docs, np.int32)
    labels = [[-100] * 10 + d[10:] for d in docs]  # no loss on each document's first 10 tokens
    write_token_file(tmp_path / "lab", labels, np.int32)
    run(train_cmd(corpus, tmp_path / "ok", *sft_sets(tmp_path / "tok", tmp_path / "lab"), "train.steps=1"))
    labels[6][20] = 9999
    write_token_file(tmp_path / "lab_bad", labels, np.int32)
    p = run(train_cmd(corpus, tmp_path / "bad", *sft_sets(tmp_path / "tok", tmp_path / "lab_bad")), check=False)
    assert_clean_error(p)
    assert (f"lathe: error: data.label_path: '{tmp_path / 'lab_bad'}': {tmp_path / 'lab_bad'}.bin, document 6, position 20: "
            "label 9999 is neither a token id below the model's vocabulary size 384 nor negative") in p.stderr, \
        p.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


# ---- resume with a changed configuration ----

def test_incompatible_resume_is_refused_and_writes_nothing(corpus, tmp_path):
    r = tmp_path / "r"
    run(train_cmd(corpus, r))
    before = tree_bytes(r)
    assert "config.yaml" in before and "checkpoints/step-00000004/model.safetensors" in before
    p = run(train_cmd(corpus, r, "train.steps=6", "data.seq_length=16", "train.seed=7", "optimizer.lr=1e-3"),
            check=False)
    assert_clean_error(p)
    err = p.stderr
    assert f"--run-dir {r} resumes from {r / 'checkpoints' / 'step-00000004'}" in err, err
    assert "data.seq_length 32 -> 16, train.seed 1234 -> 7 (the run's value -> this one)" in err, err
    # Compatible changes are not what is refused.
    assert "optimizer.lr" not in err.split("lathe: error:")[1] and "train.steps" not in err.split("lathe: error:")[1]
    assert tree_bytes(r) == before  # config.yaml, metrics.jsonl, every checkpoint file: as they were


def test_compatible_resume_logs_every_changed_key(corpus, tmp_path):
    r = tmp_path / "r"
    run(train_cmd(corpus, r))
    p = run(train_cmd(corpus, r, "train.steps=6", "optimizer.lr=1e-3", "train.log_interval=2"))
    assert "resuming with a changed train.steps: 4 -> 6" in p.stderr, p.stderr
    assert "resuming with a changed train.log_interval: 1 -> 2" in p.stderr, p.stderr
    assert "resuming with a changed optimizer.lr: 0.003 -> 0.001" in p.stderr, p.stderr
    assert f"resuming from {r / 'checkpoints' / 'step-00000004'}" in p.stderr, p.stderr
    steps = [json.loads(l)["step"] for l in (r / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 6]  # log_interval 2 after the resume
    optimizer = (r / "config.yaml").read_text().split("\noptimizer:\n")[1]
    assert float(re.search(r"^  lr: (\S+)$", optimizer, re.M).group(1)) == 1e-3  # the run's config now
    # The same command again: nothing changed, nothing logged as changed.
    again = run(train_cmd(corpus, r, "train.steps=6", "optimizer.lr=1e-3", "train.log_interval=2"))
    assert "resuming with a changed" not in again.stderr, again.stderr


# ---- stopped by a signal ----


def children_of(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


@pytest.mark.parametrize("sig,code,name", [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM"),
                                           (signal.SIGHUP, 129, "SIGHUP")])
def test_stopped_by_a_signal_exits_non_zero_after_saving(corpus, tmp_path, sig, code, name):
    # `lathe train ... && lathe convert ...` as a user writes it: the signal goes to the training
    # process once it is past its second step; the shell must not run the conversion.
    r, out = tmp_path / "r", tmp_path / "hf"
    steps = 100000  # never reached: the signal always lands mid-run
    script = (f'"$0" train {corpus / "tiny.yaml"} --run-dir {r} --set train.steps={steps} '
              f'--set checkpoint.interval=0 && "$0" convert {r} {out} --to hf; echo "train exit $?"')
    shell = subprocess.Popen(["bash", "-c", script, LATHE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    wait_for_step(r, 2, shell)
    train = children_of(shell.pid)
    assert len(train) == 1, train
    os.kill(train[0], sig)
    stdout, err = shell.communicate(timeout=120)
    assert stdout.strip().splitlines()[-1] == f"train exit {code}", (stdout, err)
    assert not out.exists()
    assert f"stopped by {name} after step" in err and "checkpoint saved" in err, err
    assert "lathe: error" not in err, err
    saved = [d.name for d in (r / "checkpoints").iterdir() if d.name.startswith("step-")]
    assert len(saved) == 1 and 2 <= int(saved[0].split("-")[1]) < steps, saved


def test_a_signal_the_run_was_started_ignoring_stays_ignored(corpus, tmp_path):
    # `nohup lathe train ...`: SIGHUP arrives ignored, and a hangup must not stop the run;
    # SIGTERM, not ignored, still stops it after saving.
    r = tmp_path / "r"
    train = subprocess.Popen([LATHE, "train", str(corpus / "tiny.yaml"), "--run-dir", str(r),
                              "--set", "train.steps=100000", "--set", "checkpoint.interval=0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    wait_for_step(r, 2, train)
    train.send_signal(signal.SIGHUP)
    done = [json.loads(ln)["step"] for ln in (r / "metrics.jsonl").read_text().splitlines()
            if ln.endswith("}")]
    wait_for_step(r, max(done) + 5, train)  # it trains on after the hangup
    train.send_signal(signal.SIGTERM)
    err = train.communicate(timeout=120)[1]
    assert train.returncode == 143, err
    assert "stopped by SIGTERM after step" in err and "SIGHUP" not in err, err


def test_train_help_documents_exit_codes(corpus):
    p = run(["train", "--help"])
    text = " ".join(p.stdout.split())
    assert "130 / 143 stopped by SIGINT / SIGTERM after saving a checkpoint" in text, p.stdout
    assert "These may change, and each change is logged: train.steps" in text, p.stdout


# ---- device ----

@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU")
def test_cuda_is_refused_before_anything_is_written(corpus, tmp_path):
    p = run(train_cmd(corpus, tmp_path / "cuda", "train.device=cuda"), check=False)
    assert_clean_error(p)
    assert "train.device: cuda, but" in p.stderr, p.stderr
    assert not (tmp_path / "cuda").exists()  # not even the run folder


# ---- doctor: attention ----

def build_has_cudnn_attention():
    """How the build was configured: the CUDA attention op compiled with the cuDNN frontend."""
    commands = json.loads((Path(BUILD_DIR) / "compile_commands.json").read_text())
    attention = [c["command"] if "command" in c else " ".join(c["arguments"]) for c in commands
                 if c["file"].endswith("src/ops/cuda/attention.cu")]
    if not attention:
        return False  # no CUDA backend in this build
    return "LATHE_HAVE_CUDNN_FRONTEND=1" in attention[0]


def test_doctor_reports_attention_as_built():
    p = run(["doctor", "--json"], check=False)
    j = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(j["cuda_attention"]) == {"available", "detail"}
    expected = build_has_cudnn_attention()
    assert j["cuda_attention"]["available"] is expected, j["cuda_attention"]
    if not j["cuda_build"]:
        assert j["cuda_attention"]["available"] is False
    if not expected:
        assert "install-deps.sh" in j["cuda_attention"]["detail"] or not j["cuda_build"], j["cuda_attention"]
        if j["devices"]:  # a GPU no model can run on: not ready, and the verdict says why
            assert j["status"] == "not_ready" and "attention" in j["verdict"], j
    table = run(["doctor"], check=False).stdout
    row = next(l for l in table.splitlines() if l.startswith("attention"))
    assert ("cuDNN fused flash attention (built)" in row) is expected, row


# ---- checkpoint.init_from forms ----

def test_init_from_takes_run_checkpoint_and_latest(corpus, tmp_path):
    src = tmp_path / "src"
    run(train_cmd(corpus, src))
    forms = {"checkpoint": src / "checkpoints" / "step-00000004", "run": src,
             "latest": src / "checkpoints" / "latest"}
    first_losses = {}
    for name, path in forms.items():
        r = tmp_path / name
        run(train_cmd(corpus, r, "train.steps=1", f"checkpoint.init_from={path}"))
        first_losses[name] = json.loads((r / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    # The same weights, whichever form named them.
    assert len(set(first_losses.values())) == 1, first_losses


# ---- NaN and infinity in the weights or the optimizer state ----

def poke_safetensors(path, tensor, values):
    """Writes `values` ({element: float}) into the F32 tensor `tensor` of the safetensors file
    `path`, in place: the 8-byte little-endian header length, the JSON header, then the data."""
    raw = bytearray(Path(path).read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    info = json.loads(raw[8:8 + n])[tensor]
    assert info["dtype"] == "F32", info
    base = 8 + n + info["data_offsets"][0]
    for i, v in values.items():
        raw[base + 4 * i: base + 4 * i + 4] = struct.pack("<f", v)
    Path(path).write_bytes(raw)


NAN_TENSOR = "model.layers.0.self_attn.q_proj.weight"  # (32, 32)


def test_non_finite_weights_are_refused_where_a_model_is_loaded(corpus, tmp_path):
    r = tmp_path / "r"
    run(train_cmd(corpus, r))
    ck = r / "checkpoints" / "step-00000004"
    poke_safetensors(ck / "model.safetensors", NAN_TENSOR, {9: float("inf"), 5: float("nan")})
    before = tree_bytes(r / "checkpoints")
    # The resume refuses before a step: the file, the tensor, the count and the first element,
    # and the checkpoint before it to resume from.
    p = run(train_cmd(corpus, r, "train.steps=6"), check=False)
    assert_clean_error(p)
    assert (f"lathe: error: resuming from {ck}: {ck / 'model.safetensors'}: tensor {NAN_TENSOR}: "
            "2 of the 1024 values read are not finite (NaN or infinity), the first at element 5 "
            "(nan)") in p.stderr, p.stderr
    assert f"to resume from step-00000002, the checkpoint before it, move {ck} out of " \
        f"{r / 'checkpoints'}" in p.stderr, p.stderr
    assert tree_bytes(r / "checkpoints") == before
    # A new run from it (checkpoint.init_from) and every command that computes with it refuse too.
    p = run(train_cmd(corpus, tmp_path / "init", f"checkpoint.init_from={ck}"), check=False)
    assert_clean_error(p)
    assert f"tensor {NAN_TENSOR}: 2 of the 1024 values read are not finite" in p.stderr, p.stderr
    assert not (tmp_path / "init" / "checkpoints" / "step-00000001").exists()
    p = run(["eval", "loss", "--device", "cpu", "--checkpoint", ck, "--data", corpus / "gc384",
             "--seq-len", 16, "--batches", 2], check=False)
    assert_clean_error(p)
    assert f"{ck / 'model.safetensors'}: tensor {NAN_TENSOR}: 2 of the 1024" in p.stderr, p.stderr
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    p = run(["generate", "--checkpoint", ck, "--input", prompts, "--output", tmp_path / "out.jsonl",
             "--max-new-tokens", 2, "--device", "cpu"], check=False)
    assert_clean_error(p)
    assert f"tensor {NAN_TENSOR}: 2 of the 1024" in p.stderr, p.stderr
    # convert reads it as it is (to inspect a damaged model).
    run(["convert", ck, tmp_path / "hf", "--to", "hf"])
    # With the damaged checkpoint moved out, as the message says, the run resumes from step 2.
    shutil.move(str(ck), str(tmp_path / "damaged"))
    p = run(train_cmd(corpus, r, "train.steps=6"))
    assert f"resuming from {r / 'checkpoints' / 'step-00000002'}" in p.stderr, p.stderr
    assert (r / "checkpoints" / "step-00000006").is_dir()


def test_non_finite_optimizer_moments_are_refused_on_resume(corpus, tmp_path):
    r = tmp_path / "r"
    run(train_cmd(corpus, r, "train.steps=2"))
    ck = r / "checkpoints" / "step-00000002"
    poke_safetensors(ck / "optimizer.safetensors", "exp_avg_sq", {7: float("-inf")})
    p = run(train_cmd(corpus, r), check=False)
    assert_clean_error(p)
    assert (f"lathe: error: resuming from {ck}: {ck / 'optimizer.safetensors'}: tensor "
            "'exp_avg_sq': 1 of the ") in p.stderr, p.stderr
    assert "the first at element 7 of the parameter vector (-inf)" in p.stderr, p.stderr
    assert "checkpoint.init_mode: finetune" in p.stderr, p.stderr
    assert "it is the run's only checkpoint: start again with a new --run-dir" in p.stderr, p.stderr
    assert not (r / "checkpoints" / "step-00000004").exists()
