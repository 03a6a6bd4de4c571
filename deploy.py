"""pyinfra entry point: ``pyinfra inventories/lab.py deploy.py``.

Validates the inventory (the inventory file already did, before pyinfra connected to
any host), then gives each host the components its groups ask for, in dependency
order: base, network, infiniband, nvidia, storage, stacks, monitoring (its agents on
every node once a host is in the monitoring group). A component not built yet would be
skipped.

Desired absence (aicluster.common.absence, docs/rerunning.md): what a host recorded
and is no longer given is taken off it first; a removal that would break the cluster
(the last Slurm controller, a Ceph monitor quorum, the only k3s server) stops the run
before any host is changed; the host's deploy ends by recording what it now runs.
"""

import sys

from pyinfra import host, logger

from aicluster import accel, dryrun
from aicluster.artifacts import ArtifactError, resolve_cluster
from aicluster.common.absence import host_mounts
from aicluster.common.ops import (
    current_cluster,
    pyinfra_dry,
    record_components,
    refuse_breaking_removals,
    remove_absent,
)
from aicluster.components import component_module
from aicluster.connectors.openssh import HostLost
from aicluster.inventory import COMPONENT_ORDER, InventoryError

# `pyinfra ... --dry` changes nothing anywhere, this machine included: release artifacts
# not yet here are not downloaded, missing secrets not generated; each is named in one
# line ("aicluster: --dry: would ...") and the plan goes on (aicluster.dryrun).
dryrun.set_dry(pyinfra_dry())

try:
    _cluster = current_cluster()
except InventoryError as exc:  # (refused already as pyinfra loaded the inventory)
    print(str(exc), file=sys.stderr)
    raise SystemExit(2) from None


def _deploy_host() -> None:
    # The pyinfra accelerator (aicluster.accel): facts read once per host and the last
    # run's reads fetched in one command, pyinfra's per-operation bookkeeping made cheap,
    # one connection per host. On only for the pyinfra versions it was tested with,
    # unless AICLUSTER_ACCEL=0 or `pyinfra_accelerator = False`; otherwise this is stock
    # pyinfra, and it says so in one line. (pyinfra runs this file for all hosts at once,
    # so their facts are prefetched in parallel.)
    accel.enable(host, host.state, wanted=_cluster.spec.pyinfra_accelerator)

    try:
        # Every release artifact the inventory needs, found or downloaded once and
        # verified on this machine before any operation runs (aicluster.artifacts).
        resolve_cluster(_cluster)
    except (InventoryError, ArtifactError) as exc:
        raise SystemExit(f"aicluster: {exc}") from None

    # Before any host is changed (the first host that runs this reads every record).
    refuse_breaking_removals(_cluster)
    wanted = _cluster.hosts[host.name].roles()
    remove_absent(wanted, _cluster)

    # Every component in the one deploy order, through host.loop: pyinfra names an
    # operation by the line numbers of its call stack, which for two components' deploys
    # called from this one line can be the same (ceph's line 132 and minio's line 132 were
    # one operation to pyinfra, and the hosts' orders made a cycle). The loop adds the
    # component's position in COMPONENT_ORDER, the same on every host, so an operation
    # several hosts share (a cluster-wide step) stays one operation.
    mine = set(_cluster.hosts[host.name].components())
    for component in host.loop(COMPONENT_ORDER):
        if component not in mine:
            continue
        module = component_module(component)
        if module is None:
            logger.debug("%s: component %s is not built yet, skipped", host.name, component)
            continue
        module.deploy()

    record_components(wanted, host_mounts(_cluster, host.name))


try:
    _deploy_host()
except HostLost as exc:
    # This host's connection was lost while its deploy was planned (the connector said
    # so in one line, aicluster.connectors.openssh): nothing more is planned for it, and
    # it is failed, so pyinfra runs nothing on it, goes on with the others and exits
    # non-zero (docs/rerunning.md, "A node lost mid-run").
    if exc.host.name != host.name:
        raise
    logger.debug("%s: deploy not planned further: %s", host.name, exc)
    host.state.fail_hosts({exc.host})
