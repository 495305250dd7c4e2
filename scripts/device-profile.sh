#!/usr/bin/env bash
# make device-profile: where the GPU's time goes, per kernel, for the phases
# the performance issues are judged on (docs/device-check.md, "Profiles").
# Nsight Compute runs llm-devbench on random-weight models (llm-synth) with
# --profile-from-start off; llm-devbench brackets only the phase's timed
# decodes with cuProfilerStart/Stop, so a file holds that phase alone.
#
#   scripts/device-profile.sh
#
# Phases (one text file each under $OUT/profile/, the ncu command line on
# its first line, then ncu's per-kernel summary):
#   decode1-bf16   8B shape (8 of its 32 layers), bf16, batch 1, 4 tokens
#   decode1-q4k    the same in Q4_K (the quantized GEMV kernels)
#   prefill2048    1B shape, bf16, one 2048-token prompt
#   decode64-bf16  8B shape (8 layers), bf16, 64 sequences, 2 steps
# A layer of the cut 8B model has the full model's shapes, so per-launch
# figures are the full model's; only the launch counts are a quarter.
# Metrics: gpu__time_duration.sum and dram__bytes_read.sum, clocks as the
# machine has them (--clock-control none). Everything is also packed into
# $OUT/device-profile.tar.gz, one file to bring back.
#
# Environment:
#   OUT                     results folder (default $BUILD/device-profile)
#   BUILD                   build folder (default build); a bundle from
#                           scripts/device-bundle.sh works as it is
#   DEVICE_PROFILE_BUDGET_S seconds for the whole run (default 300); a
#                           phase that would start past it is skipped
#   DEVICE_PROFILE_PHASES   space-separated subset of the phases above
#   DEVICE_CHECK_TMP        where the models go (default /tmp)
#   NCU                     the ncu binary (default: PATH, then the CUDA
#                           and Nsight Compute install folders)
# Exit status: 0 every phase ran, 1 a phase failed or was skipped, 2 no
# GPU or no ncu, 3 bad usage.
set -uo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
cd -- "$here/.." || exit 3

BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/device-profile}
BUDGET=${DEVICE_PROFILE_BUDGET_S:-300}
TMP_BASE=${DEVICE_CHECK_TMP:-/tmp}
PHASES=${DEVICE_PROFILE_PHASES:-decode1-bf16 decode1-q4k prefill2048 decode64-bf16}
T0=$(date +%s)

case "$BUDGET" in
'' | *[!0-9]*)
    echo "device-profile: DEVICE_PROFILE_BUDGET_S must be a number of seconds" >&2
    exit 3
    ;;
esac
for p in $PHASES; do
    case "$p" in
    decode1-bf16 | decode1-q4k | prefill2048 | decode64-bf16) ;;
    *)
        echo "device-profile: unknown phase '$p'" >&2
        exit 3
        ;;
    esac
done

find_ncu() {
    if [ -n "${NCU:-}" ]; then
        echo "$NCU"
        return
    fi
    command -v ncu 2>/dev/null && return
    local c
    for c in /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
        /usr/local/cuda/nsight-compute*/ncu; do
        [ -x "$c" ] && {
            echo "$c"
            return
        }
    done
}
ncu=$(find_ncu)
if [ -z "$ncu" ] || [ ! -x "$ncu" ]; then
    echo "device-profile: Nsight Compute (ncu) was not found; set NCU" >&2
    exit 2
fi
if ! timeout 20 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "device-profile: no GPU here (nvidia-smi -L lists none)" >&2
    exit 2
fi
for t in llm-synth llm-devbench libllminfer-cuda.so; do
    if [ ! -e "$BUILD/$t" ]; then
        echo "device-profile: $BUILD/$t is missing (make device-bundle, or build it)" >&2
        exit 2
    fi
done
ABS_BUILD=$(cd -- "$BUILD" && pwd)
export LLM_PLUGIN_PATH=$ABS_BUILD
# A bundle carries the libraries a CUDA image may lack.
[ -d "$ABS_BUILD/lib" ] && export LD_LIBRARY_PATH="$ABS_BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

mkdir -p "$OUT/profile" "$TMP_BASE" || exit 1
OUT=$(cd -- "$OUT" && pwd)
rm -f "$OUT"/profile/* "$OUT/device-profile.tar.gz"
TMPD=$(mktemp -d "$TMP_BASE/llminfer-device-profile.XXXXXX") || exit 1
trap 'rm -rf -- "$TMPD"' EXIT

left() { echo $((BUDGET - ($(date +%s) - T0))); }
failed=0
note() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/profile/summary.txt"; }

# model SHAPE TYPE LAYERS: path of a synthetic model, made once.
model() {
    local f="$TMPD/$1-$2-${3:-all}.gguf"
    [ -f "$f" ] && {
        echo "$f"
        return
    }
    local cmd=("$BUILD/llm-synth" --shape "$1" --type "$2")
    [ -n "$3" ] && cmd+=(--layers "$3")
    timeout 120 "${cmd[@]}" -o "$f" >"$TMPD/synth.log" 2>&1 || {
        rm -f "$f"
        return 1
    }
    echo "$f"
}

metrics=gpu__time_duration.sum,dram__bytes_read.sum
for p in $PHASES; do
    case "$p" in
    decode1-bf16) m=(8b bf16 8) bench=(--tg 4 --pp 0 --batch 0 --identity 0 --profile tg) ;;
    decode1-q4k) m=(8b q4_k 8) bench=(--tg 4 --pp 0 --batch 0 --identity 0 --profile tg) ;;
    prefill2048) m=(1b bf16 "") bench=(--tg 0 --pp 2048 --batch 0 --identity 0 --profile pp) ;;
    decode64-bf16)
        m=(8b bf16 8)
        bench=(--tg 0 --pp 0 --batch 64 --batch-steps 2 --identity 0 --profile batched)
        ;;
    esac
    if [ "$(left)" -lt 30 ]; then
        note "$p: skipped, the budget of ${BUDGET}s is spent"
        failed=1
        continue
    fi
    if ! file=$(model "${m[@]}"); then
        note "$p: llm-synth failed: $(tail -n 3 "$TMPD/synth.log" | tr '\n' ' ')"
        failed=1
        continue
    fi
    cmd=("$ncu" --profile-from-start off --print-summary per-kernel --metrics "$metrics"
        --clock-control none "$BUILD/llm-devbench" -m "$file" --device cuda "${bench[@]}")
    limit=$(left)
    [ "$limit" -gt 180 ] && limit=180
    start=$(date +%s)
    {
        echo "# ${cmd[*]}"
        timeout "$limit" "${cmd[@]}" 2>&1
    } >"$OUT/profile/$p.txt"
    rc=$?
    note "$p: exit $rc in $(($(date +%s) - start))s ($OUT/profile/$p.txt)"
    [ "$rc" -eq 0 ] || failed=1
done

tar -czf "$OUT/device-profile.tar.gz" -C "$OUT" profile && note "packed $OUT/device-profile.tar.gz"
exit "$failed"
