#!/usr/bin/env python3
"""klinear serve against hostile clients, over raw sockets (issue 34's table).

Each case failed on the server before its fix and must now be a clear error or bounded behaviour,
with the server still answering afterwards:
  nested JSON      100,000 levels in prompt, temperature, stop, messages, tools and /tokenize: 400
                   naming the depth limit, the reply short (no value echoed); it segfaulted
  gzip bomb        a ~100 KB gzip body (inside --max-body-bytes) that inflates to 100 MB: 413 on the decoded bytes; it was
                   inflated whole (200 MB aborted the server)
  chunked flood    a chunked body past --max-body-bytes: 413; it was read whole
  port in use      a second serve on a busy port exits 2 naming the port; it started (SO_REUSEPORT)
                   and the kernel split the connections between the two
  API key          from --api-key-file or KLINEAR_API_KEY (the command line shows in `ps`); an
                   empty file or variable is refused at start
  TCP_NODELAY      20 small replies on one keep-alive connection, the median under 20 ms (Nagle
                   held each reply's body ~40 ms)
  drain            SIGTERM with a request running that has no max_tokens (the rest of a ~1M-token
                   context): /health is 503 while draining, the server exits after
                   --shutdown-timeout with the stream ended; a second signal exits at once
  long prompt      a 1M-id prompt (the cache holds it) beside short requests: each short one answered
                   within 15 s (they waited for its whole prefill, hours: each chunk took the step's whole
                   budget, and each step attended over up to 2·10⁹ query-key pairs)
  slowloris        300 connections each holding a head partly sent: /health answered within 1 s and
                   a completion served; past 16 per client they get 429, the rest 408 at
                   --header-timeout (they held every HTTP thread; /health went unanswered)
  slow body        a body trickled a byte at a time gets 408 at --body-timeout (each byte restarted
                   the read timeout)
  busy threads     every request thread reading a slow body: /health and /metrics answered within
                   1 s (they waited for a free thread)
  pipelining       three requests in one write on a keep-alive connection: three replies in order
                   (the second and third were dropped)
  half-close       a request followed by shutdown(SHUT_WR) gets its whole reply (the hang-up check
                   cancelled it)
  out of memory    a 72 MB prompt list whose parse runs out of memory (the address space capped at
                   the server's size + 512 MiB) fails that request alone (SIGABRT: nlohmann's
                   destructor allocates, and threw while unwinding); skipped under the sanitizers,
                   whose allocators end the process on a failed allocation by design

usage: hostile_server_test.py --klinear BIN --source REPO
"""
import argparse
import gzip
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from openai_client_test import MODEL, Server, check, run_checks  # noqa: E402

KEY = "hostile-key"
PORT_LINE = r"on http://[^:]+:(\d+)"


def still_serving(s):
    status, data = s.raw("POST", "/v1/completions",
                         json.dumps({"model": MODEL, "prompt": "still there?", "max_tokens": 2}))
    check(status == 200, f"the server stopped answering: HTTP {status} {data[:200]!r}")


def nested(depth):
    return "[" * depth + "]" * depth


def test_nested_json(s):
    deep = nested(100000)
    cases = [
        ("/v1/completions", '{"model": "%s", "prompt": %s}' % (MODEL, deep)),
        ("/v1/completions", '{"model": "%s", "prompt": "x", "temperature": %s}' % (MODEL, deep)),
        ("/v1/completions", '{"model": "%s", "prompt": "x", "stop": %s}' % (MODEL, deep)),
        ("/v1/chat/completions", '{"model": "%s", "messages": %s}' % (MODEL, deep)),
        ("/v1/chat/completions",
         '{"model": "%s", "messages": [{"role": "user", "content": "x"}], "tools": %s}' % (MODEL, deep)),
        ("/tokenize", '{"prompt": %s}' % deep),
    ]
    for path, body in cases:
        status, data = s.raw("POST", path, body)
        check(status == 400, f"{path} nested 100k deep: HTTP {status}")
        message = json.loads(data)["error"]["message"]
        check("nest" in message and "512" in message, f"{path}: the error does not name the depth limit: {message!r}")
        check(len(data) < 2000, f"{path}: a {len(data)}-byte error echoes the body")
    still_serving(s)


def test_gzip_bomb(s):
    body = b'{"prompt": "' + b"a" * (100 << 20) + b'"}'
    bomb = gzip.compress(body, 9)
    check(len(bomb) < s.max_body, f"the bomb ({len(bomb)} bytes) must pass the Content-Length check")
    rss = s.rss_kib()
    status, data = s.raw("POST", "/v1/completions", bomb, {"Content-Encoding": "gzip"})
    check(status == 413, f"gzip bomb: HTTP {status} {data[:200]!r}")
    check("after decoding" in json.loads(data)["error"]["message"], data)
    grown = (s.rss_kib() - rss) / 1024
    check(grown < 50, f"RSS grew {grown:.0f} MiB reading a bomb")
    still_serving(s)


