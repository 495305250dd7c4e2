#!/usr/bin/env bash
# The command-line tools end to end: --device in llm-run, llm-bench,
# llm-devbench and llm-serve (an unavailable or unknown backend exits 2 with
# the library's reason; llm-serve shows where it runs in /v1/models and
# /metrics), llm-synth's files (sizes and parameter counts
# against the shape's own arithmetic, determinism, the loader accepts them),
# llm-serve --kv-type, llm-run --lora refusals, and llm-perplexity on such
# a file (KV bytes per token of every KV type, a near-uniform model's
# perplexity near its vocabulary size).
#
#   tests/tools/test_cli.sh [BUILD dir]
#
# Prints one line per check and "cli-test: N passed, M failed" last; exit
# status 1 when a check failed.
set -uo pipefail

build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
passed=0
failed=0

ok() {
    printf 'ok    %s\n' "$1"
    passed=$((passed + 1))
}
bad() {
    printf 'FAIL  %s\n' "$1"
    [ -n "${2:-}" ] && sed 's/^/    | /' <<<"$2"
    failed=$((failed + 1))
}
# expect DESCRIPTION STATUS REGEX CMD...: CMD exits STATUS and its stderr
# matches REGEX (grep -E; empty: anything).
expect() {
    local what=$1 want=$2 re=$3
    shift 3
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        bad "$what: exit status $rc, expected $want" "$(cat "$tmp/err")"
    elif [ -n "$re" ] && ! grep -q -E -- "$re" "$tmp/err"; then
        bad "$what: stderr does not match /$re/" "$(cat "$tmp/err")"
    else
        ok "$what"
    fi
}
jnum() { sed -n -E "s/.*\"$2\": (-?[0-9.]+).*/\1/p" <<<"$1"; }

# ---- llm-synth ----
tiny=$tmp/tiny-q8.gguf
expect "llm-synth writes a tiny Q8_0 model" 0 "" "$build/llm-synth" --shape tiny --type q8_0 \
    -o "$tiny"
# The tiny shape: 2 layers, n_embd 256, 4 heads (64 wide), 2 KV heads,
# n_ff 512, vocabulary 4096, an output matrix of its own.
L=2 e=256 q=256 kv=128 ff=512 v=4096
layer=$((e * q + 2 * e * kv + q * e + 3 * e * ff))
params=$((L * layer + 2 * v * e + (2 * L + 1) * e))
q8() { echo $(($1 / 32 * 34)); } # Q8_0: 34 bytes per 32 weights
per_token=$(($(q8 $((L * layer))) + $(q8 $((v * e))) + (2 * L + 1) * e * 4))
info=$("$build/llm-synth" --info "$tiny" 2>&1)
if [ "$(jnum "$info" params)" = "$params" ] &&
    [ "$(jnum "$info" bytes_per_token)" = "$per_token" ] &&
    [ "$(jnum "$info" weight_bytes)" = "$((per_token + $(q8 $((v * e)))))" ] &&
    [ "$(jnum "$info" layer_macs_per_token)" = "$((L * layer))" ] &&
    [ "$(jnum "$info" lm_head_macs)" = "$((v * e))" ]; then
    ok "llm-synth --info counts the shape's parameters and bytes"
else
    bad "llm-synth --info: expected $params params, $per_token bytes per token" "$info"
fi
size=$(stat -c %s "$tiny" 2>/dev/null)
dry=$(jnum "$("$build/llm-synth" --shape tiny --type q8_0 -o "$tmp/none.gguf" --dry-run)" bytes)
if [ -n "$size" ] && [ "$dry" = "$size" ] && [ ! -e "$tmp/none.gguf" ]; then
    ok "llm-synth --dry-run gives the file's size and writes nothing"
else
    bad "llm-synth --dry-run: $dry bytes, the file has ${size:-?}"
