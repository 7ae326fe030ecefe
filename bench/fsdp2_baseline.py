"""PyTorch FSDP2 (fully_shard) + torch.compile: the sharded data-parallel baseline that `lathe bench`
under `lathe launch` is measured against, beside ../shared/bench/ddp_baseline.py (DDP).

    torchrun --standalone --nproc_per_node=N bench/fsdp2_baseline.py gpt2|llama1b|llama8b
             [--torch-baseline-dir DIR] [--steps 12] [--warmup 4] [--no-compile] [--no-reshard]
             [--checkpoint]

The model is torch_baseline.py's decoder (imported from DIR: default ../shared/bench beside this
checkout, else .carry/bench; a file of the shared bench folder, not of this repository), at the
shapes ddp_baseline.py measures: GPT-2 124M at B 32, T 1024 per GPU and the Llama-3.2-1B shape at
B 8, T 2048 per GPU, so the three trainers run the same work per GPU; and `llama8b`, the whole
Llama-3-8B shape (32 layers, untied, T 8192, B 1 per GPU), the ZeRO-3 rows of docs/PERF.md.

Sharding (what FSDP2 users run, as torchtitan sets it up): each decoder block is compiled on its
own (torch.compile per block, FSDP2's hooks staying outside the compiled code) and then made an
FSDP unit,
the embedding, final norm and tied head are the root unit; parameters are stored fp32, gathered as
bf16 for compute, gradients reduce-scattered in fp32 (MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)); each block's parameters are freed after its forward and gathered again for
its backward (ZeRO-3), except the last block's, which its backward needs at once.
--no-reshard keeps them after the forward (ZeRO-2's memory, less traffic). --checkpoint recomputes
each block's activations in the backward (torch.utils.checkpoint around the block), as torchtitan's
full activation checkpointing does.

Timing as ddp_baseline.py: `warmup` untimed steps, a barrier, then `steps` steps each timed to a
device synchronize; the median. Rank 0 prints one JSON line with ddp_baseline.py's keys:
    {"what": "fsdp2+compile gpt2", "world": N, "tok_s_per_gpu": B*T/median, "tok_s_total":
     N*B*T/median, "step_ms": median in ms, "mem_GiB": rank 0's peak allocated, warmup included}
and "mfu" (per GPU, torch_baseline.py's 6N + 12 L C T FLOPs per token over 989.4 TFLOP/s).

Keep NCCL_NVLS_ENABLE=0 on the shared machines (set here when the environment leaves it unset).
--device cpu (gloo, no compile unless asked, no autocast) and the `tiny` model are for checking
the script off the GPU machine (tests/test_fsdp2_baseline.py).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Micro-batch per GPU of each model, as ddp_baseline.py's.
BATCH = {"gpt2": 32, "llama1b": 8, "llama8b": 1, "tiny": 2, "tiny-untied": 2}
# A 2-layer Llama-family shape for runs on the CPU (tests), with a tied and an untied head.
TINY = dict(vocab=512, d=64, heads=4, kv=2, ff=192, layers=2, T=64, llama=True)
TINY_UNTIED = dict(TINY, tied=False)


def shape_of(tb, model):
    """torch_baseline.py's shape dict of a model name (its module passed in)."""
    if model == "llama8b":  # its 8-layer slice's widths, all 32 layers, at T 8192
        return dict(tb.LLAMA8B_SLICE, layers=32, T=8192)
    return {"gpt2": getattr(tb, "GPT2", None), "llama1b": getattr(tb, "LLAMA1B", None), "tiny": TINY,
            "tiny-untied": TINY_UNTIED}[model]


