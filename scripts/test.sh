#!/usr/bin/env bash
# Install everything and run the whole test suite: lint, unit, deploy plans on fake
# hosts, and end to end on the local testbed (both engines, molecule).
#   ./scripts/test.sh            (as root; CI runs this)
#   ./scripts/test.sh ARGS...    (plain `pytest ARGS...`, e.g. -m 'not e2e' without the
#                                 testbed, or one file)
# Without arguments it runs the end-to-end tests one after another (one testbed per
# machine) and, beside them at a low CPU priority (nice 10: they take mostly the CPU
# the testbed leaves idle), the tests without the testbed as one part per core
# (`--part I/N`, tests/conftest.py), each part's output printed whole once the
# end-to-end tests are done. Every part must run tests: pytest's exit code 5 (none
# collected) fails.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit $?
export PATH="$PWD/.venv/bin:$PATH"

check() {  # check RC WHAT: 0 stays 0; 5 (no tests collected) is a failure
    if [ "$1" -eq 5 ]; then
        echo "aicluster: pytest collected no tests ($2): that is a failure" >&2
        return 1
    fi
    return "$1"
}

if [ $# -gt 0 ]; then
    pytest "$@"
    check $? "pytest $*"
    exit $?
fi

parts=$(nproc)
[ "$parts" -ge 1 ] || parts=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for i in $(seq 1 "$parts"); do
    nice -n 10 pytest -v -m "not e2e" --part "$i/$parts" > "$logs/$i" 2>&1 &
    pids+=("$!")
done
status=0
pytest -v -m e2e --durations=40
check $? "end-to-end tests" || status=1
for i in $(seq 1 "$parts"); do
    wait "${pids[$((i - 1))]}"
    rc=$?
    echo "=== tests without the testbed, part $i of $parts (exit $rc) ==="
    cat "$logs/$i"
    check "$rc" "part $i of $parts" || status=1
done
exit "$status"
