#!/usr/bin/env bash
# Installs the package into a fresh virtual environment under
# $BINDINGS_BUILD_DIR, runs the tests against the installed copy and the
# chat example. The source tree is only read.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${BINDINGS_BUILD_DIR:-}"
if [ -z "$build" ]; then
    build="$(mktemp -d)"
fi
mkdir -p "$build"
build="$(cd "$build" && pwd)"

export PYTHONDONTWRITEBYTECODE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_NO_INPUT=1
export PIP_CACHE_DIR="$build/pip-cache"

venv="$build/python-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python"

# Test tools come from PyPI only when the system lacks them: pytest, and
# wheel for setuptools releases without their own bdist_wheel.
missing=()
"$py" -c 'import pytest' 2>/dev/null || missing+=(pytest)
"$py" -c 'import wheel' 2>/dev/null \
    || "$py" -c 'import setuptools.command.bdist_wheel' 2>/dev/null \
    || missing+=(wheel)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "python: installing ${missing[*]} into the test environment"
    "$py" -m pip install -q "${missing[@]}"
fi

# pip builds a local project in place, and setuptools would leave build/
# and *.egg-info behind: build from a copy instead.
src="$build/python-src"
rm -rf "$src"
mkdir -p "$src"
cp -R "$here/pyproject.toml" "$here/README.md" "$here/llminfer" "$here/tests" "$src/"
"$py" -m pip install -q --no-build-isolation --no-index --no-deps --force-reinstall "$src"

cd "$build"
"$py" - "$venv" <<'PY'
import sys
import llminfer
assert llminfer.__file__.startswith(sys.argv[1]), f"imported {llminfer.__file__}, not the installed copy"
print(f"python: llminfer from {llminfer.__file__}, libllminfer {llminfer.version_string()}")
PY
"$py" -m pytest -q -p no:cacheprovider "$src/tests"
# With SIGINT ignored, as a shell starts a background job, the Ctrl-C tests
# skip and say why instead of failing.
if [ -n "${LLMINFER_TEST_MODEL:-}" ]; then
    ignored="$( (trap '' INT; "$py" -m pytest -q -rs -p no:cacheprovider -k ctrl_c "$src/tests") 2>&1)" || {
        echo "$ignored"
        echo "python: the Ctrl-C tests failed with SIGINT ignored" >&2
        exit 1
    }
    skipped="$(sed -n -E 's/^SKIPPED \[([0-9]+)\].*SIGINT is ignored.*/\1/p' <<<"$ignored" | head -n 1)"
    if [ "${skipped:-0}" -lt 2 ] || grep -q -E '[0-9]+ (failed|passed)' <<<"$ignored"; then
        echo "$ignored"
        echo "python: with SIGINT ignored, ${skipped:-0} Ctrl-C tests skipped with a reason, expected 2" >&2
        exit 1
    fi
    echo "python: with SIGINT ignored the $skipped Ctrl-C tests skip with a reason"
fi

if [ -n "${LLMINFER_TEST_MODEL:-}" ]; then
    "$py" "$here/examples/chat.py" -m "$LLMINFER_TEST_MODEL" -n 8 -t 2 "Say hello."
    # The first program of docs/bindings/python.md, as written but for the
    # model's path: the default model must answer its question correctly.
    doc="$here/../../docs/bindings/python.md"
    awk '/^```python$/ { inside = 1; next } inside && /^```$/ { exit } inside' "$doc" |
        sed -E "s|\"(models/)?SmolLM2-135M-Instruct.Q4_1.gguf\"|\"$LLMINFER_TEST_MODEL\"|" >"$build/first.py"
    grep -q "$LLMINFER_TEST_MODEL" "$build/first.py" || {
        echo "python: the first program of $doc does not load SmolLM2-135M-Instruct.Q4_1.gguf" >&2
        exit 1
    }
    answer="$("$py" "$build/first.py")"
    echo "python: docs' first program: $answer"
    if [[ "$answer" != *Berlin* ]]; then
        echo "python: the docs' first program does not answer Berlin" >&2
        exit 1
    fi
else
    echo "python: LLMINFER_TEST_MODEL is not set, the chat example is skipped"
fi

echo "python bindings: ok"
