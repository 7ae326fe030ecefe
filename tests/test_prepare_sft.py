"""`lathe prepare --format alpaca|sharegpt`: LLaMA-Factory's SFT layouts end to end, against
transformers.

What is checked, for the shared Llama-3 and Qwen3 tokenizers and their chat templates:
  * records map onto messages as the contract says (docs/SFT.md; an independent Python mapping
    here): system, history, multi-turn, custom role tags, an empty input, a JSON array file;
  * each document's ids are transformers' apply_chat_template(messages, tokenize=True);
  * the label file keeps exactly the tokens of each assistant message, from the end of the
    assistant header through its end-of-turn token (and the newline the template puts after it),
    and -100 everywhere else (a header the template appends after the final turn too), located in
    the rendered text independently of lathe;
  * each conversation is one document of the token files, so the packed training samples know
    where each conversation starts (the sample-level check is data_tests
    SftPrepare.ConversationsPackIntoSamplesWithTheirOwnBoundariesAndLabels), and `lathe train`
    on CPU takes the prepared files with their labels and per-document attention;
  * bad records under --on-error fail (file:line, nothing written) and skip (counts per problem),
    a record nested too deeply for a recursive walk among them; data whose labels train no token
    (a --generation-role that names no turn) and contradictory --role-tags are refused.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
LATHE = os.environ.get("LATHE_BIN", str(ROOT / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", str(ROOT.parent / "shared")))
TOKENIZERS = SHARED / "tokenizers"

# Each template's end-of-turn token.
END_OF_TURN = {"llama3": "<|eot_id|>", "qwen3": "<|im_end|>"}


def read_token_files(prefix):
    """The documents of prefix.bin/.idx (MMapIndexedDataset layout: magic, version, dtype code,
    counts, sizes, pointers, doc_idx), as lists of ints."""
    idx = Path(f"{prefix}.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    dtype = {4: np.int32, 8: np.uint16}[idx[17]]
    seq_count, _ = struct.unpack_from("<QQ", idx, 18)
    sizes = np.frombuffer(idx, np.int32, seq_count, 34)
    pointers = np.frombuffer(idx, np.int64, seq_count, 34 + 4 * seq_count)
    data = np.fromfile(f"{prefix}.bin", dtype)
    item = np.dtype(dtype).itemsize
    return [data[p // item: p // item + s].tolist() for p, s in zip(pointers, sizes)]


def lathe(*args, check=True):
    r = subprocess.run([LATHE, *map(str, args)], capture_output=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed:\n{r.stderr.decode()}")
    return r


def prepare(tokenizer, src, prefix, *extra, check=True):
    return lathe("prepare", "--tokenizer", TOKENIZERS / f"{tokenizer}.json", "--input", src,
                 "--output-prefix", prefix, "--no-progress", "--threads", "2", *extra,
                 check=check)


def report_value(result, key):
    m = re.search(rf"^\s*{key}: (\d+)(.*)$", result.stdout.decode(), re.M)
    assert m, result.stdout.decode()
    return int(m.group(1)), m.group(2).strip()


@lru_cache(maxsize=None)
def hf(name):
    folder = Path(tempfile.mkdtemp(prefix=f"lathe_sft_{name}_"))
    shutil.copy(TOKENIZERS / f"{name}.json", folder / "tokenizer.json")
    shutil.copy(TOKENIZERS / f"{name}.tokenizer_config.json", folder / "tokenizer_config.json")
    return AutoTokenizer.from_pretrained(str(folder))


# ---------------------------------------------------------------------------------------------
# The contract's mapping, written from docs/SFT.md.


def alpaca_messages(r):
    m = []
    if r.get("system"):
        m.append({"role": "system", "content": r["system"]})
    for prompt, response in r.get("history") or []:
        m += [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    m.append({"role": "user",
              "content": "\n".join(p for p in (r.get("instruction"), r.get("input")) if p)})
    m.append({"role": "assistant", "content": r["output"]})
    return m


ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system", "observation": "tool", "function_call": "assistant"}


def sharegpt_messages(r, key="conversations", role="from", content="value", roles=ROLES):
    turns = r[key]
    m = []
    if roles.get(turns[0][role]) == "system":
        system, turns = turns[0][content], turns[1:]
    else:
        system = r.get("system", "")
    if system:
        m.append({"role": "system", "content": system})
    return m + [{"role": roles[t[role]], "content": t[content]} for t in turns]


def expected_labels(name, messages, ids):
    """-100 except on each assistant message's tokens: from where the generation prompt before
    it ends through its end-of-turn token and the whitespace after it, found in the text that
    transformers renders; text the template renders after that (the shared Llama-3 template's
    assistant header after the final turn) is -100. A token belongs to the span its first
    character lies in."""
    tok = hf(name)
    full = tok.apply_chat_template(messages, tokenize=False)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids  # the rendered text tokenizes to the template's ids
    spans = []
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = tok.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
        assert full.startswith(before), (k, before, full)
        start = len(before)
        assert msg["content"].strip() in full[start:]
        end = full.index(END_OF_TURN[name], start) + len(END_OF_TURN[name])
        while end < len(full) and full[end] in " \n":
            end += 1
        spans.append((start, end))
    return [t if any(a <= s < b for a, b in spans) else -100
            for t, (s, _) in zip(ids, enc["offset_mapping"])]


def check_documents(name, prefix, conversations):
    ids = read_token_files(prefix)
    labels = read_token_files(f"{prefix}_label")
    assert len(ids) == len(labels) == len(conversations)
    for i, messages in enumerate(conversations):
        want = hf(name).apply_chat_template(messages, tokenize=True, return_dict=False)
        assert ids[i] == want, f"document {i}"
        assert labels[i] == expected_labels(name, messages, want), f"labels of document {i}"
        kept = hf(name).decode([t for t in labels[i] if t != -100], skip_special_tokens=True)
        for m in messages:
            assert (m["content"].strip() in kept) == (m["role"] == "assistant"), (i, m)


ALPACA = [
    {"instruction": "What is a lathe?", "input": "",
     "output": "A machine tool that rotates a workpiece."},
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
    {"instruction": "Continue.", "input": "1, 2, 3", "output": "4, 5, 6",
     "system": "You are terse.", "history": [["Count to two.", "1, 2"], ["Again?", "1, 2"]]},
    {"instruction": "Name a prime.", "output": "Seven.", "history": []},
    {"instruction": "", "input": "Say « salut » in Japanese.", "output": "こんにちは 😀"},
]

SHAREGPT = [
    {"conversations": [{"from": "human", "value": "What is a lathe?"},
                       {"from": "gpt", "value": "A machine tool."}]},
    {"conversations": [{"from": "system", "value": "Be brief."},
                       {"from": "human", "value": "Name a prime."},
                       {"from": "gpt", "value": "Seven."},
                       {"from": "user", "value": "Another?"},
                       {"from": "assistant", "value": "Eleven."}]},
    {"system": "You answer in one word.",
     "conversations": [{"from": "human", "value": "Colour of the sky?"},
                       {"from": "gpt", "value": "Blue."}]},
]


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_alpaca_and_sharegpt_equal_apply_chat_template(tmp_path, name):
    src = tmp_path / "alpaca.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ALPACA), "utf-8")
    r = prepare(name, src, tmp_path / "a", "--format", "alpaca")
    assert "format: alpaca" in r.stdout.decode()
    assert report_value(r, "documents")[0] == len(ALPACA)
    check_documents(name, tmp_path / "a", [alpaca_messages(x) for x in ALPACA])

    # sharegpt, as one JSON array file (LLaMA-Factory's usual .json dataset).
    src = tmp_path / "sharegpt.json"
    src.write_text(json.dumps(SHAREGPT, indent=2, ensure_ascii=False), "utf-8")
    prepare(name, src, tmp_path / "s", "--format", "sharegpt")
    check_documents(name, tmp_path / "s", [sharegpt_messages(x) for x in SHAREGPT])

    # The same conversations through --format chat give the same files.
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": sharegpt_messages(x)}) + "\n"
                            for x in SHAREGPT), "utf-8")
    prepare(name, chat, tmp_path / "c", "--format", "chat")
    for suffix in (".bin", ".idx", "_label.bin", "_label.idx"):
        assert Path(f"{tmp_path}/s{suffix}").read_bytes() == Path(
            f"{tmp_path}/c{suffix}").read_bytes(), suffix


def test_sharegpt_custom_role_tags(tmp_path):
    records = [{"messages": [{"role": "rules", "content": "Reply in French."},
                             {"role": "Q", "content": "Hello"},
                             {"role": "A", "content": "Bonjour"},
                             {"role": "asker", "content": "Thanks"},
                             {"role": "A", "content": "De rien"}]}]
    src = tmp_path / "tags.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    tags = "role_tag=role,content_tag=content,user_tag=Q|asker,assistant_tag=A,system_tag=rules"
    prepare("llama3", src, tmp_path / "t", "--format", "sharegpt", "--json-key", "messages",
            "--role-tags", tags)
    roles = {"Q": "user", "asker": "user", "A": "assistant", "rules": "system"}
    check_documents("llama3", tmp_path / "t",
                    [sharegpt_messages(r, "messages", "role", "content", roles) for r in records])
    # Without the tags the records are unknown roles; bad tags and misplaced options are errors.
    r = prepare("llama3", src, tmp_path / "u", "--format", "sharegpt", "--json-key", "messages",
                check=False)
    assert r.returncode != 0 and f"{src}:1: messages[0] has no \"from\"".encode() in r.stderr, \
        r.stderr
    r = prepare("llama3", src, tmp_path / "u", "--format", "sharegpt", "--role-tags", "speaker=x",
                check=False)
    assert r.returncode != 0 and b"--role-tags: unknown key 'speaker'" in r.stderr, r.stderr
    r = prepare("llama3", src, tmp_path / "u", "--format", "chat", "--role-tags", "user_tag=Q",
                check=False)
    assert r.returncode != 0 and b"--role-tags applies to --format sharegpt only" in r.stderr


def test_each_conversation_is_one_document_for_packing(tmp_path):
    # Training packs documents back to back into samples and numbers them for per-document
    # attention; here each record must be exactly one document, in input order.
    records = [dict(ALPACA[i % len(ALPACA)], output=f"Answer {i}.") for i in range(40)]
    src = tmp_path / "many.json"
    src.write_text(json.dumps(records), "utf-8")
    prepare("qwen3", src, tmp_path / "p", "--format", "alpaca")
    docs = read_token_files(tmp_path / "p")
    want = [hf("qwen3").apply_chat_template(alpaca_messages(x), tokenize=True, return_dict=False)
            for x in records]
    assert docs == want
    labels = read_token_files(tmp_path / "p_label")
    assert [len(x) for x in labels] == [len(x) for x in want]


BAD_ALPACA = [
    ({"instruction": "q", "output": "a"}, None),
    ({"instruction": "q"}, "missing field"),
    ({"instruction": "q", "output": 5}, "wrong type"),
    ({"instruction": "q", "output": "a", "history": [["only a prompt"]]}, "wrong type"),
    ({"instruction": "", "input": "", "output": "a"}, "empty"),
    ({"instruction": "q " * 60, "output": "a"}, "too long"),
    ("{broken", "not JSON"),
    # Nested deeper than any recursive walk of it could take (io/json.h's bound).
    ('{"instruction": "q", "output": "a", "x": ' + "[" * 30000 + "]" * 30000 + "}", "not JSON"),
]
BAD_SHAREGPT = [
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}, None),
    ({"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]},
     "role order"),
    ({"conversations": [{"from": "human", "value": "q"}]}, "role order"),
    ({"conversations": [{"from": "bot", "value": "q"}, {"from": "gpt", "value": "a"}]},
     "unknown role"),
    ({"dialog": []}, "missing field"),
]


@pytest.mark.parametrize("fmt,records", [("alpaca", BAD_ALPACA), ("sharegpt", BAD_SHAREGPT)])
def test_bad_records_under_each_on_error(tmp_path, fmt, records):
    src = tmp_path / f"{fmt}.jsonl"
    src.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                           for r, _ in records))
    limit = ["--seq-length", "64"]
    # fail: the first bad record (line 2) stops the run, and nothing is written.
    r = prepare("llama3", src, tmp_path / "f", "--format", fmt, *limit, check=False)
    assert r.returncode != 0
    assert f"{src}:2: ".encode() in r.stderr and b"--on-error skip" in r.stderr, r.stderr
    assert not list(tmp_path.glob("f*"))
    r = prepare("llama3", src, tmp_path / "f", "--format", fmt, *limit, "--on-error", "fail",
                check=False)
    assert r.returncode != 0 and f"{src}:2: ".encode() in r.stderr
    # skip: counted per problem, the good record kept.
    r = prepare("llama3", src, tmp_path / "s", "--format", fmt, *limit, "--on-error", "skip")
    counts = {}
    for _, problem in records:
        if problem:
            counts[problem] = counts.get(problem, 0) + 1
    skipped, by_problem = report_value(r, "skipped")
    assert skipped == sum(counts.values())
    assert by_problem == "(" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + ")"
    assert report_value(r, "documents")[0] == 1
    good = [alpaca_messages(x) if fmt == "alpaca" else sharegpt_messages(x)
            for x, p in records if p is None]
    check_documents("llama3", tmp_path / "s", good)
    r = prepare("llama3", src, tmp_path / "x", "--format", fmt, "--on-error", "ignore",
                check=False)
    assert r.returncode != 0 and b"--on-error ignore: expected fail or skip" in r.stderr


def test_data_that_trains_no_token_is_refused(tmp_path):
    # A --generation-role or a role tag that names no turn of the data leaves every label -100.
    src = tmp_path / "chat.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": "hello"}]}) + "\n")
    r = prepare("qwen3", src, tmp_path / "c", "--format", "chat", "--generation-role",
                "assitant", check=False)
    assert r.returncode == 2 and b"no token of the 1 documents is trained" in r.stderr, r.stderr
    assert not list(tmp_path.glob("c.*")) and not list(tmp_path.glob("c_*"))
    sg = tmp_path / "sg.jsonl"
    sg.write_text(json.dumps({"conversations": [{"from": "human", "value": "q"},
                                                {"from": "gpt", "value": "a"}]}) + "\n")
    for tags, needle in [("role_tag=from,content_tag=from", b"role_tag and content_tag are both"),
                         ("user_tag=human,user_tag=foo", b"user_tag is given twice")]:
        r = prepare("qwen3", sg, tmp_path / "s", "--format", "sharegpt", "--role-tags", tags,
                    check=False)
        assert r.returncode == 2 and needle in r.stderr, (tags, r.stderr)
    assert not list(tmp_path.glob("s.*")) and not list(tmp_path.glob("s_*"))


TRAIN = """
model:
  family: llama
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 1
  num_attention_heads: 2
  max_position_embeddings: 64
  tie_word_embeddings: true