def test_chunked_flood(s):
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                  "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" % KEY).encode())
    chunk = b"%x\r\n%s\r\n" % (65536, b"a" * 65536)
    sent = 0
    try:
        while sent < (64 << 20):  # far past the limit: the server must answer (and stop reading) first
            sock.sendall(chunk)
            sent += 65536
    except (BrokenPipeError, ConnectionResetError):
        pass
    reply = b""
    try:
        while b"\r\n\r\n" not in reply:
            part = sock.recv(65536)
            if not part:
                break
            reply += part
    except ConnectionResetError:
        pass
    sock.close()
    check(reply.startswith(b"HTTP/1.1 413"), f"chunked flood of {sent >> 20} MiB: {reply[:100]!r}")
    still_serving(s)


def test_port_in_use(s, serve):
    p = subprocess.run(serve + ["--port", str(s.port)], capture_output=True, text=True, timeout=120)
    check(p.returncode == 2, f"a second server on busy port {s.port}: exit {p.returncode}\n{p.stderr[-500:]}")
    check(f":{s.port}" in p.stderr and "in use" in p.stderr, f"the error does not name the port: {p.stderr[-500:]}")
    still_serving(s)


def test_api_key_sources(s, serve, tmp):
    # The main server took its key from --api-key-file.
    status, _ = s.raw("GET", "/v1/models")
    check(status == 200, f"the key from --api-key-file: HTTP {status}")
    status, _ = s.raw("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY[:-1] + "x"})
    check(status == 401, f"a wrong key of the same length: HTTP {status}")
    env_server = Server(serve + ["--port", "0"], PORT_LINE, env=dict(os.environ, KLINEAR_API_KEY="from-env"),
                        key="from-env")
    try:
        check(env_server.raw("GET", "/v1/models")[0] == 200, "KLINEAR_API_KEY not used")
        check(env_server.raw("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY})[0] == 401,
              "KLINEAR_API_KEY not required")
    finally:
        env_server.stop()
    empty = os.path.join(tmp, "empty-key")
    open(empty, "w").close()
    for extra, env, word in ((["--api-key-file", empty], {}, "empty key"),
                             ([], {"KLINEAR_API_KEY": ""}, "KLINEAR_API_KEY")):
        p = subprocess.run(serve + ["--port", "0"] + extra, capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, **env))
        check(p.returncode == 2 and word in p.stderr, f"{extra or env}: exit {p.returncode}: {p.stderr[-300:]}")


def test_no_nagle(s):
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY})
        r = conn.getresponse()
        r.read()
        times.append(time.perf_counter() - t0)
        check(r.status == 200, f"HTTP {r.status}")
    conn.close()
    median = statistics.median(times) * 1000
    check(median < 20, f"keep-alive replies take {median:.1f} ms (median of 20): Nagle?")


def test_drain(serve):
    s = Server(serve + ["--port", "0", "--shutdown-timeout", "2", "--cache-memory", "256M"], PORT_LINE, key=KEY)
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    # No max_tokens: the rest of the context, far more than 2 s of decoding.
    conn.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": "go", "stream": True,
                                                             "ignore_eos": True}),
                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    r = conn.getresponse()
    check(r.status == 200, f"stream: HTTP {r.status}")
    r.readline()
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    seen_503 = False
    while s.proc.poll() is None and time.time() - t0 < 30:
        try:
            status, _ = s.raw("GET", "/health", timeout=5)
            seen_503 = seen_503 or status == 503
        except OSError:
            pass
        time.sleep(0.05)
    code = s.proc.wait(timeout=60)
    waited = time.time() - t0
    check(seen_503, "/health never answered 503 while draining")
    check(code == 0 and waited < 15, f"drain with --shutdown-timeout 2: exit {code} after {waited:.1f} s")
    rest = r.read()  # the stream ended (cancelled at the deadline), it did not hang
    check(b"data: [DONE]" in rest or rest == b"", rest[-200:])
    conn.close()

    s = Server(serve + ["--port", "0", "--shutdown-timeout", "600", "--cache-memory", "256M"], PORT_LINE, key=KEY)
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": "go", "stream": True,
                                                             "ignore_eos": True}),
                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    conn.getresponse().readline()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    code = s.proc.wait(timeout=30)
    check(code == 130 and time.time() - t0 < 10, f"a second signal: exit {code} after {time.time() - t0:.1f} s")
    conn.close()