fi
"$build/llm-synth" --shape tiny --type q8_0 --threads 1 -o "$tmp/again.gguf" >/dev/null 2>&1
"$build/llm-synth" --shape tiny --type q8_0 --seed 2 -o "$tmp/seed2.gguf" >/dev/null 2>&1
if cmp -s "$tiny" "$tmp/again.gguf" && [ -s "$tmp/seed2.gguf" ] && ! cmp -s "$tiny" "$tmp/seed2.gguf"; then
    ok "llm-synth: the same options give the same bytes whatever the threads; the seed changes them"
else
    bad "llm-synth is not deterministic, or ignores --seed"
fi

# ---- llm-perplexity on the tiny model (random weights: close to uniform
# over its 4096 tokens, so the perplexity is near 4096) ----
text=$(dirname -- "${BASH_SOURCE[0]}")/../data/perplexity/declaration.txt
ppl() { "$build/llm-perplexity" -m "$tiny" -f "$text" --ctx 64 "$@" 2>"$tmp/ppl.err"; }
# K and V of 2 layers x 2 KV heads x 64: 4 and 2 bytes per element, 34, 18
# and 36 bytes per block of 32.
declare -A want_bytes=([f32]=2048 [f16]=1024 [q8_0]=544 [q4_0]=288 [fp8]=576)
declare -A got_ppl=()
for kv in f32 f16 q8_0 q4_0 fp8; do
    out=$(ppl --kv-type "$kv" --threads 2)
    got_ppl[$kv]=$(jnum "$out" perplexity)
    if [ "$(jnum "$out" kv_bytes_per_token)" = "${want_bytes[$kv]}" ] &&
        [ "$(jnum "$out" tokens)" -gt 5000 ] 2>/dev/null &&
        awk -v p="${got_ppl[$kv]}" 'BEGIN { exit !(p > 4096 * 0.9 && p < 4096 * 1.1) }'; then
        ok "llm-perplexity --kv-type $kv: ${want_bytes[$kv]} KV bytes per token, perplexity ${got_ppl[$kv]}"
    else
        bad "llm-perplexity --kv-type $kv" "$out"$'\n'"$(cat "$tmp/ppl.err")"
    fi
done
if awk -v a="${got_ppl[q8_0]:-0}" -v b="${got_ppl[f32]:-1}" \
    'BEGIN { d = a / b - 1; exit !(d < 1e-3 && d > -1e-3) }'; then
    ok "llm-perplexity: q8_0 KV within 0.1% of f32 KV on the tiny model"
else
    bad "llm-perplexity: q8_0 ${got_ppl[q8_0]:-?} vs f32 ${got_ppl[f32]:-?}"
fi
if awk -v a="${got_ppl[fp8]:-0}" -v b="${got_ppl[f32]:-1}" \
    'BEGIN { d = a / b - 1; exit !(d < 1e-3 && d > -1e-3) }'; then
    ok "llm-perplexity: fp8 KV within 0.1% of f32 KV on the tiny model"
else
    bad "llm-perplexity: fp8 ${got_ppl[fp8]:-?} vs f32 ${got_ppl[f32]:-?}"
fi
for kv in q8_0 fp8; do
    if [ "$(ppl --kv-type $kv --threads 1)" = "$(ppl --kv-type $kv --threads 2)" ]; then
        ok "llm-perplexity --kv-type $kv: the same output on 1 and 2 threads"
    else
        bad "llm-perplexity --kv-type $kv depends on the thread count"
    fi
done
expect "llm-perplexity refuses an unknown --kv-type" 1 "kv-type" "$build/llm-perplexity" \
    -m "$tiny" -f "$text" --kv-type q3
expect "llm-perplexity: a missing text file" 1 "cannot open" "$build/llm-perplexity" \
    -m "$tiny" -f "$tmp/no-such-text"
