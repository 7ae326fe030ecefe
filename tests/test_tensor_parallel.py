"""Tensor-parallel `lathe train` (parallel.tensor: T): groups of T consecutive ranks share every
layer (infer/tensor_parallel.h's shards), the ranks of one tensor rank form a data-parallel group.

On the CPU the ranks run under `mpirun --oversubscribe -np N` (MPI collectives); this is the part CI
runs. The contract checked here:
  - TP = 2 and 4 (and TP = 2 x DP = 2 at ZeRO 1, 2 and 3, and TP = 2 with full or selective
    recompute), with the embedding and the LM head split by vocabulary rows (the shards' softmax
    statistics combined over the group), log the per-step losses and gradient norms of one
    process within 1e-5 relative, with sequence parallel (the default: the residual stream's rows
    cut over the tensor ranks, model/block.h) and without it (parallel.sequence_parallel false);
    sequence parallel plans 1/T of each layer's residual-stream tensors, and a micro-batch whose
    rows do not cut into T equal shares (or into the overlap's T x chunks) is refused naming the
    keys; the overlap's settings (two chunks, four, off) log the same losses;
    for a GQA Llama (8 heads, 4 key/value heads, untied head) and a Qwen2 (q/k/v biases): the
    ranks add the partial sums of the attention-output and down projections, and of the
    norm-output gradients, in another order than one process's GEMM does (f32, a few terms:
    ~1e-7 relative), a hundred times under 1e-5; and a Mistral with a tied embedding and a sliding
    window at TP = 2, TP = 4 and TP = 2 x DP = 2;
  - the seed gives every layout the weights of one process: with lr 0 the saved Hugging Face folder
    holds the same bytes as one process's; after training, the same tensors within 1e-5 of each
    tensor's norm times the steps (WEIGHT_NORMS), the key biases excepted (their gradient is zero
    up to rounding, which AdamW turns into steps of about lr either way);
  - the optimizer state resumes at the same parallel.tensor, with more data-parallel ranks and
    another ZeRO stage, and at another parallel.tensor (1 -> 2, 2 -> 1, 2 -> 4: converted): the
    losses of a run never stopped; an offloaded optimizer refuses another layout naming both;
  - a T that does not divide the heads, the key/value heads, the MLP width, the vocabulary or the
    ranks, and the GPT-2 family, are refused with `lathe: error:` naming parallel.tensor;
  - SIGTERM to one rank of a tensor group stops every rank after the same step, with a checkpoint
    (the stop request travels with the tensor group's norm gather).
On two or more GPUs (skipped otherwise) `lathe launch --gpus 2` runs TP = 2 against one GPU; on four
(skipped otherwise) `lathe launch --gpus 4` runs TP = 4 and TP = 2 x DP = 2 against one GPU.
"""
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import NEEDS_CUDA
from corpus import write_gcide_jsonl
from lathe_cli import LATHE, run, tokenize_corpus
from lathe_cli import wait_for_step
from test_data_parallel import (assert_metrics_close, gpu_count, metric_lines, mpi_env,
                                mpirun_args, needs_mpirun, rank_pids, run_ranks, stop_job,
                                train_args)

ROOT = Path(__file__).resolve().parent.parent
CPU_RTOL = 1e-5

LLAMA = """
model:
  family: llama
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 2
  num_attention_heads: 8
  num_key_value_heads: 4
  max_position_embeddings: 64
  tie_word_embeddings: false
data:
  split: "90,10,0"
  seq_length: 16
train:
  steps: 4
  micro_batch_size: 2
  gradient_accumulation_steps: 1
  log_interval: 1
  eval_interval: 2
  eval_iters: 2
  threads: 1
  device: cpu
optimizer:
  lr: 3.0e-3
lr:
  warmup: 0.1
checkpoint:
  interval: 2
  keep_last: 0
"""
QWEN2 = LLAMA.replace("family: llama", "family: qwen2").replace("num_attention_heads: 8",
                                                                "num_attention_heads: 4")
# Mistral: a tied embedding (the LM head is the embedding, replicated) and a sliding window.
MISTRAL = LLAMA.replace("family: llama", "family: mistral").replace(
    "tie_word_embeddings: false", "tie_word_embeddings: true\n  sliding_window: 8")
