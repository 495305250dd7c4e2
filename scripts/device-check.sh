#!/usr/bin/env bash
# make device-check: builds, tests and benchmarks the library on a GPU in
# one run of under 8 minutes (docs/device-check.md).
#
#   scripts/device-check.sh
#
# Environment:
#   OUT                   results folder (default build/device-check): the
#                         table (table.txt), summary.json, every part's log
#                         under logs/ and raw measurements under bench/
#   DEVICE_CHECK_BACKEND  cuda (default) or cpu: the CPU plumbing mode runs
#                         the same flow on the CPU backend with tiny shapes
#   DEVICE_CHECK_BUDGET_S seconds for the whole run (default 450); a part
#                         that would start past it is skipped, and none
#                         runs past it
#   DEVICE_CHECK_TMP      where the generated models go (default /tmp), in
#                         a folder of this run's own, removed at the end
#   DEVICE_CHECK_MODEL    SmolLM2 GGUF (default
#                         models/SmolLM2-135M-Instruct.Q4_1.gguf); its parts
#                         are skipped when the file is absent
#   BUILD                 build folder (default build)
#   DEVICE_CHECK_PREBUILT set: $BUILD is a bundle from scripts/device-bundle.sh
#                         (binaries and the shared libraries they need, for
#                         a machine that cannot build); nothing is built
#   DEVICE_CHECK_STAGE    a folder of carried pieces (scripts/device-stage.sh):
#                         model parts are joined from there, and with
#                         DEVICE_CHECK_PREBUILT its device-bundle.tar.xz is
#                         unpacked beside $BUILD when $BUILD is absent
# A model file absent but present as parts (NAME.part-aa, -ab, ...) is
# joined and checked against its pinned sha256.
#
# Every part runs under timeout(1) with its own limit, cut to what is left
# of the budget; a failed, timed-out or skipped part is recorded and the
# run goes on. Without a GPU (and without DEVICE_CHECK_BACKEND=cpu) it says
# so and exits 2 at once. Exit status: 0 when every part that ran passed
# (goals missed are reported, not failures), 1 when a part failed, 2 no
# GPU, 3 bad usage.
set -uo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
root=$(cd -- "$here/.." && pwd)
cd -- "$root"

BACKEND=${DEVICE_CHECK_BACKEND:-cuda}
BUDGET=${DEVICE_CHECK_BUDGET_S:-450}
TMP_BASE=${DEVICE_CHECK_TMP:-/tmp}
SMOL=${DEVICE_CHECK_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA3=models/gemma-3-270m-q4_k_m.gguf
BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/device-check}
JOBS=$(nproc 2>/dev/null || echo 4)
RESERVE=8 # seconds kept for the table at the end
T0=$(date +%s)

case "$BACKEND" in
cuda | cpu) ;;
*)
    echo "device-check: DEVICE_CHECK_BACKEND must be cuda or cpu, not '$BACKEND'" >&2
    exit 3
    ;;
esac
case "$BUDGET" in
'' | *[!0-9]*)
    echo "device-check: DEVICE_CHECK_BUDGET_S must be a number of seconds" >&2
    exit 3
    ;;
esac

# What the run needs built (paths under $BUILD).
ENGINE_TESTS=(test_sched test_samples test_spec test_state test_swakv test_embed test_lora_device)
TEST_BINS=(tests/backend/test_conformance tests/unit/test_golden "${ENGINE_TESTS[@]/#/tests/unit/}")
# The CUDA backend's own checks (tests/cuda/test_*.cu and .c: kernels
# against CPU references, the host side's layouts).
CUDA_TESTS=()
if [ "$BACKEND" = cuda ]; then
    for t in tests/cuda/test_*.cu tests/cuda/test_*.c; do
        [ -f "$t" ] && CUDA_TESTS+=("${t%.*}")
    done
fi
tools=("$BUILD/llm-synth" "$BUILD/llm-devbench" "$BUILD/llm-run" "$BUILD/llm-bench")
[ "$BACKEND" = cpu ] && tools+=("$BUILD/llm-bench-cpu")
# scripts/device-bundle.sh builds the same list ahead of time.
if [ -n "${DEVICE_CHECK_PRINT_TARGETS:-}" ]; then
    printf '%s\n' "${tools[@]}" "$BUILD/llm-serve" "${TEST_BINS[@]/#/$BUILD/}" \
        ${CUDA_TESTS[@]+"${CUDA_TESTS[@]/#/$BUILD/}"} "$BUILD/libllminfer-cuda.so" \
        "$BUILD/cuda-bench-bandwidth"
    exit 0
fi

