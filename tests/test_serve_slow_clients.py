"""`lathe serve` (src/cli/serve.cpp) and slow clients, on the CPU with the llama parity fixture and
a byte-level tokenizer (test_generate.with_tokenizer):

  - twice as many connections as the server has pool threads, each sending its request a byte a
    second (from its first byte, after its request line, or after its whole headers): a normal
    request is still answered, and each slow connection is closed about --request-read-timeout-s
    after it opened, with a 408 where its request line had arrived;
  - a stream that lasts longer than --request-read-timeout-s ends whole; the connection then
    serves its next request, whose body comes in two parts within the deadline; a request still
    arriving at the deadline gets a 408 and the connection closes;
  - the listening socket's backlog is net.core.somaxconn; a keep-alive connection is closed after
    its response while other connections wait for a thread; a stop does not wait for the deadline
    of a request still arriving; headers without end are cut at 64 KiB with a 431.
"""
import json
import select
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from test_generate import with_tokenizer
from test_serve import get, post, read_to_end, serve

DEADLINE = 3  # --request-read-timeout-s of the slow-client test


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f, _ = with_tokenizer(tmp_path_factory.mktemp("serve_slow"))
    return f


def address(url):
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def request_bytes(body):
    """A completion request's head and body bytes."""
    data = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n", data)


class SlowClient(threading.Thread):
    """A connection that sends a request a byte a second after its first bytes (one, the request
    line, or the whole headers), until the server closes it or `stop` is set; .reply the bytes it
    got, .lasted its seconds open."""

    def __init__(self, addr, fast, stop):
        super().__init__(daemon=True)
        head, data = request_bytes({"prompt": "x" * 200, "max_tokens": 1})
        self.request = head + data
        # The first byte at once: the server waits 2 s (the keep-alive timeout) for one.
        self.fast = {"none": 1, "line": self.request.index(b"\r\n") + 2, "head": len(head)}[fast]
        self.stop, self.reply, self.lasted, self.closed = stop, b"", None, False
        self.sock = socket.create_connection(addr, timeout=10)
        self.opened = time.monotonic()
        self.sock.sendall(self.request[:self.fast])

    def run(self):
        try:
            for i in range(self.fast, len(self.request)):
                if self.stop.is_set():
                    return
                self.sock.send(self.request[i:i + 1])
                # A second between bytes, less what the server sends; nothing read is a close.
                if select.select([self.sock], [], [], 1.0)[0]:
                    got = self.sock.recv(65536)
                    self.reply += got
                    if not got:
                        break
        except OSError:  # reset, or a send after the server's close
            pass
        finally:
            self.closed = not self.stop.is_set()
            self.lasted = time.monotonic() - self.opened
            self.sock.close()


def test_slow_clients_cannot_hold_every_thread(folder):
    # A pool of 2 * (--max-seqs + --max-queue) + 16 = 20 threads, 40 slow connections. Each recv
    # of theirs succeeds (a byte a second, within the per-recv read timeout): only a deadline for
    # the whole request frees their threads.
    stop = threading.Event()
    with serve(folder, "--max-seqs", 1, "--max-queue", 1, "--request-read-timeout-s",
               DEADLINE) as url:
        assert get(url + "/health").status_code == 200
        slow = [SlowClient(address(url), ["none", "line", "head"][i % 3], stop) for i in range(40)]
        for s in slow:
            s.start()
        try:
            time.sleep(1)  # every thread of the pool holds a slow connection
            start = time.monotonic()
            r = post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
            waited = time.monotonic() - start
            assert r.status_code == 200 and len(r.json()["choices"]) == 1, r.text
            # Behind at most the connections before it, each cut by its deadline.
            assert waited < DEADLINE + 15, waited
            for s in slow:
                s.join(timeout=DEADLINE + 20)
        finally:
            stop.set()
        for s in slow:
            assert s.closed, "a slow connection was never closed"
            assert DEADLINE - 0.5 < s.lasted < DEADLINE + 15, s.lasted
            assert s.reply == b"" or s.reply.startswith(b"HTTP/1.1 408 "), s.reply[:200]
        # A request line read: a 408 with an OpenAI error object (unless the close's reset lost
        # it); the others are closed without an answer.
        answered = [s.reply for s in slow if s.reply]
        assert answered and all(s.fast > 1 for s in slow if s.reply)
        err = json.loads(answered[0].split(b"\r\n\r\n", 1)[1])["error"]
        assert "--request-read-timeout-s" in err["message"], err
        assert get(url + "/health").status_code == 200


def read_response(s, got=b""):
    """One HTTP/1.1 response (Content-Length or chunked) from a socket: its head and body bytes,
    and what follows it."""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    head, rest = got.split(b"\r\n\r\n", 1)
    if b"transfer-encoding: chunked" in head.lower():
        while not rest.endswith(b"\r\n0\r\n\r\n"):
            chunk = s.recv(65536)
            assert chunk, rest[-200:]
            rest += chunk
        return head, rest, b""
    n = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")))
    while len(rest) < n:
        chunk = s.recv(65536)
        assert chunk, rest
        rest += chunk
    return head, rest[:n], rest[n:]


