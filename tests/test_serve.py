"""`lathe serve` (src/cli/serve.cpp, src/infer/scheduler.h, docs/INFERENCE.md) through the real
`openai` client and raw HTTP, on the CPU with the llama parity fixture and a byte-level tokenizer
(test_generate.with_tokenizer: each id is one byte of text):

  - greedy completions equal `lathe generate`'s output, one at a time, as a list of prompts and
    from concurrent clients (continuous batching changes no token); streamed text equals it too;
  - echo + logprobs (lm-evaluation-harness's loglikelihood request) equal transformers' fp32
    log-likelihoods within 1e-4; the chat endpoint equals `lathe generate` with the template;
  - n > 1 with a seed is reproducible; bad input gets an OpenAI error object and a 4xx, and the
    server answers after each; a client leaving mid-stream; overload 503 with Retry-After;
    --api-key; SIGINT/SIGTERM stop it with exit code 0; a port already served is refused.
"""
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import openai
import pytest
import torch
import transformers

from lathe_cli import LATHE, run
from test_generate import MODELS, PROMPTS, read_jsonl, with_tokenizer, write_jsonl

NEW = 12
CTX = 96  # --max-len: tokens per sequence


class Url(str):
    """A server's base URL; .proc its process."""


@contextmanager
def serve(folder, *flags, sig=signal.SIGTERM, ctx=CTX):
    """A `lathe serve` on a free port; yields its base URL; stops it with `sig` (exit code 0)."""
    p = subprocess.Popen([LATHE, "serve", "--checkpoint", str(folder), "--port", "0", "--device",
                          "cpu", "--max-len", str(ctx), *map(str, flags)],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = p.stderr.readline()
    if "http://" not in line:
        p.kill()
        raise AssertionError(f"lathe serve did not start: {line}{p.stderr.read()}")
    url = Url("http://" + line.split("http://")[1].split()[0])
    url.proc = p
    try:
        yield url
    finally:
        if p.poll() is None:
            p.send_signal(sig)
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError("lathe serve did not stop on a signal")
        rest = p.stderr.read()
        assert rc == 0, rest
        assert "stopping" in rest


class Reply:
    def __init__(self, status, headers, text):
        self.status_code, self.headers, self.text = status, headers, text

    def json(self):
        return json.loads(self.text)


def http(method, url, content=None, json_body=None, timeout=30):
    """One raw HTTP request (urllib): its status, headers (lower-case names) and body text."""
    if json_body is not None:
        content = json.dumps(json_body).encode()
    req = urllib.request.Request(url, data=content, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Reply(r.status, {k.lower(): v for k, v in r.headers.items()},
                         r.read().decode())
    except urllib.error.HTTPError as e:
        return Reply(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode())


def post(url, content=None, json=None, timeout=30):
    return http("POST", url, content, json, timeout)


def get(url):
    return http("GET", url)


class Stream:
    """A raw streaming connection: .head the bytes read so far, recv() the next ones."""

    def __init__(self, sock, head):
        self.sock, self.head = sock, head

    def recv(self, n):
        return self.sock.recv(n)

    def settimeout(self, t):
        self.sock.settimeout(t)


@contextmanager
def open_stream(url, body):
    """A raw streaming completion read until its first event; closing it leaves mid-stream."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    data = json.dumps({**body, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    got = b""
    while b"data:" not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    try:
        yield Stream(s, got)
    finally:
        s.close()


def client(url, key="none"):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f, _ = with_tokenizer(tmp_path_factory.mktemp("serve"))
    return f


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory):
    """`lathe generate`'s greedy text for PROMPTS and one chat prompt."""
    tmp = tmp_path_factory.mktemp("ref")
    rows = [{"prompt_ids": p} for p in PROMPTS]
    rows.append({"messages": [{"role": "user", "content": "hi there"}]})
    out = tmp / "out.jsonl"
    run(["generate", "--checkpoint", folder, "--input", write_jsonl(tmp / "in.jsonl", rows),
         "--output", out, "--temperature", 0, "--max-new-tokens", NEW, "--device", "cpu"])
    return [r["text"] for r in read_jsonl(out)]


def test_greedy_streaming_and_concurrent_equal_generate(folder, reference):
    with serve(folder, "--max-seqs", 3) as url:
        c = client(url)
        # One at a time.
        for p, want in zip(PROMPTS, reference):
            r = c.completions.create(model="tok", prompt=p, max_tokens=NEW, temperature=0)
            assert r.choices[0].text == want
            assert r.usage.prompt_tokens == len(p)
        # A list of prompts: choices in prompt order.
        r = c.completions.create(model="tok", prompt=PROMPTS, max_tokens=NEW, temperature=0)
        assert [ch.text for ch in sorted(r.choices, key=lambda ch: ch.index)] == reference[:4]
        # Streamed: the deltas add up to the same text.
        for p, want in zip(PROMPTS, reference):
            parts = [ch.choices[0].text for ch in c.completions.create(
                model="tok", prompt=p, max_tokens=NEW, temperature=0, stream=True)]
            assert "".join(parts) == want
        # Concurrent clients: 12 requests over 3 engine sequences, joining and leaving.
        jobs = [PROMPTS[i % 4] for i in range(12)]
        with ThreadPoolExecutor(12) as ex:
            got = list(ex.map(lambda p: c.completions.create(
                model="tok", prompt=p, max_tokens=NEW, temperature=0).choices[0].text, jobs))
        assert got == [reference[i % 4] for i in range(12)]
        # Every sequence's first token, then one gap before each later token.
        sequences = 3 * len(PROMPTS) + 12
        assert metric(url, "lathe_time_to_first_token_seconds_count") == sequences
        assert metric(url, "lathe_time_per_output_token_seconds_count") == \
            metric(url, "lathe_generation_tokens_total") - sequences
        assert c.models.list().data[0].id == "tok"


def hf_loglik(folder, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return [float(lp[t - 1, ids[t]]) for t in range(1, len(ids))], lp


def test_echo_logprobs_equal_transformers(folder):
    ctx, cont = [5, 9, 17, 40, 41], [42, 43, 44]
    ids = ctx + cont
    want, lp = hf_loglik(folder, ids)
    with serve(folder) as url:
        c = client(url)
        # lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs=1, temperature
        # 0; max_tokens 1 (its request) and 0.
        for max_tokens in (1, 0):
            r = c.completions.create(model="tok", prompt=[ids, ctx], echo=True, logprobs=1,
                                     max_tokens=max_tokens, temperature=0, seed=1234)
            ch = sorted(r.choices, key=lambda ch: ch.index)
            got = ch[0].logprobs.token_logprobs
            assert got[0] is None and len(got) == len(ids) + max_tokens
            assert max(abs(a - b) for a, b in zip(got[1:len(ids)], want)) < 1e-4
            for t in range(1, len(ids)):
                top = ch[0].logprobs.top_logprobs[t]
                assert abs(max(top.values()) - float(lp[t - 1].max())) < 1e-4
            assert ch[0].text.startswith(bytes(ids).decode("latin-1")[:0])
            assert len(ch[1].logprobs.token_logprobs) == len(ctx) + max_tokens
            if max_tokens == 1:  # the greedy token after the prompt and its log-probability
                assert abs(got[-1] - float(lp[-1].max())) < 1e-4
        # Generated tokens' logprobs without echo.
        r = c.completions.create(model="tok", prompt=ids, logprobs=2, max_tokens=3,
                                 temperature=0)
        lps = r.choices[0].logprobs
        assert len(lps.token_logprobs) == 3 and all(len(t) == 2 for t in lps.top_logprobs)
        assert abs(lps.token_logprobs[0] - float(lp[-1].max())) < 1e-4


def test_seeded_n_chat_and_stops(folder, reference):
    with serve(folder) as url:
        c = client(url)
        kw = dict(model="tok", prompt="hello", max_tokens=NEW, temperature=1.0, n=3)
        a = [ch.text for ch in c.completions.create(seed=5, **kw).choices]
        assert a == [ch.text for ch in c.completions.create(seed=5, **kw).choices]
        assert a != [ch.text for ch in c.completions.create(seed=6, **kw).choices]
        assert len(set(a)) > 1
        # Chat: the checkpoint's template, as `lathe generate` renders messages.
        msgs = [{"role": "user", "content": "hi there"}]
        r = c.chat.completions.create(model="tok", messages=msgs, max_tokens=NEW, temperature=0)
        assert r.choices[0].message.content == reference[4]
        assert r.choices[0].message.role == "assistant"
        s = c.chat.completions.create(model="tok", messages=msgs, max_tokens=NEW, temperature=0,
                                      stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in s) == reference[4]
        # A stop string: the text ends right before it.
        free = c.completions.create(model="tok", prompt="hi", max_tokens=24, temperature=1,
                                    seed=3).choices[0].text
        stop = next(ch for ch in free[2:] if ch.isalnum())
        r = c.completions.create(model="tok", prompt="hi", max_tokens=24, temperature=1, seed=3,
                                 stop=["zzz", stop])
        assert r.choices[0].text == free[:free.index(stop)]
        assert r.choices[0].finish_reason == "stop"
        parts = [ch.choices[0].text for ch in c.completions.create(
            model="tok", prompt="hi", max_tokens=24, temperature=1, seed=3, stop=["zzz", stop],
            stream=True)]
        assert "".join(parts) == free[:free.index(stop)]


BAD = [
    (b'{"prompt": "x"', 400, None),
    (b'[1, 2]', 400, None),
    (b'{"max_tokens": 2}', 400, "prompt"),
    (b'{"prompt": 5}', 400, "prompt"),
    (b'{"prompt": []}', 400, "prompt"),
    (b'{"prompt": [1, "a"]}', 400, "prompt"),
    (b'{"prompt": [1, 256]}', 400, "prompt"),
    (b'{"prompt": "x", "max_tokens": "2"}', 400, "max_tokens"),
    (b'{"prompt": "x", "max_tokens": 1000}', 400, "max_tokens"),
    (b'{"prompt": "x", "temperature": 5}', 400, "temperature"),
    (b'{"prompt": "x", "top_p": 0}', 400, "top_p"),
    (b'{"prompt": "x", "n": 0}', 400, "n"),
    (b'{"prompt": "x", "stop": 3}', 400, "stop"),
    (b'{"prompt": "x", "stream": "yes"}', 400, "stream"),
    (b'{"prompt": "x", "logprobs": 99}', 400, "logprobs"),
    (b'{"prompt": "' + b"a" * 200 + b'"}', 400, "prompt"),
]


def test_bad_input_never_takes_the_server_down(folder):
    with serve(folder) as url:
        for body, code, param in BAD:
            r = post(url + "/v1/completions", content=body, timeout=30)
            assert r.status_code == code, (body, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
            assert err["param"] == param, (body, err)
            assert get(url + "/health").status_code == 200
        long = post(url + "/v1/completions", json={"prompt": "a" * 200}).json()["error"]
        assert long["code"] == "context_length_exceeded"
        chat = post(url + "/v1/chat/completions", json={"messages": "x"})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
        missing = get(url + "/v1/nothing")
        assert missing.status_code == 404 and "error" in missing.json()
        # A client that leaves mid-stream: its sequence leaves the batch, the server goes on.
        with open_stream(url, {"prompt": "hello", "max_tokens": 80, "temperature": 1}):
            pass
        r = client(url).completions.create(model="tok", prompt="hi", max_tokens=2)
        assert len(r.choices[0].text) > 0
        deadline = time.time() + 10
        while "lathe_running_sequences 0" not in get(url + "/metrics").text:
            assert time.time() < deadline
            time.sleep(0.05)


def metric(url, name):
    for line in get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def wait_for(cond, what, timeout=20):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.02)


def test_overload_answers_503(folder):
    with serve(folder, "--max-seqs", 1, "--max-queue", 1, ctx=4096) as url:
        c = client(url)
        want = c.completions.create(model="tok", prompt="hi", max_tokens=5,
                                    temperature=0).choices[0].text
        # A long stream holds the one engine sequence, a second request waits in the queue of
        # one: a third is refused with 503 and Retry-After (the openai client sees the status).
        with open_stream(url, {"prompt": "hello", "max_tokens": 4000, "temperature": 0}):
            with ThreadPoolExecutor(1) as ex:
                waiting = ex.submit(lambda: c.completions.create(
                    model="tok", prompt="hi", max_tokens=5, temperature=0).choices[0].text)
                wait_for(lambda: metric(url, "lathe_queue_depth") == 1, "a queued request")
                r = post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "overloaded"
                with pytest.raises(openai.APIStatusError) as e:
                    c.completions.create(model="tok", prompt="x", max_tokens=2)
                assert e.value.status_code == 503
                assert metric(url, "lathe_running_sequences") == 1
            # Leaving the stream cancels it; the queued request runs (above, on leaving).
        assert waiting.result() == want
        # n beyond what the queue can ever hold is the request's fault: 400.
        r = post(url + "/v1/completions", json={"prompt": "x", "n": 3, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        r = post(url + "/v1/completions", json={"prompt": ["x", "y"], "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert c.completions.create(model="tok", prompt="hi", max_tokens=5,
                                    temperature=0).choices[0].text == want


def test_api_key_small_kv_pool_and_sigint(folder):
    # A paged KV pool of 4 blocks of 8 positions: a sequence longer than 32 can never run.
    with serve(folder, "--api-key", "sekret", "--kv-block-size", 8, "--kv-blocks", 4,
               sig=signal.SIGINT) as url:
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").completions.create(model="tok", prompt="x", max_tokens=1)
        r = post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert get(url + "/health").status_code == 200
        assert get(url + "/metrics").status_code == 401
        r = client(url, "sekret").completions.create(model="tok", prompt="x", max_tokens=1)
        assert len(r.choices) == 1
        with pytest.raises(openai.BadRequestError) as e:
            client(url, "sekret").completions.create(model="tok", prompt="x", max_tokens=40)
        assert "KV blocks" in str(e.value)
        # Three sequences of 2 blocks each share the pool two at a time, in greedy agreement.
        texts = [ch.text for ch in client(url, "sekret").completions.create(
            model="tok", prompt=["hi", "hi", "hi"], max_tokens=12, temperature=0).choices]
        assert len(set(texts)) == 1 and len(texts[0]) > 0


def test_flag_errors(tmp_path):
    for args, needle in [(["--checkpoint", tmp_path / "none"], "--checkpoint"),
                         (["--checkpoint", MODELS / "llama", "--max-seqs", 0], "--max-seqs"),
                         (["--checkpoint", MODELS / "llama", "--max-len", 10**7], "--max-len"),
                         (["--checkpoint", MODELS / "llama", "--device", "tpu"], "--device"),
                         (["--checkpoint", MODELS / "llama", "--kv-blocks", -1], "--kv-blocks"),
                         (["--checkpoint", MODELS / "llama", "--kv-block-size", -5],
                          "--kv-block-size must be in [0, 65536]"),
                         (["--checkpoint", MODELS / "llama", "--kv-block-size", -1],
                          "--kv-block-size"),
                         (["--checkpoint", MODELS / "llama", "--max-seqs", 2**63 - 1],
                          "--max-seqs must be in [1, 4096]"),
                         (["--checkpoint", MODELS / "llama", "--max-queue", 2**63 - 1],
                          "--max-queue must be in [1, 65536]"),
                         (["--checkpoint", MODELS / "llama", "--kv-blocks", 2**62],
                          "--kv-blocks must be in"),
                         (["--checkpoint", MODELS / "llama", "--default-max-tokens", 0],
                          "--default-max-tokens must be in"),
                         (["--checkpoint", MODELS / "llama", "--max-body-bytes", 10],
                          "--max-body-bytes"),
                         (["--checkpoint", MODELS / "llama", "--request-read-timeout-s", 0],
                          "--request-read-timeout-s must be in [1, 3600]")]:
        p = run(["serve", *args], check=False)
        assert p.returncode != 0 and p.stderr.startswith("lathe: error:") and needle in p.stderr


def test_a_port_already_served_is_refused(folder):
    # A second server on the port would share its clients with the first (SO_REUSEPORT).
    with serve(folder) as url:
        port = url.rstrip("/").rsplit(":", 1)[1]
        p = run(["serve", "--checkpoint", folder, "--port", port, "--device", "cpu"], check=False,
                timeout=60)
        assert p.returncode != 0 and "cannot listen" in p.stderr, p.stderr
        assert get(url + "/health").status_code == 200


def test_hostile_bodies_get_4xx_and_the_server_goes_on(folder):
    with serve(folder) as url:
        # Nesting far deeper than the parser's limit (the DOM and its printing recurse per level).
        for deep in (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                     b'{"prompt": "x", "n": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}",
                     b"[" * 100_000):
            r = post(url + "/v1/completions", content=deep)
            assert r.status_code == 400 and "deeper than 32" in r.json()["error"]["message"]
        # A bad value is named by its type, never printed whole.
        r = post(url + "/v1/completions", json={"prompt": "x", "max_tokens": [[1] * 5000]})
        assert r.status_code == 400 and len(r.text) < 400 and "array of 1 items" in r.text
        r = post(url + "/v1/completions", json={"prompt": "x", "stream": "y" * 100_000})
        assert r.status_code == 400 and len(r.text) < 400
        assert client(url).completions.create(model="tok", prompt="hi", max_tokens=2).choices


def test_huge_max_tokens_is_refused_and_others_go_on(folder):
    # A small paged pool: an over-committed admission would end the running sequences.
    with serve(folder, "--kv-block-size", 8, "--kv-blocks", 24) as url:
        with open_stream(url, {"prompt": "hello", "max_tokens": 60, "temperature": 0}) as s:
            for m in (2**63 - 1, 2**63 - 2, 2**63 - 90, 97):
                r = post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": m})
                assert r.status_code == 400, r.text
                assert r.json()["error"]["code"] == "context_length_exceeded"
            r = post(url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2**63 - 1})
            assert r.status_code == 400
            got = s.head
            while b"[DONE]" not in got:
                chunk = s.recv(65536)
                assert chunk, got
                got += chunk
            assert b'"error"' not in got and b'"finish_reason":"length"' in got


def test_large_requests_are_refused_before_the_work(folder):
    with serve(folder, "--max-body-bytes", 200_000) as url:
        # Many prompts: refused by count against the queue before tokenizing any.
        t = time.time()
        r = post(url + "/v1/completions", json={"prompt": ["ab"] * 20_000, "max_tokens": 1})
        assert r.status_code == 400 and "--max-queue" in r.json()["error"]["message"]
        assert time.time() - t < 2
        r = post(url + "/v1/completions", json={"prompt": ["ab"] * 40, "n": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        for stop, needle in ((["a", "b", "c", "d", "e"], "at most 4"),
                             (["x" * 257], "at most 256")):
            r = post(url + "/v1/completions", json={"prompt": "x", "stop": stop})
            assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
        r = post(url + "/v1/completions", json={"prompt": "x", "stop": ["x" * 256] * 4,
                                                "max_tokens": 2})
        assert r.status_code == 200, r.text
        r = post(url + "/v1/completions", json={"prompt": "x" * 300_000})
        assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]
        assert client(url).completions.create(model="tok", prompt="hi", max_tokens=2).choices


# Numeric and flag fields and values of the wrong type or out of range for them: each must get a
# 400 naming the field (param and message), never a 500, a dropped connection or an accepted
# request. 2**64 - 1 fits JSON parsers' unsigned 64 bits but no int64.
INT_BAD = ["2", [2], {"a": 1}, True, 1.5, 2.0, -1, 2**64 - 1, 1e300]
FLOAT_BAD = ["0.5", [0.5], {"a": 1}, True, -1, 1e300, 2**64 - 1]
BOOL_BAD = ["yes", 1, [True], {"a": 1}]
WRONG = ([(f, v) for f in ("max_tokens", "max_completion_tokens", "n", "top_k") for v in INT_BAD]
         + [("seed", v) for v in ("2", [2], True, 1.5, 2**64 - 1)]
         + [(f, v) for f in ("temperature", "top_p", "min_p", "repetition_penalty",
                             "presence_penalty", "frequency_penalty") for v in FLOAT_BAD]
         + [("stream", v) for v in BOOL_BAD])
ONLY = {"/v1/completions": ([("logprobs", v) for v in INT_BAD] + [("echo", v) for v in BOOL_BAD]),
        "/v1/chat/completions": ([("top_logprobs", v) for v in INT_BAD]
                                 + [("logprobs", v) for v in BOOL_BAD])}


def test_wrong_types_of_numeric_fields_get_400_naming_the_field(folder):
    bodies = {"/v1/completions": {"prompt": "hi"},
              "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]}}
    with serve(folder) as url:
        for path, base in bodies.items():
            for field, value in WRONG + ONLY[path]:
                r = post(url + path, json={**base, field: value})
                assert r.status_code == 400, (path, field, value, r.status_code, r.text)
                err = r.json()["error"]
                assert err["type"] == "invalid_request_error", (field, value, err)
                assert err["param"] == field and f"'{field}'" in err["message"], (field, value, err)
                # Only a token count past the context is context_length_exceeded.
                if err["code"] == "context_length_exceeded":
                    assert field in ("max_tokens", "max_completion_tokens") and \
                        isinstance(value, int) and value > CTX, (field, value, err)
                if value == 2**64 - 1:
                    assert str(2**64 - 1) in err["message"], (field, err)
        assert get(url + "/health").status_code == 200
        assert client(url).completions.create(model="tok", prompt="hi", max_tokens=2).choices


def read_to_end(s, got=b""):
    while chunk := s.recv(65536):
        got += chunk
    return got


def test_a_stream_ended_by_shutdown_closes_cleanly(folder):
    with serve(folder, ctx=4096) as url:
        with open_stream(url, {"prompt": "hello", "max_tokens": 4000, "temperature": 0}) as s:
            url.proc.send_signal(signal.SIGTERM)
            s.settimeout(20)
            got = read_to_end(s, s.head)
        # The error event, then [DONE] and the chunked body's last chunk.
        assert b'"error"' in got and b"shutting down" in got, got[-300:]
        assert got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), got[-300:]
        assert url.proc.wait(timeout=20) == 0


def test_text_offsets_continue_from_the_prompt_and_across_chunks(folder):
    with serve(folder) as url:
        body = {"prompt": "hello", "max_tokens": 6, "temperature": 0, "logprobs": 1}
        whole = post(url + "/v1/completions", json=body).json()["choices"][0]
        lp = whole["logprobs"]
        # The first new token follows the prompt's 5 bytes; each next one its token's bytes.
        want = [5]
        for t in lp["tokens"][:-1]:
            want.append(want[-1] + len(t.encode()))
        assert lp["text_offset"] == want
        echo = post(url + "/v1/completions", json={**body, "echo": True}).json()["choices"][0]
        assert echo["logprobs"]["text_offset"][0] == 0
        assert echo["logprobs"]["text_offset"][-len(lp["tokens"]):] == lp["text_offset"]
        offsets = []
        got = stream_raw(url, body)
        for line in got.split(b"\n"):
            if line.startswith(b"data: {"):
                ch = json.loads(line[6:])["choices"][0]
                if ch["logprobs"]:
                    offsets += ch["logprobs"]["text_offset"]
        assert offsets == lp["text_offset"]


def stream_raw(url, body):
    """A whole streaming completion's raw bytes (Connection: close: the server ends it)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        data = json.dumps({**body, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: " + str(len(data)).encode()
                  + b"\r\n\r\n" + data)
        return read_to_end(s)


def test_chat_without_max_tokens_is_bounded(folder):
    msgs = [{"role": "user", "content": "hi"}]
    with serve(folder, "--default-max-tokens", 3) as url:
        r = post(url + "/v1/chat/completions", json={"messages": msgs, "temperature": 1,
                                                      "seed": 5, "stop": None})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 3
        r = post(url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 5,
                                                      "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 5
