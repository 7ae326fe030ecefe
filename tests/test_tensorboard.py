"""TensorBoard event files of `lathe train` (RUN_DIR/tb/, logging.tensorboard): the `tensorboard`
package's EventAccumulator reads back every scalar of a tiny CPU run, each equal to its
metrics.jsonl value rounded to f32, also across a resume from a checkpoint older than the last
logged step (the events logged after it are dropped by the resumed file's START, as
metrics.jsonl's lines are); every
record's framing is checked with a CRC-32C written here; logging.tensorboard false writes none."""
import json
import shutil
import struct
import subprocess

import numpy as np
import pytest
# scripts/install-deps.sh installs it (pip install tensorboard).
from tensorboard.backend.event_processing import event_accumulator

from conftest import NEEDS_CUDA
from corpus import write_gcide_jsonl
from lathe_cli import TINY_MODEL_2L, run, tokenize_corpus

TINY = TINY_MODEL_2L + """
train:
  steps: 12
  micro_batch_size: 2
  log_interval: 1
  eval_interval: 3
  eval_iters: 1
  threads: 2
  device: cpu
optimizer:
  lr: 3.0e-3
checkpoint:
  interval: 4
"""

# metrics.jsonl key -> TensorBoard tag, for each split.
TRAIN_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
              "tokens_per_s": "train/tokens_per_s", "skipped": "train/skipped",
              "memory_bytes": "train/memory_bytes", "mfu": "train/mfu"}
