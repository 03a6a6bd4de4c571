"""The network configuration model and its renderers, engine-free: the host's interfaces
(NICs, bonds, VLANs, IPoIB) as one data model, the files netplan, systemd-networkd or
NetworkManager get for them, and the commands that apply them (with a rollback when the
management interface changes). The network component writes Ethernet interfaces with it,
the infiniband component IPoIB interfaces, and k3s asks for an interface's name."""

from __future__ import annotations

import hashlib
import shlex
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from aicluster.common.settings import layered
from aicluster.inventory import Cluster

#: Where each renderer keeps its files, the prefix of ours, and the mode they need.
NETWORKD_DIR = "/etc/systemd/network"
NETPLAN_DIR = "/etc/netplan"
NM_DIR = "/etc/NetworkManager/system-connections"
PREFIX = "60-aicluster-"
NETPLAN_FILE = f"{NETPLAN_DIR}/60-aicluster.yaml"
ROLLBACK_UNIT = "aicluster-network-rollback"
ROLLBACK_DIR = "/var/lib/aicluster/network-rollback"


# ---------------------------------------------------------------------------
# The data model (both engines use these)
# ---------------------------------------------------------------------------


def _mtu(cluster: Cluster, v: Mapping[str, Any], network: str | None, given: Any) -> int:
    """An interface's MTU: its own, else its network's (``networks.<n>.mtu``), else
    ``network_default_mtu[<n>]`` (9000 on fabric), else 1500."""
    if given is not None:
        return int(given)
    if network and network in cluster.spec.networks and cluster.spec.networks[network].mtu:
        return int(cluster.spec.networks[network].mtu)
    return int((v["network_default_mtu"] or {}).get(network or "", 1500))


def _cidr(cluster: Cluster, network: str | None, address: Any) -> list[str]:
    if address is None or not network or network not in cluster.spec.networks:
        return []
    return [f"{address}/{cluster.spec.networks[network].subnet.prefixlen}"]


def nic_id(nic: Any) -> str:
    return nic.name or "nic" + nic.mac.replace(":", "")[-6:]


