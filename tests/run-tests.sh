#!/usr/bin/env bash
# Runs cmocka test binaries and summarises them.
#
#   tests/run-tests.sh "<ENV assignments>" [--env=VAR=value] <test binary>...
#
# The first argument is one string of VAR=value assignments separated by
# spaces ("A=1 B=2"; values cannot contain spaces), passed to every binary
# through env(1). --env=VAR=value adds one more assignment for the binaries
# after it (a later --env replaces it, --env= drops it), so a binary can
# run twice in one summary: its name then shows the assignment and its log
# is <binary>.<VAR>-<value>.log. Each binary's output goes to <binary>.log; it is shown when
# the binary fails (always with TEST_VERBOSE=1). Every binary runs even when
# an earlier one failed. The last line is the summary, counting individual
# cmocka tests:
#
#   N passed, M failed, K skipped
#
# A binary that crashes, is killed, times out or exits non-zero without
# reporting a failed test (a LeakSanitizer report, say) counts as one failed
# test. Exit status: 0 when nothing failed, 1 otherwise, 2 on bad usage.
#
# Environment: TEST_TIMEOUT (seconds per binary, default 1800; 0 = none),
# TEST_VERBOSE=1 (print every binary's output).
set -uo pipefail

if [ "$#" -lt 1 ]; then
    echo "usage: $0 \"VAR=value ...\" test-binary..." >&2
    exit 2
fi

read -r -a assigns <<<"$1"
shift
for a in "${assigns[@]}"; do
    case "$a" in
    [A-Za-z_]*=*) ;;
    *)
        echo "run-tests: '$a' is not a VAR=value assignment" >&2
        exit 2
        ;;
    esac
done

if [ "$#" -eq 0 ]; then
    echo "run-tests: no test binaries given" >&2
    exit 2
fi

timeout_s=${TEST_TIMEOUT:-1800}
timeout_cmd=()
if [ "$timeout_s" != 0 ] && command -v timeout >/dev/null 2>&1; then
    timeout_cmd=(timeout -k 10 "$timeout_s")
fi

total_pass=0
total_fail=0
total_skip=0
failed_bins=()

# Sums the counts of every "[  WORD  ] k test(s)" line of a cmocka log (one
# binary may run several groups).
sum_count() { # word log
    sed -n -E "s/^\[ +$1 +\] ([0-9]+) test\(s\).*/\1/p" "$2" |
        awk '{ s += $1 } END { print s + 0 }'
}

extra=()
for bin in "$@"; do
    case "$bin" in
    --env=)
        extra=()
        continue
        ;;
    --env=[A-Za-z_]*=*)
        extra=("${bin#--env=}")
        continue
        ;;
    --env=*)
        echo "run-tests: '${bin#--env=}' is not a VAR=value assignment" >&2
        exit 2
        ;;
    esac
    name=${bin#./}${extra:+ [${extra[0]}]}
    if [ ! -x "$bin" ]; then
        printf 'FAIL  %s: missing or not executable\n' "$name"
        total_fail=$((total_fail + 1))
        failed_bins+=("$name")
        continue
    fi
    log="$bin${extra:+.${extra[0]/=/-}}.log"
    start=$(date +%s.%N)
    "${timeout_cmd[@]}" env "${assigns[@]}" "${extra[@]}" "$bin" >"$log" 2>&1 </dev/null
    rc=$?
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')

    pass=$(sum_count PASSED "$log")
    fail=$(sum_count FAILED "$log")
    skip=$(sum_count SKIPPED "$log")
    summaries=$(grep -c -E '^\[=+\] [0-9]+ test\(s\) run\.' "$log")
    groups=$(grep -c -E '^\[=+\] Running [0-9]+ test\(s\)\.' "$log")
    if [ "$summaries" -lt "$groups" ]; then
        # Stopped mid-group: count the tests that finished before.
        pass=$(grep -c -E '^\[ +OK +\] ' "$log")
        skip=$(grep -c -E '^\[  SKIPPED \] [^0-9]' "$log")
    fi

    why=
    if [ "$rc" -eq 124 ] && [ "${#timeout_cmd[@]}" -gt 0 ]; then
        why="timed out after ${timeout_s}s"
    elif [ "$rc" -gt 128 ]; then
        sig=$(kill -l $((rc - 128)) 2>/dev/null || echo "?")
        why="killed by signal $((rc - 128)) (SIG$sig)"
    elif [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
        if grep -q -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log"; then
            why="sanitizer report, exit status $rc"
        else
            why="exit status $rc"
        fi
    elif [ "$summaries" -lt "$groups" ] || [ "$groups" -eq 0 ]; then
        why="stopped before cmocka's summary (crash?)"
    fi
    # Anything wrong that cmocka did not count is one more failed test.
    if [ -n "$why" ] && [ "$fail" -eq 0 ]; then
        fail=1
    fi

    counts="$pass passed"
    [ "$fail" -gt 0 ] && counts="$counts, $fail failed"
    [ "$skip" -gt 0 ] && counts="$counts, $skip skipped"
    if [ "$fail" -gt 0 ]; then
        printf 'FAIL  %s (%s; %ss)%s\n' "$name" "$counts" "$secs" "${why:+: $why}"
        sed -e 's/^/    | /' "$log"
        failed_bins+=("$name")
    else
        printf 'PASS  %s (%s; %ss)\n' "$name" "$counts" "$secs"
        if [ "${TEST_VERBOSE:-0}" = 1 ]; then
            sed -e 's/^/    | /' "$log"
        elif [ "$skip" -gt 0 ]; then
            sed -n -E 's/^\[  SKIPPED \] ([^0-9].*)$/    skipped: \1/p' "$log" | sort -u
        fi
    fi
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
    total_skip=$((total_skip + skip))
done

echo
if [ "${#failed_bins[@]}" -gt 0 ]; then
    echo "failed binaries (logs in <binary>.log):"
    printf '    %s\n' "${failed_bins[@]}"
fi
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
