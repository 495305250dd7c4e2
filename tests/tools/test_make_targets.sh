#!/usr/bin/env bash
# What each make goal builds, read from make's dry run and its rule
# database with a stand-in nvcc (nothing is compiled): `make` and `make run`
# build only what runs on this machine's CPU, never the CUDA plug-in;
# `make cuda` builds the plug-in with nvcc; `make test` (hence `make check`
# and CI) and `make install` still build it when nvcc is found; CUDA=0
# leaves it out everywhere; device-check and device-bundle build it.
#
#   tests/tools/test_make_targets.sh
#
# Prints one line per check and "make-targets-test: N passed, M failed"
# last; exit status 1 when a check failed.
set -uo pipefail

cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.."
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
passed=0
failed=0
ok() {
    printf 'ok    %s\n' "$1"
    passed=$((passed + 1))
}
bad() {
    printf 'FAIL  %s\n' "$1"
    [ -n "${2:-}" ] && sed 's/^/    | /' <<<"$2" | head -n 20
    failed=$((failed + 1))
}

# A stand-in nvcc: the Makefile enables the plug-in when it finds one.
printf '#!/bin/sh\nexit 0\n' >"$tmp/nvcc"
chmod +x "$tmp/nvcc"
mk=(make --no-print-directory NVCC="$tmp/nvcc" BUILD="$tmp/build")
plugin=$tmp/build/libllminfer-cuda.so

# dry GOAL [VAR=VALUE...]: the commands `make -B GOAL` would run.
dry() {
    local goal=$1
    shift
    "${mk[@]}" "$@" -n -B "$goal" 2>&1
}
# prereqs GOAL [VAR=VALUE...]: GOAL's prerequisites from the rule database.
prereqs() {
    local goal=$1
    shift
    "${mk[@]}" "$@" -p -q -r .llminfer-no-such-goal 2>/dev/null |
        sed -n -E "s|^$goal: (.*)|\\1|p" | head -n 1
}

for goal in all run; do
    out=$(dry "$goal")
    if grep -q -e "$tmp/nvcc" -e libllminfer-cuda.so <<<"$out"; then
        bad "make $goal does not build the CUDA plug-in" "$(grep -e nvcc -e cuda <<<"$out")"
    elif ! grep -q -e "-o $tmp/build/llm-run" <<<"$out"; then
        bad "make $goal builds llm-run" "$out"
    else
        ok "make $goal builds llm-run and not the CUDA plug-in"
    fi
done

out=$(dry cuda)
if grep -q "$tmp/nvcc" <<<"$out" && grep -q -e "-o $plugin" <<<"$out"; then
    ok "make cuda compiles with nvcc and links the plug-in"
else
    bad "make cuda compiles with nvcc and links the plug-in" "$out"
fi

for goal in test install; do
    p=$(prereqs "$goal")
    if [[ " $p " == *" $plugin "* ]]; then
        ok "make $goal builds the CUDA plug-in when nvcc is found"
    else
        bad "make $goal builds the CUDA plug-in when nvcc is found" "$goal: $p"
    fi
    p=$(prereqs "$goal" CUDA=0)
    if [ -z "$p" ]; then
        bad "make $goal CUDA=0 has a rule" "no '$goal:' rule in the database"
    elif [[ " $p " == *libllminfer-cuda* ]]; then
        bad "make $goal CUDA=0 leaves the plug-in out" "$goal: $p"
    else
        ok "make $goal CUDA=0 leaves the plug-in out"
    fi
done

# device-check and device-bundle name the plug-in themselves (they do not
# rely on `all` for it).
targets=$(DEVICE_CHECK_PRINT_TARGETS=1 BUILD="$tmp/build" bash scripts/device-check.sh 2>&1)
if grep -qx "$plugin" <<<"$targets"; then
    ok "device-check and device-bundle build the CUDA plug-in"
else
    bad "device-check's targets include the CUDA plug-in" "$targets"
fi

echo "make-targets-test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
