"""Concurrency limit (429) and SIGTERM under load, each on a server of its
own."""
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time

from common import BUILD, MODEL, Suite, sse_events


def start_server(*args):
    proc = subprocess.Popen([os.environ.get("LLM_SERVE_BIN", os.path.join(BUILD, "llm-serve")), "-m", MODEL, "--port", "0",
                             "--ctx", "1024", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
    assert m, ("no URL printed", line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(m.group(1))


def stream(port, max_tokens, outcome, i):
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({
            "messages": [{"role": "user", "content": f"Count to {i + 100}."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "temperature": 0}))
        resp = conn.getresponse()
        if resp.status != 200:
            outcome[i] = ("status", resp.status, resp.getheader("Retry-After"))
            return
        finish, done = None, False
        for ev in sse_events(resp):
            if ev == "DONE":
                done = True
                break
            for c in ev.get("choices", []):
                finish = c.get("finish_reason") or finish
        outcome[i] = ("stream", finish, done)
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        outcome[i] = ("error", type(e).__name__, None)


def wait_running(port, n, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        m = re.search(r"^llm_serve_http_requests_active (\d+)", text, re.M)
        if m and int(m.group(1)) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} requests never became active")


def test_too_many_concurrent_gives_429():
    proc, port = start_server("--max-concurrent", "2", "--shutdown-timeout", "1")
    try:
        outcome = {}
        # Long enough to still run when the third request comes, on any machine.
        threads = [threading.Thread(target=stream, args=(port, 1000, outcome, i)) for i in range(2)]
        for t in threads:
            t.start()
        wait_running(port, 2)
        stream(port, 4, outcome, 2)
        assert outcome[2][:2] == ("status", 429) and outcome[2][2], outcome[2]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        for t in threads:
            t.join(30)


def test_sigterm_finishes_short_requests():
    proc, port = start_server("--shutdown-timeout", "20")
    outcome = {}
    threads = [threading.Thread(target=stream, args=(port, 24, outcome, i)) for i in range(6)]
    for t in threads:
        t.start()
    wait_running(port, 6)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    for t in threads:
        t.join(30)
    assert all(o == ("stream", "length", True) for o in outcome.values()) and len(outcome) == 6, outcome


def test_sigterm_cancels_long_requests_cleanly():
    proc, port = start_server("--shutdown-timeout", "1")
    outcome = {}
    threads = [threading.Thread(target=stream, args=(port, 1000, outcome, i)) for i in range(6)]
    for t in threads:
        t.start()
    wait_running(port, 6)
    started = time.time()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert time.time() - started < 10, "shutdown took too long"
    for t in threads:
        t.join(30)
    assert len(outcome) == 6, outcome
    for o in outcome.values():
        # A complete stream ends with a finish reason and [DONE]; a cut one
        # is a clean connection error, never a hang.
        assert o[0] == "error" or (o[0] == "stream" and o[2] and o[1] in ("abort", "length")), o
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).request("GET", "/health")
        raise AssertionError("the server still accepts connections")
    except OSError:
        pass


if __name__ == "__main__":
    Suite("shutdown").run([test_too_many_concurrent_gives_429, test_sigterm_finishes_short_requests,
                           test_sigterm_cancels_long_requests_cleanly])
