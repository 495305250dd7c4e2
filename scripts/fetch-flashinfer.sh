#!/usr/bin/env bash
# Fetches FlashInfer's CUDA headers (Apache-2.0) for `make cuda FLASHINFER=1`
# (docs/cuda.md, "FlashInfer attention"): the pinned flashinfer-python wheel
# from PyPI carries them under flashinfer/data/. Nothing of it is committed.
#
#   scripts/fetch-flashinfer.sh [output folder]     default build/flashinfer
#
# The wheel is checked against a pinned SHA-256 before anything is
# extracted; only the header folders are kept:
#   include/            FlashInfer's templates (flashinfer/data/include)
#   cutlass/include/    the CUTLASS/CuTe headers its sm90 kernels include
#   spdlog/include/     the logging library its logging.h includes
#   LICENSE             the wheel's license (Apache-2.0)
# and a stamp file naming the version and hash, written last: a folder with
# the right stamp is kept (idempotent), anything else is replaced whole.
set -euo pipefail

VERSION=0.5.3
WHEEL=flashinfer_python-$VERSION-py3-none-any.whl
WHEEL_SHA256=b601293b72f9138bad173edc28df84b9f239a013be974e2e79d4ba98aeb38cf5
STAMP_TEXT="flashinfer-python $VERSION $WHEEL_SHA256"

case "$#" in
0) out=build/flashinfer ;;
1) out=$1 ;;
*)
    echo "usage: $0 [output folder]" >&2
    exit 2
    ;;
esac
[ -n "$out" ] || { echo "usage: $0 [output folder]" >&2; exit 2; }

stamp="$out/.fetched"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$STAMP_TEXT" ] &&
    [ -f "$out/include/flashinfer/attention/prefill.cuh" ]; then
    touch "$stamp"
    echo "fetch-flashinfer: $out is up to date (flashinfer-python $VERSION)"
    exit 0
fi

fail() {
    echo "fetch-flashinfer: could not fetch flashinfer-python==$VERSION from PyPI: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || fail "python3 is not installed"
python3 -m pip --version >/dev/null 2>&1 || fail "pip is not available (install python3-pip)"

parent=$(dirname -- "$out")
mkdir -p -- "$parent"
# Next to the output, so the final rename is atomic.
tmp=$(mktemp -d "$parent/.fetch-flashinfer.XXXXXX")
trap 'rm -rf -- "$tmp"' EXIT
trap 'exit 130' INT TERM

echo "fetch-flashinfer: downloading flashinfer-python==$VERSION from PyPI (about 7 MB)..."
# --no-deps: only the headers are wanted, not torch and the rest.
if ! python3 -m pip download --no-deps --only-binary=:all: --no-input \
    --disable-pip-version-check --progress-bar off --retries 2 \
    -d "$tmp/dl" "flashinfer-python==$VERSION" >"$tmp/pip.log" 2>&1; then
    reason=$(grep -E '^ERROR:' "$tmp/pip.log" | tail -n 2 | tr '\n' ' ')
    [ -n "$reason" ] || reason=$(tail -n 3 "$tmp/pip.log" | tr '\n' ' ')
    net=$(grep -o -E "(Failed to establish a new connection|Temporary failure in name resolution|Name or service not known|Network is unreachable|timed out|SSLError|ProxyError)[^')]*" \
        "$tmp/pip.log" | tail -n 1 || true)
    [ -z "$net" ] || reason="network error (offline?): $net; $reason"
    fail "pip download failed: ${reason:-no output}"
fi
[ -f "$tmp/dl/$WHEEL" ] || fail "expected $WHEEL, pip gave: $(ls "$tmp/dl")"

have=$(python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())' "$tmp/dl/$WHEEL")
[ "$have" = "$WHEEL_SHA256" ] || fail "$WHEEL has sha256 $have, expected $WHEEL_SHA256"

# Only these members are extracted; a member whose path would leave the
# folder (.. or absolute) is refused.
python3 - "$tmp/dl/$WHEEL" "$tmp/out" <<'PY' || fail "extracting the headers failed"
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
keep = {
    "flashinfer/data/include/": "include/",
    "flashinfer/data/cutlass/include/": "cutlass/include/",
    "flashinfer/data/spdlog/include/": "spdlog/include/",
}
license_name = "flashinfer_python-0.5.3.dist-info/licenses/LICENSE"
found = set()
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        target = None
        for prefix, to in keep.items():
            if name.startswith(prefix):
                target = to + name[len(prefix):]
                found.add(prefix)
        if name == license_name:
            target = "LICENSE"
        if target is None or name.endswith("/"):
            continue
        parts = target.split("/")
        if ".." in parts or target.startswith("/"):
            sys.exit("refusing member " + name)
        path = os.path.join(dest, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(info) as src, open(path, "wb") as dst:
            dst.write(src.read())
missing = set(keep) - found
if missing:
    sys.exit("the wheel has no " + ", ".join(sorted(missing)))
PY
[ -f "$tmp/out/include/flashinfer/attention/prefill.cuh" ] ||
    fail "the wheel has no flashinfer/attention/prefill.cuh"
printf '%s\n' "$STAMP_TEXT" >"$tmp/out/.fetched"
chmod -R a+rX "$tmp/out"
rm -rf -- "$out"
mv -f -- "$tmp/out" "$out"
echo "fetch-flashinfer: wrote $out/ (flashinfer-python $VERSION headers, sha256 ok)"