GPT2 = LLAMA.replace("family: llama", "family: gpt2")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp_corpus")
    write_gcide_jsonl(d / "c.jsonl", 100_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 300)
    data = f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n"
    for name, text in (("llama", LLAMA), ("qwen2", QWEN2), ("mistral", MISTRAL), ("gpt2", GPT2)):
        (d / f"{name}.yaml").write_text(text + data)
    return d


def train(corpus, family, run_dir, ranks, tensor, *sets, check=True):
    args = train_args(corpus / f"{family}.yaml", run_dir, f"parallel.tensor={tensor}", *sets)
    if ranks == 1:
        return run(args[1:], env=mpi_env(), check=check)
    return run_ranks(ranks, args, check=check)


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """runs(family, ranks, tensor, *sets): the run folder, trained on first use."""
    d = tmp_path_factory.mktemp("tp_runs")
    made = {}

    def get(family, ranks, tensor, *sets):
        key = (family, ranks, tensor) + sets
        if key not in made:
            run_dir = d / "_".join(str(k).replace("=", "-").replace(".", "-") for k in key)
            train(corpus, family, run_dir, ranks, tensor, *sets)
            made[key] = run_dir
        return made[key]
    return get


# WEIGHT_NORMS: the trained weights are compared tensor by tensor through the norm of their
# difference. Every gradient comes through the LM head, whose softmax takes the lse combined over
# the vocabulary shards: each shard's lse rounded to f32 and the combination's f32 steps move lse
# by a few 2^-24 relative (~1e-6 absolute at lse ~ 6), hence each probability by ~1e-6 relative,
# where one process's logits meet one f64 sum. AdamW divides the moments elementwise, so an
# element whose gradient cancels over the rows (its first moment a few percent of the root of its
# second) turns that into a step error 30 or more times larger (measured after 4 steps: one
# element of the 384 x 32 head 9.5e-6 off, 1.2e-4 of the tensor's largest weight; one of a
# 32 x 64 down projection at TP 4, 5e-5 of it). Such elements are few: the difference's norm stays
# within 1e-5 of the tensor's norm per step, which a missing or doubled shard (whole rows off by
# about lr) exceeds a hundred times.


def final_model(run_dir):
    return load_file(run_dir / "checkpoints" / "step-00000004" / "model.safetensors")


@needs_mpirun
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("tensor", [2, 4])
def test_tensor_parallel_logs_the_losses_of_one_process(runs, family, tensor):
    one, tp = runs(family, 1, 1), runs(family, tensor, tensor)
    worst = assert_metrics_close(metric_lines(tp), metric_lines(one), CPU_RTOL,
                                 f"{family} TP={tensor}")
    print(f"{family} TP={tensor}: largest relative difference {worst:.3g}")
    a, b = final_model(one), final_model(tp)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].shape == b[name].shape, name
        if name.endswith("k_proj.bias"):
            # Its gradient is zero up to rounding (a key bias adds the same amount to every
            # score of a query, which the softmax cancels): AdamW steps it by about lr in the
            # direction of that rounding noise, in any layout.
            continue
        # The tensor as a whole (its norm), see WEIGHT_NORMS.
        diff = float(np.linalg.norm(a[name] - b[name]))
        assert diff <= CPU_RTOL * 4 * float(np.linalg.norm(a[name])), name
    ckpt = tp / "checkpoints" / "step-00000004"
    assert (ckpt / "config.json").read_bytes() == \
           (one / "checkpoints" / "step-00000004" / "config.json").read_bytes()
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("tensor-rank")) == \
           [f"tensor-rank-{r:05d}-of-{tensor:05d}" for r in range(tensor)]


@needs_mpirun
@pytest.mark.parametrize("family, ranks, tensor", [("llama", 2, 2), ("qwen2", 4, 4),
                                                   ("llama", 4, 2)])
def test_tensor_parallel_without_sequence_parallel_logs_the_losses_of_one_process(runs, family,
                                                                                 ranks, tensor):
    # Every rank keeps every row of the residual stream; the partial sums are all-reduced.
    sets = () if ranks == tensor else ("train.gradient_accumulation_steps=2",)
    one = runs(family, 1, 1, *sets)
    off = runs(family, ranks, tensor, "parallel.sequence_parallel=false")
    assert_metrics_close(metric_lines(off), metric_lines(one), CPU_RTOL,
                         f"{family} {ranks} ranks, TP={tensor}, sequence parallel off")


