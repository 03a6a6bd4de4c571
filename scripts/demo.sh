#!/usr/bin/env bash
# Install everything, stand up the two-node testbed and deploy the full stack to it.
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
echo "aicluster: the testbed is deployed. Remove it with: .venv/bin/aicluster testbed down"
