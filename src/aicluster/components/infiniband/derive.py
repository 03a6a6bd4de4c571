"""The infiniband component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aicluster.common import netconf
from aicluster.common.settings import layered, setting
from aicluster.components.infiniband.probe import PORTS_COMMAND
from aicluster.inventory import Cluster

IPOIB_MODULES_FILE = "/etc/modules-load.d/aicluster-ipoib.conf"
IPOIB_NETPLAN_FILE = f"{netconf.NETPLAN_DIR}/61-aicluster-ipoib.yaml"
IPOIB_PREFIX = "61-aicluster-ipoib-"


# ---------------------------------------------------------------------------
# Values computed from the whole inventory (both engines use these)
# ---------------------------------------------------------------------------


def opensm_hosts(cluster: Cluster) -> list[tuple[str, int]]:
    """(host, priority) of the ib_nodes that run opensm, highest priority first."""
    out = []
    for name in cluster.group("ib_nodes"):
        data = cluster.hosts[name].data
        prio = setting("infiniband", data, "infiniband_opensm_priority")
        manager = setting("infiniband", data, "infiniband_subnet_manager")
        if manager == "opensm" and prio is not None:
            out.append((name, prio))
    return sorted(out, key=lambda hp: (-hp[1], hp[0]))


def opensm_settings(v: Mapping[str, Any], priority: int) -> dict[str, Any]:
    """opensm.conf as a merged dict: defaults, the user's, and the node's priority."""
    merged = {**(v["infiniband_opensm_default_config"] or {}),
              **(v["infiniband_opensm_config"] or {})}
    merged["sm_priority"] = priority
    return {k: merged[k] for k in sorted(merged) if merged[k] is not None}


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("infiniband", data)
    hw = cluster.hosts[host_name].spec.hardware
    sms = opensm_hosts(cluster)
    mine = dict(sms).get(host_name)
    role = ""
    if mine is not None:
        role = "primary" if sms[0][0] == host_name else "standby"
    return {
        "infiniband_declared_ports": [
            {"device": p.device, "pci": p.pci, "guid": p.guid, "port": p.port}
            for p in hw.ib_ports
        ],
        "infiniband_ipoib_ports": [
            {"device": p.device, "pci": p.pci, "guid": p.guid, "port": p.port,
             "network": p.network,
             "addresses": [f"{p.address}/{cluster.spec.networks[p.network].subnet.prefixlen}"]
             if p.address is not None and p.network in cluster.spec.networks else [],
             "mode": p.mode, "mtu": p.mtu}
            for p in hw.ib_ports if p.network
        ],
        "infiniband_opensm_here": mine is not None,
        "infiniband_opensm_role": role,
        "infiniband_opensm_hosts": [h for h, _ in sms],
        "infiniband_opensm_settings": opensm_settings(v, mine if mine is not None else 0),
        "infiniband_fact_command": PORTS_COMMAND,
    }


def validate(cluster: Cluster) -> list[str]:
    """infiniband's checks that need the whole inventory (host and field named): the
    fabric's subnet manager, and base's locked memory on ib_nodes. The type and shape of
    each setting is infiniband's settings model's (aicluster.components.infiniband.model)."""
    errors: list[str] = []
    nodes = cluster.group("ib_nodes")
    for name in nodes:
        limit = setting("base", cluster.hosts[name].data, "base_memlock_limit")
        if str(limit) != "unlimited":
            errors.append(f"host {name!r}: base_memlock_limit: {limit!r}; RDMA registers "
                          "pinned memory, so ib_nodes need 'unlimited'")
    sms = opensm_hosts(cluster)
    with_ports = [n for n in nodes if cluster.hosts[n].spec.hardware.ib_ports]
    managed = [n for n in with_ports
               if layered("infiniband", cluster.hosts[n].data)["infiniband_subnet_manager"]
               == "opensm"]
    if managed and not sms:
        errors.append(
            f"host {managed[0]!r}: infiniband_opensm_priority: the fabric has no subnet "
            "manager: give one node (two for a standby) an opensm priority, or set "
            "infiniband_subnet_manager: switch when a managed switch runs it"
        )
    prios = [p for _, p in sms]
    for name, prio in sms[1:]:
        if prio == prios[0]:
            errors.append(f"host {name!r}: infiniband_opensm_priority: {prio} is also "
                          f"{sms[0][0]!r}'s; give the standby a lower priority than the primary")
    return errors


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


def port_label(port: Mapping[str, Any]) -> str:
    """A declared port as a person reads it: what identifies it, then its number
    (``pci 0000:41:00.0 port 1``, ``mlx5_0 port 1``)."""
    ids = [f"guid {port['guid']}" if port.get("guid") else "",
           f"pci {port['pci']}" if port.get("pci") else "",
           "" if port.get("guid") or port.get("pci") else str(port.get("device") or "")]
    return f"{' '.join(i for i in ids if i)} port {port['port']}"


def match_port(declared: Mapping[str, Any],
               found: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The node's port (a :func:`~aicluster.components.infiniband.probe.parse` entry) a
    declared port is, or None. A port named by ``guid`` (its HCA's node GUID or the port's
    GUID) or ``pci`` (the HCA's PCI function) is found by those, whatever the HCA is called
    now (rdma-core's udev rule renames ``mlx5_0`` to e.g. ``ibp65s0f0``); its ``device``
    is then only a label. A port named by ``device`` alone is found by the HCA's current
    name, the kernel's or the persistent one, whichever the node has."""
    def fits(f: Mapping[str, Any]) -> bool:
        if f.get("port") != declared["port"]:
            return False
        if declared.get("guid") or declared.get("pci"):
            if declared.get("guid") and declared["guid"] not in (f.get("node_guid"),
                                                                 f.get("port_guid")):
                return False
            return not declared.get("pci") or f.get("pci") == declared["pci"]
        return f.get("device") == declared.get("device")

    hits = [f for f in found if fits(f)]
    return hits[0] if len(hits) == 1 else None


