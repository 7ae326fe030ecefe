"""`lathe prepare` end to end, against an independent reading of the file format and a Python
re-implementation of GPT-NeoX's tools/datasets/preprocess_data.py (HF `tokenizers`).

What is checked:
  * token streams equal GPT-NeoX's for gpt2 (uint16) and llama3 (int32), with and without
    --append-eod, from JSONL, text lines and text blocks, plain / gzip / zstd / stdin;
  * the .bin/.idx bytes equal, byte for byte, what GPT-NeoX's MMapIndexedDatasetBuilder writes for
    those token lists, and parse with an independent numpy reader;
  * --on-error skip counts bad records, fail names file and line, bad inputs give clear errors;
  * a failed or interrupted run leaves nothing under the final names;
  * chat JSONL: tokens and a label file as GPT-NeoX's preprocess_data_with_chat_template.py.
"""

import gzip
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
LATHE = os.environ.get("LATHE_BIN", str(ROOT / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", str(ROOT.parent / "shared")))
TOKENIZERS = SHARED / "tokenizers"
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")

# ---------------------------------------------------------------------------------------------
# An independent reader and writer of the MMapIndexedDataset layout (GPT-NeoX
# megatron/data/indexed_dataset.py), written from the format description, not from lathe.

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


def read_token_files(prefix):
    """Parses prefix.idx/.bin field by field and checks every invariant. Returns
    (dtype, sizes, pointers, doc_idx, documents as lists of ints)."""
    idx = Path(str(prefix) + ".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
    (version,) = struct.unpack_from("<Q", idx, 9)
    assert version == 1
    code = idx[17]
    dtype = np.dtype(DTYPES[code])
    seq_count, doc_count = struct.unpack_from("<QQ", idx, 18)
    off = 34
    sizes = np.frombuffer(idx, np.int32, seq_count, off)
    off += 4 * seq_count
    pointers = np.frombuffer(idx, np.int64, seq_count, off)
    off += 8 * seq_count
    doc_idx = np.frombuffer(idx, np.int64, doc_count, off)
    off += 8 * doc_count
    assert off == len(idx), f"{len(idx) - off} trailing bytes in the .idx"
    data = Path(str(prefix) + ".bin").read_bytes()
    expected_pointers = np.concatenate(
        [[0], np.cumsum(sizes.astype(np.int64) * dtype.itemsize)[:-1]]) if seq_count else []
    assert np.array_equal(pointers, expected_pointers)
    assert len(data) == int(sizes.astype(np.int64).sum()) * dtype.itemsize
    assert doc_idx[0] == 0 and doc_idx[-1] == seq_count and np.all(np.diff(doc_idx) >= 0)
    tokens = np.frombuffer(data, dtype)
    docs = []
    for k in range(doc_count - 1):
        doc = []
        for i in range(doc_idx[k], doc_idx[k + 1]):
            start = pointers[i] // dtype.itemsize
            doc.extend(int(t) for t in tokens[start:start + sizes[i]])
        docs.append(doc)
    return dtype, sizes, pointers, doc_idx, docs


def neox_file_bytes(docs, dtype):
    """The .idx and .bin bytes GPT-NeoX's MMapIndexedDatasetBuilder writes for `docs` (one
    add_item + end_document per document)."""
    dtype = np.dtype(dtype)
    sizes = [len(d) for d in docs]
    pointers, address = [], 0
    for s in sizes:
        pointers.append(address)
        address += s * dtype.itemsize
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", CODES[dtype])
    idx += struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(sizes) + 1)
    idx += np.array(sizes, np.int32).tobytes() + np.array(pointers, np.int64).tobytes()
    idx += np.arange(len(sizes) + 1, dtype=np.int64).tobytes()
    data = b"".join(np.array(d, dtype).tobytes() for d in docs)
    return idx, data


# ---------------------------------------------------------------------------------------------
# GPT-NeoX's preprocessing, re-implemented: HFTokenizer.tokenize(text) is
# Tokenizer.encode(text).ids (add_special_tokens=True); --append-eod appends the eod id; the
# builder's dtype is uint16 when the vocabulary has fewer than 65,500 entries, else int32.


@lru_cache(maxsize=None)
def hf(name):
    return Tokenizer.from_file(str(TOKENIZERS / f"{name}.json"))


def neox_dtype(name):
    return np.uint16 if hf(name).get_vocab_size() < 65500 else np.int32


def neox_eod(name):
    """GPT-NeoX uses <|endoftext|>; for tokenizers without it lathe takes the eos_token of the
    tokenizer_config.json beside the tokenizer (GPT-NeoX would crash on None)."""
    tok = hf(name)
    eod = tok.token_to_id("<|endoftext|>")
    if eod is None:
        config = json.loads((TOKENIZERS / f"{name}.tokenizer_config.json").read_text())
        eos = config["eos_token"]
        eod = tok.token_to_id(eos if isinstance(eos, str) else eos["content"])
    return eod


def neox_encode(name, texts, append_eod):
    encodings = hf(name).encode_batch(list(texts))
    docs = []
    for e in encodings:
        ids = list(e.ids)
        assert ids, "GPT-NeoX cannot append EOD to an empty encoding"
        if append_eod:
            ids.append(neox_eod(name))
        docs.append(ids)
    return docs


# ---------------------------------------------------------------------------------------------
# Corpora


def split_blocks(text):
    """Blank-line-separated blocks as lathe documents them: a line of only spaces, tabs, \\r, \\v,
    \\f is blank; line ends inside a block are kept; the last line's ending is not."""
    blocks, cur = [], []
    for line in text.split("\n"):
        if line.strip(" \t\r\v\f") == "":
            if cur:
                blocks.append("\n".join(cur))
                cur = []
        else:
            cur.append(line)
    if cur:
        blocks.append("\n".join(cur))
    return [b[:-1] if b.endswith("\r") else b for b in blocks]


@lru_cache(maxsize=None)
def gcide_text(limit=600_000):
    """The start of GCIDE (UTF-8 lines only), cut at a line end."""
    raw = gzip.open(GCIDE).read(limit)
    raw = raw[: raw.rfind(b"\n") + 1]
    lines = []
    for line in raw.split(b"\n")[:-1]:
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return "\n".join(lines) + "\n"


EXTRA_DOCS = [
    "Ünïcödé: naïve café, 東京は日本の首都です。 😀👍🏽 — done.",
    "tabs\tand\r\nwindows line ends\r\nand   runs   of spaces",
    "  leading and trailing spaces  ",
    "<|endoftext|> written inside the text",
    "x",
]


@lru_cache(maxsize=None)
def corpus_docs():
    return split_blocks(gcide_text()) + EXTRA_DOCS


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, "text": d}, ensure_ascii=(i % 2 == 0)) + "\n")


