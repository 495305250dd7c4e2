#!/usr/bin/env python3
"""Records llama.cpp's logits for the tiny F32 Llama of gen_hf_models.py
with the LoRA adapters of gen_lora.py, through llama-cpp-python (pinned
0.3.36, as tests/models/README.md), into tests/golden/lora-llama.txt, which
tests/unit/test_lora.c compares our logits with.

Settings as tests/golden/make_golden.py's (CPU, 1 thread, f32 KV cache,
no flash attention, no extra buffer types): one token sequence evaluated
teacher-forced in one batch with all logits, per adapter (and scale) and
once without. Each case line names the files' sha256, so a drifting
generator fails loudly; each position line holds the row's standard
deviation and its top-20 logits.

usage: <venv with llama-cpp-python>/bin/python tests/models/record_lora.py \\
           [--models build/test-models] [--out tests/golden/lora-llama.txt]
"""
import argparse
import hashlib
import os
import sys

import numpy as np

import llama_cpp.llama_cpp as llama_cpp_lib
from llama_cpp import Llama

# the token ids test_lora.c feeds (prompt_token(7, i) there)
PROMPT = [(i * 7919 + 7 * 104729 + 13) % 49000 for i in range(12)]
CASES = [  # (adapter file or None, scale)
    (None, 1.0),
    ("lora-llama-a.gguf", 1.0),
    ("lora-llama-b.gguf", 0.5),
]
TOPK = 20


def no_extra_bufts():
    orig = llama_cpp_lib.llama_model_default_params

    def patched():
        p = orig()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    llama_cpp_lib.llama_model_default_params = patched


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="build/test-models")
    ap.add_argument("--out", default="tests/golden/lora-llama.txt")
    a = ap.parse_args()
    no_extra_bufts()
    base = os.path.join(a.models, "hf-llama-f32.gguf")
    lines = ["# llama.cpp (llama-cpp-python %s) logits of hf-llama-f32.gguf with LoRA adapters;"
             % __import__("llama_cpp").__version__,
             "# written by tests/models/record_lora.py, read by tests/unit/test_lora.c",
             "# case ADAPTER SCALE BASE_SHA256 ADAPTER_SHA256 / pos P std S top ID:LOGIT ..."]
    for adapter, scale in CASES:
        kw = {}
        if adapter:
            kw = {"lora_path": os.path.join(a.models, adapter), "lora_scale": scale}
        llm = Llama(model_path=base, n_ctx=64, n_batch=64, n_threads=1, n_threads_batch=1,
                    logits_all=True, flash_attn=False, type_k=0, type_v=0, seed=1234,
                    verbose=False, **kw)
        llm.eval(PROMPT)
        logits = np.array(llm.scores[:len(PROMPT)], dtype=np.float64)
        lines.append("case %s %g %s %s" % (adapter or "-", scale, sha256(base),
                                            sha256(kw["lora_path"]) if adapter else "-"))
        for p, row in enumerate(logits):
            top = np.argsort(-row, kind="stable")[:TOPK]
            lines.append("pos %d std %.9g top %s" % (p, row.std(), " ".join(
                "%d:%.9g" % (t, row[t]) for t in top)))
        del llm
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