data:
  split: "100,0,0"
  seq_length: 64
train:
  steps: 1
  micro_batch_size: 2
  log_interval: 1
  eval_interval: 0
  threads: 2
  device: cpu
optimizer:
  lr: 3.0e-3
checkpoint:
  interval: 0
"""


def test_prepared_conversations_train_packed_with_per_document_attention(tmp_path):
    # Conversations of 20 to 40 tokens, so that each 64-token sample packs several of them.
    records = [{"instruction": f"Count to {i % 7 + 1}.", "input": "" if i % 3 else "in words",
                "output": f"Counting {i} done, " + "one two three " * (i % 4)} for i in range(60)]
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    prepare("llama3", src, tmp_path / "sft", "--format", "alpaca", "--seq-length", "64")
    (tmp_path / "t.yaml").write_text(TRAIN)
    first_loss = {}
    for per_doc in ("true", "false"):
        run_dir = tmp_path / f"run_{per_doc}"
        sets = [f"data.path={tmp_path / 'sft'}", f"data.label_path={tmp_path / 'sft_label'}",
                f"data.valid_path={tmp_path / 'sft'}",
                f"data.valid_label_path={tmp_path / 'sft_label'}",
                f"data.tokenizer={TOKENIZERS / 'llama3.json'}",
                f"data.per_document_attention={per_doc}"]
        lathe("train", tmp_path / "t.yaml", "--run-dir", run_dir,
              *[a for s in sets for a in ("--set", s)])
        step = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
        assert step["split"] == "train" and np.isfinite(step["loss"])
        first_loss[per_doc] = step["loss"]
    # Same weights, same samples: only the attention mask differs, and it changes the loss
    # because the samples hold several conversations.
    assert first_loss["true"] != first_loss["false"], first_loss
