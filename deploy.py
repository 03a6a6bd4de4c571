"""pyinfra entry point: ``pyinfra inventories/lab.py deploy.py``.

Validates the inventory (the inventory file already did, before pyinfra connected to
any host), then gives each host the components its groups ask for, in dependency
order: base, network, infiniband, nvidia, storage, stacks, monitoring. Components
not built yet are skipped.
"""

from pyinfra import host, logger

from aicluster.deploys import component_module, current_cluster, memoize_facts_while_preparing
from aicluster.inventory import InventoryError

memoize_facts_while_preparing()

try:
    _cluster = current_cluster()
except InventoryError as exc:
    raise SystemExit(f"aicluster: {exc}") from None

for _component in _cluster.hosts[host.name].components():
    _module = component_module(_component)
    if _module is None:
        logger.debug("%s: component %s is not built yet, skipped", host.name, _component)
        continue
    _module.deploy()
