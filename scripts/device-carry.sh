#!/usr/bin/env bash
# Plans the transfers to a GPU machine (docs/device-check.md, "Carrying
# models"): a transfer takes the working tree plus the paths it carries, at
# most 64 MiB in all, and a carried file is gone at the next transfer, so
# the bundle archive (scripts/device-bundle.sh) and the real models travel
# in pieces over consecutive transfers, each copied aside on arrival
# (scripts/device-stage.sh) and joined by device-check against the sha256
# scripts/fetch-model.sh pins.
#
#   scripts/device-carry.sh [--gemma3]
#
# Writes build/device-carry/call-1, call-2, ...: the bundle archive first,
# then SmolLM2 (and with --gemma3 the Gemma 3 file) cut into parts named as
# split(1) names them (NAME.part-aa, -ab, ...), each folder small enough
# to travel with the tree. Prints each transfer's carry path and command.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."

models=(models/SmolLM2-135M-Instruct.Q4_1.gguf)
for a in "$@"; do
    case "$a" in
    --gemma3) models+=(models/gemma-3-270m-q4_k_m.gguf) ;;
    *)
        echo "device-carry: unknown option '$a' (usage: scripts/device-carry.sh [--gemma3])" >&2
        exit 2
        ;;
    esac
done
bundle=build/device-bundle.tar.xz
if [ ! -f "$bundle" ]; then
    echo "device-carry: $bundle is missing: run make device-bundle first" >&2
    exit 2
fi
for m in "${models[@]}"; do
    if [ ! -f "$m" ]; then
        echo "device-carry: $m is missing: run make model (make model-gemma3)" >&2
        exit 2
    fi
done

# What travels anyway: tracked files and untracked ones git does not ignore.
tree=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
limit=$((64 * 1024 * 1024))
margin=$((1024 * 1024))
cap=$((limit - tree - margin))
if [ "$cap" -le $((8 * 1024 * 1024)) ]; then
    echo "device-carry: the working tree already takes $tree bytes of the 64 MiB" >&2
    exit 2
fi

out=build/device-carry
rm -rf "$out"
python3 - "$out" "$cap" "$bundle" "${models[@]}" <<'EOF'
import os, shutil, string, sys

out, cap, bundle, models = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
if os.path.getsize(bundle) > cap:
    sys.exit(f"device-carry: {bundle} alone is over the {cap} bytes a transfer has left")
calls = [[]]  # per call: (source, offset, length, name)
room = cap
def add(src, off, n, name):
    global room
    calls[-1].append((src, off, n, name))
    room -= n
add(bundle, 0, os.path.getsize(bundle), os.path.basename(bundle))
suffixes = [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]
for m in models:
    size, off, k = os.path.getsize(m), 0, 0
    while off < size:
        if room < 1 << 20:
            calls.append([])
            room = cap
        n = min(room, size - off)
        add(m, off, n, f"{os.path.basename(m)}.part-{suffixes[k]}")
        off += n
        k += 1
for i, items in enumerate(calls, 1):
    d = os.path.join(out, f"call-{i}")
    os.makedirs(d)
    for src, off, n, name in items:
        with open(src, "rb") as f, open(os.path.join(d, name), "wb") as g:
            f.seek(off)
            left = n
            while left:
                chunk = f.read(min(left, 1 << 22))
                g.write(chunk)
                left -= len(chunk)
print(len(calls))
EOF
n=$(find "$out" -mindepth 1 -maxdepth 1 -type d | wc -l)
echo "device-carry: $n transfers (tree $((tree / 1000000)) MB, up to $((cap / 1000000)) MB carried each)"
for i in $(seq 1 "$n"); do
    d=$out/call-$i
    echo
    echo "transfer $i: carry [\"$d\"] ($(du -sb "$d" | cut -f1) bytes)"
    if [ "$i" -lt "$n" ]; then
        echo "  bash scripts/device-stage.sh $d"
    else
        echo "  bash scripts/device-stage.sh $d && DEVICE_CHECK_STAGE=/tmp/llminfer-stage \\"
        echo "    DEVICE_CHECK_PREBUILT=1 BUILD=build/device-bundle make device-check"
    fi
done
