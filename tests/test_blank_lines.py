"""One blank-line rule for `lathe prepare` and `lathe tokenizer train`: a blank line (empty, or
only spaces, tabs, \\r, \\v, \\f) is never a document. `text` and JSONL input pass over it,
`text-blocks` splits documents at it. Both commands read the same files into the same documents.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
LATHE = os.environ.get("LATHE_BIN", str(ROOT / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", str(ROOT.parent / "shared")))
GPT2 = SHARED / "tokenizers" / "gpt2.json"
BLANKS = ["", " ", "\t", "  \t  ", "\r", " \r", "\v", "\f", "\t\v\f\r"]


def lathe(*args, check=True):
    p = subprocess.run([LATHE, *map(str, args)], capture_output=True)
    if check:
        assert p.returncode == 0, (args, p.stderr.decode(errors="replace"))
    return p


def report(p, key):
    m = re.search(rf"^  {key}: (\d+)$", p.stdout.decode(), re.M)
    assert m, p.stdout.decode()
    return int(m.group(1))


def token_docs(prefix):
    """Documents of a GPT-NeoX .idx/.bin pair (one sequence per document, uint16 for GPT-2)."""
    idx = Path(f"{prefix}.idx").read_bytes()
    count = int.from_bytes(idx[18:26], "little")
    sizes = np.frombuffer(idx, np.int32, count, 34)
    tokens = np.frombuffer(Path(f"{prefix}.bin").read_bytes(), np.uint16)
    out, at = [], 0
    for s in sizes:
        out.append([int(t) for t in tokens[at : at + s]])
        at += s
    return out


def corpus_with_blank_lines():
    """Lines of text with every kind of blank line between them (first and last lines blank)."""
    words = ["alpha beta", "gamma  delta ", "naïve café", "   indented", "x"]
    lines = []
    for i in range(60):
        lines.append(BLANKS[i % len(BLANKS)])
        lines.append(f"{words[i % len(words)]} {i}")
        if i % 7 == 0:
            lines.append(BLANKS[(i + 3) % len(BLANKS)])
    lines.append(" \t ")
    return lines


def test_prepare_text_passes_over_blank_lines(tmp_path):
    lines = corpus_with_blank_lines()
    src = tmp_path / "lines.txt"
    src.write_bytes(("\n".join(lines) + "\n").encode())
    documents = [l.removesuffix("\r") for l in lines if l.strip(" \t\r\v\f") != ""]
    blank = len(lines) - len(documents)
    hf = Tokenizer.from_file(str(GPT2))
    expected = [e.ids for e in hf.encode_batch(documents)]
    for fmt in ["text", "auto"]:
        p = lathe("prepare", "--tokenizer", GPT2, "--input", src, "--output-prefix",
                  tmp_path / fmt, "--format", fmt)
        assert report(p, "documents") == len(documents)
        assert report(p, "blank lines") == blank
        assert report(p, "skipped") == 0
        assert token_docs(tmp_path / fmt) == expected


def test_prepare_jsonl_passes_over_blank_lines(tmp_path):
    docs = ["one", "two words", "three"]
    src = tmp_path / "docs.jsonl"
    body = "\n \n".join(json.dumps({"text": d}) for d in docs)
    src.write_bytes(("\r\n\t\n" + body + "\n\n\n").encode())
    p = lathe("prepare", "--tokenizer", GPT2, "--input", src, "--output-prefix", tmp_path / "j")
    assert report(p, "documents") == 3 and report(p, "blank lines") == 6
    hf = Tokenizer.from_file(str(GPT2))
    assert token_docs(tmp_path / "j") == [hf.encode(d).ids for d in docs]
    # An empty document that is not a blank line is still an error.
    src.write_bytes(b'{"text": "fine"}\n\n{"text": ""}\n')
    p = lathe("prepare", "--tokenizer", GPT2, "--input", src, "--output-prefix", tmp_path / "e",
              check=False)
    assert p.returncode != 0 and f"{src}:3: empty document".encode() in p.stderr, p.stderr


def test_prepare_chat_passes_over_blank_lines(tmp_path):
    convs = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
             [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]]
    lines = [json.dumps({"messages": c}) for c in convs]
    llama3 = SHARED / "tokenizers" / "llama3.json"
    dense, sparse = tmp_path / "dense.jsonl", tmp_path / "sparse.jsonl"
    dense.write_text("\n".join(lines) + "\n")
    sparse.write_text("\n \n" + "\n\t\n\n".join(lines) + "\n\n")
    for src in [dense, sparse]:
        p = lathe("prepare", "--tokenizer", llama3, "--input", src, "--output-prefix",
                  tmp_path / src.stem, "--format", "chat")
        assert report(p, "documents") == 2
        assert report(p, "blank lines") == (0 if src == dense else 5)
    for suffix in [".bin", ".idx", "_label.bin", "_label.idx"]:
        assert (tmp_path / f"sparse{suffix}").read_bytes() == \
            (tmp_path / f"dense{suffix}").read_bytes(), suffix


def test_text_blocks_split_at_blank_lines(tmp_path):
    src = tmp_path / "blocks.txt"
    src.write_bytes(b"\n \none\ntwo\n\t\n\r\nthree\n \f\nfour\r\nfive\n\n")
    p = lathe("prepare", "--tokenizer", GPT2, "--input", src, "--output-prefix", tmp_path / "b",
              "--format", "text-blocks")
    hf = Tokenizer.from_file(str(GPT2))
    assert token_docs(tmp_path / "b") == [hf.encode(d).ids
                                          for d in ["one\ntwo", "three", "four\r\nfive"]]
    assert report(p, "blank lines") == 0  # separators, not passed-over lines


def trained_documents(stderr):
    m = re.search(r"in (\d+) documents", stderr.decode())
    assert m, stderr.decode()
    return int(m.group(1))


def test_tokenizer_train_reads_the_same_documents_as_prepare(tmp_path):
    # Whitespace-only lines in bulk: if they were documents, "  " pairs would be merged.
    lines = []
    for i, l in enumerate(corpus_with_blank_lines()):
        lines.append(l)
        lines.extend(["    \t    "] * 5)
    with_blanks = tmp_path / "with_blanks.txt"
    with_blanks.write_bytes(("\n".join(lines) + "\n").encode())
    without = tmp_path / "without.txt"
    without.write_bytes(("\n".join(l for l in lines if l.strip(" \t\r\v\f")) + "\n").encode())
    outs = []
    for src in [with_blanks, without]:
        out = tmp_path / f"{src.stem}.json"
        p = lathe("tokenizer", "train", "--vocab-size", 300, "--input", src, "--output", out,
                  "--format", "text")
        q = lathe("prepare", "--tokenizer", GPT2, "--input", src, "--output-prefix",
                  tmp_path / src.stem, "--format", "text")
        assert trained_documents(p.stderr) == report(q, "documents")
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    # JSONL: both commands pass over the same blank lines.
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_bytes(b'\n{"text": "a b"}\n  \n{"text": "c"}\r\n\r\n')
    p = lathe("tokenizer", "train", "--vocab-size", 260, "--input", jsonl, "--output",
              tmp_path / "j.json")
    q = lathe("prepare", "--tokenizer", GPT2, "--input", jsonl, "--output-prefix", tmp_path / "j")
    assert trained_documents(p.stderr) == report(q, "documents") == 2


def test_help_states_the_rule():
    for cmd in [["prepare", "--help"], ["tokenizer", "train", "--help"]]:
        text = lathe(*cmd).stdout.decode()
        assert "blank lines" in text.lower() and "never documents" in text, (cmd, text)