def missing_ports(host_name: str, declared: list[Mapping[str, Any]],
                  found: list[Mapping[str, Any]]) -> str | None:
    """Why the deploy stops when the node lacks HCA ports the inventory declares."""
    missing = [d for d in declared if match_port(d, found) is None]
    if not missing:
        return None
    seen = ", ".join(
        f"{f['device']} port {f['port']}"
        + (f" (pci {f['pci']}, guid {f['node_guid']})" if f.get("pci") and f.get("node_guid")
           else f" (pci {f['pci']})" if f.get("pci") else "")
        for f in found) or "none"
    hint = ""
    if any(not (d.get("pci") or d.get("guid")) for d in missing) and found:
        hint = ("; HCA names change when rdma-core's udev rule renames them "
                "(mlx5_0 -> ibp65s0f0, 60-rdma-persistent-naming.rules): name the port "
                "by its pci or guid instead (docs/components/infiniband.md)")
    return (
        f"infiniband: host {host_name!r}: the inventory declares {len(declared)} InfiniBand "
        f"port(s) (hardware.ib_ports), the node has {len(declared) - len(missing)} of them; "
        f"not found: {', '.join(port_label(d) for d in missing)} (the node has: {seen})"
        f"{hint}"
    )


def with_netdevs(ports: list[Mapping[str, Any]], found: list[Mapping[str, Any]]) -> list[dict]:
    """The IPoIB ports with the node's name of their HCA (``device``) and the network
    interface the node has on each (``netdev``, None where it has none)."""
    out = []
    for p in ports:
        f = match_port(p, found)
        out.append({**p, "device": f["device"] if f else (p.get("device") or p.get("pci")
                                                           or p.get("guid")),
                    "netdev": f.get("netdev") if f else None})
    return out


def opensm_decision(v: Mapping[str, Any], found: list[Mapping[str, Any]]) -> tuple[bool, str]:
    """(run opensm here, why) from the inventory and the node's ports."""
    ib = [f for f in found if f.get("link_layer") == "InfiniBand"]
    if v["infiniband_subnet_manager"] == "switch":
        return False, "the fabric's managed switch runs the subnet manager " \
                      "(infiniband_subnet_manager: switch)"
    if not v["infiniband_opensm_here"]:
        hosts = ", ".join(v["infiniband_opensm_hosts"]) or "no node"
        return False, f"not a subnet manager node (opensm runs on {hosts})"
    if not found:
        return False, "this node has no InfiniBand HCA (/sys/class/infiniband is empty), " \
                      "so opensm would have no port to manage"
    if not ib:
        return False, "this node's RDMA ports are RoCE (Ethernet link layer), which needs no " \
                      "subnet manager"
    return True, f"{v['infiniband_opensm_role']} subnet manager, priority " \
                 f"{v['infiniband_opensm_settings']['sm_priority']}"


def ipoib_glob(renderer_name: str) -> str:
    if renderer_name == "netplan":
        return IPOIB_NETPLAN_FILE
    if renderer_name == "networkd":
        return f"{netconf.NETWORKD_DIR}/{IPOIB_PREFIX}*"
    return f"{netconf.NM_DIR}/{IPOIB_PREFIX}*.nmconnection"



#: Once the IPoIB interfaces' files are gone, the network services read their files
#: again (the interfaces are no longer theirs; their addresses go with the next
#: reconfiguration or boot). Netplan's files become networkd's through netplan generate.
IPOIB_REMOVAL = (
    f"rm -f {IPOIB_NETPLAN_FILE} {netconf.NETWORKD_DIR}/{IPOIB_PREFIX}* "
    f"{netconf.NM_DIR}/{IPOIB_PREFIX}*.nmconnection\n"
    "if command -v netplan >/dev/null 2>&1; then netplan generate; fi\n"
    "if systemctl -q is-active systemd-networkd; then networkctl reload; fi\n"
    "if systemctl -q is-active NetworkManager; then nmcli connection reload; fi"
)

#: What a deploy takes off a host the inventory no longer gives InfiniBand
#: (aicluster.common.absence): opensm stopped and disabled, its configuration and the
#: IPoIB interfaces' files and module list removed. The RDMA packages stay, unless the
#: inventory's remove_packages names infiniband.
REMOVAL = {
    "infiniband": {"services": ["opensm"],
                   "after": [IPOIB_REMOVAL],
                   "files": [IPOIB_MODULES_FILE, "/etc/opensm/opensm.conf",
                             "/etc/rdma/opensm.conf"],
                   "packages": ["infiniband_packages", "infiniband_opensm_package"]},
}
