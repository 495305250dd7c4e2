"""Out-of-memory handling: servers whose every N-th own allocation fails
(LLM_SERVE_TEST_FAIL_ALLOC, docs/serve.md) must answer each request
(generations and embeddings) with a correct success, a 503 out_of_memory error, or a stream that ends with
[DONE]; afterwards they serve, hold no requests or KV blocks, and exit 0 on
SIGTERM."""
import http.client
import json
import os
import re
import signal
import subprocess
import threading

from common import BUILD, MODEL, Suite, wait_until

SERVER_BIN = os.environ.get("LLM_SERVE_BIN", os.path.join(BUILD, "llm-serve"))


def start_server(fail_every):
    env = dict(os.environ, LLM_SERVE_TEST_FAIL_ALLOC=str(fail_every))
    proc = subprocess.Popen([SERVER_BIN, "-m", MODEL, "--port", "0", "--ctx", "512"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
    assert m, ("no URL printed", line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(m.group(1))


def exchange(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("Content-Type") or "", data


def check_out_of_memory_error(data):
    err = json.loads(data)["error"]
    assert err["type"] == "server_error" and err["code"] == "out_of_memory", err
    assert err["param"] is None and err["message"].startswith("out of memory"), err


def check_answer(body, data):
    reply = json.loads(data)
    n = body.get("n", 1)
    assert len(reply["choices"]) == n, reply
    usage = reply["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    for c in reply["choices"]:
        if c["finish_reason"] == "tool_calls":
            assert body.get("tools") and c["message"]["tool_calls"], c
            continue
        assert c["finish_reason"] in ("stop", "length"), c
        if "messages" in body:
            assert isinstance(c["message"]["content"], str), c
            if body.get("logprobs"):
                assert isinstance(c["logprobs"]["content"], list), c
        else:
            assert isinstance(c["text"], str), c
            if body.get("logprobs"):
                assert len(c["logprobs"]["tokens"]) == len(c["logprobs"]["text_offset"]), c


def check_embeddings(body, data):
    reply = json.loads(data)
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    assert [d["index"] for d in reply["data"]] == list(range(len(inputs))), reply
    for d in reply["data"]:
        assert isinstance(d["embedding"], str if body.get("encoding_format") == "base64" else list)
    assert reply["usage"]["prompt_tokens"] > 0, reply


def check_stream(body, data):
    """Every event parses; the stream ends with [DONE]. Without an error
    event every choice finishes and usage comes when asked for."""
    text = data.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-300:]
    events = [e for e in text.split("\n\n") if e]
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    errors = [p for p in payloads if "error" in p]
    for p in errors:
        assert p["error"]["code"] == "out_of_memory", p
    if errors:
        return "stream-error"
    finished = {c["index"] for p in payloads for c in p["choices"] if c.get("finish_reason")}
    assert finished == set(range(body.get("n", 1))), payloads
    if body.get("stream_options", {}).get("include_usage"):
        assert "usage" in payloads[-1], payloads[-1]
    return "stream-ok"


def request_mix():
    chat = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8,
            "temperature": 0}
    plain = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    bodies = []
    for base, path in ((chat, "/v1/chat/completions"), (plain, "/v1/completions")):
        for extra in ({}, {"n": 2}, {"logprobs": True, "top_logprobs": 2} if base is chat
                      else {"logprobs": 2, "echo": True}):
            for stream in (False, True):
                body = dict(base, **extra, stream=stream)
                if stream:
                    body["stream_options"] = {"include_usage": True}
                bodies.append((path, body))
    # Structured output and tool calls: grammars, the tools' preamble, parsed replies.
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}},
              "required": ["colour"]}
    tools = [{"type": "function", "function": {"name": "paint", "parameters": schema}}]
    for extra in ({"response_format": {"type": "json_schema", "json_schema": {
                      "name": "c", "schema": schema}}},
                  {"tools": tools, "tool_choice": "required", "max_tokens": 40},
                  {"tools": tools, "max_tokens": 16}):
        for stream in (False, True):
            bodies.append(("/v1/chat/completions", dict(chat, **extra, stream=stream)))
    for body in ({"input": ["Name three colours.", "The capital of France is"]},
                 {"input": "hello", "encoding_format": "base64"}, {"input": [[17, 18, 19]]}):
        bodies.append(("/v1/embeddings", body))
    return bodies


def run_mix(port):
    outcomes, failures = [], []
    lock = threading.Lock()

    def one(path, body):
        try:
            status, _, data = exchange(port, "POST", path, body)
            if status == 503:
                check_out_of_memory_error(data)
                kind = "503"
            else:
                assert status == 200, (status, data[:300])
                if path == "/v1/embeddings":
                    check_embeddings(body, data)
                    kind = "ok"
                elif body["stream"]:
                    kind = check_stream(body, data)
                else:
                    check_answer(body, data)
                    kind = "ok"
            with lock:
                outcomes.append(kind)
        except Exception as e:  # collected and reported below
            with lock:
                failures.append(f"{path} {json.dumps(body)}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=job) for job in request_mix() * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not failures, "\n".join(failures)
    return outcomes


def eventually_ok(port, path):
    """The hook also fails allocations of these endpoints now and then."""
    for _ in range(50):
        status, _, data = exchange(port, "GET", path)
        if status == 200:
            return data
        assert status == 503, (status, data)
        check_out_of_memory_error(data)
    raise AssertionError(f"{path} never answered 200")


def idle(port):
    values = {}
    for line in eventually_ok(port, "/metrics").decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return (values["llm_serve_requests_running"] == 0 and values["llm_serve_requests_waiting"] == 0
            and values['llm_serve_kv_blocks{state="used"}'] == 0
            and values["llm_serve_http_requests_active"] == 0)


def check_server(fail_every):
    proc, port = start_server(fail_every)
    try:
        outcomes = run_mix(port)
        assert outcomes.count("503") + outcomes.count("stream-error") > 0, outcomes
        print(f"    one allocation in {fail_every} failing: " +
              ", ".join(f"{k} {outcomes.count(k)}" for k in sorted(set(outcomes))), flush=True)
        assert json.loads(eventually_ok(port, "/health"))["status"] == "ok"
        wait_until(lambda: idle(port), 10, "no running requests and no KV blocks in use")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    stderr = proc.stderr.read()
    assert rc == 0, (rc, stderr[-3000:])


def test_every_7th_allocation_fails():
    check_server(7)


def test_every_23rd_allocation_fails():
    check_server(23)


def test_every_97th_allocation_fails():
    check_server(97)


if __name__ == "__main__":
    Suite("out_of_memory").run([test_every_7th_allocation_fails, test_every_23rd_allocation_fails,
                                   test_every_97th_allocation_fails])