def activation_bytes(run_dir):
    text = (run_dir / "memory_plan.txt").read_text()
    m = re.search(r"^  activations\s+(\d+) B", text, re.MULTILINE)
    assert m, text
    return int(m.group(1))


@needs_mpirun
@pytest.mark.parametrize("ranks, tensor, setting", [(2, 2, "parallel.tensor_overlap=false"),
                                                    (2, 2, "parallel.tensor_overlap_chunks=2"),
                                                    (4, 4, "parallel.tensor_overlap_chunks=4")])
def test_overlap_settings_log_the_losses_of_one_process(runs, ranks, tensor, setting):
    # The chunks cut the rows otherwise (model/block.h) and split the forward's GEMMs by rows;
    # each row is still summed over the same partials. (The default, overlap with one chunk, is
    # every other test's.)
    assert_metrics_close(metric_lines(runs("llama", ranks, tensor, setting)),
                         metric_lines(runs("llama", 1, 1)), CPU_RTOL, f"TP {tensor}, {setting}")


@needs_mpirun
@pytest.mark.parametrize("tensor", [2, 4])
def test_sequence_parallel_plans_a_shard_of_the_residual_stream(runs, tensor):
    # Per layer x, x_mid, ln1_out and ln2_out (N C f32 each, N = 2 x 16 rows, C = 32) shrink to
    # N / T rows, and the last block's output too: at least (1 - 1/T) (4 L + 1) N C 4 bytes less
    # (the statistics save more, by less than their alignment).
    on, off = runs("llama", tensor, tensor), runs("llama", tensor, tensor,
                                                  "parallel.sequence_parallel=false")
    N, C, L = 2 * 16, 32, 2
    saved = activation_bytes(off) - activation_bytes(on)
    assert saved >= (4 * L + 1) * N * C * 4 * (tensor - 1) // tensor, (saved, tensor)
    assert f"sequence parallel over {tensor} ranks: {N // tensor} of the {N} rows" in \
        (on / "memory_plan.txt").read_text()
    assert "sequence parallel" not in (off / "memory_plan.txt").read_text()


