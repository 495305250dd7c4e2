#!/usr/bin/env bash
# Vets and tests the Go binding against the installed libllminfer that
# pkg-config finds, and runs the chat example for a few tokens. Every
# build output goes under BINDINGS_BUILD_DIR; the source tree stays clean.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_dir="${BINDINGS_BUILD_DIR:-}"
if [[ -z "$build_dir" ]]; then
    build_dir="$(mktemp -d)"
    # Go makes its module cache read-only; make it removable first.
    trap 'chmod -R u+w "$build_dir" 2>/dev/null; rm -rf "$build_dir"' EXIT
fi
build_dir="$build_dir/go"
mkdir -p "$build_dir/gopath" "$build_dir/cache" "$build_dir/tmp" "$build_dir/bin"

export GOPATH="$build_dir/gopath"
export GOCACHE="$build_dir/cache"
export GOTMPDIR="$build_dir/tmp"
export GOFLAGS=-mod=mod
export GOPROXY=off
export GOTOOLCHAIN=local
export GO111MODULE=on
export CGO_ENABLED=1

if ! pkg-config --exists llminfer; then
    echo "go bindings: pkg-config does not find llminfer (set PKG_CONFIG_PATH)" >&2
    exit 1
fi
if [[ -z "${LLMINFER_TEST_MODEL:-}" ]]; then
    echo "go bindings: LLMINFER_TEST_MODEL is unset: the tests that need a model skip"
fi
# Go's build cache does not notice a changed header outside the module
# (llm.h of a reinstalled library, same path): its hash in CGO_CFLAGS
# makes a new header a new build.
header="$(pkg-config --variable=includedir llminfer)/llm.h"
if [[ -f "$header" ]]; then
    export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -DLLMINFER_HEADER_SHA256=$(sha256sum "$header" | cut -c1-16)"
fi

cd "$here"
go version
unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then
    echo "go bindings: not gofmt-formatted: $unformatted" >&2
    exit 1
fi
go vet ./...
go test -race -count=1 ./...

go build -o "$build_dir/bin/chat" ./examples/chat
if [[ -n "${LLMINFER_TEST_MODEL:-}" ]]; then
    answer="$("$build_dir/bin/chat" -model "$LLMINFER_TEST_MODEL" -n 8 -t 2 "What is the capital of Germany?")"
    echo "chat example: $answer"
    if [[ -z "${answer//[[:space:]]/}" ]]; then
        echo "go bindings: the chat example printed no answer" >&2
        exit 1
    fi
    # The first program of docs/bindings/go.md, as written but for the
    # model's path, in a module that takes this binding from here: the
    # default model must answer its question correctly.
    first="$build_dir/docs-first"
    rm -rf "$first" && mkdir -p "$first"
    awk '/^```go$/ { inside = 1; next } inside && /^```$/ { exit } inside' "$here/../../docs/bindings/go.md" |
        sed -E "s|\"(models/)?SmolLM2-135M-Instruct.Q4_1.gguf\"|\"$LLMINFER_TEST_MODEL\"|" >"$first/main.go"
    printf 'module docsfirst\n\ngo 1.19\n\nrequire github.com/libllminfer/llminfer-go v0.0.0\n\nreplace github.com/libllminfer/llminfer-go => %s\n' \
        "$here" >"$first/go.mod"
    answer="$(cd "$first" && go run .)"
    echo "docs' first program: $answer"
    if [[ "$answer" != *Berlin* ]]; then
        echo "go bindings: the first program of docs/bindings/go.md does not answer Berlin" >&2
        exit 1
    fi
fi

echo "go bindings: ok"
