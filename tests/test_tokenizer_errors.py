"""tokenizer.json files that are valid for Hugging Face `tokenizers` but unusual, and files that
are not tokenizers at all, through the lathe commands that take `--tokenizer`.

  * Split / Replace patterns with capturing groups (HF splits and replaces on the whole match):
    the shared tokenizers' own patterns with their parts wrapped in groups (plain, nested,
    optional, alternatives that do not take part), a Split of every behaviour with and without
    invert, and a Replace normalizer; `lathe tokenize` must give HF's ids byte for byte over real
    text (gcide and the rest of tests/corpus.py).
  * Very large token ids (HF keeps ids in a map): a gpt2 vocabulary with some ids moved up to
    2^31 - 1, and added tokens whose file ids are huge; the ids must be HF's, and lathe must run
    in a memory limit far below what a table indexed by id would take. Ids that HF refuses
    (>= 2^32, negative) and ids lathe cannot hold (2^31 .. 2^32 - 1, which HF reads) are refused
    with a message naming the file and the token.
  * A file of the wrong kind as --tokenizer (JSON Lines, YAML, empty, a directory, a
    tokenizer_config.json, a JSON array) for tokenize, prepare, chat encode and tokenizer info:
    `lathe: error:` naming the file, what it holds and what was expected, never a crash.
  * A Split, normalizer Replace or decoder Replace pattern that gives up on a text (it
    backtracks too far; here `(a|aa)+$` on 100 'a' and a 'b', and Llama-3's pattern on ten
    million spaces): prepare, align terms and tokenizer train stop with one `lathe: error:`
    naming the input file and line, or skip the document under --on-error skip; data dump's
    decoding is an error naming the tokenizer and the document; never an abort, in the worker
    threads as on the main one.
"""

import copy
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import build_corpus, dictionary_text  # noqa: E402
from lathe_cli import LATHE, run  # noqa: E402

SHARED = Path(os.environ.get("LATHE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
REPO = Path(__file__).resolve().parents[1]
SHOW = 3


def shared_json(name):
    path = SHARED / "tokenizers" / f"{name}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing (LATHE_SHARED_DIR={SHARED})")
    return json.loads(path.read_text(encoding="utf-8"))


def gcide_documents(total_chars, doc_chars=700):
    """Real English text (gcide), cut into documents of about doc_chars characters."""
    text = dictionary_text("gcide", 4 * total_chars)
    text = text[len(text) // 3:][:total_chars]  # past the front matter
    return [text[i:i + doc_chars] for i in range(0, len(text), doc_chars)]


_corpus = None


def documents():
    """gcide text plus the varied corpus (Unicode edge cases, contractions, digit runs...)."""
    global _corpus
    if _corpus is None:
        _corpus = gcide_documents(300_000) + build_corpus(total_bytes=300_000, seed=11)
    return _corpus


def lathe_encode(tok_path, docs, tmp_path, address_space=None):
    """ids from `lathe tokenize` for each document (under an address-space limit if given)."""
    src = tmp_path / "docs.jsonl"
    out = tmp_path / "ids.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")

    def limit():
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    proc = subprocess.run([LATHE, "tokenize", "--tokenizer", str(tok_path), "--input", str(src),
                           "--output", str(out), "--threads", "2"],
                          capture_output=True, text=True, preexec_fn=limit)
    assert proc.returncode == 0, f"lathe tokenize --tokenizer {tok_path} failed:\n{proc.stderr}"
    with open(out, encoding="utf-8") as f:
        return [json.loads(line)["ids"] for line in f]


def assert_same_ids(name, docs, expected, got):
    assert len(got) == len(expected), f"{name}: {len(got)} output lines for {len(expected)} documents"
    bad = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    print(f"{name}: {len(docs)} documents, {sum(map(len, expected))} ids, {len(bad)} mismatches")
    lines = []
    for i in bad[:SHOW]:
        e, g = expected[i], got[i]
        at = next((k for k, (x, y) in enumerate(zip(e, g)) if x != y), min(len(e), len(g)))
        lines.append(f"  doc {i} text={docs[i][:120]!r} first difference at {at}: "
                     f"hf={e[max(0, at - 3):at + 6]} lathe={g[max(0, at - 3):at + 6]}")
    assert not bad, f"{name}: {len(bad)} of {len(docs)} documents differ from HF\n" + "\n".join(lines)


def check_against_hf(name, tok_json, tmp_path, docs=None, address_space=None):
    """Saves tok_json, encodes the documents with HF and lathe, and compares every id."""
    docs = documents() if docs is None else docs
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
    hf = Tokenizer.from_file(str(path))
    expected = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    got = lathe_encode(path, docs, tmp_path, address_space)
    assert_same_ids(name, docs, expected, got)
    return hf, expected


# ---------------------------------------------------------------------------------------------
# Capturing groups


def top_level_alternatives(pattern):
    """The pattern's top-level alternatives (outside groups and character classes)."""
    parts, depth, in_class, start, i = [], 0, False, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]":  # a ']' right after '[' is a literal
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def grouped_variants(pattern):
    """The same language as `pattern`, written with capturing groups in several ways."""
    alts = top_level_alternatives(pattern)
    assert len(alts) > 3, pattern
    return {
        "each": "|".join(f"({a})" for a in alts),
        "nested": "|".join(f"(({a})|(?!))" for a in alts),
        "whole": f"({pattern})",
        # Groups inside each part: an optional group that never takes part (\p{Cs}, surrogates,
        # never occur in UTF-8 text) and a quantified group around every \p{L}+.
        "inner": "|".join("(?:(\\p{Cs})?" + a.replace("\\p{L}+", "((\\p{L})+)") + ")"
                          for a in alts),
    }


