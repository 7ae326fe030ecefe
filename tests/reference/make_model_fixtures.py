#!/usr/bin/env python3
"""Reference fixtures for whole-model parity (src/model/model_parity_test.cpp).

For each case below this builds a small random-weight model with Hugging Face transformers from a
real configuration scaled down, runs a fixed batch in fp32 on the CPU, and writes into
tests/fixtures/models/<case>/:

  config.json         the model's config.json, in the form checkpoints on the Hub carry it
                      (rope_theta / rope_scaling / rotary_pct keys, not transformers 5's
                      rope_parameters), so lathe's config reader is tested on what users have
  model.safetensors   the initial weights under their Hugging Face names and stored shapes
                      (as save_pretrained writes them: tied weights once, GPT-2 Conv1D [in, out],
                      GPT-NeoX query_key_value per-head interleaved)
  reference.safetensors
                      tokens, targets (-100 = ignored), docs and positions (B, T) int32;
                      logits (B, T, V) f32; grad.<name> for every parameter (HF layout) f32
  reference.json      loss, the AdamW hyperparameters and the losses of ten AdamW steps
                      (float repr, round-trips), plus the shapes and library versions used

The loss is mean cross-entropy over the targets that are not -100, targets aligned with the
inputs (targets[b, t] is what position t predicts; no shift inside), which is what lathe's model
computes. Weights are drawn at random for every parameter (biases and norms included, so that
adding a bias or scaling a norm is actually tested), dropout is off.

AdamW: torch.optim.AdamW with two parameter groups, weight decay on matrices and embeddings
(ndim >= 2) and none on norms and biases (ndim < 2), fixed lr, betas, eps. adamw_losses[i] is
the loss computed before update i + 1; final_loss is the loss after the tenth update.

Regenerate (needs torch, transformers, safetensors from PyPI; CI never does this):
    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers safetensors numpy
    /tmp/ref/bin/python tests/reference/make_model_fixtures.py [--out tests/fixtures/models]
The output is deterministic for a given torch version (seeded, CPU, fp32).
"""

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

B, T = 2, 16
ADAMW = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "steps": 10}

# Real configurations scaled down. Keys are the Hub's config.json keys; the comment names the model
# whose shape each case follows.
CASES = {
    # meta-llama/Llama-3.2-1B: tied embeddings, GQA 32/8, rope_theta 5e5, llama3 rope scaling.
    "llama": {
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "hidden_act": "silu",
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "tie_word_embeddings": True,
            "initializer_range": 0.02,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "torch_dtype": "float32",
        },
        "seed": 11,
    },
    # A Llama with every optional flag on: untied head, attention_bias (q, k, v, o) and mlp_bias,
    # no GQA, and packed documents (positions restart per document, attention stays inside one).
    "llama_bias_packed": {
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 128,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "hidden_act": "silu",
            "max_position_embeddings": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "attention_bias": True,
            "attention_dropout": 0.0,
            "mlp_bias": True,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
        },
        "seed": 12,
        "packed": True,
    },
    # mistralai/Mistral-7B-v0.1: sliding window (here 5 < T), GQA 32/8 (here 4/1), untied.
    "mistral": {
        "config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "hidden_act": "silu",
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "sliding_window": 5,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
        },
        "seed": 13,
    },
    # Qwen/Qwen2.5-0.5B: q/k/v biases, GQA 14/2 (here 4/2), rope_theta 1e6, tied, no sliding window.
    "qwen2": {
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "max_position_embeddings": 32768,
            "max_window_layers": 2,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "use_sliding_window": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
        },
        "seed": 14,
    },
    # EleutherAI/pythia-160m: LayerNorm with bias, parallel residual, rotary_pct 0.25, erf GELU,
    # untied embed_out, per-head interleaved query_key_value.
    "gpt_neox": {
        "config": {
            "architectures": ["GPTNeoXForCausalLM"],
            "model_type": "gpt_neox",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_act": "gelu",
            "max_position_embeddings": 2048,
            "layer_norm_eps": 1e-5,
            "rotary_emb_base": 10000,
            "rotary_pct": 0.25,
            "use_parallel_residual": True,
            "tie_word_embeddings": False,
            "initializer_range": 0.02,
            "attention_dropout": 0.0,
            "hidden_dropout": 0.0,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "torch_dtype": "float32",
        },
        "seed": 15,
    },
    # GPT-NeoX with the sequential residual (use_parallel_residual false, as GPT-NeoX-20B's
    # relatives and some Pythia-style finetunes) and half the head dims rotated.
    "gpt_neox_sequential": {
        "config": {
            "architectures": ["GPTNeoXForCausalLM"],
            "model_type": "gpt_neox",
            "vocab_size": 128,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "hidden_act": "gelu",
            "max_position_embeddings": 64,
            "layer_norm_eps": 1e-5,
            "rotary_emb_base": 10000,
            "rotary_pct": 0.5,
            "use_parallel_residual": False,
            "tie_word_embeddings": False,
            "attention_dropout": 0.0,
            "hidden_dropout": 0.0,
            "torch_dtype": "float32",
        },
        "seed": 16,
    },
    # openai-community/gpt2: learned positions, LayerNorm, tanh GELU, tied head, Conv1D weights.
    "gpt2": {
        "config": {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": 256,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "n_inner": 128,
            "n_positions": 64,
            "n_ctx": 64,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "scale_attn_weights": True,
            "initializer_range": 0.02,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "torch_dtype": "float32",
        },
        "seed": 17,
    },
}


