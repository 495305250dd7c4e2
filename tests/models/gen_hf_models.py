#!/usr/bin/env python3
"""Tiny Hugging Face checkpoint folders and the GGUF files llama.cpp's
converter (convert_hf_to_gguf.py) would make of them, for tests/unit/test_hf.c.

Each model's random weights are written twice: as a folder (config.json,
model.safetensors or shards with model.safetensors.index.json,
generation_config.json, tokenizer.json, tokenizer_config.json) and as
<name>.gguf, converted here the way the converter converts: Llama q/k rows
permuted for adjacent-pair rope (numpy reshape/swapaxes, as the converter
writes it), 1-D tensors widened to F32, matrices kept in the checkpoint's
dtype (the converter's --outtype f32/f16/bf16), tensors added in the
converter's order (shard by shard, each shard's tensors by name, as the
safetensors package lists them; computed tensors such as rope_freqs first).
A Llama with rope_scaling type "llama3" gets rope_freqs.weight computed in
numpy float32 scalars, transcribing the converter's LlamaModel (torch
float32 there). The vocabulary is
SmolLM2-135M's (tokens and merges read from its GGUF with the gguf package,
tokenizer.json made from them with the tokenizers package).

Deterministic (fixed seeds), files written atomically; skipped when a stamp
says this script already wrote them.

usage: gen_hf_models.py --out DIR [--smollm2 PATH]
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

DIMS = dict(hidden=32, layers=2, heads=4, kv_heads=2, ff=64)
GEN_CONFIG = {"bos_token_id": 1, "eos_token_id": [2, 0], "temperature": 0.6, "top_p": 0.9,
              "top_k": 20, "do_sample": True}


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even (as torch)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


class Stored:
    """One checkpoint tensor: its bytes in the checkpoint dtype."""

    def __init__(self, values: np.ndarray, dtype: str):
        self.dtype = dtype
        if dtype == "F32":
            self.raw = values.astype(np.float32)
        elif dtype == "F16":
            self.raw = values.astype(np.float16)
        else:
            self.raw = bf16_bits(values)

    def as_f32(self) -> np.ndarray:
        if self.dtype == "BF16":
            return bf16_to_f32(self.raw)
        return self.raw.astype(np.float32)


def write_safetensors(path: Path, tensors: dict) -> None:
    """F32/F16 through the safetensors package; numpy has no bfloat16, so
    BF16 files are laid out here by the format's definition (8-byte header
    length, JSON header, data in header order)."""
    if all(t.dtype != "BF16" for t in tensors.values()):
        tmp = path.with_name(path.name + ".tmp")
        save_file({k: np.ascontiguousarray(t.raw) for k, t in tensors.items()}, str(tmp))
        os.replace(tmp, path)
        return
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        b = np.ascontiguousarray(t.raw).tobytes()
        header[name] = {"dtype": t.dtype, "shape": list(t.raw.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    atomic_write(path, struct.pack("<Q", len(h)) + h + b"".join(blobs))


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The converter's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_weights(arch: str, dtype: str, n_vocab: int, seed: int) -> dict:
    d = DIMS
    rng = np.random.default_rng(seed)
    hd = d["hidden"] // d["heads"]
    q, kv = d["heads"] * hd, d["kv_heads"] * hd

    def mat(rows, cols, scale=0.3):
        return Stored(rng.standard_normal((rows, cols)).astype(np.float32) * scale, dtype)

    def norm(n):
        return Stored(1.0 + 0.1 * rng.standard_normal(n).astype(np.float32), dtype)

    def bias(n):
        return Stored(0.1 * rng.standard_normal(n).astype(np.float32), dtype)

    t = {"model.embed_tokens.weight": mat(n_vocab, d["hidden"], 1.0),
         "model.norm.weight": norm(d["hidden"])}
    if arch == "qwen2":
        t["lm_head.weight"] = mat(n_vocab, d["hidden"])
    for l in range(d["layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = norm(d["hidden"])
        t[p + "self_attn.q_proj.weight"] = mat(q, d["hidden"])
        t[p + "self_attn.k_proj.weight"] = mat(kv, d["hidden"])
        t[p + "self_attn.v_proj.weight"] = mat(kv, d["hidden"])
        t[p + "self_attn.o_proj.weight"] = mat(d["hidden"], q)
        if arch == "qwen2":
            t[p + "self_attn.q_proj.bias"] = bias(q)
            t[p + "self_attn.k_proj.bias"] = bias(kv)
            t[p + "self_attn.v_proj.bias"] = bias(kv)
        t[p + "post_attention_layernorm.weight"] = norm(d["hidden"])
        t[p + "mlp.gate_proj.weight"] = mat(d["ff"], d["hidden"])
        t[p + "mlp.up_proj.weight"] = mat(d["ff"], d["hidden"])
        t[p + "mlp.down_proj.weight"] = mat(d["hidden"], d["ff"])
    return t


# Llama 3.1's rope_scaling with a short original context, so the tiny
# model's head (8 dims, rope_theta 1e5) has pairs in all three bands: kept
# (wavelength < 64), blended (64..256) and divided by factor (> 256).
LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 256, "rope_type": "llama3"}
# Linear position scaling: the converter's LlamaModel writes it as the
# rope.scaling.type / rope.scaling.factor keys (no tensor).
LINEAR_SCALING = {"type": "linear", "factor": 4.0}


def llama3_rope_factors(theta: float, dim: int, rs: dict) -> np.ndarray:
    """The converter's LlamaModel rope_freqs for rope_type llama3. torch
    there: a float32 tensor of frequencies, Python numbers rounded to
    float32 where they meet it; here numpy float32 scalars, one element at
    a time (numpy scalar power is the C library's powf)."""
    f32 = np.float32
    factor = rs.get("factor", 8.0)
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for i in range(0, dim, 2):
        freq = f32(1.0) / (f32(theta) ** (f32(i) / f32(dim)))
        wavelen = f32(2 * math.pi) / freq
        if wavelen < f32(high_wavelen):
            out.append(f32(1.0))
        elif wavelen > f32(low_wavelen):
            out.append(f32(factor))
        else:
            smooth = (f32(old) / wavelen - f32(low)) / f32(high - low)
            out.append(f32(1.0) / ((f32(1.0) - smooth) / f32(factor) + smooth))
    return np.array(out, dtype=np.float32)


def config_json(arch: str, dtype: str, n_vocab: int, rope_scaling=None) -> dict:
    d = DIMS
    cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    return {"architectures": [cls], "model_type": arch, "hidden_size": d["hidden"],
            "intermediate_size": d["ff"], "num_hidden_layers": d["layers"],
            "num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"],
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "rope_scaling": rope_scaling, "tie_word_embeddings": arch == "llama", "vocab_size": n_vocab,
            "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype],
            "bos_token_id": 1, "eos_token_id": 2}