def split_node(tok_json):
    node = tok_json["pre_tokenizer"]
    split = node["pretokenizers"][0] if node["type"] == "Sequence" else node
    assert split["type"] == "Split" and "Regex" in split["pattern"], split
    return split


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
@pytest.mark.parametrize("variant", ["each", "nested", "whole", "inner"])
def test_split_pattern_with_groups_matches_hf(name, variant, tmp_path):
    original = shared_json(name)
    tok_json = copy.deepcopy(original)
    split = split_node(tok_json)
    pattern = grouped_variants(split["pattern"]["Regex"])[variant]
    split["pattern"]["Regex"] = pattern
    hf, expected = check_against_hf(f"{name}-{variant}", tok_json, tmp_path)
    # HF ignores the groups: the ids are those of the original file (so the text did go through
    # the grouped pattern's every part).
    plain = Tokenizer.from_str(json.dumps(original))
    assert [e.ids for e in plain.encode_batch(documents()[:300], add_special_tokens=False)] == \
        expected[:300]


BEHAVIORS = ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]
# Digits, contractions, a group that is optional, and alternatives whose groups do not take part.
GROUPED = r"(\p{N}+)|('s|'t|'(re|ve))|((x)|(q))(u)?|(?<sp>\s)(\s)?(?=\p{Lu})"