def _connection_uuid(host_name: str, ident: str) -> str:
    """A stable NetworkManager connection UUID per host and interface."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"aicluster:{host_name}:{ident}"))


def refers(nic: Any, ref: str) -> bool:
    ref = str(ref).lower()
    return ref in ((nic.name or "").lower(), nic.mac or "")


def interfaces(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> list[dict]:
    """The host's interfaces as one data model, in the order they are brought up:
    NICs (bond members among them), bonds, VLANs. Each is a dict with ``id`` (our
    label), ``kind`` (ethernet, bond, vlan, ipoib), ``name`` (kernel name to match,
    or None), ``mac`` (MAC to match, or None), ``network``, ``addresses`` (CIDR),
    ``mtu``, ``bond`` (the bond it is a member of), ``vlans`` (kernel names of the
    VLANs on it), ``uuid`` (NetworkManager's), and for bonds ``members`` and
    ``bond_mode``/``bond_hash``/``bond_miimon``/``bond_lacp_rate``, for VLANs
    ``vlan_id`` and ``link`` (the id of the parent)."""
    v = layered("network", data)
    hw = cluster.hosts[host_name].spec.hardware
    bonds = list(v["network_bonds"] or [])
    vlans = list(v["network_vlans"] or [])
    out: dict[str, dict] = {}
    member_of: dict[str, str] = {}
    for bond in bonds:
        for ref in bond.get("members") or []:
            for nic in hw.nics:
                if refers(nic, ref):
                    member_of[nic_id(nic)] = bond["name"]
    bond_mtu = {
        b["name"]: _mtu(cluster, v, b.get("network"), b.get("mtu")) for b in bonds
    }
    for nic in hw.nics:
        ident = nic_id(nic)
        bond = member_of.get(ident)
        mtu = bond_mtu[bond] if bond else _mtu(
            cluster, v, nic.network, nic.mtu if "mtu" in nic.model_fields_set else None
        )
        out[ident] = {
            "id": ident,
            "kind": "ethernet",
            "name": nic.name,
            "mac": nic.mac,
            "network": None if bond else nic.network,
            "addresses": [] if bond else _cidr(cluster, nic.network, nic.address),
            "mtu": mtu,
            "speed_gbps": nic.speed_gbps,
            "bond": bond,
            "vlans": [],
        }
    defaults_ = v["network_bond_defaults"] or {}
    for bond in bonds:
        name = bond["name"]
        members = [
            nic_id(nic) for ref in bond.get("members") or [] for nic in hw.nics
            if refers(nic, ref)
        ]
        out[name] = {
            "id": name,
            "kind": "bond",
            "name": name,
            "mac": None,
            "network": bond.get("network"),
            "addresses": _cidr(cluster, bond.get("network"), bond.get("address")),
            "mtu": bond_mtu[name],
            "bond": None,
            "vlans": [],
            "members": members,
            "bond_mode": bond.get("mode", defaults_.get("mode", "802.3ad")),
            "bond_hash": bond.get("hash", defaults_.get("hash", "layer3+4")),
            "bond_miimon": int(bond.get("miimon", defaults_.get("miimon", 100))),
            "bond_lacp_rate": bond.get("lacp_rate", defaults_.get("lacp_rate", "fast")),
        }
    for vlan in vlans:
        parent = link_id(hw, bonds, vlan.get("link"))
        name = vlan_name(vlan, out.get(parent or ""))
        out[name] = {
            "id": name,
            "kind": "vlan",
            "name": name,
            "mac": None,
            "network": vlan.get("network"),
            "addresses": _cidr(cluster, vlan.get("network"), vlan.get("address")),
            "mtu": _mtu(cluster, v, vlan.get("network"), vlan.get("mtu")),
            "bond": None,
            "vlans": [],
            "vlan_id": int(vlan["id"]),
            "link": parent,
        }
        if parent in out:
            out[parent]["vlans"].append(name)
    for item in out.values():
        item["uuid"] = _connection_uuid(host_name, item["id"])
    for item in out.values():
        if item["kind"] == "vlan" and item["link"] in out:
            item["link_uuid"] = out[item["link"]]["uuid"]
            item["link_name"] = out[item["link"]]["name"]
        if item["kind"] == "ethernet" and item["bond"]:
            item["bond_uuid"] = out[item["bond"]]["uuid"]
    return list(out.values())


def link_id(hw: Any, bonds: list[Mapping[str, Any]], ref: Any) -> str | None:
    for bond in bonds:
        if bond.get("name") == ref:
            return str(ref)
    for nic in hw.nics:
        if ref is not None and refers(nic, ref):
            return nic_id(nic)
    return None


def vlan_name(vlan: Mapping[str, Any], parent: Mapping[str, Any] | None) -> str:
    """A VLAN's kernel name: its own, else ``<parent>.<id>`` where that fits in 15
    characters, else ``vlan<id>``."""
    if vlan.get("name"):
        return str(vlan["name"])
    if parent and parent.get("name") and len(f"{parent['name']}.{vlan['id']}") <= 15:
        return f"{parent['name']}.{vlan['id']}"
    return f"vlan{vlan['id']}"


def ipoib_interfaces(ports: Iterable[Mapping[str, Any]], host_name: str) -> list[dict]:
    """IPoIB interfaces in the same model, for the declared IB ports on a network whose
    netdev the node has (``netdev`` read from the node; ``addresses`` in CIDR form,
    as infiniband's derived ``infiniband_ipoib_ports`` give them)."""
    out = []
    for port in ports:
        if not port.get("netdev") or not port.get("network"):
            continue
        ident = port["netdev"]
        out.append(
            {
                "id": ident,
                "kind": "ipoib",
                "name": port["netdev"],
                "mac": None,
                "network": port["network"],
                "addresses": list(port.get("addresses") or []),
                "mtu": int(port["mtu"]),
                "bond": None,
                "vlans": [],
                "ipoib_mode": port["mode"],
                "uuid": _connection_uuid(host_name, ident),
            }
        )
    return out


def renderer(chosen: str, distribution: str, os_renderer: str,
             distribution_renderer: Mapping[str, str] | None) -> str:
    """The renderer: the inventory's ``network_renderer``, else the distribution's
    (netplan on Ubuntu), else the OS family's (networkd on Debian, NetworkManager on
    Rocky/RHEL)."""
    if chosen:
        return chosen
    return (distribution_renderer or {}).get(distribution) or os_renderer


def render_files(
    items: list[dict], renderer_name: str, netplan_file: str = NETPLAN_FILE,
    prefix: str = PREFIX,
) -> list[dict]:
    """The files a renderer writes for ``items``: ``[{dest, template, interface,
    mode}]`` (``interface`` None for netplan's one file of every interface)."""
    out = []
    if not items:
        return out
    if renderer_name == "netplan":
        return [{"dest": netplan_file, "template": "netplan.yaml.j2", "interface": None,
                 "mode": "600"}]
    for item in items:
        if renderer_name == "networkd":
            if item["kind"] in ("bond", "vlan"):
                out.append({"dest": f"{NETWORKD_DIR}/{prefix}{item['id']}.netdev",
                            "template": "networkd.netdev.j2", "interface": item,
                            "mode": "644"})
            out.append({"dest": f"{NETWORKD_DIR}/{prefix}{item['id']}.network",
                        "template": "networkd.network.j2", "interface": item, "mode": "644"})
        elif renderer_name == "networkmanager":
            out.append({"dest": f"{NM_DIR}/{prefix}{item['id']}.nmconnection",
                        "template": "networkmanager.nmconnection.j2", "interface": item,
                        "mode": "600"})
        else:
            raise ValueError(f"unknown network renderer {renderer_name!r}")
    return out


def file_glob(renderer_name: str, kind: str = "") -> str:
    """Our files of a renderer (to find ones the model no longer has)."""
    if renderer_name == "netplan":
        return f"{NETPLAN_DIR}/60-aicluster{kind}.yaml"
    if renderer_name == "networkd":
        return f"{NETWORKD_DIR}/{PREFIX}*"
    return f"{NM_DIR}/{PREFIX}*.nmconnection"


def apply_commands(renderer_name: str, items: list[dict]) -> list[str]:
    """What applies written files: ``networkctl reload`` and ``reconfigure`` of the
    links; for netplan, ``netplan generate`` (its networkd files, the renderer our file
    leaves to the default) then the same, never ``netplan apply``, which reconfigures
    every interface, the management one included; or ``nmcli connection reload`` and
    ``up`` of each."""
    names = [i["name"] for i in items if i.get("name")]
    if renderer_name == "netplan":
        return ["netplan generate", *apply_commands("networkd", items)]
    if renderer_name == "networkd":
        cmds = ["networkctl reload"]
        if names:
            cmds.append(
                "for i in " + " ".join(shlex.quote(n) for n in names)
                + "; do if [ -e /sys/class/net/$i ]; then networkctl reconfigure $i; fi; done"
            )
        macs = [i["mac"] for i in items if not i.get("name") and i.get("mac")]
        if macs:
            cmds.append(
                "for m in " + " ".join(macs) + "; do for d in /sys/class/net/*; do "
                "[ \"$(cat $d/address)\" = \"$m\" ] && networkctl reconfigure ${d##*/}; "
                "done; done; true"
            )
        return cmds
    return ["nmcli connection reload"] + [
        f"nmcli connection up uuid {i['uuid']}" for i in items if not i.get("bond")
    ]


def rollback_commands(renderer_name: str, paths: list[str], items: list[dict],
                      seconds: int) -> tuple[list[str], str]:
    """(commands that save the current files and arm a timer restoring them in
    ``seconds``, the command that confirms the change and disarms it)."""
    saved = " ".join(shlex.quote(p) for p in paths)
    restore = "; ".join(
        [
            f"rm -f {saved}",
            f"tar -C / -xf {ROLLBACK_DIR}/saved.tar",
            *apply_commands(renderer_name, items),
        ]
    )
    arm = [
        f"rm -rf {ROLLBACK_DIR} && mkdir -p {ROLLBACK_DIR}",
        f"cd / && tar -cf {ROLLBACK_DIR}/saved.tar --ignore-failed-read "
        + " ".join(shlex.quote(p.lstrip("/")) for p in paths) + " 2>/dev/null || true",
        f"systemctl stop {ROLLBACK_UNIT}.timer 2>/dev/null || true",
        f"systemd-run --unit={ROLLBACK_UNIT} --on-active={int(seconds)}s "
        f"/bin/sh -c {shlex.quote(restore)}",
    ]
    confirm = f"systemctl stop {ROLLBACK_UNIT}.timer && rm -rf {ROLLBACK_DIR}"
    return arm, confirm


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


def distribution_name(distribution: Mapping[str, Any] | None) -> str:
    """The distribution as Ansible names it (``ansible_distribution``): Ubuntu, Debian,
    Rocky ..."""
    meta = (distribution or {}).get("release_meta") or {}
    ident = str(meta.get("ID", "")).lower()
    return {"ubuntu": "Ubuntu", "debian": "Debian", "rocky": "Rocky", "almalinux": "AlmaLinux",
            "rhel": "RedHat", "centos": "CentOS"}.get(ident, str((distribution or {}).get("name")))


def sha1_text(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()

