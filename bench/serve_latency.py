#!/usr/bin/env python3
"""End-to-end latency of `lathe serve` (or any OpenAI-compatible server) from the client side, for
the request sets of the tensor-parallel serving job (docs/INFERENCE.md): one request of P1 prompt
tokens, then C concurrent requests of P2 prompt tokens, each asking for N new tokens (greedy,
prompts of random token ids so no tokenizer is needed). Prints one JSON line: per set the wall
time from the first send to the last complete answer, each request's time, and the tokens the
server says it read and wrote (usage).

    python3 bench/serve_latency.py --url http://127.0.0.1:8000 --vocab 32000 \\
        [--long 31242] [--short 3349] [--concurrent 8] [--new 100] [--wait 900]

--wait: seconds to wait for /health before the first request (a large model loads first)."""
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
    a = ap.parse_args()
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
    if a.long > 0:
        out["long"] = run_set(a.url, [ids(a.long)], a.new, a.model, a.timeout)
    if a.short > 0 and a.concurrent > 0:
        out["concurrent"] = run_set(a.url, [ids(a.short) for _ in range(a.concurrent)], a.new,
                                    a.model, a.timeout)
    print(json.dumps(out))
    sys.exit(1 if any(out.get(k, {}).get("errors") for k in ("long", "concurrent")) else 0)


if __name__ == "__main__":
    main()