def test_long_prompt(bare):
    """A 1M-id prompt admitted beside short requests: each short one is answered within a bounded time."""
    s = Server(bare + ["--port", "0", "--cache-memory", "256M", "--shutdown-timeout", "1"], PORT_LINE, key=KEY)
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    try:
        long_prompt = json.dumps({"model": MODEL, "prompt": [5] * 1000000, "max_tokens": 1})
        conn.request("POST", "/v1/completions", body=long_prompt,
                     headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        time.sleep(3)  # parsed, admitted, its prefill under way
        worst = 0.0
        for _ in range(3):
            t0 = time.time()
            status, data = s.raw("POST", "/v1/completions",
                                 json.dumps({"model": MODEL, "prompt": "hello there", "max_tokens": 4}), timeout=60)
            worst = max(worst, time.time() - t0)
            check(status == 200, f"a short request beside the long prompt: HTTP {status} {data[:200]!r}")
        check(worst < 15, f"a short request beside a 1M-id prompt took {worst:.1f} s")
    finally:
        conn.close()
        s.stop()


def read_reply(f):
    """One HTTP response from the file `f` of a socket, skipping interim 1xx replies: (status, body)."""
    while True:
        line = f.readline()
        if not line:
            return None, b""
        status = int(line.split()[1])
        headers = {}
        for h in iter(f.readline, b"\r\n"):
            if not h:
                return status, b""
            k, _, v = h.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        if status >= 200:
            return status, f.read(int(headers.get("content-length", "0")))


def request_bytes(method, path, body=b"", extra=""):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n{extra}"
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def timed_health(s, what):
    t0 = time.perf_counter()
    status, _ = s.raw("GET", "/health", timeout=10)
    took = time.perf_counter() - t0
    check(status == 200 and took < 1, f"/health with {what}: HTTP {status} after {took:.2f} s")
    status, _ = s.raw("GET", "/metrics", timeout=10)
    check(status == 200, f"/metrics with {what}: HTTP {status}")


def test_slowloris(s):
    # 300 connections that each send part of a head and then nothing: they held all the HTTP
    # threads (the socket's read timeout restarts with every byte), so /health went unanswered.
    socks = []
    for _ in range(300):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        socks.append(c)
    time.sleep(0.3)
    timed_health(s, "300 slow heads open")
    still_serving(s)
    # Past the cap of 16 slow heads per client the server answers 429; the rest get 408 at
    # --header-timeout (2 s here).
    replies = []
    for c in socks:
        c.settimeout(8)
        try:
            replies.append(c.recv(64)[:12])
        except OSError:
            replies.append(b"")
        c.close()
    check(replies.count(b"HTTP/1.1 429") >= 300 - 16, f"429 for {replies.count(b'HTTP/1.1 429')} of 300 slow heads")
    check(replies.count(b"HTTP/1.1 408") + replies.count(b"HTTP/1.1 429") == 300,
          f"slow heads not all answered 408 or 429: {sorted(set(replies))}")


def test_slow_body(s):
    # A body trickled a byte at a time: the read timeout restarted with each byte. The body must
    # arrive within --body-timeout (2 s here), else 408.
    c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    c.sendall(request_bytes("POST", "/v1/completions", b"")[:-2].replace(b"Content-Length: 0", b"Content-Length: 1000")
              + b"\r\n{")
    t0 = time.time()
    c.setblocking(False)
    reply = b""
    while time.time() - t0 < 8 and not reply:
        try:
            c.send(b" ")
            reply = c.recv(4096)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            break
        time.sleep(0.2)
    took = time.time() - t0
    c.close()
    check(reply.startswith(b"HTTP/1.1 408") and took < 5, f"a trickled body: {reply[:40]!r} after {took:.1f} s")
    still_serving(s)


def test_busy_threads(serve):
    # Every request thread (64 here) reading a slow body: /health and /metrics still answer.
    s = Server(serve + ["--port", "0", "--cache-memory", "16M", "--max-queue", "1", "--max-num-seqs", "1",
                        "--body-timeout", "30"], PORT_LINE, key=KEY)
    socks = []
    try:
        for _ in range(80):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            c.sendall(request_bytes("POST", "/v1/completions", b"")[:-2].replace(b"Content-Length: 0",
                                                                                   b"Content-Length: 1000") + b"\r\n{")
            socks.append(c)
        time.sleep(0.5)
        timed_health(s, "every request thread busy")
    finally:
        for c in socks:
            c.close()
        s.stop()


def test_pipelining(s):
    # Three requests in one write on a keep-alive connection: all three answered, in order (the
    # ones after the first were dropped).
    c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    body = json.dumps({"model": MODEL, "prompt": "pipelined", "max_tokens": 2}).encode()
    c.sendall(request_bytes("GET", "/v1/models") + request_bytes("POST", "/v1/completions", body) +
              request_bytes("GET", "/health"))
    f = c.makefile("rb")
    replies = [read_reply(f) for _ in range(3)]
    c.close()
    check([r[0] for r in replies] == [200, 200, 200], f"pipelined replies: {[r[0] for r in replies]}")
    check(json.loads(replies[0][1])["object"] == "list" and json.loads(replies[1][1])["object"] == "text_completion",
          f"pipelined replies out of order: {[r[1][:60] for r in replies]}")


def test_half_close(s):
    # A client that sends its request and shuts down its write side still gets the whole reply
    # (the hang-up check took the half-close for a disconnect and cancelled the request).
    for body in (None, {"model": MODEL, "prompt": "half", "max_tokens": 4, "ignore_eos": True}):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        c.sendall(request_bytes("POST", "/v1/completions", json.dumps(body).encode()) if body
                  else request_bytes("GET", "/health"))
        c.shutdown(socket.SHUT_WR)
        status, data = read_reply(c.makefile("rb"))
        c.close()
        check(status == 200, f"half-closed {'completion' if body else '/health'}: HTTP {status} {data[:200]!r}")
        if body:
            usage = json.loads(data)["usage"]
            check(usage["completion_tokens"] == 4, f"half-closed completion cut short: {usage}")


def test_out_of_memory(bare):
    s = Server(bare + ["--port", "0", "--cache-memory", "16M", "--max-body-bytes", "100000000"], PORT_LINE, key=KEY)
    try:
        # One request first, so that what a first step maps (OpenBLAS's buffers, a thread's malloc
        # arena) is in place before the cap: Debian's OpenBLAS retries a failed mmap forever.
        still_serving(s)
        with open(f"/proc/{s.proc.pid}/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        cap = size + (512 << 20)
        # The soft limit only, lifted again before the server is stopped: under CI's load a capped
        # server once printed "drained, exiting" and did not exit within 120 s.
        resource.prlimit(s.proc.pid, resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
        # 24M ids: ~400 MB as parsed JSON values, more than the cap leaves.
        body = '{"model": "%s", "max_tokens": 1, "prompt": [%s5]}' % (MODEL, "5," * 24000000)
        status, data = s.raw("POST", "/v1/completions", body)
        check(status in (413, 500, 503), f"a request that ran out of memory: HTTP {status} {data[:200]!r}")
        check(b"memory" in data, f"the error does not say memory ran out: {data[:200]!r}")
        still_serving(s)
    finally:
        if s.proc.poll() is None:
            resource.prlimit(s.proc.pid, resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--klinear", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="klinear_hostile_")
    failures = []
    server = None
    try:
        model = os.path.join(tmp, MODEL)
        subprocess.run([a.klinear, "init", "--preset", "kimi-linear-tiny", "--out", model, "--tokenizer",
                        os.path.join(a.source, "tokenizers/kimi-k2")], check=True, capture_output=True)
        key_file = os.path.join(tmp, "key")
        with open(key_file, "w") as f:
            f.write(KEY + "\n")
        max_body = 300000  # room for 100,000 levels of nesting (200 KB), not for the bombs
        serve = [a.klinear, "serve", "--model", model, "--max-body-bytes", str(max_body)]
        server = Server(serve + ["--port", "0", "--cache-memory", "16M", "--api-key-file", key_file,
                                 "--header-timeout", "2", "--body-timeout", "2"], PORT_LINE, key=KEY)
        server.max_body = max_body
        keyed = serve + ["--api-key-file", key_file]
        tests = [("nested_json", lambda: test_nested_json(server)),
                 ("gzip_bomb", lambda: test_gzip_bomb(server)),
                 ("chunked_flood", lambda: test_chunked_flood(server)),
                 ("port_in_use", lambda: test_port_in_use(server, keyed + ["--cache-memory", "16M"])),
                 ("api_key_sources", lambda: test_api_key_sources(server, serve + ["--cache-memory", "16M"], tmp)),
                 ("no_nagle", lambda: test_no_nagle(server)),
                 ("drain", lambda: test_drain(keyed)),
                 ("long_prompt", lambda: test_long_prompt([a.klinear, "serve", "--model", model, "--api-key-file",
                                                           key_file])),
                 ("slowloris", lambda: test_slowloris(server)),
                 ("slow_body", lambda: test_slow_body(server)),
                 ("busy_threads", lambda: test_busy_threads(keyed)),
                 ("pipelining", lambda: test_pipelining(server)),
                 ("half_close", lambda: test_half_close(server))]
        if "ASAN_OPTIONS" in os.environ:
            print("[SKIP] out_of_memory (a sanitizer's allocator ends the process when an allocation fails)")
        else:
            tests.append(("out_of_memory", lambda: test_out_of_memory([a.klinear, "serve", "--model", model,
                                                                        "--api-key-file", key_file])))
        failures += run_checks(tests)
    finally:
        if server and server.proc.poll() is None:
            server.stop()
        if failures and server:
            print("---- server log:\n" + "".join(server.log[-30:]))
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
