"""The `lathe` binary as the Python tests run it: LATHE (LATHE_BIN, which CTest sets, else the build
folder's) and run(), which fails the calling test with lathe's stderr when the command fails."""

import os
import subprocess
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


def run(args, check=True, timeout=600, **kw):
    """`lathe ARGS` (each argument str()-ed), output captured as text; with check, a non-zero exit
    raises AssertionError naming the command, its exit code and its stderr."""
    p = subprocess.run([LATHE] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p
