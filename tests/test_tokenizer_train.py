"""`lathe tokenizer train` against Hugging Face `tokenizers`.

What is checked:
  * HF `Tokenizer.from_file` loads what lathe writes, and HF and `lathe tokenize` encode a
    held-out corpus (other GCIDE entries, German, Japanese, Russian dictionary text, edge cases)
    to the same ids: 0 mismatches.
  * HF's BpeTrainer, given the same documents and settings, learns the same vocabulary (ids
    included) and the same merges in the same order; the overlap is printed and must be exact,
    because lathe reproduces HF's tie-breaking (count, then smallest pair of ids).
  * Both pre-tokenizers that split (gpt2, llama3), special tokens, min_frequency, the text,
    text-blocks and gzip inputs, `lathe tokenizer info`, and clear errors for bad input.
"""

import gzip
import json
import os
import subprocess
import zlib
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LATHE = os.environ.get("LATHE_BIN", str(Path(__file__).resolve().parents[1] / "build" / "lathe"))
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")
DICTS = Path("/usr/share/dictd")
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)



@pytest.fixture(scope="module", autouse=True)
def required_data():
    """dict-gcide is required test data: without it every test here fails."""
    assert GCIDE.exists(), f"{GCIDE} is missing: install dict-gcide (scripts/install-deps.sh does)"


def read_dict(name, start, size):
    """`size` bytes of a dictd dictionary from decompressed offset `start`, cut at whole lines."""
    path = DICTS / name
    assert path.exists(), f"{path} is missing: scripts/install-deps.sh installs the dictionaries"
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    with open(path, "rb") as f:
        while len(out) < start + size:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            out += d.decompress(chunk)
    text = bytes(out[start : start + size]).decode("utf-8", "ignore")
    return text[text.find("\n") + 1 : text.rfind("\n")]


def blocks(text):
    """Blank-line-separated blocks, as `--format text-blocks` cuts them (text has no \\r)."""
    out, cur = [], []
    for line in text.split("\n"):
        if line.strip(" \t\r\v\f") == "":
            if cur:
                out.append("\n".join(cur))
                cur = []
        else:
            cur.append(line)
    if cur:
        out.append("\n".join(cur))
    return out


def write_jsonl(path, docs, key="text"):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({key: d}, ensure_ascii=False) + "\n")


