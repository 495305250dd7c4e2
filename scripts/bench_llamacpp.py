#!/usr/bin/env python3
"""llama.cpp's side of `make bench-cpu`: the measurements of build/llm-bench-cpu
through llama-cpp-python's low-level API, printed as one JSON line.

Run with the Python of a venv that has llama-cpp-python (scripts/bench-cpu.sh
makes one). Same work as ours, token for token:

  pp       one llama_decode of N prompt tokens (logits for the last only);
  tg       N llama_decode calls of one token each after a short prompt;
  batched  S sequences with a short prompt each (one decode, untimed), then
           steps of S tokens, one per sequence, each with logits.

The token ids come from the same generator as llm-bench-cpu's, consumed in the
same order (warm-up, pp, tg, batched), so both engines see the same tokens.
Settings: n_threads = n_threads_batch = -t, CPU only, n_batch = n_ubatch =
512 (or the largest batch), KV cache F32 like ours, flash attention at
llama.cpp's default (auto), weights read into memory (use_mmap off; --mmap
maps them) and llama.cpp's "extra buffer types" without AMX (_drop_amx;
--bufts none turns them all off, as tests/golden/make_golden.py does).
Batched runs get a context with n_seq_max = S (non-unified KV, llama.cpp's
default), created before the timing starts.
"""

import argparse
import ctypes
import json
import os
import sys
import time

import llama_cpp
import llama_cpp.llama_cpp as L

MASK = (1 << 64) - 1


class Rng:
    """splitmix64, as llm-bench-cpu's rng_next/rand_token."""

    def __init__(self, seed):
        self.s = seed & MASK

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def token(self, n_vocab):
        hi = n_vocab - 256 if n_vocab > 512 else n_vocab
        return self.next() % hi


LOG_LINES = []


@L.llama_log_callback
def _log(level, text, user):
    # Keep llama.cpp quiet, but remember what it said (flash attention
    # resolution, errors) for the record.
    try:
        LOG_LINES.append(text.decode(errors="replace"))
    except Exception:
        pass


def _no_extra_bufts():
    """Make Llama() load weights without llama.cpp's "extra buffer types"
    (AMX and CPU_REPACK): patch the default model params, the trick of
    tests/golden/make_golden.py (llama-cpp-python has no option for it)."""
    orig = L.llama_model_default_params

    def patched():
        p = orig()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    L.llama_model_default_params = patched


def _drop_amx():
    """Remove AMX from the CPU device's list of extra buffer types, keeping
    CPU_REPACK. On CPUs that report AMX, llama.cpp puts Q4_0/Q4_1/Q8_0
    weights in the AMX buffer type, and decode with it segfaults on these
    machines (it did when tests/golden was made, and does with this build);
    without AMX llama.cpp runs as on any AVX-512 CPU: Q4_0 matrices repacked
    into its interleaved q4_0_8x8 layout (CPU_REPACK), everything else on the
    plain ggml-cpu kernels. llama.cpp reads the list (a NULL-terminated
    array behind ggml_backend_dev_get_extra_bufts) when it places the
    weights, so rewriting the array in place before the model loads is
    enough. Returns the names left, or None when the list is unreachable."""
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    libs = []
    for name in ("libggml.so", "libggml-base.so"):
        try:
            libs.append(ctypes.CDLL(os.path.join(libdir, name)))
        except OSError:
            pass

    def fn(name, restype, argtypes):
        for lib in libs:
            if hasattr(lib, name):
                f = getattr(lib, name)
                f.restype, f.argtypes = restype, argtypes
                return f
        raise AttributeError(name)

    try:
        vp = ctypes.c_void_p
        dev = fn("ggml_backend_dev_by_type", vp, [ctypes.c_int])(0)  # CPU
        reg = fn("ggml_backend_dev_backend_reg", vp, [vp])(dev)
        proc = fn("ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p])(
            reg, b"ggml_backend_dev_get_extra_bufts")
        buft_name = fn("ggml_backend_buft_name", ctypes.c_char_p, [vp])
    except AttributeError:
        return None
    if not dev or not proc:
        return None
    arr = ctypes.CFUNCTYPE(ctypes.POINTER(vp), vp)(proc)(dev)
    bufts = []
    while arr[len(bufts)]:
        bufts.append(arr[len(bufts)])
    keep = [b for b in bufts if not buft_name(b).upper().startswith(b"AMX")]
    for i in range(len(bufts)):
        arr[i] = keep[i] if i < len(keep) else None
    return [buft_name(b).decode() for b in keep]


def now():
    return time.perf_counter()


class Timer:
    """Wall and CPU seconds (every thread of the process) of a region."""

    def __enter__(self):
        self.w0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.w0
        self.cpu = time.process_time() - self.c0


