"""Special token ids in the checkpoints lathe writes, checked with transformers itself.

A model trained from scratch takes its bos/eos/pad ids from the tokenizer it was trained with
(its tokenizer_config.json when it has one, else the tokenizer.json: <|endoftext|>, the
post-processor's tokens), not from transformers' class defaults (Llama's 1 and 2, GPT-NeoX's 2):
  * `lathe train` writes them into every checkpoint's config.json, and a tokenizer_config.json
    beside a tokenizer that has none;
  * `lathe convert --to hf` writes config.json and generation_config.json with them (an id of a
    checkpoint that names no special token of its tokenizer is replaced, with a warning), writes
    tokenizer_config.json when none is carried and keeps a carried one byte for byte;
  * `lathe align apply` takes the target tokenizer's ids.
transformers loads each output (AutoTokenizer, AutoModelForCausalLM): the config's ids equal the
tokenizer's, and generate() stops at the document-end token: with a hook that makes eos the
argmax, it emits exactly one token (with a wrong eos_token_id it would run to max_new_tokens),
and the trained model's own greedy continuation never runs past an eos.
"""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from corpus import write_gcide_jsonl
from lathe_cli import run, tiny_llama_model, tokenize_corpus

SHARED = Path(os.environ.get("LATHE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
EOT = "<|endoftext|>"
MAX_NEW = 16

MODELS = {
    "llama": tiny_llama_model(48, 96),
    "gpt_neox": """
model:
  family: gpt_neox
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 2
  num_attention_heads: 4
  max_position_embeddings: 64
""",
}

TRAIN = """
data:
  split: "100,0,0"
  seq_length: 32
train:
  steps: {steps}
  micro_batch_size: 8
  log_interval: 10
  eval_interval: 0
  threads: 2
optimizer:
  lr: 1.0e-2
checkpoint:
  interval: 0
"""


def shared_file(name):
    path = SHARED / "tokenizers" / name
    if not path.exists():
        pytest.fail(f"{path} is missing (LATHE_SHARED_DIR={SHARED})")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """GCIDE entries as short JSONL documents, a lathe BPE tokenizer with <|endoftext|> (id 0)
    and no tokenizer_config.json, the documents prepared with --append-eod."""
    d = tmp_path_factory.mktemp("special_ids")
    write_gcide_jsonl(d / "c.jsonl", 300_000, doc_chars=200)
    (d / "lathe_tok").mkdir()
    tokenize_corpus(d / "c.jsonl", d / "lathe_tok" / "tok.json", d / "lathe_data", 384, EOT)
    return d


def train(corpus, tmp_path, family, tokenizer, data, steps):
    cfg = tmp_path / f"{family}.yaml"
    cfg.write_text(MODELS[family] + TRAIN.format(steps=steps) +
                   f"\ndata.path: {data}\ndata.tokenizer: {tokenizer}\n")
    run_dir = tmp_path / f"run_{family}"
    p = run(["train", cfg, "--run-dir", run_dir])
    steps_dirs = sorted((run_dir / "checkpoints").glob("step-*"))
    assert steps_dirs, p.stderr
    return run_dir, steps_dirs[-1], p.stderr


def load_json(path):
    return json.loads(Path(path).read_text())


def check_hf_folder(folder, eos_token, bos_token, generation_config_file=True):
    """transformers loads `folder`: the tokenizer names the expected tokens, config.json and
    generation_config.json (or, without that file, the generation config transformers derives
    from config.json) carry their ids, and generate() stops at eos. Returns the model and
    tokenizer."""
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token == eos_token and tok.bos_token == bos_token
    eos = tok.convert_tokens_to_ids(eos_token)
    assert tok.eos_token_id == eos and tok.bos_token_id == tok.convert_tokens_to_ids(bos_token)
    cfg = load_json(folder / "config.json")
    assert cfg["eos_token_id"] == eos and cfg["bos_token_id"] == tok.bos_token_id, cfg
    assert (folder / "generation_config.json").exists() == generation_config_file
    if generation_config_file:
        gen = load_json(folder / "generation_config.json")
        assert gen["eos_token_id"] == eos and gen["bos_token_id"] == tok.bos_token_id, gen
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    assert model.config.eos_token_id == eos and model.generation_config.eos_token_id == eos

    # A model whose argmax is eos at every position: generate must stop after that one token.
    def push_eos(module, inputs, output):
        out = output.clone()
        out[..., eos] += 1.0e4
        return out

    enc = tok("A noun, the", return_tensors="pt")
    hook = model.get_output_embeddings().register_forward_hook(push_eos)
    try:
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False,
                                 pad_token_id=eos)
    finally:
        hook.remove()
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    assert new == [eos], new
    return model, tok


def test_scratch_llama_checkpoint_and_hf_conversion(corpus, tmp_path):
    tok_path = corpus / "lathe_tok" / "tok.json"
    run_dir, ckpt, log = train(corpus, tmp_path, "llama", tok_path, corpus / "lathe_data", 60)
    # The tokenizer's ids, not LlamaConfig's 1 and 2 (byte tokens of this vocabulary).
    cfg = load_json(ckpt / "config.json")
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (0, 0), cfg
    assert "eos_token_id 2" in log and EOT in log, log
    tc = load_json(ckpt / "tokenizer_config.json")
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tc["eos_token"] == EOT and tc["bos_token"] == EOT and tc["pad_token"] is None
    assert tc["model_max_length"] == 64

    out = tmp_path / "hf"
    r = run(["convert", run_dir, out, "--to", "hf"])
    assert "config.json:" not in r.stderr  # nothing to repair in a checkpoint lathe wrote
    assert (out / "tokenizer_config.json").read_bytes() == (ckpt / "tokenizer_config.json").read_bytes()
    model, tok = check_hf_folder(out, EOT, EOT)

    # The trained model's own greedy continuations stop at the first eos they emit.
    eos = tok.eos_token_id
    stopped = 0
    for prompt in ["A noun", "To cut", "The state of", "Having the"]:
        enc = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=48, do_sample=False, pad_token_id=eos)
        new = gen[0, enc["input_ids"].shape[1]:].tolist()
        assert eos not in new[:-1], new
        stopped += new[-1] == eos
    print(f"{stopped} of 4 greedy continuations ended with eos")
    # Trained on documents that each end with <|endoftext|>, the model ends some continuations
    # itself (4 of 4 on the development machine; training is deterministic).
    assert stopped >= 1


