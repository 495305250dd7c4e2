"""Raw HTTP against llm-serve: every error path, client disconnects,
concurrent streams."""
import http.client
import json
import socket
import threading
import time

from common import (API_KEY, Suite, host_port, metrics, post_json, request, sse_events,
                    wait_until)

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello!"}]


def assert_error(status, body, want_status, param=None, contains=None):
    assert status == want_status, (status, body)
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    if param is not None:
        assert err["param"] == param, err
    if contains:
        assert contains in err["message"], err


def test_health_models_metrics():
    status, _, data = request("GET", "/health", auth=False)
    assert status == 200 and json.loads(data)["status"] == "ok"
    status, _, data = request("GET", "/v1/models")
    assert status == 200 and json.loads(data)["data"][0]["object"] == "model"
    m = metrics()
    for name in ["llm_serve_prompt_tokens_total", "llm_serve_kv_blocks{state=\"free\"}",
                 "llm_serve_time_to_first_token_seconds_count", "llm_serve_preemptions_total",
                 "llm_serve_prefix_cache_hit_tokens_total", "llm_serve_requests_waiting",
                 "llm_serve_spec_accepted_tokens_total"]:
        assert name in m, name


def test_auth():
    if not API_KEY:
        return
    status, headers, body = post_json(CHAT, {"messages": HELLO}, auth=False)
    assert_error(status, body, 401)
    status, _, body = post_json(CHAT, {"messages": HELLO}, auth=False,
                                headers={"Authorization": "Bearer wrong"})
    assert_error(status, body, 401)
    status, _, data = request("GET", "/v1/models", auth=False)
    assert status == 401


def test_bad_json_and_types():
    status, _, data = request("POST", CHAT, body="{not json")
    assert_error(status, json.loads(data), 400, contains="JSON")
    status, _, body = post_json(CHAT, {"messages": HELLO, "temperature": "hot"})
    assert_error(status, body, 400, "temperature", "'temperature' must be a number")
    status, _, body = post_json(CHAT, {"messages": "hi"})
    assert_error(status, body, 400, "messages")
    status, _, body = post_json(CHAT, {"messages": HELLO, "stop": 5})
    assert_error(status, body, 400, "stop")
    status, _, body = post_json(CHAT, {"messages": [{"role": "robot", "content": "x"}]})
    assert_error(status, body, 400, "messages[0].role")
    status, _, body = post_json(CHAT, {"messages": HELLO, "n": 0})
    assert_error(status, body, 400, "n")
    status, _, body = post_json("/v1/completions", {"prompt": 3})
    assert_error(status, body, 400, "prompt")
    status, _, data = request("POST", CHAT, body=b'{"messages":[{"role":"user","content":"\xff"}]}')
    assert_error(status, json.loads(data), 400, "messages", "UTF-8")
    status, _, data = request("POST", "/v1/completions", body=b'{"prompt":"\xfe\xff"}')
    assert_error(status, json.loads(data), 400, contains="UTF-8")
    # Unknown fields are ignored.
    status, _, body = post_json(CHAT, {"messages": HELLO, "max_tokens": 2, "frobnicate": [1]})
    assert status == 200, body


def test_limits():
    status, _, body = post_json(CHAT, {"messages": HELLO, "max_tokens": 10 ** 9})
    assert_error(status, body, 400, "max_tokens", "limit")
    long_prompt = "hello " * 5000
    status, _, body = post_json("/v1/completions", {"prompt": long_prompt, "max_tokens": 4})
    assert_error(status, body, 400, "prompt")
    assert body["error"]["code"] == "context_length_exceeded"
    status, _, data = request("POST", CHAT, body="x" * (2 << 20))
    assert_error(status, json.loads(data), 413)
    # Chunked bodies have no Content-Length to refuse up front.
    host, port = host_port()
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", CHAT, body=(b"x" * 65536 for _ in range(40)), encode_chunked=True,
                 headers={"Authorization": "Bearer " + API_KEY} if API_KEY else {})
    resp = conn.getresponse()
    assert_error(resp.status, json.loads(resp.read()), 413)
    conn.close()


def raw_exchange(data, timeout=10):
    """Sends raw bytes on a new connection; returns everything the server
    sends back until it closes the connection."""
    s = socket.create_connection(host_port(), timeout=timeout)
    s.sendall(data)
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def test_tokenize_names_the_bad_field():
    status, _, body = post_json("/tokenize", {"prompt": "hi", "add_special": "yes"})
    assert_error(status, body, 400, "add_special", "'add_special' must be a boolean")
    status, _, body = post_json("/tokenize", {"prompt": 5, "add_special": True})
    assert_error(status, body, 400, "prompt", "'prompt' must be a string")


