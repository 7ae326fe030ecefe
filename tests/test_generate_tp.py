"""`lathe generate --tensor-parallel 2` under `mpirun --oversubscribe -np 2` on the CPU
(src/infer/tensor_parallel.h, docs/INFERENCE.md "Tensor parallel").

  - greedy output is token-identical to the one-process run (which tests/test_generate.py holds to
    transformers' greedy output) for Llama (GQA, 2 key/value heads), Qwen2 (q/k/v biases) and a
    Llama with every bias (the output projection's and the MLP's, added once after the reduce),
    with prompts of different lengths in one batch; the Llama run also equals transformers';
  - sampled output with a seed equals the one-process run's (every rank takes rank 0's tokens);
  - --random-weights draws a model from a seed alone, the same with one process or two, with no
    safetensors in the folder;
  - refusals name the flag and the numbers: --tensor-parallel without as many processes, a T that
    does not divide the key/value heads, families whose projections have no head shards, and bad
    input read by rank 0 ends every rank with `lathe: error:` and leaves no output.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import transformers

from lathe_cli import LATHE, ROOT, run

MODELS = ROOT / "tests" / "fixtures" / "models"
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(
    MPIRUN is None, reason="needs mpirun (OpenMPI; scripts/install-deps.sh installs it)")
PROMPTS = [[5, 9, 17], [3, 4, 5, 6, 7, 8, 9, 10], [100], [11, 12, 13, 14, 15]]
NEW = 12


def mpi_env():
    """One thread per rank (2 cores) and OpenMPI's consent to run as root (containers)."""
    return dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run_ranks(n, args, check=True, timeout=300):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(n), LATHE] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env())
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_ids(path):
    return [json.loads(line)["ids"] for line in Path(path).read_text().splitlines()]


def generate(tmp_path, name, checkpoint, ranks, *extra):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": p} for p in PROMPTS])
    out = tmp_path / f"{name}.jsonl"
    args = ["generate", "--checkpoint", checkpoint, "--input", inp, "--output", out,
            "--max-new-tokens", NEW, "--batch-size", 3, "--device", "cpu", *extra]
    if ranks == 1:
        run(args)
    else:
        run_ranks(ranks, args + ["--tensor-parallel", ranks])
    return read_ids(out)


@pytest.mark.parametrize("family", ["llama", "qwen2", "llama_bias_packed"])
def test_greedy_tp2_equals_one_process(family, tmp_path):
    one = generate(tmp_path, "tp1", MODELS / family, 1, "--temperature", 0)
    two = generate(tmp_path, "tp2", MODELS / family, 2, "--temperature", 0)
    assert len(two) == len(PROMPTS)
    assert all(len(ids) == NEW for ids in two)
    # f32 on both sides; the shards change only the order of the Wo and down sums (~1e-6
    # relative), far below the top-2 logit gaps of these fixtures (tests/test_generate.py).
    assert two == one


def test_greedy_tp2_equals_transformers(tmp_path):
    two = generate(tmp_path, "tp2", MODELS / "llama", 2, "--temperature", 0)
    model = transformers.AutoModelForCausalLM.from_pretrained(MODELS / "llama",
                                                              dtype=torch.float32)
    for prompt, got in zip(PROMPTS, two):
        want = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False)
        assert got == want[0, len(prompt):].tolist(), f"prompt {prompt}"


def test_sampled_tp2_equals_one_process(tmp_path):
    args = ("--temperature", 0.9, "--top-k", 20, "--seed", 7)
    one = generate(tmp_path, "tp1", MODELS / "qwen2", 1, *args)
    two = generate(tmp_path, "tp2", MODELS / "qwen2", 2, *args)
    assert two == one
    # A different seed changes the output: the seed reached the sampler.
    other = generate(tmp_path, "tp2b", MODELS / "qwen2", 2, "--temperature", 0.9, "--top-k", 20,
                     "--seed", 8)
    assert other != two


def test_random_weights_from_a_config_alone(tmp_path):
    folder = tmp_path / "shape"
    folder.mkdir()
    shutil.copy(MODELS / "llama" / "config.json", folder / "config.json")
    one = generate(tmp_path, "r1", folder, 1, "--temperature", 0, "--random-weights", 3)
    again = generate(tmp_path, "r1b", folder, 1, "--temperature", 0, "--random-weights", 3)
    two = generate(tmp_path, "r2", folder, 2, "--temperature", 0, "--random-weights", 3)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert one == again
    for ids in one + two:
        assert len(ids) == NEW and all(0 <= t < vocab for t in ids)
    # Without --random-weights the folder has no weights to read.
    p = run(["generate", "--checkpoint", folder, "--prompt", "x", "--device", "cpu"],
            check=False)
    assert p.returncode != 0


def test_tensor_parallel_needs_as_many_processes(tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}])
    out = tmp_path / "out.jsonl"
    p = run(["generate", "--checkpoint", MODELS / "llama", "--input", inp, "--output", out,
             "--device", "cpu", "--tensor-parallel", 2], check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr
    assert "--tensor-parallel 2" in p.stderr and "processes of this job, 1" in p.stderr
    assert not out.exists()


@pytest.mark.parametrize("family,words", [
    ("mistral", ["--tensor-parallel 2", "key/value heads (1)"]),
    ("gpt_neox", ["--tensor-parallel 2", "query_key_value"]),
    ("gpt2", ["--tensor-parallel 2", "c_attn"]),
])
def test_refuses_models_that_do_not_split(family, words, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}])
    out = tmp_path / "out.jsonl"
    p = run_ranks(2, ["generate", "--checkpoint", MODELS / family, "--input", inp, "--output", out,
                      "--device", "cpu", "--tensor-parallel", 2], check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr
    for w in words:
        assert w in p.stderr, p.stderr
    assert not out.exists()


def test_bad_input_on_rank0_ends_every_rank(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt_ids": [1, 2]}\n{"prompt_ids": "x"}\n')
    out = tmp_path / "out.jsonl"
    p = run_ranks(2, ["generate", "--checkpoint", MODELS / "llama", "--input", inp, "--output",
                      out, "--device", "cpu", "--tensor-parallel", 2], check=False, timeout=120)
    assert p.returncode != 0
    assert f"{inp}:2" in p.stderr and "prompt_ids" in p.stderr, p.stderr
    assert "rank 0 could not read the input" in p.stderr, p.stderr
    assert not out.exists()
