"""pyinfra entry point: ``pyinfra inventories/lab.py deploy.py``.

Validates the inventory (the inventory file already did, before pyinfra connected to
any host), then gives each host the components its groups ask for, in dependency
order: base, network, infiniband, nvidia, storage, stacks, monitoring. Components
not built yet are skipped.

Desired absence (aicluster.common.absence, docs/rerunning.md): what a host recorded
and is no longer given is taken off it first; a removal that would break the cluster
(the last Slurm controller, a Ceph monitor quorum, the only k3s server) stops the run
before any host is changed; the host's deploy ends by recording what it now runs.
"""

from pyinfra import host, logger

from aicluster import accel
from aicluster.artifacts import ArtifactError, resolve_cluster
from aicluster.common.ops import (
    current_cluster,
    record_components,
    refuse_breaking_removals,
    remove_absent,
)
from aicluster.components import component_module
from aicluster.inventory import InventoryError

try:
    _cluster = current_cluster()
except InventoryError as exc:
    raise SystemExit(f"aicluster: {exc}") from None

# The pyinfra accelerator (aicluster.accel): facts read once per host and the last run's
# reads fetched in one command, pyinfra's per-operation bookkeeping made cheap, one
# connection per host. On only for the pyinfra versions it was tested with, unless
# AICLUSTER_ACCEL=0 or `pyinfra_accelerator = False`; otherwise this is stock pyinfra,
# and it says so in one line. (pyinfra runs this file for all hosts at once, so their
# facts are prefetched in parallel.)
accel.enable(host, host.state, wanted=_cluster.spec.pyinfra_accelerator)

try:
    # Every release artifact the inventory needs, found or downloaded once and verified
    # on this machine before any operation runs (aicluster.artifacts).
    resolve_cluster(_cluster)
except (InventoryError, ArtifactError) as exc:
    raise SystemExit(f"aicluster: {exc}") from None


# Before any host is changed (the first host that runs this reads every record).
refuse_breaking_removals(_cluster)
_wanted = _cluster.hosts[host.name].roles()
remove_absent(_wanted)

for _component in _cluster.hosts[host.name].components():
    _module = component_module(_component)
    if _module is None:
        logger.debug("%s: component %s is not built yet, skipped", host.name, _component)
        continue
    _module.deploy()


record_components(_wanted)
