#!/usr/bin/env bash
# End-to-end tests of build/llm-serve on loopback (docs/serve.md).
# Env: LLM_TEST_MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf),
#      LLM_TEST_MODEL_MINILM (default models/all-MiniLM-L6-v2; skipped if absent),
#      LLM_SERVE_BIN (default $BUILD/llm-serve),
#      BUILD (default build), SERVE_VENV (default $BUILD/serve-venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
MODEL=${LLM_TEST_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
VENV=${SERVE_VENV:-$BUILD/serve-venv}
SERVER_BIN=${LLM_SERVE_BIN:-$BUILD/llm-serve}
# The client and the tests' checkers, as pinned in tests/requirements.txt.
OPENAI_VERSION=$(sed -n 's/^openai==//p' tests/requirements.txt)
export BUILD LLM_TEST_MODEL=$MODEL LLM_SERVE_BIN=$SERVER_BIN

if ! "$VENV/bin/python" -c "import openai, jsonschema, jinja2, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
    python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install -q "openai==$OPENAI_VERSION" \
        "$(grep '^jsonschema==' tests/requirements.txt)" "$(grep '^jinja2==' tests/requirements.txt)"
fi
PY="$VENV/bin/python"
# `make serve-venv` (the README's client): the venv alone.
[ "${1:-}" = --venv-only ] && exit 0

LOG_DIR=$BUILD/serve-test
mkdir -p "$LOG_DIR"
SERVER_PID=
cleanup() { if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi; }
trap cleanup EXIT

# Starts the server in the background; sets SERVER_PID and LLM_SERVE_URL.
start_server() {
    local log=$1; shift
    "$SERVER_BIN" -m "$MODEL" --port 0 "$@" >"$log.out" 2>"$log.err" &
    SERVER_PID=$!
    for _ in $(seq 100); do
        # The server's shell may not have created $log.out yet: not an error.
        LLM_SERVE_URL=$(sed -n 's|.* at \(http://[^ ]*\)/v1 .*|\1|p' "$log.out" 2>/dev/null || true)
        [ -n "$LLM_SERVE_URL" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log.err"; echo "serve-test: server died"; exit 1; }
        sleep 0.1
    done
    [ -n "$LLM_SERVE_URL" ] || { echo "serve-test: server did not start"; exit 1; }
    export LLM_SERVE_URL
    for _ in $(seq 50); do
        curl -sf "$LLM_SERVE_URL/health" >/dev/null && return 0
        sleep 0.1
    done
    echo "serve-test: /health never answered"; exit 1
}

export LLM_SERVE_TEST_KEY=serve-test-key
start_server "$LOG_DIR/main" --ctx 1024 --api-key "$LLM_SERVE_TEST_KEY" --max-concurrent 80 \
    --max-tokens-limit 1000 --max-body-bytes 1048576 --draft-model "$MODEL"
echo "serve-test: server at $LLM_SERVE_URL"
"$PY" tests/serve/test_openai.py
"$PY" tests/serve/test_http.py
"$PY" tests/serve/test_embeddings.py
"$PY" tests/serve/test_structured.py
# SmolLM2's template has no tools section: the fallback preamble.
"$PY" tests/serve/test_tools.py
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || { echo "serve-test: exit status $? after SIGTERM"; exit 1; }
SERVER_PID=
unset LLM_SERVE_TEST_KEY

# A model declared Matryoshka: /v1/embeddings takes shorter 'dimensions'.
start_server "$LOG_DIR/matryoshka" --ctx 1024 --matryoshka
EMBED_MATRYOSHKA=1 "$PY" tests/serve/test_embeddings.py
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || { echo "serve-test: exit status $? after SIGTERM"; exit 1; }
SERVER_PID=

# Tool calling with templates that render the tools (--chat-template), in
# the Hermes and the Llama 3 styles, checked against Python's jinja2; the
# reply parser on its own first.
"$BUILD/tests/serve/test_tool_parse"
for template in hermes_tools llama3_tools; do
    start_server "$LOG_DIR/$template" --ctx 2048 --chat-template "tests/serve/$template.jinja"
    TOOLS_TEMPLATE="tests/serve/$template.jinja" "$PY" tests/serve/test_tools.py
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || { echo "serve-test: exit status $? after SIGTERM"; exit 1; }
    SERVER_PID=
done

# A --chat-template that does not parse or cannot be read stops the start
# (exit 2) with the reason.
printf '{%% for m in messages %%}{{ m.content }' >"$LOG_DIR/broken.jinja"
for case in "broken.jinja:syntax error" "absent.jinja:No such file"; do
    template=$LOG_DIR/${case%%:*}
    rc=0
    "$SERVER_BIN" -m "$MODEL" --port 0 -q --chat-template "$template" >/dev/null \
        2>"$LOG_DIR/template.err" || rc=$?
    [ "$rc" = 2 ] && grep -q "${case#*:}" "$LOG_DIR/template.err" ||
        { echo "serve-test: --chat-template $template: exit $rc: $(cat "$LOG_DIR/template.err")"; exit 1; }
done

# 12 MiB of KV cache (17 blocks of SmolLM2) for 64 streams forces preemptions.
start_server "$LOG_DIR/preempt" --ctx 1024 --kv-cache-mib 12
"$PY" tests/serve/test_preemption.py
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || { echo "serve-test: exit status $? after SIGTERM"; exit 1; }
SERVER_PID=

# The README's server ("An OpenAI-compatible server": the model and nothing
# else but a free port) and its client lines, as written but for the
# server's address and this run's venv: each prints an answer. The lines
# set no max_tokens and sample: replies are capped at 64 tokens so that a
# sanitized server (serve-test-san) answers in seconds too.
start_server "$LOG_DIR/readme" --max-tokens-limit 64
readme_client=$(awk '/^## An OpenAI-compatible server/ { seen = 1 } seen' README.md |
    grep -E '^(curl|build/serve-venv/bin/python) ')
[ "$(grep -c . <<<"$readme_client")" -eq 2 ] ||
    { echo "serve-test: README's curl and openai lines not found"; exit 1; }
while IFS= read -r line; do
    line=${line//http:\/\/localhost:8080/$LLM_SERVE_URL}
    line=${line//localhost:8080/${LLM_SERVE_URL#http://}}
    line=${line//build\/serve-venv/$VENV}
    answer=$(bash -c "$line") || { echo "serve-test: README line failed: $line"; exit 1; }
    if [ -z "${answer//[[:space:]]/}" ] || grep -q '"error"' <<<"$answer"; then
        echo "serve-test: README line printed no answer: $line: $answer"; exit 1
    fi
    echo "serve-test: README: ${line%% *} -> $(head -c 120 <<<"$answer" | tr '\n' ' ')"
done <<<"$readme_client"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || { echo "serve-test: exit status $? after SIGTERM"; exit 1; }
SERVER_PID=
# An encoder (BERT) serving embeddings, when `make model-minilm` has run.
MINILM=${LLM_TEST_MODEL_MINILM:-models/all-MiniLM-L6-v2}
if [ -f "$MINILM/model.safetensors" ]; then
    MODEL_SAVED=$MODEL
    MODEL=$MINILM
    start_server "$LOG_DIR/bert" --ctx 1024
    "$PY" tests/serve/test_embeddings_bert.py
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || { echo "serve-test: exit status $? after SIGTERM"; exit 1; }
    SERVER_PID=
    MODEL=$MODEL_SAVED
else
    echo "serve-test: $MINILM absent (make model-minilm); encoder embeddings skipped"
fi

"$PY" tests/serve/test_shutdown.py
"$PY" tests/serve/test_flood.py
"$PY" tests/serve/test_nginx.py
"$PY" tests/serve/test_out_of_memory.py
"$PY" tests/serve/test_lora.py
echo "serve-test: ok"