# ---- llm-perplexity --kld-base / --kld (kld.h): a run against itself is
# exactly 0; another KV type gives a positive KL divergence, no larger with
# fewer base tokens kept (the tail bucket makes it a lower bound); delta ppl
# is the ratio of the two printed perplexities; the file has the size its
# header promises; a file that does not fit the run is refused ----
head -c 600 "$text" >"$tmp/short.txt"
kcmd=("$build/llm-perplexity" -m "$tiny" -f "$tmp/short.txt" --ctx 64 --threads 2)
kppl() { "${kcmd[@]}" "$@" 2>"$tmp/ppl.err"; }
base=$(kppl --kv-type f32 --kld-base "$tmp/base.kld" --kld-top-k 4096)
base8=$(kppl --kv-type f32 --kld-base "$tmp/base8.kld" --kld-top-k 8)
self=$(kppl --kv-type f32 --kld "$tmp/base.kld")
if [ "$(jnum "$self" kld_max)" = "0.000000000" ] && [ "$(jnum "$self" same_top_pct)" = "100.000" ] &&
    [ "$(jnum "$self" delta_ppl_pct)" = "0.0000" ] &&
    awk -v a="$(jnum "$self" base_perplexity)" -v b="$(jnum "$base" perplexity)" \
        'BEGIN { exit !(a > 0 && a / b - 1 < 1e-6 && b / a - 1 < 1e-6) }'; then
    ok "llm-perplexity --kld: a run against its own base file gives KLD 0, the same top token"
else
    bad "llm-perplexity --kld against itself" "$base"$'\n'"$self"$'\n'"$(cat "$tmp/ppl.err")"
fi
n=$(jnum "$base" tokens)
size=$(stat -c %s "$tmp/base.kld" 2>/dev/null)
magic=$(head -c 8 "$tmp/base.kld")
scored=$(od -An -t u8 -j 40 -N 8 "$tmp/base.kld" | tr -d ' ')
if [ "$magic" = LLMKLDB1 ] && [ "$scored" = "$n" ] && [ "$size" = $((48 + n * (4 + 8 * 4096))) ] &&
    [ "$(stat -c %s "$tmp/base8.kld")" = $((48 + n * (4 + 8 * 8))) ]; then
    ok "llm-perplexity --kld-base: $n records of the size the header promises"
else
    bad "llm-perplexity --kld-base file: magic $magic, $scored records, $size bytes for $n tokens"
fi
q8=$(kppl --kv-type q8_0 --kld "$tmp/base.kld")
q8k8=$(kppl --kv-type q8_0 --kld "$tmp/base8.kld")
if awk -v a="$(jnum "$q8" kld_mean)" -v b="$(jnum "$q8k8" kld_mean)" \
    -v d="$(jnum "$q8" delta_ppl_pct)" -v p="$(jnum "$q8" perplexity)" \
    -v bp="$(jnum "$base" perplexity)" -v s="$(jnum "$q8" same_top_pct)" \
    'BEGIN { r = 100 * (p / bp - 1); exit !(a > 0 && b >= 0 && b <= a && a < 0.05 &&
             d - r < 1e-3 && r - d < 1e-3 && s > 0 && s <= 100) }'; then
    ok "llm-perplexity --kld: q8_0 against f32, KLD $(jnum "$q8" kld_mean) (top-8 bound $(jnum "$q8k8" kld_mean))"
else
    bad "llm-perplexity --kld q8_0 against f32" "$base"$'\n'"$q8"$'\n'"$q8k8"$'\n'"$(cat "$tmp/ppl.err")"
fi
head -c 1000 "$tmp/base.kld" >"$tmp/short.kld"
expect "llm-perplexity --kld: a truncated base file" 1 "size does not match" "${kcmd[@]}" --kld "$tmp/short.kld"
expect "llm-perplexity --kld: not a base file" 1 "not an llm-perplexity base file" "${kcmd[@]}" --kld "$text"
expect "llm-perplexity --kld: a base made with another --ctx" 1 "another --ctx" \
    "$build/llm-perplexity" -m "$tiny" -f "$tmp/short.txt" --ctx 32 --kld "$tmp/base.kld"
expect "llm-perplexity --kld: a base made from another text" 1 "another vocabulary or text" \
    "$build/llm-perplexity" -m "$tiny" -f "$text" --ctx 64 --kld "$tmp/base.kld"
