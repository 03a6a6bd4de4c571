"""pyinfra entry for tests/e2e/test_ceph.py: the ceph component alone, on the hosts
the inventory gives it (deploy.py deploys every component; the test needs only this
one, and the same deploy function deploy.py calls).

    pyinfra -y inventories/testbed.py tests/e2e/deploy_ceph.py
"""

from pyinfra import host

from aicluster.common.ops import current_cluster
from aicluster.components.ceph import deploy as ceph

if "ceph" in current_cluster().hosts[host.name].components():
    ceph.deploy()