if [ "$BACKEND" = cuda ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "device-check: no GPU here: nvidia-smi is not installed (no NVIDIA driver)." >&2
        echo "  DEVICE_CHECK_BACKEND=cpu runs the CPU plumbing mode." >&2
        exit 2
    fi
    if ! gpus=$(timeout 20 nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$gpus"; then
        echo "device-check: no GPU here: nvidia-smi -L says: ${gpus:-nothing}" >&2
        echo "  DEVICE_CHECK_BACKEND=cpu runs the CPU plumbing mode." >&2
        exit 2
    fi
fi

STAGE=${DEVICE_CHECK_STAGE:-}
if [ -n "$STAGE" ] && [ -n "${DEVICE_CHECK_PREBUILT:-}" ] &&
    [ -f "$STAGE/device-bundle.tar.xz" ]; then
    # The archive holds one folder, device-bundle/: it replaces $BUILD.
    if [ "$(basename "$BUILD")" != device-bundle ]; then
        echo "device-check: the staged archive unpacks as device-bundle/; BUILD is $BUILD" >&2
        exit 3
    fi
    parent=$(dirname "$BUILD")
    rm -rf -- "$BUILD" && mkdir -p "$parent" || exit 1
    if tar -C "$parent" -xJf "$STAGE/device-bundle.tar.xz" 2>/dev/null ||
        python3 -m tarfile -e "$STAGE/device-bundle.tar.xz" "$parent"; then
        echo "device-check: unpacked $STAGE/device-bundle.tar.xz into $BUILD"
    else
        echo "device-check: cannot unpack $STAGE/device-bundle.tar.xz" >&2
        exit 1
    fi
fi

# A model too big to carry in one piece may come in parts (NAME.part-aa,
# NAME.part-ab, ... as split(1) names them), beside the model's path or in
# $STAGE: joined here and checked against the sha256
# scripts/fetch-model.sh pins.
join_parts() { # file model-name
    local f=$1 want have dir
    dir=$(dirname "$f")
    if ! compgen -G "$f.part-*" >/dev/null; then
        [ -n "$STAGE" ] && compgen -G "$STAGE/$(basename "$f").part-*" >/dev/null || return 0
        dir=$STAGE
    fi
    [ -f "$f" ] && return 0
    mkdir -p "$(dirname "$f")" || return 1
    cat "$dir/$(basename "$f")".part-* >"$f.tmp" || return 1
    want=$(sed -n "/^$2)/,/;;/s/.*SHA256=//p" scripts/fetch-model.sh)
    have=$(sha256sum "$f.tmp" | cut -d' ' -f1)
    if [ -n "$want" ] && [ "$have" = "$want" ]; then
        mv "$f.tmp" "$f" && echo "device-check: joined $f from its parts (sha256 ok)"
    else
        rm -f "$f.tmp"
        echo "device-check: the parts of $f do not make the pinned file (sha256 $have)" >&2
    fi
}
join_parts "$SMOL" smollm2
join_parts "$GEMMA3" gemma3

mkdir -p "$OUT/logs" "$OUT/bench" "$TMP_BASE" || exit 1
TMPD=$(mktemp -d "$TMP_BASE/llminfer-device-check.XXXXXX") || exit 1
mkdir -p "$TMPD/tmp" || exit 1
OUT=$(cd -- "$OUT" && pwd)
ABS_BUILD=$(mkdir -p "$BUILD" && cd -- "$BUILD" && pwd)
rm -f "$OUT/parts.tsv" "$OUT/rows.tsv" "$OUT"/bench/* "$OUT"/logs/*
trap 'rm -rf -- "$TMPD"' EXIT
# Test binaries link the static library: they find the plug-in through the
# loader's search path.
export LLM_PLUGIN_PATH=$ABS_BUILD

elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - RESERVE - $(elapsed))); }
clean() { tr -d '"\\\t' <<<"$*" | tr '\n' ' ' | sed 's/ *$//'; }
record() { # name status seconds detail
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(clean "$4")" >>"$OUT/parts.tsv"
    printf '[%4ss] %-24s %-8s %s\n' "$(elapsed)" "$1" "$2" "$(clean "$4")"
}

# part NAME LIMIT CMD...: runs CMD under timeout (LIMIT cut to the budget
# left), output in logs/NAME.log; records ok / fail / timeout / skipped.
# Returns CMD's status (124 on a timeout, 125 when skipped).
PART_DETAIL=
part() {
    local name=$1 limit=$2
    shift 2
    local budget_left
    budget_left=$(left)
    if [ "$budget_left" -lt 5 ]; then
        record "$name" skipped 0 "no time left in the ${BUDGET}s budget"
        return 125
    fi
    [ "$limit" -gt "$budget_left" ] && limit=$budget_left
    local log="$OUT/logs/$name.log" start end rc
    start=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >"$log" 2>&1 </dev/null
    rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", e - s }')
    local detail=${PART_DETAIL:-}
    PART_DETAIL=
    if [ "$rc" -eq 0 ]; then
        record "$name" ok "$secs" "$detail"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        record "$name" timeout "$secs" "stopped after ${limit}s; $detail"
        rc=124
    else
        record "$name" fail "$secs" "exit status $rc: $(tail -n 3 "$log" | cut -c1-200) $detail"
    fi
    return "$rc"
}

# Rewrites a recorded part's status and detail.
retag() { # name status detail
    awk -F'\t' -v OFS='\t' -v n="$1" -v s="$2" -v d="$(clean "$3")" \
        '$1 == n { $2 = s; $4 = d } { print }' "$OUT/parts.tsv" >"$OUT/parts.tmp" &&
        mv "$OUT/parts.tmp" "$OUT/parts.tsv"
    printf '       %-24s %-8s %s\n' "$1" "$2" "$(clean "$3")"
}

# A number from a JSON line: jnum LINE KEY.
jnum() { sed -n -E "s/.*\"$2\": (-?[0-9.eE+]+).*/\1/p" <<<"$1" | head -n 1; }
phase() { grep -E "\"phase\": \"$2\"${3:+.*\"n_seq\": $3,}" "$1" 2>/dev/null | head -n 1; }

row() { # figure measured floor fraction goal verdict
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$OUT/rows.tsv"
}
# verdict FRACTION GOAL ("ge 0.85", "lt 10"): ok / below / -
verdict() {
    [ -z "$2" ] || [ -z "$1" ] && { echo -; return; }
    awk -v x="$1" -v op="${2%% *}" -v g="${2#* }" 'BEGIN {
        ok = op == "ge" ? x >= g : x < g; print ok ? "ok" : "MISSED" }'
}
pct() { [ -n "$1" ] && awk -v x="$1" 'BEGIN { printf "%.1f%%", 100 * x }' || echo n/a; }

echo "device-check: backend $BACKEND, budget ${BUDGET}s, results in $OUT"

# ---- the machine ----
if [ "$BACKEND" = cuda ]; then
    echo "$gpus"
    smi=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
        --format=csv,noheader 2>/dev/null | head -n 1)
    echo "driver: $smi"
    machine="$(head -n 1 <<<"$gpus"); $smi"
    cap=$(awk -F', ' '{ gsub(/\./, "", $4); print $4 }' <<<"$smi")
    # Machine code for this GPU only: half the nvcc time of the default.
    gencode=()
    if [[ "$cap" =~ ^[0-9]+$ ]]; then
        gencode=("CUDA_GENCODE=-gencode arch=compute_${cap},code=sm_${cap}")
    fi
