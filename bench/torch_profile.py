"""Where torch.compile's training step spends its GPU time: torch_baseline.py's compiled model at
one of its shapes, timed as torch_baseline.py times it, then PyTorch's profiler over a few more
steps, kernel time per step grouped as `lathe bench --kernel-breakdown` groups lathe's.

    python3 bench/torch_profile.py gpt2|llama1b|llama8b [--torch-baseline-dir DIR] [--steps 3]
                                   [--top 20] [--no-profile]

The model is torch_baseline.py's decoder (imported from DIR: default ../shared/bench beside this
checkout, else .carry/bench; a file of the shared bench folder, not of this repository) at the
shape its own `gpt2`, `llama1b` and `llama8b` runs use. Prints torch_baseline.py's JSON line of
the compiled run, then one JSON line {"what": "kernel_groups", ...} with the groups in ms a step
and the --top kernels by time. docs/PERF.md ("Elementwise kernels, norm backwards and the LM
head's long rows") has a table from it beside lathe's breakdown.
"""
import argparse
import collections
import json
import sys

from fsdp2_baseline import find_torch_baseline

SHAPES = {"gpt2": ("gpt2_124M", "GPT2", 32), "llama1b": ("llama_1B", "LLAMA1B", 8),
          "llama8b": ("llama_8B_slice8L", "LLAMA8B_SLICE", 2)}

# (group, substrings of a kernel name), first match wins; the groups of ops/kernel_groups.h where
# PyTorch's kernels have a counterpart.
GROUPS = [
    ("gemm", ("nvjet", "splitKreduce", "gemm", "cutlass")),
    ("attention", ("sdpa", "fmha", "flash", "cudnn")),
    ("optimizer", ("multi_tensor_apply",)),
    ("lm_head_ce", ("log_softmax", "nll_loss")),
    ("norms", ("layer_norm", "rms_norm")),
    ("elementwise", ("gelu", "silu", "triton", "elementwise", "vectorized", "reduce_kernel")),
    ("copies", ("Memset", "Memcpy")),
]


def group_of(name):
    for group, keys in GROUPS:
        if any(k in name for k in keys):
            return group
    return "other"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="torch.compile's step time by kernel group")
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("--torch-baseline-dir", default=None,
                   help="folder of torch_baseline.py (default: ../shared/bench, else .carry/bench)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--top", type=int, default=20, help="kernels listed by time (default 20)")
    p.add_argument("--no-profile", action="store_true", help="time only, as torch_baseline.py")
    a = p.parse_args(argv)
    if a.steps < 1 or a.top < 0:
        p.error(f"--steps must be >= 1 and --top >= 0 (got {a.steps}, {a.top})")
    return a


def main(argv=None):
    a = parse_args(argv)
    sys.path.insert(0, str(find_torch_baseline(a.torch_baseline_dir)))
    import torch
    import torch_baseline as tb
    from torch.profiler import ProfilerActivity, profile

    name, config, batch = SHAPES[a.shape]
    c = getattr(tb, config)
    tb.train_bench(name, c, batch, True)  # prints the JSON line torch_baseline.py prints
    if a.no_profile:
        return
    torch.manual_seed(0)
    model = tb.GPT(c).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    f = torch.compile(model)
    idx = torch.randint(0, c["vocab"], (batch, c["T"]), device="cuda")
    tgt = torch.randint(0, c["vocab"], (batch, c["T"]), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = f(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name] += e.device_time / 1000.0 / a.steps  # us -> ms a step
    groups = collections.defaultdict(float)
    for k, ms in per_kernel.items():
        groups[group_of(k)] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:a.top]
    print(json.dumps({"what": "kernel_groups", "shape": a.shape, "steps": a.steps,
                      "kernel_ms_per_step": round(sum(per_kernel.values()), 3),
                      "groups": {g: round(ms, 3) for g, ms in sorted(groups.items(), key=lambda kv: -kv[1])},
                      "top": [{"name": k[:160], "ms_per_step": round(ms, 3)} for k, ms in top]}),
          flush=True)


if __name__ == "__main__":
    main()
