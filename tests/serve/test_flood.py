"""Connection floods, each on a server of its own: a thousand connections
that never finish their headers must not lock other clients out, must be
closed after --idle-timeout, and the per-address and global connection
limits must refuse what is over them at once."""
import json
import resource
import socket
import time

from common import Suite, metrics, post_json, request
from test_shutdown import start_server

KEY = "flood-test-key"
STALLED = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # never the blank line that ends it


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= need, "fd limit too low"


def connect(port, source="127.0.0.1"):
    """A connection from `source` (any 127.x.y.z address is loopback)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def stalled(port, n, source="127.0.0.1"):
    socks = []
    for _ in range(n):
        s = connect(port, source)
        s.sendall(STALLED)
        socks.append(s)
    return socks


def closed_by_server(s, wait):
    """Whether the server closes `s` within `wait` seconds."""
    s.settimeout(wait)
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True
    except (socket.timeout, BlockingIOError):
        return False


def timed(fn):
    started = time.time()
    result = fn()
    return result, time.time() - started


def stop(proc):
    proc.terminate()
    proc.wait(30)


def test_stalled_connections_do_not_lock_others_out():
    raise_fd_limit(2200)
    idle = 3
    proc, port = start_server("--api-key", KEY, "--idle-timeout", str(idle),
                              "--max-connections", "1500", "--max-connections-per-ip", "0")
    base = f"http://127.0.0.1:{port}"
    try:
        opened = time.time()
        socks = stalled(port, 1000)
        # Every one of them is accepted and held, none answered yet.
        assert not any(closed_by_server(s, 0.01) for s in socks[:20])
        (status, _, data), took = timed(lambda: request("GET", "/health", base=base,
                                                        timeout=5, auth=False))
        assert status == 200 and json.loads(data)["status"] == "ok", (status, data)
        assert took < 1.0, f"/health took {took:.2f}s behind 1000 stalled connections"
        (status, _, body), took = timed(lambda: post_json(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                     "max_tokens": 2, "temperature": 0},
            base=base, timeout=5, auth=False, headers={"Authorization": "Bearer " + KEY}))
        assert status == 200 and body["usage"]["completion_tokens"] == 2, body
        assert took < 1.0, f"a completion took {took:.2f}s behind 1000 stalled connections"
        # Dropped on time: none before the idle timeout, all soon after.
        early = time.time() - opened
        assert early < idle - 0.5, "the test was too slow to check the timeout"
        assert not any(closed_by_server(s, 0.01) for s in socks[:50])
        deadline = opened + idle + 3
        for s in socks:
            assert closed_by_server(s, max(0.01, deadline - time.time())), \
                f"a stalled connection was still open {time.time() - opened:.1f}s after it opened"
        took = time.time() - opened
        assert idle - 0.5 <= took <= idle + 3, took
        for s in socks:
            s.close()
        status, _, _ = request("GET", "/health", base=base, timeout=5, auth=False)
        assert status == 200
    finally:
        stop(proc)


def test_per_address_and_global_limits():
    raise_fd_limit(400)
    proc, port = start_server("--idle-timeout", "30", "--max-connections", "50",
                              "--max-connections-per-ip", "30")
    base = f"http://127.0.0.1:{port}"
    socks = []
    try:
        socks += stalled(port, 30, "127.0.0.1")
        # The address is at its limit: its next connection is closed at once...
        extra = connect(port, "127.0.0.1")
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed_by_server(extra, 2), "the per-address limit did not close the connection"
        extra.close()
        # ...while another address is served.
        s = connect(port, "127.0.0.2")
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 200 "), "127.0.0.2 was refused"
        s.close()
        time.sleep(0.2)  # the closed connection is counted out
        socks += stalled(port, 20, "127.0.0.2")
        time.sleep(0.3)  # the event loops count connections as they take them in
        # 50 open: the global cap answers 503 at once, before any request.
        full, took = timed(lambda: connect(port, "127.0.0.3"))
        full.settimeout(2)
        reply = full.recv(4096)
        assert reply.startswith(b"HTTP/1.1 503 "), reply
        assert b"Retry-After: 1" in reply and b"too_many_connections" in reply, reply
        assert closed_by_server(full, 2)
        full.close()
        # Room again once some close.
        for s in socks[:5]:
            s.close()
        time.sleep(0.3)
        status, _, _ = request("GET", "/health", base=base, timeout=5, auth=False)
        assert status == 200
        m = metrics(base)
        assert m["llm_serve_connections_refused_total"] == 1, m
        # 45 stalled and this one, and maybe the /health one, still closing.
        assert 46 <= m["llm_serve_connections_open"] <= 47, m["llm_serve_connections_open"]
    finally:
        for s in socks:
            s.close()
        stop(proc)


if __name__ == "__main__":
    Suite("flood").run([test_stalled_connections_do_not_lock_others_out,
                        test_per_address_and_global_limits])
