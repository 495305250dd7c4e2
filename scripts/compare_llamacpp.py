#!/usr/bin/env python3
"""Teacher-forced logits of libllminfer versus llama.cpp on one GGUF file.

Both engines evaluate the six prompts of tests/golden/make_golden.py (prose,
ChatML chat, code, a list, a question, repetition) in one batch from an empty
KV cache, with logits at every position; llama.cpp through llama-cpp-python
with make_golden.py's settings (CPU, 1 thread, f32 KV, no flash attention,
no AMX/repack layouts), libllminfer through its public C API (ctypes on the
shared library; 8-bit activations, as in normal use). Reported:

  top-1 agreement   positions whose argmax is the same in both;
  near ties         of the disagreements, how many have llama.cpp's logits
                    of the two argmaxes within 0.5 of each other;
  logits            mean and max |ours - llama.cpp| over all logits,
                    relative to the logits' standard deviation too;
  nll               mean negative log-likelihood of the prompts' tokens.

Used for the K-quant files (Q4_K, Q6_K, Q4_K_M) that examples/llm-quantize
writes, e.g.

    build-kq/llm-quantize models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        /tmp/smol-q4km.gguf Q4_K_M
    /tmp/llvenv/bin/python scripts/compare_llamacpp.py /tmp/smol-q4km.gguf \\
        --lib build-kq/libllminfer.so

The venv needs llama-cpp-python (0.3.36) and numpy. Exit status 0 always
(it reports; it does not judge) unless something fails to run.
"""

import argparse
import ctypes
import importlib.util
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load_golden_module():
    path = os.path.join(ROOT, "tests", "golden", "make_golden.py")
    spec = importlib.util.spec_from_file_location("make_golden", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # defines things only; main() is not run
    return mod


class Ours:
    """libllminfer through its public API."""

    def __init__(self, lib_path, model_path, n_threads, n_ctx):
        L = ctypes.CDLL(lib_path)
        self.L = L
        L.llm_last_error.restype = ctypes.c_char_p
        L.llm_model_load.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p)]
        L.llm_session_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.POINTER(ctypes.c_void_p)]
        L.llm_session_free.argtypes = [ctypes.c_void_p]
        L.llm_model_free.argtypes = [ctypes.c_void_p]
        L.llm_seq_open.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
        L.llm_batch_create.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p)]
        L.llm_batch_free.argtypes = [ctypes.c_void_p]
        L.llm_batch_add.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32,
                                    ctypes.c_int32, ctypes.c_bool]
        L.llm_session_decode.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        L.llm_session_logits.argtypes = [ctypes.c_void_p, ctypes.c_uint32,
                                         ctypes.POINTER(ctypes.POINTER(ctypes.c_float))]
        self.model = ctypes.c_void_p()
        self.check(L.llm_model_load(model_path.encode(), None, ctypes.byref(self.model)),
                   "llm_model_load")
        # llm_session_params starts with struct_size, n_threads, n_ctx,
        # max_batch_tokens (uint32 each); init fills the rest.
        self.params = (ctypes.c_uint32 * 256)()
        L.llm_session_params_init(self.params)
        self.params[1] = n_threads
        self.params[2] = n_ctx
        self.params[3] = n_ctx
        self.n_ctx = n_ctx

    def check(self, st, what):
        if st != 0:
            sys.exit("%s: status %d (%s)" % (what, st, self.L.llm_last_error().decode()))

    def logits(self, ids, n_vocab):
        L = self.L
        sess = ctypes.c_void_p()
        self.check(L.llm_session_create(self.model, self.params, ctypes.byref(sess)),
                   "llm_session_create")
        seq = ctypes.c_int32()
        self.check(L.llm_seq_open(sess, ctypes.byref(seq)), "llm_seq_open")
        batch = ctypes.c_void_p()
        self.check(L.llm_batch_create(len(ids), ctypes.byref(batch)), "llm_batch_create")
        for p, t in enumerate(ids):
            self.check(L.llm_batch_add(batch, seq, p, t, True), "llm_batch_add")
        self.check(L.llm_session_decode(sess, batch), "llm_session_decode")
        out = np.empty((len(ids), n_vocab), dtype=np.float32)
        ptr = ctypes.POINTER(ctypes.c_float)()
        for p in range(len(ids)):
            self.check(L.llm_session_logits(sess, p, ctypes.byref(ptr)), "llm_session_logits")
            out[p] = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
        L.llm_batch_free(batch)
        L.llm_session_free(sess)
        return out


def log_softmax(row):
    m = row.max()
    return row - m - np.log(np.exp(row - m).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libllminfer.so"))
    ap.add_argument("--threads", type=int, default=1, help="libllminfer threads (1)")
    args = ap.parse_args()

    golden = load_golden_module()
    llm = golden.load(args.model, logits_all=True)
    n_vocab = llm.n_vocab()
    ours = Ours(os.path.abspath(args.lib), args.model, args.threads, golden.N_CTX)

    tot = agree = near = 0
    sum_abs = 0.0
    max_abs = 0.0
    n_logits = 0
    rel = []
    nll_ref = nll_ours = 0.0
    n_pred = 0
    for pi, text in enumerate(golden.LOGITS_PROMPTS):
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        ref = np.array(llm.scores[: len(ids), :], dtype=np.float32)
        got = ours.logits(ids, n_vocab)
        a_ref, a_got = ref.argmax(axis=1), got.argmax(axis=1)
        same = int((a_ref == a_got).sum())
        diff = np.abs(got.astype(np.float64) - ref)
        for p in np.nonzero(a_ref != a_got)[0]:
            if ref[p, a_ref[p]] - ref[p, a_got[p]] < 0.5:
                near += 1
        for p in range(len(ids) - 1):
            nll_ref -= float(log_softmax(ref[p].astype(np.float64))[ids[p + 1]])
            nll_ours -= float(log_softmax(got[p].astype(np.float64))[ids[p + 1]])
            n_pred += 1
        rel.append(diff.mean() / ref.std())
        tot += len(ids)
        agree += same
        sum_abs += diff.sum()
        n_logits += diff.size
        max_abs = max(max_abs, float(diff.max()))
        print("prompt %d: %3d positions, top-1 agree %3d, mean |diff| %.4f, max %.3f"
              % (pi, len(ids), same, diff.mean(), diff.max()))
    print("model %s" % args.model)
    print("top-1 agreement %d/%d = %.1f%% (disagreements at near ties, margin < 0.5: %d/%d)"
          % (agree, tot, 100.0 * agree / tot, near, tot - agree))
    print("logits |ours - llama.cpp|: mean %.4f, max %.3f; mean / std(logits) %.4f"
          % (sum_abs / n_logits, max_abs, float(np.mean(rel))))
    print("mean nll: llama.cpp %.4f, ours %.4f" % (nll_ref / n_pred, nll_ours / n_pred))


if __name__ == "__main__":
    main()
