#!/usr/bin/env bash
# Installs the packages libllminfer needs to build, fetch its test model and
# run its tests, on Debian or Ubuntu. Idempotent: installs only what is
# missing (apt-get update runs only then).
#
#   scripts/install-deps.sh
set -euo pipefail

installed() { # package
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}
install_deps() {
    local want=(build-essential pkg-config libcmocka-dev libpcre2-dev zlib1g-dev abigail-tools
        clang libclang-rt-14-dev)
    # The model comes from PyPI through pip; unzip is optional (python3's
    # zipfile is the fallback) but cheap.
    if ! command -v python3 >/dev/null 2>&1; then
        want+=(python3 python3-pip)
    elif ! python3 -m pip --version >/dev/null 2>&1; then
        want+=(python3-pip)
    fi
    command -v unzip >/dev/null 2>&1 || want+=(unzip)
    # The bindings' suites (tests/bindings/run.sh): a venv for Python, Go
    # and cargo from Debian unless a toolchain is already on PATH (a rustup
    # or upstream Go install is fine: Go 1.19+ and Rust 1.63+ are enough).
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || want+=(python3-venv)
    command -v go >/dev/null 2>&1 || want+=(golang-go)
    command -v cargo >/dev/null 2>&1 || want+=(cargo)
    # The API reference (make docs); llm-serve's HTTP and JSON libraries and
    # the curl its tests use.
    want+=(doxygen libmicrohttpd-dev libcjson-dev curl)
    # llm-serve behind a reverse proxy: tests/serve/test_nginx.py runs
    # docs/nginx/llm-serve.conf (TLS with a throwaway certificate).
    want+=(nginx openssl)

    if ! command -v dpkg-query >/dev/null 2>&1; then
        echo "ci: not a Debian-like system; install these yourself: ${want[*]}" >&2
        return 0
    fi
    local missing=() p
    for p in "${want[@]}"; do
        installed "$p" || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        echo "all dependencies present: ${want[*]}"
        return 0
    fi
    echo "installing: ${missing[*]}"
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || {
            echo "ci: need root (or sudo) to install: ${missing[*]}" >&2
            return 1
        }
        sudo=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

install_deps