def zstd_compress(src, dst):
    if shutil.which("zstd"):
        subprocess.run(["zstd", "-q", "-f", "-3", str(src), "-o", str(dst)], check=True)
        return
    import zstandard  # scripts/install-deps.sh installs the zstd CLI and this module

    Path(dst).write_bytes(zstandard.ZstdCompressor(level=3).compress(Path(src).read_bytes()))


# ---------------------------------------------------------------------------------------------
# Running lathe


def lathe(*args, input=None, check=True):
    r = subprocess.run([LATHE, *map(str, args)], input=input, capture_output=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(
            f"lathe {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr.decode()}")
    return r


def prepare(tokenizer, inputs, prefix, *extra, input=None, check=True):
    args = ["prepare", "--tokenizer", TOKENIZERS / f"{tokenizer}.json", "--input", *inputs,
            "--output-prefix", prefix, "--no-progress", *extra]
    return lathe(*args, input=input, check=check)


def report_value(result, key):
    m = re.search(rf"^\s*{key}: (\d+)", result.stdout.decode(), re.M)
    assert m, result.stdout.decode()
    return int(m.group(1))


def assert_files_equal_reference(prefix, docs, dtype):
    got_dtype, _, _, _, got_docs = read_token_files(prefix)
    assert got_dtype == np.dtype(dtype)
    assert len(got_docs) == len(docs)
    for i, (g, e) in enumerate(zip(got_docs, docs)):
        assert g == e, f"document {i} differs"
    idx, data = neox_file_bytes(docs, dtype)
    assert Path(str(prefix) + ".idx").read_bytes() == idx
    assert Path(str(prefix) + ".bin").read_bytes() == data


def no_outputs(prefix):
    folder = Path(prefix).parent
    name = Path(prefix).name
    return [p.name for p in folder.iterdir() if p.name.startswith(name + ".")]


# ---------------------------------------------------------------------------------------------
# Plain documents


@pytest.mark.parametrize("tokenizer", ["gpt2", "llama3"])
@pytest.mark.parametrize("append_eod", [False, True])
def test_jsonl_equals_gpt_neox_preprocessing(tmp_path, tokenizer, append_eod):
    docs = corpus_docs()
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, docs)
    prefix = tmp_path / "out"
    extra = ["--append-eod"] if append_eod else []
    r = prepare(tokenizer, [src], prefix, "--threads", "2", *extra)
    expected = neox_encode(tokenizer, docs, append_eod)
    assert_files_equal_reference(prefix, expected, neox_dtype(tokenizer))
    assert report_value(r, "documents") == len(docs)
    assert report_value(r, "tokens") == sum(map(len, expected))
    assert report_value(r, "skipped") == 0
    assert report_value(r, "bytes") == src.stat().st_size


