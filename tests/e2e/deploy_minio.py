"""pyinfra entry for tests/e2e/test_minio.py: base (hosts, time, firewall: MinIO's
servers talk to each other through it) and then minio, on the hosts the inventory
gives them (deploy.py deploys every component; the test needs only these two, and the
same deploy functions deploy.py calls).

    pyinfra -y inventories/testbed.py tests/e2e/deploy_minio.py
"""

from pyinfra import host

from aicluster.common.ops import current_cluster
from aicluster.components.base import deploy as base
from aicluster.components.minio import deploy as minio

_components = current_cluster().hosts[host.name].components()
if "base" in _components:
    base.deploy()
if "minio" in _components:
    minio.deploy()
