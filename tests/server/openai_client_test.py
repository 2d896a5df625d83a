#!/usr/bin/env python3
"""klinear serve driven by the official `openai` Python client on loopback.

Starts `klinear serve` on a random-weight test checkpoint that carries the real Kimi tokenizer
(CPU backend) and checks what clients rely on: chat and text completions, streaming and not,
usage, stop strings that span tokens, max_tokens, log-probabilities that concatenate to the
content, n = 2, 20 concurrent greedy requests equal to the same requests run one by one, a client
that disconnects mid-stream and one that disconnects while waiting for a non-streamed answer
(their slots and pages return, the others finish), every malformed request (the right 4xx, the
server keeps serving), a bounded soak (64 streams with random disconnects and malformed requests:
everything else completes, memory stays flat) and a drain on SIGTERM. Scripted-model servers
(tests/server/scripted_server.cc) give the exact output needed for tool-call round trips: K2
(content before the section, two calls, streamed arguments) and K3 (reasoning_content, content,
two calls with typed arguments; thinking, thinking_effort, tool_choice and response_format
accepted or refused with the field named). With --mpirun, the same checkpoint also served over two
CPU ranks (tensor parallel, `mpirun -np 2 klinear serve --tensor-parallel-size 2`): the chat,
completion and concurrency checks on it, and its greedy answers equal to the one-rank server's.

usage: openai_client_test.py --klinear BIN --scripted-server BIN --source REPO [--soak-seconds N]
                             [--mpirun BIN]
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import openai

MODEL = "tiny"
KEY = "test-key"


class Server:
    """A server process; `port` is read from its start-up line."""

    def __init__(self, argv, port_pattern, stream="stderr", env=None, key=KEY):
        self.key = key
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        source = self.proc.stderr if stream == "stderr" else self.proc.stdout
        other = self.proc.stdout if stream == "stderr" else self.proc.stderr
        self.port = None
        deadline = time.time() + 120
        while self.port is None:
            line = source.readline()
            if not line or time.time() > deadline:
                raise RuntimeError("server did not start: " + "".join(self.log) + (other.read() if other else ""))
            self.log.append(line)
            m = re.search(port_pattern, line)
            if m:
                self.port = int(m.group(1))
        for pipe in (source, other):  # keep draining so the server never blocks on a full pipe
            threading.Thread(target=lambda p=pipe: [self.log.append(l) for l in p], daemon=True).start()

    def client(self, api_key=KEY, **kw):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=api_key, max_retries=0, **kw)

    def raw(self, method, path, body=None, headers=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Authorization": "Bearer " + self.key, "Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    def metrics(self):
        status, data = self.raw("GET", "/metrics")
        assert status == 200, status
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=120)


def run_checks(checks):
    """Runs each (name, fn) and prints its outcome; returns the names that failed."""
    failures = []
    for name, fn in checks:
        t0 = time.time()
        try:
            fn()
            print(f"[ OK ] {name} ({time.time() - t0:.1f} s)")
        except Exception as e:  # noqa: BLE001 - report every failing check, then fail
            failures.append(name)
            print(f"[FAIL] {name}: {e!r}")
    return failures


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def expect_status(fn, status):
    try:
        fn()
    except openai.APIStatusError as e:
        check(e.status_code == status, f"expected HTTP {status}, got {e.status_code}: {e}")
        body = e.body if isinstance(e.body, dict) else {}
        check("message" in body or "error" in body, f"no OpenAI error object in {e.body!r}")
        return
    raise AssertionError(f"expected HTTP {status}, the request succeeded")


def open_stream(port, body):
    """A raw streaming request; returns (connection, response) to read SSE lines from."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    r = conn.getresponse()
    check(r.status == 200, f"stream: HTTP {r.status}")
    return conn, r


def read_events(r, n):
    got = 0
    while got < n:
        line = r.readline()
        check(line, "stream ended early")
        if line.startswith(b"data: "):
            got += 1


def wait_idle(server, cancelled_at_least=0, timeout=30):
    deadline = time.time() + timeout
    while True:
        m = server.metrics()
        idle = (m["klinear:num_requests_running"] == 0 and m["klinear:num_requests_waiting"] == 0 and
                m["klinear:state_slot_usage_perc"] == 0 and m["klinear:kv_cache_usage_perc"] == 0 and
                m['klinear:request_success_total{finished_reason="cancelled"}'] >= cancelled_at_least)
        if idle:
            return m
        check(time.time() < deadline, f"server not idle after {timeout} s: {m}")
        time.sleep(0.05)


# ---- checks on the main server

def test_models(s):
    ids = [m.id for m in s.client().models.list().data]
    check(ids == [MODEL], ids)


