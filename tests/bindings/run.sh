#!/usr/bin/env bash
# Bindings test: installs the library into a scratch prefix, then runs the
# test suite of each language binding against that installed copy, found
# the way a user's build finds it (pkg-config, the dynamic loader).
#
#   tests/bindings/run.sh <BUILD dir> <model.gguf> [python go rust]
#
# Each bindings/<lang>/test.sh gets PKG_CONFIG_PATH, LD_LIBRARY_PATH,
# LLMINFER_LIBRARY, LLMINFER_TEST_MODEL, LLMINFER_RUN and its own
# BINDINGS_BUILD_DIR (docs/bindings/). A language whose toolchain is missing
# (python3, go, cargo) fails the test unless LLMINFER_BINDINGS_OPTIONAL=1,
# which skips it with a message instead.
#
# Prints "bindings-test: ok (...)" as its last line, or exits 1.
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: $0 <BUILD dir> <model.gguf> [language...]" >&2
    exit 2
fi

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p -- "$1"
build=$(cd -- "$1" && pwd)
model=$2
shift 2
langs=("$@")
[ "${#langs[@]}" -gt 0 ] || langs=(python go rust)
[ -f "$model" ] || {
    echo "bindings-test: no model at $model (make model)" >&2
    exit 1
}
model=$(cd -- "$(dirname -- "$model")" && pwd)/$(basename -- "$model")

work=$build/bindings
prefix=$work/usr
rm -rf -- "$prefix"
mkdir -p -- "$work"
cd -- "$root"
if ! make --no-print-directory install BUILD="$build" PREFIX="$prefix" DESTDIR= \
    >"$work/install.log" 2>&1; then
    sed -e 's/^/    | /' "$work/install.log" >&2
    echo "bindings-test: FAILED: make install PREFIX=$prefix" >&2
    exit 1
fi

toolchain() { # language -> the command it needs
    case $1 in
    python) echo python3 ;;
    go) echo go ;;
    rust) echo cargo ;;
    *) return 1 ;;
    esac
}

# Untracked and ignored files under bindings/, before and after the tests.
leftovers() {
    git -C "$root" status --porcelain --ignored --untracked-files=all -- bindings 2>/dev/null |
        grep -E '^(\?\?|!!)' | sort || true
}
before=$(leftovers)

passed=() skipped=() failed=()
for lang in "${langs[@]}"; do
    tool=$(toolchain "$lang") || {
        echo "bindings-test: unknown language '$lang'" >&2
        exit 2
    }
    if ! command -v "$tool" >/dev/null 2>&1; then
        if [ "${LLMINFER_BINDINGS_OPTIONAL:-0}" = 1 ]; then
            echo "==> $lang: skipped ($tool is not installed)"
            skipped+=("$lang")
            continue
        fi
        echo "bindings-test: $tool is not installed (scripts/install-deps.sh installs it)" >&2
        failed+=("$lang")
        continue
    fi
    echo "==> $lang bindings"
    start=$(date +%s)
    log=$work/$lang.log
    rc=0
    (
        cd -- "$work"
        env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" \
            LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            LLMINFER_LIBRARY="$prefix/lib/libllminfer.so.1" \
            LLMINFER_TEST_MODEL="$model" \
            LLMINFER_RUN="$prefix/bin/llm-run" \
            BINDINGS_BUILD_DIR="$work/$lang" \
            bash "$root/bindings/$lang/test.sh"
    ) >"$log" 2>&1 || rc=$?
    secs=$(($(date +%s) - start))
    if [ "$rc" -eq 0 ] && [ "$(tail -n 1 "$log")" = "$lang bindings: ok" ]; then
        echo "<== $lang bindings: ok (${secs}s)"
        passed+=("$lang")
    else
        tail -n 60 "$log" | sed -e 's/^/    | /' >&2
        echo "<== $lang bindings: FAILED (exit $rc, ${secs}s; full log: $log)" >&2
        failed+=("$lang")
    fi
done

# The tests build and install outside the source tree: they may leave
# nothing new in bindings/ (a stray build/, venv, target/ or cache).
stray=$(comm -13 <(echo "$before") <(leftovers))
if [ -n "$stray" ]; then
    echo "bindings-test: the tests left files in the source tree:" >&2
    echo "$stray" | sed -e 's/^/    /' >&2
    failed+=(source-tree)
fi

if [ "${#failed[@]}" -gt 0 ]; then
    echo "bindings-test: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "bindings-test: ok (passed: ${passed[*]:-none}${skipped[*]:+; skipped: ${skipped[*]}})"
