"""End-to-end tests of `lathe align map`, `align apply`, `align eval` and the two fine-tuning
configs (stages 4-7), through the `lathe` binary.

The setting: a source tokenizer of the 256 byte-level bytes only (so every model fixture in
tests/fixtures/models, vocab_size 256, matches it) and a target byte-level BPE of 320 entries
trained on GCIDE text, plus the added term "hypertension". Random GloVe-format vectors stand in for
stage 3. Checked:
  - map: TokAlign's JSON (one entry per target id), the report's decisions (gold for the shared
    byte entries, term, fvt for unseen ids), the stage cache skipping a rerun;
  - apply, for Llama, Mistral, Qwen2, GPT-NeoX and GPT-2 fixtures (tied and untied): config
    vocab_size padded as the family pads, gathered rows equal to the mapped source rows, FVT rows
    equal to the mean (or AdaptiVocab's exponential weighting) of the source pieces, padding rows
    the mean, every other tensor byte-identical, the target tokenizer written; the baselines;
    errors for a map of another tokenizer and a model smaller than its tokenizer;
  - eval: bits per byte of the adapted checkpoint, alignment score, tokens per byte;
  - configs/align-stage1.yaml trains only the embedding and head, align-stage2.yaml everything.
"""
import gzip
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import transformers

LATHE = os.environ.get("LATHE_BIN", "build/lathe")
ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "fixtures" / "models"
FAMILIES = ["llama", "mistral", "qwen2", "gpt_neox", "gpt2"]
EMBED = {"llama": "model.embed_tokens.weight", "mistral": "model.embed_tokens.weight",
         "qwen2": "model.embed_tokens.weight", "gpt_neox": "gpt_neox.embed_in.weight",
         "gpt2": "transformer.wte.weight"}
HEAD = {"llama": "lm_head.weight", "mistral": "lm_head.weight", "qwen2": "lm_head.weight",
        "gpt_neox": "embed_out.weight", "gpt2": None}


def run(args, check=True):
    p = subprocess.run([LATHE] + [str(a) for a in args], capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def last_json(p):
    return json.loads(p.stdout.strip().splitlines()[-1])


NP = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}


def read_tensors(folder):
    """name -> (dtype, shape, bytes) over model.safetensors (lathe writes one file here)."""
    data = (Path(folder) / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], tuple(v["shape"]), data[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in header.items()}


def as_f32(t):
    dtype, shape, raw = t
    a = np.frombuffer(raw, dtype=NP[dtype]).reshape(shape)
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def byte_level_bpe(vocab_size, texts, special):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("align")
    raw = gzip.open("/usr/share/dictd/gcide.dict.dz", "rt", errors="replace").read(300_000)
    docs = [b.strip() for b in raw.split("\n\n") if b.strip()]
    src = byte_level_bpe(256, docs, [])
    assert src.get_vocab_size() == 256
    tgt = byte_level_bpe(320, docs, ["<|endoftext|>"])
    tgt.add_tokens(["hypertension"])
    assert tgt.get_vocab_size() == 321
    src.save(str(d / "source.json"))
    tgt.save(str(d / "target.json"))
    (d / "terms.tsv").write_text("term\tcount\tpieces\tscore\nhypertension\t10\t12\t110\n")
    rng = np.random.default_rng(0)
    with open(d / "sv.txt", "w") as f:
        for i in range(256):
            f.write(f"{i} " + " ".join(f"{x:.6f}" for x in rng.normal(size=16)) + "\n")
        f.write("<unk> " + " ".join("0" for _ in range(16)) + "\n")
    with open(d / "tv.txt", "w") as f:
        for i in range(300):  # ids 300..320 unseen
            f.write(f"{i} " + " ".join(f"{x:.6f}" for x in rng.normal(size=16)) + "\n")
    (d / "held.txt").write_text("\n".join(docs[-40:]) + "\n")
    with open(d / "c.jsonl", "w") as f:
        for b in docs[:-40]:
            f.write(json.dumps({"text": b}) + "\n")
    out = last_json(run(["align", "map", "--source-tokenizer", d / "source.json", "--target-tokenizer",
                         d / "target.json", "--source-vectors", d / "sv.txt", "--target-vectors", d / "tv.txt",
                         "--output", d / "map.json", "--pivots", 50, "--terms", d / "terms.tsv",
                         "--device", "cpu"]))
    return {"dir": d, "src": src, "tgt": tgt, "map_result": out, "docs": docs}


