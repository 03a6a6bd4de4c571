#!/usr/bin/env bash
# The wheel, outside the clone: build it from this repository, install it with its
# dependencies into a fresh venv in a temporary directory, and from there deploy the
# two-node testbed with pyinfra, twice: the second run must change nothing.
#   ./scripts/wheel_check.sh         (as root; the testbed is taken down afterwards)
# Needs the package index this host's pip is configured with, and the testbed's own
# needs (docs/testbed.md). Holds /tmp/aicluster-testbed.lock while the testbed is up.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/aicluster-wheel.XXXXXX)
echo "aicluster: wheel check in $work"

python3 -m venv "$work/venv"
"$work/venv/bin/pip" wheel -q --no-deps -w "$work/dist" "$repo"
"$work/venv/bin/pip" install -q "$work"/dist/aicluster-*.whl
export PATH="$work/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin"
unset PYTHONPATH
cd "$work"

# Everything below runs from the wheel: nothing of the clone is on any path.
python -c 'import aicluster, sys; sys.exit(not aicluster.__file__.startswith(sys.argv[1]))' \
    "$work/venv/" || { echo "aicluster: not imported from the wheel" >&2; exit 1; }
cp -r "$(aicluster path inventories)" inventories
aicluster validate inventories/lab.py

grand_total() {  # the "Grand total" row of pyinfra's results: hosts changed errors no-change
    grep -E '^\s*Grand total' "$1" | tail -1
}

flock /tmp/aicluster-testbed.lock bash -euo pipefail -c '
    trap "aicluster testbed down" EXIT
    aicluster testbed up --nodes 2
    aicluster validate inventories/testbed.py
    pyinfra -y inventories/testbed.py "$(aicluster path deploy)" 2>&1 | tee first.log
    pyinfra -y inventories/testbed.py "$(aicluster path deploy)" 2>&1 | tee second.log
'
echo "first run:  $(grand_total first.log)"
echo "second run: $(grand_total second.log)"
read -r _ _ _ changed errors _ <<<"$(grand_total second.log)"
if [ -z "${errors:-}" ] || [ "${changed/-/0}" != 0 ] || [ "${errors/-/0}" != 0 ]; then
    echo "aicluster: the second deploy from the wheel changed something or failed" >&2
    exit 1
fi
echo "aicluster: the wheel deploys the testbed; a second run changes nothing"
rm -rf "$work"