class Engine:
    def __init__(self, args):
        self.args = args
        self.rng = Rng(args.seed)
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        if hasattr(mp, "load_mode"):
            mp.load_mode = L.LLAMA_LOAD_MODE_MMAP if args.mmap else L.LLAMA_LOAD_MODE_NONE
        else:  # older bindings
            mp.use_mmap = bool(args.mmap)
        t0 = now()
        self.model = L.llama_model_load_from_file(args.model.encode(), mp)
        if not self.model:
            sys.exit("bench_llamacpp: cannot load %s" % args.model)
        self.load_s = now() - t0
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.ctx = None
        self.batch = None
        self.cap = 0

    def context(self, n_ctx, n_seq, n_batch):
        self.free_context()
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = min(n_batch, 512)
        cp.n_seq_max = n_seq
        cp.n_threads = self.args.threads
        cp.n_threads_batch = self.args.threads
        kv = {"f32": L.GGML_TYPE_F32, "f16": L.GGML_TYPE_F16}[self.args.kv]
        cp.type_k = kv
        cp.type_v = kv
        cp.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
                              "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[self.args.flash_attn]
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            sys.exit("bench_llamacpp: cannot create a context (n_ctx %d, n_seq %d)"
                     % (n_ctx, n_seq))
        self.cap = n_batch
        self.batch = L.llama_batch_init(n_batch, 0, n_seq)

    def free_context(self):
        if self.batch is not None:
            L.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None

    def clear(self):
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def fill(self, rows):
        """rows: (seq, pos, want_logits); token ids are drawn here, in order."""
        b = self.batch
        for i, (seq, pos, logits) in enumerate(rows):
            b.token[i] = self.rng.token(self.n_vocab)
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if logits else 0
        b.n_tokens = len(rows)

    def decode(self):
        rc = L.llama_decode(self.ctx, self.batch)
        if rc != 0:
            sys.exit("bench_llamacpp: llama_decode returned %d" % rc)

    def pp(self, n):
        self.clear()
        self.fill([(0, i, i == n - 1) for i in range(n)])
        with Timer() as t:
            self.decode()
            L.llama_synchronize(self.ctx)
        return t

    def tg(self, prompt, n):
        self.clear()
        self.fill([(0, i, i == prompt - 1) for i in range(prompt)])
        self.decode()
        L.llama_synchronize(self.ctx)
        with Timer() as t:
            for i in range(n):
                self.fill([(0, prompt + i, True)])
                self.decode()
            L.llama_synchronize(self.ctx)
        return t

    def batched(self, n_seq, prompt, steps):
        self.clear()
        self.fill([(s, i, i == prompt - 1) for s in range(n_seq) for i in range(prompt)])
        self.decode()
        L.llama_synchronize(self.ctx)
        with Timer() as t:
            for i in range(steps):
                self.fill([(s, prompt + i, True) for s in range(n_seq)])
                self.decode()
            L.llama_synchronize(self.ctx)
        return t


def round_up(n, m):
    return (n + m - 1) // m * m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--mmap", action="store_true", help="map the weights (default: read)")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--tg-prompt", type=int, default=16)
    ap.add_argument("--batch", default="1,8,32", help="sequence counts, 0 = none")
    ap.add_argument("--batch-steps", type=int, default=32)
    ap.add_argument("--batch-prompt", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kv", choices=["f32", "f16"], default="f32")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--bufts", choices=["no-amx", "none", "all"], default="no-amx",
                    help="llama.cpp's extra buffer types: all but AMX (default), none, "
                    "or all (llama.cpp's default; AMX segfaults on these machines)")
    args = ap.parse_args()
    batches = [int(x) for x in args.batch.split(",") if int(x) > 0]

    L.llama_log_set(_log, ctypes.c_void_p())
    L.llama_backend_init()
    bufts = args.bufts
    extra = None
    if bufts == "no-amx":
        extra = _drop_amx()
        if extra is None:
            bufts = "none"  # cannot reach the list: the make_golden.py trick
    if bufts == "none":
        _no_extra_bufts()
        extra = []
    e = Engine(args)

    # pp/tg context, the same for the warm-up.
    n_ctx = round_up(max(args.pp + 1, args.tg_prompt + args.tg + 1, 64), 256)
    e.context(n_ctx, 1, max(args.pp, 512))
    t0 = now()
    e.pp(min(args.pp, 32) if args.pp > 0 else 8)  # pages the weights in, as ours
    e.tg(4, 4)
    warm_s = now() - t0
    out = {"kind": "run", "engine": "llama.cpp", "version": llama_cpp.__version__,
           "model": args.model, "threads": args.threads, "mmap": bool(args.mmap),
           "kv_type": args.kv, "flash_attn": args.flash_attn,
           "bufts": bufts, "extra_bufts": extra, "load_s": round(e.load_s, 4),
           "warmup_s": round(warm_s, 4), "n_vocab": e.n_vocab}
    # cpu_s: CPU seconds of all threads in the timed region.
    if args.pp > 0:
        t = e.pp(args.pp)
        out.update(pp_tokens=args.pp, pp_s=t.wall, pp_cpu_s=t.cpu, pp_tok_s=args.pp / t.wall)
    if args.tg > 0:
        t = e.tg(args.tg_prompt, args.tg)
        out.update(tg_prompt=args.tg_prompt, tg_tokens=args.tg, tg_s=t.wall, tg_cpu_s=t.cpu,
                   tg_tok_s=args.tg / t.wall)
    out.update(batch_prompt=args.batch_prompt, batch_steps=args.batch_steps, batched=[])
    for n in batches:
        per_seq = round_up(args.batch_prompt + args.batch_steps + 1, 256)
        e.context(n * per_seq, n, max(n * args.batch_prompt, n, 512))
        t = e.batched(n, args.batch_prompt, args.batch_steps)
        out["batched"].append({"n_seq": n, "s": t.wall, "cpu_s": t.cpu,
                               "tok_s": n * args.batch_steps / t.wall})
    e.free_context()
    L.llama_model_free(e.model)
    fa = [ln.strip() for ln in LOG_LINES if "flash_attn" in ln]
    out["flash_attn_log"] = fa[-1] if fa else None
    out["system_info"] = L.llama_print_system_info().decode(errors="replace").strip()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
