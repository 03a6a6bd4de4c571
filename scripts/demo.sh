#!/usr/bin/env bash
# Install everything, stand up the two-node testbed, deploy the full stack to it and
# prove it with `aicluster check`.
#   ./scripts/demo.sh            (as root)
# Afterwards: `.venv/bin/aicluster testbed status`, `... testbed ssh node1`,
# and `.venv/bin/aicluster testbed down` to remove it all.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

aicluster validate inventories/lab.py
aicluster testbed up --nodes 2
aicluster validate inventories/testbed.py
pyinfra -y inventories/testbed.py deploy.py
aicluster testbed status
# The deploy gate: prove what was deployed (docs/check.md); exits non-zero on a failure.
aicluster check inventories/testbed.py
echo "aicluster: the testbed is deployed. Remove it with: .venv/bin/aicluster testbed down"
