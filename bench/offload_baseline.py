"""PyTorch optimizer offload, the side-by-side baseline of `lathe bench --offload cpu`:

    python3 bench/offload_baseline.py --preset llama3-8b --batch 6 --seq 4096 --accum 4 \
        --recompute --steps 2 --warmup 1 [--layers L] [--device cuda|cpu]
        [--torch-baseline-dir DIR]

The model is torch_baseline.py's decoder (imported from DIR: default ../shared/bench beside this
checkout, else .carry/bench; the shared bench folder's file, as fsdp2_baseline.py takes it) at the
shapes of `lathe bench`'s presets (llama3-8b, llama-1b, llama2-13b; tiny for the CPU), with
--layers replacing the layer count. Its parameters are bf16 on the GPU; the f32 master weights and
the AdamW state live in CPU tensors, stepped by torch.optim.AdamW on the CPU (fused=True where
this torch runs the fused AdamW on CPU tensors, else foreach).

A step (one optimizer step, as `lathe bench --accum K` times it):
  1. K forward+backward passes of B sequences of T random tokens, each loss divided by K (the
     bf16 gradients accumulate in the parameters' .grad on the GPU); --recompute runs each
     decoder block under torch.utils.checkpoint (what `lathe bench --recompute full` keeps: one
     block's input);
  2. the global gradient norm on the GPU and clipping to 1.0 (torch.nn.utils.clip_grad_norm_),
     as `lathe bench` clips;
  3. every gradient copied into one pinned bf16 host buffer (one flat staging buffer for all
     parameters), waited for;
  4. per unit (the embeddings, each block, the final norm and head), the unit's gradients widened
     to f32 into the masters' .grad, the unit's AdamW step (lr 6e-4, betas 0.9/0.95, eps 1e-8,
     weight decay 0.1: `lathe bench`'s), the masters rounded to bf16 into the same staging buffer
     and the unit's f32 gradients dropped (only one unit's f32 gradients exist at a time);
  5. the staging buffer copied back into the GPU's bf16 parameters.
Nothing overlaps: this is the plain serial schedule (`lathe bench --offload-schedule serial`).
Host memory: 4 B (masters) + 8 B (moments) + 2 B (staging) per parameter, 14 B, plus the largest
unit's f32 gradients.

Timing: `warmup` untimed steps, then `steps` steps each timed to a device synchronize; the median.
One JSON line, with `lathe bench`'s field names where they mean the same:
  tokens_per_s       K * B * T / median step time
  step_ms_median, s_per_it   the median step in ms and in seconds
  mfu                tokens_per_s * (6 N + 12 L C T) / 989.4e12 (N: parameters without the input
                     embedding, with the head; torch_baseline.py's count); null on the CPU
  peak_memory_bytes  CUDA: device memory in use (torch.cuda.mem_get_info total - free) after each
                     step, the largest, minus the memory in use before the model was built
                     (`lathe bench`'s definition); CPU: the process's peak resident set
  host_peak_rss_bytes  the process's peak resident set (getrusage)
and batch, seq, accum, params, flop_params, flops_per_token, steps, warmup, recompute,
loss_first, loss_last, grad_norm_last, offload ("cpu"), state_dtype ("fp32"), offload_schedule
("serial"); plus what ("torch_offload"), torch_max_allocated_bytes and adamw ("fused" or
"foreach").
"""
import argparse
import json
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fsdp2_baseline import find_torch_baseline  # noqa: E402

