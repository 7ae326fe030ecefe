"""`lathe data info` and `lathe data dump` on token files written by lathe and by a Python writer
that follows GPT-NeoX's MMapIndexedDatasetBuilder, valid and damaged."""

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
LATHE = os.environ.get("LATHE_BIN", str(ROOT / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", str(ROOT.parent / "shared")))
GPT2 = SHARED / "tokenizers" / "gpt2.json"

CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3,
         np.dtype(np.int32): 4, np.dtype(np.int64): 5, np.dtype(np.uint16): 8}


def neox_write(prefix, documents, dtype):
    """What GPT-NeoX's MMapIndexedDatasetBuilder writes: add_item per sequence, end_document per
    document (a document here is a list of sequences)."""
    dtype = np.dtype(dtype)
    sizes, doc_idx, data = [], [0], b""
    for doc in documents:
        for seq in doc:
            data += np.array(seq, dtype).tobytes()
            sizes.append(len(seq))
        doc_idx.append(len(sizes))
    pointers, address = [], 0
    for s in sizes:
        pointers.append(address)
        address += s * dtype.itemsize
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, CODES[dtype])
    idx += struct.pack("<QQ", len(sizes), len(doc_idx))
    idx += np.array(sizes, np.int32).tobytes() + np.array(pointers, np.int64).tobytes()
    idx += np.array(doc_idx, np.int64).tobytes()
    Path(f"{prefix}.idx").write_bytes(idx)
    Path(f"{prefix}.bin").write_bytes(data)


def lathe(*args, check=True):
    r = subprocess.run([LATHE, *map(str, args)], capture_output=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"lathe {args} failed ({r.returncode}):\n{r.stderr.decode()}")
    return r


def info_json(prefix, check=True):
    r = lathe("data", "info", prefix, "--json", check=check)
    return json.loads(r.stdout), r


# Documents of several sequences (Megatron-LM's sentence mode), one empty sequence.
DOCS = [[[5, 6, 7], [8]], [[9]], [[10, 11], [], [12, 13, 14]], [[15, 16, 17, 18, 19]]]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8])
def test_info_reads_gpt_neox_files(tmp_path, dtype):
    prefix = tmp_path / "neox"
    neox_write(prefix, DOCS, dtype)
    j, _ = info_json(prefix)
    assert j["valid"] is True
    assert j["dtype"] == np.dtype(dtype).name and j["dtype_code"] == CODES[np.dtype(dtype)]
    assert j["documents"] == 4 and j["sequences"] == 7 and j["tokens"] == 15
    lengths = [sum(len(s) for s in d) for d in DOCS]
    assert j["document_length"] == {"min": min(lengths), "mean": 15 / 4, "max": max(lengths)}
    assert j["warnings"] == []
    text = lathe("data", "info", prefix).stdout.decode()
    assert "documents: 4\n" in text and "sequences: 7\n" in text and "valid: yes" in text
    assert "document length: min 1, mean 3.8, max 5 tokens" in text
    # dump concatenates a document's sequences.
    d = json.loads(lathe("data", "dump", prefix, "--doc", 2, "--json").stdout)
    assert d["ids"] == [10, 11, 12, 13, 14] and d["sequences"] == 3


def test_dump_decodes_with_the_tokenizer(tmp_path):
    tok = Tokenizer.from_file(str(GPT2))
    texts = ["Hello world, this is lathe.", "Ünïcödé and emoji 😀 survive the round trip."]
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    prefix = tmp_path / "d"
    lathe("prepare", "--tokenizer", GPT2, "--input", src, "--output-prefix", prefix,
          "--append-eod", "--no-progress")
    for k, t in enumerate(texts):
        d = json.loads(lathe("data", "dump", prefix, "--doc", k, "--tokenizer", GPT2,
                             "--json").stdout)
        assert d["ids"] == tok.encode(t).ids + [50256]
        assert d["text"] == t + "<|endoftext|>"
        assert "labels" not in d
    plain = lathe("data", "dump", prefix, "--doc", 1, "--tokenizer", GPT2).stdout.decode()
    assert plain.startswith(f"document 1 of 2 in {prefix}: 1 sequence, ")
    assert "ids: " + " ".join(map(str, tok.encode(texts[1]).ids)) + " 50256\n" in plain
    assert "text:\n" + texts[1] + "<|endoftext|>" in plain
    r = lathe("data", "dump", prefix, "--doc", 2, check=False)
    assert r.returncode != 0 and b"--doc 2: " in r.stderr and b"documents 0 to 1" in r.stderr
    # The wrong tokenizer for the ids is caught.
    neox_write(tmp_path / "big", [[[200000]]], np.int32)
    r = lathe("data", "dump", tmp_path / "big", "--doc", 0, "--tokenizer", GPT2, check=False)
    assert r.returncode != 0 and b"outside the 50257 vocabulary" in r.stderr


