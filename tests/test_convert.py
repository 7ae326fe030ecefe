"""End-to-end tests of `lathe convert` (issue: Hugging Face interop).

Checked here, through the `lathe` binary:
  - HF -> lathe -> HF reproduces every tensor bit for bit, in f32, bf16 and fp16, one file and
    sharded, for all seven model fixtures (tests/fixtures/models);
  - narrowing f32 -> bf16 / fp16 gives torch's values (an independent numpy implementation of
    torch's round-to-nearest-even for bf16, numpy's own float16 cast for fp16);
  - `lathe eval loss` on a converted checkpoint equals the loss transformers computed on the same
    windows (tests/fixtures/convert, made by tests/reference/make_convert_fixture.py: a bf16,
    sharded Hugging Face folder with a tokenizer and chat template, a token file, the expected
    loss), and the folder converts back with tokenizer, chat template and generation config;
  - `lathe train` starts from a converted checkpoint in both init modes, and its run folder
    converts back to Hugging Face;
  - errors name the tensor and exit non-zero, and leave no output behind.
With torch and transformers (required test dependencies, installed by scripts/install-deps.sh):
  - transformers' from_pretrained loads lathe's HF output (f32 and bf16) and reproduces the
    reference logits; lathe's bf16 weights equal torch's `.to(torch.bfloat16)` of the originals;
    AutoTokenizer loads the converted tokenizer and renders the chat template as the original.
"""
import json
import os
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import transformers

LATHE = os.environ.get("LATHE_BIN", "build/lathe")
ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "fixtures" / "models"
EVAL = ROOT / "tests" / "fixtures" / "convert"
CASES = ["llama", "llama_bias_packed", "mistral", "qwen2", "gpt_neox", "gpt_neox_sequential", "gpt2"]


def run(args, check=True):
    p = subprocess.run([LATHE] + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"lathe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def convert(src, dst, to, *extra):
    p = run(["convert", src, dst, "--to", to, *extra])
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- safetensors, read with numpy (CI has no safetensors package) ----

NP = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "I32": np.int32}


def read_file(path):
    """name -> (dtype, shape, raw bytes) of one .safetensors file."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], tuple(v["shape"]), data[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in header.items()}


def read_checkpoint(folder):
    """Every tensor of a checkpoint folder (one file, or the shards of its index)."""
    folder = Path(folder)
    if (folder / "model.safetensors").exists():
        return read_file(folder / "model.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(read_file(folder / shard))
    assert sorted(out) == sorted(index["weight_map"]), "index and shards disagree"
    return out


def as_array(t):
    dtype, shape, raw = t
    return np.frombuffer(raw, dtype=NP[dtype]).reshape(shape)


def bf16_like_torch(x):
    """torch's round_to_nearest_even (c10/util/BFloat16.h) on f32 values, as uint16 bits."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def weight_files(folder):
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith("model"))


# ---- round trips ----

@pytest.mark.parametrize("case", CASES)
def test_f32_round_trip_is_bit_identical(case, tmp_path):
    a = convert(MODELS / case, tmp_path / "lathe", "lathe")
    assert a["input_format"] == "hf" and a["format"] == "lathe" and a["dtype"] == "fp32"
    for f in ("model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"):
        assert (tmp_path / "lathe" / f).exists(), f
    b = convert(tmp_path / "lathe", tmp_path / "hf", "hf", "--dtype", "fp32")
    assert b["input_format"] == "lathe"
    assert read_checkpoint(tmp_path / "hf") == read_checkpoint(MODELS / case)
    # save_pretrained's file, byte for byte.
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == (MODELS / case / "model.safetensors").read_bytes()
    cfg_in = json.loads((MODELS / case / "config.json").read_text())
    cfg_out = json.loads((tmp_path / "hf" / "config.json").read_text())
    # transformers 5 copied rope_theta into the fixture's rope_scaling too; lathe writes the
    # Hub's spelling, where it sits at the top level only.
    if isinstance(cfg_in.get("rope_scaling"), dict):
        assert cfg_in["rope_scaling"].pop("rope_theta", cfg_in["rope_theta"]) == cfg_in["rope_theta"]
    for k, v in cfg_in.items():
        assert cfg_out[k] == v, k
    assert not (tmp_path / "hf" / "optimizer.safetensors").exists()


