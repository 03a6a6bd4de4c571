"""The network component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from aicluster.common.netconf import interfaces, link_id, nic_id, refers, vlan_name
from aicluster.common.settings import layered
from aicluster.components.network.probe import INTERFACES_COMMAND, management_command
from aicluster.inventory import IFNAME_RE, MTU_LIMITS, Cluster

RENDERERS = ("netplan", "networkd", "networkmanager")
#: Linux bonding modes and transmit hash policies (kernel names).
BOND_MODES = (
    "balance-rr", "active-backup", "balance-xor", "broadcast", "802.3ad", "balance-tlb",
    "balance-alb",
)
BOND_HASHES = ("layer2", "layer2+3", "layer3+4", "encap2+3", "encap3+4", "vlan+srcmac")
BOND_FIELDS = frozenset({"name", "members", "network", "address", "mtu", "mode", "hash",
                         "miimon", "lacp_rate"})
VLAN_FIELDS = frozenset({"id", "link", "name", "network", "address", "mtu"})
TUNING_UNIT = "/etc/systemd/system/aicluster-nic-tuning.service"
TUNING_SCRIPT = "/usr/local/sbin/aicluster-nic-tuning"


def touches(items: Iterable[Mapping[str, Any]], mgmt: Mapping[str, Any] | None) -> list[str]:
    """The ids of model interfaces that would change the management interface: it,
    a bond it is a member of, a VLAN on it."""
    if not mgmt:
        return []
    items = list(items)
    hit = {
        i["id"] for i in items
        if (i.get("name") and i["name"] == mgmt.get("name"))
        or (i.get("mac") and mgmt.get("mac") and i["mac"] == mgmt["mac"])
    }
    hit |= {i["bond"] for i in items if i["id"] in hit and i.get("bond")}
    hit |= {i["id"] for i in items if i.get("link") in hit}
    return sorted(hit)


def management_refusal(host_name: str, mgmt: Mapping[str, Any], ids: list[str]) -> str:
    return (
        f"network: host {host_name!r}: the configuration would change {', '.join(ids)}, "
        f"which carries the management interface {mgmt['name']} "
        f"({mgmt.get('mac') or 'MAC unknown'}, the address this deploy connects to); "
        "refused. Set network_allow_management_change: true for this host to apply it "
        "under an automatic rollback."
    )


def missing_nics(declared: list[Mapping[str, Any]], host_name: str,
                 found: list[Mapping[str, Any]]) -> str | None:
    """Why the deploy stops when the node lacks NICs the inventory declares
    (``hardware.nics`` entries, matched by MAC where given, else by name); None when
    it has them all."""
    names = {f["name"] for f in found}
    macs = {str(f["mac"]).lower() for f in found}
    missing = []
    for nic in declared:
        mac = str(nic.get("mac") or "").lower()
        name = nic.get("name")
        if not ((mac and mac in macs) or (not mac and name in names)):
            missing.append(name or mac)
    if not missing:
        return None
    return (
        f"network: host {host_name!r}: the inventory declares {len(declared)} NIC(s) "
        f"(hardware.nics), the node has {len(declared) - len(missing)} of them; not found: "
        f"{', '.join(missing)}. Fix the names or MACs in the inventory (the node has: "
        f"{', '.join(sorted(f['name'] + ' ' + f['mac'] for f in found)) or 'none'})."
    )


def tuning_targets(items: list[dict], v: Mapping[str, Any]) -> list[dict]:
    """The NICs whose ring buffers the tuning unit raises (>= network_tuning_min_speed_gbps)."""
    if not v["network_nic_tuning"]:
        return []
    return [
        i for i in items
        if i["kind"] == "ethernet" and i.get("speed_gbps", 0) >= v["network_tuning_min_speed_gbps"]
    ]


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    items = interfaces(cluster, host_name, data)
    v = layered("network", data)
    return {
        "network_interfaces": items,
        # The interfaces a file renders: these, or infiniband's IPoIB interfaces.
        "network_render_interfaces": items,
        "network_tuning_interfaces": tuning_targets(items, v),
        "network_ssh_address": cluster.hosts[host_name].address,
        "network_interfaces_command": INTERFACES_COMMAND,
        "network_management_command": management_command(cluster.hosts[host_name].address),
    }


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _check_address(cluster: Cluster, where: str, fld: str, network: Any, address: Any,
                   seen: dict[str, str]) -> list[str]:
    errors = []
    if network is not None and network not in cluster.spec.networks:
        errors.append(f"{where}: {fld}.network: unknown network {network!r}; declared: "
                      f"{', '.join(cluster.spec.networks)}")
        return errors
    if address is None:
        return errors
    if network is None:
        return [f"{where}: {fld}.address: an address needs a network"]
    try:
        addr = ipaddress.ip_address(str(address))
    except ValueError:
        return [f"{where}: {fld}.address: {address!r} is not an IP address"]
    subnet = cluster.spec.networks[network].subnet
    if addr not in subnet:
        errors.append(f"{where}: {fld}.address: {addr} is outside the {network} network "
                      f"{subnet}")
    if str(addr) in seen:
        errors.append(f"{where}: {fld}.address: address {addr} is also used by "
                      f"{seen[str(addr)]}")
    seen[str(addr)] = f"{where} ({fld}.address)"
    return errors


def _check_mtu(where: str, fld: str, mtu: Any) -> list[str]:
    if mtu is None:
        return []
    low, high = MTU_LIMITS["ethernet"]
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not low <= mtu <= high:
        return [f"{where}: {fld}.mtu: {mtu!r} is out of range for Ethernet ({low}-{high})"]
    return []


def validate(cluster: Cluster) -> list[str]:
    """network's own checks of the inventory (host and field named)."""
    errors: list[str] = []
    seen: dict[str, str] = {}
    for name, h in cluster.hosts.items():
        for nic in h.spec.hardware.nics:
            if nic.address is not None:
                seen[str(nic.address)] = f"host {name!r} (hardware.nics)"
        for port in h.spec.hardware.ib_ports:
            if port.address is not None:
                seen[str(port.address)] = f"host {name!r} (hardware.ib_ports)"
        seen[h.address] = f"host {name!r} (ssh_hostname)"
    for name, h in cluster.hosts.items():
        errors += _validate_host(cluster, name, h, seen)
    return errors