@pytest.mark.parametrize("behavior", BEHAVIORS)
@pytest.mark.parametrize("invert", [False, True])
def test_split_behaviours_with_groups_match_hf(behavior, invert, tmp_path):
    tok_json = shared_json("gpt2")
    tok_json["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GROUPED}, "behavior": behavior, "invert": invert},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ]}
    check_against_hf(f"split-{behavior}-{invert}", tok_json, tmp_path,
                     docs=gcide_documents(150_000) + documents()[-300:])


@pytest.mark.parametrize("pattern", ["( )", "(( )|(\t))", "(?<s> )(x)?"])
def test_replace_normalizer_with_groups_matches_hf(pattern, tmp_path):
    tok_json = shared_json("llama2")
    replace = tok_json["normalizer"]["normalizers"][1]
    assert replace["type"] == "Replace" and replace["pattern"] == {"String": " "}, replace
    replace["pattern"] = {"Regex": pattern}
    replace["content"] = "\u2581"
    check_against_hf(f"replace-{len(pattern)}", tok_json, tmp_path,
                     docs=gcide_documents(150_000) + documents()[-300:])


# ---------------------------------------------------------------------------------------------
# Very large ids

HUGE = [2**31 - 1, 2**31 - 2, 1_000_000_000, 123_456_789, 50_257 * 3]


def huge_id_gpt2():
    """gpt2 with frequent tokens moved to very large ids, and added tokens with huge file ids."""
    tok_json = shared_json("gpt2")
    vocab = tok_json["model"]["vocab"]
    for token, new_id in zip(["\u0120the", ",", "e", "\u0120of", "hello"], HUGE):
        assert token in vocab, token
        vocab[token] = new_id
    added = tok_json["added_tokens"]
    assert [t["content"] for t in added] == ["<|endoftext|>"]
    added[0]["id"] = 2**32 - 1  # HF reads it (u32) but assigns the id itself
    base = dict(added[0], special=False, normalized=False)
    added.append(dict(base, content="<|huge|>", id=2**31 - 1))  # new: gets the next free id
    added.append(dict(base, content="hello", id=7))  # in the vocabulary: keeps 50_257 * 3
    return tok_json


def test_huge_ids_encode_as_hf_in_bounded_memory(tmp_path):
    tok_json = huge_id_gpt2()
    docs = documents() + [f"x<|huge|>hello, the end<|endoftext|>{i}" for i in range(50)]
    # A table indexed by id would take gigabytes (2^31 entries); 2 GiB of address space is
    # enough for the ordinary gpt2 file (checked first, so the limit is not what fails).
    limit = 2 << 30
    plain_path = tmp_path / "plain.json"
    plain_path.write_text(json.dumps(shared_json("gpt2")), encoding="utf-8")
    lathe_encode(plain_path, docs[:50], tmp_path, address_space=limit)
    hf, expected = check_against_hf("gpt2-huge-ids", tok_json, tmp_path, docs=docs,
                                    address_space=limit)
    flat = {i for ids in expected for i in ids}
    assert set(HUGE) <= flat, "the corpus must use every moved id"
    assert hf.token_to_id("<|huge|>") == 50_257 and 50_257 in flat
    # Decoding the same ids gives HF's text.
    ids_path = tmp_path / "huge_ids.jsonl"
    with open(ids_path, "w", encoding="utf-8") as f:
        for ids in expected[:400]:
            f.write(json.dumps({"ids": ids}) + "\n")
    out = tmp_path / "decoded.jsonl"
    proc = run(["tokenize", "--decode", "--special", "--tokenizer", str(tmp_path / "gpt2-huge-ids.json"),
                "--input", str(ids_path), "--output", str(out)],
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line)["text"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert got == hf.decode_batch(expected[:400], skip_special_tokens=False)
    info = run(["tokenizer", "info", str(tmp_path / "gpt2-huge-ids.json")])
    assert info.returncode == 0, info.stderr
    assert "vocab size:     2147483648" in info.stdout, info.stdout


def hf_refuses(tok_json):
    try:
        Tokenizer.from_str(json.dumps(tok_json))
    except Exception as e:  # noqa: BLE001 (the binding raises a plain Exception)
        return str(e)
    return None


@pytest.mark.parametrize("where,value,hf_takes", [
    ("vocab", 2**31, True), ("vocab", 2**32 - 1, True), ("vocab", 2**32, False),
    ("vocab", -1, False), ("vocab", 10**20, False),
    ("added", 2**32, False), ("added", -5, False), ("added", 1.5, False),
])
def test_ids_out_of_range_are_refused_naming_the_token(where, value, hf_takes, tmp_path):
    tok_json = shared_json("gpt2")
    if where == "vocab":
        tok_json["model"]["vocab"]["\u0120the"] = value
        token = "\u0120the"
    else:
        tok_json["added_tokens"][0]["id"] = value
        token = "<|endoftext|>"
    # What HF does with the file (the test states it, so a change in HF shows here).
    assert (hf_refuses(tok_json) is None) == hf_takes
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
    proc = run(["tokenize", "--tokenizer", str(path), "--input", "-", "--output", "-"], check=False, input="{}\n")
    assert 0 < proc.returncode < 128, (proc.returncode, proc.stderr)
    err = proc.stderr
    assert err.startswith("lathe: error: ") and str(path) in err and token in err, err
    assert ("32-bit" in err) == hf_takes, err
    assert "terminate" not in err and "Aborted" not in err


# ---------------------------------------------------------------------------------------------
# Files of the wrong kind


def wrong_kind_files(tmp_path):
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in gcide_documents(5000)))
    empty = tmp_path / "empty.json"
    empty.write_text("")
    directory = tmp_path / "model_dir"
    directory.mkdir()
    array = tmp_path / "ids.json"
    array.write_text("[1, 2, 3]\n")
    return {
        "jsonl": (jsonl, "JSON Lines"),
        "yaml": (REPO / "configs" / "tiny.yaml", "not JSON"),
        "empty": (empty, "the file is empty"),
        "directory": (directory, "it is a directory"),
        "tokenizer_config": (SHARED / "tokenizers" / "qwen3.tokenizer_config.json",
                             "tokenizer_config.json"),
        "array": (array, "a JSON array"),
    }


