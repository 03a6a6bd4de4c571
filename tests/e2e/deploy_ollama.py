"""pyinfra entry for tests/e2e/test_ollama.py: the ollama component alone, on the hosts
the inventory gives it (deploy.py deploys every component; the test needs only this
one, and the same deploy function deploy.py calls), after resolving the release
artifacts first as deploy.py does.

    pyinfra -y inventories/testbed.py tests/e2e/deploy_ollama.py
"""

from pyinfra import host

from aicluster.artifacts import ArtifactError, resolve_cluster
from aicluster.common.ops import current_cluster
from aicluster.components.ollama import deploy as ollama

try:
    resolve_cluster(current_cluster())
except ArtifactError as exc:
    raise SystemExit(f"aicluster: {exc}") from None

if "ollama" in current_cluster().hosts[host.name].components():
    ollama.deploy()
