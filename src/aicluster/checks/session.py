"""One ``aicluster check`` run: reach every node, run every layer's node probes in
parallel (bounded), then the pair checks round by round, and (``--drain``) drain the
Slurm nodes that failed and resume the ones this tool drained that pass now.

Probes reach the nodes with the OpenSSH client, with the options pyinfra's deploy uses
for the same host (:func:`aicluster.connectors.openssh.client_argv`: the inventory's
user, port, key and host-key settings, one multiplexed connection per node).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aicluster.checks import nodes
from aicluster.checks.context import Context
from aicluster.checks.plan import LAYERS, plan
from aicluster.checks.result import Result, Status
from aicluster.checks.runner import Probe, Transport, run_pair_check, run_probes, ssh_transport
from aicluster.inventory import Cluster


def ssh_argv(cluster: Cluster) -> Callable[[str], list[str]]:
    """The OpenSSH client's command line to each node, up to the remote command."""
    from aicluster.connectors.openssh import client_argv, openssh_data_meta

    def argv(node: str) -> list[str]:
        host = cluster.hosts[node]
        data = {key: host.data.get(key, meta.default)
                for key, meta in openssh_data_meta.items()}
        data.update(ssh_hostname=host.address, ssh_user=host.spec.ssh_user,
                    ssh_port=host.spec.ssh_port, ssh_key=host.spec.ssh_key,
                    ssh_control_persist=host.spec.ssh_control_persist)
        return client_argv(data, node)[0]

    return argv


def transport_for(cluster: Cluster) -> Transport:
    return ssh_transport(ssh_argv(cluster))


@dataclass
class Progress:
    """A progress line on stderr while the run goes on (a terminal: one line rewritten;
    otherwise nothing until the end, so that logs stay clean)."""

    enabled: bool = field(default_factory=lambda: sys.stderr.isatty())
    done: int = 0
    total: int = 0
    start: float = field(default_factory=time.monotonic)

    def plan(self, count: int) -> None:
        self.total += count

    def __call__(self, _done: int, _total: int, probe: Probe) -> None:
        self.done += 1
        if self.enabled:
            where = probe.node or "<->".join(probe.pair or ())
            sys.stderr.write(f"\r\033[K[{self.done}/{self.total}] "
                             f"{time.monotonic() - self.start:5.1f}s {probe.check} {where}")
            sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def run(ctx: Context, transport: Transport, *, workers: int = 16,
        layers: tuple[str, ...] = LAYERS, progress: Progress | None = None,
        pairs: bool = True, local: str | None = None) -> list[Result]:
    """Every result of the run (``pairs=False``: no tests between nodes; ``local``: only
    the probes that run on that node, the machine this runs on)."""
    progress = progress or Progress(enabled=False)
    reach = nodes.reach_probes(ctx)
    progress.plan(len(reach))
    results = run_probes(reach, transport, workers, progress)
    lost = [r.node for r in results if r.status is not Status.PASS and r.node]
    if lost:
        reachable = tuple(n for n in ctx.nodes() if n not in lost)
        for node in lost:
            results.append(Result("nodes.checked", Status.SKIP, node=node, layer="nodes",
                                  message=f"{node}: not checked further: not reachable"))
        if not reachable:
            return results
        ctx = Context(ctx.cluster, ctx.tier, reachable)
    probes, pair_checks = plan(ctx, layers)
    if not pairs:
        pair_checks = []
    if local:
        # A cluster-wide probe (sinfo on the controller) runs elsewhere: not here.
        probes = [p for p in probes if p.runs_on == local]
    progress.plan(len(probes) + sum(
        len(pc.nodes) * (len(pc.nodes) - 1) // 2 for pc in pair_checks))
    results += run_probes(probes, transport, workers, progress)
    for pair_check in pair_checks:
        results += run_pair_check(pair_check, transport, workers, progress)
    progress.finish()
    return results