expect "llm-perplexity: --kld and --kld-base together" 1 "not both" "${kcmd[@]}" --kld "$tmp/base.kld" \
    --kld-base "$tmp/other.kld"
expect "llm-perplexity --kld: a missing base file" 1 "cannot open the base file" \
    "${kcmd[@]}" --kld "$tmp/no-such.kld"
for t in bf16 q4_k; do
    expect "llm-synth --type $t, 1 layer" 0 "" "$build/llm-synth" --shape tiny --type "$t" \
        --layers 1 -o "$tmp/tiny-$t.gguf"
    expect "llm-run runs the $t model on the CPU" 0 "" "$build/llm-run" -m "$tmp/tiny-$t.gguf" \
        --device cpu --temp 0 -n 4 -p "hello world"
done
expect "llm-synth: an unknown type is a usage error" 1 "bad value 'q5_9'" "$build/llm-synth" \
    --shape tiny --type q5_9 -o "$tmp/x.gguf"
expect "llm-synth --info on a missing file" 2 "LLM_ERR_" "$build/llm-synth" --info "$tmp/missing.gguf"

# ---- --device ----
run=("$build/llm-run" -m "$tiny" --temp 0 -n 4 -p "hello world")
expect "llm-run --device cpu" 0 "" "${run[@]}" --device cpu
expect "llm-run --device auto (falls back to the CPU without a GPU)" 0 "" "${run[@]}" --device auto
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    printf 'skip  llm-run --device cuda: a GPU is present (make device-check covers it)\n'
else
    expect "llm-run --device cuda without a GPU says why" 2 \
        "backend 'cuda' is not available: [^ ].*" "${run[@]}" --device cuda
fi
expect "llm-run --device bogus names the backends" 2 "no backend named 'bogus'.*'cpu'" \
    "${run[@]}" --device bogus
# ---- --lora (the happy path: the Go and Rust bindings' tests) ----
expect "llm-run --lora on a missing file says which" 2 "loading the adapter: LLM_ERR_IO.*missing-lora.gguf" \
    "${run[@]}" --lora "$tmp/missing-lora.gguf"
expect "llm-run --lora on a model file" 2 "loading the adapter: LLM_ERR_BAD_FORMAT: .*not 'adapter'" \
    "${run[@]}" --lora "$tiny"
expect "llm-run --lora-scale needs a number" 1 "bad value 'x' for --lora-scale" \
    "${run[@]}" --lora-scale x
expect "llm-bench --device bogus" 2 "no backend named 'bogus'.*'cpu'" "$build/llm-bench" \
    -m "$tiny" --device bogus --requests 2 --prompt-len 4:8 --output-len 2:4
expect "llm-bench --device cpu" 0 "" "$build/llm-bench" -m "$tiny" --device cpu --requests 2 \
    --prompt-len 4:8 --output-len 2:4 --json "$tmp/bench.json"
if grep -q '"device": "cpu"' "$tmp/bench.json" 2>/dev/null; then
    ok "llm-bench --json records the device"
else
    bad "llm-bench --json has no \"device\": \"cpu\"" "$(head -c 400 "$tmp/bench.json" 2>&1)"
fi
expect "llm-devbench --device bogus" 2 "no backend named 'bogus'" "$build/llm-devbench" \
    -m "$tiny" --device bogus
expect "llm-devbench on the CPU, batch identity" 0 "" "$build/llm-devbench" -m "$tiny" \
    --device cpu --tg 8 --pp 64 --batch 4 --batch-steps 2 --identity 8
if grep -q '"phase": "identity".*"same": true' "$tmp/out" &&
    [ "$(grep -c '"phase"' "$tmp/out")" = 5 ]; then
    ok "llm-devbench reports load, tg, pp, identity and batched"
else
    bad "llm-devbench output" "$(cat "$tmp/out")"