def _validate_host(cluster: Cluster, name: str, h: Any, seen: dict[str, str]) -> list[str]:
    v = layered("network", h.data)
    where = f"host {name!r}"
    errors: list[str] = []
    hw = h.spec.hardware
    if v["network_renderer"] and v["network_renderer"] not in RENDERERS:
        errors.append(f"{where}: network_renderer: {v['network_renderer']!r} is not one of "
                      f"{', '.join(RENDERERS)} (or empty: by distribution)")
    allow = v["network_allow_management_change"]
    if not isinstance(allow, bool):
        errors.append(f"{where}: network_allow_management_change: must be true or false")
    seconds = v["network_rollback_seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 30 <= seconds <= 3600:
        errors.append(f"{where}: network_rollback_seconds: {seconds!r} is not a number of "
                      "seconds between 30 and 3600")
    default_mtu = v["network_default_mtu"]
    if not isinstance(default_mtu, Mapping):
        errors.append(f"{where}: network_default_mtu: must be a mapping of network to MTU")
    else:
        for net, mtu in default_mtu.items():
            errors += _check_mtu(where, f"network_default_mtu.{net}", mtu)
    for key in ("network_nic_tuning",):
        if not isinstance(v[key], bool):
            errors.append(f"{where}: {key}: must be true or false")
    for key in ("network_ring_rx", "network_ring_tx", "network_tuning_min_speed_gbps"):
        if isinstance(v[key], bool) or not isinstance(v[key], int) or v[key] < 1:
            errors.append(f"{where}: {key}: {v[key]!r} is not a positive whole number")
    for i, nic in enumerate(hw.nics):
        if nic.network == "management" and allow is not True:
            errors.append(
                f"{where}: hardware.nics[{i}].network: the management network carries the "
                "deploy's own connection; aicluster configures it only with "
                "network_allow_management_change: true"
            )
        elif nic.address is not None and str(nic.address) == h.address and allow is not True:
            errors.append(
                f"{where}: hardware.nics[{i}].address: {nic.address} is the host's "
                "ssh_hostname (the management interface); aicluster configures it only with "
                "network_allow_management_change: true"
            )
    bonds = v["network_bonds"]
    vlans = v["network_vlans"]
    if not isinstance(bonds, list):
        errors.append(f"{where}: network_bonds: must be a list of bonds")
        bonds = []
    if not isinstance(vlans, list):
        errors.append(f"{where}: network_vlans: must be a list of VLANs")
        vlans = []
    nic_names = {nic.name for nic in hw.nics if nic.name}
    bond_names: list[str] = []
    used: dict[str, str] = {}
    for i, bond in enumerate(bonds):
        fld = f"network_bonds[{i}]"
        if not isinstance(bond, Mapping):
            errors.append(f"{where}: {fld}: must be a mapping (name, members, network, ...)")
            continue
        unknown = set(bond) - BOND_FIELDS
        if unknown:
            errors.append(f"{where}: {fld}: unknown field(s) {', '.join(sorted(unknown))}")
        bname = bond.get("name")
        if not isinstance(bname, str) or not IFNAME_RE.match(bname):
            errors.append(f"{where}: {fld}.name: {bname!r} is not an interface name "
                          "(1-15 characters)")
        elif bname in nic_names or bname in bond_names:
            errors.append(f"{where}: {fld}.name: {bname} is already the name of another "
                          "interface of this host")
        else:
            bond_names.append(bname)
        members = bond.get("members")
        if not isinstance(members, list) or not members:
            errors.append(f"{where}: {fld}.members: give the bond's NICs, by name or MAC")
            members = []
        for j, ref in enumerate(members):
            nics = [(k, n) for k, n in enumerate(hw.nics) if refers(n, str(ref))]
            if not nics:
                errors.append(f"{where}: {fld}.members[{j}]: {ref!r} is not a NIC of this host "
                              "(hardware.nics, by name or MAC)")
                continue
            k, nic = nics[0]
            ident = nic_id(nic)
            if ident in used:
                errors.append(f"{where}: {fld}.members[{j}]: {ref} is already a member of "
                              f"{used[ident]}")
            used[ident] = str(bname)
            if nic.address is not None:
                errors.append(f"{where}: hardware.nics[{k}].address: {nic.address} is on a "
                              f"member of bond {bname}; give the address to the bond")
        mode = bond.get("mode", "802.3ad")
        if mode not in BOND_MODES:
            errors.append(f"{where}: {fld}.mode: {mode!r} is not a bonding mode "
                          f"({', '.join(BOND_MODES)})")
        hash_ = bond.get("hash", "layer3+4")
        if hash_ not in BOND_HASHES:
            errors.append(f"{where}: {fld}.hash: {hash_!r} is not a transmit hash policy "
                          f"({', '.join(BOND_HASHES)})")
        miimon = bond.get("miimon", 100)
        if isinstance(miimon, bool) or not isinstance(miimon, int) or not 0 < miimon <= 10000:
            errors.append(f"{where}: {fld}.miimon: {miimon!r} is not a link check interval "
                          "in milliseconds (1-10000)")
        if bond.get("lacp_rate", "fast") not in ("fast", "slow"):
            errors.append(f"{where}: {fld}.lacp_rate: {bond.get('lacp_rate')!r} is not fast "
                          "or slow")
        errors += _check_mtu(where, fld, bond.get("mtu"))
        errors += _check_address(cluster, where, fld, bond.get("network"), bond.get("address"),
                                 seen)
    links = set(bond_names)
    links |= {n.name for n in hw.nics if n.name} | {n.mac for n in hw.nics if n.mac}
    vlan_keys: dict[tuple[str, int], int] = {}
    for i, vlan in enumerate(vlans):
        fld = f"network_vlans[{i}]"
        if not isinstance(vlan, Mapping):
            errors.append(f"{where}: {fld}: must be a mapping (id, link, network, ...)")
            continue
        unknown = set(vlan) - VLAN_FIELDS
        if unknown:
            errors.append(f"{where}: {fld}: unknown field(s) {', '.join(sorted(unknown))}")
        vid = vlan.get("id")
        if isinstance(vid, bool) or not isinstance(vid, int) or not 1 <= vid <= 4094:
            errors.append(f"{where}: {fld}.id: {vid!r} is not a VLAN id (1-4094)")
        link = vlan.get("link")
        if str(link).lower() not in {str(x).lower() for x in links}:
            errors.append(f"{where}: {fld}.link: {link!r} is not a NIC (name or MAC) or bond "
                          "of this host")
        elif isinstance(vid, int):
            key = (str(link).lower(), vid)
            if key in vlan_keys:
                errors.append(f"{where}: {fld}.id: VLAN {vid} on {link} is already "
                              f"network_vlans[{vlan_keys[key]}]")
            vlan_keys[key] = i
        vname = vlan.get("name")
        if vname is not None and (not isinstance(vname, str) or not IFNAME_RE.match(vname)):
            errors.append(f"{where}: {fld}.name: {vname!r} is not an interface name "
                          "(1-15 characters)")
        errors += _check_mtu(where, fld, vlan.get("mtu"))
        errors += _check_address(cluster, where, fld, vlan.get("network"), vlan.get("address"),
                                 seen)
    if not errors and hw.nics:
        # A VLAN or bond MTU above its parent's fails at the kernel: say so now.
        items = {i["id"]: i for i in interfaces(cluster, name, h.data)}
        for i, vlan in enumerate(vlans):
            ident = vlan_name(vlan, items.get(link_id(hw, bonds, vlan.get("link")) or ""))
            parent = items.get(items[ident]["link"] or "")
            if parent and items[ident]["mtu"] > parent["mtu"]:
                errors.append(f"{where}: network_vlans[{i}].mtu: {items[ident]['mtu']} is "
                              f"above the MTU of its link {parent['id']} ({parent['mtu']})")
    return errors

