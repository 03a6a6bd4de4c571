#!/usr/bin/env bash
# Install everything and run the whole test suite: lint, unit, deploy plans on fake
# hosts, and end to end on the local testbed (both engines, molecule).
#   ./scripts/test.sh            (as root; CI runs this)
#   ./scripts/test.sh ARGS...    (plain `pytest ARGS...`, e.g. -m 'not e2e' without the
#                                 testbed, or one file)
# Without arguments it runs in two steps: the tests without the testbed, as one part
# per core side by side (`--part I/N`, tests/conftest.py; each part's output printed
# whole when it ends), then the end-to-end tests one after another (one testbed per
# machine). Every part must run tests: pytest's exit code 5 (none collected) fails.
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
    pytest -v -m "not e2e" --part "$i/$parts" > "$logs/$i" 2>&1 &
    pids+=("$!")
done
status=0
for i in $(seq 1 "$parts"); do
    wait "${pids[$((i - 1))]}"
    rc=$?
    echo "=== tests without the testbed, part $i of $parts (exit $rc) ==="
    cat "$logs/$i"
    check "$rc" "part $i of $parts" || status=1
done
pytest -v -m e2e
check $? "end-to-end tests" || status=1
exit "$status"