GGUF_NAMES = [("model.embed_tokens.weight", "token_embd.weight"), ("model.norm.weight", "output_norm.weight"),
              ("lm_head.weight", "output.weight")]
LAYER_NAMES = [("input_layernorm.weight", "attn_norm.weight"), ("self_attn.q_proj.weight", "attn_q.weight"),
               ("self_attn.k_proj.weight", "attn_k.weight"), ("self_attn.v_proj.weight", "attn_v.weight"),
               ("self_attn.o_proj.weight", "attn_output.weight"), ("self_attn.q_proj.bias", "attn_q.bias"),
               ("self_attn.k_proj.bias", "attn_k.bias"), ("self_attn.v_proj.bias", "attn_v.bias"),
               ("post_attention_layernorm.weight", "ffn_norm.weight"), ("mlp.gate_proj.weight", "ffn_gate.weight"),
               ("mlp.up_proj.weight", "ffn_up.weight"), ("mlp.down_proj.weight", "ffn_down.weight")]


def gguf_name(hf: str) -> str:
    for a, b in GGUF_NAMES:
        if hf == a:
            return b
    parts = hf.split(".")
    layer, rest = parts[2], ".".join(parts[3:])
    return f"blk.{layer}." + dict(LAYER_NAMES)[rest]


def copy_tokenizer_keys(reader: gguf.GGUFReader, w: gguf.GGUFWriter) -> None:
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, gguf.GGUFValueType(field.types[1]))
        else:
            w.add_key_value(key, field.contents(), vtype)