fi
# Long contexts: a 96-token prompt, then 3 sequences of 40 positions each
# stepped twice. The tiny shape's causal attention: 2 layers x 4 heads x 64
# x 96 * 97 / 2 multiply-adds, twice (Q.K and P.V), 2 flops each; its KV
# per position: 2 layers x K and V x 2 KV heads x 64 x 4 bytes (f32), and a
# step reads on average 40 + 1.5 positions of each of 3 sequences.
expect "llm-devbench long prompt and long decode" 0 "" "$build/llm-devbench" -m "$tiny" \
    --device cpu --tg 0 --pp 0 --batch 0 --identity 0 --kv f32 --long-pp 96 \
    --long-decode 3x40 --batch-steps 2
lp=$(grep '"phase": "long_pp"' "$tmp/out") ld=$(grep '"phase": "long_decode"' "$tmp/out")
want_flop=$((2 * 2 * 2 * 4 * 64 * 96 * 97 / 2))
want_kv=$((3 * (2 * 2 * 2 * 64 * 4) * 83 / 2))
if [ -n "$lp" ] && [ -n "$ld" ] &&
    awk -v a="$(jnum "$lp" attn_flop)" -v b="$want_flop" -v c="$(jnum "$ld" kv_bytes_per_step)" \
        -v d="$want_kv" -v t="$(jnum "$ld" tokens)" \
        'BEGIN { exit !(a == b && c == d && t == 6) }'; then
    ok "llm-devbench counts a long prompt's attention flops and a long decode's KV bytes"
else
    bad "llm-devbench long phases (want attn_flop $want_flop, kv_bytes_per_step $want_kv)" \
        "$(cat "$tmp/out")"
fi
expect "llm-devbench --long-decode needs SxP" 1 "bad value '3x' for --long-decode" \
    "$build/llm-devbench" -m "$tiny" --long-decode 3x

# ---- load progress ----
# Without a terminal: one line per finished phase, in order; -q: none.
"${run[@]}" --no-mmap >/dev/null 2>"$tmp/progress.err"
phases=$(sed -n -E 's/^llm-run: (read|upload|warm-up) .* done$/\1/p' "$tmp/progress.err" | tr '\n' ' ')
if [ "$phases" = "read upload warm-up " ]; then
    ok "llm-run reports read, upload and warm-up, a line each, off a terminal"
else
    bad "llm-run's progress lines: '$phases'" "$(cat "$tmp/progress.err")"
fi
"${run[@]}" -q >/dev/null 2>"$tmp/progress.err"
if grep -q -E '(read|upload|warm-up) ' "$tmp/progress.err"; then
    bad "llm-run -q prints no progress" "$(cat "$tmp/progress.err")"
else
    ok "llm-run -q prints no progress"
fi
# On a terminal (script(1) gives it one): a bar redrawn in place to 100%.
if command -v script >/dev/null 2>&1; then
    script -qec "$(printf '%q ' "${run[@]}")" /dev/null >"$tmp/tty.out" 2>&1 </dev/null
    if grep -q $'\rllm-run: read    \[#*\.*\]' "$tmp/tty.out" &&
        grep -q 'warm-up \[##############################\] 100% 2 / 2' "$tmp/tty.out"; then
        ok "llm-run draws a progress bar on a terminal"
    else
        bad "llm-run's progress bar on a terminal" "$(cat -v "$tmp/tty.out" | head -n 5)"
    fi
fi

# ---- llm-serve --device / --tp / --devices ----
serve=("$build/llm-serve" -m "$tiny" --port 0)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    printf 'skip  llm-serve --device cuda: a GPU is present (make device-check covers it)\n'
else
    expect "llm-serve --device cuda without a GPU says why" 2 \
        "backend 'cuda' is not available: [^ ].*" "${serve[@]}" --device cuda
fi
expect "llm-serve --device bogus names the backends" 2 "no backend named 'bogus'.*'cpu'" \
    "${serve[@]}" --device bogus