KINDS = ["jsonl", "yaml", "empty", "directory", "tokenizer_config", "array"]
COMMANDS = ["tokenize", "prepare", "chat encode", "tokenizer info"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", COMMANDS)
def test_wrong_kind_of_file_names_it_and_what_was_expected(kind, command, tmp_path):
    path, says = wrong_kind_files(tmp_path)[kind]
    assert path.exists(), path
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "hello"}\n')
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    args = {
        "tokenize": ["tokenize", "--tokenizer", str(path), "--input", str(docs), "--output",
                     str(tmp_path / "out.jsonl")],
        "prepare": ["prepare", "--tokenizer", str(path), "--input", str(docs), "--output-prefix",
                    str(tmp_path / "out")],
        "chat encode": ["chat", "encode", "--tokenizer", str(path), "--tokenizer-config",
                        str(SHARED / "tokenizers" / "qwen3.tokenizer_config.json"),
                        "--input", str(chats), "--output", str(tmp_path / "out.jsonl")],
        "tokenizer info": ["tokenizer", "info", str(path)],
    }[command]
    proc = run(args, check=False)
    assert 0 < proc.returncode < 128, (proc.returncode, proc.stderr)
    err = proc.stderr.strip()
    assert err.startswith("lathe: error: "), err
    assert str(path) in err and says in err, err
    assert "expected a Hugging Face tokenizer.json" in err, err
    if command != "tokenizer info":
        assert err.startswith("lathe: error: --tokenizer: "), err
    assert "last read" not in err and "terminate" not in err, err
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "out.bin").exists()


# ---------------------------------------------------------------------------------------------
# Patterns that give up

# Backtracks exponentially on a run of 'a' that does not reach the end of the text: PCRE2 gives
# up on 100 of them followed by a 'b' within milliseconds.
GIVES_UP = "(a|aa)+$"
BAD_TEXT = "a" * 100 + "b"
GOOD_LINES = ["The patient had amoxicillin clavulanate.", "Left ventricular hypokinesis."]


def giving_up(where):
    """gpt2.json with a pattern that gives up on BAD_TEXT: a Split before its pre-tokenizer, a
    Replace as its normalizer, or a Replace after its ByteLevel decoder (which joins the tokens
    into one)."""
    tok = shared_json("gpt2")
    split = {"type": "Split", "pattern": {"Regex": GIVES_UP}, "behavior": "Isolated",
             "invert": False}
    replace = {"type": "Replace", "pattern": {"Regex": GIVES_UP}, "content": "x"}
    if where == "pre_tokenizer":
        tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, tok["pre_tokenizer"]]}
    elif where == "normalizer":
        assert tok["normalizer"] is None
        tok["normalizer"] = replace
    else:
        tok["decoder"] = {"type": "Sequence", "decoders": [tok["decoder"], replace]}
    return tok