def test_operations(s):
    """What operators and dashboards rely on: /version, /ping, the model card, X-Request-Id, CORS for
    an allowed origin (the server runs with --allowed-origins http://ui.example), vLLM's metric names."""
    status, data = s.raw("GET", "/version")
    check(status == 200 and re.fullmatch(r"\d+\.\d+\.\d+", json.loads(data)["version"]), data)
    for method in ("GET", "POST"):
        status, _ = s.raw(method, "/ping")
        check(status == 200, (method, status))
    card = s.client().models.retrieve(MODEL)
    check(card.id == MODEL and card.created > 1_700_000_000, card)
    extra = card.model_extra or {}
    check(extra.get("max_model_len", 0) > 0 and extra.get("root"), card)
    status, data = s.raw("GET", "/v1/models/other")
    check(status == 404 and json.loads(data)["error"]["code"] == "model_not_found", data)
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1})
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1, "user": "alice\nklinear serve: forged"})
    conn.request("POST", "/v1/completions", body, {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json",
                                                   "X-Request-Id": "trace-42", "Origin": "http://ui.example"})
    r = conn.getresponse()
    data = r.read()
    check(r.status == 200 and r.getheader("X-Request-Id") == "trace-42", (r.status, r.getheaders()))
    check(json.loads(data)["id"] == "cmpl-trace-42", data)
    check(r.getheader("Access-Control-Allow-Origin") == "http://ui.example", r.getheaders())
    # A preflight needs no key; an origin not allowed gets no CORS headers.
    conn.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "http://ui.example",
                                                             "Access-Control-Request-Method": "POST",
                                                             "Access-Control-Request-Headers": "authorization,content-type"})
    r = conn.getresponse()
    r.read()
    check(r.status == 204 and "POST" in (r.getheader("Access-Control-Allow-Methods") or ""), (r.status, r.getheaders()))
    check(r.getheader("Access-Control-Allow-Headers") == "authorization,content-type", r.getheaders())
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}", "Origin": "http://evil.example"})
    r = conn.getresponse()
    r.read()
    check(r.status == 200 and r.getheader("Access-Control-Allow-Origin") is None, r.getheaders())
    conn.close()
    m = s.metrics()
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "generation_tokens_total",
                 "time_to_first_token_seconds_count", "e2e_request_latency_seconds_count"):
        key = f'vllm:{name}{{model_name="{MODEL}"}}'
        check(key in m and m[key] == m[f"klinear:{name}"], (key, m.get(key), m.get(f"klinear:{name}")))
    deadline = time.time() + 10  # the log is read by a thread of its own
    while not any(line.startswith("klinear serve: cmpl-trace-42 completion 200") for line in s.log):
        check(time.time() < deadline, "no request log line")
        time.sleep(0.05)
    logged = [line for line in s.log if line.startswith("klinear serve: cmpl-trace-42 ")]
    check(logged[0].rstrip("\n").endswith('; user "alice\\nklinear serve: forged"'), logged)
    check(not any(line.startswith("klinear serve: forged") for line in s.log), "the user forged a log line")


def test_chat_and_usage(s):
    c = s.client()
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello there"}],
                                  max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    ch = r.choices[0]
    check(ch.message.role == "assistant" and isinstance(ch.message.content, str), r)
    check(ch.finish_reason == "length", ch.finish_reason)
    check(r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 5, r.usage)
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
    # Streaming gives the same text, a first chunk with the role, and a final usage chunk.
    chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello there"}],
                                            max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    check(chunks[0].choices[0].delta.role == "assistant", chunks[0])
    text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    check(text == ch.message.content, (text, ch.message.content))
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6, chunks[-1])
    check(len({k.id for k in chunks}) == 1, "chunk ids differ")
    finish = [k.choices[0].finish_reason for k in chunks if k.choices and k.choices[0].finish_reason]
    check(finish == ["length"], finish)


def test_completions(s):
    c = s.client()
    r = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=7, temperature=0,
                             extra_body={"ignore_eos": True})
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7, r)
    parts = list(c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=7, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True}))
    check("".join(p.choices[0].text for p in parts) == r.choices[0].text, "stream != non-stream")
    # Token-id prompts work the same as their text.
    ids = json.loads(s.raw("POST", "/tokenize", json.dumps({"prompt": "The capital of France is"}))[1])["tokens"]
    r2 = c.completions.create(model=MODEL, prompt=ids, max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
    check(r2.choices[0].text == r.choices[0].text, "id prompt != text prompt")
    status, data = s.raw("POST", "/detokenize", json.dumps({"tokens": ids}))
    check(status == 200 and json.loads(data)["prompt"] == "The capital of France is", data)


def test_logprobs_concatenate(s):
    c = s.client()
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count with me"}],
                                  max_tokens=12, temperature=0, logprobs=True, top_logprobs=3,
                                  extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    check(len(content) == 12, len(content))
    check("".join(t.token for t in content) == r.choices[0].message.content, "logprob tokens != content")
    for t in content:
        check(t.logprob <= 0 and len(t.top_logprobs) == 3, t)
        # greedy: the pick is the most likely token
        check(abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5, t)
    r = c.completions.create(model=MODEL, prompt="Count with me", max_tokens=8, temperature=0, logprobs=2,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    check("".join(lp.tokens) == r.choices[0].text and len(lp.top_logprobs[0]) == 2, lp)


def test_stop_strings_span_tokens(s):
    c = s.client()
    base = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0, logprobs=0,
                                extra_body={"ignore_eos": True})
    tokens = base.choices[0].logprobs.tokens
    text = base.choices[0].text
    # A stop string made of the last character of one token and the first of the next.
    for b in range(2, len(tokens) - 1):
        left, right = tokens[b - 1], tokens[b]
        if left and right:
            offset = len("".join(tokens[:b]))
            stop = text[offset - 1:offset + 1]
            break
    else:
        raise AssertionError(f"no token boundary to test in {tokens!r}")
    r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0, stop=[stop],
                             extra_body={"ignore_eos": True})
    check(r.choices[0].text == text[:text.index(stop)], (r.choices[0].text, text, stop))
    check(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
    streamed = list(c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0,
                                         stop=stop, stream=True, extra_body={"ignore_eos": True}))
    check("".join(p.choices[0].text for p in streamed) == r.choices[0].text, "streamed stop differs")


