"""Functions shared by the llm-serve tests: the server under test comes from
the environment that run.sh sets up."""
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse

BASE_URL = os.environ.get("LLM_SERVE_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("LLM_SERVE_TEST_KEY", "")
MODEL = os.environ.get("LLM_TEST_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
BUILD = os.environ.get("BUILD", "build")


def host_port(base=None):
    u = urllib.parse.urlparse(base or BASE_URL)
    return u.hostname, u.port


def request(method, path, body=None, headers=None, base=None, timeout=120, auth=True):
    """One HTTP exchange; returns (status, headers dict, body bytes)."""
    host, port = host_port(base)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if auth and API_KEY:
        h["Authorization"] = "Bearer " + API_KEY
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def post_json(path, body, **kw):
    status, headers, data = request("POST", path, body, **kw)
    return status, headers, json.loads(data) if data else None


def metrics(base=None):
    status, _, data = request("GET", "/metrics", base=base)
    assert status == 200, status
    values = {}
    for line in data.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values


def wait_until(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def sse_events(resp):
    """Yields the JSON payloads of a server-sent event stream, then 'DONE'."""
    buf = b""
    while True:
        chunk = resp.read1(4096) if hasattr(resp, "read1") else resp.read(4096)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    payload = line[6:]
                    if payload == b"[DONE]":
                        yield "DONE"
                    else:
                        yield json.loads(payload)


def llm_run_greedy(prompt, n_tokens, chat=True):
    """The reference answer and its token count from build/llm-run."""
    args = [os.path.join(BUILD, "llm-run"), "-m", MODEL, "-p", prompt, "--temp", "0",
            "-n", str(n_tokens)]
    if chat:
        args.append("--chat")
    out = subprocess.run(args, capture_output=True, check=True)
    text = out.stdout.decode()
    if text.endswith("\n"):
        text = text[:-1]
    if not chat and text.startswith(prompt):  # llm-run echoes a plain prompt
        text = text[len(prompt):]
    m = re.search(r"generated (\d+) tokens", out.stderr.decode())
    return text, int(m.group(1)) if m else None


class Suite:
    """Runs test functions in order and reports each."""

    def __init__(self, name):
        self.name = name
        self.failed = []

    def run(self, tests):
        for test in tests:
            started = time.time()
            try:
                test()
                print(f"  ok   {self.name}.{test.__name__} ({time.time() - started:.1f}s)", flush=True)
            except Exception as e:  # report every failure, then exit non-zero
                self.failed.append(test.__name__)
                print(f"  FAIL {self.name}.{test.__name__}: {type(e).__name__}: {e}", flush=True)
        if self.failed:
            print(f"{self.name}: {len(self.failed)} failed: {', '.join(self.failed)}")
            sys.exit(1)
