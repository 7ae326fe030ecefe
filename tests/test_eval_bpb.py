"""`lathe eval bpb` (run/eval_bpb.h) against the same definition computed with transformers (fp32,
CPU): documents from a .jsonl and from a text file, windows shorter than a document (overlapping
by one token), a document of no tokens; errors name the file and line (invalid UTF-8: also the
byte column and the byte)."""
import json
import math

import pytest
import torch
import transformers

from lathe_cli import run
from test_generate import with_tokenizer

DOCS = ["hello world, this is lathe.", "", "a longer document " * 3, "caf\u00e9 \u2603 ok"]


def reference_bpb(folder, hf_tok, docs, T):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prefix = json.loads((folder / "config.json").read_text())["bos_token_id"]
    nats, tokens = 0.0, 0
    for text in docs:
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        if not ids:
            continue
        s = [prefix] + ids
        w = 0
        while w * T + 1 < len(s):
            win = s[w * T: w * T + T + 1]
            with torch.no_grad():
                logits = model(torch.tensor([win[:-1]])).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            nats -= float(lp[torch.arange(len(win) - 1), torch.tensor(win[1:])].sum())
            tokens += len(win) - 1
            w += 1
    total_bytes = sum(len(d.encode("utf-8")) for d in docs)
    return nats / (math.log(2) * total_bytes), tokens, total_bytes


def test_bpb_equals_the_definition_with_transformers(tmp_path):
    folder, hf_tok = with_tokenizer(tmp_path)
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    got = json.loads(run(["eval", "bpb", "--checkpoint", folder, "--data", data, "--seq-len", 16,
                          "--device", "cpu"]).stdout)
    want, tokens, nbytes = reference_bpb(folder, hf_tok, DOCS, 16)
    assert got["tokens"] == tokens and got["bytes"] == nbytes and got["documents"] == len(DOCS)
    # f32 logits of a 2-layer model: the summed log-probabilities agree to ~1e-6 relative.
    assert got["bpb"] == pytest.approx(want, rel=1e-5)
    # A text file is one document.
    text = tmp_path / "c.txt"
    text.write_text(DOCS[2])
    got = json.loads(run(["eval", "bpb", "--checkpoint", folder, "--data", text, "--seq-len",
                          8]).stdout)
    want, _, _ = reference_bpb(folder, hf_tok, [DOCS[2]], 8)
    assert got["bpb"] == pytest.approx(want, rel=1e-5)


def test_bpb_errors(tmp_path):
    folder, _ = with_tokenizer(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "x"}\n')
    p = run(["eval", "bpb", "--checkpoint", folder, "--data", bad], check=False)
    assert p.returncode != 0 and p.stderr.startswith("lathe: error:") and f"{bad}:2" in p.stderr
    empty = tmp_path / "e.jsonl"
    empty.write_text('{"text": ""}\n')
    p = run(["eval", "bpb", "--checkpoint", folder, "--data", empty], check=False)
    assert p.returncode != 0 and "no text" in p.stderr
    p = run(["eval", "bpb", "--checkpoint", folder, "--data", tmp_path / "none.txt"], check=False)
    assert p.returncode != 0 and "cannot open" in p.stderr
    p = run(["eval", "bpb", "--checkpoint", folder.parent.parent / "nothing", "--data", bad],
            check=False)
    assert p.returncode != 0 and "--checkpoint" in p.stderr


def test_bpb_names_the_file_line_and_byte_of_invalid_utf8(tmp_path):
    folder, _ = with_tokenizer(tmp_path)
    # A text file (one document): its line, byte column and byte offset.
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"first line\ncaf\xe9 au lait\n")
    p = run(["eval", "bpb", "--checkpoint", folder, "--data", latin, "--device", "cpu"],
            check=False)
    assert p.returncode == 2 and (
        f"lathe: error: --data {latin}:2: invalid UTF-8 at byte column 4 (byte 0xe9, byte offset "
        "14 of the file); the input must be UTF-8") in p.stderr, p.stderr
    # A .jsonl line holding raw Latin-1 inside its string: the line and the byte column.
    jl = tmp_path / "latin.jsonl"
    jl.write_bytes(b'{"text": "ok"}\n\n{"text": "caf\xe9"}\n')
    p = run(["eval", "bpb", "--checkpoint", folder, "--data", jl, "--device", "cpu"], check=False)
    assert p.returncode == 2 and (
        f"lathe: error: --data {jl}:3: invalid UTF-8 at byte column 14 (byte 0xe9)") in p.stderr, \
        p.stderr
    # The first byte of a file.
    first = tmp_path / "first.txt"
    first.write_bytes(b"\xffabc")
    p = run(["eval", "bpb", "--checkpoint", folder, "--data", first, "--device", "cpu"],
            check=False)
    assert f"--data {first}:1: invalid UTF-8 at byte column 1 (byte 0xff, byte offset 0" \
        in p.stderr, p.stderr