def test_n2_and_seed(s):
    c = s.client()
    r = c.completions.create(model=MODEL, prompt="Pick a word", max_tokens=8, temperature=0, n=2,
                             extra_body={"ignore_eos": True})
    check(len(r.choices) == 2 and r.choices[0].text == r.choices[1].text, r)
    check(r.usage.completion_tokens == 16, r.usage)
    a = c.completions.create(model=MODEL, prompt="Pick a word", max_tokens=8, temperature=1.0, n=2, seed=11,
                             extra_body={"ignore_eos": True})
    b = c.completions.create(model=MODEL, prompt="Pick a word", max_tokens=8, temperature=1.0, n=2, seed=11,
                             extra_body={"ignore_eos": True})
    check([x.text for x in a.choices] == [x.text for x in b.choices], "a seed does not reproduce")
    check(a.choices[0].text != a.choices[1].text, "the two choices sampled the same tokens")


def test_concurrent_equals_serial(s):
    c = s.client()
    prompts = [f"Request number {i}: " + "word " * (i % 7) for i in range(20)]

    def one(p):
        r = c.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
        return r.choices[0].text

    before = s.metrics()
    serial = [one(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        concurrent_out = list(pool.map(one, prompts))
    check(serial == concurrent_out, "concurrent outputs differ from serial ones")
    check(len(set(serial)) > 1, "all outputs equal: the test would not see a mix-up")
    # Engine steps by kind: every generated token after a request's first is a decode step's (or a
    # mixed one's); each step is counted in both histograms.
    after = wait_idle(s)
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    kinds = ("decode", "prefill", "mixed")
    steps = sum(grew[f'klinear:engine_step_seconds_count{{kind="{k}"}}'] for k in kinds)
    check(steps == sum(grew[f'klinear:engine_step_forward_seconds_count{{kind="{k}"}}'] for k in kinds), grew)
    tokens = sum(grew[f'klinear:engine_step_tokens_total{{kind="{k}"}}'] for k in kinds)
    check(tokens >= 40 * 9, f"{tokens} step tokens for 40 requests of 10 generated tokens")
    check(grew['klinear:engine_step_seconds_count{kind="decode"}'] >= 9, grew)


def test_ranks_equal_one_rank(pair):
    one, ranks = pair
    prompts = [f"Tell me about item {i}" + "!" * i for i in range(8)]

    def answers(s):
        c = s.client()

        def ask(p):
            r = c.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
            return r.choices[0].text
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(ask, prompts))

    want, got = answers(one), answers(ranks)
    check(got == want, f"two ranks answered {got}, one rank {want}")
    check(len(set(want)) > 1, "all answers equal: the test would not see a mix-up")


def test_disconnect_frees(s):
    before = s.metrics()['klinear:request_success_total{finished_reason="cancelled"}']
    conn, r = open_stream(s.port, {"model": MODEL, "prompt": "Talk forever", "max_tokens": 100000, "ignore_eos": True})
    read_events(r, 3)
    other = concurrent.futures.ThreadPoolExecutor(1).submit(
        lambda: s.client().completions.create(model=MODEL, prompt="Meanwhile", max_tokens=30, temperature=0,
                                              extra_body={"ignore_eos": True}))
    conn.sock.shutdown(2)
    conn.close()
    check(other.result(timeout=120).usage.completion_tokens == 30, "the other request did not finish")
    wait_idle(s, cancelled_at_least=before + 1)


def test_disconnect_nonstream_frees(s):
    """A non-streaming client that hangs up while its request runs: the request is cancelled."""
    before = s.metrics()['klinear:request_success_total{finished_reason="cancelled"}']
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": "Talk forever",
                                                             "max_tokens": 100000, "ignore_eos": True}),
                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    deadline = time.time() + 30
    while s.metrics()["klinear:num_requests_running"] < 1:
        check(time.time() < deadline, "the request never ran")
        time.sleep(0.02)
    conn.sock.shutdown(2)
    conn.close()
    wait_idle(s, cancelled_at_least=before + 1)
    r = s.client().completions.create(model=MODEL, prompt="After", max_tokens=3, extra_body={"ignore_eos": True})
    check(r.usage.completion_tokens == 3, r)


def test_connection_burst(s):
    # 256 clients connecting at the same instant (bench-serve at 256 streams): with cpp-httplib's
    # listen backlog of 5 some were reset or never answered (1 to 57 of 256 here and on the H200).
    n = 256
    barrier = threading.Barrier(n)
    results = []

    def one():
        barrier.wait()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
            conn.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, "stream": True}),
                         headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            results.append(r.status)
        except Exception as e:  # noqa: BLE001 - every failure is counted
            results.append(repr(e))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r for r in results if r != 200]
    check(len(results) == n and not bad, f"{len(bad)} of {n} failed: {bad[:3]}")


