#!/usr/bin/env bash
# The cost of LoRA adapters on the CPU backend (docs/lora.md, "Cost"):
# llm-bench's load on SmolLM2-135M-Instruct dequantized to F32, without an
# adapter and with random adapters of rank 8 and 16 on all seven
# projections of every layer. Prints one JSON line per run (tokens/s and
# the adapter's bytes) and keeps llm-bench's full JSON under OUT.
#
#   scripts/lora-bench.sh [BUILD=build] [OUT=build/lora-bench] [-- llm-bench options]
#
# Needs `make model`, `make test-venv` and build/llm-bench. Not a test:
# timings depend on the machine and what else runs on it.
set -euo pipefail

BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/lora-bench}
PY=${PY:-$BUILD/test-venv/bin/python}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
shift_args=()
if [ "${1:-}" = "--" ]; then
    shift
    shift_args=("$@")
fi
mkdir -p "$OUT"

"$PY" - "$MODEL" "$OUT" <<'EOF'
import os
import sys

import gguf
import numpy as np
from gguf.quants import dequantize

src, out = sys.argv[1], sys.argv[2]
base = os.path.join(out, "smollm2-f32.gguf")
r = gguf.GGUFReader(src)
arch = str(r.fields["general.architecture"].contents())
if not os.path.exists(base):
    w = gguf.GGUFWriter(base + ".tmp", arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vt = gguf.GGUFValueType(f.types[0])
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vt, gguf.GGUFValueType(f.types[1]))
        else:
            w.add_key_value(key, f.contents(), vt)
    w.add_file_type(0)
    for t in r.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape(tuple(int(x) for x in t.shape[::-1])))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(base + ".tmp", base)
targets = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
for rank in (8, 16):
    path = os.path.join(out, f"lora-r{rank}.gguf")
    if os.path.exists(path):
        continue
    rng = np.random.default_rng(rank)
    w = gguf.GGUFWriter(path + ".tmp", arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    for t in r.tensors:
        parts = t.name.split(".")
        if parts[0] != "blk" or parts[2] not in targets:
            continue
        cols, rows = int(t.shape[0]), int(t.shape[1])
        w.add_tensor(t.name + ".lora_a", rng.normal(0, 0.02, (rank, cols)).astype(np.float32))
        w.add_tensor(t.name + ".lora_b", rng.normal(0, 0.02, (rows, rank)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)
EOF

run() { # name, extra llm-bench args
    local name=$1
    shift
    "$BUILD/llm-bench" -m "$OUT/smollm2-f32.gguf" --requests 8 --prompt-len 64:64 \
        --output-len 32:32 --json "$OUT/$name.json" "$@" "${shift_args[@]}" >"$OUT/$name.txt"
    "$PY" - "$OUT/$name.json" "$name" "$@" <<'EOF'
import json, os, sys
j = json.load(open(sys.argv[1]))
run = j["runs"][0] if "runs" in j else j
lora = sys.argv[4] if len(sys.argv) > 4 else None
print(json.dumps({"run": sys.argv[2], "adapter": lora,
                  "adapter_bytes": os.path.getsize(lora) if lora else 0,
                  "throughput_tok_s": round(run["throughput_tok_s"], 2),
                  "prompt_tok_s": round(run["prompt_tok_s"], 2),
                  "tpot_ms_p50": round(run["tpot_ms"]["p50"], 2)}))
EOF
}
run base
run lora-r8 --lora "$OUT/lora-r8.gguf"
run lora-r16 --lora "$OUT/lora-r16.gguf"
