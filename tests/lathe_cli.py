"""The `lathe` binary as the Python tests run it: LATHE (LATHE_BIN, which CTest sets, else the build
folder's) and run(), which fails the calling test with lathe's stderr when the command fails."""

import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LATHE = os.environ.get("LATHE_BIN", str(ROOT / "build" / "lathe"))

# The model and data sections of the tiny train config the CLI tests train: a one-layer Llama of
# hidden size 32, 16-token sequences, every document for training (no validation split). A test
# appends its train/optimizer/checkpoint sections, then data.path and data.tokenizer.
TINY_MODEL = """
model:
  family: llama
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 1
  num_attention_heads: 2
  num_key_value_heads: 1
  max_position_embeddings: 64
  tie_word_embeddings: true
data:
  split: "100,0,0"
  seq_length: 16
"""


def tiny_llama_model(hidden, intermediate):
    """The model section of a two-layer Llama (4 heads, 2 KV heads, 64 positions, tied)."""
    return f"""
model:
  family: llama
  hidden_size: {hidden}
  intermediate_size: {intermediate}
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  max_position_embeddings: 64
  tie_word_embeddings: true
"""


def tiny_llama(hidden, intermediate, seq_length):
    """tiny_llama_model's section with a data section of a 90/10 split."""
    return tiny_llama_model(hidden, intermediate) + f"""data:
  split: "90,10,0"
  seq_length: {seq_length}
"""


# A two-layer Llama of hidden size 32 with a validation split: the model and data sections that
# the run-inspecting tests (runs, report, TensorBoard) share; a test appends its train sections.
TINY_MODEL_2L = tiny_llama(32, 64, 16)

# The same a little wider (hidden 48) with sequences of 32 tokens: the training and offload tests,
# whose loss must fall within a few steps.
TINY_MODEL_48 = tiny_llama(48, 96, 32)

def train_cmd(corpus, run_dir, *sets):
    """The arguments of `lathe train CORPUS/tiny.yaml --run-dir RUN_DIR --set S...`."""
    args = ["train", corpus / "tiny.yaml", "--run-dir", run_dir]
    for s in sets:
        args += ["--set", s]
    return args


def run(args, check=True, timeout=600, **kw):
    """`lathe ARGS` (each argument str()-ed), output captured as text; with check, a non-zero exit
    raises AssertionError naming the command, its exit code and its stderr."""
    p = subprocess.run([LATHE] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def tokenize_corpus(jsonl, tokenizer, prefix, vocab_size, special_tokens="<|endoftext|>"):
    """The tests' token files: a BPE tokenizer of vocab_size trained on jsonl (written to
    tokenizer), then jsonl prepared with it into prefix.bin/.idx, an EOD after each document."""
    run(["tokenizer", "train", "--vocab-size", vocab_size, "--special-tokens", special_tokens,
         "--input", jsonl, "--output", tokenizer])
    run(["prepare", "--tokenizer", tokenizer, "--input", jsonl, "--output-prefix", prefix,
         "--append-eod"])


def tiny_training_folder(d, config_text, chars, vocab_size=384):
    """A folder a tiny training run reads: d/c.jsonl (GCIDE's first `chars` characters), its
    tokenizer d/tok.json and token files d/gc (tokenize_corpus), and d/tiny.yaml, config_text with
    data.path and data.tokenizer pointing at them. Returns d."""
    from corpus import write_gcide_jsonl
    d = Path(d)
    write_gcide_jsonl(d / "c.jsonl", chars)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", vocab_size)
    (d / "tiny.yaml").write_text(config_text + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    return d


def wait_for_step(run_dir, step, proc, timeout=300):
    """Waits until run_dir/metrics.jsonl's last line has reached `step`; fails when proc (the
    training process, stderr piped) ends first or the timeout passes."""
    path = Path(run_dir) / "metrics.jsonl"
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists():
            lines = [l for l in path.read_text().splitlines() if l.endswith("}")]
            if lines and json.loads(lines[-1])["step"] >= step:
                return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early ({proc.returncode}): {proc.stderr.read()}")
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the run")