def test_map_outputs(setup):
    d = setup["dir"]
    m = json.loads((d / "map.json").read_text())
    assert list(m.keys()) == [str(i) for i in range(321)]
    assert all(0 <= v < 256 for v in m.values())
    rows = [line.split("\t") for line in (d / "map.report.tsv").read_text().splitlines()]
    assert rows[0] == ["target_id", "token", "decision", "source_id", "source_token", "similarity"]
    decisions = {int(r[0]): r[2] for r in rows[1:]}
    src, tgt = setup["src"], setup["tgt"]
    for t in range(321):
        s = src.token_to_id(tgt.id_to_token(t))
        if s is not None:
            assert decisions[t] == "gold" and m[str(t)] == s, t
    assert decisions[tgt.token_to_id("hypertension")] == "term"
    unseen = [t for t in range(300, 320)]
    assert all(decisions[t] == "fvt" for t in unseen)
    aligned = [t for t, v in decisions.items() if v == "aligned"]
    assert len(aligned) == 300 - 256  # every seen non-gold id: <|endoftext|> and the merges below 300
    assert setup["map_result"]["gold"] == 256 and setup["map_result"]["pivots"] == 50
    # The same inputs again: skipped by the stage cache.
    again = last_json(run(["align", "map", "--source-tokenizer", d / "source.json", "--target-tokenizer",
                           d / "target.json", "--source-vectors", d / "sv.txt", "--target-vectors",
                           d / "tv.txt", "--output", d / "map.json", "--pivots", 50, "--terms", d / "terms.tsv",
                           "--device", "cpu"]))
    assert again["skipped"] is True


def test_map_errors(setup, tmp_path):
    d = setup["dir"]
    p = run(["align", "map", "--source-tokenizer", d / "source.json", "--target-tokenizer", d / "target.json",
             "--source-vectors", d / "tv.txt", "--target-vectors", d / "tv.txt", "--output", tmp_path / "m.json"],
            check=False)
    assert p.returncode != 0 and "outside the tokenizer's vocabulary of 256" in p.stderr, p.stderr


def source_model(setup, family, tmp_path):
    folder = tmp_path / f"src-{family}"
    shutil.copytree(MODELS / family, folder)
    for extra in ("reference.json", "reference.safetensors"):
        (folder / extra).unlink(missing_ok=True)
    shutil.copy(setup["dir"] / "source.json", folder / "tokenizer.json")
    # The fixtures' bos/eos ids belong to their original tokenizers (some lie outside the 256 rows):
    # give them an id of this source tokenizer (apply replaces them by the target tokenizer's).
    cfg = json.loads((folder / "config.json").read_text())
    cfg["bos_token_id"] = cfg["eos_token_id"] = 0
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def target_text(tgt, t):
    """The raw text of a target entry (added tokens as written, byte-level entries decoded)."""
    tok = tgt.id_to_token(t)
    if tok in ("hypertension", "<|endoftext|>"):
        return tok
    return tgt.decoder.decode([tok])


def fvt_row(setup, matrix, t, weighting, sign):
    pieces = setup["src"].encode(target_text(setup["tgt"], t), add_special_tokens=False).ids
    rows = matrix[pieces].astype(np.float64)
    if weighting == "exponential" and len(pieces) > 1:
        w = np.exp(sign * 2.0 * np.arange(1, len(pieces) + 1))
    else:
        w = np.ones(len(pieces))
    return (w[:, None] * rows).sum(0) / w.sum()


