#!/usr/bin/env bash
# Checks the ABI of the built shared library against the committed baseline.
#
#   tests/abi/check.sh [--update] <path to libllminfer.so.1.0.0>
#
# Checks, all of them run, each reported:
#   soname    the SONAME is libllminfer.so.1
#   prefix    every exported symbol starts with llm_
#   header    every LLM_API function of include/llm.h is exported, and every
#             exported function is declared there
#   nodes     the functions of the experimental section of llm.h (between
#             `#ifdef LLM_EXPERIMENTAL` and its `#endif`) are exported in a
#             version node of their own, never in the stable LLMINFER_1
#   symbols   the exported symbols with their version node equal
#             tests/abi/symbols.txt (one `name@@NODE` per line, sorted; NODE
#             is LLMINFER_1, or the node of the minor release that added
#             the function: LLMINFER_1.1, LLMINFER_1.2, ...)
#   abidiff   the types and signatures of the public interface, as libabigail
#             sees them through the debug info (types defined in include/
#             only), have not changed from tests/abi/libllminfer.abi
#
# --update rewrites symbols.txt and libllminfer.abi from the library (after
# the soname, prefix and header checks pass). Only do that for an intended,
# compatible change: appended functions, fields appended to a struct_size
# struct, appended enum values.
#
# Needs nm and readelf (binutils) and abidw/abidiff (Debian's abigail-tools).
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
root=$(cd -- "$here/../.." && pwd)
symbols_txt=$here/symbols.txt
baseline=$here/libllminfer.abi
headers=$root/include
header=$headers/llm.h
want_soname=libllminfer.so.1
version_node=LLMINFER_1 # the stable node; later ones are LLMINFER_1.MINOR

update=0
if [ "${1:-}" = --update ]; then
    update=1
    shift
fi
if [ "$#" -ne 1 ]; then
    echo "usage: $0 [--update] <path to libllminfer.so.1.0.0>" >&2
    exit 2
fi
lib=$1
if [ ! -f "$lib" ]; then
    echo "abi-check: $lib does not exist (build it first: make)" >&2
    exit 2
fi

for tool in nm readelf abidw abidiff; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        case "$tool" in
        abidw | abidiff) pkg=abigail-tools ;;
        *) pkg=binutils ;;
        esac
        echo "abi-check: $tool not found; install $pkg (apt-get install $pkg)" >&2
        exit 2
    fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/abi-check.XXXXXX")
trap 'rm -rf -- "$tmp"' EXIT

failed=()
ok() { printf 'abi-check: %-8s ok\n' "$1"; }
bad() { # check message
    printf 'abi-check: %-8s FAILED: %s\n' "$1" "$2" >&2
    failed+=("$1")
}
indent() { sed -e 's/^/    /' >&2; }

# --- soname ---------------------------------------------------------------
soname=$(readelf -d "$lib" | sed -n -E 's/.*\(SONAME\).*\[(.*)\].*/\1/p')
if [ "$soname" = "$want_soname" ]; then
    ok soname
else
    bad soname "SONAME is '${soname:-<none>}', expected '$want_soname'"
fi

# --- exported symbols -----------------------------------------------------
# `nm -D --defined-only` prints "address type name@@VERSION". Each version
# node shows up as an absolute symbol named after it; leave those out.
is_node='$2 == "A" && $3 ~ /^LLMINFER_[0-9.]+$/'
nm -D --defined-only "$lib" |
    awk "NF >= 3 && !($is_node) { print \$3 }" |
    LC_ALL=C sort -u >"$tmp/symbols"
nm -D --defined-only "$lib" |
    awk "NF >= 3 && !($is_node) && \$2 ~ /^[TtWwiI]\$/ { print \$3 }" |
    sed -e 's/@.*//' | LC_ALL=C sort -u >"$tmp/functions"

if [ ! -s "$tmp/symbols" ]; then
    bad prefix "the library exports no symbols at all"
elif grep -v -E '^llm_' "$tmp/symbols" >"$tmp/noprefix"; then
    bad prefix "exported symbols without the llm_ prefix (hide them: static, or not LLM_API):"
    indent <"$tmp/noprefix"
else
    ok prefix
fi

# --- header declarations --------------------------------------------------
# Every function declared LLM_API in llm.h; the name is the last word before
# the first '(' on the LLM_API line.
# LLM_LEGACY_INIT(T) declares the exported T_init of old programs.
declared_functions() { # reads a header on stdin
    local text
    text=$(cat)
    {
        grep -E '^[[:space:]]*LLM_API[[:space:]]' <<<"$text" |
            sed -E 's/\(.*//; s/.*[^A-Za-z0-9_]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*$/\1/'
        grep -oE '^LLM_LEGACY_INIT\([A-Za-z0-9_]+\)' <<<"$text" |
            sed -E 's/^LLM_LEGACY_INIT\(([A-Za-z0-9_]+)\)/\1_init/'
    } | LC_ALL=C sort -u
}
declared_functions <"$header" >"$tmp/declared"
LC_ALL=C comm -23 "$tmp/declared" "$tmp/functions" >"$tmp/undefined"
LC_ALL=C comm -13 "$tmp/declared" "$tmp/functions" >"$tmp/undeclared"
if [ -s "$tmp/undefined" ] || [ -s "$tmp/undeclared" ]; then
    if [ -s "$tmp/undefined" ]; then
        bad header "declared LLM_API in include/llm.h but not exported by the library:"
        indent <"$tmp/undefined"
    fi
    if [ -s "$tmp/undeclared" ]; then
        bad header "exported by the library but not declared LLM_API in include/llm.h:"
        indent <"$tmp/undeclared"
    fi