def test_malformed(s):
    c = s.client()
    raw_cases = [
        ("bad JSON", "/v1/chat/completions", "{not json", 400),
        ("body not an object", "/v1/completions", "[1, 2]", 400),
        ("wrong type", "/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "temperature": "hot"}), 400),
        ("wrong type max_tokens", "/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "5"}), 400),
        ("messages not a list", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": "hi"}), 400),
        ("unknown role", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}), 400),
        ("unknown path", "/v1/nothing", "{}", 404),
    ]
    for name, path, body, status in raw_cases:
        got, data = s.raw("POST", path, body)
        check(got == status, f"{name}: HTTP {got}, expected {status}: {data!r}")
        check("error" in json.loads(data), f"{name}: no error object")
    msg = [{"role": "user", "content": "x"}]
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg, temperature=5), 400)
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg, top_p=0), 400)
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg, n=0), 400)
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg, max_tokens=0), 400)
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg, max_tokens=10 ** 9), 400)
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg, top_logprobs=3), 400)
    expect_status(lambda: c.completions.create(model=MODEL, prompt=[10 ** 6], max_tokens=2), 400)
    expect_status(lambda: c.chat.completions.create(model="gpt-4o", messages=msg), 404)
    # Kimi Linear's chat format (K2) renders no tool choice, response format or thinking options.
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg, tools=TOOLS, tool_choice="required"), 400)
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg, response_format={"type": "json_object"}), 400)
    expect_status(lambda: c.chat.completions.create(model=MODEL, messages=msg,
                                                    extra_body={"chat_template_kwargs": {"thinking_effort": "max"}}), 400)
    expect_status(lambda: s.client(api_key="wrong").chat.completions.create(model=MODEL, messages=msg), 401)
    got, _ = s.raw("GET", "/v1/models", headers={"Authorization": ""})
    check(got == 401, f"no key: HTTP {got}")
    # Still serving.
    r = c.completions.create(model=MODEL, prompt="Still there?", max_tokens=3, extra_body={"ignore_eos": True})
    check(r.usage.completion_tokens == 3, r)