def test_gzip_zstd_and_stdin_inputs_give_identical_files(tmp_path):
    docs = corpus_docs()
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src, docs)
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    zst = tmp_path / "corpus.data"  # no telling extension: detected from the bytes
    zstd_compress(src, zst)
    expected = neox_encode("gpt2", docs, True)
    for name, inputs, stdin in [("plain", [src], None), ("gz", [gz], None), ("zst", [zst], None),
                                ("stdin", ["-"], src.read_bytes()),
                                ("stdin_zst", ["-"], zst.read_bytes())]:
        prefix = tmp_path / name
        prepare("gpt2", inputs, prefix, "--append-eod", input=stdin)
        assert_files_equal_reference(prefix, expected, np.uint16)


def test_text_blocks_and_text_lines_equal_reference(tmp_path):
    text = gcide_text(400_000)
    src = tmp_path / "dict.txt"
    src.write_text(text, encoding="utf-8")
    gz = tmp_path / "dict.txt.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    blocks = split_blocks(text)
    prepare("gpt2", [gz], tmp_path / "blocks", "--format", "text-blocks", "--append-eod")
    assert_files_equal_reference(tmp_path / "blocks", neox_encode("gpt2", blocks, True), np.uint16)

    lines = [l for l in text.split("\n") if l != ""]
    lines_src = tmp_path / "lines.txt"
    lines_src.write_bytes(("\r\n".join(lines[:3000]) + "\n").encode())  # CRLF endings
    prepare("llama3", [lines_src], tmp_path / "lines", "--format", "text")
    # Whitespace-only lines of the source are blank lines, not documents.
    documents = [l for l in lines[:3000] if l.strip(" \t\r\v\f") != ""]
    assert len(documents) < 3000
    assert_files_equal_reference(tmp_path / "lines", neox_encode("llama3", documents, False),
                                 np.int32)
    # auto: the first line does not start with '{', so one document per line.
    r = prepare("llama3", [lines_src], tmp_path / "auto")
    assert "format: text" in r.stdout.decode()
    assert (tmp_path / "auto.bin").read_bytes() == (tmp_path / "lines.bin").read_bytes()


