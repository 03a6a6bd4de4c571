#!/usr/bin/env bash
# Install everything and run the whole test suite: lint, unit, deploy plans on fake
# hosts, and end to end on the local testbed (both engines, molecule).
#   ./scripts/test.sh            (as root)
#   ./scripts/test.sh -m 'not e2e'   (without the testbed; any pytest arguments)
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit $?
export PATH="$PWD/.venv/bin:$PATH"

pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "aicluster: pytest collected no tests: that is a failure" >&2
    exit 1
fi
exit "$rc"
