#!/usr/bin/env python3
"""Reference fixture for `lathe convert` + `lathe eval loss` (tests/test_convert.py).

Writes tests/fixtures/convert/:

  hf/                 a Hugging Face folder as transformers' save_pretrained writes it: a small
                      random-weight Llama (GQA, untied head) stored in **bf16** and **sharded**
                      (model-0000K-of-00002.safetensors + model.safetensors.index.json), its
                      config.json and generation_config.json, and a byte-level BPE tokenizer
                      (tokenizer.json, tokenizer_config.json, chat_template.jinja) trained here on
                      the repository's own format docs
  tokens.bin/.idx     a token file (Megatron/GPT-NeoX MMapIndexedDataset, uint16) of those docs,
                      one document per paragraph, each closed by the EOS token
  expected.json       the loss transformers computes on that file as `lathe eval loss` defines it
                      (src/run/eval_loss.h): the token file read as one stream, the first N
                      non-overlapping windows of T + 1 tokens, tokens 1..T of each predicted from
                      the ones before, mean cross-entropy over all N*T predictions, in fp32 on the
                      CPU with the bf16 weights widened to fp32 (exactly what lathe loads)

The CI test converts hf/ to a lathe checkpoint, runs `lathe eval loss` on it and compares with
expected.json (no torch needed), converts back and compares the files with hf/ byte for byte.

Regenerate (needs torch, transformers, tokenizers, numpy from PyPI; CI never does this):
    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers tokenizers numpy
    /tmp/ref/bin/python tests/reference/make_convert_fixture.py [--out tests/fixtures/convert]
Deterministic for a given torch / tokenizers version (seeded, CPU).
"""

import argparse
import json
import os
import shutil
import struct

import numpy as np
import tokenizers
import torch
import torch.nn.functional as F
import transformers

SEQ_LEN = 32  # T
WINDOWS = 6   # N
VOCAB = 384
MAX_SHARD_SIZE = "150KB"  # the bf16 weights are ~250 kB: two shards
SEED = 21

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|end|>"]  # ids 0, 1, 2, 3


def documents(repo):
    """Paragraphs of the repository's format docs: real, stable English text with code."""
    docs = []
    for name in ("token-files.md", "safetensors.md"):
        with open(os.path.join(repo, "docs", "formats", name), encoding="utf-8") as f:
            docs += [p.strip() for p in f.read().split("\n\n") if p.strip()]
    return docs


def train_tokenizer(texts):
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def write_token_file(prefix, docs):
    """MMapIndexedDataset, one sequence per document (docs/formats/token-files.md)."""
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.zeros(len(docs), dtype=np.int64)
    pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * 2)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.array(d, dtype=np.uint16).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(docs) + 1))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.abspath(os.path.join(here, "..", ".."))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "convert"))
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    shutil.rmtree(args.out, ignore_errors=True)
    hf_dir = os.path.join(args.out, "hf")
    os.makedirs(hf_dir)

    # Tokenizer and token file.
    texts = documents(repo)
    tok = train_tokenizer(texts)
    eos = tok.token_to_id("<|eos|>")
    docs = [tok.encode(t).ids + [eos] for t in texts]
    stream = [t for d in docs for t in d]
    assert len(stream) >= WINDOWS * (SEQ_LEN + 1), len(stream)
    write_token_file(os.path.join(args.out, "tokens"), docs)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(hf_dir)

    # The model: random weights (every parameter, norms included), saved in bf16, sharded.
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    config = transformers.AutoConfig.for_model(**CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(0.1 * noise if p.ndim >= 2 else 1.0 + 0.1 * noise)
    model.to(torch.bfloat16).save_pretrained(hf_dir, max_shard_size=MAX_SHARD_SIZE)
    assert os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")), "not sharded"

    # The reference loss: the saved bf16 weights, widened to fp32, on lathe's eval windows.
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, attn_implementation="eager", dtype=torch.float32)
    ref.eval()
    windows = torch.tensor(stream[:WINDOWS * (SEQ_LEN + 1)], dtype=torch.int64).view(
        WINDOWS, SEQ_LEN + 1)
    with torch.no_grad():
        logits = ref(input_ids=windows[:, :-1], use_cache=False).logits
        losses = F.cross_entropy(logits.reshape(-1, VOCAB), windows[:, 1:].reshape(-1),
                                 reduction="none").double()
    loss = losses.mean().item()
    expected = {
        "seq_len": SEQ_LEN,
        "batches": WINDOWS,
        "tokens": WINDOWS * SEQ_LEN,
        "loss": loss,
        "perplexity": float(np.exp(loss)),
        "window_losses": losses.view(WINDOWS, SEQ_LEN).mean(dim=1).tolist(),
        "max_shard_size": MAX_SHARD_SIZE,
        "stream_tokens": len(stream),
        "documents": len(docs),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    print(f"loss {loss:.7f} over {WINDOWS} x {SEQ_LEN} tokens; {len(docs)} documents, "
          f"{len(stream)} tokens; files: {sorted(os.listdir(hf_dir))}")


if __name__ == "__main__":
    main()