else
    machine="CPU plumbing mode: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo |
        head -n 1), $JOBS cores"
    echo "$machine"
    gencode=()
fi
printf '%s\n' "$machine" >"$OUT/machine.txt"

# ---- build (release) ----
mk=(make -j"$JOBS" --no-print-directory BUILD="$BUILD" ${gencode[@]+"${gencode[@]}"})
# The core and the tools first, without the plug-in: a plug-in that does not
# build still leaves the floors and the CPU-side parts to run. -k: one
# target that fails does not keep the others from building.
if [ -n "${DEVICE_CHECK_PREBUILT:-}" ]; then
    # A bundle from scripts/device-bundle.sh: nothing to build, and the
    # shared libraries a machine without the -dev packages lacks are in it.
    export LD_LIBRARY_PATH="$ABS_BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    record build skipped 0 "prebuilt bundle in $BUILD"
elif ! part build 300 "${mk[@]}" CUDA=0 all "${tools[@]}"; then
    echo "device-check: the build failed; nothing else can run"
    build_failed=1
fi
if [ -z "${build_failed:-}${DEVICE_CHECK_PREBUILT:-}" ] && [ "$BACKEND" = cuda ]; then
    part build-cuda 240 "${mk[@]}" -k "$BUILD/libllminfer-cuda.so" "$BUILD/cuda-bench-bandwidth"
fi
if [ -z "${build_failed:-}${DEVICE_CHECK_PREBUILT:-}" ]; then
    # Apart: llm-serve needs libmicrohttpd's -dev package, which a GPU
    # machine may lack; without it only the serving benchmark is skipped.
    part build-serve 120 "${mk[@]}" CUDA=0 "$BUILD/llm-serve"
    part build-tests 240 "${mk[@]}" -k "${TEST_BINS[@]/#/$BUILD/}" \
        ${CUDA_TESTS[@]+"${CUDA_TESTS[@]/#/$BUILD/}"}
fi

# ---- floors ----
BW= GEMM= COPY=
if [ -z "${build_failed:-}" ]; then
    if [ "$BACKEND" = cuda ] && [ -x "$BUILD/cuda-bench-bandwidth" ]; then
        part floors 60 "$BUILD/cuda-bench-bandwidth" --size-mb 4096
        f=$(grep '^{' "$OUT/logs/floors.log" | tail -n 1)
        BW=$(jnum "$f" read_gbs) COPY=$(jnum "$f" memcpy_gbs) GEMM=$(jnum "$f" gemm_tflops)
    elif [ "$BACKEND" = cuda ]; then
        record floors fail 0 "cuda-bench-bandwidth did not build (logs/build-cuda.log)"
        f=
    else
        part floors 30 "$BUILD/llm-bench-cpu" --bandwidth -t "$JOBS" --size-mb 512 --seconds 0.5
        f=$(grep '^{' "$OUT/logs/floors.log" | tail -n 1)
        BW=$(jnum "$f" read_gbs) COPY=$(jnum "$f" copy_gbs)
    fi
    printf '%s\n' "$f" >"$OUT/bench/floors.json"
    row "copy bandwidth ($([ "$BACKEND" = cuda ] && echo "cudaMemcpy, read+write" ||
        echo "CPU copy, read+write"))" "${COPY:-n/a} GB/s" - - - -
    row "read bandwidth (kernel; floor of decode)" "${BW:-n/a} GB/s" - - - -
    row "cuBLASLt bf16 8192^3 (floor of prefill)" \
        "$([ -n "$GEMM" ] && echo "$GEMM TFLOP/s" || echo "n/a")" - - - -
fi

# ---- tests ----
test_env=(env LLM_TEST_BACKEND="$BACKEND" LLM_TEST_TMP="$TMPD/tmp" LLM_TEST_DATA="$root/tests"
    LLM_PLUGIN_PATH="$ABS_BUILD")
# LoRA on CUDA is opt-in until a GPU has measured it (docs/lora.md):
# test_lora_device only checks the refusal without it.
[ "$BACKEND" = cuda ] && test_env+=(LLM_CUDA_LORA=1)
[ -f "$SMOL" ] && test_env+=(LLM_TEST_MODEL="$(cd "$(dirname "$SMOL")" && pwd)/$(basename "$SMOL")")
[ -f "$GEMMA3" ] && test_env+=(LLM_TEST_MODEL_GEMMA3="$root/$GEMMA3")
assigns=$(printf '%s ' "${test_env[@]:1}")

# Whether a test binary reads LLM_TEST_BACKEND at all (else it ran on the CPU).
honours() { grep -q -a LLM_TEST_BACKEND "$1" 2>/dev/null; }
summary_of() { tail -n 1 "$OUT/logs/$1.log" 2>/dev/null; }
# After run-tests.sh: the counts become the detail; a run with skipped tests
# is "partial" (some ran) or "skipped" (none did), never "ok", with the
# binaries' reasons; a failed one names its failed tests.
tests_verdict() { # part-name binary...
    local name=$1 s p f k logs status detail
    shift
    logs=("${@/%/.log}")
    s=$(summary_of "$name")
    p=$(sed -n -E 's/^([0-9]+) passed.*/\1/p' <<<"$s")
    f=$(sed -n -E 's/.* ([0-9]+) failed.*/\1/p' <<<"$s")
    k=$(sed -n -E 's/.* ([0-9]+) skipped.*/\1/p' <<<"$s")
    status=$(awk -F'\t' -v n="$name" '$1 == n { print $2 }' "$OUT/parts.tsv")
    if [ ! -s "$OUT/logs/$name.log" ]; then # never started (no time left)
        row "tests: $name" "not run" - - - "$status"
        return
    fi
    detail=$s
    if [ "${f:-0}" != 0 ]; then
        detail="$detail; failed: $(cat "${logs[@]}" 2>/dev/null |
            sed -n -E 's/^\[  FAILED  \] ([A-Za-z_].*)/\1/p' | sort -u | head -n 4 | tr '\n' ' ')"
    elif [ "${k:-0}" != 0 ]; then
        [ "$status" = ok ] && status=$([ "${p:-0}" = 0 ] && echo skipped || echo partial)
        detail="$detail; skipped: $(cat "${logs[@]}" 2>/dev/null | sed -n -E 's/^# skipped: //p' |
            sort | uniq -c | sort -rn | head -n 2 | sed -E 's/^ *[0-9]+ //' | tr '\n' ';')"
    fi
    retag "$name" "$status" "$detail ${PART_NOTE:-}"
    row "tests: $name" "$s" - - - "$status"
}