def test_vllm_fields(s):
    """The request fields vLLM clients send beyond OpenAI's: each honoured one changes the output as
    vLLM documents it, each refused or unknown one is a 400 naming it."""
    c = s.client()
    prompt = "Tell me a story"
    # logit_bias: +100 on a token whose bytes are not ASCII makes every greedy pick that token; the
    # logprobs' bytes are OpenAI's integers 0-255 and spell it.
    tok = json.loads(s.raw("POST", "/tokenize", json.dumps({"prompt": "é", "return_token_strs": True}))[1])
    forced = tok["tokens"][0]
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=4,
                                  temperature=0, logprobs=True, top_logprobs=1, logit_bias={str(forced): 100},
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    check(r.choices[0].token_ids == [forced] * 4, r.choices[0])
    check(isinstance(r.prompt_token_ids, list) and len(r.prompt_token_ids) == r.usage.prompt_tokens, r)
    raw = bytes(r.choices[0].logprobs.content[0].bytes)
    check(all(0 <= b <= 255 for b in r.choices[0].logprobs.content[0].bytes) and raw[0] > 127, raw)
    # min_tokens: a stop id pushed to the top of every row waits until min_tokens ids are out.
    stop_id = forced
    for min_tokens in (0, 5):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, logit_bias={str(stop_id): 100},
                                 extra_body={"stop_token_ids": [stop_id], "min_tokens": min_tokens,
                                             "return_token_ids": True})
        check(r.choices[0].finish_reason == "stop" and len(r.choices[0].token_ids) == min_tokens, (min_tokens, r.choices[0]))
        check(stop_id not in r.choices[0].token_ids, r.choices[0])
    # include_stop_str_in_output keeps the stop string that ended the text.
    base = c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                extra_body={"ignore_eos": True}).choices[0].text
    stop = base[len(base) // 2:len(base) // 2 + 2]
    cut = base.index(stop)
    for include, want in ((False, base[:cut]), (True, base[:cut + len(stop)])):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop],
                                 extra_body={"ignore_eos": True, "include_stop_str_in_output": include})
        check(r.choices[0].text == want, (include, r.choices[0].text, want))
    # return_tokens_as_token_ids names logprob tokens by id.
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, logprobs=1,
                             extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True,
                                         "return_token_ids": True})
    check(r.choices[0].logprobs.tokens == [f"token_id:{i}" for i in r.choices[0].token_ids], r.choices[0].logprobs)
    # continuous_usage_stats: every chunk carries the usage so far.
    chunks = list(c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True,
                                                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    check(all(k.usage is not None for k in chunks), [k.usage for k in chunks])
    check(chunks[-1].usage.completion_tokens == 5 and chunks[0].usage.prompt_tokens > 0, chunks[-1].usage)
    # request_id names the response; best_of equal to n is n.
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=2, n=2,
                                  extra_body={"request_id": "abc-123", "best_of": 2, "ignore_eos": True})
    check(r.id == "chatcmpl-abc-123" and len(r.choices) == 2, r)
    ids = {c.completions.create(model=MODEL, prompt=prompt, max_tokens=1).id for _ in range(3)}
    check(len(ids) == 3, ids)
    # add_generation_prompt and continue_final_message shape the rendered prompt (/tokenize shows it).
    def rendered(messages, **kw):
        status, data = s.raw("POST", "/tokenize", json.dumps({"messages": messages, "return_token_strs": True, **kw}))
        check(status == 200, data)
        return json.loads(data)["token_strs"]
    user = [{"role": "user", "content": prompt}]
    with_prompt, without = rendered(user), rendered(user, add_generation_prompt=False)
    check(with_prompt[:len(without)] == without and len(with_prompt) > len(without), (with_prompt, without))
    cont = rendered(user + [{"role": "assistant", "content": "Once upon"}], continue_final_message=True)
    check("".join(cont).endswith("Once upon"), cont)
    r = c.chat.completions.create(model=MODEL, messages=user + [{"role": "assistant", "content": "Once upon"}],
                                  max_tokens=2, extra_body={"continue_final_message": True, "add_generation_prompt": False,
                                                            "ignore_eos": True})
    check(r.usage.prompt_tokens == len(cont), (r.usage, len(cont)))
    # Chat echo: the continued assistant message opens the reply (vLLM's echo), streamed or not.
    body = dict(model=MODEL, messages=user + [{"role": "assistant", "content": "Once upon"}], max_tokens=2, temperature=0,
                extra_body={"continue_final_message": True, "add_generation_prompt": False, "ignore_eos": True})
    cont_text = c.chat.completions.create(**body).choices[0].message.content
    body["extra_body"] = dict(body["extra_body"], echo=True)
    echoed = c.chat.completions.create(**body).choices[0].message.content
    check(echoed == "Once upon" + cont_text, (echoed, cont_text))
    streamed = "".join(p.choices[0].delta.content or "" for p in c.chat.completions.create(**body, stream=True) if p.choices)
    check(streamed == echoed, (streamed, echoed))
    # Refused: what this server does not do, and fields nobody defines; each 400 names the field.
    for body, param in ((dict(prompt="x", guided_json={"type": "object"}), "guided_json"),
                        (dict(prompt="x", echo=True, logprobs=1, stream=True), "echo"),
                        (dict(prompt="x", prompt_logprobs=1, stream=True), "prompt_logprobs"),
                        (dict(prompt="x", max_tokens=0), "max_tokens"),
                        (dict(prompt="x", best_of=3), "best_of"),
                        (dict(prompt="x", temprature=0.5), "temprature"),
                        (dict(prompt="x", logit_bias={"x": 1}), "logit_bias"),
                        (dict(prompt="x", stop_token_ids=[10 ** 7]), None),
                        (dict(prompt="x", min_tokens=9, max_tokens=8), "min_tokens")):
        status, data = s.raw("POST", "/v1/completions", json.dumps({"model": MODEL, **body}))
        err = json.loads(data).get("error", {})
        check(status == 400 and (param is None or err.get("param") == param), (body, status, data))
        if param is None:
            check("stop_token_ids" in err.get("message", ""), data)
    # echo: the prompt's text opens the output, streamed or not.
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True,
                             extra_body={"ignore_eos": True})
    plain = c.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
                                 extra_body={"ignore_eos": True}).choices[0].text
    check(r.choices[0].text == prompt + plain, (r.choices[0].text, plain))
    streamed = "".join(p.choices[0].text for p in c.completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, stream=True, extra_body={"ignore_eos": True}))
    check(streamed == prompt + plain, (streamed, plain))
    # lm-evaluation-harness's loglikelihood shape (local-completions: a batch of prompts, echo,
    # logprobs 1, max_tokens 1 or 0): the prompt's tokens lead the logprobs, the first without a
    # score; a prompt that ends with the greedy token scores it as the generation did.
    ids = json.loads(s.raw("POST", "/tokenize", json.dumps({"prompt": prompt}))[1])["tokens"]
    g = c.completions.create(model=MODEL, prompt=[ids, ids[:3]], max_tokens=1, temperature=0, logprobs=1, echo=True,
                             extra_body={"ignore_eos": True})
    for ch in g.choices:
        n = len(ids) if ch.index == 0 else 3
        lp = ch.logprobs
        check(len(lp.tokens) == n + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp)
        check(all(isinstance(v, float) and v <= 0 for v in lp.token_logprobs[1:]), lp.token_logprobs)
        check(all(len(t) == 1 for t in lp.top_logprobs[1:]), lp.top_logprobs)
    first = g.choices[0]
    gen_id = int(c.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0].token_ids[0])
    scored = c.completions.create(model=MODEL, prompt=ids + [gen_id], max_tokens=0, logprobs=1, echo=True,
                                  extra_body={"prompt_logprobs": 2})
    sc = scored.choices[0]
    check(scored.usage.completion_tokens == 0 and len(sc.logprobs.tokens) == len(ids) + 1, scored)
    check(abs(sc.logprobs.token_logprobs[-1] - first.logprobs.token_logprobs[-1]) < 1e-3,
          (sc.logprobs.token_logprobs[-1], first.logprobs.token_logprobs[-1]))
    check(all(abs(a - b) < 1e-4 for a, b in zip(sc.logprobs.token_logprobs[1:len(ids)], first.logprobs.token_logprobs[1:len(ids)])),
          "the prompt's scores differ between two requests")
    pl = sc.model_extra["prompt_logprobs"]
    check(pl[0] is None and len(pl) == len(ids) + 1 and str(gen_id) in pl[-1] and pl[-1][str(gen_id)]["rank"] == 1, pl[-1])
    # A list of prompts (texts, or token-id lists) is a batch: prompt k's choice i is choice k·n + i,
    # each equal to the prompt sent alone; usage sums; streaming gives the same texts.
    prompts = ["Once upon a time", "The capital of France is", "Count with me"]
    alone = [c.completions.create(model=MODEL, prompt=q, max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True}) for q in prompts]
    r = c.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2,
                             extra_body={"ignore_eos": True})
    check(sorted(ch.index for ch in r.choices) == list(range(6)), [ch.index for ch in r.choices])
    for ch in r.choices:
        check(ch.text == alone[ch.index // 2].choices[0].text, (ch.index, ch.text))
    check(r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone) and
          r.usage.completion_tokens == 24, r.usage)
    id_lists = [json.loads(s.raw("POST", "/tokenize", json.dumps({"prompt": q}))[1])["tokens"] for q in prompts]
    texts = {}
    for chunk in c.completions.create(model=MODEL, prompt=id_lists, max_tokens=4, temperature=0, stream=True,
                                      extra_body={"ignore_eos": True}):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    check(texts == {k: alone[k].choices[0].text for k in range(3)}, texts)
    status, data = s.raw("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": ["x"] * 1025, "max_tokens": 1}))
    check(status == 400 and json.loads(data)["error"]["param"] == "prompt", data)
    # Asking for nothing is not refused.
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                             extra_body={"echo": False, "use_beam_search": False, "guided_json": None, "user": "u1",
                                         "skip_special_tokens": True, "ignore_eos": True})
    check(r.usage.completion_tokens == 2, r)


