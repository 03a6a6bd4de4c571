"""pyinfra entry for tests/e2e/test_k3s.py: the k3s component alone, on the hosts the
inventory gives it (deploy.py deploys every component; the test needs only this one,
and the same deploy function deploy.py calls). The release files are resolved and
verified first, as deploy.py does, before any host is touched.

    pyinfra -y inventories/testbed.py tests/e2e/deploy_k3s.py
"""

from pyinfra import host

from aicluster.artifacts import ArtifactError, resolve_cluster
from aicluster.common.ops import current_cluster
from aicluster.components.k3s import deploy as k3s

_cluster = current_cluster()
try:
    resolve_cluster(_cluster)
except ArtifactError as exc:
    raise SystemExit(f"aicluster: {exc}") from None

if "k3s" in _cluster.hosts[host.name].components():
    k3s.deploy()