def test_several_inputs_keep_order_threads_do_not_matter(tmp_path):
    docs = corpus_docs()
    parts = [docs[: len(docs) // 3], docs[len(docs) // 3: 2 * len(docs) // 3],
             docs[2 * len(docs) // 3:]]
    paths = []
    for i, part in enumerate(parts):
        p = tmp_path / f"part{i}.jsonl"
        write_jsonl(p, part)
        paths.append(p)
    gz = tmp_path / "part1.jsonl.gz"
    gz.write_bytes(gzip.compress(paths[1].read_bytes()))
    expected = neox_encode("gpt2", docs, True)
    prepare("gpt2", [paths[0], gz, paths[2]], tmp_path / "multi", "--append-eod", "--threads", "3")
    assert_files_equal_reference(tmp_path / "multi", expected, np.uint16)
    # GPT-NeoX's comma-separated form, one thread, stdin in the middle.
    prepare("gpt2", [f"{paths[0]},-,{paths[2]}"], tmp_path / "comma", "--append-eod",
            "--threads", "1", input=paths[1].read_bytes())
    assert (tmp_path / "comma.bin").read_bytes() == (tmp_path / "multi.bin").read_bytes()
    assert (tmp_path / "comma.idx").read_bytes() == (tmp_path / "multi.idx").read_bytes()


def test_json_key_selects_the_field(tmp_path):
    src = tmp_path / "k.jsonl"
    src.write_text("\n".join(json.dumps({"text": "ignored", "body": d}) for d in EXTRA_DOCS) + "\n")
    prepare("gpt2", [src], tmp_path / "k", "--json-key", "body")
    assert_files_equal_reference(tmp_path / "k", neox_encode("gpt2", EXTRA_DOCS, False), np.uint16)


# ---------------------------------------------------------------------------------------------
# End-of-document token


def test_eod_token_resolution(tmp_path):
    src = tmp_path / "d.jsonl"
    write_jsonl(src, ["one", "two"])
    # llama3 has no <|endoftext|>: the eos_token of llama3.tokenizer_config.json beside it.
    r = prepare("llama3", [src], tmp_path / "l3", "--append-eod")
    eos = hf("llama3").token_to_id("<|end_of_text|>")
    assert "eod: <|end_of_text|> = %d" % eos in r.stdout.decode()
    assert read_token_files(tmp_path / "l3")[4][0][-1] == eos
    # --eod-token wins.
    prepare("llama3", [src], tmp_path / "l3b", "--append-eod", "--eod-token", "<|eot_id|>")
    assert read_token_files(tmp_path / "l3b")[4][1][-1] == hf("llama3").token_to_id("<|eot_id|>")
    bad = prepare("llama3", [src], tmp_path / "l3c", "--append-eod", "--eod-token", "<nope>",
                  check=False)
    assert bad.returncode != 0 and b"--eod-token '<nope>' is not a token of" in bad.stderr
    # A tokenizer with neither <|endoftext|> nor a config beside it: a clear request.
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(TOKENIZERS / "llama3.json", alone / "tokenizer.json")
    r = lathe("prepare", "--tokenizer", alone / "tokenizer.json", "--input", src,
              "--output-prefix", tmp_path / "none", "--append-eod", check=False)
    assert r.returncode != 0
    assert b"pass --eod-token TOKEN" in r.stderr, r.stderr
    assert no_outputs(tmp_path / "none") == []


# ---------------------------------------------------------------------------------------------
# Bad records and bad inputs

GOOD = ["first good", "second good", "third good", "fourth good"]
BAD_LINES = [
    (b'{"text": "unterminated}', "not valid JSON"),
    (b'{"body": "no text field"}', 'no "text" field (the object has keys "body")'),
    (b'{"text": 17}', 'field "text" is a number, expected a string'),
    (b'{"text": ""}', "empty document"),
    (b'{"text": "bad \xff byte"}', "invalid UTF-8 at byte column 15 (byte 0xff)"),
    (b'{"text": "lone \\ud800"}', "unpaired"),
    (b'["text", "array"]', "found an array"),
]


def bad_jsonl(path):
    """GOOD documents with every kind of bad line between them. Returns {line: problem}."""
    lines, problems = [], {}
    good = iter(GOOD)
    for bad, problem in BAD_LINES:
        lines.append(json.dumps({"text": next(good, "extra good")}).encode())
        lines.append(bad)
        problems[len(lines)] = problem
    lines.append(json.dumps({"text": "last good"}).encode())
    path.write_bytes(b"\n".join(lines) + b"\n")
    return problems


def test_on_error_skip_counts_and_fail_names_file_and_line(tmp_path):
    src = tmp_path / "bad.jsonl"
    problems = bad_jsonl(src)
    good_docs = [json.loads(l)["text"] for l in src.read_bytes().split(b"\n")
                 if l.startswith(b'{"text": "') and b"good" in l]
    r = prepare("gpt2", [src], tmp_path / "skip", "--on-error", "skip")
    assert report_value(r, "skipped") == len(BAD_LINES)
    assert report_value(r, "documents") == len(good_docs)
    assert_files_equal_reference(tmp_path / "skip", neox_encode("gpt2", good_docs, False),
                                 np.uint16)
    stderr = r.stderr.decode()
    for line, problem in problems.items():
        said = [l for l in stderr.splitlines() if f"skipped {src}:{line}: " in l]
        assert len(said) == 1 and problem in said[0], (line, problem, stderr)

    r = prepare("gpt2", [src], tmp_path / "fail", check=False)
    assert r.returncode != 0
    first = min(problems)
    assert f"{src}:{first}: not valid JSON".encode() in r.stderr, r.stderr
    assert b"--on-error skip" in r.stderr
    assert no_outputs(tmp_path / "fail") == []

    # Every record skipped: an error, no empty token files.
    none = tmp_path / "all_bad.jsonl"
    none.write_text('{"txt": "a"}\nnot json\n')
    r = prepare("gpt2", [none], tmp_path / "none", "--format", "jsonl", "--on-error", "skip",
                check=False)
    assert r.returncode == 2 and b"every record was skipped (2; the first: " in r.stderr, r.stderr
    assert no_outputs(tmp_path / "none") == []


def test_text_errors_name_the_line_inside_a_block(tmp_path):
    src = tmp_path / "blocks.txt"
    src.write_bytes(b"block one\nline two\n\nblock two\nstill two \xc3\x28 bad\nmore\n\nthree\n")
    r = prepare("gpt2", [src], tmp_path / "b", "--format", "text-blocks", check=False)
    assert r.returncode != 0
    assert f"{src}:5: invalid UTF-8 at byte column 11 (byte 0xc3)".encode() in r.stderr, r.stderr
    r = prepare("gpt2", [src], tmp_path / "b", "--format", "text-blocks", "--on-error", "skip")
    assert report_value(r, "documents") == 2 and report_value(r, "skipped") == 1
    # One document per line: a blank line is not a document (tests/test_blank_lines.py).
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"a\nb\n\nc\n")
    r = prepare("gpt2", [lines], tmp_path / "l", "--format", "text")
    assert report_value(r, "documents") == 3 and report_value(r, "skipped") == 0


def test_bad_inputs_are_clear_errors(tmp_path):
    good = tmp_path / "good.jsonl"
    write_jsonl(good, ["fine"])
    cases = []
    cases.append(([tmp_path / "missing.jsonl"], [], b"missing.jsonl: no such file"))
    cases.append(([tmp_path], [], b"is a directory"))
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(gzip.compress(b'{"text": "abc"}\n' * 5000)[:-20])
    cases.append(([good, truncated], [], b"cut.jsonl.gz: truncated gzip data"))
    xz = tmp_path / "a.xz"
    xz.write_bytes(b"\xfd7zXZ\x00\x00\x04rest")
    cases.append(([xz], [], b"is xz-compressed"))
    cases.append(([good], ["--format", "yaml"], b"unknown input format 'yaml'"))
    cases.append(([good], ["--on-error", "ignore"], b"--on-error ignore: expected fail or skip"))
    cases.append((["-", "-"], [], b"stdin ('-') can be read only once"))
    for i, (inputs, extra, message) in enumerate(cases):
        prefix = tmp_path / f"case{i}"
        r = prepare("gpt2", inputs, prefix, *extra, input=b"", check=False)
        assert r.returncode != 0, message
        assert message in r.stderr, (message, r.stderr)
        assert no_outputs(prefix) == [], message
    r = prepare("gpt2", [good], tmp_path / "no" / "such" / "dir" / "out", check=False)
    assert r.returncode != 0 and b"does not exist" in r.stderr


def test_failed_run_keeps_previous_outputs(tmp_path):
    src = tmp_path / "a.jsonl"
    write_jsonl(src, ["old run"])
    prefix = tmp_path / "out"
    prepare("gpt2", [src], prefix)
    before = (Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes())
    bad = tmp_path / "bad.jsonl"
    bad_jsonl(bad)
    assert prepare("gpt2", [bad], prefix, check=False).returncode != 0
    assert (Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()) == before
    assert sorted(no_outputs(prefix)) == ["out.bin", "out.idx"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_interrupted_run_leaves_no_final_files(tmp_path, sig):
    prefix = tmp_path / "killed"
    p = subprocess.Popen(
        [LATHE, "prepare", "--tokenizer", TOKENIZERS / "gpt2.json", "--input", "-",
         "--output-prefix", prefix, "--no-progress"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = json.dumps({"text": "a document that keeps the workers busy " * 20}).encode() + b"\n"
    try:
        p.stdin.write(line * 2000)  # the run cannot finish: stdin stays open
        p.stdin.flush()
        deadline = time.time() + 60
        while not any(n.startswith("killed.bin.tmp-") for n in no_outputs(prefix)):
            assert time.time() < deadline, "lathe never started writing"
            time.sleep(0.05)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0
    left = no_outputs(prefix)
    assert "killed.bin" not in left and "killed.idx" not in left, left
    if sig != signal.SIGKILL:  # a catchable signal also removes the temporaries
        assert left == [], left
        assert b"interrupted; nothing was written" in err, err


# ---------------------------------------------------------------------------------------------
# Chat: GPT-NeoX's tools/datasets/preprocess_data_with_chat_template.py (build_chat), with
# transformers' own apply_chat_template rendering and tokenizing each prefix.


@lru_cache(maxsize=None)
def hf_chat_tokenizer(name):
    """transformers' AutoTokenizer from the shared NAME.json and NAME.tokenizer_config.json."""
    folder = Path(tempfile.mkdtemp(prefix=f"lathe_prepare_{name}_"))
    shutil.copy(TOKENIZERS / f"{name}.json", folder / "tokenizer.json")
    shutil.copy(TOKENIZERS / f"{name}.tokenizer_config.json", folder / "tokenizer_config.json")
    return AutoTokenizer.from_pretrained(str(folder))


def apply_chat_template(name, messages, add_generation_prompt=False):
    return hf_chat_tokenizer(name).apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False)


def neox_build_chat(name, messages, generation_role="assistant"):
    """build_chat() with apply_mask=True, only_last_turn=False. GPT-NeoX then appends eos_token;
    lathe does not after a template that ends its turns itself, as llama3's and qwen3's do."""
    tokens, mask = [], []
    for i, turn in enumerate(messages):
        add_gen = False if i == len(messages) - 1 else messages[i + 1]["role"] == generation_role
        chat_tokens = apply_chat_template(name, messages[: i + 1], add_gen)
        # lathe matches GPT-NeoX exactly where each prefix's tokens extend the previous ones.
        assert chat_tokens[: len(tokens)] == tokens
        chat_tokens = chat_tokens[len(tokens):]
        tokens.extend(chat_tokens)
        mask.extend(chat_tokens if turn["role"] == generation_role else [-100] * len(chat_tokens))
    return tokens, mask


CHATS = [
    [{"role": "user", "content": "What is a lathe?"},
     {"role": "assistant", "content": "A machine tool that rotates a workpiece."}],
    [{"role": "user", "content": "Traduis « bonjour » en japonais."},
     {"role": "assistant", "content": "こんにちは (konnichiwa) 😀"}],
    [{"role": "user", "content": "  spaces are trimmed by the template  "},
     {"role": "assistant", "content": "Yes.\n\nTwo paragraphs."}],
]


# The tokens each template renders after a final assistant turn's end-of-turn: llama3's
# assistant header after <|eot_id|> (<|start_header_id|> assistant <|end_header_id|> "\n\n");
# qwen3 ends with <|im_end|>"\n", and that newline is the turn's own, kept as in every turn.
TRAILING_AFTER_LAST_TURN = {"llama3": [128006, 78191, 128007, 271], "qwen3": []}


@pytest.mark.parametrize("tokenizer", ["llama3", "qwen3"])
def test_chat_tokens_and_labels_equal_gpt_neox(tmp_path, tokenizer):
    """The ids equal GPT-NeoX's build_chat() tokens, and so do the labels, except after the last
    assistant turn: llama3's template renders an assistant header after the final <|eot_id|>
    (even without add_generation_prompt). build_chat slices it into the last turn, so it keeps
    loss there; lathe masks it, as it masks every header: the label file keeps each assistant
    message and its end-of-turn token and nothing after it. The test asserts those trailing
    tokens are -100."""
    chats = list(CHATS)
    if tokenizer == "qwen3":
        # llama3's template ends every rendering with an assistant header, so after a system turn
        # its prefixes stop extending each other and GPT-NeoX's token slicing emits tokens of no
        # rendering; qwen3's prefixes extend each other here.
        chats.append([{"role": "system", "content": "You are terse."}] + CHATS[0])
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps({"id": i, "messages": m}, ensure_ascii=False) + "\n"
                           for i, m in enumerate(chats)), encoding="utf-8")
    prefix = tmp_path / "sft"
    r = prepare(tokenizer, [src], prefix, "--threads", "2")
    assert "format: chat" in r.stdout.decode()
    expected = [neox_build_chat(tokenizer, m) for m in chats]
    trailer = TRAILING_AFTER_LAST_TURN[tokenizer]
    labels = []
    for tokens, mask in expected:
        n = len(trailer)
        if n:
            assert tokens[-n:] == trailer and mask[-n:] == trailer  # build_chat keeps loss there
        labels.append(mask[:len(mask) - n] + [-100] * n)
    # Both files are int32, as GPT-NeoX's chat script forces (labels hold -100).
    assert_files_equal_reference(prefix, [t for t, _ in expected], np.int32)
    assert_files_equal_reference(f"{prefix}_label", labels, np.int32)
    # --format chat with a custom field name, from gzip.
    gz = tmp_path / "conv.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps({"conversation": m}) + "\n"
                                         for m in chats).encode()))
    prepare(tokenizer, [gz], tmp_path / "conv", "--format", "chat", "--json-key", "conversation",
            "--chat-template-config", TOKENIZERS / f"{tokenizer}.tokenizer_config.json")
    assert (tmp_path / "conv_label.bin").read_bytes() == Path(f"{prefix}_label.bin").read_bytes()