def test_soak(s, seconds):
    """64 concurrent workers for `seconds`: normal streams, disconnects (streaming and not), malformed requests."""
    stop_at = time.time() + seconds
    errors, counts = [], {"ok": 0, "cancelled": 0, "hung_up": 0, "malformed": 0}
    lock = threading.Lock()
    rss = []

    def worker(seed):
        rng = random.Random(seed)
        while time.time() < stop_at and not errors:
            kind = rng.random()
            try:
                if kind < 0.1:
                    got, _ = s.raw("POST", "/v1/completions", rng.choice(["{", '{"prompt": 5}', '{"prompt":"x","n":-1}']))
                    check(got == 400, f"malformed: HTTP {got}")
                    key = "malformed"
                elif kind < 0.2:
                    conn, r = open_stream(s.port, {"model": MODEL, "prompt": "soak " * rng.randint(1, 30),
                                                   "max_tokens": 5000, "ignore_eos": True})
                    read_events(r, rng.randint(1, 5))
                    conn.sock.shutdown(2)
                    conn.close()
                    key = "cancelled"
                elif kind < 0.25:  # a non-streaming client that gives up waiting
                    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
                    conn.request("POST", "/v1/completions",
                                 body=json.dumps({"model": MODEL, "prompt": "wait " * rng.randint(1, 30),
                                                  "max_tokens": 5000, "ignore_eos": True}),
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
                    time.sleep(rng.uniform(0.05, 0.5))
                    conn.sock.shutdown(2)
                    conn.close()
                    key = "hung_up"
                else:
                    n = rng.randint(1, 24)
                    parts = list(s.client().completions.create(
                        model=MODEL, prompt="soak " * rng.randint(1, 60), max_tokens=n, temperature=1.0, stream=True,
                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
                    check(parts[-1].usage.completion_tokens == n, "incomplete stream")
                    key = "ok"
                with lock:
                    counts[key] += 1
            except Exception as e:  # noqa: BLE001 - any failure fails the soak
                with lock:
                    errors.append(repr(e))

    def sampler():
        while time.time() < stop_at:
            rss.append(s.rss_kib())
            time.sleep(0.5)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)] + [threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, f"soak errors: {errors[:3]}")
    wait_idle(s)
    third = max(1, len(rss) // 3)
    warm, end = max(rss[:third]), max(rss[-third:])
    print(f"  soak {seconds} s: {counts}, RSS warm {warm} KiB, end {end} KiB")
    check(counts["ok"] > 10 and counts["cancelled"] > 2 and counts["hung_up"] > 2 and counts["malformed"] > 2, counts)
    check(end <= warm * 1.25 + 32768, f"memory grew: {warm} KiB -> {end} KiB")


# ---- a small server: context, body limit, queue limit

def test_limits(small):
    c = small.client()
    expect_status(lambda: c.completions.create(model=MODEL, prompt="hello " * 5000, max_tokens=2), 400)
    got, data = small.raw("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "x" * 200000}))
    check(got == 413 and "error" in json.loads(data), f"body over the limit: HTTP {got}")
    # One running, one waiting (the queue holds one), the next is refused with 503.
    conn, r = open_stream(small.port, {"model": MODEL, "prompt": "long", "max_tokens": 3000, "ignore_eos": True})
    read_events(r, 2)
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
        lambda: c.completions.create(model=MODEL, prompt="queued", max_tokens=4, extra_body={"ignore_eos": True}))
    deadline = time.time() + 30
    while small.metrics()["klinear:num_requests_waiting"] < 1:
        check(time.time() < deadline, "the second request never waited")
        time.sleep(0.02)
    expect_status(lambda: c.completions.create(model=MODEL, prompt="refused", max_tokens=4), 503)
    conn.sock.shutdown(2)
    conn.close()
    check(waiting.result(timeout=120).usage.completion_tokens == 4, "the queued request did not run")
    wait_idle(small, cancelled_at_least=1)


def test_drain_on_sigterm(server):
    c = server.client()
    stream = c.completions.create(model=MODEL, prompt="Drain me", max_tokens=60, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True})
    it = iter(stream)
    first = next(it)
    server.proc.send_signal(signal.SIGTERM)
    rest = list(it)
    finish = [p.choices[0].finish_reason for p in [first] + rest if p.choices and p.choices[0].finish_reason]
    check(finish == ["length"], f"in-flight stream after SIGTERM: {finish}")
    check(server.proc.wait(timeout=120) == 0, "server exit code")


# ---- the scripted server: a tool-call round trip

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("get_weather", "get_time")]
ARGS = ['{"city": "Paris", "unit": "celsius"}', '{"tz": "Europe/Paris"}']
SCRIPTS = ["Let me check both.<|tool_calls_section_begin|>"
           f"<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{ARGS[0]}<|tool_call_end|>"
           f"<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{ARGS[1]}<|tool_call_end|>"
           "<|tool_calls_section_end|>",
           "It is 21 degrees in Paris at noon."]