def test_scratch_gpt_neox_with_the_gpt_neox_tokenizer(corpus, tmp_path):
    """GPTNeoXConfig's eos 2 is "!" in GPT-NeoX-20B's vocabulary; its <|endoftext|> is 0."""
    tok_dir = tmp_path / "neox_tok"
    tok_dir.mkdir()
    shutil.copy(shared_file("gpt-neox-20b.json"), tok_dir / "tokenizer.json")
    run(["prepare", "--tokenizer", tok_dir / "tokenizer.json", "--input", corpus / "c.jsonl",
         "--output-prefix", tmp_path / "neox_data", "--append-eod"])
    run_dir, ckpt, _ = train(corpus, tmp_path, "gpt_neox", tok_dir / "tokenizer.json",
                             tmp_path / "neox_data", 2)
    cfg = load_json(ckpt / "config.json")
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (0, 0), cfg
    out = tmp_path / "hf"
    run(["convert", run_dir, out, "--to", "hf"])
    check_hf_folder(out, EOT, EOT)


def test_convert_repairs_ids_that_name_no_special_token(corpus, tmp_path):
    """A checkpoint with transformers' Llama defaults (bos 1, eos 2) and no tokenizer_config.json
    converts with its tokenizer's ids; a carried tokenizer_config.json is kept as it is."""
    run_dir, ckpt, _ = train(corpus, tmp_path, "llama", corpus / "lathe_tok" / "tok.json",
                             corpus / "lathe_data", 2)
    old = tmp_path / "old"
    shutil.copytree(ckpt, old)
    cfg = load_json(old / "config.json")
    cfg.update(bos_token_id=1, eos_token_id=2)
    (old / "config.json").write_text(json.dumps(cfg, indent=2))
    (old / "tokenizer_config.json").unlink()
    r = run(["convert", old, tmp_path / "hf", "--to", "hf"])
    assert "eos_token_id 2" in r.stderr and "-> 0 ('<|endoftext|>')" in r.stderr, r.stderr
    assert "tokenizer_config.json" in json.loads(r.stdout.splitlines()[-1])["other_files"]
    check_hf_folder(tmp_path / "hf", EOT, EOT)

    # A tokenizer_config.json of the checkpoint's own is carried byte for byte, and its tokens
    # are the ones the ids follow: here <|endoftext|> is eos and there is no bos.
    own = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT, "bos_token": None,
           "model_max_length": 64, "note": "kept"}
    text = json.dumps(own, indent=3) + "\n"
    (old / "tokenizer_config.json").write_text(text)
    run(["convert", old, tmp_path / "hf2", "--to", "hf"])
    assert (tmp_path / "hf2" / "tokenizer_config.json").read_text() == text
    cfg2 = load_json(tmp_path / "hf2" / "config.json")
    assert cfg2["eos_token_id"] == 0 and cfg2.get("bos_token_id") is None, cfg2
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf2")
    assert tok.eos_token_id == 0 and tok.bos_token is None


def test_align_apply_takes_the_target_tokenizers_ids(corpus, tmp_path):
    """The source model's eos (<|endoftext|> = 0) is not the target's: the target tokenizer
    puts <|pad|> at 0 and <|endoftext|> at 1."""
    run_dir, ckpt, _ = train(corpus, tmp_path, "llama", corpus / "lathe_tok" / "tok.json",
                             corpus / "lathe_data", 2)
    target = tmp_path / "target"
    target.mkdir()
    run(["tokenizer", "train", "--vocab-size", 320, "--special-tokens", f"<|pad|>,{EOT}",
         "--input", corpus / "c.jsonl", "--output", target / "target.json"])
    tj = load_json(target / "target.json")
    ids = {t["content"]: t["id"] for t in tj["added_tokens"]}
    assert ids == {"<|pad|>": 0, EOT: 1}, ids
    out = tmp_path / "aligned"
    run(["align", "apply", "--checkpoint", run_dir, "--target-tokenizer", target / "target.json",
         "--init", "fvt", "--output", out])
    cfg = load_json(out / "config.json")
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 1), cfg
    tc = load_json(out / "tokenizer_config.json")
    assert tc["eos_token"] == EOT
    check_hf_folder(out, EOT, EOT, generation_config_file=False)

    # With a tokenizer_config.json beside the target, its tokens define the ids and the file is
    # carried as it is. It names no bos: the source's (<|endoftext|>, by spelling) stays, as a
    # special token of the target.
    text = json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT,
                       "bos_token": None, "pad_token": "<|pad|>"}, indent=2) + "\n"
    (target / "target.tokenizer_config.json").write_text(text)
    out2 = tmp_path / "aligned2"
    run(["align", "apply", "--checkpoint", run_dir, "--target-tokenizer", target / "target.json",
         "--init", "fvt", "--output", out2])
    assert (out2 / "tokenizer_config.json").read_text() == text
    cfg2 = load_json(out2 / "config.json")
    assert cfg2["eos_token_id"] == 1 and cfg2["pad_token_id"] == 0, cfg2
    assert cfg2["bos_token_id"] == 1, cfg2
