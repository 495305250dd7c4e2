#!/usr/bin/env bash
# Load test of build/llm-serve on loopback (docs/serve.md, "Benchmark"), and
# of llama-server on the same workload when one is installed (LLAMA_SERVER,
# else llama-server on PATH; never built here). Results: build/bench/serve-*.json.
# Env: LLM_TEST_MODEL, BENCH_REQUESTS (48), BENCH_RATE (4 per second),
#      BENCH_THREADS (0 = all cores), BENCH_PARALLEL (llama-server slots, 16).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MODEL=${LLM_TEST_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
REQUESTS=${BENCH_REQUESTS:-48}
RATE=${BENCH_RATE:-4}
THREADS=${BENCH_THREADS:-0}
PARALLEL=${BENCH_PARALLEL:-16}
CTX=2048
OUT=$BUILD/bench
mkdir -p "$OUT"
PID=
cleanup() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_health() {
    for _ in $(seq 300); do
        curl -sf "$1/health" >/dev/null 2>&1 && return 0
        kill -0 "$PID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

PORT=$(free_port)
"$BUILD/llm-serve" -m "$MODEL" --port "$PORT" --ctx $CTX --threads "$THREADS" \
    --max-concurrent 256 >"$OUT/serve-llm-serve.log" 2>&1 &
PID=$!
wait_health "http://127.0.0.1:$PORT" || { cat "$OUT/serve-llm-serve.log"; exit 1; }
python3 tests/serve/loadgen.py --url "http://127.0.0.1:$PORT" --requests "$REQUESTS" \
    --rate "$RATE" --label llm-serve --out "$OUT/serve-llm-serve.json"
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