def flop_params(model, shape):
    """torch_baseline.py's N: the parameters without the input embedding lookup (token and position
    tables), with the head; a tied head shares the token table, so it is counted back once."""
    n = sum(p.numel() for p in model.parameters()) - model.emb.weight.numel()
    if shape.get("tied", True):
        n += model.head.weight.numel()
    if model.pos is not None:
        n -= model.pos.weight.numel()
    return n


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="PyTorch FSDP2 + torch.compile tokens/s per GPU; run under torchrun. "
        "Rank 0 prints one JSON line (ddp_baseline.py's keys).")
    p.add_argument("model", choices=sorted(BATCH),
                   help="gpt2 (B32 T1024), llama1b (B8 T2048), llama8b (32 layers, B1 T8192), tiny, tiny-untied (tests)")
    p.add_argument("--torch-baseline-dir", type=Path, default=None,
                   help="folder of torch_baseline.py (default: ../shared/bench, else .carry/bench)")
    p.add_argument("--steps", type=int, default=12, help="timed steps (default 12)")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps first (default 4)")
    p.add_argument("--batch", type=int, default=None, help="micro-batch per GPU (default: the model's)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--no-compile", action="store_true", help="eager blocks (default on CUDA: compiled)")
    p.add_argument("--compile", action="store_true", help="compile on the CPU too")
    p.add_argument("--no-reshard", action="store_true",
                   help="keep gathered parameters from forward to backward (ZeRO-2 memory)")
    p.add_argument("--checkpoint", action="store_true",
                   help="recompute each block's activations in the backward (torch.utils.checkpoint)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        p.error(f"--steps must be >= 1 and --warmup >= 0 (got {a.steps}, {a.warmup})")
    return a


def find_torch_baseline(given):
    candidates = [given] if given else [HERE.parent.parent / "shared" / "bench", HERE.parent / ".carry" / "bench"]
    for d in candidates:
        if (Path(d) / "torch_baseline.py").is_file():
            return Path(d)
    where = ", ".join(str(d) for d in candidates)
    sys.exit(f"{Path(sys.argv[0]).name}: error: torch_baseline.py not found in {where}; "
             "pass --torch-baseline-dir (the shared bench folder, or .carry/bench on the GPU machine)")


def checkpointed_class():
    import torch
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        """A block whose activations are recomputed in the backward."""

        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, *args):
            return checkpoint(self.block, *args, use_reentrant=False)

    return Checkpointed


def main(argv=None):
    a = parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.path.insert(0, str(find_torch_baseline(a.torch_baseline_dir)))
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import torch_baseline as tb

    cuda = a.device == "cuda"
    compile_ = (cuda and not a.no_compile) or a.compile
    shape = shape_of(tb, a.model)
    B = a.batch or BATCH[a.model]
    T = shape["T"]

    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")

    Checkpointed = checkpointed_class()
    torch.manual_seed(0)  # the same initial model on every rank, as DDP's broadcast gives
    model = tb.GPT(shape).to(dev)
    flops_per_token = 6 * flop_params(model, shape) + 12 * shape["layers"] * shape["d"] * T
    if a.checkpoint:
        for i in range(len(model.blocks)):
            model.blocks[i] = Checkpointed(model.blocks[i])

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cuda else MixedPrecisionPolicy()
    last = len(model.blocks) - 1
    for i in range(len(model.blocks)):
        if compile_:  # the compiled block takes the block's place, then becomes an FSDP unit
            model.blocks[i] = torch.compile(model.blocks[i])
        fully_shard(model.blocks[i], mp_policy=mp, reshard_after_forward=not a.no_reshard and i < last)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda, foreach=not cuda)

    # Different data on each rank, as in data-parallel training.
    g = torch.Generator(device="cpu").manual_seed(1 + rank)
    idx = torch.randint(0, shape["vocab"], (B, T), generator=g).to(dev)
    tgt = torch.randint(0, shape["vocab"], (B, T), generator=g).to(dev)

    def step():
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    sync()
    dist.barrier()
    ts = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    t = ts[len(ts) // 2]
    if not torch.isfinite(loss.detach()).item():
        print(f"fsdp2_baseline.py: rank {rank}: the last loss is not finite", file=sys.stderr)
    if rank == 0:
        mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
        what = f"fsdp2{'+compile' if compile_ else ''} {a.model}"
        print(json.dumps({"what": what, "world": world, "tok_s_per_gpu": round(B * T / t),
                          "tok_s_total": round(world * B * T / t), "step_ms": round(t * 1e3, 1),
                          "mem_GiB": round(mem, 1),
                          "mfu": round(B * T / t * flops_per_token / tb.PEAK, 3) if cuda else None,
                          "B": B, "T": T, "reshard": not a.no_reshard, "checkpoint": a.checkpoint}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
