"""llm-serve behind nginx with the configuration of docs/nginx/llm-serve.conf,
as written there but for the marked lines (ports, certificate): TLS, the
API key passed through, server-sent events passed on token by token, the
per-key rate limit, and a client that leaves cancelling its generation.
Skipped, saying so, where nginx or openssl is not installed
(scripts/install-deps.sh installs both on Debian)."""
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

from common import Suite, sse_events, wait_until
from test_shutdown import start_server

KEY = "nginx-test-key"
CONF = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "nginx", "llm-serve.conf")


def find(name):
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def adjusted_conf(upstream_port, listen_port, cert, key):
    """The documented file with its ADJUST lines set for this test."""
    text = open(CONF).read()
    subs = [(r"server 127\.0\.0\.1:8080;", f"server 127.0.0.1:{upstream_port};"),
            (r"listen 443 ssl;", f"listen 127.0.0.1:{listen_port} ssl;"),
            (r"ssl_certificate +/etc/ssl/llm/fullchain\.pem;", f"ssl_certificate {cert};"),
            (r"ssl_certificate_key /etc/ssl/llm/privkey\.pem;", f"ssl_certificate_key {key};")]
    for pattern, repl in subs:
        text, n = re.subn(pattern, repl, text)
        assert n == 1, f"docs/nginx/llm-serve.conf no longer has '{pattern}'"
    return text


class Proxy:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="llm-nginx-")
        self.server, self.upstream = start_server("--api-key", KEY)
        cert, key = os.path.join(self.dir, "cert.pem"), os.path.join(self.dir, "key.pem")
        subprocess.run([find("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                        "-subj", "/CN=localhost", "-days", "1", "-keyout", key, "-out", cert],
                       check=True, capture_output=True)
        self.port = free_port()
        with open(os.path.join(self.dir, "llm-serve.conf"), "w") as f:
            f.write(adjusted_conf(self.upstream, self.port, cert, key))
        d = self.dir
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(f"daemon off;\nmaster_process off;\npid {d}/nginx.pid;\n"
                    f"error_log {d}/error.log;\nevents {{}}\n"
                    f"http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n"
                    f"  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n"
                    f"  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n"
                    f"  include {d}/llm-serve.conf;\n}}\n")
        self.nginx = subprocess.Popen([find("nginx"), "-p", d, "-c", f"{d}/nginx.conf"],
                                      stderr=subprocess.PIPE, text=True)
        self.tls = ssl.create_default_context()
        self.tls.check_hostname = False
        self.tls.verify_mode = ssl.CERT_NONE
        wait_until(self.up, 10, "nginx to listen")

    def up(self):
        if self.nginx.poll() is not None:
            raise AssertionError("nginx exited: " + self.nginx.stderr.read())
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def conn(self):
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=60, context=self.tls)

    def request(self, method, path, body=None, key=KEY):
        c = self.conn()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = "Bearer " + key
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers=headers)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def upstream_metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=10)
        c.request("GET", "/metrics", headers={"Authorization": "Bearer " + KEY})
        text = c.getresponse().read().decode()
        c.close()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def close(self):
        self.nginx.terminate()
        self.nginx.wait(10)
        self.server.terminate()
        self.server.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


PROXY = None
CHAT = "/v1/chat/completions"


def test_tls_and_key_pass_through():
    status, data = PROXY.request("GET", "/health", key=None)
    assert status == 200 and json.loads(data)["status"] == "ok", (status, data)
    status, data = PROXY.request("GET", "/v1/models", key="wrong")
    assert status == 401, (status, data)
    status, data = PROXY.request("GET", "/v1/models")
    assert status == 200 and json.loads(data)["data"], (status, data)


def test_stream_passes_tokens_as_they_come():
    body = {"messages": [{"role": "user", "content": "Count from one to twenty."}],
            "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    status, data = PROXY.request("POST", CHAT, body)
    assert status == 200, data
    want = json.loads(data)["choices"][0]["message"]["content"]
    c = PROXY.conn()
    c.request("POST", CHAT, body=json.dumps({**body, "stream": True}),
              headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    text, times = "", []
    for ev in sse_events(r):
        if ev == "DONE":
            break
        times.append(time.time())
        for ch in ev["choices"]:
            text += ch["delta"].get("content") or ""
    c.close()
    assert text == want, (text, want)
    # Buffered, every event would arrive at once at the end.
    assert times[len(times) // 2] < times[-1] - 0.05, "the stream arrived in one piece"


def test_per_key_rate_limit():
    # 5 requests/s with a burst of 20 per key (the documented values). The
    # tests before used the same key: wait until its bucket is full again, or
    # how many of the 40 pass depends on how fast those tests ran.
    time.sleep(4.5)
    statuses = [PROXY.request("GET", "/v1/models")[0] for _ in range(40)]
    assert statuses.count(429) >= 10 and statuses.count(200) >= 20, statuses
    time.sleep(4.5)  # the bucket refills
    assert PROXY.request("GET", "/v1/models")[0] == 200


def test_client_leaving_cancels_generation():
    before = PROXY.upstream_metrics()["llm_serve_engine_generated_tokens_total"]
    c = PROXY.conn()
    c.request("POST", CHAT, body=json.dumps({
        "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 900,
        "ignore_eos": True, "stream": True}),
        headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    r.read1(64)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    wait_until(lambda: PROXY.upstream_metrics()["llm_serve_requests_running"] == 0, 10,
               "the generation to be cancelled")
    generated = PROXY.upstream_metrics()["llm_serve_engine_generated_tokens_total"] - before
    assert generated < 600, f"{generated} of 900 tokens generated after the client left"


if __name__ == "__main__":
    missing = [n for n in ("nginx", "openssl") if not find(n)]
    if missing:
        print(f"nginx: skipped, {' and '.join(missing)} not installed (scripts/install-deps.sh)")
        sys.exit(0)
    PROXY = Proxy()
    try:
        Suite("nginx").run([test_tls_and_key_pass_through, test_stream_passes_tokens_as_they_come,
                            test_per_key_rate_limit, test_client_leaving_cancels_generation])
    finally:
        PROXY.close()