def test_info_and_dump_show_chat_labels(tmp_path):
    neox_write(tmp_path / "sft", [[[1, 2, 3, 4]], [[5, 6]]], np.int32)
    neox_write(tmp_path / "sft_label", [[[-100, -100, 3, 4]], [[-100, 6]]], np.int32)
    j, _ = info_json(tmp_path / "sft")
    assert j["valid"] is True and j["labels"]["valid"] is True
    d = json.loads(lathe("data", "dump", tmp_path / "sft", "--doc", 0, "--json").stdout)
    assert d["labels"] == [-100, -100, 3, 4]
    # A label file that does not match its tokens.
    neox_write(tmp_path / "sft_label", [[[-100, -100, 3]], [[-100, 6]]], np.int32)
    j, r = info_json(tmp_path / "sft", check=False)
    assert r.returncode != 0 and j["valid"] is False
    assert "sequence 0 has 3 labels for 4 tokens" in j["labels"]["error"]


def test_info_accepts_merged_gpt_neox_files_with_a_warning(tmp_path):
    # merge_datasets.py: the sizes of every merged file, the doc_idx of none after the first.
    prefix = tmp_path / "merged"
    neox_write(prefix, [[[1, 2]], [[3]], [[4, 5, 6]]], np.uint16)
    idx = bytearray(Path(f"{prefix}.idx").read_bytes())
    struct.pack_into("<Q", idx, 26, 2)
    Path(f"{prefix}.idx").write_bytes(bytes(idx[:-16]))
    j, _ = info_json(prefix)
    assert j["valid"] is True and j["documents"] == 1 and j["sequences"] == 3
    assert "doc_idx ends at sequence 1 of 3" in j["warnings"][0]
    assert "warning: doc_idx ends at sequence 1 of 3" in lathe("data", "info", prefix).stdout.decode()


def damage(prefix, how):
    idx = bytearray(Path(f"{prefix}.idx").read_bytes())
    data = bytearray(Path(f"{prefix}.bin").read_bytes())
    how(idx, data)
    Path(f"{prefix}.idx").write_bytes(bytes(idx))
    Path(f"{prefix}.bin").write_bytes(bytes(data))


# DOCS in uint16: S = 7, D = 5; sizes at 34, pointers at 62, doc_idx at 118.
DAMAGE = [
    ("truncated_idx", lambda idx, data: idx.__delitem__(slice(-3, None)),
     "truncated: the header announces 7 sequences and 5 doc_idx entries"),
    ("truncated_bin", lambda idx, data: data.__delitem__(slice(-2, None)), "the .bin is truncated"),
    ("pointer_order", lambda idx, data: struct.pack_into("<q", idx, 62 + 8 * 2, 0),
     "pointers are not monotonic: pointers[2] = 0 is less than pointers[1] = 6"),
    ("doc_idx_bound", lambda idx, data: struct.pack_into("<q", idx, 118 + 8 * 3, 9),
     "doc_idx[3] = 9 is beyond the 7 sequences"),
    ("float_dtype", lambda idx, data: idx.__setitem__(17, 7), "is a floating-point type"),
    ("magic", lambda idx, data: idx.__setitem__(slice(0, 4), b"XXXX"), "not a token index"),
]


@pytest.mark.parametrize("name,how,expected", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_info_reports_damage_and_fails(tmp_path, name, how, expected):
    prefix = tmp_path / name
    neox_write(prefix, DOCS, np.uint16)
    damage(prefix, how)
    j, r = info_json(prefix, check=False)
    assert r.returncode != 0
    assert j["valid"] is False and expected in j["error"], j
    assert str(prefix) in j["error"]
    text = lathe("data", "info", prefix, check=False)
    assert text.returncode != 0
    assert "valid: no" in text.stdout.decode() and expected.encode() in text.stderr
    assert lathe("data", "dump", prefix, "--doc", 0, check=False).returncode != 0


def test_info_on_missing_files(tmp_path):
    r = lathe("data", "info", tmp_path / "nothing", check=False)
    assert r.returncode != 0 and b"nothing.idx: no such file" in r.stderr