@pytest.mark.parametrize("family", FAMILIES)
def test_apply_align(setup, family, tmp_path):
    d = setup["dir"]
    src_dir = source_model(setup, family, tmp_path)
    weighting = "exponential" if family == "gpt_neox" else "mean"
    out = tmp_path / "out"
    res = last_json(run(["align", "apply", "--checkpoint", src_dir, "--map", d / "map.json", "--target-tokenizer",
                         d / "target.json", "--output", out, "--fvt-weighting", weighting,
                         "--align-weight", 1, "--align-head-weight", 1]))  # TokAlign's plain gather
    padded = 384 if family == "gpt_neox" else 321
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == padded and res["vocab_size"] == padded
    assert (out / "tokenizer.json").read_bytes() == (d / "target.json").read_bytes()
    # The target tokenizer's own special ids (its <|endoftext|>), not the source's carried over.
    boundary = setup["tgt"].token_to_id("<|endoftext|>")
    assert boundary != setup["tgt"].token_to_id(setup["src"].id_to_token(0))
    assert cfg["bos_token_id"] == boundary and cfg["eos_token_id"] == boundary
    before, after = read_tensors(src_dir), read_tensors(out)
    m = json.loads((d / "map.json").read_text())
    decisions = {int(r.split("\t")[0]): r.split("\t")[2]
                 for r in (d / "map.report.tsv").read_text().splitlines()[1:]}
    # The untied head (Mistral's and GPT-NeoX's fixtures; Llama, Qwen2 and GPT-2 are tied).
    names = [EMBED[family]] + [h for h in [HEAD[family]] if h and h in before]
    assert len(names) == (2 if family in ("mistral", "gpt_neox") else 1)
    for name, sign in zip(names, (+1.0, -1.0)):
        e0, e1 = as_f32(before[name]), as_f32(after[name])
        assert e1.shape == (padded, e0.shape[1])
        for t in range(321):
            if decisions[t] in ("gold", "aligned"):
                np.testing.assert_array_equal(e1[t], e0[m[str(t)]], err_msg=f"{name} row {t}")
            else:
                np.testing.assert_allclose(e1[t], fvt_row(setup, e0, t, weighting, sign), rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} FVT row {t}")
        for t in range(321, padded):
            np.testing.assert_allclose(e1[t], e0[:256].astype(np.float64).mean(0), rtol=1e-5, atol=1e-6)
    for name, t in after.items():
        if name not in names:
            assert before[name] == t, name
    assert set(names) <= set(after) <= set(before)
    # lathe reads the new checkpoint: bits per byte of held-out text.
    ev = last_json(run(["align", "eval", "--checkpoint", out, "--documents", d / "held.txt", "--seq-len", 64,
                        "--max-documents", 8]))
    bpb = ev["models"][0]["bits_per_byte"]
    assert 0.5 < bpb < 20, ev


