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


def undeclared_network(cluster: Cluster, where: str, key: str, network: str | None) -> list[str]:
    """The error for a network chosen under ``key`` that the inventory does not declare
    (none when ``network`` is declared or not chosen)."""
    if not network or network in cluster.spec.networks:
        return []
    return [f"{where}: {key}: {network!r} is not a network of this inventory; "
            f"declared: {', '.join(cluster.spec.networks)}"]


def network_errors(cluster: Cluster, name: str, key: str, network: str,
                   hint: str = "(hardware.nics, network_bonds or network_vlans)") -> list[str]:
    """The network a component runs on, checked for one host: one the inventory
    declares, on which the host has an address."""
    where = f"host {name!r}"
    undeclared = undeclared_network(cluster, where, key, network)
    if undeclared:
        return undeclared
    if not host_address(cluster, name, network):
        return [f"{where}: {key}: the host has no address on the {network} network"
                + (f" {hint}" if hint else "")]
    return []
