"""Load generator for OpenAI-compatible servers: mixed prompt and output
lengths, streaming /v1/completions requests. Open loop by default (Poisson
arrivals at --rate); with --concurrency N, closed loop: N clients, each
sending its next request when its last one ends. Prints (and writes with
--out) a JSON summary: throughput, TTFT and TPOT percentiles. Standard
library only."""
import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly "
         "judge boxing matches near the old harbour under grey autumn skies").split()


def make_workload(n, seed):
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        prompt_words = rng.choice([16, 64, 256])
        max_tokens = rng.choice([16, 64, 128])
        prompt = f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(prompt_words))
        jobs.append((prompt, max_tokens))
    return jobs


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def one_request(url, model, prompt, max_tokens, result):
    u = urllib.parse.urlparse(url)
    start = time.perf_counter()
    first, last, n_tokens = None, None, 0
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        conn.request("POST", "/v1/completions", body=json.dumps({
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}),
            headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            result.update(error=f"HTTP {resp.status}")
            return
        usage = None
        buf = b""
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event[6:] == b"[DONE]":
                    continue
                data = json.loads(event[6:])
                if data.get("usage"):
                    usage = data["usage"]
                for c in data.get("choices", []):
                    if c.get("text"):
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        n_tokens += 1
        conn.close()
        if usage and usage.get("completion_tokens"):
            n_tokens = usage["completion_tokens"]
        result.update(start=start, first=first, last=last, tokens=n_tokens,
                      end=time.perf_counter())
    except OSError as e:
        result.update(error=repr(e))


def run(url, model, n, rate, seed):
    jobs = make_workload(n, seed)
    rng = random.Random(seed + 1)
    results = [dict() for _ in jobs]
    threads = []
    t0 = time.perf_counter()
    for i, (prompt, max_tokens) in enumerate(jobs):
        t = threading.Thread(target=one_request, args=(url, model, prompt, max_tokens, results[i]))
        t.start()
        threads.append(t)
        time.sleep(rng.expovariate(rate))
    for t in threads:
        t.join()
    return {**summarize(results, time.perf_counter() - t0), "arrival_rate_per_s": rate}


def run_closed(url, model, n, concurrency, seed):
    """concurrency clients share the n requests, each one at a time."""
    jobs = make_workload(n, seed)
    results = [dict() for _ in jobs]
    lock, taken = threading.Lock(), [0]

    def client():
        while True:
            with lock:
                i = taken[0]
                taken[0] += 1
            if i >= n:
                return
            one_request(url, model, jobs[i][0], jobs[i][1], results[i])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {**summarize(results, time.perf_counter() - t0), "concurrency": concurrency}


def summarize(results, wall):
    n = len(results)
    ok = [r for r in results if "error" not in r and r.get("first")]
    ttft = [r["first"] - r["start"] for r in ok]
    tpot = [(r["last"] - r["first"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    tokens = sum(r["tokens"] for r in ok)
    ms = lambda v: round(v * 1000, 1) if v is not None else None
    return {
        "requests": n, "completed": len(ok), "errors": n - len(ok),
        "wall_s": round(wall, 2), "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 1), "requests_per_s": round(len(ok) / wall, 2),
        "ttft_ms_p50": ms(percentile(ttft, 50)), "ttft_ms_p99": ms(percentile(ttft, 99)),
        "tpot_ms_p50": ms(percentile(tpot, 50)), "tpot_ms_p99": ms(percentile(tpot, 99)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--model", default="default")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=4.0, help="mean arrivals per second")
    ap.add_argument("--concurrency", type=int, default=0,
                    help="closed loop: this many clients, one request each at a time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="llm-serve")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.concurrency < 0 or args.requests < 1:
        ap.error("--concurrency must be >= 0 and --requests >= 1")
    if args.concurrency:
        result = run_closed(args.url, args.model, args.requests, args.concurrency, args.seed)
    else:
        result = run(args.url, args.model, args.requests, args.rate, args.seed)
    summary = {"server": args.label, **result}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