VALID_TAGS = {"loss": "valid/loss", "perplexity": "valid/perplexity"}


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    """The data of each TFRecord of an events file, every CRC checked; a record cut short at
    the end (a killed writer) ends the list."""
    raw = path.read_bytes()
    out, at = [], 0
    while at + 12 <= len(raw):
        (n,) = struct.unpack_from("<Q", raw, at)
        (len_crc,) = struct.unpack_from("<I", raw, at + 8)
        assert len_crc == masked(raw[at:at + 8]), f"{path}: length CRC at {at}"
        if at + 12 + n + 4 > len(raw):
            break
        data = raw[at + 12:at + 12 + n]
        (data_crc,) = struct.unpack_from("<I", raw, at + 12 + n)
        assert data_crc == masked(data), f"{path}: data CRC at {at}"
        out.append(data)
        at += 12 + n + 4
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("tb_corpus")
    write_gcide_jsonl(d / "c.jsonl", 200_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 300)
    cfg = d / "tiny.yaml"
    cfg.write_text(TINY + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    return d, cfg


def read_scalars(tb_dir):
    acc = event_accumulator.EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected_scalars(run_dir):
    want = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        j = json.loads(line)
        tags = TRAIN_TAGS if j["split"] == "train" else VALID_TAGS
        for key, tag in tags.items():
            if key not in j:  # mfu: on a GPU with a known peak only
                continue
            want.setdefault(tag, []).append((j["step"], float(np.float32(j[key]))))
    return want


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for tag in want:
        assert got[tag] == want[tag], tag


def test_every_scalar_reads_back(setup):
    d, cfg = setup
    run_dir = d / "run"
    p = run(["train", cfg, "--run-dir", run_dir])
    assert "| mem " in p.stderr and "MFU" not in p.stderr  # no MFU on the CPU
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [j for j in lines if j["split"] == "train"]
    assert [j["step"] for j in train] == list(range(1, 13))
    # New keys come last; the CPU has no MFU; memory is the peak RSS, more than the model.
    assert list(train[0])[-1] == "memory_bytes" and "mfu" not in train[0]
    assert all(j["memory_bytes"] > 1 << 20 for j in train)
    files = sorted((run_dir / "tb").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.")
    assert files[0].name.endswith(".lathe")
    recs = records(files[0])
    assert b"brain.Event:2" in recs[0]
    assert len(recs) == 2 + 12 + 4  # version, START, 12 train steps, 4 validation passes
    got = read_scalars(run_dir / "tb")
    assert_same(got, expected_scalars(run_dir))
    assert [s for s, _ in got["valid/loss"]] == [3, 6, 9, 12]


def test_resume_shows_each_step_once(setup):
    """A run that logged steps 1-12 but whose newest checkpoint is step 4 (as a kill would leave
    it; here the newer checkpoints are removed) resumes from 4 and logs 5-12 again into a new
    events file: TensorBoard shows steps 1-12 once each, 5-12 with the resumed run's values."""
    d, cfg = setup
    run_dir = d / "resumed"
    run(["train", cfg, "--run-dir", run_dir])
    ckpts = run_dir / "checkpoints"
    for step in (8, 12):
        shutil.rmtree(ckpts / f"step-{step:08d}")
    (ckpts / "latest").write_text("step-00000004\n")
    first = sorted((run_dir / "tb").iterdir())
    assert len(first) == 1
    before = read_scalars(run_dir / "tb")
    assert [s for s, _ in before["train/loss"]] == list(range(1, 13))
    run(["train", cfg, "--run-dir", run_dir])
    files = sorted((run_dir / "tb").iterdir())
    assert len(files) == 2 and files[0] == first[0]  # a new file, sorted after the first
    for f in files:
        records(f)
    got = read_scalars(run_dir / "tb")
    want = expected_scalars(run_dir)
    assert [s for s, _ in want["train/loss"]] == list(range(1, 13))
    assert [s for s, _ in want["valid/loss"]] == [3, 6, 9, 12]
    assert_same(got, want)
    # Steps 5-12 come from the resumed run: its tokens/s (a time) differs from the first's.
    assert got["train/tokens_per_s"][4:] != before["train/tokens_per_s"][4:]
    # A complete run started again writes no new events file.
    run(["train", cfg, "--run-dir", run_dir])
    assert sorted((run_dir / "tb").iterdir()) == files


def test_off(setup):
    d, cfg = setup
    run_dir = d / "off"
    run(["train", cfg, "--run-dir", run_dir, "--set", "logging.tensorboard=false",
         "--set", "train.steps=2"])
    assert (run_dir / "metrics.jsonl").exists()
    assert not (run_dir / "tb").exists()


def gpu0_compute_capability():
    """GPU 0's compute capability as "9.0", or None without a GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    p = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=compute_cap",
                        "--format=csv,noheader"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


def test_cuda_mfu_and_memory(setup):
    """On a GPU: memory_bytes is the device's memory in use, and on Hopper mfu is tokens/s times
    `lathe bench`'s flops per token (6 N + 12 L C T, N every parameter of this tied-embedding
    Llama, counted here from its shape) over 989.4e12; TensorBoard has both."""
    cc = gpu0_compute_capability()
    if cc is None:
        pytest.skip(NEEDS_CUDA + "no GPU (nvidia-smi lists none)")
    d, cfg = setup
    run_dir = d / "cuda"
    p = run(["train", cfg, "--run-dir", run_dir, "--set", "train.device=cuda"])
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [j for j in lines if j["split"] == "train"]
    assert all(0 < j["memory_bytes"] for j in train)
    hopper = cc.startswith("9.")
    assert all(("mfu" in j) == hopper for j in train), (cc, train[0])
    if hopper:
        hf = json.loads((run_dir / "checkpoints" / "step-00000012" / "config.json").read_text())
        V, C, L = hf["vocab_size"], hf["hidden_size"], hf["num_hidden_layers"]
        I, H, KV = hf["intermediate_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
        kv = KV * (C // H)
        N = V * C + L * (2 * C * C + 2 * C * kv + 3 * C * I + 2 * C) + C
        flops_per_token = 6 * N + 12 * L * C * 16
        for j in train:
            assert j["mfu"] == pytest.approx(j["tokens_per_s"] * flops_per_token / 989.4e12,
                                             rel=1e-12)
        assert "| MFU " in p.stderr
    assert_same(read_scalars(run_dir / "tb"), expected_scalars(run_dir))