else
    ok header
fi

# --- version nodes ----------------------------------------------------------
# The functions declared LLM_API inside `#ifdef LLM_EXPERIMENTAL` ... `#endif`.
awk '/^#ifdef LLM_EXPERIMENTAL/ { on = 1; next } on && /^#endif/ { on = 0 } on' "$header" |
    declared_functions >"$tmp/experimental"
: >"$tmp/misplaced"
while read -r fn; do
    if grep -q -x -F "$fn@@$version_node" "$tmp/symbols"; then echo "$fn" >>"$tmp/misplaced"; fi
done <"$tmp/experimental"
if [ -s "$tmp/misplaced" ]; then
    bad nodes "experimental functions exported in the stable node $version_node (list them in a node of their own in lib/llminfer.map):"
    indent <"$tmp/misplaced"
else
    ok nodes
fi

abidw_args=(--no-corpus-path --no-comp-dir-path --no-elf-needed --no-show-locs --type-id-style hash
    --headers-dir "$headers" --drop-private-types --exported-interfaces-only)

# The public interface as abidw sees it: the ELF symbols, plus the types
# defined in include/ (anything else, e.g. the insides of opaque handles, is
# dropped). The baseline is made the same way, so both sides are filtered
# alike; locations and paths are left out so it does not depend on the
# checkout.
if ! abidw "${abidw_args[@]}" --out-file "$tmp/new.abi" "$lib" 2>"$tmp/abidw.err"; then
    echo "abi-check: abidw failed on $lib:" >&2
    indent <"$tmp/abidw.err"
    exit 1
fi
if ! grep -q '<function-decl' "$tmp/new.abi"; then
    echo "abi-check: abidw found no public functions with debug info in $lib (built without -g?)" >&2
    exit 1
fi

if [ "$update" = 1 ]; then
    if [ "${#failed[@]}" -gt 0 ]; then
        echo "abi-check: not updating the baseline: fix the failed checks first (${failed[*]})" >&2
        exit 1
    fi
    if [ -f "$symbols_txt" ]; then
        LC_ALL=C comm -13 "$symbols_txt" "$tmp/symbols" | sed -e 's/^/    added:   /'
        LC_ALL=C comm -23 "$symbols_txt" "$tmp/symbols" | sed -e 's/^/    removed: /'
    fi
    cp "$tmp/symbols" "$symbols_txt"
    cp "$tmp/new.abi" "$baseline"
    echo "abi-check: wrote ${symbols_txt#"$root"/} ($(wc -l <"$symbols_txt") symbols)" \
        "and ${baseline#"$root"/}"
    exit 0
fi

# --- symbols.txt ----------------------------------------------------------
if [ ! -f "$symbols_txt" ]; then
    bad symbols "${symbols_txt#"$root"/} is missing (create it with: make abi-update)"
else
    LC_ALL=C sort -u "$symbols_txt" >"$tmp/expected"
    LC_ALL=C comm -13 "$tmp/expected" "$tmp/symbols" >"$tmp/added"
    LC_ALL=C comm -23 "$tmp/expected" "$tmp/symbols" >"$tmp/removed"
    if [ -s "$tmp/added" ] || [ -s "$tmp/removed" ]; then
        msg="exported symbols differ from ${symbols_txt#"$root"/}"
        bad symbols "$msg"
        if [ -s "$tmp/removed" ]; then
            echo "  removed (or moved to another version node; this breaks programs using them):" >&2
            indent <"$tmp/removed"
        fi
        if [ -s "$tmp/added" ]; then
            echo "  added (if intended, record them with: make abi-update):" >&2
            indent <"$tmp/added"
        fi
    else
        ok symbols
    fi
fi

# --- abidiff --------------------------------------------------------------
if [ ! -f "$baseline" ]; then
    bad abidiff "${baseline#"$root"/} is missing (create it with: make abi-update)"
else
    set +e
    abidiff --no-show-locs "$baseline" "$tmp/new.abi" >"$tmp/abidiff.out" 2>&1
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
        ok abidiff
    else
        why=
        ((rc & 1)) && why="${why}error; "
        ((rc & 2)) && why="${why}usage error; "
        ((rc & 4)) && why="${why}ABI changed; "
        ((rc & 8)) && why="${why}INCOMPATIBLE ABI change; "
        bad abidiff "abidiff ${baseline#"$root"/} <abidw of $lib> exited $rc (${why%; }):"
        indent <"$tmp/abidiff.out"
        if ((rc & 8)); then
            echo "  programs built against libllminfer.so.1 would break; undo the change" >&2
        elif ((rc & 4)); then
            echo "  if the change is intended and compatible, record it with: make abi-update" >&2
        fi
    fi
fi

if [ "${#failed[@]}" -gt 0 ]; then
    echo "abi-check: FAILED (${failed[*]})" >&2
    exit 1
fi
echo "abi-check: ok ($(wc -l <"$tmp/symbols") symbols)"
