"""`lathe generate --tensor-parallel 2` under `mpirun --oversubscribe -np 2` on the CPU
(src/infer/tensor_parallel.h, docs/INFERENCE.md "Tensor parallel").

  - greedy output is token-identical to the one-process run (which tests/test_generate.py holds to
    transformers' greedy output) for Llama (GQA, 2 key/value heads), Qwen2 (q/k/v biases) and a
    Llama with every bias (the output projection's and the MLP's, added once after the reduce),
    with prompts of different lengths in one batch; the Llama run also equals transformers';
  - sampled output with a seed equals the one-process run's (every rank takes rank 0's tokens);
  - --random-weights draws a model from a seed alone, with no safetensors in the folder (each rank
    draws its shard, so a two-rank model is not the one-process model of the same seed);
  - refusals name the flag and the numbers: --tensor-parallel without as many processes, a T that
    does not divide the key/value heads, families whose projections have no head shards, and bad
    input read by rank 0 ends every rank with `lathe: error:` and leaves no output;
  - `lathe serve --tensor-parallel 2` (rank 0 serves, rank 1 replays its engine calls) answers the
    openai client with one-process `lathe generate`'s greedy text, one at a time, streamed and
    from concurrent clients; echo log-probabilities and a refused request leave it serving; a
    SIGTERM to rank 0 stops both ranks with exit code 0;
  - `lathe bench --generate --tensor-parallel 2` prints rank 0's line alone, with one rank's share
    of the flops and bytes, and refuses a T other than the process count.
"""
import json
import os
import shutil
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import openai

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


# ---- lathe serve --tensor-parallel 2 ----

@pytest.fixture(scope="module")
def tok_folder(tmp_path_factory):
    from test_generate import with_tokenizer
    f, _ = with_tokenizer(tmp_path_factory.mktemp("serve_tp"))
    return f


def rank0_pid(mpirun_pid):
    """The pid of rank 0 among mpirun's children (OMPI_COMM_WORLD_RANK in its environment)."""
    kids = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True,
                          text=True).stdout.split()
    for k in kids:
        env = Path(f"/proc/{k}/environ").read_bytes().split(b"\0")
        if b"OMPI_COMM_WORLD_RANK=0" in env:
            return int(k)
    raise AssertionError(f"no rank 0 among mpirun's children {kids}")


@contextmanager
def serve_tp(folder, *flags):
    """`mpirun -np 2 lathe serve --tensor-parallel 2` on a free port; yields its base URL; stops
    it with SIGTERM to rank 0, which stops serving and releases rank 1: both exit with 0, and so
    does mpirun."""
    cmd = [MPIRUN, "--oversubscribe", "-np", "2", LATHE, "serve", "--checkpoint", str(folder),
           "--port", "0", "--device", "cpu", "--max-len", "96", "--tensor-parallel", "2",
           *map(str, flags)]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                         env=mpi_env())
    seen = ""
    while True:
        line = p.stderr.readline()
        seen += line
        if "http://" in line or not line:
            break
    if "http://" not in line:
        p.kill()
        raise AssertionError(f"lathe serve did not start: {seen}{p.stderr.read()}")
    assert "tensor parallel 2" in line
    url = "http://" + line.split("http://")[1].split()[0]
    try:
        yield url
    finally:
        if p.poll() is None:
            os.kill(rank0_pid(p.pid), signal.SIGTERM)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError("mpirun lathe serve did not stop on SIGTERM to rank 0")
        rest = p.stderr.read()
        assert rc == 0, rest
        assert "stopping" in rest


def test_serve_tp2_equals_generate(tok_folder, tmp_path):
    # The reference: one-process `lathe generate`, greedy, and a seeded sample.
    rows = [{"prompt_ids": p} for p in PROMPTS]
    out = tmp_path / "ref.jsonl"
    run(["generate", "--checkpoint", tok_folder, "--input", write_jsonl(tmp_path / "in.jsonl", rows),
         "--output", out, "--temperature", 0, "--max-new-tokens", NEW, "--device", "cpu"])
    want = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    with serve_tp(tok_folder, "--max-seqs", 3) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        for p, w in zip(PROMPTS, want):
            r = c.completions.create(model="m", prompt=p, max_tokens=NEW, temperature=0)
            assert r.choices[0].text == w
        # Streamed, and concurrent clients over 3 engine sequences (joining and leaving).
        parts = [ch.choices[0].text for ch in c.completions.create(
            model="m", prompt=PROMPTS[1], max_tokens=NEW, temperature=0, stream=True)]
        assert "".join(parts) == want[1]
        jobs = [PROMPTS[i % 4] for i in range(10)]
        with ThreadPoolExecutor(10) as ex:
            got = list(ex.map(lambda p: c.completions.create(
                model="m", prompt=p, max_tokens=NEW, temperature=0).choices[0].text, jobs))
        assert got == [want[i % 4] for i in range(10)]
        # Echo with log-probabilities (prefill_all on every rank) and a refused request; the
        # server goes on after it.
        r = c.completions.create(model="m", prompt=PROMPTS[0], max_tokens=0, echo=True,
                                 logprobs=1)
        assert len(r.choices[0].logprobs.token_logprobs) == len(PROMPTS[0])
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model="m", prompt=[10**6], max_tokens=2)
        r = c.completions.create(model="m", prompt=PROMPTS[2], max_tokens=NEW, temperature=0)
        assert r.choices[0].text == want[2]


def test_serve_tp_needs_as_many_processes(tok_folder):
    p = run(["serve", "--checkpoint", tok_folder, "--port", "0", "--device", "cpu",
             "--tensor-parallel", 2], check=False, timeout=60)
    assert p.returncode != 0
    assert "--tensor-parallel 2" in p.stderr and "processes of this job, 1" in p.stderr


def bench_line(ranks, *extra):
    args = ["bench", "--generate", "--config", MODELS / "llama" / "config.json", "--device", "cpu",
            "--prefill", "32", "--decode-batches", "1,2", "--prompt-len", "8", "--decode-steps",
            "3", *extra]
    p = run_ranks(ranks, args + ["--tensor-parallel", ranks]) if ranks > 1 else run(args)
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, p.stdout  # rank 0's line alone
    return json.loads(lines[0])


def test_bench_generate_tensor_parallel_reports_rank_0s_share():
    # `lathe bench --generate --tensor-parallel 2` under mpirun: one line, every measurement
    # there, and the flops and bytes of one rank's shard: the layers' halved, the replicated
    # embedding and LM head whole (so between half and all of the one-process figures).
    one, two = bench_line(1), bench_line(2)
    assert one["tensor_parallel"] == 1 and two["tensor_parallel"] == 2
    assert [r["batch"] for r in two["decode"]] == [1, 2]
    assert [r["tokens"] for r in two["prefill"]] == [32]
    for key in ("weight_bytes", "kv_bytes_per_position"):
        assert one[key] / 2 <= two[key] < one[key], key
    assert two["kv_bytes_per_position"] == one["kv_bytes_per_position"] / 2  # Hkv / 2 heads
    f1, f2 = one["prefill"][0]["flops"], two["prefill"][0]["flops"]
    assert f1 / 2 < f2 < f1


def test_bench_generate_tensor_parallel_must_match_the_processes():
    p = run_ranks(2, ["bench", "--generate", "--config", MODELS / "llama" / "config.json",
                      "--device", "cpu", "--prefill", "32", "--decode-batches", "",
                      "--tensor-parallel", 3], check=False)
    assert p.returncode != 0
    assert "--tensor-parallel 3 must equal the number of processes of this job, 2" in p.stderr
    assert "lathe bench --generate ..." in p.stderr