def test_chat_multi_turn_keeps_loss_on_assistant_turns_only(tmp_path):
    conv = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "Seven."},
            {"role": "user", "content": "Another?"},
            {"role": "assistant", "content": "Eleven."}]
    src = tmp_path / "multi.jsonl"
    src.write_text(json.dumps({"messages": conv}) + "\n")
    prepare("llama3", [src], tmp_path / "m")
    _, _, _, _, (ids,) = read_token_files(tmp_path / "m")
    _, _, _, _, (labels,) = read_token_files(tmp_path / "m_label")
    tok = hf("llama3")
    # transformers' tokens, nothing appended: the template ends each turn with <|eot_id|>.
    assert ids == apply_chat_template("llama3", conv)
    assert len(labels) == len(ids)
    assert all(l == -100 or l == t for l, t in zip(labels, ids))
    kept = tok.decode([t for l, t in zip(labels, ids) if l != -100], skip_special_tokens=True)
    assert "Seven." in kept and "Eleven." in kept
    assert "prime" not in kept and "Another" not in kept and "brief" not in kept


def test_chat_bad_records(tmp_path):
    src = tmp_path / "bad_chat.jsonl"
    src.write_text(json.dumps({"messages": CHATS[0]}) + "\n"
                   + json.dumps({"messages": "not a list"}) + "\n"
                   + json.dumps({"messages": []}) + "\n"
                   + '{"messages": [}\n')
    r = prepare("llama3", [src], tmp_path / "c", "--format", "chat", "--on-error", "skip")
    assert report_value(r, "documents") == 1 and report_value(r, "skipped") == 3
    err = r.stderr.decode()
    assert f"{src}:2: field \"messages\" is a string, expected an array of messages" in err, err
    assert f"{src}:3: empty conversation" in err, err
    assert f"{src}:4: not valid JSON" in err, err
    # A chat input with no template anywhere.
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(TOKENIZERS / "gpt2.json", alone / "gpt2.json")
    r = lathe("prepare", "--tokenizer", alone / "gpt2.json", "--input", src, "--output-prefix",
              tmp_path / "none", "--format", "chat", check=False)
    assert r.returncode != 0 and b"--chat-template-config" in r.stderr, r.stderr
