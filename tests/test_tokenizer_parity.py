"""`lathe tokenize` against Hugging Face `tokenizers`, byte for byte.

For every tokenizer.json in $LATHE_SHARED_DIR/tokenizers (gpt2, gpt-neox-20b, llama2, llama3,
qwen3) a varied corpus (tests/corpus.py: dictionary text in eight languages, Unicode edge cases,
the tokenizer's own special-token strings embedded in text) is encoded by HF
(`encode_batch(..., add_special_tokens=S)`) and by `lathe tokenize [--special]`, and decoded back
by both (`decode_batch(ids, skip_special_tokens=not S)` vs `lathe tokenize --decode [--special]`).
Every document must agree exactly: the number of documents and mismatches is printed, and the
first mismatches are shown with their text.

Also checked: output order with many threads and many batches, and that bad input (a malformed
JSON line, invalid UTF-8, a missing field, an id outside the vocabulary) fails with an error
naming the file and line and leaves no output file.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import build_corpus  # noqa: E402

LATHE = os.environ.get("LATHE_BIN", str(Path(__file__).resolve().parents[1] / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
TOKENIZERS = ["gpt2", "gpt-neox-20b", "llama2", "llama3", "qwen3"]
# About 2.7 MB of text per tokenizer; the whole file takes 35 s on the 2-core VM when it is
# lightly loaded, about 2 minutes when other jobs share it.
CORPUS_BYTES = 4_000_000
SHOW = 5


def tokenizer_path(name):
    path = SHARED / "tokenizers" / f"{name}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing (LATHE_SHARED_DIR={SHARED})")
    return path


def run_lathe(args, input_path, output_path):
    proc = subprocess.run([LATHE, "tokenize", *args, "--input", str(input_path),
                           "--output", str(output_path)], capture_output=True, text=True)
    assert proc.returncode == 0, f"lathe {' '.join(args)} failed:\n{proc.stderr}"
    with open(output_path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl(path, key, values):
    with open(path, "w", encoding="utf-8") as f:
        for v in values:
            f.write(json.dumps({key: v}) + "\n")


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def report(name, what, docs, expected, got):
    """Prints the counts; returns the mismatch descriptions."""
    assert len(got) == len(expected), f"{name} {what}: {len(got)} output lines for {len(expected)} documents"
    bad = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    print(f"{name} {what}: {len(docs)} documents, {len(bad)} mismatches")
    lines = []
    for i in bad[:SHOW]:
        e, g = expected[i], got[i]
        at = first_difference(e, g)
        lines.append(f"  doc {i} text={docs[i][:200]!r}\n    first difference at {at}: "
                     f"hf={e[max(0, at - 3):at + 8]!r}\n    lathe={g[max(0, at - 3):at + 8]!r}")
    return lines


@pytest.mark.parametrize("name", TOKENIZERS)
def test_encode_decode_parity(name, tmp_path):
    path = tokenizer_path(name)
    hf = Tokenizer.from_file(str(path))
    specials = [t.content for t in hf.get_added_tokens_decoder().values()]
    # A bounded, deterministic sample of the added tokens (llama3 has 256).
    specials = sorted(specials)[:40]
    docs = build_corpus(total_bytes=CORPUS_BYTES, seed=1234, special_strings=specials)
    total_bytes = sum(len(d.encode("utf-8")) for d in docs)
    print(f"{name}: {len(docs)} documents, {total_bytes} bytes")

    text_in = tmp_path / "text.jsonl"
    write_jsonl(text_in, "text", docs)
    failures = []
    for special in (False, True):
        flag = ["--special"] if special else []
        got = [r["ids"] for r in run_lathe(["--tokenizer", str(path), "--threads", "2", *flag],
                                           text_in, tmp_path / "ids.jsonl")]
        expected = [e.ids for e in hf.encode_batch(docs, add_special_tokens=special)]
        failures += report(name, f"encode special={special}", docs, expected, got)

        # Decode HF's ids (with the post-processor's specials, so skipping has work to do).
        ids = [e.ids for e in hf.encode_batch(docs, add_special_tokens=True)]
        ids_in = tmp_path / "ids_in.jsonl"
        write_jsonl(ids_in, "ids", ids)
        got_text = [r["text"] for r in run_lathe(
            ["--tokenizer", str(path), "--decode", "--threads", "2", *flag], ids_in,
            tmp_path / "text_out.jsonl")]
        expected_text = hf.decode_batch(ids, skip_special_tokens=not special)
        failures += report(name, f"decode special={special}", docs, expected_text, got_text)
    assert not failures, "mismatches against HF tokenizers:\n" + "\n".join(failures)


# Normalizers over (nearly) every code point, each alone, followed by combining marks, and after a
# base letter. HF takes its normalization and mark data from Unicode 9.0 tables; lathe reproduces
# that on top of utf8proc's newer data. (Lowercase and BertNormalizer are left out: HF's Rust
# case tables are Unicode 16 and its BERT categories predate Unicode 9, and lathe documents those
# differences for characters assigned since.)
SWEEP_NORMALIZERS = {
    "NFC": {"type": "NFC"},
    "NFD": {"type": "NFD"},
    "NFKC": {"type": "NFKC"},
    "NFKD": {"type": "NFKD"},
    "StripAccents": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}]},
}


def code_point_sweep():
    cps = [c for c in range(0x80, 0x30000)
           if not 0xD800 <= c < 0xF900 and not (0x20000 <= c < 0x2F800 and c % 7)]
    return ["".join(chr(c) + "\u0301" + chr(c) + " A" + chr(c) + "\u0323\u0307" for c in cps[i:i + 64])
            for i in range(0, len(cps), 64)]


@pytest.mark.parametrize("normalizer", list(SWEEP_NORMALIZERS))
def test_normalizer_code_point_sweep(normalizer, tmp_path):
    doc = json.loads((SHARED / "tokenizers" / "gpt2.json").read_text(encoding="utf-8"))
    doc["normalizer"] = SWEEP_NORMALIZERS[normalizer]  # byte-level ids show every byte of the output
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    hf = Tokenizer.from_file(str(path))
    docs = code_point_sweep()
    text_in = tmp_path / "sweep.jsonl"
    write_jsonl(text_in, "text", docs)
    got = [r["ids"] for r in run_lathe(["--tokenizer", str(path)], text_in, tmp_path / "out.jsonl")]
    expected = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    failures = report(f"sweep {normalizer}", "encode", docs, expected, got)
    assert not failures, "\n".join(failures)


def test_order_with_many_threads_and_batches(tmp_path):
    """More lines than one batch holds, several workers: output order is input order."""
    path = tokenizer_path("gpt2")
    hf = Tokenizer.from_file(str(path))
    docs = [f"line {i} " + "word " * (i % 7) for i in range(10000)]
    text_in = tmp_path / "in.jsonl"
    write_jsonl(text_in, "text", docs)
    got = [r["ids"] for r in run_lathe(["--tokenizer", str(path), "--threads", "4"], text_in,
                                       tmp_path / "out.jsonl")]
    assert got == [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]


def test_stdin_stdout_and_json_key(tmp_path):
    path = tokenizer_path("llama2")
    hf = Tokenizer.from_file(str(path))
    lines = "".join(json.dumps({"id": i, "body": f"doc {i} \u00e9"}) + "\n" for i in range(3))
    proc = subprocess.run([LATHE, "tokenize", "--tokenizer", str(path), "--json-key", "body",
                           "--special"], input=lines, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(l)["ids"] for l in proc.stdout.splitlines()]
    assert got == [hf.encode(f"doc {i} \u00e9").ids for i in range(3)]


@pytest.mark.parametrize("content,decode,expect", [
    ('{"text": "ok"}\n{"text": "ok"}\n{"text": broken}\n', False, ":3:"),
    ('{"text": "ok"}\n{"other": "x"}\n', False, ":2:"),
    (b'{"text": "ok"}\n{"text": "\xff\xfe"}\n', False, ":2:"),
    ('{"ids": [1, 2]}\n{"ids": [1, 99999999]}\n', True, ":2:"),
    ('{"ids": [1, 2]}\n{"ids": [1, -3]}\n', True, ":2:"),
    ('{"ids": "nope"}\n', True, ":1:"),
])
def test_bad_input_names_file_and_line(tmp_path, content, decode, expect):
    path = tokenizer_path("gpt2")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out.jsonl"
    args = [LATHE, "tokenize", "--tokenizer", str(path), "--input", str(bad), "--output", str(out)]
    if decode:
        args.append("--decode")
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode != 0
    assert f"bad.jsonl{expect}" in proc.stderr, proc.stderr
    assert not out.exists(), "a failed run must not leave an output file"
    assert not list(tmp_path.glob("out.jsonl.tmp*")), "temporary output left behind"


def test_bad_tokenizer_json_names_the_key(tmp_path):
    doc = json.loads((SHARED / "tokenizers" / "gpt2.json").read_text(encoding="utf-8"))
    doc["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Isolatd",
                            "invert": False}
    bad = tmp_path / "tok.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    proc = subprocess.run([LATHE, "tokenize", "--tokenizer", str(bad)], input='{"text":"a"}\n',
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pre_tokenizer.behavior" in proc.stderr and "Isolated" in proc.stderr, proc.stderr