if [ -x "$BUILD/tests/backend/test_conformance" ]; then
    part conformance 90 bash tests/run-tests.sh "$assigns" "$BUILD/tests/backend/test_conformance"
    tests_verdict conformance "$BUILD/tests/backend/test_conformance"
fi

if [ "${#CUDA_TESTS[@]}" -gt 0 ]; then
    bins=()
    for t in "${CUDA_TESTS[@]}"; do
        [ -x "$BUILD/$t" ] && bins+=("$BUILD/$t")
    done
    if [ "${#bins[@]}" -gt 0 ]; then
        part cuda-kernel-tests 90 bash tests/run-tests.sh "$assigns" "${bins[@]}"
        tests_verdict cuda-kernel-tests "${bins[@]}"
        # test_prefill's timings of a 2048-token prompt's attention (split,
        # f32 prefill, tensor-core prefill and, built with FlashInfer,
        # FlashInfer), one row per head size.
        while IFS= read -r line; do
            row "attention kernels: ${line#\# }" - - - - -
        done < <(grep -E '^# (attention of a 2048-token prompt|the same prompt, FlashInfer)' \
            "$BUILD/tests/cuda/test_prefill.log" 2>/dev/null | cut -c1-200)
    fi
fi

if [ -x "$BUILD/tests/unit/test_golden" ]; then
    if [ ! -f "$SMOL" ]; then
        record golden skipped 0 "$SMOL was not carried"
    else
        golden_env=$assigns
        note=
        # Without the Gemma 3 file only the SmolLM2 tests run.
        if [ ! -f "$GEMMA3" ]; then
            golden_env="$assigns LLM_TEST_FILTER=test_smollm2_*"
            note="SmolLM2 only (Gemma 3 not carried);"
        fi
        part golden 60 bash tests/run-tests.sh "$golden_env" "$BUILD/tests/unit/test_golden"
        # Each forward-pass result names the backend it ran on
        # ("# smollm2 on cuda, ..."): count them by backend.
        glog=$BUILD/tests/unit/test_golden.log
        ran_on=$(sed -n -E 's/^# [a-z0-9]+ on ([^ ,]+), .*/\1/p' "$glog" 2>/dev/null | sort |
            uniq -c | awk '{ printf "%s%s on %s", (NR > 1 ? ", " : ""), $1, $2 }')
        note="${note:+$note }results: ${ran_on:-none}"
        other=$(sed -n -E 's/^# [a-z0-9]+ on ([^ ,]+), .*/\1/p' "$glog" 2>/dev/null |
            grep -v -x -F "$BACKEND" | sort -u | tr '\n' ' ')
        if [ -n "$other" ]; then
            note="$note; FAILED: results from ${other}instead of $BACKEND"
            retag golden fail "$note"
        fi
        PART_NOTE=$note tests_verdict golden "$BUILD/tests/unit/test_golden"
    fi
fi

# ---- benchmarks ----
FULL_ARGS="--tg 128 --pp 2048 --batch 8,64,256 --batch-steps 16 --identity 64"
DEVBENCH_ARGS=
if [ "$BACKEND" = cuda ]; then
    # name shape layers type; the most telling first.
    MODELS=("1b bf16|1b||bf16" "8b bf16|8b||bf16" "8b q4_k|8b||q4_k" "1b q4_k|1b||q4_k"
        "1b q8_0|1b||q8_0" "8b q8_0|8b||q8_0")
else
    MODELS=("1b bf16|tiny|1|bf16" "8b bf16|tiny|2|bf16" "8b q4_k|tiny|2|q4_k"
        "1b q4_k|tiny|1|q4_k" "1b q8_0|tiny|1|q8_0" "8b q8_0|tiny|2|q8_0")
fi

# identity_row LABEL JSONL MODE: the row of llm-devbench's identity phase.
# MODE "invariant" (run with LLM_CUDA_BATCH_INVARIANT=1) also wants the
# first logits bitwise equal; otherwise the same tokens suffice.
identity_row() {
    local label=$1 jl=$2 mode=$3 t same bitwise ok
    t=$(phase "$jl" identity)
    [ -n "$t" ] || return 0
    same=$(sed -n -E 's/.*"same": (true|false).*/\1/p' <<<"$t")
    bitwise=$(sed -n -E 's/.*"first_logits_bitwise": (true|false).*/\1/p' <<<"$t")
    ok=$([ "$same" = true ] && echo ok || echo FAILED)
    [ "$mode" = invariant ] && [ "$bitwise" != true ] && ok=FAILED
    row "$label batch identity${mode:+ ($mode)} (alone vs $(jnum "$t" n_seq))" "tokens \
$([ "$same" = true ] && echo same || echo "differ from $(jnum "$t" first_diff)"); logits bitwise \
$bitwise" - - "$([ "$mode" = invariant ] && echo "same, bitwise" || echo same)" "$ok"
}

