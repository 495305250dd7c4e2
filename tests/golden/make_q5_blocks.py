#!/usr/bin/env python3
"""Records reference Q5_0 / Q5_1 blocks for tests/unit/test_quant_q5.c.

The reference is the PyPI package `gguf` (llama.cpp's gguf-py), whose numpy
quantizers and dequantizers follow ggml's reference C code:

  * `deq` lines: blocks read from a real GGUF file (by default Gemma 3 270M
    in Q4_K_M, whose attn_q/k and ffn_gate/up are Q5_0) with the values
    `gguf.quants.dequantize` gives for them;
  * `quant` lines: random f32 blocks (fixed seed, several magnitudes, ties
    and zero blocks) with the bytes `gguf.quants.quantize` makes of them and
    the values those bytes dequantize to. The file has no Q5_1 tensors, so
    Q5_1 is checked on these only.

Output (stdout, or --out FILE), after `#` comment lines:

    deq <type> <tensor name> <block index> <block bytes hex> : <32 f32 bits hex>
    quant <type> <32 input f32 bits hex> : <block bytes hex> : <32 f32 bits hex>

Usage: make_q5_blocks.py [MODEL.gguf] [--out tests/golden/q5-blocks.txt]
Needs gguf and numpy (tests/requirements.txt pins them). The model is read,
never copied: only a few blocks' bytes go into the output.
"""
import argparse
import hashlib
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

BLOCK = 32
BLOCK_BYTES = {QT.Q5_0: 22, QT.Q5_1: 24}


def f32_hex(values):
    return " ".join("%08x" % v for v in np.asarray(values, dtype=np.float32).view(np.uint32))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_blocks(path, per_tensor=3, max_tensors=4):
    """A few Q5 blocks of the first Q5 tensors: the first, a middle and the last."""
    reader = gguf.GGUFReader(path)
    lines, used = [], 0
    for t in reader.tensors:
        if t.tensor_type not in BLOCK_BYTES or used >= max_tensors:
            continue
        used += 1
        raw = np.asarray(t.data, dtype=np.uint8).reshape(-1)
        bb = BLOCK_BYTES[t.tensor_type]
        nb = raw.size // bb
        for b in sorted({0, nb // 2 + 7, nb - 1})[:per_tensor]:
            blk = raw[b * bb:(b + 1) * bb]
            vals = dequantize(blk, t.tensor_type).reshape(-1)
            assert vals.size == BLOCK
            lines.append("deq %s %s %d %s : %s" % (t.tensor_type.name, t.name, b, blk.tobytes().hex(),
                                                   f32_hex(vals)))
    return lines


def random_blocks(seed=0x55):
    rng = np.random.default_rng(seed)
    blocks = []
    for scale in (1e-3, 0.05, 1.0, 300.0):
        for _ in range(3):
            blocks.append(rng.uniform(-scale, scale, BLOCK))
        blocks.append(rng.uniform(0.2 * scale, scale, BLOCK))  # all positive: min > 0
    blocks.append(np.zeros(BLOCK))
    blocks.append(np.arange(BLOCK) - 15.5)  # ties for the +16.5 / +0.5 rounding
    blocks.append(np.full(BLOCK, 0.75))     # constant: d = 0 for Q5_1
    one = np.zeros(BLOCK)
    one[20] = -2.5
    blocks.append(one)
    return [np.asarray(b, dtype=np.float32) for b in blocks]


def quant_lines():
    lines = []
    for qt in (QT.Q5_0, QT.Q5_1):
        for x in random_blocks():
            q = quantize(x.reshape(1, BLOCK), qt).reshape(-1)
            vals = dequantize(q, qt).reshape(-1)
            lines.append("quant %s %s : %s : %s" % (qt.name, f32_hex(x), q.tobytes().hex(),
                                                    f32_hex(vals)))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--out", help="write here (atomically) instead of stdout")
    args = ap.parse_args()
    import importlib.metadata as md
    head = [
        "# Q5_0 / Q5_1 reference blocks, recorded by tests/golden/make_q5_blocks.py",
        "# gguf %s, numpy %s" % (md.version("gguf"), md.version("numpy")),
        "# model %s sha256 %s" % (os.path.basename(args.model), sha256(args.model)),
        "# deq <type> <tensor> <block> <bytes hex> : <32 f32 bits hex> (gguf.quants.dequantize)",
        "# quant <type> <32 f32 bits hex> : <bytes hex> : <32 f32 bits hex> (gguf.quants.quantize)",
    ]
    text = "\n".join(head + file_blocks(args.model) + quant_lines()) + "\n"
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
