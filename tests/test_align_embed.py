"""`lathe align embed` (stage 3 of vocabulary adaptation, docs/ALIGN.md "Embeddings") end to end,
on the CPU, on real text: a slice of GCIDE tokenized by `lathe prepare` with the GPT-2 tokenizer.

What is checked, for GloVe and skip-gram:
  * the output is GloVe's text format: one "<id> v1 .. vD" line per token id seen at least
    --min-count times in the token file (counted here with numpy), no other rows, finite values;
  * the vectors mean something: colour words have other colour words, number words other number
    words among their 10 nearest neighbours for at least 4 of 7 words (random vectors: about
    0.05 of 7, with 10 neighbours among ~9k ids);
  * the stage cache: an identical second run does nothing; a changed setting runs again;
  * bad input is a clear error (an unknown method, a missing token file, no frequent token).
The GPU kernels are checked against these CPU twins in src/align/*_test.cu; speed and quality
against the GloVe C tool and fastText in bench/embed_bench.sh.
"""

import os
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

LATHE = os.environ.get("LATHE_BIN", str(Path(__file__).resolve().parents[1] / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
GPT2 = SHARED / "tokenizers" / "gpt2.json"
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")



@pytest.fixture(scope="module", autouse=True)
def required_data():
    """dict-gcide and ../shared/tokenizers/gpt2.json are required test data: a missing file fails
    every test here, naming it."""
    for path in (GCIDE, GPT2):
        assert path.exists(), f"{path} is missing (../shared, or dict-gcide: scripts/install-deps.sh)"

COLOURS = [" red", " blue", " green", " yellow", " white", " black", " brown"]
NUMBERS = [" two", " three", " four", " five", " six", " seven", " eight"]


def lathe(*args, check=True):
    p = subprocess.run([LATHE, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """About 2.5 MB of GCIDE (skipping its header), one document per blank-line block."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    with open(GCIDE, "rb") as f:
        while len(out) < 3_000_000:
            out += d.decompress(f.read(1 << 20))
    text = bytes(out[500_000:3_000_000]).decode("utf-8", "ignore")
    tmp = tmp_path_factory.mktemp("embed")
    (tmp / "gcide.txt").write_text(text, encoding="utf-8")
    lathe("prepare", "--tokenizer", GPT2, "--input", tmp / "gcide.txt", "--format", "text-blocks",
          "--output-prefix", tmp / "gcide", "--no-progress")
    return tmp / "gcide"


def token_counts(prefix):
    idx = Path(str(prefix) + ".idx").read_bytes()
    dtype = {4: np.int32, 8: np.uint16}[idx[17]]
    t = np.fromfile(str(prefix) + ".bin", dtype)
    return np.bincount(t.astype(np.int64))


def read_vectors(path):
    ids, rows = [], []
    for line in Path(path).read_text().splitlines():
        parts = line.split(" ")
        ids.append(int(parts[0]))
        rows.append([float(x) for x in parts[1:]])
    return ids, np.asarray(rows, dtype=np.float64)


def neighbour_hits(ids, m, words):
    """How many of `words` have another of `words` among their 10 nearest neighbours."""
    tok = Tokenizer.from_file(str(GPT2))
    word_ids = [tok.encode(w).ids for w in words]
    assert all(len(w) == 1 for w in word_ids), word_ids
    word_ids = [w[0] for w in word_ids]
    pos = {t: i for i, t in enumerate(ids)}
    unit = m / (np.linalg.norm(m, axis=1, keepdims=True) + 1e-12)
    hits = 0
    for w in word_ids:
        sims = unit @ unit[pos[w]]
        sims[pos[w]] = -np.inf
        top = {ids[j] for j in np.argsort(-sims)[:10]}
        hits += bool(top & (set(word_ids) - {w}))
    return hits


@pytest.mark.parametrize("method,iters,extra", [("glove", 8, []),
                                                ("sgns", 3, ["--subsample", "1e-3"])])
def test_vectors_are_the_vocabulary_and_mean_something(tokens, tmp_path, method, iters, extra):
    out = tmp_path / f"{method}.txt"

    def embed_args(dim, iters):
        return ["align", "embed", "--tokens", tokens, "--output", out, "--method", method,
                "--dim", dim, "--iters", iters, "--min-count", "5", "--device", "cpu",
                "--threads", "1", *extra]  # one thread: deterministic (Hogwild with more is not)

    args = embed_args(50, iters)
    first = lathe(*args)
    assert "wrote" in first.stdout, first.stdout
    ids, m = read_vectors(out)
    assert m.shape[1] == 50 and np.isfinite(m).all()
    counts = token_counts(tokens)
    assert sorted(ids) == sorted(np.nonzero(counts >= 5)[0].tolist())
    # Rows are written most frequent first.
    assert all(counts[a] >= counts[b] for a, b in zip(ids, ids[1:]))
    assert neighbour_hits(ids, m, COLOURS) >= 4, method
    assert neighbour_hits(ids, m, NUMBERS) >= 4, method

    again = lathe(*args)
    assert "up to date" in again.stdout, again.stdout
    # A changed setting runs again (one pass, to keep the test short).
    changed = lathe(*embed_args(40, 1))
    assert "wrote" in changed.stdout
    assert read_vectors(out)[1].shape[1] == 40


def test_bad_input_is_a_clear_error(tokens, tmp_path):
    p = lathe("align", "embed", "--tokens", tokens, "--output", tmp_path / "v.txt",
              "--method", "word2vec", check=False)
    assert p.returncode != 0 and "expected glove or sgns" in p.stderr, p.stderr
    p = lathe("align", "embed", "--tokens", tmp_path / "missing", "--output", tmp_path / "v.txt",
              "--device", "cpu", check=False)
    assert p.returncode != 0 and "missing" in p.stderr, p.stderr
    p = lathe("align", "embed", "--tokens", tokens, "--output", tmp_path / "v.txt",
              "--device", "cpu", "--min-count", "100000000", check=False)
    assert p.returncode != 0 and "--min-count" in p.stderr, p.stderr
    assert not (tmp_path / "v.txt").exists()


def test_a_diverging_learning_rate_is_an_error_and_writes_nothing(tokens, tmp_path):
    # SGNS at lr 10 sends the vectors to NaN within an epoch; lr inf or NaN is refused up front.
    out = tmp_path / "v.txt"
    p = lathe("align", "embed", "--tokens", tokens, "--output", out, "--method", "sgns",
              "--dim", "8", "--iters", "1", "--lr", "10", "--device", "cpu", "--threads", "2",
              check=False)
    assert p.returncode == 2 and "training diverged" in p.stderr and "lower --lr" in p.stderr, \
        (p.returncode, p.stderr)
    for lr in ("inf", "nan", "-1"):
        p = lathe("align", "embed", "--tokens", tokens, "--output", out, "--lr", lr,
                  "--device", "cpu", check=False)
        assert p.returncode == 2 and f"--lr {lr}" in p.stderr, (lr, p.stderr)
    assert not out.exists()
