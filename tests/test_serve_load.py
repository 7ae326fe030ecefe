"""A bounded load test of `lathe serve` (src/cli/serve.cpp, src/infer/scheduler.h) on localhost,
on the CPU with the llama parity fixture and a byte-level tokenizer (test_generate.with_tokenizer).

Two rounds of 64 requests from 16 concurrent client threads, mixing completions and chat through
the `openai` client, streamed completions, malformed bodies (raw HTTP) and streams the client
leaves after their first event. Checked each round:
  - every good request (greedy) returns exactly the text, finish reason and completion-token count
    the same request got alone before the load (continuous batching changes no token), streamed
    text included;
  - every malformed one gets a 400 with an OpenAI error object; /health answers 200 throughout;
  - /metrics: lathe_requests_total per path and code grows by exactly the requests sent (the left
    streams counted as the 200s they began as), lathe_generation_tokens_total by at least the good
    requests' tokens, and the batch drains to 0 running and 0 waiting sequences;
  - the server's resident set (less the tokenizer's per-thread huge-page caches, bounded by the
    thread pool: see rss_bytes) after the second round is within 16 MiB of the first's (the same
    work twice holds no more memory), and SIGTERM stops it with exit code 0.
"""
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_generate import with_tokenizer
from test_serve import client, get, open_stream, post, serve

CLIENTS = 16
REQUESTS = 64
PROMPTS = ["hello", "the cat sat", "a", "numbers 1 2 3", "zz top", "Once upon a time"]
MALFORMED = [
    (b'{"prompt": "x", "max_tokens": "2"}', "max_tokens"),
    (b'{"max_tokens": 2}', "prompt"),
    (b'{"prompt": "x", "temperature": -1}', "temperature"),
    (b'not json', "JSON"),
]


def request_of(i):
    """The i-th request of a round: (kind, prompt, max_tokens)."""
    kind = ["completion", "completion", "chat", "chat", "stream", "stream", "malformed",
            "leave"][i % 8]
    return kind, PROMPTS[i % len(PROMPTS)], 3 + i % 7


_clients = threading.local()


def client_of(url):
    """This thread's client: one keep-alive connection per client thread, as a real client has."""
    if getattr(_clients, "url", None) != url:
        _clients.url, _clients.client = url, client(url)
    return _clients.client


def complete(url, kind, prompt, max_tokens):
    """A good request's (text, finish_reason, completion tokens or None for a stream)."""
    c = client_of(url)
    if kind == "completion":
        r = c.completions.create(model="tok", prompt=prompt, max_tokens=max_tokens, temperature=0)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
    if kind == "chat":
        r = c.chat.completions.create(model="tok", messages=[{"role": "user", "content": prompt}],
                                      max_tokens=max_tokens, temperature=0)
        return (r.choices[0].message.content, r.choices[0].finish_reason,
                r.usage.completion_tokens)
    text, finish = "", None
    for ev in c.completions.create(model="tok", prompt=prompt, max_tokens=max_tokens,
                                   temperature=0, stream=True):
        text += ev.choices[0].text
        finish = ev.choices[0].finish_reason or finish
    return text, finish, None