# identity_invariant NAME MODEL-FILE LABEL: the identity phase alone with
# LLM_CUDA_BATCH_INVARIANT=1 (docs/cuda.md), where the CUDA backend keeps
# the CPU's promise that a row's logits do not depend on the batch.
identity_invariant() {
    local tag=${1// /-} file=$2 label=$3
    [ "$BACKEND" = cuda ] || return 0
    part "identity-invariant-$tag" 45 env LLM_CUDA_BATCH_INVARIANT=1 "$BUILD/llm-devbench" \
        -m "$file" --device cuda --tg 0 --pp 0 --batch 0 --identity 64
    grep "^{" "$OUT/logs/identity-invariant-$tag.log" >"$OUT/bench/$tag.invariant.jsonl" 2>/dev/null
    identity_row "$label" "$OUT/bench/$tag.invariant.jsonl" invariant
}

# bench_rows NAME MODEL-FILE INFO-LINE LIMIT [LABEL]: llm-devbench, then the
# table rows. The goals belong to the synthetic shapes ("1b ...", "8b ...").
bench_rows() {
    local name=$1 file=$2 info=$3 limit=$4 label=${5:-$1} tag=${1// /-} synthetic=
    case "$name" in 1b* | 8b*) synthetic=1 ;; esac
    local jl="$OUT/bench/$tag.jsonl"
    # shellcheck disable=SC2086 # DEVBENCH_ARGS is a list of options
    part "bench-$tag" "$limit" "$BUILD/llm-devbench" -m "$file" --device "$BACKEND" \
        ${DEVBENCH_ARGS:-$FULL_ARGS} ${LONG_ARGS:-}
    local brc=$?
    grep "^{" "$OUT/logs/bench-$tag.log" >"$jl" 2>/dev/null
    [ -n "$info" ] && printf '%s\n' "$info" >>"$jl"
    local B L H
    B=$(jnum "$info" bytes_per_token) L=$(jnum "$info" layer_macs_per_token)
    H=$(jnum "$info" lm_head_macs)
    local goal_tg= goal_ltft=
    case "$name" in
    "8b bf16") goal_tg="ge 0.85" ;;
    "1b bf16") goal_tg="ge 0.75" ;;
    "8b q4_k") goal_tg="ge 0.70" ;;
    esac
    case "$name" in 8b*) goal_ltft="lt 10" ;; esac
    local l t fr
    l=$(phase "$jl" load)
    if [ -n "$l" ]; then
        t=$(jnum "$l" load_to_first_token_s)
        row "$label load-to-first-token" "$t s (load $(jnum "$l" load_s), session \
$(jnum "$l" session_s), decode $(jnum "$l" first_decode_s))" - - \
            "${goal_ltft:+< 10 s}" "$(verdict "$t" "$goal_ltft")"
    fi
    t=$(phase "$jl" tg)
    if [ -n "$t" ] && [ -n "$B" ]; then
        local tok gbs fl=
        fr=
        tok=$(jnum "$t" tok_s)
        gbs=$(awk -v b="$B" -v t="$tok" 'BEGIN { printf "%.1f", b * t / 1e9 }')
        if [ -n "$BW" ]; then
            fr=$(awk -v x="$gbs" -v bw="$BW" 'BEGIN { printf "%.4f", x / bw }')
            fl=$(awk -v b="$B" -v bw="$BW" 'BEGIN { printf "%.0f tok/s", bw * 1e9 / b }')
        fi
        row "$label decode batch 1" "$tok tok/s ($gbs GB/s)" "${fl:-n/a}" "$(pct "$fr")" \
            "${goal_tg:+>= $(pct "${goal_tg#ge }")}" "$(verdict "$fr" "$goal_tg")"
    fi
    t=$(phase "$jl" pp)
    if [ -n "$t" ] && [ -n "$L" ]; then
        local tok tf
        fr=
        tok=$(jnum "$t" tok_s)
        # 2 flops per multiply-add: every layer matrix for every token, the
        # LM head for the last one (attention's own flops not counted).
        tf=$(awk -v l="$L" -v h="$H" -v n="$(jnum "$t" tokens)" -v s="$(jnum "$t" s)" \
            'BEGIN { printf "%.3g", (2 * l * n + 2 * h) / s / 1e12 }')
        [ -n "$GEMM" ] && fr=$(awk -v x="$tf" -v g="$GEMM" 'BEGIN { printf "%.4f", x / g }')
        local goal=
        [ -n "$synthetic" ] && goal="ge 0.60"
        row "$label prefill $(jnum "$t" tokens)" "$tok tok/s ($tf TFLOP/s)" "${GEMM:-n/a}${GEMM:+ TFLOP/s}" \
            "$(pct "${fr:-}")" "${goal:+>= 60.0%}" "$(verdict "${fr:-}" "$goal")"
    fi
    # Long contexts (LONG_ARGS): attention's share grows with the context.
    t=$(phase "$jl" long_pp)
    if [ -n "$t" ] && [ -n "$L" ]; then
        local s tf goal=
        s=$(jnum "$t" s)
        # Matmul flops as for the prefill row plus the causal attention's.
        tf=$(awk -v l="$L" -v h="$H" -v a="$(jnum "$t" attn_flop)" -v n="$(jnum "$t" tokens)" \
            -v s="$s" 'BEGIN { printf "%.3g", (2 * l * n + 2 * h + a) / s / 1e12 }')
        [ "$name" = "8b bf16" ] && goal="lt 0.4"
        row "$label prompt $(jnum "$t" tokens), time to first token" \
            "$s s ($(jnum "$t" tok_s) tok/s, $tf TFLOP/s with attention)" - - \
            "${goal:+< 0.4 s}" "$(verdict "$s" "$goal")"
    fi
    t=$(phase "$jl" long_decode)
    if [ -n "$t" ] && [ -n "$B" ]; then
        local gbs goal=
        fr=
        # A step reads the weights once and every sequence's KV: the rate
        # of both over the whole step bounds attention's own from below.
        gbs=$(awk -v b="$B" -v kv="$(jnum "$t" kv_bytes_per_step)" -v n="$(jnum "$t" tokens)" \
            -v q="$(jnum "$t" n_seq)" -v s="$(jnum "$t" s)" \
            'BEGIN { printf "%.1f", (b + kv) * (n / q) / s / 1e9 }')
        [ -n "$BW" ] && fr=$(awk -v x="$gbs" -v bw="$BW" 'BEGIN { printf "%.4f", x / bw }')
        [ "$name" = "8b bf16" ] && goal="ge 0.70"
        row "$label decode $(jnum "$t" n_seq) x $(jnum "$t" ctx) positions" \
            "$(jnum "$t" tok_s) tok/s (weights + KV at $gbs GB/s, KV alone $(jnum "$t" kv_gbs) GB/s)" \
            "${BW:-n/a}${BW:+ GB/s}" "$(pct "${fr:-}")" "${goal:+>= 70.0%}" \
            "$(verdict "${fr:-}" "$goal")"
    fi
    identity_row "$label" "$jl" ""
    local n
    for n in 8 64 256; do
        t=$(phase "$jl" batched "$n")
        [ -n "$t" ] && [ -n "$B" ] || continue
        local tok roof
        fr=
        tok=$(jnum "$t" tok_s)
        # A step reads the weights once and multiplies them by n rows (the
        # LM head on every row: each sequence needs its logits).
        roof=$(awk -v b="$B" -v bw="$BW" -v l="$L" -v h="$H" -v n="$n" -v g="${GEMM:-0}" 'BEGIN {
            tb = bw > 0 ? b / (bw * 1e9) : 0; tf = g > 0 ? 2 * (l + h) * n / (g * 1e12) : 0
            t = tb > tf ? tb : tf; if (t > 0) printf "%.0f", n / t }')
        [ -n "$roof" ] && fr=$(awk -v x="$tok" -v r="$roof" 'BEGIN { printf "%.4f", x / r }')
        local goal=
        [ "$n" = 256 ] && [ -n "$synthetic" ] && goal="ge 0.50"
        local floor=${roof:+$roof tok/s}
        [ -z "$GEMM" ] && floor="${floor:-n/a} (bytes only)"
        row "$label decode batch $n" "$tok tok/s" "$floor" \
            "$(pct "${fr:-}")" "${goal:+>= 50.0%}" "$(verdict "${fr:-}" "$goal")"
    done
    return "$brc"
}

