#!/usr/bin/env bash
# Load test of build/llm-serve on loopback (docs/serve.md, "Benchmark"), and
# of llama-server on the same workload when one is installed (LLAMA_SERVER,
# else llama-server on PATH; never built here). Results: build/bench/serve-*.json.
# Env: LLM_TEST_MODEL, BENCH_REQUESTS (48), BENCH_RATE (4 per second),
#      BENCH_THREADS (0 = all cores), BENCH_PARALLEL (llama-server slots, 16),
#      BENCH_SERVE_OUT (the results folder, default $BUILD/bench).
#
#   scripts/bench-serve.sh [--device cpu|cuda|auto] [--tp N] [--devices LIST]
#                          [--concurrency N[,N...]]
#
# --device, --tp and --devices go to llm-serve as they are (llm-serve
# --help); the device and ranks it served on are recorded in
# serve-llm-serve.json. --concurrency replaces the open-loop run by closed
# loops of N clients each (TTFT, TPOT and throughput per level, on at least
# 2N requests) in serve-concurrency.json, and skips llama-server.
set -euo pipefail
cd "$(dirname "$0")/.."
SERVE_DEVICE_ARGS=()
LEVELS=
while [ "$#" -gt 0 ]; do
    case $1 in
    --concurrency)
        [ "$#" -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
            { echo "bench-serve: --concurrency needs counts like 1,16,64" >&2; exit 1; }
        LEVELS=$2
        shift 2
        ;;
    --device | --tp | --devices)
        [ "$#" -ge 2 ] || { echo "bench-serve: $1 needs a value" >&2; exit 1; }
        SERVE_DEVICE_ARGS+=("$1" "$2")
        shift 2
        ;;
    -h | --help)
        sed -n '2,17p' "$0"
        exit 0
        ;;
    *)
        echo "bench-serve: unknown option $1 (--device, --tp, --devices, --concurrency)" >&2
        exit 1
        ;;
    esac
done
BUILD=${BUILD:-build}
MODEL=${LLM_TEST_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
REQUESTS=${BENCH_REQUESTS:-48}
RATE=${BENCH_RATE:-4}
THREADS=${BENCH_THREADS:-0}
PARALLEL=${BENCH_PARALLEL:-16}
CTX=2048
OUT=${BENCH_SERVE_OUT:-$BUILD/bench}
mkdir -p "$OUT"
PID=
cleanup() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_health() {
    for _ in $(seq 300); do
        python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
            "$1/health" >/dev/null 2>&1 && return 0
        kill -0 "$PID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

PORT=$(free_port)
"$BUILD/llm-serve" -m "$MODEL" --port "$PORT" --ctx $CTX --threads "$THREADS" \
    --max-concurrent 256 ${SERVE_DEVICE_ARGS[@]+"${SERVE_DEVICE_ARGS[@]}"} \
    >"$OUT/serve-llm-serve.log" 2>&1 &
PID=$!
wait_health "http://127.0.0.1:$PORT" || { cat "$OUT/serve-llm-serve.log"; exit 1; }
# Where it ran, from /v1/models, into each result file.
record_device() { # file...
    python3 - "http://127.0.0.1:$PORT/v1/models" "$@" <<'PY'
import json, sys, urllib.request
model = json.load(urllib.request.urlopen(sys.argv[1]))["data"][0]
for path in sys.argv[2:]:
    with open(path) as f:
        result = json.load(f)
    for key in ("device", "tensor_parallel", "kv_cache_tokens"):
        result[key] = model.get(key)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
PY
}
if [ -n "$LEVELS" ]; then
    files=()
    for n in ${LEVELS//,/ }; do
        reqs=$((2 * n > REQUESTS ? 2 * n : REQUESTS))
        echo "bench-serve: $n concurrent clients, $reqs requests"
        python3 tests/serve/loadgen.py --url "http://127.0.0.1:$PORT" --requests "$reqs" \
            --concurrency "$n" --label llm-serve --out "$OUT/serve-c$n.json"
        files+=("$OUT/serve-c$n.json")
    done
    record_device "${files[@]}"
    python3 - "$OUT/serve-concurrency.json" "${files[@]}" <<'PY'
import json, sys
levels = [json.load(open(p)) for p in sys.argv[2:]]
keep = ("device", "tensor_parallel", "kv_cache_tokens")
out = {"server": "llm-serve", **{k: levels[0].get(k) for k in keep},
       "levels": [{k: v for k, v in l.items() if k not in keep + ("server",)} for l in levels]}
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
PY
    echo "bench-serve: $OUT/serve-concurrency.json (llama-server is compared in the open-loop run only)"
    exit 0
fi
python3 tests/serve/loadgen.py --url "http://127.0.0.1:$PORT" --requests "$REQUESTS" \
    --rate "$RATE" --label llm-serve --out "$OUT/serve-llm-serve.json"
record_device "$OUT/serve-llm-serve.json"
cleanup; PID=

LLAMA=${LLAMA_SERVER:-$(command -v llama-server || true)}
if [ -z "$LLAMA" ] || [ ! -x "$LLAMA" ]; then
    echo "bench-serve: llama-server not found (set LLAMA_SERVER or put it on PATH): comparison skipped"
    echo '{"server": "llama-server", "skipped": "llama-server not found"}' >"$OUT/serve-llama-server.json"
    exit 0
fi
PORT=$(free_port)
THREAD_ARGS=(); [ "$THREADS" != 0 ] && THREAD_ARGS=(-t "$THREADS")
# One slot per concurrent request, each with the whole context, as llm-serve has.
"$LLAMA" -m "$MODEL" --port "$PORT" --host 127.0.0.1 -c $((CTX * PARALLEL)) -np "$PARALLEL" \
    -cb "${THREAD_ARGS[@]}" >"$OUT/serve-llama-server.log" 2>&1 &
PID=$!
wait_health "http://127.0.0.1:$PORT" || { tail "$OUT/serve-llama-server.log"; exit 1; }
python3 tests/serve/loadgen.py --url "http://127.0.0.1:$PORT" --requests "$REQUESTS" \
    --rate "$RATE" --label llama-server --out "$OUT/serve-llama-server.json"
