"""`lathe align terms` (stage 1 of vocabulary adaptation, docs/ALIGN.md) against Hugging Face
`tokenizers`.

What is checked, for two byte-level source tokenizers (gpt-neox-20b, qwen3):
  * the target tokenizer.json that lathe writes loads in HF `Tokenizer.from_file`, has exactly the
    mined terms as new ids after the source vocabulary (the ids the reports list), and HF and
    `lathe tokenize` encode real held-out text to the same ids: PubMedQA abstracts (the medical
    corpus the terms come from) and GCIDE dictionary text. 0 mismatches, and the new ids are
    really used (the check cannot pass with terms that never match);
  * HF decodes those encodings back to the exact text (an added term decodes to its content);
  * the reports agree with HF: each term's source encoding (the FVT pieces of stage 5) is HF's
    encoding of its text under the source tokenizer, and its piece count is that length;
  * the stage cache: a second identical run does nothing; a changed setting runs again;
  * a tokenizer that is not byte-level (llama2) and an empty corpus are clear errors.
"""

import json
import os
import subprocess
import zlib
from pathlib import Path

import pytest
from tokenizers import Tokenizer

LATHE = os.environ.get("LATHE_BIN", str(Path(__file__).resolve().parents[1] / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
PUBMED = SHARED / "corpora" / "pubmedqa_ori_pqal.json"
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")



@pytest.fixture(scope="module", autouse=True)
def required_data():
    """PubMedQA of ../shared and dict-gcide are required test data: a missing file fails every
    test here, naming it."""
    for path in (PUBMED, GCIDE):
        assert path.exists(), f"{path} is missing (../shared, or dict-gcide: scripts/install-deps.sh)"


def lathe(*args, check=True):
    p = subprocess.run([LATHE, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def pubmed_docs():
    """One document per PubMedQA entry: question, abstract paragraphs, long answer."""
    data = json.loads(PUBMED.read_text(encoding="utf-8"))
    return ["\n".join([v["QUESTION"], *v["CONTEXTS"], v["LONG_ANSWER"]]) for v in data.values()]


def gcide_blocks(start, size):
    """Blank-line-separated blocks of GCIDE text from decompressed offset `start`."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    with open(GCIDE, "rb") as f:
        while len(out) < start + size:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            out += d.decompress(chunk)
    text = bytes(out[start:start + size]).decode("utf-8", "ignore")
    return [b.strip("\n") for b in text.split("\n\n") if b.strip()]


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")


def encode_with_lathe(tokenizer_json, docs, tmp_path):
    src = tmp_path / "heldout.jsonl"
    out = tmp_path / "heldout.ids.jsonl"
    write_jsonl(src, docs)
    lathe("tokenize", "--tokenizer", tokenizer_json, "--input", src, "--output", out)
    return [json.loads(line)["ids"] for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = pubmed_docs()
    d = tmp_path_factory.mktemp("align_terms_corpus")
    # Mine on 800 abstracts; hold out the other 200.
    write_jsonl(d / "train.jsonl", docs[:800])
    return d / "train.jsonl", docs[800:]


@pytest.mark.parametrize("source_name", ["gpt-neox-20b", "qwen3"])
def test_target_tokenizer_encodes_identically_in_hf_and_lathe(tmp_path, corpus, source_name):
    train, heldout_medical = corpus
    source_path = SHARED / "tokenizers" / f"{source_name}.json"
    out = tmp_path / "target" / "tokenizer.json"
    p = lathe("align", "terms", "--tokenizer", source_path, "--corpus", train, "--output", out,
              "--top-k", 300, "--min-count", 4, "--no-progress")
    print(p.stdout)

    source = Tokenizer.from_file(str(source_path))
    target = Tokenizer.from_file(str(out))
    v = source.get_vocab_size()
    assert target.get_vocab_size() == v + 300

    # The reports: TSV (term first, as stage 4 reads it) and the JSON list of new ids.
    lines = (tmp_path / "target" / "tokenizer.terms.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "term\tcount\tpieces\tscore\tid"
    rows = [line.split("\t") for line in lines[1:]]
    assert len(rows) == 300
    new_tokens = json.loads((tmp_path / "target" / "tokenizer.new_tokens.json").read_text())
    assert new_tokens["source_vocab_size"] == v
    assert new_tokens["target_vocab_size"] == v + 300
    scores = []
    for i, (row, tok) in enumerate(zip(rows, new_tokens["tokens"])):
        term, count, pieces, score, tid = row[0], int(row[1]), int(row[2]), float(row[3]), int(row[4])
        assert tid == tok["id"] == v + i
        assert term == tok["content"]
        assert term.startswith(" ")
        assert target.token_to_id(term) == tid
        assert source.encode(term, add_special_tokens=False).ids == tok["source_ids"]
        assert pieces == len(tok["source_ids"]) >= 2
        assert count >= 4
        assert score == pytest.approx(count * (pieces - 1), rel=1e-5)
        scores.append(score)
    assert scores == sorted(scores, reverse=True)

    # Held-out medical text and GCIDE: HF and lathe agree, and the terms are used.
    docs = heldout_medical + gcide_blocks(5_000_000, 300_000)
    ours = encode_with_lathe(out, docs, tmp_path)
    theirs = [e.ids for e in target.encode_batch(docs, add_special_tokens=False)]
    assert len(ours) == len(theirs) == len(docs)
    mismatches = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    used = sum(1 for ids in theirs for t in ids if t >= v)
    n_source = sum(len(e.ids) for e in source.encode_batch(docs, add_special_tokens=False))
    n_target = sum(map(len, theirs))
    print(f"{source_name}: {len(docs)} held-out documents, {n_source} source tokens, {n_target} "
          f"target tokens ({1 - n_target / n_source:.2%} fewer), {used} uses of new ids, "
          f"{len(mismatches)} mismatches")
    assert not mismatches, f"first mismatch: {docs[mismatches[0]][:200]!r}"
    assert used > 100
    assert n_target < n_source
    for d, ids in zip(docs, theirs):
        assert target.decode(ids, skip_special_tokens=False) == d


def test_stage_cache_skips_and_reruns(tmp_path, corpus):
    train, _ = corpus
    source_path = SHARED / "tokenizers" / "gpt-neox-20b.json"
    out = tmp_path / "t.json"
    args = ["align", "terms", "--tokenizer", source_path, "--corpus", train, "--output", out,
            "--top-k", 50, "--no-progress"]
    first = lathe(*args)
    assert "wrote" in first.stdout
    manifest = json.loads((tmp_path / "t.json.stage.json").read_text())
    assert len(manifest["outputs"]) == 3
    mtime = out.stat().st_mtime_ns
    second = lathe(*args)
    assert "up to date" in second.stdout
    assert out.stat().st_mtime_ns == mtime
    third = lathe(*args[:-3], "--top-k", 40, "--no-progress")
    assert "wrote" in third.stdout
    assert Tokenizer.from_file(str(out)).get_vocab_size() == Tokenizer.from_file(
        str(source_path)).get_vocab_size() + 40


def test_bad_input_is_a_clear_error(tmp_path, corpus):
    train, _ = corpus
    llama2 = SHARED / "tokenizers" / "llama2.json"
    assert llama2.exists(), f"{llama2} is missing (../shared)"
    p = lathe("align", "terms", "--tokenizer", llama2, "--corpus", train, "--output",
              tmp_path / "x.json", check=False)
    assert p.returncode != 0
    assert "byte-level" in p.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    p = lathe("align", "terms", "--tokenizer", SHARED / "tokenizers" / "gpt2.json", "--corpus", empty,
              "--output", tmp_path / "y.json", check=False)
    assert p.returncode != 0
    assert "no documents" in p.stderr
    assert not (tmp_path / "y.json").exists()


def byte_level_bpe(vocab_size, texts):
    """A small byte-level BPE trained by HF (256 = the bytes alone)."""
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


MODELS = Path(__file__).resolve().parent / "fixtures" / "models"


def test_align_run_every_stage_then_nothing(tmp_path):
    """`lathe align run` on a tiny setup: the llama fixture (256 rows) with a 256-byte source
    tokenizer, 300 PubMedQA abstracts. Every stage runs once; a second run skips them all."""
    import shutil
    docs = pubmed_docs()
    train, held = docs[:300], docs[300:320]
    src = byte_level_bpe(256, train)
    assert src.get_vocab_size() == 256
    src.save(str(tmp_path / "source.json"))
    model = tmp_path / "model"
    shutil.copytree(MODELS / "llama", model)
    for extra in ("reference.json", "reference.safetensors"):
        (model / extra).unlink(missing_ok=True)
    shutil.copy(tmp_path / "source.json", model / "tokenizer.json")
    cfg = json.loads((model / "config.json").read_text())
    cfg["bos_token_id"] = cfg["eos_token_id"] = 0
    (model / "config.json").write_text(json.dumps(cfg))
    write_jsonl(tmp_path / "corpus.jsonl", train)
    (tmp_path / "held.txt").write_text("\n".join(d.replace("\n", " ") for d in held) + "\n")
    work = tmp_path / "work"
    (tmp_path / "run.yaml").write_text(f"""
align: {{work_dir: {work}, threads: 2}}
source: {{tokenizer: {tmp_path / 'source.json'}, checkpoint: {model}}}
corpus: {{inputs: [{tmp_path / 'corpus.jsonl'}]}}
terms: {{top_k: 40, min_count: 5}}
embed: {{dim: 16, iters: 3, min_count: 2, device: cpu}}
map: {{pivots: 50, device: cpu}}
eval: {{documents: {tmp_path / 'held.txt'}, seq_len: 64, max_documents: 5}}
""")
    first = lathe("align", "run", tmp_path / "run.yaml", "--no-progress")
    print(first.stdout)
    states = {line.split()[0] + (" " + line.split()[1] if line.split()[1] in ("source", "target") else ""):
              line for line in first.stdout.splitlines()[1:]}
    for stage in ("terms", "prepare source", "prepare target", "embed source", "embed target", "map",
                  "apply", "eval"):
        assert stage in states and " ran " in states[stage], (stage, first.stdout)
    target = Tokenizer.from_file(str(work / "target" / "tokenizer.json"))
    assert target.get_vocab_size() == 256 + 40
    m = json.loads((work / "map" / "map.json").read_text())
    assert len(m) == 296 and all(0 <= v < 256 for v in m.values())
    adapted = json.loads((work / "model" / "config.json").read_text())
    assert adapted["vocab_size"] >= 296
    ev = json.loads((work / "eval.json").read_text())
    assert len(ev["models"]) == 2
    second = lathe("align", "run", tmp_path / "run.yaml", "--no-progress")
    body = second.stdout.splitlines()[1:]
    assert len(body) == 8 and all(" up to date " in line for line in body), second.stdout
    # A changed map setting reruns the map only: here every target id is gold (the 256 bytes) or a
    # term, so the new map.json has the same bytes, and apply and eval, which fingerprint it by
    # content, stay up to date.
    third = lathe("align", "run", tmp_path / "run.yaml", "--no-progress", "--set", "map.pivots=40")
    ran = [line.split()[0] for line in third.stdout.splitlines()[1:] if " ran " in line]
    assert ran == ["map"], third.stdout
    # A changed apply setting reruns apply and eval (the adapted model changed).
    fourth = lathe("align", "run", tmp_path / "run.yaml", "--no-progress", "--set", "map.pivots=40",
                   "--set", "apply.init=mean")
    ran = [line.split()[0] for line in fourth.stdout.splitlines()[1:] if " ran " in line]
    assert ran == ["apply", "eval"], fourth.stdout
    # Config errors name the file and line.
    (tmp_path / "bad.yaml").write_text(f"align: {{work_dir: {work}}}\nsource: {{tokenizer: x}}\n"
                                       f"corpus: {{inputs: [x]}}\nterms: {{topk: 5}}\n")
    p = lathe("align", "run", tmp_path / "bad.yaml", check=False)
    assert p.returncode != 0 and "bad.yaml:4" in p.stderr and "terms.top_k" in p.stderr, p.stderr


def test_example_config_is_valid(tmp_path):
    """configs/align-example.yaml passes the schema: the run gets as far as the corpus check."""
    example = Path(__file__).resolve().parents[1] / "configs" / "align-example.yaml"
    p = lathe("align", "run", example, "--set", f"align.work_dir={tmp_path / 'w'}",
              "--set", f"corpus.inputs=[{tmp_path / 'missing.jsonl'}]", check=False)
    assert p.returncode != 0
    assert "missing.jsonl does not exist" in p.stderr, p.stderr