# The shapes of `lathe bench`'s presets (src/run/bench.cpp), in torch_baseline.py's vocabulary.
PRESETS = {
    "llama3-8b": dict(vocab=128256, d=4096, heads=32, kv=8, ff=14336, layers=32, llama=True, tied=False),
    "llama-1b": dict(vocab=128256, d=2048, heads=32, kv=8, ff=8192, layers=16, llama=True, tied=True),
    "llama2-13b": dict(vocab=32000, d=5120, heads=40, kv=40, ff=13824, layers=40, llama=True, tied=False),
    "tiny": dict(vocab=512, d=64, heads=4, kv=2, ff=192, layers=2, llama=True, tied=True),
}
# `lathe bench`'s optimizer settings (src/run/bench.cpp: `lathe train`'s defaults).
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 6e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
PEAK = 989.4e12  # Hopper dense bf16, torch_baseline.py's and `lathe bench`'s


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="PyTorch with the f32 masters and AdamW on the CPU, bf16 parameters on the "
        "GPU; one JSON line (lathe bench's field names)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    p.add_argument("--batch", type=int, required=True, help="B: sequences per micro-batch")
    p.add_argument("--seq", type=int, required=True, help="T: tokens per sequence")
    p.add_argument("--accum", type=int, default=1, help="K: micro-batches per step (default 1)")
    p.add_argument("--layers", type=int, default=None, help="decoder blocks (default: the preset's)")
    p.add_argument("--steps", type=int, default=2, help="timed steps (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    p.add_argument("--recompute", action="store_true",
                   help="recompute each block's activations in the backward (torch.utils.checkpoint)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--torch-baseline-dir", type=Path, default=None,
                   help="folder of torch_baseline.py (default: ../shared/bench, else .carry/bench)")
    a = p.parse_args(argv)
    for name in ("batch", "seq", "accum", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1 (got {getattr(a, name)})")
    if a.warmup < 0:
        p.error(f"--warmup must be >= 0 (got {a.warmup})")
    if a.layers is not None and a.layers < 1:
        p.error(f"--layers must be >= 1 (got {a.layers})")
    return a


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def adamw_kind(torch):
    """fused where this torch steps CPU tensors with the fused AdamW, else foreach."""
    try:
        w = torch.zeros(2, requires_grad=True)
        w.grad = torch.zeros(2)
        torch.optim.AdamW([w], lr=0.0, fused=True).step()
        return "fused"
    except (RuntimeError, TypeError):
        return "foreach"


def main(argv=None):
    a = parse_args(argv)
    sys.path.insert(0, str(find_torch_baseline(a.torch_baseline_dir)))
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint

    import torch_baseline as tb

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("offload_baseline.py: error: --device cuda, but torch sees no GPU; "
                 "pass --device cpu for a run on the CPU")
    dev = torch.device("cuda" if cuda else "cpu")
    c = dict(PRESETS[a.preset], T=a.seq)
    if a.layers is not None:
        c["layers"] = a.layers
    B, T, K = a.batch, a.seq, a.accum

    class Recomputed(nn.Module):
        """A block whose activations are recomputed in the backward (its input alone kept)."""

        def __init__(s, block):
            super().__init__()
            s.block = block

        def forward(s, x, cos, sin):
            return checkpoint(s.block, x, cos, sin, use_reentrant=False)

    used_before = 0
    if cuda:
        free, total = torch.cuda.mem_get_info()
        used_before = total - free
    torch.manual_seed(0)
    # bf16 parameters built on the device directly (no f32 copy of the model on the device).
    torch.set_default_dtype(torch.bfloat16)
    with dev:
        model = tb.GPT(c)
    torch.set_default_dtype(torch.float32)
    if a.recompute:
        for i, b in enumerate(model.blocks):
            model.blocks[i] = Recomputed(b)
    n_all = sum(p.numel() for p in model.parameters())
    # torch_baseline.py's N: without the input embedding lookup, with the (tied) head.
    n_flop = n_all - model.emb.weight.numel() + (model.head.weight.numel() if c["tied"] else 0)
    flops_per_token = 6 * n_flop + 12 * c["layers"] * c["d"] * T

    # Units in forward order; a tied head's matrix belongs to the embeddings' unit.
    seen, units = set(), []
    for m in [model.emb, *model.blocks, nn.ModuleList([model.nf, model.head])]:
        ps = [p for p in m.parameters() if id(p) not in seen]
        seen.update(id(p) for p in ps)
        if ps:
            units.append(ps)
    params = [p for u in units for p in u]
    # One pinned bf16 staging buffer: gradients down, then the updated weights up.
    staging = torch.empty(n_all, dtype=torch.bfloat16, pin_memory=cuda)
    views, off = {}, 0
    for p in params:
        views[id(p)] = staging[off:off + p.numel()].view_as(p)
        off += p.numel()
    kind = adamw_kind(torch)
    masters, opts = {}, []
    for u in units:
        ms = []
        for p in u:
            m = torch.empty(p.shape, dtype=torch.float32)
            m.copy_(p.detach())
            masters[id(p)] = m
            ms.append(m)
        decay = [m for m in ms if m.dim() >= 2]
        no_decay = [m for m in ms if m.dim() < 2]
        groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        opts.append(torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS,
                                      **({"fused": True} if kind == "fused" else {"foreach": True})))

    g = torch.Generator(device="cpu").manual_seed(1234)
    batches = []
    for _ in range(min(4, (a.warmup + a.steps) * K)):
        row = torch.randint(0, c["vocab"], (B, T + 1), generator=g)
        batches.append((row[:, :-1].contiguous().to(dev), row[:, 1:].contiguous().to(dev)))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(s):
        losses = []
        for k in range(K):
            idx, tgt = batches[(s * K + k) % len(batches)]
            loss = model(idx, tgt) / K
            loss.backward()
            losses.append(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        for p in params:
            views[id(p)].copy_(p.grad, non_blocking=True)
            p.grad = None
        sync()
        for u, opt in zip(units, opts):
            for p in u:
                masters[id(p)].grad = views[id(p)].float()
            opt.step()
            for p in u:
                m = masters[id(p)]
                m.grad = None
                views[id(p)].copy_(m)
        with torch.no_grad():
            for p in params:
                p.copy_(views[id(p)], non_blocking=True)
        sync()
        return float(sum(losses)), float(norm)

    used_peak = 0
    times, first, last = [], None, None
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        last = step(s)
        ms = (time.perf_counter() - t0) * 1e3
        if first is None:
            first = last
        if cuda:
            free, total = torch.cuda.mem_get_info()
            used_peak = max(used_peak, total - free)
        if s >= a.warmup:
            times.append(ms)
        print(f"offload_baseline.py: step {s + 1}/{a.warmup + a.steps}: {ms:.1f} ms, "
              f"loss {last[0]:.4f}, grad norm {last[1]:.3f}", file=sys.stderr, flush=True)
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    tokens_per_s = K * B * T / (med / 1e3)
    print(json.dumps({
        "what": "torch_offload", "model": a.preset, "device": dev.type,
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "batch": B, "seq": T, "accum": K, "layers": c["layers"], "params": n_all,
        "flop_params": n_flop, "flops_per_token": flops_per_token,
        "recompute": "full" if a.recompute else "none", "precision": "bf16",
        "offload": "cpu", "state_dtype": "fp32", "offload_schedule": "serial", "adamw": kind,
        "steps": a.steps, "warmup": a.warmup, "tokens_per_s": tokens_per_s,
        "step_ms_median": med, "s_per_it": med / 1e3,
        "mfu": tokens_per_s * flops_per_token / PEAK if cuda else None,
        "peak_memory_bytes": max(0, used_peak - used_before) if cuda else peak_rss_bytes(),
        "peak_memory_source": "cuda_mem_get_info" if cuda else "max_rss",
        "torch_max_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "host_peak_rss_bytes": peak_rss_bytes(),
        "loss_first": first[0], "loss_last": last[0], "grad_norm_last": last[1],
    }), flush=True)


if __name__ == "__main__":
    main()
