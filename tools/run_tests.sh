#!/usr/bin/env bash
# make test: every test — the suite on PYTEST_WORKERS xdist workers (default
# 2, this machine's cores), then the tests marked `serial` alone, in one
# process: they compare times with the wall clock (no other test may load the
# machine under them), or read what other tests of their module left.  Both phases print their slowest tests; the last line counts them all.
# Usage: tools/run_tests.sh PYTHON [PYTEST ARGS...]
set -u
python=$1
shift
workers=${PYTEST_WORKERS:-2}
log=$(mktemp)
# what the session fixtures make (profiled graphs, real torchrun incidents)
# is made once for both phases (tests/shared.py)
export PRISM_DEBUG_TESTS_SHARED=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$PRISM_DEBUG_TESTS_SHARED"' EXIT
started=$SECONDS

phase() {  # phase NAME PYTEST-ARGS...: run one, remember its counts and status
    local name=$1
    shift
    echo "== $name"
    "$python" -m pytest "$@" 2>&1 | tee -a "$log"
    local status=${PIPESTATUS[0]}
    [ "$status" -eq 5 ] && status=0  # (a phase that selects no test)
    return "$status"
}

phase "every test but the serial ones, on $workers workers" \
    -n "$workers" -m "not serial" --durations=25 "$@"
parallel=$?
phase "the serial tests, alone" -p no:xdist -m serial --durations=25 "$@"
serial=$?

# the closing line: both phases' counts together, and the wall time
count() {  # (from each phase's own summary line: "=== 3 passed, 1 failed in 9.1s ===")
    grep -E '^=+ .* in [0-9.]+s' "$log" | grep -Eo "[0-9]+ $1\b" \
        | awk '{n += $1} END {print n + 0}'
}
summary="$(count passed) passed, $(count failed) failed"
for what in skipped xfailed xpassed errors error; do
    n=$(count "$what")
    [ "$n" -gt 0 ] && summary+=", $n $what"
done
echo "make test: $summary in $((SECONDS - started)) s"
[ "$parallel" -eq 0 ] && [ "$serial" -eq 0 ]