def write_gguf(path: Path, arch: str, name: str, dtype: str, n_vocab: int, tensors: dict,
               reader: gguf.GGUFReader, rope_scaling=None, shards=None) -> None:
    d = DIMS
    hd = d["hidden"] // d["heads"]
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(name)
    w.add_block_count(d["layers"])
    w.add_context_length(2048)
    w.add_embedding_length(d["hidden"])
    w.add_feed_forward_length(d["ff"])
    w.add_head_count(d["heads"])
    w.add_head_count_kv(d["kv_heads"])
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type({"F32": 0, "F16": 1, "BF16": 32}[dtype])
    if arch == "llama":
        w.add_vocab_size(n_vocab)
        w.add_rope_dimension_count(hd)
    if rope_scaling and rope_scaling.get("type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope_scaling["factor"])
    w.add_sampling_temp(GEN_CONFIG["temperature"])
    w.add_sampling_top_p(GEN_CONFIG["top_p"])
    w.add_sampling_top_k(GEN_CONFIG["top_k"])
    copy_tokenizer_keys(reader, w)
    if rope_scaling and rope_scaling.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(100000.0, hd, rope_scaling))
    # the converter reads shard after shard (file names sorted), each
    # shard's tensors in the order safe_open().keys() gives: sorted
    for hf in [n for shard in (shards or [tensors]) for n in sorted(shard)]:
        t = tensors[hf]
        gname = gguf_name(hf)
        if t.raw.ndim == 1:
            w.add_tensor(gname, t.as_f32())
            continue
        raw = t.raw
        if arch == "llama" and hf.endswith("q_proj.weight"):
            raw = permute(raw, d["heads"])
        elif arch == "llama" and hf.endswith("k_proj.weight"):
            raw = permute(raw, d["kv_heads"])
        raw = np.ascontiguousarray(raw)
        if dtype == "BF16":
            w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(gname, raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def tokenizer_files(reader: gguf.GGUFReader) -> tuple:
    f = reader.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    merges = f["tokenizer.ggml.merges"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                              merges=[tuple(m.split(" ", 1)) for m in merges]))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True) for t, ty in zip(tokens, types) if ty == 3])
    # the fields SmolLM2-135M-Instruct's own tokenizer_config.json has that
    # the converter reads (no add_bos_token / add_eos_token there)
    tok_cfg = {"add_prefix_space": False,
               "bos_token": tokens[f["tokenizer.ggml.bos_token_id"].contents()],
               "eos_token": tokens[f["tokenizer.ggml.eos_token_id"].contents()],
               "unk_token": tokens[f["tokenizer.ggml.unknown_token_id"].contents()],
               "pad_token": tokens[f["tokenizer.ggml.padding_token_id"].contents()],
               "chat_template": f["tokenizer.chat_template"].contents()}
    return tk.to_str().encode(), json.dumps(tok_cfg, indent=1).encode()


