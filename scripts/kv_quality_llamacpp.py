#!/usr/bin/env python3
"""llama.cpp's side of the KV cache quality comparison (docs/bench.md, "KV
cache types: quality and memory"): perplexity of a text with llama.cpp's KV
cache in a test type against the same model with a base KV type, through
llama-cpp-python, windowed exactly as build/llm-perplexity windows it.

  python scripts/kv_quality_llamacpp.py -m MODEL -f TEXT --ctx 512 \
      --base f16 --test q8_0[,f32,...] [--threads 2] [--top-k 1024] [--save-base FILE]

The text is tokenized whole (no BOS, no special tokens) and read in windows
of ctx tokens starting every ctx/2; each window is decoded from an empty
cache and scores the tokens of its second half (the first window all but
its first token). One llama.cpp context with the base KV type and one per
test type decode every window, and per scored token the script compares
each test's full distribution with the base's (log-softmax in float64):

  KLD(base || test), exact over the whole vocabulary; with --top-k K also
    the estimate llm-perplexity makes from a saved base (the base's K most
    likely tokens plus one bucket for the rest), to show what K loses;
  same top token: argmax of the two rows equal;
  delta ppl: exp(mean(nll_test - nll_base)) - 1, its standard error from the
    per-token differences (tokens treated as independent, as llama.cpp's
    perplexity tool does).

--save-base FILE writes the base run in llm-perplexity's --kld-base format
(see examples/llm-perplexity/main.c), so `llm-perplexity --kld FILE` can
compare our engine against llama.cpp's distribution too; the file holds a
hash of the token ids, so a tokenizer difference is refused, not measured.

Settings: CPU only, flash attention on (llama.cpp needs it for a quantized V
cache), n_batch = n_ubatch = ctx, weights without the AMX buffer type (see
scripts/bench_llamacpp.py). KV types: f32, f16, bf16, q8_0, q4_0. Under
flash attention llama.cpp casts an f32 cache to f16, so f32 gives the f16
result. With a quantized cache llama.cpp rotates Q, K and V by a Hadamard
matrix before storing them (its default); LLAMA_ATTN_ROT_DISABLE=1 in the
environment turns that off, for comparison with a cache without it.
Prints one JSON object per test type, a line each. Run with the Python of a venv that has
llama-cpp-python and numpy (scripts/bench-cpu.sh makes one).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_llamacpp  # noqa: E402  (for _drop_amx and the quiet log callback)
import llama_cpp  # noqa: E402
import llama_cpp.llama_cpp as L  # noqa: E402

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "bf16": 30}
MAGIC = b"LLMKLDB1"


def token_hash(tokens):
    """FNV-1a 64 over the ids as little-endian uint32 (llm-perplexity's)."""
    h = 0xCBF29CE484222325
    for b in np.asarray(tokens, dtype="<u4").tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def windows(n_tok, ctx):
    """(start, length, first scored token) of every window, as llm-perplexity."""
    half = ctx // 2
    start = 0
    while True:
        length = min(n_tok - start, ctx)
        first = 1 if start == 0 else start + half
        if first >= start + length:
            return
        yield start, length, first
        if start + length == n_tok:
            return
        start += half


def log_softmax(rows):
    x = rows.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def topk_kld(lp_base, lp_test, k):
    """KLD from the base's k most likely tokens plus a tail bucket: what
    llm-perplexity computes from a saved base (a lower bound of the exact)."""
    idx = np.argpartition(-lp_base, k - 1, axis=1)[:, :k]
    pb = np.take_along_axis(lp_base, idx, axis=1)
    pt = np.take_along_axis(lp_test, idx, axis=1)
    head = (np.exp(pb) * (pb - pt)).sum(axis=1)
    tail_b = np.clip(1.0 - np.exp(pb).sum(axis=1), 0.0, None)
    tail_t = np.clip(1.0 - np.exp(pt).sum(axis=1), 1e-300, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = np.where(tail_b > 0, tail_b * np.log(tail_b / tail_t), 0.0)
    return head + tail, idx, pb


def load(args, kv):
    return llama_cpp.Llama(model_path=args.model, n_ctx=args.ctx, n_batch=args.ctx,
                           n_ubatch=args.ctx, n_threads=args.threads,
                           n_threads_batch=args.threads, n_gpu_layers=0, logits_all=True,
                           flash_attn=True, type_k=GGML_TYPES[kv], type_v=GGML_TYPES[kv],
                           seed=0, verbose=False)


def window_logprobs(llm, tokens, start, length, first):
    llm.reset()
    llm.eval(tokens[start:start + length])
    rows = np.array(llm.scores[first - start - 1:length - 1], copy=True)
    return log_softmax(rows)


def summary(values):
    v = np.sort(np.asarray(values))
    return {"mean": float(v.mean()), "mean_se": float(v.std(ddof=1) / math.sqrt(len(v))),
            "median": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
            "max": float(v[-1])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base", choices=sorted(GGML_TYPES), default="f16")
    ap.add_argument("--test", default="q8_0", help="KV types, comma-separated")
    ap.add_argument("--top-k", type=int, default=1024)
    ap.add_argument("--save-base", metavar="FILE")
    args = ap.parse_args()
    tests = args.test.split(",")
    if any(t not in GGML_TYPES for t in tests):
        ap.error("--test takes KV types among " + ", ".join(sorted(GGML_TYPES)))

    L.llama_log_set(bench_llamacpp._log, None)
    bench_llamacpp._drop_amx()
    with open(args.file, "rb") as fh:
        text = fh.read()
    base = load(args, args.base)
    engines = [load(args, t) for t in tests]
    tokens = base.tokenize(text, add_bos=False, special=False)
    n_vocab = base.n_vocab()
    k = min(args.top_k, n_vocab)
    nll_b = []
    stats = [{"nll": [], "kld": [], "kld_k": [], "same": []} for _ in tests]
    out = None
    if args.save_base:
        out = open(args.save_base, "wb")
        n_scored = sum(s + n - f for s, n, f in windows(len(tokens), args.ctx))
        out.write(MAGIC + struct.pack("<IIIIQQQ", n_vocab, k, args.ctx, 0, len(tokens),
                                      token_hash(tokens), n_scored))
    for start, length, first in windows(len(tokens), args.ctx):
        lb = window_logprobs(base, tokens, start, length, first)
        tgt = np.asarray(tokens[first:start + length])
        rows = np.arange(len(tgt))
        nll_b.extend(-lb[rows, tgt])
        for engine, st in zip(engines, stats):
            lt = window_logprobs(engine, tokens, start, length, first)
            st["nll"].extend(-lt[rows, tgt])
            st["kld"].extend((np.exp(lb) * (lb - lt)).sum(axis=1))
            st["kld_k"].extend(topk_kld(lb, lt, k)[0])
            st["same"].extend(lb.argmax(axis=1) == lt.argmax(axis=1))
        if out:
            idx = np.argpartition(-lb, k - 1, axis=1)[:, :k]
            pb = np.take_along_axis(lb, idx, axis=1)
            order = np.lexsort((idx, -pb), axis=1)
            pb = np.take_along_axis(pb, order, axis=1).astype("<f4")
            idx = np.take_along_axis(idx, order, axis=1).astype("<i4")
            for r in rows:
                out.write(struct.pack("<f", -lb[r, tgt[r]]) + pb[r].tobytes() +
                          idx[r].tobytes())
    if out:
        out.close()
    nll_b = np.asarray(nll_b)
    for test, st in zip(tests, stats):
        d = np.asarray(st["nll"]) - nll_b
        n = len(d)
        ratio = math.exp(d.mean())
        p_same = float(np.mean(st["same"]))
        print(json.dumps({
            "engine": "llama.cpp " + llama_cpp.__version__, "base": args.base, "test": test,
            "ctx": args.ctx, "tokens": n, "text_tokens": len(tokens),
            "ppl_base": math.exp(nll_b.mean()), "ppl": math.exp(np.mean(st["nll"])),
            "delta_ppl_pct": 100.0 * (ratio - 1.0),
            "delta_ppl_pct_se": 100.0 * ratio * d.std(ddof=1) / math.sqrt(n),
            "kld": summary(st["kld"]), "kld_top_k": k, "kld_from_top_k": summary(st["kld_k"]),
            "same_top_pct": 100.0 * p_same,
            "same_top_pct_se": 100.0 * math.sqrt(p_same * (1.0 - p_same) / n),
        }), flush=True)


if __name__ == "__main__":
    main()
