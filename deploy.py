"""pyinfra entry point: ``pyinfra inventories/lab.py deploy.py``.

Validates the inventory (the inventory file already did, before pyinfra connected to
any host), then gives each host the components its groups ask for, in dependency
order: base, network, infiniband, nvidia, storage, stacks, monitoring. Components
not built yet are skipped.
"""

from pyinfra import host, logger

from aicluster.artifacts import ArtifactError, resolve_cluster
from aicluster.deploys import component_module, current_cluster
from aicluster.accel.memo import memoize_facts, prefetch_facts, remember_reads
from aicluster.inventory import InventoryError
from aicluster.accel.connect_once import connect_once
from aicluster.accel.speed import speed_up_pyinfra

# pyinfra's bookkeeping for each operation, without reading every source file on the
# stack or re-evaluating type hints each time (aicluster.accel.speed).
speed_up_pyinfra()
# One connection per host, however many hosts' deploys read a left-out host's facts at
# once (aicluster.accel.connect_once: `--limit` hung without it).
connect_once()
# Each fact is read once per host until something changes on a host; the facts the last
# run read are fetched in one command first (aicluster.accel.memo).
memoize_facts()
# (pyinfra runs this file for all hosts at once, so they are fetched in parallel)
logger.debug("%s: %d facts prefetched", host.name, prefetch_facts(host))
remember_reads(host.state)

try:
    _cluster = current_cluster()
    # Every release artifact the inventory needs, found or downloaded once and verified
    # on this machine before any operation runs (aicluster.artifacts).
    resolve_cluster(_cluster)
except (InventoryError, ArtifactError) as exc:
    raise SystemExit(f"aicluster: {exc}") from None

for _component in _cluster.hosts[host.name].components():
    _module = component_module(_component)
    if _module is None:
        logger.debug("%s: component %s is not built yet, skipped", host.name, _component)
        continue
    _module.deploy()

