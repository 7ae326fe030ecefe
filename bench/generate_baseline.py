"""Inference speed of Hugging Face transformers on the same model shape and GPU as
`lathe bench --generate`, printed as one JSON line with the same keys, so the two compare directly.

  python3 bench/generate_baseline.py --preset llama3-8b                    # the GPU measurement
  python3 bench/generate_baseline.py --preset tiny --device cpu \\
      --prefill 64,128 --decode-batches 1,4 --prompt-len 32 --compile off  # a CPU smoke run

The model is transformers' LlamaForCausalLM built from a config (a preset below, or a
config.json given with --config) with random weights, bf16 on CUDA (f32 on the CPU), attention
through PyTorch's scaled_dot_product_attention (attn_implementation "sdpa").

  prefill   per length T: one sequence of T random tokens through the model into an empty cache,
            only the last position's logits computed (logits_to_keep=1, as lathe's prefill returns
            the last token's logits); one warm-up, then --prefill-repeats timed, the median.
  decode    per batch B: a StaticCache of B rows and prompt_len + warm-up + steps positions,
            filled by one batched forward of B random prompts of --prompt-len tokens (untimed),
            then decode steps of one random token per row, each timed to the device's end; the
            median step. With --compile auto (the default) the decode step's forward is
            torch.compile'd (mode "reduce-overhead", CUDA graphs) and the compiled step is used
            when its first calls succeed, else the eager one; "decode_mode" says which, and
            "compile_error" why not.

Definitions (those of lathe's src/run/bench_generate.h):
  prefill flops(T) = 2 N_body T + 2 V C + 2 L H D T (T + 1)   N_body: the parameters without the
                     embedding table and the LM head; the head on the last token; causal attention
  mfu              = flops / seconds / 989.4e12 on compute capability 9.x, else null
  bytes_per_step   = (N_body + V C) * element size + sum of the rows' lengths after the step *
                     2 L Hkv D * element size, averaged over the timed steps
  copy_bandwidth   = 2 * copy_bytes / seconds of a device-to-device copy (reads + writes), the best
                     of five after a warm-up; null on the CPU
  bandwidth_fraction = bytes_per_step / step seconds / copy_bandwidth
"""
import argparse
import inspect
import json
import resource
import sys
import time

PEAK_HOPPER = 989.4e12  # H100 SXM dense bf16 (datasheet), lathe's bench_peak_flops

# Architecture facts of the shapes lathe's bench presets of the same names describe.
PRESETS = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=32768, rms_norm_eps=1e-5, hidden_act="silu",
                      rope_theta=500000.0, attention_bias=False, mlp_bias=False,
                      tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 rms_norm_eps=1e-5, hidden_act="silu", rope_theta=10000.0,
                 tie_word_embeddings=True),
}


def fail(message):
    print(f"generate_baseline.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def length_list(flag, text):
    if text == "":
        return []
    out = []
    for item in text.split(","):
        if not item.isdigit() or int(item) < 1:
            fail(f"{flag} '{text}': '{item}' is not a positive integer; give a list such as 1,16,64")
        out.append(int(item))
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset", choices=sorted(PRESETS), help="model shape (default llama3-8b)")
    g.add_argument("--config", help="a Hugging Face config.json of a Llama-family model")
    p.add_argument("--prefill", default="4096,32768", help="prefill lengths, comma-separated")
    p.add_argument("--decode-batches", default="1,16,64", help="decode batches, comma-separated")
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--decode-warmup", type=int, default=4)
    p.add_argument("--prefill-repeats", type=int, default=3)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--compile", choices=["auto", "off"], default="auto",
                   help="torch.compile the decode step (auto: when it works) or not")
    p.add_argument("--copy-bytes", type=int, default=1 << 30)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    a.prefill = length_list("--prefill", a.prefill)
    a.decode_batches = length_list("--decode-batches", a.decode_batches)
    for flag in ("prompt_len", "decode_steps", "prefill_repeats"):
        if getattr(a, flag) < 1:
            fail(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(a, flag)}")
    if a.decode_warmup < 0:
        fail(f"--decode-warmup must be >= 0, got {a.decode_warmup}")
    if not a.prefill and not a.decode_batches:
        fail("nothing to measure: --prefill and --decode-batches are both empty")
    return a


