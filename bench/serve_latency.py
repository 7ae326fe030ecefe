#!/usr/bin/env python3
"""End-to-end latency of `lathe serve` (or any OpenAI-compatible server) from the client side, for
the request sets of the tensor-parallel serving job (docs/INFERENCE.md): one request of P1 prompt
tokens, then C concurrent requests of P2 prompt tokens, each asking for N new tokens (greedy,
prompts of random token ids so no tokenizer is needed). Prints one JSON line: per set the wall
time from the first send to the last complete answer, each request's time, and the tokens the
server says it read and wrote (usage).

    python3 bench/serve_latency.py --url http://127.0.0.1:8000 --vocab 32000 \\
        [--long 31242] [--short 3349] [--concurrent 8] [--new 100] [--wait 900] \\
        [--config config.json --gpus G] [--rounds R]

--wait: seconds to wait for /health before the first request (a large model loads first).
--rounds R: both sets R times with new prompts; rounds after the first are in "again" (a first
round meets per-shape first-use costs that the warm-up's shorter prompts do not cover).

Each set also carries "server": the difference of the server's /metrics counters across the set
(lathe serve's lathe_prefill_seconds_total, lathe_decode_seconds_total, lathe_decode_steps_total,
lathe_decode_rows_total, lathe_prompt_tokens_total; absent from a server without them; and,
where the server has them, lathe_prefill_calls_total and lathe_engine_step_seconds_total): the
seconds spent in prefills and in decode steps, the prefill calls (a group of prompts prefilled
together counts once), step_s (the engine thread's busy time: prefills, decode steps and the host work between
them; the set's wall time less step_s is spent outside the engine thread), ms_per_decode_step,
and with --config (the
model's Hugging Face config.json, a Llama-shaped model: SwiGLU MLP, q/k/v/o projections) and
--gpus G the prefill's mfu = (2 N_body P + 2 V C + 2 L H D P (P+1)) summed over the set's
prompts / prefill seconds / G / 989.4 TFLOP/s (N_body: the layers' linear weights; the LM head
runs on each prompt's last token; the last term is the causal attention; lathe bench
--generate's formula)."""
import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request


def post(url, body, timeout):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        answer = json.loads(r.read())
    return time.perf_counter() - t0, answer


def wait_healthy(url, seconds):
    end = time.time() + seconds
    while time.time() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(1)
    return False


PEAK_HOPPER = 989.4e12  # H100 SXM dense bf16 (datasheet), lathe bench's peak

COUNTERS = {"prefill_s": "lathe_prefill_seconds_total", "decode_s": "lathe_decode_seconds_total",
            "decode_steps": "lathe_decode_steps_total", "decode_rows": "lathe_decode_rows_total",
            "prompt_tokens": "lathe_prompt_tokens_total"}
# Counters a server may lack (one built before them): reported where both scrapes have them.
OPTIONAL = {"prefill_calls": "lathe_prefill_calls_total",
            "step_s": "lathe_engine_step_seconds_total"}