def write_folder(folder: Path, cfg: dict, shards: list, tok: tuple) -> None:
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    (tmp / "generation_config.json").write_text(json.dumps(GEN_CONFIG, indent=1))
    (tmp / "tokenizer.json").write_bytes(tok[0])
    (tmp / "tokenizer_config.json").write_bytes(tok[1])
    if len(shards) == 1:
        write_safetensors(tmp / "model.safetensors", shards[0])
    else:
        n = len(shards)
        weight_map = {}
        for i, s in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            write_safetensors(tmp / fname, s)
            weight_map.update({k: fname for k in s})
        index = {"metadata": {"total_size": sum(t.raw.nbytes for s in shards for t in s.values())},
                 "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


# ---- architectures mapped beyond llama/qwen2 ----
# Qwen3 and Phi-3 have rows in the model table: SmolLM2's vocabulary and
# tokenizer, and test_hf compares logits too. The others (no row yet) have
# small vocabularies and no tokenizer: tensors and keys only.

MAP_VOCAB = 64


def to_gguf_tensor(w: gguf.GGUFWriter, name: str, t: "Stored", raw=None) -> None:
    raw = np.ascontiguousarray(t.raw if raw is None else raw)
    if raw.ndim == 1:
        w.add_tensor(name, t.as_f32() if raw is t.raw else raw)
    elif t.dtype == "BF16":
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        w.add_tensor(name, raw)


def mapping_model(kind: str, n_vocab: int):
    """(class, model_type, gguf arch, dtype, config extras, hf tensors, gguf tensors, keys)."""
    rng = np.random.default_rng({"qwen3": 11, "gemma3": 12, "phi3": 13, "qwen3moe": 14, "mixtral": 15}[kind])
    dtype = {"qwen3": "F32", "gemma3": "BF16", "phi3": "F16", "qwen3moe": "F32", "mixtral": "F16"}[kind]
    hidden, heads, kv_heads, ff, layers = 32, 4, 2, 64, 2
    head_dim = 16 if kind in ("qwen3", "qwen3moe", "gemma3") else hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    n_exp, n_used, ff_exp = 4, 2, 16

    def st(shape, scale=0.3, offset=0.0):
        return Stored(offset + scale * rng.standard_normal(shape).astype(np.float32), dtype)

    hf, out = {}, []   # out: (gguf name, Stored, transformed raw or None)
    source = {}        # gguf name -> checkpoint name, for the converter's order

    def pair(hname, gname, t, raw=None):
        hf[hname] = t
        source[gname] = hname
        out.append((gname, t, raw))

    pair("model.embed_tokens.weight", "token_embd.weight", st((n_vocab, hidden), 1.0))
    pair("model.norm.weight", "output_norm.weight", st(hidden, 0.1, 1.0))
    if kind in ("phi3", "mixtral", "qwen3moe"):
        pair("lm_head.weight", "output.weight", st((n_vocab, hidden)))
    for l in range(layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        pair(p + "input_layernorm.weight", b + "attn_norm.weight", st(hidden, 0.1, 1.0))
        if kind == "phi3":
            pair(p + "self_attn.qkv_proj.weight", b + "attn_qkv.weight", st((q + 2 * kv, hidden)))
        else:
            wq, wk = st((q, hidden)), st((kv, hidden))
            pq = permute(wq.raw, heads) if kind == "mixtral" else None
            pk = permute(wk.raw, kv_heads) if kind == "mixtral" else None
            pair(p + "self_attn.q_proj.weight", b + "attn_q.weight", wq, pq)
            pair(p + "self_attn.k_proj.weight", b + "attn_k.weight", wk, pk)
            pair(p + "self_attn.v_proj.weight", b + "attn_v.weight", st((kv, hidden)))
        pair(p + "self_attn.o_proj.weight", b + "attn_output.weight", st((hidden, q)))
        if kind in ("qwen3", "qwen3moe", "gemma3"):
            pair(p + "self_attn.q_norm.weight", b + "attn_q_norm.weight", st(head_dim, 0.1, 1.0))
            pair(p + "self_attn.k_norm.weight", b + "attn_k_norm.weight", st(head_dim, 0.1, 1.0))
        if kind == "gemma3":
            pair(p + "post_attention_layernorm.weight", b + "post_attention_norm.weight", st(hidden, 0.1))
            pair(p + "pre_feedforward_layernorm.weight", b + "ffn_norm.weight", st(hidden, 0.1))
            pair(p + "post_feedforward_layernorm.weight", b + "post_ffw_norm.weight", st(hidden, 0.1))
        else:
            pair(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", st(hidden, 0.1, 1.0))
        if kind == "phi3":
            pair(p + "mlp.gate_up_proj.weight", b + "ffn_up.weight", st((2 * ff, hidden)))
            pair(p + "mlp.down_proj.weight", b + "ffn_down.weight", st((hidden, ff)))
        elif kind in ("qwen3moe", "mixtral"):
            moe = "mlp" if kind == "qwen3moe" else "block_sparse_moe"
            pair(f"{p}{moe}.gate.weight", b + "ffn_gate_inp.weight", st((n_exp, hidden)))
            fe = ff_exp if kind == "qwen3moe" else ff
            names = ({"gate": "gate_proj", "up": "up_proj", "down": "down_proj"} if kind == "qwen3moe"
                     else {"gate": "w1", "up": "w3", "down": "w2"})
            for part, hname in names.items():
                shape = (hidden, fe) if part == "down" else (fe, hidden)
                experts = [st(shape) for _ in range(n_exp)]
                for e, t in enumerate(experts):
                    hf[f"{p}{moe}.experts.{e}.{hname}.weight"] = t
                stacked = Stored.__new__(Stored)
                stacked.dtype, stacked.raw = dtype, np.stack([t.raw for t in experts])
                out.append((b + f"ffn_{part}_exps.weight", stacked, None))
        else:
            pair(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", st((ff, hidden)))
            pair(p + "mlp.up_proj.weight", b + "ffn_up.weight", st((ff, hidden)))
            pair(p + "mlp.down_proj.weight", b + "ffn_down.weight", st((hidden, ff)))
    # Gemma: the converter adds 1 to every *norm.weight in the checkpoint's
    # dtype (torch rounds the sum to bfloat16), then widens to F32.
    if kind == "gemma3":
        fixed = []
        for gname, t, raw in out:
            if gname.endswith("norm.weight"):
                shifted = Stored.__new__(Stored)
                shifted.dtype, shifted.raw = "F32", bf16_to_f32(bf16_bits(t.as_f32() + np.float32(1.0)))
                fixed.append((gname, shifted, None))
            else:
                fixed.append((gname, t, raw))
        out = fixed
    # checkpoint names in order; stacked experts last (the converter emits
    # them at each layer's last expert; not compared by position)
    out.sort(key=lambda o: (o[0] not in source, source.get(o[0], o[0])))
    cls = {"qwen3": ("Qwen3ForCausalLM", "qwen3"), "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
           "phi3": ("Phi3ForCausalLM", "phi3"), "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
           "mixtral": ("MixtralForCausalLM", "mixtral")}[kind]
    cfg = {"architectures": [cls[0]], "model_type": cls[1], "hidden_size": hidden, "intermediate_size": ff,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
           "vocab_size": n_vocab, "tie_word_embeddings": kind in ("qwen3", "gemma3"),
           "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]}
    if kind in ("qwen3", "qwen3moe", "gemma3"):
        cfg["head_dim"] = head_dim
    if kind == "gemma3":
        cfg["sliding_window"] = 16
    if kind == "phi3":
        cfg["sliding_window"] = None
    if kind == "qwen3moe":
        cfg.update(num_experts=n_exp, num_experts_per_tok=n_used, moe_intermediate_size=ff_exp)
    if kind == "mixtral":
        cfg.update(num_local_experts=n_exp, num_experts_per_tok=n_used, sliding_window=None)
    arch = {"qwen3": "qwen3", "gemma3": "gemma3", "phi3": "phi3", "qwen3moe": "qwen3moe", "mixtral": "llama"}[kind]

    def keys(w: gguf.GGUFWriter) -> None:
        w.add_block_count(layers)
        w.add_context_length(4096)
        w.add_embedding_length(hidden)
        w.add_feed_forward_length(ff)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_rope_freq_base(50000.0)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_file_type({"F32": 0, "F16": 1, "BF16": 32}[dtype])
        if "head_dim" in cfg:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        if kind == "gemma3":
            w.add_sliding_window(16)
        if kind == "phi3":
            w.add_rope_dimension_count(hidden // heads)
            w.add_sliding_window(0)
        if kind == "mixtral":
            w.add_vocab_size(n_vocab)
            w.add_rope_dimension_count(head_dim)
        if kind in ("qwen3moe", "mixtral"):
            w.add_expert_count(n_exp)
            w.add_expert_used_count(n_used)
        if kind == "qwen3moe":
            w.add_expert_feed_forward_length(ff_exp)

    return arch, dtype, cfg, hf, out, keys


def write_mapping_model(out_dir: Path, kind: str, reader: gguf.GGUFReader, tok: tuple) -> None:
    with_tokenizer = kind in ("qwen3", "phi3")
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data) if with_tokenizer else MAP_VOCAB
    arch, dtype, cfg, hf, out, keys = mapping_model(kind, n_vocab)
    name = f"hfmap-{kind}"
    folder = out_dir / name
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    if with_tokenizer:
        (tmp / "tokenizer.json").write_bytes(tok[0])
        (tmp / "tokenizer_config.json").write_bytes(tok[1])
    write_safetensors(tmp / "model.safetensors", hf)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    path = out_dir / f"{name}.gguf"
    gtmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(gtmp), arch)
    w.add_name(name)
    keys(w)
    if with_tokenizer:
        copy_tokenizer_keys(reader, w)
    for gname, t, raw in out:
        to_gguf_tensor(w, gname, t, raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(gtmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smollm2", type=Path, default=DEFAULT_SMOLLM2)
    a = ap.parse_args()
    if not a.smollm2.exists():
        print(f"gen_hf_models: {a.smollm2} is missing (make model); skipped", file=sys.stderr)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = a.out / "hf-models.stamp"
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return 0
    reader = gguf.GGUFReader(str(a.smollm2))
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    tok = tokenizer_files(reader)
    models_ = [("llama", "F32", 1, None), ("llama", "F16", 2, None), ("llama", "BF16", 3, None),
               ("qwen2", "F32", 4, None), ("llama3", "F32", 5, LLAMA3_SCALING),
               ("llama-linear", "F32", 6, LINEAR_SCALING)]
    for kind, dtype, seed, scaling in models_:
        arch = "llama" if kind in ("llama3", "llama-linear") else kind
        name = f"hf-{kind}-{dtype.lower()}"
        tensors = make_weights(arch, dtype, n_vocab, seed)
        cfg = config_json(arch, dtype, n_vocab, scaling)
        write_folder(a.out / name, cfg, [tensors], tok)
        write_gguf(a.out / f"{name}.gguf", arch, name, dtype, n_vocab, tensors, reader, scaling)
        if dtype == "BF16":
            # split in the checkpoint's order, as transformers shards: the
            # converter's order (by shard, then by name) is not name order
            names = list(tensors)
            half = len(names) // 2
            shards = [{k: tensors[k] for k in names[:half]}, {k: tensors[k] for k in names[half:]}]
            write_folder(a.out / f"{name}-sharded", cfg, shards, tok)
            write_gguf(a.out / f"{name}-sharded.gguf", arch, f"{name}-sharded", dtype, n_vocab, tensors,
                       reader, scaling, shards)
    for kind in ("qwen3", "gemma3", "phi3", "qwen3moe", "mixtral"):
        write_mapping_model(a.out, kind, reader, tok)
    atomic_write(stamp, digest.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
