"""Which cluster network a component runs on, and a host's address there, written once
for every component that picks one (ceph, minio, nfs, k3s, ray, ollama)."""

from __future__ import annotations

from collections.abc import Iterable

from aicluster.inventory import Cluster


def host_address(cluster: Cluster, name: str, network: str) -> str | None:
    """The host's address on ``network`` (its SSH address on the management network)."""
    h = cluster.hosts[name]
    return h.address if network == "management" else h.network_address(network)


def pick_network(cluster: Cluster, chosen: str | None, hosts: Iterable[str],
                 prefer: tuple[str, ...] = ("fabric",)) -> str:
    """The network the inventory chose for a component, else the first of ``prefer``
    the cluster declares and every one of ``hosts`` has an address on, else management."""
    if chosen:
        return str(chosen)
    names = list(hosts)
    for network in prefer:
        if network in cluster.spec.networks and names and all(
            host_address(cluster, n, network) for n in names
        ):
            return network
    return "management"
