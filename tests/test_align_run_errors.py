"""`lathe align run` checks every path and setting before stage 1 writes anything.

One small, valid configuration (a byte-level tokenizer of the 256 bytes written here, the llama
model fixture, a short corpus and held-out file) is the control: it runs every stage. Each case
below changes one key of it to a bad value, in the YAML file itself, and checks that the run
  * exits non-zero with `lathe: error:`,
  * names the key and the file and line that set it,
  * says what is wrong (a phrase per case),
  * takes less than a second, and
  * leaves align.work_dir absent (no stage output, not even the folder).
"""
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

LATHE = os.environ.get("LATHE_BIN", str(Path(__file__).resolve().parents[1] / "build" / "lathe"))
MODELS = Path(__file__).resolve().parent / "fixtures" / "models"

DOCS = [
    "The patients with chronic heart failure were treated with beta blockers for six months.",
    "Blood pressure was measured twice a day in patients with hypertension and diabetes.",
    "A randomized trial compared the outcomes of surgery and medical therapy in older adults.",
    "The incidence of infection after surgery was lower in the group treated with antibiotics.",
] * 8


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_tokenizer():
    """A byte-level BPE of 256 ids, as Hugging Face writes one: the bytes except 0xFF (never in
    UTF-8 text) and the special token <|endoftext|> as id 255, the model's bos and eos."""
    alphabet = bytes_to_unicode()
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 255, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {**{alphabet[b]: b for b in range(255)}, "<|endoftext|>": 255},
                  "merges": []},
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The files of the valid configuration; returns (folder, the settings as a dict)."""
    assert (MODELS / "llama" / "config.json").exists(), f"{MODELS}/llama is missing"
    d = tmp_path_factory.mktemp("align_run_errors")
    (d / "source.json").write_text(json.dumps(byte_tokenizer()))
    model = d / "model"
    model.mkdir()
    shutil.copy(MODELS / "llama" / "model.safetensors", model / "model.safetensors")
    cfg = json.loads((MODELS / "llama" / "config.json").read_text())
    cfg["bos_token_id"] = cfg["eos_token_id"] = 255
    (model / "config.json").write_text(json.dumps(cfg))
    shutil.copy(d / "source.json", model / "tokenizer.json")
    (d / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS))
    (d / "general.txt").write_text("the cat sat on the mat\n" * 20)
    (d / "held.txt").write_text("\n".join(DOCS[:3]) + "\n")
    (d / "notes.jsonl").write_text(json.dumps({"text": "not a tokenizer"}) + "\n")
    plain = byte_tokenizer()  # loads, but has no words for stage 1 to mine
    plain["pre_tokenizer"] = None
    (d / "no_byte_level.json").write_text(json.dumps(plain))
    prefix = byte_tokenizer()
    prefix["pre_tokenizer"]["add_prefix_space"] = True
    (d / "prefix_space.json").write_text(json.dumps(prefix))
    (d / "a_folder").mkdir()
    (d / "a_file").write_text("x\n")
    (d / "empty_folder").mkdir()
    settings = {
        "align": {"work_dir": str(d / "work"), "threads": 2},
        "source": {"tokenizer": str(d / "source.json"), "checkpoint": str(model)},
        "corpus": {"inputs": [str(d / "corpus.jsonl")]},
        "terms": {"top_k": 5, "min_count": 2, "general": [str(d / "general.txt")]},
        "embed": {"dim": 8, "iters": 1, "min_count": 1, "device": "cpu"},
        "map": {"pivots": 20, "device": "cpu"},
        "apply": {"align_weight": 0.25},
        "eval": {"documents": str(d / "held.txt"), "seq_len": 32, "batch": 2, "device": "cpu"},
    }
    return d, settings


def write_config(path, settings):
    """Writes `settings` as YAML, one key per line; returns {"section.key": line number}."""
    lines, where = [], {}
    for section, keys in settings.items():
        lines.append(f"{section}:")
        for k, v in keys.items():
            lines.append(f"  {k}: {json.dumps(v)}")
            where[f"{section}.{k}"] = len(lines)
    path.write_text("\n".join(lines) + "\n")
    return where


def with_value(settings, key, value):
    """A copy of `settings` with `key` ("section.name") set to `value`."""
    out = json.loads(json.dumps(settings))
    section, name = key.split(".", 1)
    out.setdefault(section, {})[name] = value
    return out


def align_run(config, *extra):
    t0 = time.monotonic()
    p = subprocess.run([LATHE, "align", "run", str(config), "--no-progress", *extra],
                       capture_output=True, text=True, timeout=600)
    return p, time.monotonic() - t0


def test_the_valid_configuration_runs_every_stage(setup):
    """The control: without a bad value the same configuration passes the checks and runs."""
    d, settings = setup
    settings = with_value(settings, "align.work_dir", str(d / "work-valid"))
    config = d / "valid.yaml"
    write_config(config, settings)
    p, _ = align_run(config)
    assert p.returncode == 0, p.stderr
    for stage in ("terms", "prepare source", "embed target", "map", "apply", "eval"):
        assert any(line.split()[:len(stage.split())] == stage.split() and " ran " in line
                   for line in p.stdout.splitlines()), (stage, p.stdout)
    ev = json.loads((d / "work-valid" / "eval.json").read_text())
    assert len(ev["models"]) == 2


# (key, bad value or a function of the setup folder, a phrase the message must hold)
CASES = [
    ("corpus.inputs", lambda d: [str(d / "missing.jsonl")], "missing.jsonl does not exist"),
    ("corpus.inputs", lambda d: [str(d / "a_folder")], "is a folder"),
    ("corpus.inputs", [], "no files"),
    ("terms.corpus", lambda d: [str(d / "missing-domain.jsonl")], "does not exist"),
    ("terms.general", lambda d: [str(d / "missing-general.txt")], "does not exist"),
    ("source.tokenizer", lambda d: str(d / "missing.json"), "does not exist"),
    ("source.tokenizer", lambda d: str(d / "notes.jsonl"), "expected a Hugging Face tokenizer.json"),
    ("target.tokenizer", lambda d: str(d / "a_folder"), "is a folder"),
    ("target.tokenizer", lambda d: str(d / "a_file"), "expected a Hugging Face tokenizer.json"),
    ("source.tokenizer", lambda d: str(d / "no_byte_level.json"), "needs a byte-level BPE tokenizer"),
    ("target.tokenizer", lambda d: str(d / "prefix_space.json"), "add_prefix_space=true"),
    ("source.checkpoint", lambda d: str(d / "no-such-model"), "no such folder"),
    ("source.checkpoint", lambda d: str(d / "empty_folder"), "no config.json"),
    ("eval.documents", lambda d: str(d / "missing-held.txt"), "does not exist"),
    ("eval.documents", lambda d: str(d / "a_folder"), "is a folder"),
    ("align.work_dir", lambda d: str(d / "a_file"), "is not a folder"),
    ("align.work_dir", lambda d: str(d / "a_file" / "below"), "is not a folder"),
    ("align.threads", -1, "must be at least 0"),
    ("terms.top_k", 0, "must be at least 1"),
    ("terms.min_count", 0, "must be at least 1"),
    ("terms.max_ngram", 4, "must be in [1, 3]"),
    ("terms.smoothing", 0.0, "must be positive"),
    ("embed.dim", 0, "must be in [1, 4096]"),
    ("embed.window", -1, "must be in [0, 1000]"),
    ("embed.iters", 0, "must be at least 1"),
    ("embed.min_count", 0, "must be at least 1"),
    ("embed.seed", -1, "must be at least 0"),
    ("map.pivots", 0, "must be at least 1"),
    ("apply.align_weight", 1.5, "must be in [0, 1]"),
    ("apply.align_head_weight", -0.5, "must be in [0, 1]"),
    ("apply.pad_to_multiple", 0, "must be at least 1"),
    ("eval.seq_len", 0, "must be at least 1"),
    ("eval.seq_len", 1 << 20, "exceeds the source model's max_position_embeddings"),
    ("eval.batch", 0, "must be at least 1"),
    ("eval.max_documents", -1, "must be at least 0"),
    ("embed.method", "word2vec", "is not one of glove, sgns"),
]


@pytest.mark.parametrize("key,value,phrase", CASES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(CASES)])
def test_a_bad_value_stops_the_run_before_stage_1(setup, tmp_path, key, value, phrase):
    d, settings = setup
    work = tmp_path / "work"
    settings = with_value(settings, "align.work_dir", str(work))
    if callable(value):
        value = value(d)
    settings = with_value(settings, key, value)
    config = tmp_path / "run.yaml"
    where = write_config(config, settings)
    p, seconds = align_run(config)
    assert p.returncode != 0, p.stdout
    assert "lathe: error:" in p.stderr, p.stderr
    assert key in p.stderr and f"run.yaml:{where[key]}" in p.stderr, p.stderr
    assert phrase in p.stderr, p.stderr
    assert "stage 1/6" not in p.stderr, p.stderr
    assert seconds < 1.0, f"{seconds:.2f} s: {p.stderr}"
    if key != "align.work_dir":
        assert not work.exists(), sorted(str(x) for x in work.rglob("*"))


def test_a_checkpoint_smaller_than_its_tokenizer(setup, tmp_path):
    """A model whose embedding has fewer rows than source.tokenizer has ids was not trained with it."""
    d, settings = setup
    model = tmp_path / "small-model"
    shutil.copytree(settings["source"]["checkpoint"], model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] = 200
    (model / "config.json").write_text(json.dumps(cfg))
    settings = with_value(settings, "align.work_dir", str(tmp_path / "work"))
    settings = with_value(settings, "source.checkpoint", str(model))
    config = tmp_path / "run.yaml"
    where = write_config(config, settings)
    p, seconds = align_run(config)
    assert p.returncode != 0 and f"run.yaml:{where['source.checkpoint']}" in p.stderr, p.stderr
    assert "200 embedding rows" in p.stderr and "256 ids" in p.stderr, p.stderr
    assert seconds < 1.0 and not (tmp_path / "work").exists()


def test_a_checkpoint_without_its_tokenizer_when_eval_needs_it(setup, tmp_path):
    d, settings = setup
    model = tmp_path / "model-no-tokenizer"
    shutil.copytree(settings["source"]["checkpoint"], model)
    (model / "tokenizer.json").unlink()
    settings = with_value(settings, "align.work_dir", str(tmp_path / "work"))
    settings = with_value(settings, "source.checkpoint", str(model))
    config = tmp_path / "run.yaml"
    write_config(config, settings)
    p, seconds = align_run(config)
    assert p.returncode != 0 and "source.checkpoint" in p.stderr and "no tokenizer.json" in p.stderr, p.stderr
    assert seconds < 1.0 and not (tmp_path / "work").exists()


@pytest.mark.parametrize("form", ["run", "run/checkpoints", "run/checkpoints/latest",
                                  "run/checkpoints/step-00000002"])
def test_every_checkpoint_form_is_accepted(setup, tmp_path, form):
    """A run folder, its checkpoints folder, its `latest` marker and a step folder all name the
    checkpoint: the checks resolve them as apply does (the run then stops on a bad key checked
    after the checkpoint, which shows the checkpoint passed)."""
    d, settings = setup
    run = tmp_path / "run"
    shutil.copytree(settings["source"]["checkpoint"], run / "checkpoints" / "step-00000002")
    (run / "checkpoints" / "latest").write_text("step-00000002")
    settings = with_value(settings, "align.work_dir", str(tmp_path / "work"))
    settings = with_value(settings, "source.checkpoint", str(tmp_path / form))
    settings = with_value(settings, "eval.batch", 0)
    config = tmp_path / "run.yaml"
    where = write_config(config, settings)
    p, _ = align_run(config)
    assert p.returncode != 0 and f"run.yaml:{where['eval.batch']}" in p.stderr, p.stderr
    assert "source.checkpoint" not in p.stderr, p.stderr


def test_a_tokenizer_without_words_is_fine_when_no_terms_are_added(setup, tmp_path):
    """Stage 1's byte-level requirement applies only to the tokenizer it adds terms to: with
    terms.enabled false such a target passes the checks (the run stops on a later bad key)."""
    d, settings = setup
    settings = with_value(settings, "align.work_dir", str(tmp_path / "work"))
    settings = with_value(settings, "target.tokenizer", str(d / "no_byte_level.json"))
    settings = with_value(settings, "terms.enabled", False)
    settings = with_value(settings, "eval.batch", 0)
    config = tmp_path / "run.yaml"
    where = write_config(config, settings)
    p, _ = align_run(config)
    assert p.returncode != 0 and f"run.yaml:{where['eval.batch']}" in p.stderr, p.stderr
    assert "byte-level" not in p.stderr, p.stderr


def test_latest_naming_no_checkpoint(setup, tmp_path):
    d, settings = setup
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step-00000009")
    settings = with_value(settings, "align.work_dir", str(tmp_path / "work"))
    settings = with_value(settings, "source.checkpoint", str(run / "checkpoints" / "latest"))
    config = tmp_path / "run.yaml"
    where = write_config(config, settings)
    p, seconds = align_run(config)
    assert p.returncode != 0 and f"run.yaml:{where['source.checkpoint']}" in p.stderr, p.stderr
    assert "step-00000009" in p.stderr, p.stderr
    assert seconds < 1.0 and not (tmp_path / "work").exists()


def gpu_present():
    return shutil.which("nvidia-smi") is not None and \
        subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.mark.skipif(gpu_present(), reason="a GPU is present: `cuda` is a valid choice here")
@pytest.mark.parametrize("key", ["embed.device", "map.device", "eval.device"])
def test_cuda_without_a_gpu_stops_before_stage_1(setup, tmp_path, key):
    d, settings = setup
    work = tmp_path / "work"
    settings = with_value(settings, "align.work_dir", str(work))
    settings = with_value(settings, key, "cuda")
    config = tmp_path / "run.yaml"
    write_config(config, settings)
    p, seconds = align_run(config)
    assert p.returncode != 0 and key in p.stderr, p.stderr
    assert seconds < 1.0 and not work.exists()
