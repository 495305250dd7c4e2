#!/usr/bin/env python3
"""Tiny random-weight GGUF models, one per architecture row, and llama.cpp's
outputs on them.

    gen_arch_models.py --out build/test-models
        writes <out>/arch/<name>.gguf for every entry of MODELS (keeps a file
        that is already byte-identical)
    gen_arch_models.py --out build/test-models --record [--only NAME ...]
        (with llama-cpp-python installed) also evaluates each model in
        llama.cpp and writes tests/models/arch-reference/<name>.txt

The weights come from numpy's Generator with a fixed seed per model, so
every machine with the pinned packages (tests/requirements.txt) writes the
same bytes; the reference files record each model's sha256 and the C test
(tests/unit/test_arch_reference.c) refuses to compare against a model that
has drifted.

The vocabulary is SmolLM2's (its tokenizer.ggml.* keys are copied from
models/SmolLM2-135M-Instruct.Q4_1.gguf) because llama.cpp checks that a
vocabulary is complete; only token ids are fed, never text.

To add a model, append one dict to MODELS (see the keys of `llama` and the
comments on build_model); a new tensor shape is a new entry of SHAPES.
"""

import argparse
import hashlib
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REFERENCE_DIR = os.path.join(HERE, "arch-reference")
VOCAB_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

# Tensor shapes as GGUF writes them (ne[0] first: the input dimension of a
# matrix), in named sizes an entry fills in (see sizes()).
SHAPES = {
    "attn_norm.weight": ("embd",),
    "attn_q.weight": ("embd", "q"),
    "attn_k.weight": ("embd", "kv"),
    "attn_v.weight": ("embd", "kv"),
    "attn_q.bias": ("q",),
    "attn_k.bias": ("kv",),
    "attn_v.bias": ("kv",),
    "attn_q_norm.weight": ("head",),
    "attn_k_norm.weight": ("head",),
    "attn_qkv.weight": ("embd", "qkv"),
    "attn_output.weight": ("q", "embd"),
    "post_attention_norm.weight": ("embd",),
    "post_ffw_norm.weight": ("embd",),
    "ffn_norm.weight": ("embd",),
    "ffn_gate.weight": ("embd", "ff"),
    "ffn_up.weight": ("embd", "ff"),
    "ffn_up_fused.weight": ("embd", "ff2"),  # written as ffn_up.weight (Phi-3)
    "ffn_down.weight": ("ff", "embd"),
    "token_embd.weight": ("embd", "vocab"),
    "output_norm.weight": ("embd",),
    "output.weight": ("embd", "vocab"),
    "rope_freqs.weight": ("rope_half",),
    "rope_factors_long.weight": ("rope_half",),
    "rope_factors_short.weight": ("rope_half",),
    # Mixture of experts: the router, each expert's matrix stacked on a third
    # dimension (ne[2] = expert), and Qwen2-MoE's shared expert with its gate.
    "ffn_gate_inp.weight": ("embd", "expert"),
    "ffn_gate_exps.weight": ("embd", "ff_exp", "expert"),
    "ffn_up_exps.weight": ("embd", "ff_exp", "expert"),
    "ffn_down_exps.weight": ("ff_exp", "embd", "expert"),
    "ffn_gate_inp_shexp.weight": ("embd",),
    "ffn_gate_shexp.weight": ("embd", "ff_shexp"),
    "ffn_up_shexp.weight": ("embd", "ff_shexp"),
    "ffn_down_shexp.weight": ("ff_shexp", "embd"),
    # malformed on purpose, for the loader's error tests
    "attn_qkv_short.weight": ("embd", "q"),
    "ffn_up_unfused.weight": ("embd", "ff"),
    "rope_freqs_zero.weight": ("rope_half",),
}