@pytest.mark.parametrize("dtype,np_dtype", [("bf16", "BF16"), ("fp16", "F16")])
@pytest.mark.parametrize("case", ["llama", "gpt_neox", "gpt2"])
def test_narrow_round_trip_sharded_is_bit_identical(case, dtype, np_dtype, tmp_path):
    original = read_checkpoint(MODELS / case)
    limit = str(sum(len(t[2]) for t in original.values()) // 2 // 3)  # three shards or more
    narrow = tmp_path / "narrow"
    convert(MODELS / case, narrow, "hf", "--dtype", dtype, "--max-shard-size", limit)
    assert (narrow / "model.safetensors.index.json").exists()
    assert len(weight_files(narrow)) >= 4
    narrowed = read_checkpoint(narrow)
    assert sorted(narrowed) == sorted(original)
    for name, t in original.items():
        x = as_array(t)
        want = bf16_like_torch(x) if dtype == "bf16" else x.astype(np.float16)
        got = as_array(narrowed[name])
        assert narrowed[name][0] == np_dtype
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), name
    cfg = json.loads((narrow / "config.json").read_text())
    assert cfg["torch_dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[dtype]

    convert(narrow, tmp_path / "lathe", "lathe")
    widened = read_checkpoint(tmp_path / "lathe")
    for name, t in narrowed.items():
        assert widened[name][0] == "F32"
        want = (as_array(t).astype(np.uint32) << 16).view(np.float32) if dtype == "bf16" \
            else as_array(t).astype(np.float32)
        assert np.array_equal(as_array(widened[name]).view(np.uint32), want.view(np.uint32)), name
    back = tmp_path / "back"
    convert(tmp_path / "lathe", back, "hf", "--dtype", dtype, "--max-shard-size", limit)
    assert weight_files(back) == weight_files(narrow)
    for f in weight_files(narrow):
        assert (back / f).read_bytes() == (narrow / f).read_bytes(), f


SPECIAL_F32 = np.array(
    [0x3F808000, 0x3F818000, 0x3F808001, 0xBF808000,   # bf16 ties (even stays, odd goes up)
     0x7F7FFFFF, 0x477FF000, 0x477FEFFF, 0xC77FF000,   # overflow: bf16, and fp16 at 65520
     0x00000001, 0x33000000, 0x33400000, 0x387FC000,   # f32 subnormal; fp16 subnormal ties
     0x38800000, 0x80000000, 0x7F800000, 0xFF800000,   # smallest fp16 normal, -0, +-inf
     0x7FC00000, 0x3F800000],                          # NaN, 1
    dtype=np.uint32).view(np.float32)


def test_narrowing_special_values_like_torch(tmp_path):
    """Ties, overflow, subnormals, signed zero, infinities and NaN, narrowed as torch does."""
    tensors = read_checkpoint(MODELS / "gpt2")
    name = "transformer.ln_f.weight"
    values = np.resize(SPECIAL_F32, tensors[name][1])
    tensors[name] = ("F32", tensors[name][1], values.tobytes())
    src = write_tensors(tmp_path / "special", tensors, MODELS / "gpt2" / "config.json")
    import torch
    for dtype in ("bf16", "fp16"):
        out = convert(src, tmp_path / dtype, "hf", "--dtype", dtype)
        got = as_array(read_checkpoint(tmp_path / dtype)[name]).view(np.uint16)
        with np.errstate(over="ignore"):
            want = bf16_like_torch(values) if dtype == "bf16" else values.astype(np.float16).view(np.uint16)
        assert out["dtype"] == dtype
        assert got.tolist() == want.tolist(), dtype  # NaN included: 0x7FC0 / 0x7E00, quiet
        t = torch.from_numpy(values.copy()).to(torch.bfloat16 if dtype == "bf16" else torch.float16)
        theirs = t.view(torch.int16).numpy().view(np.uint16)
        # torch's own NaN encoding depends on its code path (0x7FC0 scalar, 0xFFFF vectorized for
        # bf16), so NaN is compared as NaN-ness; every other value bit for bit.
        nan = np.isnan(values)
        assert got[~nan].tolist() == theirs[~nan].tolist(), dtype
        assert np.isnan(t.float().numpy()[nan]).all()


# ---- the eval fixture: bf16, sharded, tokenizer + chat template, token file, expected loss ----

def eval_loss(checkpoint, data, expected):
    p = run(["eval", "loss", "--device", "cpu", "--checkpoint", checkpoint, "--data", data,
             "--seq-len", expected["seq_len"], "--batches", expected["batches"], "--threads", 2])
    return json.loads(p.stdout)


def test_eval_loss_on_converted_checkpoint_equals_transformers(tmp_path):
    expected = json.loads((EVAL / "expected.json").read_text())
    r = convert(EVAL / "hf", tmp_path / "lathe", "lathe")
    assert r["input_dtypes"] == ["BF16"] and r["tensors"] == 21
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (tmp_path / "lathe" / f).read_bytes() == (EVAL / "hf" / f).read_bytes(), f
    got = eval_loss(tmp_path / "lathe", EVAL / "tokens", expected)
    rel = abs(got["loss"] - expected["loss"]) / expected["loss"]
    print(f"[eval loss] lathe {got['loss']!r} vs transformers {expected['loss']!r}: rel err {rel:.3g}")
    assert got["tokens"] == expected["tokens"]
    assert rel < 1e-5, (got, expected["loss"])
    assert abs(got["perplexity"] - expected["perplexity"]) / expected["perplexity"] < 1e-4
    # The HF folder itself (bf16 widened on load) and a sharded lathe checkpoint give the very
    # same number.
    assert eval_loss(EVAL / "hf", EVAL / "tokens", expected)["loss"] == got["loss"]
    r = convert(EVAL / "hf", tmp_path / "lathe-sharded", "lathe", "--max-shard-size", "100KB")
    assert len(r["weight_files"]) > 3 and r["weight_files"][-1] == "model.safetensors.index.json"
    assert eval_loss(tmp_path / "lathe-sharded", EVAL / "tokens", expected)["loss"] == got["loss"]


def test_eval_fixture_round_trip(tmp_path):
    expected = json.loads((EVAL / "expected.json").read_text())
    convert(EVAL / "hf", tmp_path / "lathe", "lathe")
    r = convert(tmp_path / "lathe", tmp_path / "hf", "hf", "--max-shard-size", expected["max_shard_size"])
    assert r["dtype"] == "bf16"  # the default for --to hf
    assert read_checkpoint(tmp_path / "hf") == read_checkpoint(EVAL / "hf")
    idx_in = json.loads((EVAL / "hf" / "model.safetensors.index.json").read_text())
    idx_out = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert sorted(idx_out["weight_map"]) == sorted(idx_in["weight_map"])
    assert idx_out["metadata"]["total_size"] == idx_in["metadata"]["total_size"]
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (tmp_path / "hf" / f).read_bytes() == (EVAL / "hf" / f).read_bytes(), f
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "bfloat16"


TRAIN = """
data:
  split: "100,0,0"
  seq_length: 32
train:
  steps: 2
  micro_batch_size: 2
  log_interval: 1
  eval_interval: 0
  threads: 2
optimizer:
  lr: 1.0e-3
checkpoint:
  interval: 0
"""


def test_train_starts_from_converted_checkpoint(tmp_path):
    # The token file is copied: the trainer writes its index caches beside it.
    for ext in (".bin", ".idx"):
        (tmp_path / ("tokens" + ext)).write_bytes((EVAL / ("tokens" + ext)).read_bytes())
    ckpt = tmp_path / "lathe"
    convert(EVAL / "hf", ckpt, "lathe")
    (tmp_path / "train.yaml").write_text(TRAIN)
    first = {}
    for mode in ("finetune", "continue"):
        run_dir = tmp_path / f"run-{mode}"
        run(["train", tmp_path / "train.yaml", "--run-dir", run_dir,
             "--set", f"data.path={tmp_path / 'tokens'}", "--set", f"data.tokenizer={ckpt / 'tokenizer.json'}",
             "--set", f"checkpoint.init_from={ckpt}", "--set", f"checkpoint.init_mode={mode}"])
        lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [m for m in lines if m["split"] == "train"]
        assert [m["step"] for m in train] == [1, 2]
        first[mode] = train[0]["loss"]
        state = json.loads((run_dir / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())
        assert state["step"] == 2 and state["adam_step"] == 2
    # Zero moments at step 0 are exactly a fresh optimizer: both modes take the same first step.
    assert first["finetune"] == first["continue"]
    # The run folder converts back (its newest checkpoint), tokenizer and chat template included.
    r = convert(tmp_path / "run-continue", tmp_path / "export", "hf")
    assert r["input_format"] == "lathe" and r["input"].endswith("step-00000002")
    for f in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (tmp_path / "export" / f).exists(), f


# ---- errors ----

def write_tensors(folder, tensors, config_path, config_edit=None):
    """A one-file checkpoint of `tensors` (name -> (dtype, shape, bytes)) with a copy of a config."""
    folder.mkdir()
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    cfg = json.loads(Path(config_path).read_text())
    if config_edit:
        config_edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def write_variant(folder, case, drop=(), config_edit=None):
    """A copy of a model fixture without the tensors in `drop`."""
    tensors = {k: v for k, v in read_checkpoint(MODELS / case).items() if k not in drop}
    return write_tensors(folder, tensors, MODELS / case / "config.json", config_edit)


def test_errors_name_the_tensor_and_leave_nothing(tmp_path):
    bad = write_variant(tmp_path / "missing", "mistral", drop={"lm_head.weight"})
    p = run(["convert", bad, tmp_path / "out", "--to", "lathe"], check=False)
    assert p.returncode == 2
    assert "lm_head.weight" in p.stderr and "tie_word_embeddings" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".")] == []

    bad = write_variant(tmp_path / "arch", "llama", config_edit=lambda c: c.update(architectures=["MambaForCausalLM"]))
    p = run(["convert", bad, tmp_path / "out", "--to", "lathe"], check=False)
    assert p.returncode != 0 and "MambaForCausalLM" in p.stderr, p.stderr

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    p = run(["convert", MODELS / "gpt2", tmp_path / "busy", "--to", "hf"], check=False)
    assert p.returncode == 2 and "--overwrite" in p.stderr
    run(["convert", MODELS / "gpt2", tmp_path / "busy", "--to", "hf", "--overwrite"])
    assert not (tmp_path / "busy" / "x").exists()

    p = run(["convert", MODELS / "gpt2", tmp_path / "o2", "--to", "hf", "--max-shard-size", "5 parsecs"], check=False)
    assert p.returncode == 2 and "--max-shard-size" in p.stderr

    # A depth far beyond the checkpoint's layers: refused at once, before a table of that depth.
    bad = write_variant(tmp_path / "deep", "llama",
                        config_edit=lambda c: c.update(num_hidden_layers=10_000_000))
    t0 = time.monotonic()
    p = run(["convert", bad, tmp_path / "out", "--to", "lathe"], check=False)
    assert p.returncode == 2 and "num_hidden_layers is 10000000, but the checkpoint's layers end at" \
        in p.stderr, p.stderr
    assert time.monotonic() - t0 < 10