def rss_bytes(pid):
    """The resident set less its transparent huge pages. The only memory lathe marks for huge
    pages is the tokenizer's lookup tables (src/tokenizer/hash_tables.h), among them each thread's
    encode cache: every pool thread that tokenizes a prompt holds one (about 2 MiB), so they grow
    with the number of distinct server threads a round happens to use, up to the pool's size, and
    are left out of the comparison."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        text = f.read()
    kb = {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1))
          for k in ("Rss", "AnonHugePages")}
    return (kb["Rss"] - kb["AnonHugePages"]) * 1024


def counters(url):
    """lathe_requests_total by (path, code), and the scalar lathe_* metrics."""
    by_code, scalars = {}, {}
    for line in get(url + "/metrics").text.splitlines():
        m = re.match(r'lathe_requests_total\{path="([^"]+)",code="(\d+)"\} (\S+)', line)
        if m:
            by_code[(m.group(1), m.group(2))] = float(m.group(3))
        elif line.startswith("lathe_") and "{" not in line:
            name, value = line.split()
            scalars[name] = float(value)
    return by_code, scalars


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f, _ = with_tokenizer(tmp_path_factory.mktemp("serve_load"))
    return f


def test_two_rounds_of_mixed_load(folder):
    with serve(folder, "--max-seqs", 8, "--max-queue", 64) as url:
        # Each distinct good request alone first: what it must return under load.
        want = {}
        for i in range(REQUESTS):
            kind, prompt, m = request_of(i)
            if kind in ("completion", "chat") and (kind, prompt, m) not in want:
                want[(kind, prompt, m)] = complete(url, kind, prompt, m)
            if kind == "stream" and ("completion", prompt, m) not in want:
                want[("completion", prompt, m)] = complete(url, "completion", prompt, m)
        for (kind, _, m), (text, finish, tokens) in want.items():
            assert finish in ("length", "stop") and 1 <= tokens <= m
            assert finish == "stop" or tokens == m

        health_failures = []
        stop_health = threading.Event()

        def watch_health():
            while not stop_health.is_set():
                r = get(url + "/health")
                if r.status_code != 200:
                    health_failures.append(r.status_code)
                time.sleep(0.05)

        def one(i):
            kind, prompt, m = request_of(i)
            if kind == "malformed":
                body, field = MALFORMED[(i // 8) % len(MALFORMED)]
                r = post(url + "/v1/completions", content=body)
                assert r.status_code == 400, (body, r.text)
                err = r.json()["error"]
                assert field in err["message"] and err["type"] == "invalid_request_error", err
                return 0
            if kind == "leave":
                with open_stream(url, {"prompt": prompt, "max_tokens": 40, "temperature": 0}):
                    pass  # closed after the first event
                return 0
            text, finish, tokens = complete(url, kind, prompt, m)
            ref_text, ref_finish, ref_tokens = want[("completion" if kind == "stream" else kind,
                                                     prompt, m)]
            assert (text, finish) == (ref_text, ref_finish), (i, kind, prompt, m)
            if tokens is not None:
                assert tokens == ref_tokens, (i, kind, prompt, m)
            return ref_tokens

        rss = []
        for _ in range(2):
            before_codes, before = counters(url)
            watcher = threading.Thread(target=watch_health)
            watcher.start()
            try:
                with ThreadPoolExecutor(CLIENTS) as pool:
                    good_tokens = sum(pool.map(one, range(REQUESTS)))
            finally:
                stop_health.set()
                watcher.join()
                stop_health.clear()
            assert health_failures == []
            # The left streams finish (cancelled) in the background: wait for the batch to drain.
            deadline = time.time() + 20
            while True:
                codes, after = counters(url)
                if after["lathe_running_sequences"] == 0 and after["lathe_queue_depth"] == 0:
                    break
                assert time.time() < deadline, after
                time.sleep(0.05)

            def grew(path, code):
                return codes.get((path, code), 0) - before_codes.get((path, code), 0)

            per_kind = {k: sum(request_of(i)[0] == k for i in range(REQUESTS))
                        for k in ("completion", "chat", "stream", "malformed", "leave")}
            # The metrics requests themselves are not counted before their own answer.
            assert grew("/v1/completions", "200") == (per_kind["completion"] + per_kind["stream"]
                                                      + per_kind["leave"])
            assert grew("/v1/completions", "400") == per_kind["malformed"]
            assert grew("/v1/chat/completions", "200") == per_kind["chat"]
            other = {k: v for k, v in codes.items()
                     if k[0].startswith("/v1/") and k[1] not in ("200", "400")}
            assert other == {}, other
            assert (after["lathe_generation_tokens_total"] - before["lathe_generation_tokens_total"]
                    >= good_tokens)
            rss.append(rss_bytes(url.proc.pid))
        assert rss[1] <= rss[0] + 16 * 2**20, f"resident set grew from {rss[0]} to {rss[1]} bytes"