def test_long_streams_and_keep_alive_outlast_the_deadline(folder):
    # One sequence at a time: n = 8 streams of 4000 tokens take several times the deadline.
    with serve(folder, "--max-seqs", 1, "--max-queue", 8, "--request-read-timeout-s", 2,
               ctx=4096) as url:
        with socket.create_connection(address(url), timeout=30) as s:
            head, data = request_bytes({"prompt": "hello", "max_tokens": 4000, "n": 8,
                                        "temperature": 0, "stream": True})
            start = time.monotonic()
            s.sendall(head + data)
            head, body, rest = read_response(s)
            lasted = time.monotonic() - start
            assert head.startswith(b"HTTP/1.1 200 ") and body.endswith(b"data: [DONE]\n\n\r\n"
                                                                        b"0\r\n\r\n"), body[-300:]
            assert body.count(b'"finish_reason":"length"') == 8
            assert lasted > 2.5, f"the stream took {lasted:.2f} s: not longer than the deadline"
            # The same connection: the next request's deadline runs from the stream's end; its
            # body in two parts 0.3 s apart (1.7 s inside the deadline).
            head, data = request_bytes({"prompt": "hi", "max_tokens": 2})
            s.sendall(head + data[:5])
            time.sleep(0.3)
            s.sendall(data[5:])
            head, body, _ = read_response(s, rest)
            assert head.startswith(b"HTTP/1.1 200 "), head + body
            assert len(json.loads(body)["choices"]) == 1
            # A request still arriving at the deadline: 408, and the connection closes.
            s.sendall(request_bytes({"prompt": "hi"})[0] + b"{")
            head, body, rest = read_response(s)
            assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
            assert json.loads(body)["error"]["code"] == "request_timeout"
            assert read_to_end(s, rest) == b""


def test_the_listening_socket_takes_a_burst_of_connections(folder):
    """cpp-httplib 0.11 listens with a backlog of 5; serve asks for the kernel's largest
    (net.core.somaxconn), so a burst of clients opening at once is queued by the kernel instead of
    waiting for SYN retransmits. `ss` reports a listening socket's backlog as its Send-Q."""
    ss = shutil.which("ss")
    if ss is None:
        pytest.skip("ss (iproute2) is not installed")
    with open("/proc/sys/net/core/somaxconn") as f:
        somaxconn = int(f.read())
    with serve(folder) as url:
        _, port = address(url)
        out = subprocess.run([ss, "-ltnH", f"sport = :{port}"], capture_output=True, text=True,
                             check=True).stdout.split()
        # State Recv-Q Send-Q Local-Address:Port Peer-Address:Port
        assert out[0] == "LISTEN" and out[3].endswith(f":{port}"), out
        assert int(out[2]) == somaxconn, out


def test_no_keep_alive_while_connections_wait_for_a_thread(folder):
    """A keep-alive connection gives its thread back after a response while others wait for one
    (Connection: close), so that a client sending each request just inside its deadline holds a
    thread for one deadline, not one a request."""
    with serve(folder, "--max-seqs", 1, "--max-queue", 1) as url:  # 20 pool threads
        with socket.create_connection(address(url), timeout=30) as s:
            head, data = request_bytes({"prompt": "hi", "max_tokens": 1})
            s.sendall(head + data)
            first, _, _ = read_response(s)
            assert first.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in first.lower()
            # 30 idle connections: 19 take the other threads, 11 wait (each idles up to 2 s)
            idle = [socket.create_connection(address(url), timeout=30) for _ in range(30)]
            time.sleep(0.5)
            s.sendall(head + data)
            second, _, rest = read_response(s)
            assert second.startswith(b"HTTP/1.1 200 ") and b"connection: close" in second.lower()
            assert read_to_end(s, rest) == b""
            for c in idle:
                c.close()


def test_a_stop_does_not_wait_for_a_request_still_arriving(folder):
    with serve(folder) as url:  # the default deadline, 30 s
        with socket.create_connection(address(url), timeout=30) as s:
            head, _ = request_bytes({"prompt": "hi"})
            s.sendall(head[:20])
            t0 = time.monotonic()
            url.proc.send_signal(signal.SIGTERM)
            # the request keeps arriving, a byte every half second, while the server stops
            for b in head[20:]:
                if url.proc.poll() is not None or time.monotonic() - t0 > 25:
                    break
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    pass
                time.sleep(0.5)
            url.proc.wait(timeout=25)
            took = time.monotonic() - t0
    assert took < 5, f"the server took {took:.1f} s to stop beside a request still arriving"


def test_headers_without_end_are_cut(folder):
    """Headers sent at full speed and without end never make a read wait, so no deadline fires:
    the head of a request may take 64 KiB, then the answer is 431 and the connection closes. A
    head just under that is served."""
    with serve(folder, "--request-read-timeout-s", 30) as url:
        big = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 90) for i in range(600))  # ~60 KiB
        head, data = request_bytes({"prompt": "hi", "max_tokens": 1})
        with socket.create_connection(address(url), timeout=30) as s:
            line, rest = head.split(b"\r\n", 1)
            s.sendall(line + b"\r\n" + big + rest + data)
            answer, _, _ = read_response(s)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
        with socket.create_connection(address(url), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            sent, t0 = 0, time.monotonic()
            try:
                while time.monotonic() - t0 < 20:
                    s.sendall(b"X-Pad: " + b"p" * 1000 + b"\r\n")
                    sent += 1009
                    ready, _, _ = select.select([s], [], [], 0)
                    if ready:
                        break
            except OSError:  # the server closed while headers were still going out
                pass
            got = read_to_end(s)
        took = time.monotonic() - t0
        # (the kernel's socket buffers take a few MB more after the server stops reading)
        assert took < 10, f"{took:.1f} s and {sent} bytes of headers taken without an answer"
        assert got.startswith(b"HTTP/1.1 431 "), got[:200]
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == \
            "request_header_too_large"