# ---- against transformers (torch for the models; the tokenizer test needs only transformers) ----

@pytest.mark.parametrize("case", CASES)
def test_transformers_loads_lathe_output(case, tmp_path):
    import torch
    from safetensors.torch import load_file
    ref = load_file(str(MODELS / case / "reference.safetensors"))
    meta = json.loads((MODELS / case / "reference.json").read_text())
    convert(MODELS / case, tmp_path / "lathe", "lathe")
    kwargs = {}
    if meta["packed"]:
        kwargs["position_ids"] = ref["positions"].long()
    for dtype in ("fp32", "bf16", "fp16"):
        out = tmp_path / f"hf-{dtype}"
        convert(tmp_path / "lathe", out, "hf", "--dtype", dtype)
        tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        model = transformers.AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager")
        assert model.dtype == tdtype  # torch_dtype in config.json is honoured
        if dtype != "fp32":
            # lathe's narrow weights are torch's .to(dtype) of the originals, bit for bit.
            original = transformers.AutoModelForCausalLM.from_pretrained(
                str(MODELS / case), attn_implementation="eager", dtype=torch.float32)
            want = {k: v.to(tdtype) for k, v in original.state_dict().items()}
            for k, v in model.state_dict().items():
                assert v.dtype == tdtype and torch.equal(v, want[k]), k
            continue
        model = model.eval()
        with torch.no_grad():
            logits = model(input_ids=ref["tokens"].long(), use_cache=False, **kwargs).logits
        err = ((logits - ref["logits"]).abs().max() / ref["logits"].abs().max()).item()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ref["targets"].long().reshape(-1), ignore_index=-100).item()
        print(f"[transformers on lathe output] {case}: logits rel err {err:.3g}, loss {loss!r} vs {meta['loss']!r}")
        assert err < 1e-4
        assert abs(loss - meta["loss"]) / meta["loss"] < 1e-4


def test_transformers_loads_converted_tokenizer_and_chat_template(tmp_path):
    convert(EVAL / "hf", tmp_path / "lathe", "lathe")
    convert(tmp_path / "lathe", tmp_path / "hf", "hf")
    messages = [{"role": "user", "content": "Convert this checkpoint, please."},
                {"role": "assistant", "content": "Done: every tensor is bit-identical."}]
    a = transformers.AutoTokenizer.from_pretrained(str(EVAL / "hf"))
    b = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert a.apply_chat_template(messages, tokenize=False) == b.apply_chat_template(messages, tokenize=False)
    assert a("safetensors header")["input_ids"] == b("safetensors header")["input_ids"]
    g = transformers.GenerationConfig.from_pretrained(str(tmp_path / "hf"))
    assert g.bos_token_id == 1 and g.eos_token_id == 2
