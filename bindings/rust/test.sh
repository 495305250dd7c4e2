#!/usr/bin/env bash
# Builds and tests the Rust bindings against an installed libllminfer found
# through pkg-config, then streams a few tokens with the chat example.
# Every build output and cache goes under $BINDINGS_BUILD_DIR.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_dir="${BINDINGS_BUILD_DIR:-$(mktemp -d)}"
mkdir -p "$build_dir"

export CARGO_TARGET_DIR="$build_dir/rust-target"
# An empty cargo home: nothing is fetched, the workspace has no dependencies.
export CARGO_HOME="$build_dir/rust-cargo-home"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_INCREMENTAL=0
export CARGO_TERM_COLOR=never
mkdir -p "$CARGO_HOME"
# rustup's proxies find their toolchains through RUSTUP_HOME, which defaults
# to a path under the old CARGO_HOME; keep it pointing there.
if [ -z "${RUSTUP_HOME:-}" ] && [ -d "$HOME/.rustup" ]; then
    export RUSTUP_HOME="$HOME/.rustup"
fi

cd "$here"
cargo --version
cargo test --offline --locked --workspace

if [ -n "${LLMINFER_TEST_MODEL:-}" ]; then
    cargo run --offline --locked --quiet -p llminfer --example chat -- \
        "$LLMINFER_TEST_MODEL" "What is the capital of France?" 12 | tee "$build_dir/rust-chat.txt"
    if ! [ -s "$build_dir/rust-chat.txt" ] || ! grep -q '[[:alpha:]]' "$build_dir/rust-chat.txt"; then
        echo "the chat example printed no answer" >&2
        exit 1
    fi
else
    echo "skipped the chat example: LLMINFER_TEST_MODEL is not set"
fi

echo "rust bindings: ok"