@needs_mpirun
def test_rows_that_do_not_cut_into_equal_shares_are_refused_naming_the_keys(corpus, tmp_path):
    p = train(corpus, "llama", tmp_path / "rows", 2, 2, "train.micro_batch_size=1",
              "data.seq_length=15", check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr, p.stderr
    for key in ("parallel.sequence_parallel", "train.micro_batch_size", "data.seq_length",
                "parallel.tensor"):
        assert key in p.stderr, (key, p.stderr)
    assert "train.micro_batch_size 1 x data.seq_length 15 = 15 is not a multiple of 2" in p.stderr, \
        p.stderr
    # Rows that cut over the ranks but not into the overlap's chunks: refused naming that key.
    p = train(corpus, "llama", tmp_path / "chunks", 2, 2, "train.micro_batch_size=1",
              "data.seq_length=14", "parallel.tensor_overlap_chunks=2", check=False)
    assert p.returncode != 0 and "lathe: error:" in p.stderr, p.stderr
    for key in ("parallel.tensor_overlap_chunks", "train.micro_batch_size", "data.seq_length"):
        assert key in p.stderr, (key, p.stderr)
    assert "= 14 is not a multiple of 2 x 2" in p.stderr, p.stderr
    # Without sequence parallel every rank keeps every row: the same shape trains.
    train(corpus, "llama", tmp_path / "rows_off", 2, 2, "train.micro_batch_size=1",
          "data.seq_length=15", "parallel.sequence_parallel=false", "train.steps=1",
          "train.eval_interval=0")


@needs_mpirun
@pytest.mark.parametrize("ranks, tensor", [(2, 2), (4, 4), (4, 2)])
def test_tensor_parallel_mistral_with_a_tied_embedding(runs, ranks, tensor):
    # The tied head is the embedding's vocabulary shard: its gradient sums the head's and the
    # embedding's on the rows the rank holds. TP 2 x DP 2 against one process of accumulation 2.
    sets = () if ranks == tensor else ("train.gradient_accumulation_steps=2",)
    one, tp = runs("mistral", 1, 1, *sets), runs("mistral", ranks, tensor)
    assert_metrics_close(metric_lines(tp), metric_lines(one), CPU_RTOL,
                         f"mistral {ranks} ranks, TP={tensor}")
    # The tied embedding (the shards' rows gathered into one tensor) within WEIGHT_NORMS's bound.
    # Its layers are not compared: one element of layer 0's down projection has an AdamW update
    # that cancels, which moves it by 2.8e-5 of the tensor's norm after 4 steps with a whole head
    # at TP 2 and by 1.3e-4 with the vocabulary-parallel one (measured); the llama and qwen2
    # runs compare every tensor.
    a, b = final_model(one), final_model(tp)
    assert sorted(a) == sorted(b) and "lm_head.weight" not in b
    name = "model.embed_tokens.weight"
    diff = float(np.linalg.norm(a[name] - b[name]))
    assert diff <= CPU_RTOL * 4 * float(np.linalg.norm(a[name])), name


@needs_mpirun
@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_tensor_parallel_with_recompute(runs, recompute):
    # Full recompute runs each layer's forward again in the backward, its sums included.
    assert_metrics_close(metric_lines(runs("llama", 2, 2, f"train.recompute={recompute}")),
                         metric_lines(runs("llama", 1, 1)), CPU_RTOL, f"recompute {recompute}")


@needs_mpirun
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_tensor_2_by_data_2_logs_the_losses_of_one_process(runs, zero):
    # Two data-parallel ranks of micro-batch 2: one process of micro-batch 2 and accumulation 2.
    one = runs("llama", 1, 1, "train.gradient_accumulation_steps=2")
    both = runs("llama", 4, 2, f"parallel.zero_stage={zero}")
    assert_metrics_close(metric_lines(both), metric_lines(one), CPU_RTOL, f"TP 2 x DP 2 ZeRO-{zero}")


@needs_mpirun
@pytest.mark.parametrize("ranks, zero", [(2, 1), (4, 2)])
def test_sequence_parallel_with_accumulation_logs_the_losses_of_one_process(runs, ranks, zero):
    # Two micro-batches a step per rank: the norms' partial gradients accumulate over both and
    # are summed over the tensor group once, after the last (with ZeRO-2 from each rank's shard).
    accum = 2 * (ranks // 2)
    one = runs("llama", 1, 1, f"train.gradient_accumulation_steps={accum}")
    sp = runs("llama", ranks, 2, "train.gradient_accumulation_steps=2",
              f"parallel.zero_stage={zero}")
    assert_metrics_close(metric_lines(sp), metric_lines(one), CPU_RTOL,
                         f"TP 2 x DP {ranks // 2}, accumulation 2, ZeRO-{zero}")


@needs_mpirun
@pytest.mark.parametrize("ranks, tensor, sequence_parallel", [(2, 2, 1), (4, 2, 1), (2, 2, 0)])
def test_bench_plans_a_tensor_rank_as_lathe_train_does(runs, ranks, tensor, sequence_parallel):
    # `lathe bench --plan-only --plan-ranks N --plan-tensor T` (the sizing tool of
    # docs/DISTRIBUTED.md) prints the plan `lathe train` wrote for its rank 0, byte for byte, with
    # sequence parallelism (both by default) and without.
    sets = () if sequence_parallel else ("parallel.sequence_parallel=false",)
    run_dir = runs("llama", ranks, tensor, *sets)
    written = (run_dir / "memory_plan.txt").read_text()
    p = run(["bench", "--config",
             run_dir / "checkpoints" / "step-00000004" / "config.json", "--batch", 2, "--seq", 16,
             "--device", "cpu", "--plan-only", "--plan-ranks", ranks, "--plan-tensor", tensor,
             "--plan-sequence-parallel", sequence_parallel])
    for key in ("total", "activations", "scratch"):
        line = [l for l in written.splitlines() if l.strip().startswith(key)]
        assert line and line[0] in p.stderr, (key, written, p.stderr)
    assert json.loads(p.stdout.strip().splitlines()[-1])["plan_tensor"] == tensor


def test_bench_plan_tensor_is_refused_where_it_does_not_divide(tmp_path):
    p = run(["bench", "--preset", "llama3-8b", "--batch", 1, "--seq", 4096, "--device",
             "cuda", "--plan-only", "--plan-ranks", 3, "--plan-tensor", 3], check=False)
    assert p.returncode != 0 and "lathe: error: --plan-tensor 3 must divide" in p.stderr
    p = run(["bench", "--preset", "llama3-8b", "--batch", 1, "--seq", 4096, "--device",
             "cuda", "--plan-only", "--plan-ranks", 4, "--plan-tensor", 8], check=False)
    assert p.returncode != 0 and "--plan-tensor 8 must divide --plan-ranks 4" in p.stderr
    # lathe train refuses fp8 under tensor parallel, so the plan tool does too.
    p = run(["bench", "--preset", "llama3-8b", "--batch", 1, "--seq", 4096, "--device",
             "cuda", "--plan-only", "--plan-ranks", 4, "--plan-tensor", 4, "--precision", "fp8"],
            check=False)
    assert p.returncode != 0 and "lathe: error: --precision fp8 with --plan-tensor 4" in p.stderr


@needs_mpirun
@pytest.mark.parametrize("tensor", [2, 4])
def test_the_seed_gives_every_layout_the_weights_of_one_process(runs, tensor):
    one, tp = runs("qwen2", 1, 1, "optimizer.lr=0"), runs("qwen2", tensor, tensor, "optimizer.lr=0")
    a = one / "checkpoints" / "step-00000004" / "model.safetensors"
    b = tp / "checkpoints" / "step-00000004" / "model.safetensors"
    assert a.read_bytes() == b.read_bytes()


def stopped_at_step_2(run_dir, tmp_path, name):
    """A copy of run_dir without its last checkpoint: a run to resume from step 2."""
    copy = tmp_path / name
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "step-00000004")
    return copy


@needs_mpirun
@pytest.mark.parametrize("before, after", [(2, 2), (2, 4), (2, 1), (1, 2)])
def test_a_checkpoint_resumes_at_any_tensor_size(corpus, runs, tmp_path, before, after):
    # The optimizer state of another parallel.tensor is converted (each tensor's moments
    # assembled from the ranks that wrote them and sliced for the new ones): the losses of the
    # run never stopped.
    resumed = stopped_at_step_2(runs("llama", before, before), tmp_path, "resumed")
    p = train(corpus, "llama", resumed, after, after)
    assert "resuming from" in p.stderr, p.stderr
    assert ("converting the optimizer state" in p.stderr) == (before != after), p.stderr
    assert_metrics_close(metric_lines(resumed), metric_lines(runs("llama", 1, 1)), CPU_RTOL,
                         f"TP {before} -> {after}")


@needs_mpirun
def test_sigterm_to_one_rank_of_a_tensor_group_stops_the_whole_group(corpus, tmp_path):
    # Pure tensor parallel (TP 2, DP 1): rank 1 alone gets SIGTERM. Both ranks must stop after
    # the same step and publish its checkpoint; a stop agreed inside the data-parallel group alone
    # would leave rank 0 waiting in the next step's tensor-parallel sum until the timeout.
    run_dir = tmp_path / "stop"
    args = train_args(corpus / "llama.yaml", run_dir, "parallel.tensor=2", "train.steps=100000",
                      "checkpoint.interval=100000", "train.eval_interval=100000")
    p = subprocess.Popen(mpirun_args(2, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=mpi_env())
    try:
        wait_for_step(run_dir, 3, p)
        pids = rank_pids(p.pid)
        assert sorted(pids) == [0, 1], pids
        os.kill(pids[1], signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        stop_job(p)
    assert p.returncode != 0 and "stopped by" in err, (p.returncode, err)
    steps = sorted(d.name for d in (run_dir / "checkpoints").glob("step-*"))
    assert len(steps) == 1, steps
    last = metric_lines(run_dir)[-1]["step"]
    assert steps[0] == f"step-{last:08d}", (steps, last)


@needs_mpirun
def test_an_offloaded_optimizer_refuses_another_tensor_size(corpus, runs, tmp_path):
    other = stopped_at_step_2(runs("llama", 2, 2), tmp_path, "other")
    p = train(corpus, "llama", other, 1, 1, "optimizer.offload=cpu", check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr
    assert "parallel.tensor 2, this run has parallel.tensor 1" in p.stderr, p.stderr


@needs_mpirun
def test_a_checkpoint_resumes_at_its_tensor_size_with_more_data_parallel_ranks(corpus, runs,
                                                                                tmp_path):
    # TP 2 x DP 1 with accumulation 2 stopped at step 2, resumed as TP 2 x DP 2 at ZeRO-2 with
    # accumulation 1 (the same global batch): the losses of one process with accumulation 2.
    one = runs("llama", 1, 1, "train.gradient_accumulation_steps=2")
    grown = stopped_at_step_2(runs("llama", 2, 2, "train.gradient_accumulation_steps=2"),
                              tmp_path, "grown")
    p = train(corpus, "llama", grown, 4, 2, "parallel.zero_stage=2")
    assert "resuming from" in p.stderr, p.stderr
    assert_metrics_close(metric_lines(grown), metric_lines(one), CPU_RTOL, "TP 2: DP 1 -> 2")


def test_gpt2_is_refused_naming_the_key_and_the_family(corpus, tmp_path):
    p = train(corpus, "gpt2", tmp_path / "g", 1, 2, check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr and "'parallel.tensor' 2" in p.stderr, p.stderr
    assert "gpt2 family" in p.stderr, p.stderr


@pytest.mark.parametrize("tensor, what, sets", [
    (3, "must divide the attention heads (8), the key/value heads (4) and the MLP width", ()),
    (2, "must divide the number of ranks (1)", ()),
    # The vocabulary is split by rows without padding.
    (4, "4 must divide the vocabulary (390 tokens)", ("model.vocab_size=390",))])
def test_a_tensor_size_that_does_not_divide_is_refused(corpus, tmp_path, tensor, what, sets):
    p = train(corpus, "llama", tmp_path / "t", 1, tensor, *sets, check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr and "parallel.tensor" in p.stderr, p.stderr
    assert what in p.stderr, p.stderr


def test_an_fp8_head_is_refused_naming_both_keys(corpus, tmp_path):
    # Checked with the settings, before the device or the ranks are asked for.
    p = train(corpus, "llama", tmp_path / "f", 1, 2, "train.precision=fp8", "fp8.lm_head=true",
              check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr and "'fp8.lm_head: true' with 'parallel.tensor' 2" in p.stderr, \
        p.stderr


@needs_mpirun
def test_a_checkpoint_without_the_split_vocabulary_is_refused_on_resume(corpus, runs, tmp_path):
    # A tensor-parallel checkpoint whose trainer state does not say its optimizer state splits the
    # vocabulary holds the whole embedding and head per tensor rank: refused, not misread.
    run_dir = stopped_at_step_2(runs("llama", 2, 2), tmp_path, "old")
    for state in run_dir.glob("checkpoints/step-*/trainer_state.json"):
        j = json.loads(state.read_text())
        assert j.pop("tensor_parallel_vocabulary") == "split"
        state.write_text(json.dumps(j))
    p = train(corpus, "llama", run_dir, 2, 2, check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr and "whole vocabulary on every tensor rank" in p.stderr, \
        p.stderr


# ---- GPUs: `lathe launch --gpus 2` ------------------------------------------------------------

# The bf16 tolerance of TP = 2 against one GPU. Every GEMM is the same bf16 x bf16 -> f32 product
# except the attention-output and down projections, whose f32 sums over the inner dimension
# are split in two halves, each rounded to bf16 and added by NCCL in bf16: two bf16 roundings
# (2 u, u = 2^-8) where one GPU rounds once, on the branch outputs of each of the 4 layers, and
# the norm-output gradients the same way. A per-layer relative perturbation of u of a branch
# output moves the loss by at most about u (the final norm renormalizes the stream); the 4 layers'
# two branches, forward and backward, stay under 2^-6 of the loss at the first steps, and AdamW
# keeps later steps within it (test_data_parallel.py's derivation of the drift: <= 0.075 sqrt(s)).
# The vocabulary-parallel head adds one more such pair on its dx (each shard's part rounded, then
# the bf16 sum); its logits are the same bf16 GEMM outputs, its lse combines them in f32.
GPU_RTOL = 2.0 ** -6


@pytest.fixture(scope="module")
def gpu_corpus(tmp_path_factory):
    n = gpu_count()
    if n < 2:
        pytest.skip(NEEDS_CUDA + f"needs 2 GPUs, nvidia-smi -L lists {n}")
    d = tmp_path_factory.mktemp("tp_gpu_corpus")
    write_gcide_jsonl(d / "c.jsonl", 600_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 384)
    return d


def gpu_args(corpus, run_dir, *sets):
    # configs/tiny.yaml (4 layers, hidden 192, 6 heads, 2 key/value heads, MLP 512) on cuda.
    return train_args(ROOT / "configs" / "tiny.yaml", run_dir, f"data.path={corpus / 'gc'}",
                      f"data.tokenizer={corpus / 'tok.json'}", "train.device=cuda",
                      "train.steps=20", "train.log_interval=1", "train.eval_interval=0",
                      "checkpoint.interval=20", "checkpoint.keep_last=0", *sets)


def gpus_against_one_gpu(corpus, tmp_path, gpus, one_sets, many_sets):
    """One GPU trained with one_sets, then `lathe launch --gpus N` with many_sets: both run folders,
    their metric lines and the largest relative loss difference of a step."""
    one, many = tmp_path / "one", tmp_path / f"gpus{gpus}"
    run(gpu_args(corpus, one, *one_sets)[1:], env=mpi_env())
    p = subprocess.run([str(LATHE), "launch", "--gpus", str(gpus)] +
                       gpu_args(corpus, many, *many_sets),
                       capture_output=True, text=True, timeout=600, env=mpi_env())
    assert p.returncode == 0, p.stderr
    got, want = metric_lines(many), metric_lines(one)
    worst = max(abs(g["loss"] - w["loss"]) / abs(w["loss"]) for g, w in zip(got, want))
    return one, many, got, want, worst


@pytest.mark.parametrize("sequence_parallel", ["true", "false"])
def test_gpus_tensor_2_logs_the_losses_of_one_gpu(gpu_corpus, tmp_path, sequence_parallel):
    # Sequence parallel's reduce-scatters round as the all-reduces they replace (each rank's
    # partial in bf16, NCCL's bf16 sum), its all-gathers copy: the same bound.
    one, two, got, want, worst = gpus_against_one_gpu(
        gpu_corpus, tmp_path, 2, (),
        ("parallel.tensor=2", f"parallel.sequence_parallel={sequence_parallel}"))
    print(f"TP=2 on 2 GPUs vs one GPU: largest relative loss difference {worst:.3g} "
          f"(tolerance {GPU_RTOL:.3g})")
    assert [(m["step"], m["lr"], m["tokens"]) for m in got] == \
           [(m["step"], m["lr"], m["tokens"]) for m in want]
    assert worst <= GPU_RTOL, (got, want)
    a = load_file(one / "checkpoints" / "step-00000020" / "model.safetensors")
    b = load_file(two / "checkpoints" / "step-00000020" / "model.safetensors")
    assert sorted(a) == sorted(b) and all(a[k].shape == b[k].shape for k in a)


# ---- four GPUs: `lathe launch --gpus 4` -------------------------------------------------------

# TP = 4 splits each reduced sum into four bf16 partials, which NCCL's ring adds in bf16 in three
# steps: four roundings of the partials and three of the running sum where one GPU rounds once,
# twice the 2 u of TP = 2 above, so twice its bound. TP 2 x DP 2 keeps TP = 2's roundings and adds
# the data-parallel f32 gradient sum (test_data_parallel.py: a few 2^-24 relative), far under it.
GPU4_RTOL = 2 * GPU_RTOL

# configs/tiny.yaml with 8 heads and 4 key/value heads (head_dim 24) so that four ranks divide both.
GPU4_HEADS = ("model.num_attention_heads=8", "model.num_key_value_heads=4")


@pytest.mark.parametrize("layout, sets", [
    ("TP 4", ("parallel.tensor=4",)),
    ("TP 2 x DP 2", ("parallel.tensor=2",)),
])
def test_four_gpus_log_the_losses_of_one_gpu(gpu_corpus, tmp_path, layout, sets):
    if gpu_count() < 4:
        pytest.skip(NEEDS_CUDA + f"needs 4 GPUs, nvidia-smi -L lists {gpu_count()}")
    # Two data-parallel ranks of micro-batch 8 are one GPU's micro-batch 8 accumulated twice.
    accum = ("train.gradient_accumulation_steps=2",) if "DP" in layout else ()
    _, _, got, want, worst = gpus_against_one_gpu(gpu_corpus, tmp_path, 4,
                                                  (*GPU4_HEADS, *accum), (*GPU4_HEADS, *sets))
    print(f"{layout} on 4 GPUs vs one GPU: largest relative loss difference {worst:.3g} "
          f"(tolerance {GPU4_RTOL:.3g})")
    assert [(m["step"], m["lr"], m["tokens"]) for m in got] == \
           [(m["step"], m["lr"], m["tokens"]) for m in want]
    assert worst <= GPU4_RTOL, (got, want)