def test_tool_round_trip(sc):
    c = sc.client()
    msgs = [{"role": "user", "content": "Weather and time in Paris?"}]
    r = c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
    check(m.content == "Let me check both.", m.content)
    check([(t.function.name, t.function.arguments) for t in m.tool_calls] ==
          [("get_weather", ARGS[0]), ("get_time", ARGS[1])], m.tool_calls)
    # Streamed: the same content, the calls announced once each, their arguments in several pieces.
    content, names, args, pieces = "", {}, {}, {}
    finish = None
    for k in c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS, stream=True):
        d = k.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            if t.function.name:
                check(t.index not in names, "a call announced twice")
                names[t.index] = t.function.name
            args[t.index] = args.get(t.index, "") + (t.function.arguments or "")
            pieces[t.index] = pieces.get(t.index, 0) + 1
        finish = k.choices[0].finish_reason or finish
    check(content == "Let me check both.", content)
    check(names == {0: "get_weather", 1: "get_time"} and args == {0: ARGS[0], 1: ARGS[1]}, (names, args))
    check(min(pieces.values()) > 2 and finish == "tool_calls", (pieces, finish))
    # The results go back; the model answers.
    msgs.append({"role": "assistant", "content": m.content,
                 "tool_calls": [t.model_dump() for t in m.tool_calls]})
    for t, result in zip(m.tool_calls, ['{"temp": 21}', '{"time": "12:00"}']):
        msgs.append({"role": "tool", "tool_call_id": t.id, "content": result})
    r2 = c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
    check(r2.choices[0].message.content == SCRIPTS[1] and r2.choices[0].finish_reason == "stop", r2)
    check(not r2.choices[0].message.tool_calls, r2)


# ---- the scripted K3 server: reasoning, typed tool-call arguments, the K3 chat options

K3_SCRIPTS = ['Both are needed.<|close|>think<|sep|><|open|>response<|sep|>Checking both.<|close|>response<|sep|>'
              '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
              '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
              '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>'
              '<|open|>call tool="get_time" index="2"<|sep|>'
              '<|open|>argument key="tz" type="string"<|sep|>Europe/Paris<|close|>argument<|sep|><|close|>call<|sep|>'
              '<|close|>tools<|sep|><|close|>message<|sep|>',
              '<|close|>think<|sep|><|open|>response<|sep|>It is 21 degrees in Paris at noon.'
              '<|close|>response<|sep|><|close|>message<|sep|>']
K3_CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "Europe/Paris"})]