expect "llm-serve --tp 0 is a usage error" 1 "--tp needs an integer" "${serve[@]}" --tp 0
expect "llm-serve --devices 0, is a usage error" 1 "--devices needs" "${serve[@]}" --devices 0,
expect "llm-serve --devices that do not match --tp" 2 "devices" "${serve[@]}" --tp 2 --devices 0
# A server on 2 CPU ranks ("auto" falls back to the CPU without a GPU)
# reports its device, ranks and KV size.
device=auto
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && device=cpu
"${serve[@]}" --device "$device" --tp 2 --devices 0,0 --kv-cache-mib 4 >"$tmp/serve.out" \
    2>"$tmp/serve.err" &
serve_pid=$!
url=
for _ in $(seq 100); do
    url=$(sed -n 's|.* at \(http://[^ ]*\)/v1 .*|\1|p' "$tmp/serve.out" 2>/dev/null || true)
    [ -n "$url" ] && break
    kill -0 "$serve_pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$url" ]; then
    bad "llm-serve --device $device --tp 2 starts" "$(cat "$tmp/serve.err")"
else
    models=$(curl -sf "$url/v1/models")
    metrics=$(curl -sf "$url/metrics")
    tokens=$(sed -n -E 's/.*"kv_cache_tokens":([0-9]+).*/\1/p' <<<"$models")
    blocks=$(sed -n -E 's/^llm_serve_kv_blocks_total ([0-9]+)$/\1/p' <<<"$metrics")
    if grep -q '"device":"cpu"' <<<"$models" && grep -q '"tensor_parallel":2' <<<"$models" &&
        [ -n "$tokens" ] && [ "$tokens" -gt 0 ] && [ -n "$blocks" ] &&
        grep -q "^llm_serve_kv_cache_tokens $tokens\$" <<<"$metrics" &&
        [ $((tokens % blocks)) -eq 0 ] &&
        grep -q '^llm_serve_device_info{device="cpu",tensor_parallel="2"} 1$' <<<"$metrics"; then
        ok "llm-serve --device $device --tp 2: /v1/models and /metrics say cpu, 2 ranks, $tokens KV tokens"
    else
        bad "llm-serve --device $device --tp 2: /v1/models and /metrics" \
            "$models"$'\n'"$(grep -e kv_ -e device <<<"$metrics")"
    fi
fi
kill -TERM "$serve_pid" 2>/dev/null
wait "$serve_pid" 2>/dev/null

# --kv-type: a q8_0 cache of 4 MiB holds floor(4 MiB / (16 slots x 544 bytes))
# blocks of 16 tokens (2 layers x 2 KV heads x 64 values: 4 blocks of 34
# bytes for K and V of a layer).
expect "llm-serve refuses an unknown --kv-type" 1 "kv-type" "${serve[@]}" --kv-type q3
"${serve[@]}" --kv-type q8_0 --kv-cache-mib 4 >"$tmp/serve.out" 2>"$tmp/serve.err" &
serve_pid=$!
url=
for _ in $(seq 100); do
    url=$(sed -n 's|.* at \(http://[^ ]*\)/v1 .*|\1|p' "$tmp/serve.out" 2>/dev/null || true)
    [ -n "$url" ] && break
    kill -0 "$serve_pid" 2>/dev/null || break
    sleep 0.1
done
want_tokens=$(((4 << 20) / (16 * 544) * 16))
tokens=
[ -n "$url" ] && tokens=$(curl -sf "$url/v1/models" | sed -n -E 's/.*"kv_cache_tokens":([0-9]+).*/\1/p')
if [ "$tokens" = "$want_tokens" ]; then
    ok "llm-serve --kv-type q8_0 --kv-cache-mib 4: $tokens KV tokens"
else
    bad "llm-serve --kv-type q8_0: ${tokens:-no} KV tokens, expected $want_tokens" \
        "$(cat "$tmp/serve.err")"
fi
kill -TERM "$serve_pid" 2>/dev/null
wait "$serve_pid" 2>/dev/null

echo "cli-test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