def main(argv):
    a = parse_args(argv)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    if a.config:
        try:
            with open(a.config) as f:
                fields = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"--config {a.config}: {e}")
        name = a.config
    else:
        name = a.preset or "llama3-8b"
        fields = PRESETS[name]
    config = LlamaConfig(**fields)
    config._attn_implementation = "sdpa"
    positions = config.max_position_embeddings
    if a.prefill and max(a.prefill) > positions:
        fail(f"--prefill {max(a.prefill)}: longer than {name}'s max_position_embeddings {positions}")
    decode_len = a.prompt_len + a.decode_warmup + a.decode_steps
    if a.decode_batches and decode_len > positions:
        fail(f"--prompt-len {a.prompt_len} + {a.decode_warmup} warm-up + --decode-steps "
             f"{a.decode_steps} = {decode_len} positions, beyond {name}'s max_position_embeddings "
             f"{positions}")
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no usable GPU here; run with --device cpu for a smoke run")

    dev = torch.device(a.device)
    on_cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if on_cuda else torch.float32
    elem = 2 if on_cuda else 4
    torch.manual_seed(a.seed)
    gen = torch.Generator(device="cpu").manual_seed(a.seed)

    def sync():
        if on_cuda:
            torch.cuda.synchronize()

    def tokens(*shape):
        return torch.randint(0, config.vocab_size, shape, generator=gen).to(dev)

    out = {"framework": "transformers", "model": name, "device": a.device,
           "device_name": torch.cuda.get_device_name(dev) if on_cuda else "cpu",
           "precision": "bf16" if on_cuda else "fp32"}
    peak = None
    if on_cuda and torch.cuda.get_device_capability(dev)[0] == 9:
        peak = PEAK_HOPPER

    bandwidth = None
    if on_cuda:
        src = torch.empty(a.copy_bytes, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        best = 0.0
        for i in range(6):
            sync()
            t0 = time.perf_counter()
            dst.copy_(src)
            sync()
            s = time.perf_counter() - t0
            if i > 0:
                best = max(best, 2.0 * a.copy_bytes / s)
        bandwidth = best
        del src, dst
        torch.cuda.empty_cache()

    setup_start = time.perf_counter()  # setup_s: until the weights are in the device's memory
    with torch.device(dev):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.eval()
    sync()
    out["setup_s"] = time.perf_counter() - setup_start
    L, C, V = config.num_hidden_layers, config.hidden_size, config.vocab_size
    H, Hkv = config.num_attention_heads, config.num_key_value_heads
    D = getattr(config, "head_dim", None) or C // H
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    flop_params = params if config.tie_word_embeddings else params - embed
    head = V * C
    body = flop_params - head
    kv_per_position = 2 * L * Hkv * D * elem
    # One process on one device: lathe bench --generate's tensor_parallel 1; max_len is the
    # StaticCache's length, as lathe's is its decode engine's.
    out.update(params=params, flop_params=flop_params, seed=a.seed, peak_flops=peak,
               tensor_parallel=1, max_len=decode_len, copy_bytes=a.copy_bytes if on_cuda else None,
               copy_bandwidth=bandwidth)

    forward_params = inspect.signature(model.forward).parameters
    cache_arg = "past_key_values" if "past_key_values" in forward_params else "cache"

    def median(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    prefill_rows = []
    with torch.inference_mode():
        for T in a.prefill:
            ids = tokens(1, T)
            times = []
            for r in range(a.prefill_repeats + 1):  # r = 0: the warm-up
                sync()
                t0 = time.perf_counter()
                logits = model(input_ids=ids, use_cache=True, logits_to_keep=1).logits
                sync()
                s = time.perf_counter() - t0
                del logits
                if r > 0:
                    times.append(s)
            s = median(times)
            flops = 2.0 * body * T + 2.0 * head + 2.0 * L * H * D * T * (T + 1)
            prefill_rows.append({"tokens": T, "seconds": s, "tokens_per_s": T / s, "flops": flops,
                                 "mfu": flops / s / peak if peak else None})
            if on_cuda:
                torch.cuda.empty_cache()
    out.update(prefill_chunk=None, prefill_repeats=a.prefill_repeats, prefill=prefill_rows,
               prompt_len=a.prompt_len, decode_steps=a.decode_steps, decode_warmup=a.decode_warmup,
               weight_bytes=float(flop_params * elem), kv_bytes_per_position=float(kv_per_position))

    def eager_step(ids, cache, position):
        kwargs = {cache_arg: cache}
        return model(input_ids=ids, position_ids=position, use_cache=True, logits_to_keep=1,
                     **kwargs).logits

    step = eager_step
    mode = "eager"
    compile_error = None
    if a.compile == "auto" and a.decode_batches:
        try:
            step = torch.compile(eager_step, mode="reduce-overhead" if on_cuda else "default",
                                 fullgraph=True)
            mode = "torch.compile"
        except Exception as e:  # compile is optional: the eager step measures instead
            compile_error = f"{type(e).__name__}: {e}"
            step = eager_step

    decode_rows = []
    with torch.inference_mode():
        for B in a.decode_batches:
            cache = StaticCache(config=config, max_cache_len=decode_len, max_batch_size=B,
                                device=dev, dtype=dtype)
            prompt = tokens(B, a.prompt_len)
            positions = torch.arange(a.prompt_len, device=dev).unsqueeze(0).expand(B, -1)
            kwargs = {cache_arg: cache}
            model(input_ids=prompt, position_ids=positions, use_cache=True, logits_to_keep=1,
                  **kwargs)
            times, total_bytes = [], 0.0
            for k in range(a.decode_warmup + a.decode_steps):
                length = a.prompt_len + k  # the row's position of this step's token
                ids = tokens(B, 1)
                pos = torch.full((B, 1), length, dtype=torch.long, device=dev)
                sync()
                t0 = time.perf_counter()
                try:
                    logits = step(ids, cache, pos)
                except Exception as e:
                    if step is eager_step:
                        raise
                    # The compiled step failed on its first call: measure the eager one, from
                    # a clock started again after the failure.
                    compile_error = f"{type(e).__name__}: {e}".splitlines()[0]
                    step, mode = eager_step, "eager"
                    sync()
                    t0 = time.perf_counter()
                    logits = step(ids, cache, pos)
                sync()
                s = time.perf_counter() - t0
                del logits
                if k >= a.decode_warmup:
                    times.append(s)
                    total_bytes += flop_params * elem + kv_per_position * B * (length + 1)
            s = median(times)
            bytes_per_step = total_bytes / a.decode_steps
            decode_rows.append({"batch": B, "decode_mode": mode, "tokens_per_step": B,
                                "ms_per_step": s * 1e3,
                                "tokens_per_s": B / s, "bytes_per_step": bytes_per_step,
                                "bandwidth_fraction":
                                    bytes_per_step / s / bandwidth if bandwidth else None})
            del cache
            if on_cuda:
                torch.cuda.empty_cache()
    out["decode"] = decode_rows
    # The whole line's mode: the last row's (each row has its own: a compile that fails at a
    # later batch leaves the earlier rows compiled).
    out["decode_mode"] = mode if a.decode_batches else None
    out["compile_error"] = compile_error
    if on_cuda:
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
        out["peak_memory_source"] = "torch_max_memory_allocated"
    else:
        out["peak_memory_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out["peak_memory_source"] = "max_rss"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