def test_k3_round_trip(k3):
    c = k3.client()
    msgs = [{"role": "user", "content": "Weather and time in Paris?"}]
    r = c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
    check(m.content == "Checking both." and m.model_extra.get("reasoning_content") == "Both are needed.", m)
    check([(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls] == K3_CALLS, m.tool_calls)
    # Streamed: the same reasoning, content and calls.
    reasoning, content, calls, finish = "", "", {}, None
    for k in c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS, stream=True):
        d = k.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        content += d.content or ""
        for t in d.tool_calls or []:
            name, args = calls.get(t.index, ("", ""))
            calls[t.index] = (name + (t.function.name or ""), args + (t.function.arguments or ""))
        finish = k.choices[0].finish_reason or finish
    check(reasoning == "Both are needed." and content == "Checking both." and finish == "tool_calls",
          (reasoning, content, finish))
    check([(calls[i][0], json.loads(calls[i][1])) for i in sorted(calls)] == K3_CALLS, calls)
    # The results go back (with the reasoning, which K3 renders); the model answers.
    msgs.append({"role": "assistant", "content": m.content, "reasoning_content": "Both are needed.",
                 "tool_calls": [t.model_dump() for t in m.tool_calls]})
    for t, result in zip(m.tool_calls, ['{"temp": 21}', '{"time": "12:00"}']):
        msgs.append({"role": "tool", "tool_call_id": t.id, "content": result})
    r2 = c.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
    m2 = r2.choices[0].message
    check(m2.content == "It is 21 degrees in Paris at noon." and r2.choices[0].finish_reason == "stop", r2)
    check(not m2.tool_calls and m2.model_extra.get("reasoning_content") is None, m2)
    # The K3 options are accepted, at the top level or in chat_template_kwargs ...
    for extra in ({"thinking_effort": "high"}, {"chat_template_kwargs": {"thinking_effort": "low"}},
                  {"response_format": {"type": "json_object"}}):
        r = c.chat.completions.create(model="scripted", messages=msgs[:1], tools=TOOLS, extra_body=extra)
        check(r.choices[0].finish_reason == "tool_calls", (extra, r))
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        r = c.chat.completions.create(model="scripted", messages=msgs[:1], tools=TOOLS, tool_choice=choice)
        check(r.choices[0].finish_reason == "tool_calls", (choice, r))
    # ... thinking off opens the response element: this script's think text is then no K3 turn,
    # and its text comes back as content rather than an error ...
    r = c.chat.completions.create(model="scripted", messages=msgs[:1], extra_body={"chat_template_kwargs": {"thinking": False}})
    check("Both are needed." in r.choices[0].message.content, r)
    # ... and bad values are 400 naming the field.
    for extra, param in (({"thinking_effort": "medium"}, "thinking_effort"), ({"thinking": "yes"}, "thinking"),
                         ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                         ({"response_format": {"type": "yaml"}}, "response_format")):
        body = dict({"model": "scripted", "messages": msgs[:1], "tools": TOOLS}, **extra)
        got, data = k3.raw("POST", "/v1/chat/completions", json.dumps(body))
        check(got == 400 and json.loads(data)["error"]["param"] == param, (extra, got, data))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--klinear", required=True)
    ap.add_argument("--scripted-server", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--soak-seconds", type=int, default=int(os.environ.get("KLINEAR_SOAK_SECONDS", "45")))
    ap.add_argument("--mpirun", help="Open MPI's mpirun: also serve over two tensor-parallel CPU ranks")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="klinear_openai_")
    failures = []
    servers = []
    try:
        model = os.path.join(tmp, MODEL)
        subprocess.run([a.klinear, "init", "--preset", "kimi-linear-tiny", "--out", model, "--tokenizer",
                        os.path.join(a.source, "tokenizers/kimi-k2")], check=True, capture_output=True)
        serve = [a.klinear, "serve", "--model", model, "--port", "0"]
        main_server = Server(serve + ["--api-key", KEY, "--max-num-tokens", "64", "--cache-memory", "64M",
                                      "--allowed-origins", "http://ui.example"],
                             r"on http://[^:]+:(\d+)")
        small = Server(serve + ["--max-num-seqs", "1", "--max-queue", "1", "--cache-memory", "2M",
                                "--max-body-bytes", "100000", "--api-key", KEY], r"on http://[^:]+:(\d+)")
        scripted = Server([a.scripted_server, "--tokenizer", os.path.join(a.source, "tokenizers/kimi-k2")] +
                          sum([["--script", s] for s in SCRIPTS], []), r"listening on (\d+)", stream="stdout")
        scripted_k3 = Server([a.scripted_server, "--format", "k3", "--tokenizer", os.path.join(a.source, "tokenizers/kimi-k3")] +
                             sum([["--script", s] for s in K3_SCRIPTS], []), r"listening on (\d+)", stream="stdout")
        servers = [main_server, small, scripted, scripted_k3]
        ranks = None
        if a.mpirun:
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
            ranks = Server([a.mpirun, "-np", "2", "--oversubscribe"] + serve +
                           ["--api-key", KEY, "--max-num-tokens", "64", "--cache-memory", "64M",
                            "--tensor-parallel-size", "2"], r"on http://[^:]+:(\d+)", env=env)
            servers.append(ranks)
        tests = [(f.__name__, f, main_server) for f in (test_models, test_operations, test_chat_and_usage, test_completions,
                                                          test_logprobs_concatenate, test_stop_strings_span_tokens,
                                                          test_n2_and_seed, test_concurrent_equals_serial,
                                                          test_disconnect_frees, test_disconnect_nonstream_frees,
                                                          test_connection_burst, test_malformed, test_vllm_fields)]
        tests.append(("test_limits", test_limits, small))
        if ranks:
            tests += [(f.__name__ + " (2 ranks)", f, ranks) for f in (test_chat_and_usage, test_completions,
                                                                       test_concurrent_equals_serial)]
            tests.append(("test_ranks_equal_one_rank", test_ranks_equal_one_rank, (main_server, ranks)))
        tests.append(("test_tool_round_trip", test_tool_round_trip, scripted))
        tests.append(("test_k3_round_trip", test_k3_round_trip, scripted_k3))
        if a.soak_seconds > 0:
            tests.append(("test_soak", lambda s: test_soak(s, a.soak_seconds), main_server))
        tests.append(("test_drain_on_sigterm", test_drain_on_sigterm, main_server))
        failures += run_checks([(name, lambda fn=fn, server=server: fn(server)) for name, fn, server in tests])
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.stop()
        if failures:
            for s in servers:
                print("---- server log:\n" + "".join(s.log[-30:]))
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
