"""pyinfra entry for tests/e2e/test_nvme_cache.py: the nvme_cache component alone, on
the hosts the inventory gives it (deploy.py deploys every component; the test needs
only this one, and the same deploy function deploy.py calls).

    pyinfra -y inventories/testbed.py tests/e2e/deploy_nvme_cache.py
"""

from pyinfra import host

from aicluster.common.ops import current_cluster
from aicluster.components.nvme_cache import deploy as nvme_cache

if "nvme_cache" in current_cluster().hosts[host.name].components():
    nvme_cache.deploy()