# GGUF names that differ from the SHAPES key.
FILE_NAME = {"ffn_up_fused.weight": "ffn_up.weight", "attn_qkv_short.weight": "attn_qkv.weight",
             "ffn_up_unfused.weight": "ffn_up.weight", "rope_freqs_zero.weight": "rope_freqs.weight"}

LLAMA_LAYER = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
               "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight",
               "ffn_up.weight", "ffn_down.weight"]
BIASES = ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
QK_NORM = ["attn_q_norm.weight", "attn_k_norm.weight"]
PHI3_LAYER = ["attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight",
              "ffn_up_fused.weight", "ffn_down.weight"]
POST_NORMS = ["post_attention_norm.weight", "post_ffw_norm.weight"]
MOE_LAYER = LLAMA_LAYER[:6] + ["ffn_gate_inp.weight", "ffn_gate_exps.weight",
                               "ffn_up_exps.weight", "ffn_down_exps.weight"]
SHARED_EXPERT = ["ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                 "ffn_down_shexp.weight"]
MODEL_TIED = ["token_embd.weight", "output_norm.weight"]
MODEL_UNTIED = MODEL_TIED + ["output.weight"]

# One dict per model. Keys:
#   name      file name (arch/<name>.gguf) and reference name
#   arch      general.architecture
#   seed      numpy Generator seed
#   n_layer, n_embd, n_head, n_head_kv, n_ff   sizes
#   head_dim  attention.key_length/value_length (default n_embd / n_head)
#   rope_base, eps, context
#   matrix    GGUF type of the 2-D weights: "F32", "F16" or "Q8_0"
#   embd      type of token_embd (default: matrix)
#   f32       keys of SHAPES written F32 whatever `matrix` says (MoE routers,
#             which llama.cpp's quantizer keeps F32)
#   n_expert, n_ff_exp, n_ff_shexp   MoE sizes ("expert", "ff_exp" (default
#             n_ff), "ff_shexp" (default n_ff)); the keys go in `keys`
#   layer     tensors of every layer (keys of SHAPES, "blk.N." added)
#   model     tensors outside the layers
#   keys      extra metadata {key: value}; "<arch>." is prepended unless the
#             key starts with "general." or "tokenizer."
#   record    False: not evaluated in llama.cpp (malformed files for the
#             loader's error tests)
#   activations  what llama.cpp's CPU matmuls do to the activations for
#             these weights, which sets how the C test multiplies and its
#             tolerance: "f32" (F32 weights: kept f32), "f16" (F16 weights:
#             rounded to f16; we keep f32) or "8bit" (quantized weights:
#             quantized to 8 bits, as our default path does) or
#             "f32-gelu-f16" (F32 weights and f32 activations, but GeGLU's gelu
#             read from llama.cpp's f16 table: GGML_GELU_FP16)
MODELS = [
    {
        "name": "llama", "arch": "llama", "seed": 101,
        "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 160,
        "rope_base": 10000.0, "eps": 1e-5, "context": 256,
        "matrix": "F32", "activations": "f32",
        "layer": LLAMA_LAYER, "model": MODEL_UNTIED,
    },
    {
        # Q8_0 matrices and a Q8_0 token_embd that is also the (tied) output,
        # multiplied with 8-bit activations as llama.cpp does.
        "name": "llama-q8_0", "arch": "llama", "seed": 102,
        "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 1, "n_ff": 128,
        "rope_base": 10000.0, "eps": 1e-5, "context": 256,
        "matrix": "Q8_0", "activations": "8bit",
        "layer": LLAMA_LAYER, "model": MODEL_TIED,
    },
    {
        "name": "qwen2", "arch": "qwen2", "seed": 103,
        "n_layer": 2, "n_embd": 96, "n_head": 6, "n_head_kv": 2, "n_ff": 192,
        "rope_base": 1000000.0, "eps": 1e-6, "context": 256,
        "matrix": "F16", "embd": "F32", "activations": "f16",
        "layer": LLAMA_LAYER + BIASES, "model": MODEL_TIED,
    },
    {
        # Qwen3: QK-norm, neox rope, head_dim 32 != n_embd / n_head.
        "name": "qwen3", "arch": "qwen3", "seed": 104,
        "n_layer": 3, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "head_dim": 32, "n_ff": 128,
        "rope_base": 1000000.0, "eps": 1e-6, "context": 256,
        "matrix": "F32", "activations": "f32",
        "layer": LLAMA_LAYER + QK_NORM, "model": MODEL_TIED,
    },
    {
        # Mistral 7B's shape as llama.cpp's converter writes it: arch
        # "llama", GQA 4:1, rope base 1e6, no biases, untied output.
        "name": "mistral", "arch": "llama", "seed": 105, "embd": "F16",
        "n_layer": 2, "n_embd": 128, "n_head": 8, "n_head_kv": 2, "n_ff": 224,
        "rope_base": 1000000.0, "eps": 1e-5, "context": 256,
        "matrix": "F32", "activations": "f32",
        "layer": LLAMA_LAYER, "model": MODEL_UNTIED,
    },
    {
        # Phi-3: fused QKV and gate|up, neox rope; the sliding-window key
        # real Phi-3 files carry (llama.cpp ignores it) is above the context.
        "name": "phi3", "arch": "phi3", "seed": 106,
        "n_layer": 2, "n_embd": 96, "n_head": 6, "n_head_kv": 2, "n_ff": 160,
        "rope_base": 10000.0, "eps": 1e-5, "context": 4096,
        "keys": {"attention.sliding_window": 2047},
        "matrix": "F32", "activations": "f32",
        "layer": PHI3_LAYER, "model": MODEL_UNTIED,
    },
    {
        # The fused views over quantized rows, with 8-bit activations.
        "name": "phi3-q8_0", "arch": "phi3", "seed": 108,
        "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 4, "n_ff": 128,
        "rope_base": 10000.0, "eps": 1e-5, "context": 4096,
        "matrix": "Q8_0", "embd": "F32", "activations": "8bit",
        "layer": PHI3_LAYER, "model": MODEL_UNTIED,
    },
    {
        # Llama 3.1/3.2: rope_freqs divides the angle of each rotation pair.
        "name": "llama3-rope-freqs", "arch": "llama", "seed": 107,
        "n_layer": 2, "n_embd": 128, "n_head": 4, "n_head_kv": 1, "n_ff": 192,
        "rope_base": 10000.0, "eps": 1e-5, "context": 256,
        "matrix": "F32", "activations": "f32",
        "layer": LLAMA_LAYER, "model": MODEL_TIED + ["rope_freqs.weight"],
    },
    {
        # Qwen3-MoE: QK-norm, neox rope, 8 experts of width 32 (not
        # feed_forward_length), 2 used, renormalized.
        "name": "qwen3moe", "arch": "qwen3moe", "seed": 111,
        "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "head_dim": 32,
        "n_ff": 96, "n_expert": 8, "n_ff_exp": 32,
        "rope_base": 1000000.0, "eps": 1e-6, "context": 256,
        "matrix": "F32", "activations": "f32",
        "keys": {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32},
        "layer": MOE_LAYER + QK_NORM, "model": MODEL_UNTIED,
    },
    {
        # Qwen2-MoE: Q/K/V biases, 8 experts of width 32, 2 used, weights not
        # renormalized, and a shared expert of width 96 behind a sigmoid gate.
        "name": "qwen2moe", "arch": "qwen2moe", "seed": 112,
        "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2,
        "n_ff": 128, "n_expert": 8, "n_ff_exp": 32, "n_ff_shexp": 96,
        "rope_base": 1000000.0, "eps": 1e-6, "context": 256,
        "matrix": "F32", "activations": "f32",
        "keys": {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32,
                 "expert_shared_feed_forward_length": 96},
        "layer": MOE_LAYER + BIASES + SHARED_EXPERT, "model": MODEL_UNTIED,
    },
    {
        # Mixtral as llama.cpp writes it: a Llama file with 4 experts as wide
        # as feed_forward_length, 2 used, renormalized.
        "name": "mixtral", "arch": "llama", "seed": 113,
        "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 64, "n_expert": 4,
        "rope_base": 1000000.0, "eps": 1e-5, "context": 256,
        "matrix": "F32", "activations": "f32",
        "keys": {"expert_count": 4, "expert_used_count": 2},
        "layer": MOE_LAYER, "model": MODEL_TIED,
    },
    {
        # The same in Q8_0 with an F32 router. 8-bit activations move router
        # probabilities by a few 1e-3, enough to flip a routing decision that
        # close and with it a position's logits by a few 1e-2 std; this seed
        # has none that close (tests/models/README.md).
        "name": "mixtral-q8_0", "arch": "llama", "seed": 114,
        "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 64, "n_expert": 4,
        "rope_base": 1000000.0, "eps": 1e-5, "context": 256,
        "matrix": "Q8_0", "f32": ["ffn_gate_inp.weight"], "activations": "8bit",
        "keys": {"expert_count": 4, "expert_used_count": 2},
        "layer": MOE_LAYER, "model": MODEL_TIED,
    },
    {
        # Gemma 3: QK-norm, post-norms, GeGLU, sqrt(n_embd) embedding scale,
        # tied output; a 5-position window on layers 0-4 and 6 (layer 5
        # global) over sequences of up to 40, and the windowed layers' own
        # rope base (10000) against the file's 1e6.
        "name": "gemma3", "arch": "gemma3", "seed": 109,
        "n_layer": 7, "n_embd": 64, "n_head": 4, "n_head_kv": 1, "head_dim": 32, "n_ff": 128,
        "rope_base": 1000000.0, "eps": 1e-6, "context": 256,
        "keys": {"attention.sliding_window": 5},
        "matrix": "F32", "activations": "f32-gelu-f16",
        "layer": LLAMA_LAYER + QK_NORM + POST_NORMS, "model": MODEL_TIED,
    },
    {
        # Gemma 3 4B and larger: linear RoPE scaling by 8 on the global
        # layer only (llama.cpp keeps the windowed layers unscaled).
        "name": "gemma3-rope-linear", "arch": "gemma3", "seed": 115,
        "n_layer": 7, "n_embd": 64, "n_head": 4, "n_head_kv": 1, "head_dim": 32, "n_ff": 128,
        "rope_base": 1000000.0, "eps": 1e-6, "context": 256,
        "keys": {"attention.sliding_window": 5, "rope.scaling.type": "linear",
                 "rope.scaling.factor": 8.0},
        "matrix": "F32", "activations": "f32-gelu-f16",
        "layer": LLAMA_LAYER + QK_NORM + POST_NORMS, "model": MODEL_TIED,
    },
    {
        # A linearly scaled Llama (factor 4): every position divided by 4.
        "name": "llama-rope-linear", "arch": "llama", "seed": 116,
        "n_layer": 2, "n_embd": 128, "n_head": 4, "n_head_kv": 1, "n_ff": 192,
        "rope_base": 10000.0, "eps": 1e-5, "context": 256,
        "keys": {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0},
        "matrix": "F32", "activations": "f32",
        "layer": LLAMA_LAYER, "model": MODEL_TIED,
    },
]

# Malformed files: the loader must refuse them naming the tensor
# (tests/unit/test_arch_reference.c, test_bad_files).
_PHI3_BAD = {"arch": "phi3", "seed": 199, "n_layer": 1, "n_embd": 64, "n_head": 4,
             "n_head_kv": 2, "n_ff": 96, "rope_base": 10000.0, "eps": 1e-5, "context": 256,
             "matrix": "F32", "embd": "Q8_0", "activations": "f32", "record": False,
             "model": MODEL_TIED}
MODELS += [
    dict(_PHI3_BAD, name="phi3-missing-qkv",
         layer=[t for t in PHI3_LAYER if t != "attn_qkv.weight"]),
    dict(_PHI3_BAD, name="phi3-short-qkv",
         layer=[t if t != "attn_qkv.weight" else "attn_qkv_short.weight" for t in PHI3_LAYER]),
    dict(_PHI3_BAD, name="phi3-unfused-up",
         layer=[t if t != "ffn_up_fused.weight" else "ffn_up_unfused.weight" for t in PHI3_LAYER]),
    dict(_PHI3_BAD, name="phi3-rope-factors", layer=PHI3_LAYER,
         model=MODEL_TIED + ["rope_factors_long.weight", "rope_factors_short.weight"]),
    dict(_PHI3_BAD, name="llama-zero-rope-freqs", arch="llama", layer=LLAMA_LAYER,
         model=MODEL_TIED + ["rope_freqs_zero.weight"]),
]

# Token sequences fed teacher-forced (ids below the vocabulary size, drawn
# once with a fixed seed; the third repeats a span so attention has
# something to find), and the greedy prompts (prefixes of them).
N_SEQ_TOKENS = (24, 40, 32)
GREEDY_PROMPT_LEN = (8, 13)
GREEDY_TOKENS = 16
TOPK = 20
N_SUBSET = 32  # fixed ids recorded at every position besides the top-k


def sizes(m):
    head = m.get("head_dim", m["n_embd"] // m["n_head"])
    d = {
        "embd": m["n_embd"], "q": m["n_head"] * head, "kv": m["n_head_kv"] * head,
        "head": head, "ff": m["n_ff"], "ff2": 2 * m["n_ff"], "vocab": m["n_vocab"],
        "rope_half": head // 2,
        "expert": m.get("n_expert", 0), "ff_exp": m.get("n_ff_exp", m["n_ff"]),
        "ff_shexp": m.get("n_ff_shexp", m["n_ff"]),
    }
    d["qkv"] = d["q"] + 2 * d["kv"]
    return d


def tensor_values(rng, key, shape):
    """Values that keep a few layers well conditioned: norms near 1, matrices
    with entries of order 1/sqrt(fan-in) so activations keep their scale,
    embeddings and output large enough that logits spread over a few units."""
    base = key.split(".")[0]
    if len(shape) == 1:
        if base.endswith("norm"):
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if base.endswith("_zero"):
            return np.zeros(shape, np.float32)
        if base.startswith("rope_f"):
            # Llama 3.1's factors lie between 1 and 8; keep the lowest
            # frequencies' factors large so the scaling shows.
            return np.linspace(1.0, 8.0, shape[0]).astype(np.float32)
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)  # biases
    fan_in = shape[-1]  # numpy shape is ([experts,] rows, cols) = ([experts,] out, in)
    if base in ("token_embd", "output"):
        scale = 0.3
    else:
        scale = 0.8 / np.sqrt(fan_in)
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def add_matrix(w, name, values, type_name):
    if type_name == "F32":
        w.add_tensor(name, values)
    elif type_name == "F16":
        w.add_tensor(name, values.astype(np.float16))
    elif type_name == "Q8_0":
        q = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        raise ValueError("unknown matrix type " + type_name)


def copy_vocab(w, reader):
    n_vocab = None
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            values = field.contents()
            w.add_key_value(key, values, vtype, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(values)
        else:
            w.add_key_value(key, field.contents(), vtype)
    if not n_vocab:
        sys.exit("no tokenizer.ggml.tokens in the vocabulary model")
    return n_vocab


def build_model(m, path, reader):
    """Writes entry m to path (through a temporary name). Tensors are drawn
    in the order: model tensors, then each layer's in its list order, so
    adding a tensor at the end of a list changes no other tensor's values."""
    arch = m["arch"]
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    # Not the entry's name: llama.cpp changes token attributes of models
    # whose general.name contains "phi3", and fails on SmolLM2's vocabulary.
    w.add_name("llminfer reference model %d" % m["seed"])
    n_vocab = copy_vocab(w, reader)
    m = dict(m, n_vocab=n_vocab)
    d = sizes(m)
    w.add_block_count(m["n_layer"])
    w.add_context_length(m["context"])
    w.add_embedding_length(m["n_embd"])
    w.add_feed_forward_length(m["n_ff"])
    w.add_head_count(m["n_head"])
    w.add_head_count_kv(m["n_head_kv"])
    w.add_layer_norm_rms_eps(m["eps"])
    w.add_rope_freq_base(m["rope_base"])
    if "head_dim" in m:
        w.add_key_length(m["head_dim"])
        w.add_value_length(m["head_dim"])
    w.add_rope_dimension_count(d["rope_half"] * 2)
    for key, value in m.get("keys", {}).items():
        full = key if key.startswith(("general.", "tokenizer.")) else arch + "." + key
        if isinstance(value, bool):
            w.add_bool(full, value)
        elif isinstance(value, int):
            w.add_uint32(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_string(full, value)
    rng = np.random.default_rng(m["seed"])
    names = [(FILE_NAME.get(k, k), k) for k in m["model"]]
    for i in range(m["n_layer"]):
        names += [("blk.%d.%s" % (i, FILE_NAME.get(k, k)), k) for k in m["layer"]]
    for name, key in names:
        shape = tuple(d[s] for s in reversed(SHAPES[key]))  # numpy order: (rows, cols)
        values = tensor_values(rng, key, shape)
        if len(shape) == 1 or key in m.get("f32", ()):
            w.add_tensor(name, values)
        elif key == "token_embd.weight":
            add_matrix(w, name, values, m.get("embd", m["matrix"]))
        else:
            add_matrix(w, name, values, m["matrix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_models(out_dir, only):
    if not os.path.isfile(VOCAB_MODEL):
        sys.exit("gen_arch_models.py: the vocabulary comes from %s, which is missing "
                 "(make fetches it)" % VOCAB_MODEL)
    reader = gguf.GGUFReader(VOCAB_MODEL)
    os.makedirs(os.path.join(out_dir, "arch"), exist_ok=True)
    paths = {}
    for m in MODELS:
        if only and m["name"] not in only:
            continue
        path = os.path.join(out_dir, "arch", m["name"] + ".gguf")
        tmp = build_model(m, path, reader)
        if os.path.isfile(path) and sha256_file(path) == sha256_file(tmp):
            os.remove(tmp)
        else:
            os.replace(tmp, path)
        paths[m["name"]] = path
    return paths


# ---------------------------------------------------------------- recording


def token_sequences(n_vocab):
    rng = np.random.default_rng(7)
    seqs = [[int(t) for t in rng.integers(0, n_vocab, n)] for n in N_SEQ_TOKENS]
    seqs[2] = seqs[2][:16] + seqs[2][:16]
    return seqs


def subset_ids(n_vocab):
    step = n_vocab // N_SUBSET
    return [i * step + (i * 37) % step for i in range(N_SUBSET)]


def record(m, path, out_path):
    import llama_cpp
    import llama_cpp.llama_cpp as lib
    from llama_cpp import Llama

    orig = lib.llama_model_default_params

    def no_extra_bufts():
        p = orig()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = no_extra_bufts
    n_ctx = 128
    llm = Llama(model_path=path, n_gpu_layers=0, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                n_threads=1, n_threads_batch=1, seed=1234, logits_all=True,
                flash_attn=False, type_k=llama_cpp.GGML_TYPE_F32,
                type_v=llama_cpp.GGML_TYPE_F32, use_mmap=False, verbose=False)
    lib.llama_model_default_params = orig
    n_vocab = llm.n_vocab()
    seqs = token_sequences(n_vocab)
    subset = subset_ids(n_vocab)
    sysinfo = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    lines = [
        "# llama.cpp reference for the tiny random model '%s' (architecture %s)" % (m["name"], m["arch"]),
        "# generated by tests/models/gen_arch_models.py --record (see tests/models/README.md)",
        "# llama-cpp-python %s (bundled llama.cpp), CPU only, 1 thread, n_ctx %d, n_batch %d,"
        % (llama_cpp.__version__, n_ctx, n_ctx),
        "# kv cache f32, flash_attn off, use_mmap off, extra buffer types off, logits_all",
        "# llama.cpp system info: " + sysinfo,
        "# format:",
        "#   model <name> <sha256 of arch/<name>.gguf as written by the generator>",
        "#   activations <f32|f16|8bit>   llama.cpp's activation rounding (the entry's 'activations')",
        "#   seq <index> <n> : <ids>            evaluated in one batch from an empty cache",
        "#   top <seq> <pos> <std> : <id>:<logit> x%d" % TOPK,
        "#       the logits after token <pos>: full-vocabulary standard deviation (%.6g),",
        "#       then the top %d by descending logit (ties: lower id first), %%.6f" % TOPK,
        "#   sub <seq> <pos> : <logit> x%d   at the ids of the 'subset' line" % N_SUBSET,
        "#   greedy <index> <n_prompt> : <prompt ids> | <%d argmax continuation ids>" % GREEDY_TOKENS,
        "#   margin <index> : <top1 - top2 logit at each greedy step>",
        "model %s %s" % (m["name"], sha256_file(path)),
        "activations " + m["activations"],
        "subset : " + " ".join(str(i) for i in subset),
    ]
    for si, ids in enumerate(seqs):
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids), :], dtype=np.float32)
        lines.append("seq %d %d : %s" % (si, len(ids), " ".join(map(str, ids))))
        for p in range(len(ids)):
            row = scores[p]
            order = np.argsort(-row, kind="stable")[:TOPK]
            lines.append("top %d %d %.6f : %s" % (
                si, p, float(np.std(row.astype(np.float64))),
                " ".join("%d:%.6f" % (int(t), float(row[t])) for t in order)))
            lines.append("sub %d %d : %s" % (si, p, " ".join("%.6f" % float(row[t]) for t in subset)))
    for gi, n_prompt in enumerate(GREEDY_PROMPT_LEN):
        prompt = seqs[gi][:n_prompt]
        llm.reset()
        llm.eval(prompt)
        cont, margins = [], []
        for step in range(GREEDY_TOKENS):
            row = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32)
            order = np.argsort(-row, kind="stable")[:2]
            cont.append(int(order[0]))
            margins.append(float(row[order[0]] - row[order[1]]))
            if step + 1 < GREEDY_TOKENS:
                llm.eval([int(order[0])])
        lines.append("greedy %d %d : %s | %s" % (gi, n_prompt, " ".join(map(str, prompt)),
                                                 " ".join(map(str, cont))))
        lines.append("margin %d : %s" % (gi, " ".join("%.4f" % x for x in margins)))
    del llm
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, out_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for arch/<name>.gguf")
    ap.add_argument("--record", action="store_true",
                    help="also write llama.cpp's outputs to tests/models/arch-reference/")
    ap.add_argument("--only", nargs="*", default=None, help="model names (default: all)")
    args = ap.parse_args()
    paths = write_models(args.out, args.only)
    if args.record:
        os.makedirs(REFERENCE_DIR, exist_ok=True)
        by_name = {m["name"]: m for m in MODELS}
        for name, path in paths.items():
            if not by_name[name].get("record", True):
                continue
            record(by_name[name], path, os.path.join(REFERENCE_DIR, name + ".txt"))
            print("recorded", name)


if __name__ == "__main__":
    main()