# A plug-in built with FlashInfer (make device-bundle FLASHINFER=1; its
# binary carries the marker string of cuda/attention_flashinfer.cu): the
# 1B and 8B bf16 prefill rows again with the tensor-core kernel
# (LLM_CUDA_ATTN_TC=1) and with FlashInfer (LLM_CUDA_ATTN=flashinfer), so
# one run compares them with the f32 prefill kernel of the rows above.
FLASHINFER_BUILT=
if [ "$BACKEND" = cuda ] &&
    grep -q -a 'llmi-flashinfer-attention' "$BUILD/libllminfer-cuda.so" 2>/dev/null; then
    FLASHINFER_BUILT=1
fi
attention_rows() { # name model-file info-line label
    local name=$1 file=$2 info=$3 label=$4 L H B v
    L=$(jnum "$info" layer_macs_per_token) H=$(jnum "$info" lm_head_macs)
    B=$(jnum "$info" bytes_per_token)
    # what|assignment|batch-1 decodes: FlashInfer takes decode rows too.
    for v in "tensor-core|LLM_CUDA_ATTN_TC=1|0" "FlashInfer|LLM_CUDA_ATTN=flashinfer|64"; do
        local what=${v%%|*} rest=${v#*|} tag t tok tf gbs fr=
        local assign=${rest%|*} tg=${rest#*|}
        tag="${name// /-}-attn-$what"
        part "bench-$tag" 40 env "$assign" "$BUILD/llm-devbench" -m "$file" --device "$BACKEND" \
            --tg "$tg" --pp 2048 --batch 0 --identity 0
        grep "^{" "$OUT/logs/bench-$tag.log" >"$OUT/bench/$tag.jsonl" 2>/dev/null
        t=$(phase "$OUT/bench/$tag.jsonl" pp)
        if [ -n "$t" ] && [ -n "$L" ]; then
            tok=$(jnum "$t" tok_s)
            tf=$(awk -v l="$L" -v h="$H" -v n="$(jnum "$t" tokens)" -v s="$(jnum "$t" s)" \
                'BEGIN { printf "%.3g", (2 * l * n + 2 * h) / s / 1e12 }')
            [ -n "$GEMM" ] && fr=$(awk -v x="$tf" -v g="$GEMM" 'BEGIN { printf "%.4f", x / g }')
            row "$label prefill $(jnum "$t" tokens), $what attention" "$tok tok/s ($tf TFLOP/s)" \
                "${GEMM:-n/a}${GEMM:+ TFLOP/s}" "$(pct "${fr:-}")" - -
        fi
        t=$(phase "$OUT/bench/$tag.jsonl" tg)
        if [ -n "$t" ] && [ -n "$B" ]; then
            fr=
            tok=$(jnum "$t" tok_s)
            gbs=$(awk -v b="$B" -v t="$tok" 'BEGIN { printf "%.1f", b * t / 1e9 }')
            [ -n "$BW" ] && fr=$(awk -v x="$gbs" -v bw="$BW" 'BEGIN { printf "%.4f", x / bw }')
            row "$label decode batch 1, $what attention" "$tok tok/s ($gbs GB/s)" \
                "${BW:-n/a}${BW:+ GB/s}" "$(pct "${fr:-}")" - -
        fi
    done
}

if [ -x "$BUILD/llm-synth" ] && [ -x "$BUILD/llm-devbench" ]; then
    for m in "${MODELS[@]}"; do
        IFS='|' read -r name shape layers type <<<"$m"
        tag=${name// /-}
        file="$TMPD/$tag.gguf"
        synth=("$BUILD/llm-synth" --shape "$shape" --type "$type" -o "$file")
        [ -n "$layers" ] && synth+=(--layers "$layers")
        need=$(jnum "$(timeout 30 "${synth[@]}" --dry-run 2>/dev/null)" bytes)
        free=$(df -P -B1 "$TMPD" 2>/dev/null | awk 'NR == 2 { print $4 }')
        if [ -z "$need" ] || [ -z "$free" ] || [ "$((need + (1 << 30)))" -gt "$free" ]; then
            record "synth-$tag" skipped 0 "needs ${need:-?} bytes and 1 GiB to spare; \
${free:-?} free under $TMPD"
            continue
        fi
        limit=40
        [ "$shape" = 8b ] && limit=90
        part "synth-$tag" "$limit" "${synth[@]}" || { rm -f "$file"; continue; }
        grep '^{' "$OUT/logs/synth-$tag.log" >"$OUT/bench/$tag.synth.json"
        info=$(timeout 30 "$BUILD/llm-synth" --info "$file" 2>/dev/null)
        limit=45
        [ "$shape" = 8b ] && limit=75
        LONG_ARGS=
        # The long-context figures of the attention issue: the 8B shape only.
        if [ "$name" = "8b bf16" ]; then
            if [ "$shape" = 8b ]; then
                LONG_ARGS="--long-pp 8192 --long-decode 32x4096"
                limit=$((limit + 45))
            else # the plumbing mode: the same rows, small
                LONG_ARGS="--long-pp 256 --long-decode 4x128"
            fi
        fi
        label=$name
        [ "$shape" = tiny ] && label="$name (tiny, ${layers} layer$([ "$layers" = 1 ] || echo s))"
        bench_rows "$name" "$file" "$info" "$limit" "$label"
        identity_invariant "$name" "$file" "$label"
        if [ -n "$FLASHINFER_BUILT" ] && { [ "$name" = "1b bf16" ] || [ "$name" = "8b bf16" ]; }; then
            attention_rows "$name" "$file" "$info" "$label"
        fi
        rm -f "$file"
    done
fi

# ---- SmolLM2 end to end ----
if [ -f "$SMOL" ] && [ -x "$BUILD/llm-devbench" ]; then
    info=$(timeout 30 "$BUILD/llm-synth" --info "$SMOL" 2>/dev/null)
    # Two CPU cores take minutes over the full set on a 135M model.
    [ "$BACKEND" = cpu ] && DEVBENCH_ARGS="--tg 32 --pp 256 --batch 8,64 --batch-steps 8 --identity 16"
    bench_rows "SmolLM2" "$SMOL" "$info" 45
    identity_invariant "SmolLM2" "$SMOL" "SmolLM2"
    DEVBENCH_ARGS=
    prompt="The capital of Germany is"
    part smollm2-run-cpu 30 "$BUILD/llm-run" -m "$SMOL" --device cpu --temp 0 -n 32 -p "$prompt"
    part smollm2-run 30 "$BUILD/llm-run" -m "$SMOL" --device "$BACKEND" --temp 0 -n 32 \
        -p "$prompt"
    a=$(grep -v -E '^(load |\[)' "$OUT/logs/smollm2-run-cpu.log" 2>/dev/null)
    b=$(grep -v -E '^(load |\[)' "$OUT/logs/smollm2-run.log" 2>/dev/null)
    speed=$(grep '^load ' "$OUT/logs/smollm2-run.log" 2>/dev/null | sed 's/.*generated/generated/')
    same=$([ -n "$b" ] && [ "$a" = "$b" ] && echo "same text" || echo "text differs")
    [ -z "$speed" ] && same="run failed"
    [ -s "$OUT/logs/smollm2-run.log" ] || same="not run"
    row "SmolLM2 llm-run greedy 32 tokens" "${speed:-no timing}" - - "CPU's text" "$same"
    # The 8-bit KV caches (FP8 E4M3 and Q8_0): the backend reads and writes
    # the blocks itself (the CPU's bytes for the same K/V floats, which
    # test_kernels checks bit for bit; the conformance kv/fp8 and kv/q8_0
    # cases compare logits). Greedy text against the CPU on the same cache
    # type: a K/V float that differs in its last bits can move one code a
    # step, so a difference late in the text is possible, not expected.
    for kv in fp8 q8_0; do
        part "smollm2-run-cpu-$kv" 30 "$BUILD/llm-run" -m "$SMOL" --device cpu --kv-type "$kv" \
            --temp 0 -n 32 -p "$prompt"
        part "smollm2-run-$kv" 30 "$BUILD/llm-run" -m "$SMOL" --device "$BACKEND" --kv-type "$kv" \
            --temp 0 -n 32 -p "$prompt"
        a=$(grep -v -E '^(load |\[)' "$OUT/logs/smollm2-run-cpu-$kv.log" 2>/dev/null)
        b=$(grep -v -E '^(load |\[)' "$OUT/logs/smollm2-run-$kv.log" 2>/dev/null)
        speed=$(grep '^load ' "$OUT/logs/smollm2-run-$kv.log" 2>/dev/null | sed 's/.*generated/generated/')
        same=$([ -n "$b" ] && [ "$a" = "$b" ] && echo "same text" || echo "text differs")
        [ -z "$speed" ] && same="run failed"
        [ -s "$OUT/logs/smollm2-run-$kv.log" ] || same="not run"
        row "SmolLM2 llm-run greedy 32 tokens, $kv KV" "${speed:-no timing}" - - "CPU's text" "$same"
    done
else
    record smollm2 skipped 0 "$SMOL was not carried"
fi

# ---- the OpenAI-compatible server under load ----
# scripts/bench-serve.sh: llm-serve on SmolLM2 on the backend, closed loops
# of 1, 16 and 64 clients; TTFT, TPOT and output tokens/s per level in
# bench/serve-concurrency.json (summary.json "serve") and one row each.
if [ -f "$SMOL" ] && [ -x "$BUILD/llm-serve" ]; then
    levels=1,16,64 reqs=48
    # Two CPU cores: the plumbing only.
    [ "$BACKEND" = cpu ] && levels=1,4 reqs=4
    part serve-bench 120 env BUILD="$BUILD" LLM_TEST_MODEL="$SMOL" BENCH_REQUESTS=$reqs \
        BENCH_SERVE_OUT="$OUT/bench/serve" bash scripts/bench-serve.sh --device "$BACKEND" \
        --concurrency "$levels"
    cp "$OUT/bench/serve/serve-concurrency.json" "$OUT/bench/" 2>/dev/null
    for n in ${levels//,/ }; do
        s=$(tr -d '\n ' <"$OUT/bench/serve/serve-c$n.json" 2>/dev/null | sed 's/,"/, "/g; s/":/": /g')
        ms() { local v; v=$(jnum "$s" "$1"); echo "${v:-n/a}"; }
        row "llm-serve SmolLM2, $n concurrent client(s)" \
            "$(ms output_tokens_per_s) tok/s; TTFT p50 $(ms ttft_ms_p50) p99 $(ms ttft_ms_p99) ms; TPOT p50 $(ms tpot_ms_p50) p99 $(ms tpot_ms_p99) ms; $(ms errors) errors" \
            - - - -
    done
elif [ -f "$SMOL" ]; then
    record serve-bench skipped 0 "llm-serve not built (libmicrohttpd-dev; logs/build-serve.log)"
fi

# ---- engine tests on the backend ----
ENGINE=()
for t in "${ENGINE_TESTS[@]}"; do
    [ -x "$BUILD/tests/unit/$t" ] && ENGINE+=("$BUILD/tests/unit/$t")
done
if [ "${#ENGINE[@]}" -gt 0 ]; then
    note=
    for b in "${ENGINE[@]}"; do
        honours "$b" || note="$note $(basename "$b")"
    done
    note=${note:+ignore LLM_TEST_BACKEND (ran on the CPU):$note}
    PART_DETAIL=$note part engine-tests 120 bash tests/run-tests.sh "$assigns" "${ENGINE[@]}"
    PART_NOTE=$note tests_verdict engine-tests "${ENGINE[@]}"
    # Again with every matmul on the batch-invariant kernel and every
    # attention row on the split kernel (docs/cuda.md): the batch-invariance,
    # prefix-cache and speculation tests the default path fails. Logs:
    # <binary>.LLM_CUDA_BATCH_INVARIANT-1.log.
    if [ "$BACKEND" = cuda ]; then
        PART_DETAIL=$note part engine-tests-invariant 120 bash tests/run-tests.sh "$assigns" \
            --env=LLM_CUDA_BATCH_INVARIANT=1 "${ENGINE[@]}"
        PART_NOTE=$note tests_verdict engine-tests-invariant \
            "${ENGINE[@]/%/.LLM_CUDA_BATCH_INVARIANT-1}"
    fi
fi

# ---- compute-sanitizer ----
if [ "$BACKEND" = cuda ]; then
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
    small="$TMPD/sanitize.gguf"
    if [ -z "$cs" ]; then
        record sanitizer skipped 0 "compute-sanitizer is not installed"
    elif timeout 30 "$BUILD/llm-synth" --shape tiny --type q4_k -o "$small" >/dev/null 2>&1; then
        for tool in memcheck racecheck; do
            part "sanitizer-$tool" 75 "$cs" --tool "$tool" --error-exitcode 99 \
                "$BUILD/llm-run" -m "$small" --device cuda --temp 0 -n 8 -p "hello world"
            row "compute-sanitizer $tool (llm-run, tiny model)" \
                "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitizer-$tool.log" |
                    tail -n 1)" - - "0 errors" \
                "$(awk -F'\t' -v n="sanitizer-$tool" '$1 == n { print $2 }' "$OUT/parts.tsv")"
        done
    else
        record sanitizer fail 0 "llm-synth could not write the tiny model"
    fi
else
    record sanitizer skipped 0 "CPU plumbing mode (compute-sanitizer needs a GPU)"
fi

# ---- the table, and summary.json ----
{
    echo
    echo "== device-check ($BACKEND): $machine"
    echo "== $(elapsed)s of a ${BUDGET}s budget; logs and JSON in $OUT"
    echo
    awk -F'\t' 'BEGIN { printf "%-24s %-8s %7s  %s\n", "part", "status", "seconds", "detail" }
        { printf "%-24s %-8s %7s  %s\n", $1, $2, $3, substr($4, 1, 110) }' "$OUT/parts.tsv"
    echo
    if [ -s "$OUT/rows.tsv" ]; then
        awk -F'\t' '
            { for (i = 1; i <= 6; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } }
            END {
                split("figure|measured|floor|fraction|goal|verdict", h, "|")
                for (i = 1; i <= 6; i++) if (length(h[i]) > w[i]) w[i] = length(h[i])
                line = ""; for (i = 1; i <= 6; i++) line = line sprintf("%-" w[i] "s  ", h[i])
                print line
                for (r = 1; r <= NR; r++) {
                    line = ""; for (i = 1; i <= 6; i++) line = line sprintf("%-" w[i] "s  ", c[r, i])
                    print line
                }
            }' "$OUT/rows.tsv"
    fi
} | tee "$OUT/table.txt"

json_rows() { # file fields...
    awk -F'\t' -v names="$2" 'BEGIN { n = split(names, k, ",") }
        { printf "%s    {", (NR > 1 ? ",\n" : "")
          for (i = 1; i <= n; i++) {
              v = $i; gsub(/"/, "", v); printf "%s\"%s\": \"%s\"", (i > 1 ? ", " : ""), k[i], v
          }
          printf "}" }' "$1"
}
{
    printf '{\n  "backend": "%s",\n  "machine": "%s",\n  "budget_s": %s,\n  "elapsed_s": %s,\n' \
        "$BACKEND" "$(clean "$machine")" "$BUDGET" "$(elapsed)"
    printf '  "floors": %s,\n' "$(cat "$OUT/bench/floors.json" 2>/dev/null | grep '^{' || echo null)"
    printf '  "serve": %s,\n' "$(tr -d '\n' <"$OUT/bench/serve-concurrency.json" 2>/dev/null || echo null)"
    printf '  "parts": [\n%s\n  ],\n' "$(json_rows "$OUT/parts.tsv" name,status,seconds,detail)"
    printf '  "rows": [\n%s\n  ]\n}\n' \
        "$([ -s "$OUT/rows.tsv" ] && json_rows "$OUT/rows.tsv" figure,measured,floor,fraction,goal,verdict)"
} >"$OUT/summary.json"

awk -F'\t' '$2 == "fail" || $2 == "timeout" { bad = 1 } END { exit bad ? 1 : 0 }' "$OUT/parts.tsv"