def randomize(model, gen):
    """Every parameter drawn at random: matrices and embeddings normal(0, 0.08), norm weights
    1 + normal(0, 0.1), biases and norm biases normal(0, 0.05)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.ndim >= 2:
                p.copy_(0.08 * noise)
            elif "norm" in name or ".ln_" in name or "ln_f" in name:
                p.copy_((1.0 + 0.1 * noise) if name.endswith("weight") else 0.05 * noise)
            else:
                p.copy_(0.05 * noise)


def stored_names(model, stored):
    """The checkpoint name of each parameter: the stored tensor with the same values (every
    parameter is drawn at random, so values identify it)."""
    names = {}
    for n, p in model.named_parameters():
        same = [k for k, t in stored.items() if t.shape == p.shape and torch.equal(t, p.detach())]
        assert len(same) == 1, f"{n}: {len(same)} stored tensors hold its values"
        names[n] = same[0]
    assert sorted(names.values()) == sorted(stored), "stored tensors that are no parameter"
    return names


def make_batch(vocab, gen, packed):
    tokens = torch.randint(0, vocab, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, vocab, (B, T), generator=gen, dtype=torch.int64)
    # Some ignored targets, at fixed places (never a whole row).
    targets[0, 0] = -100
    targets[0, 7] = -100
    targets[1, 3] = -100
    targets[1, 4] = -100
    targets[1, T - 1] = -100
    if packed:
        # Documents of lengths 5, 7, 4 in row 0 and 9, 7 in row 1.
        lengths = [[5, 7, 4], [9, 7]]
    else:
        lengths = [[T], [T]]
    docs = torch.zeros((B, T), dtype=torch.int64)
    positions = torch.zeros((B, T), dtype=torch.int64)
    for b, row in enumerate(lengths):
        assert sum(row) == T
        t = 0
        for d, n in enumerate(row):
            docs[b, t:t + n] = d
            positions[b, t:t + n] = torch.arange(n)
            t += n
    return tokens, targets, docs, positions


def loss_of(model, tokens, targets, positions, packed):
    # use_cache=False: with a cache, transformers does not look for packed documents in
    # position_ids (masking_utils only does so for a cache-less, training-style call).
    kwargs = {"position_ids": positions} if packed else {}
    logits = model(input_ids=tokens, use_cache=False, **kwargs).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-100)
    return logits, loss


def check_packed(model, tokens, positions, docs, logits):
    """HF masks packed documents from position_ids; make sure that is what happened: each
    document run alone must give the same logits."""
    with torch.no_grad():
        for b in range(B):
            for d in docs[b].unique().tolist():
                idx = (docs[b] == d).nonzero().flatten()
                alone = model(input_ids=tokens[b:b + 1, idx], use_cache=False).logits[0]
                err = (alone - logits[b, idx]).abs().max().item()
                assert err < 1e-4, f"packed document {b}/{d} differs from running it alone: {err}"


def make_case(name, case, out_dir):
    cfg = case["config"]
    packed = case.get("packed", False)
    torch.manual_seed(case["seed"])
    gen = torch.Generator().manual_seed(case["seed"])
    config = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32)
    model.eval()  # no dropout (every dropout probability is 0 anyway)
    randomize(model, gen)
    vocab = cfg["vocab_size"]
    tokens, targets, docs, positions = make_batch(vocab, gen, packed)

    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    with open(os.path.join(case_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    # The weights exactly as save_pretrained stores them (tied weights once; names as checkpoints
    # have them, which is not always the module's name: transformers 5 calls GPT-NeoX's head
    # lm_head but saves it as embed_out, as every Pythia checkpoint has it).
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        shutil.copyfile(os.path.join(tmp, "model.safetensors"),
                        os.path.join(case_dir, "model.safetensors"))
    stored = load_file(os.path.join(case_dir, "model.safetensors"))
    disk_name = stored_names(model, stored)
    params = stored

    initial = copy.deepcopy(model)
    model.zero_grad()
    logits, loss = loss_of(model, tokens, targets, positions, packed)
    loss.backward()
    if packed:
        check_packed(model, tokens, positions, docs, logits)
    ref = {
        "tokens": tokens.to(torch.int32),
        "targets": targets.to(torch.int32),
        "docs": docs.to(torch.int32),
        "positions": positions.to(torch.int32),
        "logits": logits.detach().contiguous(),
    }
    for n, p in model.named_parameters():
        ref["grad." + disk_name[n]] = p.grad.detach().clone().contiguous()
    save_file(ref, os.path.join(case_dir, "reference.safetensors"))

    # Ten AdamW steps from the same initial weights.
    model = initial
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAMW["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses = []
    for _ in range(ADAMW["steps"]):
        opt.zero_grad(set_to_none=True)
        _, step_loss = loss_of(model, tokens, targets, positions, packed)
        step_loss.backward()
        losses.append(step_loss.item())
        opt.step()
    with torch.no_grad():
        _, final_loss = loss_of(model, tokens, targets, positions, packed)

    meta = {
        "case": name,
        "batch": B,
        "seq_len": T,
        "packed": packed,
        "loss": loss.item(),
        "adamw": ADAMW,
        "adamw_decay": "weight decay on parameters with ndim >= 2, none on norms and biases",
        "adamw_losses": losses,
        "final_loss": final_loss.item(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    with open(os.path.join(case_dir, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"{name}: loss {loss.item():.6f}, after 10 AdamW steps {final_loss.item():.6f}, "
          f"{sum(p.numel() for p in params.values())} parameters")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(here, "..", "fixtures", "models"))
    parser.add_argument("cases", nargs="*", help="cases to write (default: all)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    names = args.cases or list(CASES)
    for name in names:
        if name not in CASES:
            sys.exit(f"unknown case {name!r}; known: {', '.join(CASES)}")
        make_case(name, CASES[name], args.out)


if __name__ == "__main__":
    main()