def write_giving_up(tmp_path, where):
    path = tmp_path / f"{where}.json"
    path.write_text(json.dumps(giving_up(where)), encoding="utf-8")
    return path


def the_error(proc):
    """The one `lathe: error:` line of a failed command that did not crash."""
    assert 0 < proc.returncode < 128, (proc.returncode, proc.stderr)
    assert "terminate called" not in proc.stderr and "what():" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("lathe: error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.mark.parametrize("where", ["pre_tokenizer", "normalizer"])
def test_align_terms_pattern_that_gives_up_names_the_line_or_skips(where, tmp_path):
    tok = write_giving_up(tmp_path, where)
    corpus = tmp_path / "domain.txt"
    corpus.write_text("\n".join(GOOD_LINES * 5 + [BAD_TEXT] + GOOD_LINES * 5) + "\n")
    args = ["align", "terms", "--tokenizer", tok, "--corpus", corpus, "--output",
            tmp_path / "target.json", "--min-count", "2", "--threads", "2", "--no-progress"]
    err = the_error(run(args, check=False))
    assert f"{corpus}:11: " in err and "gave up on this text of 101 bytes" in err, err
    assert "--on-error skip" in err, err
    assert not (tmp_path / "target.json").exists()
    proc = run(args + ["--on-error", "skip"])
    assert "skipped: 1 bad documents" in proc.stdout, proc.stdout
    assert (tmp_path / "target.json").exists()


@pytest.mark.parametrize("where", ["pre_tokenizer", "normalizer"])
def test_prepare_pattern_that_gives_up_names_the_line_or_skips(where, tmp_path):
    tok = write_giving_up(tmp_path, where)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n"
                            for t in GOOD_LINES + [BAD_TEXT] + GOOD_LINES))
    args = ["prepare", "--tokenizer", tok, "--input", docs, "--output-prefix", tmp_path / "out",
            "--threads", "2"]
    err = the_error(run(args, check=False))
    assert f"{docs}:3" in err and "gave up on this text of 101 bytes" in err, err
    assert not (tmp_path / "out.bin").exists()
    run(args + ["--on-error", "skip"])
    assert (tmp_path / "out.idx").exists()


def test_data_dump_decoder_pattern_that_gives_up_names_the_tokenizer(tmp_path):
    tok = write_giving_up(tmp_path, "decoder")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in [GOOD_LINES[0], BAD_TEXT]))
    run(["prepare", "--tokenizer", tok, "--input", docs, "--output-prefix", tmp_path / "out"])
    dump = ["data", "dump", tmp_path / "out", "--tokenizer", tok, "--json"]
    good = json.loads(run(dump + ["--doc", "0"]).stdout)
    assert good["text"] == GOOD_LINES[0]
    err = the_error(run(dump + ["--doc", "1"], check=False))
    assert f"document 1: {tok}: decoder: " in err, err
    assert "gave up on this text of 101 bytes" in err, err


def test_tokenizer_train_pattern_that_gives_up_names_the_line_or_skips(tmp_path):
    # Llama-3's pattern gives up on ten million spaces between two letters (HF's tokenizers
    # fails on them too) in a tenth of a second.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(GOOD_LINES * 2 + ["x" + " " * 10_000_000 + "x"] + GOOD_LINES)
                      + "\n")
    args = ["tokenizer", "train", "--vocab-size", "300", "--pre-tokenizer", "llama3", "--input",
            corpus, "--output", tmp_path / "tok.json", "--threads", "2"]
    err = the_error(run(args, check=False))
    assert f"{corpus}:5: " in err and "gave up on this text of 10000002 bytes" in err, err
    assert "--on-error skip" in err, err
    assert not (tmp_path / "tok.json").exists()
    proc = run(args + ["--on-error", "skip"])
    assert "skipped 1 document(s)" in proc.stderr and f"{corpus}:5" in proc.stderr, proc.stderr
    assert (tmp_path / "tok.json").exists()