@pytest.mark.parametrize("weights", [(0.5, 0.25), (0.0, 1.0)])
def test_apply_align_blends_aligned_rows_with_fvt(setup, weights, tmp_path):
    # --align-weight W / --align-head-weight H: an aligned id's row is W x its gathered source row
    # + (1 - W) x its FVT row (H for the untied head); gold ids stay gathered, the rest FVT.
    d = setup["dir"]
    src_dir = source_model(setup, "gpt_neox", tmp_path)  # untied head
    w_embed, w_head = weights
    out = tmp_path / "out"
    res = last_json(run(["align", "apply", "--checkpoint", src_dir, "--map", d / "map.json", "--target-tokenizer",
                         d / "target.json", "--output", out, "--align-weight", w_embed,
                         "--align-head-weight", w_head]))
    before, after = read_tensors(src_dir), read_tensors(out)
    m = json.loads((d / "map.json").read_text())
    decisions = {int(r.split("\t")[0]): r.split("\t")[2]
                 for r in (d / "map.report.tsv").read_text().splitlines()[1:]}
    aligned = [t for t in range(321) if decisions[t] == "aligned"]
    assert aligned, "the fixture's map has no aligned ids: the test would check nothing"
    assert res["blended"] == len(aligned)
    for name, sign, w in ((EMBED["gpt_neox"], 1.0, w_embed), (HEAD["gpt_neox"], -1.0, w_head)):
        e0, e1 = as_f32(before[name]), as_f32(after[name])
        for t in range(321):
            if decisions[t] == "gold":
                np.testing.assert_array_equal(e1[t], e0[m[str(t)]])
            elif decisions[t] == "aligned":
                want = w * e0[m[str(t)]].astype(np.float64) + (1 - w) * fvt_row(setup, e0, t, "mean", sign)
                np.testing.assert_allclose(e1[t], want, rtol=1e-5, atol=1e-6, err_msg=f"{name} row {t}")
            else:
                np.testing.assert_allclose(e1[t], fvt_row(setup, e0, t, "mean", sign), rtol=1e-5, atol=1e-6)
    bad = run(["align", "apply", "--checkpoint", src_dir, "--map", d / "map.json", "--target-tokenizer",
               d / "target.json", "--output", tmp_path / "bad", "--align-weight", 1.5], check=False)
    assert bad.returncode != 0 and "--align-weight is 1.5" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("init", ["fvt", "mean", "random"])
def test_apply_baselines(setup, init, tmp_path):
    d = setup["dir"]
    src_dir = source_model(setup, "llama", tmp_path)
    out = tmp_path / "out"
    res = last_json(run(["align", "apply", "--checkpoint", src_dir, "--target-tokenizer", d / "target.json",
                         "--output", out, "--init", init, "--seed", 3]))
    e0 = as_f32(read_tensors(src_dir)[EMBED["llama"]])
    e1 = as_f32(read_tensors(out)[EMBED["llama"]])
    if init == "fvt":
        # shared strings copied, the rest FVT
        src, tgt = setup["src"], setup["tgt"]
        for t in range(321):
            s = src.token_to_id(tgt.id_to_token(t))
            if s is not None:
                np.testing.assert_array_equal(e1[t], e0[s])
            else:
                np.testing.assert_allclose(e1[t], fvt_row(setup, e0, t, "mean", 1), rtol=1e-5, atol=1e-6)
        assert res["gathered"] == 256 and res["fvt"] == 65
    elif init == "mean":
        mean = e0[:256].mean(0)
        spread = e0[:256].std(0)
        assert np.all(np.abs(e1 - mean) < 0.1 * spread + 1e-7)
        assert e1.std(0).mean() > 0  # noise, not identical rows
    else:
        assert abs(e1.std() - 0.02) < 0.002  # the fixture's initializer_range


def test_apply_errors(setup, tmp_path):
    d = setup["dir"]
    src_dir = source_model(setup, "llama", tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({str(i): 0 for i in range(10)}))
    p = run(["align", "apply", "--checkpoint", src_dir, "--map", bad, "--target-tokenizer", d / "target.json",
             "--output", tmp_path / "o1"], check=False)
    assert p.returncode != 0 and "maps 10 target ids" in p.stderr, p.stderr
    assert not (tmp_path / "o1").exists()
    # A model whose vocabulary is smaller than its tokenizer's.
    shutil.copy(d / "target.json", src_dir / "tokenizer.json")
    p = run(["align", "apply", "--checkpoint", src_dir, "--map", d / "map.json", "--target-tokenizer",
             d / "target.json", "--output", tmp_path / "o2"], check=False)
    assert p.returncode != 0 and "does not match its tokenizer" in p.stderr, p.stderr