def test_ambiguous_body_framing_refused():
    auth = f"Authorization: Bearer {API_KEY}\r\n" if API_KEY else ""
    head = f"POST /tokenize HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
    body = '{"prompt": "a"}'
    # Two different lengths: which one a proxy in front used is unknown.
    out = raw_exchange((head + f"Content-Length: {len(body)}\r\nContent-Length: 5\r\n\r\n"
                        + body).encode())
    assert out.startswith(b"HTTP/1.1 400 "), out
    assert out.count(b"HTTP/1.1 ") == 1, out
    assert b"conflicting Content-Length" in out, out
    out = raw_exchange((head + f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n"
                        "\r\n" + body).encode())
    assert out.startswith(b"HTTP/1.1 400 ") and out.count(b"HTTP/1.1 ") == 1, out
    # The same length twice is one length.
    out = raw_exchange((head + f"Content-Length: {len(body)}\r\nContent-Length: {len(body)}\r\n"
                        "Connection: close\r\n\r\n" + body).encode())
    assert out.startswith(b"HTTP/1.1 200 "), out
    # A negative length is refused (by libmicrohttpd, before the request
    # reaches the server's code) and the connection closed. libmicrohttpd
    # 0.9.75 sends the head of that answer twice (docs/serve.md).
    out = raw_exchange((head + "Content-Length: -1\r\n\r\n" + body).encode())
    assert out.startswith(b"HTTP/1.1 400 ") and b"tokens" not in out, out


def test_method_and_path():
    status, _, data = request("GET", CHAT)
    assert_error(status, json.loads(data), 405)
    status, _, data = request("POST", "/v1/models")
    assert_error(status, json.loads(data), 405)
    status, _, data = request("GET", "/v1/nothing")
    assert_error(status, json.loads(data), 404)


def stream_request(body):
    host, port = host_port()
    conn = http.client.HTTPConnection(host, port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if API_KEY:
        headers["Authorization"] = "Bearer " + API_KEY
    conn.request("POST", CHAT, body=json.dumps(body), headers=headers)
    return conn, conn.getresponse()


def idle(m):
    return m['llm_serve_kv_blocks{state="used"}'] == 0 and m["llm_serve_requests_running"] == 0 \
        and m["llm_serve_requests_waiting"] == 0


def test_disconnect_mid_stream_frees_kv():
    before = metrics()["llm_serve_engine_generated_tokens_total"]
    conn, resp = stream_request({"messages": HELLO, "max_tokens": 900, "ignore_eos": True,
                                 "stream": True, "temperature": 0})
    assert resp.status == 200
    events = sse_events(resp)
    for _ in range(4):
        next(events)
    assert metrics()['llm_serve_kv_blocks{state="used"}'] > 0
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    wait_until(lambda: idle(metrics()), 5, "KV blocks to be released")
    generated = metrics()["llm_serve_engine_generated_tokens_total"] - before
    assert generated < 600, f"{generated} of 900 tokens generated after the client left"


def test_disconnect_non_stream_cancels():
    before = metrics()["llm_serve_engine_generated_tokens_total"]
    host, port = host_port()
    s = socket.create_connection((host, port))
    body = json.dumps({"messages": HELLO, "max_tokens": 900, "ignore_eos": True})
    auth = f"Authorization: Bearer {API_KEY}\r\n" if API_KEY else ""
    s.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    wait_until(lambda: metrics()["llm_serve_requests_running"] > 0, 5, "the request to run")
    s.close()
    wait_until(lambda: idle(metrics()), 5, "KV blocks to be released")
    generated = metrics()["llm_serve_engine_generated_tokens_total"] - before
    assert generated < 600, f"{generated} of 900 tokens generated after the client left"


def test_concurrent_streams_match_non_stream():
    prompts = [f"Name {k} animals that live in the sea." for k in range(2, 10)]
    expected = {}
    for p in prompts:
        status, _, body = post_json(CHAT, {"messages": [{"role": "user", "content": p}],
                                           "temperature": 0, "max_tokens": 16})
        assert status == 200, body
        expected[p] = (body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"])
    results, errors = {}, []

    def client(i):
        p = prompts[i % len(prompts)]
        try:
            conn, resp = stream_request({"messages": [{"role": "user", "content": p}],
                                         "temperature": 0, "max_tokens": 16, "stream": True,
                                         "stream_options": {"include_usage": True}})
            assert resp.status == 200, resp.status
            text, usage, done = "", None, False
            for ev in sse_events(resp):
                if ev == "DONE":
                    done = True
                    break
                if ev.get("usage"):
                    usage = ev["usage"]
                for c in ev["choices"]:
                    text += c["delta"].get("content") or ""
            conn.close()
            results[i] = (p, text, usage["completion_tokens"] if usage else None, done)
        except Exception as e:  # collected and reported below
            errors.append(f"client {i}: {e!r}")

    started = time.time()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert len(results) == 64
    for i, (p, text, n, done) in results.items():
        assert done, f"client {i}: no [DONE]"
        assert (text, n) == expected[p], (i, text, n, expected[p])
    print(f"       64 streams in {time.time() - started:.1f}s")
    wait_until(lambda: idle(metrics()), 5, "the server to go idle")


if __name__ == "__main__":
    Suite("http").run([
        test_health_models_metrics, test_auth, test_bad_json_and_types, test_limits,
        test_tokenize_names_the_bad_field, test_ambiguous_body_framing_refused,
        test_method_and_path, test_disconnect_mid_stream_frees_kv,
        test_disconnect_non_stream_cancels, test_concurrent_streams_match_non_stream,
    ])
