#!/usr/bin/env python3
"""Random LoRA adapters for the tiny F32 Llama of gen_hf_models.py
(hf-llama-f32.gguf), for tests/unit/test_lora.c, and the reference each is
checked against: the base model with the adapter merged ahead of time,
W + (alpha / rank) * B @ A computed in numpy (float64, rounded once to
float32), written as a new GGUF.

Written into --out:
  lora-llama-a.gguf        llama.cpp's adapter layout (general.type "adapter",
                           adapter.type "lora", adapter.lora.alpha; tensors
                           "<weight>.lora_a" ne {in, rank}, ".lora_b" ne
                           {rank, out}): all seven projections of both layers,
                           rank 4, alpha 8; the FFN matrices stored as F16
  lora-llama-a/            the same adapter as a Hugging Face PEFT folder
                           (adapter_config.json, adapter_model.safetensors),
                           B of q_proj/k_proj in the checkpoint's row order
                           (the GGUF's are permuted as convert_lora_to_gguf.py
                           permutes them, like the base model's q/k rows)
  lora-llama-a-merged.gguf hf-llama-f32.gguf with adapter a merged
  lora-llama-b.gguf        a second adapter: q, v and down only, rank 8,
                           alpha 4, layer 1's down at rank 2
  lora-llama-b-merged.gguf hf-llama-f32.gguf with adapter b merged

Deterministic (fixed seeds); skipped when its stamp says this script
already wrote them, and when hf-llama-f32.gguf is absent.

usage: gen_lora.py --out DIR
"""
import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file

BASE = "hf-llama-f32.gguf"

# GGUF weight name (after "blk.N.") -> PEFT module (after "model.layers.N.")
MODULES = {
    "attn_q.weight": "self_attn.q_proj",
    "attn_k.weight": "self_attn.k_proj",
    "attn_v.weight": "self_attn.v_proj",
    "attn_output.weight": "self_attn.o_proj",
    "ffn_gate.weight": "mlp.gate_proj",
    "ffn_up.weight": "mlp.up_proj",
    "ffn_down.weight": "mlp.down_proj",
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (rows of q/k, and of LoRA B)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def field_u32(reader: gguf.GGUFReader, key: str) -> int:
    return int(reader.fields[key].contents())


def make_adapter(reader: gguf.GGUFReader, targets: dict, seed: int) -> dict:
    """{gguf weight name: (A [rank, in], B [out, rank], dtype)} in the GGUF's
    row order; targets maps a weight suffix to (rank, dtype)."""
    rng = np.random.default_rng(seed)
    shapes = {t.name: tuple(int(x) for x in t.shape[::-1]) for t in reader.tensors}  # (rows, cols)
    out = {}
    for name, shape in shapes.items():
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else None
        if suffix not in targets:
            continue
        rows, cols = shape
        rank, dtype = targets[suffix]
        if callable(rank):
            rank = rank(name)
        a = rng.uniform(-0.5, 0.5, (rank, cols)).astype(dtype)
        b = rng.uniform(-0.5, 0.5, (rows, rank)).astype(dtype)
        out[name] = (a, b)
    return out


def write_adapter_gguf(path: Path, arch: str, alpha: float, pairs: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for name, (a, b) in pairs.items():
        w.add_tensor(name + ".lora_a", np.ascontiguousarray(a))
        w.add_tensor(name + ".lora_b", np.ascontiguousarray(b))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def write_peft(folder: Path, reader: gguf.GGUFReader, rank: int, alpha: float, pairs: dict) -> None:
    n_head = field_u32(reader, "llama.attention.head_count")
    n_head_kv = field_u32(reader, "llama.attention.head_count_kv")
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, (a, b) in pairs.items():
        layer, weight = name.split(".")[1], name.split(".", 2)[2]
        # undo the converter's permutation: the checkpoint holds B unpermuted
        if weight == "attn_q.weight":
            b = inverse_permute(b, n_head)
        elif weight == "attn_k.weight":
            b = inverse_permute(b, n_head_kv)
        stem = f"base_model.model.model.layers.{layer}.{MODULES[weight]}"
        tensors[stem + ".lora_A.weight"] = np.ascontiguousarray(a)
        tensors[stem + ".lora_B.weight"] = np.ascontiguousarray(b)
    cfg = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "hf-llama-f32",
        "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted({m.split(".")[1] for m in MODULES.values()}),
        "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
        "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
        "layers_to_transform": None, "layers_pattern": None,
    }
    tmp = folder / "adapter_model.safetensors.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=1))


def inverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    idx = permute(np.arange(rows), n_head)  # permuted[i] = original[idx[i]]
    out = np.empty_like(w)
    out[idx] = w
    return out


def write_merged(path: Path, reader: gguf.GGUFReader, alpha: float, pairs: dict) -> None:
    arch = str(reader.fields["general.architecture"].contents())
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, gguf.GGUFValueType(field.types[1]))
        else:
            w.add_key_value(key, field.contents(), vtype)
    for t in reader.tensors:
        data = np.array(t.data, dtype=np.float32).reshape(tuple(int(x) for x in t.shape[::-1]))
        if t.name in pairs:
            a, b = pairs[t.name]
            scale = alpha / a.shape[0]
            merged = data.astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64))
            data = merged.astype(np.float32)
        w.add_tensor(t.name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    base = a.out / BASE
    if not base.exists():
        print(f"gen_lora: {base} is missing (gen_hf_models.py); skipped", file=sys.stderr)
        return 0
    stamp = a.out / "lora.stamp"
    digest = hashlib.sha256(Path(__file__).read_bytes() + base.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return 0
    reader = gguf.GGUFReader(str(base))
    arch = str(reader.fields["general.architecture"].contents())

    f32, f16 = np.float32, np.float16
    a_targets = {"attn_q.weight": (4, f32), "attn_k.weight": (4, f32), "attn_v.weight": (4, f32),
                 "attn_output.weight": (4, f32), "ffn_gate.weight": (4, f16),
                 "ffn_up.weight": (4, f16), "ffn_down.weight": (4, f16)}
    pairs_a = make_adapter(reader, a_targets, seed=11)
    write_adapter_gguf(a.out / "lora-llama-a.gguf", arch, 8.0, pairs_a)
    write_peft(a.out / "lora-llama-a", reader, 4, 8.0, pairs_a)
    write_merged(a.out / "lora-llama-a-merged.gguf", reader, 8.0, pairs_a)

    down_rank = lambda name: 2 if name.startswith("blk.1.") else 8  # noqa: E731
    b_targets = {"attn_q.weight": (8, f32), "attn_v.weight": (8, f32),
                 "ffn_down.weight": (down_rank, f32)}
    pairs_b = make_adapter(reader, b_targets, seed=12)
    write_adapter_gguf(a.out / "lora-llama-b.gguf", arch, 4.0, pairs_b)
    write_merged(a.out / "lora-llama-b-merged.gguf", reader, 4.0, pairs_b)

    stamp.write_text(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