def test_eval_alignment_and_tokens_per_byte(setup):
    d = setup["dir"]
    ev = last_json(run(["align", "eval", "--documents", d / "held.txt", "--map", d / "map.json",
                        "--source-tokenizer", d / "source.json", "--target-tokenizer", d / "target.json",
                        "--tokenizer", d / "source.json", "--tokenizer", d / "target.json"]))
    src, tgt = setup["src"], setup["tgt"]
    m = json.loads((d / "map.json").read_text())
    held = [line for line in (d / "held.txt").read_text().split("\n") if line.strip()]
    assert ev["documents"] == len(held)
    nbytes = sum(len(x.encode()) for x in held)
    assert ev["bytes"] == nbytes
    src_tokens = sum(len(src.encode(x).ids) for x in held)
    assert ev["tokenizers"][0]["tokens"] == src_tokens
    assert ev["tokenizers"][1]["tokens_per_byte"] < ev["tokenizers"][0]["tokens_per_byte"]
    # BLEU-1 as nltk computes it, in Python.
    import math
    from collections import Counter
    total = 0.0
    for x in held:
        ref = src.encode(x).ids
        hyp = [m[str(t)] for t in tgt.encode(x).ids]
        clip = sum(min(c, Counter(ref)[w]) for w, c in Counter(hyp).items())
        if hyp and clip:
            bp = 1.0 if len(hyp) > len(ref) else math.exp(1 - len(ref) / len(hyp))
            total += bp * clip / len(hyp)
    assert abs(ev["alignment_bleu1"] - total / len(held)) < 1e-9


def test_stage_configs_freeze_what_they_should(setup, tmp_path):
    d = setup["dir"]
    src_dir = source_model(setup, "gpt_neox", tmp_path)
    adapted = tmp_path / "adapted"
    run(["align", "apply", "--checkpoint", src_dir, "--map", d / "map.json", "--target-tokenizer",
         d / "target.json", "--output", adapted])
    run(["prepare", "--tokenizer", d / "target.json", "--input", d / "c.jsonl", "--output-prefix",
         tmp_path / "tt", "--append-eod"])
    small = ["train.steps=2", "train.micro_batch_size=2", "train.gradient_accumulation_steps=1",
             "data.seq_length=32", "train.eval_interval=0", "checkpoint.interval=0", "train.threads=2",
             f"data.path={tmp_path / 'tt'}", f"data.tokenizer={d / 'target.json'}", "data.split=98,2,0"]

    def train(config, run_dir, init_from):
        args = ["train", ROOT / "configs" / config, "--run-dir", run_dir, "--set", f"checkpoint.init_from={init_from}"]
        for s in small:
            args += ["--set", s]
        run(args)
        return read_tensors(run_dir / "checkpoints" / "step-00000002")

    base = {k: as_f32(v) for k, v in read_tensors(adapted).items()}
    s1 = {k: as_f32(v) for k, v in train("align-stage1.yaml", tmp_path / "s1", adapted).items()}
    for name, value in base.items():
        changed = not np.array_equal(value, s1[name])
        assert changed == (name in ("gpt_neox.embed_in.weight", "embed_out.weight")), name
    s2 = {k: as_f32(v) for k, v in train("align-stage2.yaml", tmp_path / "s2",
                                                tmp_path / "s1" / "checkpoints" / "step-00000002").items()}
    assert not np.array_equal(s1["gpt_neox.layers.0.mlp.dense_h_to_4h.weight"],
                              s2["gpt_neox.layers.0.mlp.dense_h_to_4h.weight"])
    assert not np.array_equal(s1["gpt_neox.embed_in.weight"], s2["gpt_neox.embed_in.weight"])


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gpt2"])
def test_transformers_loads_the_adapted_model_and_agrees_on_bits_per_byte(setup, family, tmp_path):
    """from_pretrained loads apply's output, and its NLL over the windows eval.h defines gives
    the bits per byte lathe reports."""
    import torch
    d = setup["dir"]
    src_dir = source_model(setup, family, tmp_path)
    out = tmp_path / "out"
    run(["align", "apply", "--checkpoint", src_dir, "--map", d / "map.json", "--target-tokenizer",
         d / "target.json", "--output", out])
    T, n_docs = 16, 6
    ev = last_json(run(["align", "eval", "--checkpoint", out, "--documents", d / "held.txt", "--seq-len", T,
                        "--max-documents", n_docs]))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32)
    model.eval()
    assert model.get_input_embeddings().weight.shape[0] == json.loads((out / "config.json").read_text())["vocab_size"]
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    boundary = json.loads((out / "config.json").read_text())["bos_token_id"]
    docs = [x for x in (d / "held.txt").read_text().split("\n") if x.strip()][:n_docs]
    nll, count, nbytes = 0.0, 0, 0
    with torch.no_grad():
        for doc in docs:
            s = [boundary] + tok.encode(doc).ids
            nbytes += len(doc.encode())
            n = len(s) - 1
            for begin in range(0, n, T):
                w = s[begin:min(n, begin + T) + 1]
                logits = model(torch.tensor([w[:-1]])).logits[0]
                nll += torch.nn.functional.cross_entropy(logits, torch.tensor(w[1:]), reduction="sum").item()
                count += len(w) - 1
    m = ev["models"][0]
    assert m["predicted_tokens"] == count
    want = nll / np.log(2) / nbytes
    assert abs(m["bits_per_byte"] - want) < 1e-4 * want, (m, want)