def scrape(url):
    """The server's counters named in COUNTERS (None where /metrics lacks one) and those of
    OPTIONAL it has."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except (urllib.error.URLError, ConnectionError, OSError):
        return None
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            values[parts[0]] = float(parts[1])
    if any(name not in values for name in COUNTERS.values()):
        return None
    out = {key: values[name] for key, name in COUNTERS.items()}
    out.update({key: values[name] for key, name in OPTIONAL.items() if name in values})
    return out


def prefill_flops(config, prompt_len):
    """FLOPs of one prompt's prefill (see the module's text)."""
    C, L = config["hidden_size"], config["num_hidden_layers"]
    H = config["num_attention_heads"]
    Hkv = config.get("num_key_value_heads", H)
    D = config.get("head_dim") or C // H
    F, V = config["intermediate_size"], config["vocab_size"]
    n_body = L * (C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * F)
    P = prompt_len
    return 2 * n_body * P + 2 * V * C + 2 * L * H * D * P * (P + 1)


def server_split(before, after, prompts, config, gpus):
    if before is None or after is None:
        return None
    d = {k: after[k] - before[k] for k in COUNTERS}
    out = {"prefill_s": d["prefill_s"], "decode_s": d["decode_s"],
           "decode_steps": int(d["decode_steps"]), "decode_rows": int(d["decode_rows"]),
           "prompt_tokens": int(d["prompt_tokens"]), "ms_per_decode_step": None}
    for k in OPTIONAL:
        if k in before and k in after:
            out[k] = after[k] - before[k]
    if "prefill_calls" in out:
        out["prefill_calls"] = int(out["prefill_calls"])
    if d["decode_steps"]:
        out["ms_per_decode_step"] = 1e3 * d["decode_s"] / d["decode_steps"]
    if config is not None and d["prefill_s"] > 0:
        flops = sum(prefill_flops(config, len(p)) for p in prompts)
        out["prefill_tflops_per_gpu"] = flops / d["prefill_s"] / gpus / 1e12
        out["prefill_mfu"] = flops / d["prefill_s"] / gpus / PEAK_HOPPER
    return out


def run_set(url, prompts, new, model, timeout):
    results = [None] * len(prompts)

    def one(i):
        try:
            results[i] = post(url, {"model": model, "prompt": prompts[i], "max_tokens": new,
                                    "temperature": 0}, timeout)
        except Exception as e:  # reported in the line, not raised from a thread
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    errors = [str(r) for r in results if isinstance(r, Exception)]
    done = [r for r in results if not isinstance(r, Exception)]
    return {
        "requests": len(prompts),
        "prompt_tokens_each": len(prompts[0]),
        "wall_s": wall,
        "request_s": [d for d, _ in done],
        "prompt_tokens": sum(a.get("usage", {}).get("prompt_tokens", 0) for _, a in done),
        "completion_tokens": sum(a.get("usage", {}).get("completion_tokens", 0) for _, a in done),
        "errors": errors,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--long", type=int, default=31242)
    ap.add_argument("--short", type=int, default=3349)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--new", type=int, default=100)
    ap.add_argument("--model", default="lathe")
    ap.add_argument("--wait", type=float, default=900)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", help="the model's config.json, for the prefill's mfu")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs serving the model (mfu per GPU)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time both sets this many times (new random prompts each round)")
    a = ap.parse_args()
    config = None
    if a.config:
        try:
            with open(a.config) as f:
                config = json.load(f)
            prefill_flops(config, 1)
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"serve_latency: error: --config {a.config}: {e!r} "
                     "(a Llama-shaped config.json)")
    if a.gpus < 1 or a.rounds < 1:
        sys.exit(f"serve_latency: error: --gpus and --rounds must be >= 1, got {a.gpus}, "
                 f"{a.rounds}")
    if not wait_healthy(a.url, a.wait):
        sys.exit(f"serve_latency: error: {a.url}/health did not answer 200 within {a.wait:g} s")
    rng = random.Random(a.seed)
    ids = lambda n: [rng.randrange(a.vocab) for _ in range(n)]
    # Warm-up requests that are not timed (first-use costs: graphs, GEMM choices): one prompt
    # longer than a 2048-token prefill chunk (as long as the long set's allows), then a set of
    # the concurrent set's shape.
    run_set(a.url, [ids(max(16, min(2100, a.long)))], 4, a.model, a.timeout)
    if a.short > 0 and a.concurrent > 0:
        run_set(a.url, [ids(a.short) for _ in range(a.concurrent)], 4, a.model, a.timeout)
    out = {"url": a.url, "new_tokens": a.new}
    def timed(prompts):
        before = scrape(a.url)
        result = run_set(a.url, prompts, a.new, a.model, a.timeout)
        split = server_split(before, scrape(a.url), prompts, config, a.gpus)
        if split is not None:
            result["server"] = split
        return result

    def round_of_sets():
        r = {}
        if a.long > 0:
            r["long"] = timed([ids(a.long)])
        if a.short > 0 and a.concurrent > 0:
            r["concurrent"] = timed([ids(a.short) for _ in range(a.concurrent)])
        return r

    out.update(round_of_sets())
    if a.rounds > 1:
        out["again"] = [round_of_sets() for _ in range(a.rounds - 1)]
    print(json.dumps(out))
    rounds = [out] + out.get("again", [])
    sys.exit(1 if any(r.get(k, {}).get("errors") for r in rounds for k in ("long", "concurrent"))
             else 0)


if __name__ == "__main__":
    main()