def lathe(*args, check=True):
    p = subprocess.run([LATHE, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def hf_pre_tokenizer(kind):
    if kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "bytelevel-noregex":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if kind == "llama3":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    raise ValueError(kind)


def hf_train(docs, vocab_size, kind="gpt2", special_tokens=(), min_frequency=0):
    """HF's BpeTrainer with the settings `lathe tokenizer train` documents as equivalent."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = hf_pre_tokenizer(kind)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    return tok


def compare_models(lathe_json, hf_tok):
    """(vocab overlap fraction, same ids?, merges agreeing in position / total, same merges?)"""
    ours = json.loads(Path(lathe_json).read_text(encoding="utf-8"))["model"]
    theirs = json.loads(hf_tok.to_str())["model"]
    ov, tv = ours["vocab"], theirs["vocab"]
    overlap = len(set(ov) & set(tv)) / max(len(tv), 1)
    om = [tuple(m) for m in ours["merges"]]
    tm = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in theirs["merges"]]
    same_position = sum(1 for a, b in zip(om, tm) if a == b)
    first_diff = next((i for i, (a, b) in enumerate(zip(om, tm)) if a != b), None)
    print(f"vocab: lathe {len(ov)}, HF {len(tv)}, overlap {overlap:.4%}, ids equal {ov == tv}; "
          f"merges: lathe {len(om)}, HF {len(tm)}, same position {same_position}, "
          f"first difference at {first_diff}")
    return overlap, ov == tv, same_position, om == tm


def heldout_docs():
    docs = blocks(read_dict("gcide.dict.dz", 30_000_000, 300_000))
    for name in ("freedict-deu-eng.dict.dz", "freedict-jpn-eng.dict.dz", "freedict-eng-rus.dict.dz",
                 "freedict-ara-eng.dict.dz"):
        docs += blocks(read_dict(name, 200_000, 60_000))
    docs += [
        "", " ", "   leading and trailing   ", "tabs\tand\r\nwindows\r\nlines\n\n\n",
        "It's, they're, WE'LL, I'D, you've: contractions in ANY case.",
        "emoji 👩‍👩‍👧‍👦 flags 🇫🇷 skin 👍🏽 and CJK 漢字かなカナ한국어",
        "combining e\u0301 a\u0308 and ﬁ ligature, zero\u200bwidth, nbsp\u00a0here",
        "numbers 1234567 3.14159 -42 1e10 0x1F",
        "<|endoftext|>special in the middle<|padding|> and at the end <|endoftext|>",
    ]
    return docs


def encode_with_lathe(tokenizer_json, docs, tmp_path, special=False):
    src = tmp_path / "heldout.jsonl"
    out = tmp_path / "heldout.ids.jsonl"
    write_jsonl(src, docs)
    args = ["tokenize", "--tokenizer", tokenizer_json, "--input", src, "--output", out]
    if special:
        args.append("--special")
    lathe(*args)
    return [json.loads(line)["ids"] for line in out.read_text().splitlines()]


def assert_same_encoding(tokenizer_json, tmp_path, special=False):
    hf = Tokenizer.from_file(str(tokenizer_json))
    docs = heldout_docs()
    ours = encode_with_lathe(tokenizer_json, docs, tmp_path, special)
    theirs = [e.ids for e in hf.encode_batch(docs, add_special_tokens=special)]
    assert len(ours) == len(theirs) == len(docs)
    mismatches = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    print(f"held-out: {len(docs)} documents, {sum(map(len, theirs))} tokens, "
          f"{len(mismatches)} mismatches")
    assert not mismatches, f"first mismatch: {docs[mismatches[0]][:200]!r}"
    # Round trip through HF's decoder.
    for d, ids in zip(docs[:200], theirs[:200]):
        assert hf.decode(ids, skip_special_tokens=False) == d


@pytest.fixture(scope="module")
def train_docs():
    # About 3 MB of GCIDE, one document per dictionary block.
    return blocks(read_dict("gcide.dict.dz", 2_000_000, 3_000_000))


def test_gpt2_style_matches_hf(tmp_path, train_docs):
    corpus = tmp_path / "train.jsonl"
    write_jsonl(corpus, train_docs)
    out = tmp_path / "tokenizer.json"
    specials = ["<|endoftext|>", "<|padding|>"]
    lathe("tokenizer", "train", "--vocab-size", 8000, "--input", corpus, "--output", out,
          "--special-tokens", ",".join(specials), "--threads", 2)

    hf = Tokenizer.from_file(str(out))
    assert hf.get_vocab_size() == 8000
    assert hf.token_to_id("<|endoftext|>") == 0 and hf.token_to_id("<|padding|>") == 1
    added = json.loads(out.read_text())["added_tokens"]
    assert [(t["id"], t["content"], t["special"]) for t in added] == [
        (0, "<|endoftext|>", True), (1, "<|padding|>", True)]

    theirs = hf_train(train_docs, 8000, "gpt2", specials)
    overlap, same_ids, _, same_merges = compare_models(out, theirs)
    assert overlap == 1.0 and same_ids and same_merges

    assert_same_encoding(out, tmp_path, special=False)
    assert_same_encoding(out, tmp_path, special=True)


def test_llama3_pre_tokenizer_matches_hf(tmp_path, train_docs):
    docs = train_docs[: len(train_docs) // 3]
    corpus = tmp_path / "train.jsonl"
    write_jsonl(corpus, docs, key="body")
    out = tmp_path / "tokenizer.json"
    lathe("tokenizer", "train", "--vocab-size", 3000, "--input", corpus, "--output", out,
          "--pre-tokenizer", "llama3", "--json-key", "body", "--threads", 1)
    j = json.loads(out.read_text())
    assert j["pre_tokenizer"]["type"] == "Sequence"
    assert j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == LLAMA3_PATTERN
    overlap, same_ids, _, same_merges = compare_models(out, hf_train(docs, 3000, "llama3"))
    assert overlap == 1.0 and same_ids and same_merges
    assert_same_encoding(out, tmp_path)


def test_no_regex_and_a_special_token_that_merges_spell(tmp_path, train_docs):
    # bytelevel-noregex: every document is one word. The special token "the" is also what the
    # merges t+h, th+e spell: HF then reuses the special token's id for the merge (no new entry),
    # and encoding splits "the" out of every text as an added token.
    docs = [line for d in train_docs[:3000] for line in d.split("\n")]
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(docs) + "\n", encoding="utf-8")
    out = tmp_path / "tokenizer.json"
    lathe("tokenizer", "train", "--vocab-size", 1500, "--input", corpus, "--output", out,
          "--pre-tokenizer", "bytelevel-noregex", "--special-tokens", "<|endoftext|>,the",
          "--format", "text")
    theirs = hf_train(docs, 1500, "bytelevel-noregex", ["<|endoftext|>", "the"])
    overlap, same_ids, _, same_merges = compare_models(out, theirs)
    assert same_ids and same_merges
    merges = [tuple(m) for m in json.loads(out.read_text())["model"]["merges"]]
    assert ("th", "e") in merges and Tokenizer.from_file(str(out)).token_to_id("the") == 1
    assert_same_encoding(out, tmp_path)


def test_min_frequency_matches_hf(tmp_path, train_docs):
    docs = train_docs[:2000]
    corpus = tmp_path / "train.jsonl"
    write_jsonl(corpus, docs)
    out = tmp_path / "tokenizer.json"
    p = lathe("tokenizer", "train", "--vocab-size", 50000, "--min-frequency", 40, "--input",
              corpus, "--output", out)
    assert "min_frequency" in p.stderr  # reported: the vocabulary is smaller than asked
    theirs = hf_train(docs, 50000, "gpt2", min_frequency=40)
    overlap, same_ids, _, same_merges = compare_models(out, theirs)
    assert same_ids and same_merges
    assert 256 < Tokenizer.from_file(str(out)).get_vocab_size() < 50000


def test_text_blocks_and_gzip_input(tmp_path):
    text = read_dict("gcide.dict.dz", 5_000_000, 600_000) + "\n"
    gz = tmp_path / "part.txt.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(text)
    out = tmp_path / "blocks.json"
    lathe("tokenizer", "train", "--vocab-size", 2000, "--input", gz, "--output", out,
          "--format", "text-blocks")
    _, same_ids, _, same_merges = compare_models(out, hf_train(blocks(text), 2000))
    assert same_ids and same_merges

    # --format text: one document per line; blank lines (this slice has empty and
    # whitespace-only ones) are not documents.
    plain = tmp_path / "part.txt"
    plain.write_text(text, encoding="utf-8")
    out = tmp_path / "lines.json"
    lathe("tokenizer", "train", "--vocab-size", 2000, "--input", plain, "--output", out,
          "--format", "text")
    lines = [l for l in text.split("\n")[:-1] if l.strip(" \t\r\v\f")]
    _, same_ids, _, same_merges = compare_models(out, hf_train(lines, 2000))
    assert same_ids and same_merges


def test_corpus_too_small_is_reported(tmp_path):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("a tiny corpus\nwith few pairs\n")
    out = tmp_path / "tiny.json"
    p = lathe("tokenizer", "train", "--vocab-size", 5000, "--input", corpus, "--output", out)
    assert "fewer than the 5000" in p.stderr
    hf = Tokenizer.from_file(str(out))
    assert 256 < hf.get_vocab_size() < 5000
    assert hf.decode(hf.encode("with a corpus").ids) == "with a corpus"


def test_info(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(read_dict("gcide.dict.dz", 1_000_000, 200_000))
    out = tmp_path / "t.json"
    lathe("tokenizer", "train", "--vocab-size", 600, "--input", corpus, "--output", out,
          "--special-tokens", "<s>,</s>")
    info = lathe("tokenizer", "info", out).stdout
    assert "BPE, 600 vocabulary entries, 342 merges" in info
    assert "ByteLevel(add_prefix_space=false, trim_offsets=true, use_regex=true)" in info
    assert "added tokens:   2 (2 special)" in info and "</s>" in info
    assert "vocab size:     600" in info


def test_bad_input_is_a_clear_error(tmp_path):
    out = tmp_path / "never.json"
    good = tmp_path / "good.txt"
    good.write_text("some text\n")

    p = lathe("tokenizer", "train", "--vocab-size", 100, "--input", good, "--output", out,
              check=False)
    assert p.returncode == 2 and "at least 256" in p.stderr

    p = lathe("tokenizer", "train", "--vocab-size", 300, "--input", tmp_path / "missing.txt",
              "--output", out, check=False)
    assert p.returncode != 0 and "missing.txt" in p.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken}\n')
    p = lathe("tokenizer", "train", "--vocab-size", 300, "--input", bad, "--output", out,
              check=False)
    assert p.returncode != 0 and "bad.jsonl:2" in p.stderr

    nokey = tmp_path / "nokey.jsonl"
    nokey.write_text('{"txt": "fine"}\n')
    p = lathe("tokenizer", "train", "--vocab-size", 300, "--input", nokey, "--output", out,
              check=False)
    assert p.returncode != 0 and "nokey.jsonl:1" in p.stderr and "'txt'" in p.stderr

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"ok line\ncaf\xe9 au lait\n")
    p = lathe("tokenizer", "train", "--vocab-size", 300, "--input", latin1, "--output", out,
              check=False)
    assert p.returncode != 0 and "latin1.txt:2" in p.stderr and "UTF-8" in p.stderr

    p = lathe("tokenizer", "train", "--vocab-size", 300, "--input", good, "--output", out,
              "--pre-tokenizer", "gpt3", check=False)
    assert p.returncode == 2 and "gpt3" in p.stderr

    p = lathe("tokenizer", "train", "--vocab-size", 300, "--input", good, "--output",
              tmp_path / "no_such_dir" / "t.json", check=False)
    assert p.returncode != 0 and "no_such_dir" in p.stderr
    assert not out.exists()
    assert not list(tmp_path.glob("never.json*"))