def test_map_equals_an_independent_float64_computation(setup, tmp_path):
    """With every gold pair as a pivot (so the seeded draw plays no part), each aligned target id
    is the argmax over source rows of rel_t . rel_s, rel = unit(v) . unit(pivots)^T, computed
    here in float64 with numpy (the rule of TokAlign's cal_trans_matrix.py -r)."""
    d = setup["dir"]
    out = last_json(run(["align", "map", "--source-tokenizer", d / "source.json", "--target-tokenizer",
                         d / "target.json", "--source-vectors", d / "sv.txt", "--target-vectors", d / "tv.txt",
                         "--output", tmp_path / "all.json", "--pivots", 100000, "--device", "cpu"]))
    assert out["pivots"] == 256

    def load(path):
        rows = {}
        for line in Path(path).read_text().splitlines():
            f = line.split()
            if f[0] != "<unk>":
                rows[int(f[0])] = np.array([float(x) for x in f[1:]])
        return rows

    sv, tv = load(d / "sv.txt"), load(d / "tv.txt")
    m = json.loads((tmp_path / "all.json").read_text())
    decisions = {int(r.split("\t")[0]): r.split("\t")[2]
                 for r in (tmp_path / "all.report.tsv").read_text().splitlines()[1:]}
    src, tgt = setup["src"], setup["tgt"]
    pivots = [(t, src.token_to_id(tgt.id_to_token(t))) for t in sorted(tv)
              if src.token_to_id(tgt.id_to_token(t)) is not None]
    unit = lambda M: M / np.linalg.norm(M, axis=1, keepdims=True)
    s_ids = sorted(sv)
    S = unit(np.stack([sv[i] for i in s_ids]))
    Ps = unit(np.stack([sv[s] for _, s in pivots]))
    Pt = unit(np.stack([tv[t] for t, _ in pivots]))
    rel_s = S @ Ps.T
    checked = 0
    for t, dec in decisions.items():
        if dec != "aligned":
            continue
        rel_t = unit(tv[t][None, :]) @ Pt.T
        sim = (rel_t @ rel_s.T)[0]
        best = int(np.argmax(sim))
        got = s_ids.index(m[str(t)])
        assert sim[got] >= sim[best] - 1e-4 * abs(sim[best]), (t, s_ids[best], m[str(t)])
        checked += 1
    assert checked == 44
