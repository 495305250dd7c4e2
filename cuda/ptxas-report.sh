#!/usr/bin/env bash
# Resource use of every CUDA kernel for one architecture, from ptxas -v:
#
#   cuda/ptxas-report.sh NVCC ARCH FILE.cu... [-- NVCC FLAGS...]
#
# compiles each file for ARCH (sm_90, say) with -Xptxas -v and prints one
# line per kernel: registers, static shared memory, stack frame, spill
# stores and spill loads (bytes). Fails (exit 1) when a hot kernel spills:
# the GEMV, attention, batch-invariant matmul and LoRA kernels, whose speed is the
# step's; a spill in one of them means local-memory traffic in its inner
# loop. Exit 2 when a file does not compile or ptxas says nothing
# parseable.
set -uo pipefail

if [ "$#" -lt 3 ]; then
    echo "usage: $0 NVCC ARCH FILE.cu... [-- FLAGS...]" >&2
    exit 2
fi
nvcc=$1
arch=$2
shift 2
files=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    files+=("$1")
    shift
done
[ "${1:-}" = "--" ] && shift
flags=("$@")

filt=$(dirname "$nvcc")/cu++filt
command -v "$filt" >/dev/null 2>&1 || filt=c++filt
command -v "$filt" >/dev/null 2>&1 || filt=cat

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Kernels whose spills fail the report.
hot='gemv|attn_|prefill|mm_tc|lora_'

status=0
printf '%-60s %5s %6s %6s %7s %7s\n' kernel regs smem stack spill_st spill_ld
for f in "${files[@]}"; do
    if ! "$nvcc" "${flags[@]}" -arch="$arch" -Xptxas -v -c "$f" -o "$tmp/k.o" \
        >"$tmp/log" 2>&1; then
        cat "$tmp/log" >&2
        echo "ptxas-report: $f does not compile" >&2
        exit 2
    fi
    # One record per entry function: name, stack, spills, registers, smem.
    awk -v arch="$arch" '
        /Compiling entry function/ {
            if (name != "") print name, regs, smem, stack, sst, sld
            name = $0; sub(/.*entry function \047/, "", name); sub(/\047.*/, "", name)
            regs = smem = stack = sst = sld = 0
        }
        /bytes stack frame/ {
            for (i = 1; i <= NF; i++) {
                if ($(i+1) == "bytes" && $(i+2) == "stack") stack = $i
                if ($(i+2) == "spill" && $(i+3) == "stores,") sst = $i
                if ($(i+2) == "spill" && $(i+3) == "loads") sld = $i
            }
        }
        /Used [0-9]+ registers/ {
            for (i = 1; i <= NF; i++) {
                if ($(i+1) ~ /^registers/) regs = $i
                if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem = $i
            }
        }
        END { if (name != "") print name, regs, smem, stack, sst, sld }
    ' "$tmp/log" >"$tmp/rows"
    if [ ! -s "$tmp/rows" ]; then
        echo "ptxas-report: no kernels found in $f's ptxas output" >&2
        exit 2
    fi
    while read -r mangled regs smem stack sst sld; do
        name=$(echo "$mangled" | "$filt" | sed -E 's/\(anonymous namespace\):://g; s/^void //; s/\([^()]*(\([^()]*\)[^()]*)*\)$//')
        printf '%-60s %5s %6s %6s %7s %7s\n' "${name:0:60}" "$regs" "$smem" "$stack" "$sst" "$sld"
        if [ "$sst" != 0 ] || [ "$sld" != 0 ]; then
            if echo "$name" | grep -Eq "$hot"; then
                echo "ptxas-report: hot kernel $name spills ($sst bytes stored, $sld loaded)" >&2
                status=1
            fi
        fi
    done <"$tmp/rows"
done
exit $status
