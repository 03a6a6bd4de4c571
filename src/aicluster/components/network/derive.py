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
from aicluster.inventory import Cluster

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
    missing = [nic.get("name") or str(nic.get("mac")).lower() for nic in declared
               if find_interface(nic, found) is None]
    if not missing:
        return None
    return (
        f"network: host {host_name!r}: the inventory declares {len(declared)} NIC(s) "
        f"(hardware.nics), the node has {len(declared) - len(missing)} of them; not found: "
        f"{', '.join(missing)}. Fix the names or MACs in the inventory (the node has: "
        f"{', '.join(sorted(f['name'] + ' ' + f['mac'] for f in found)) or 'none'})."
    )


def find_interface(item: Mapping[str, Any],
                   found: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The node's interface (:func:`~aicluster.components.network.probe.parse_interfaces`)
    a model or declared interface is: by MAC where one is given (the physical interface
    with it first: a bond, its VLANs and its members share one MAC), else by name, as
    :func:`missing_nics` matches them."""
    if item.get("mac"):
        mac = str(item["mac"]).lower()
        hits = sorted((f for f in found if str(f["mac"]).lower() == mac),
                      key=lambda f: f.get("kind") is not None)
    else:
        hits = [f for f in found if f["name"] == item.get("name")]
    return hits[0] if hits else None


def mtu_drift(items: Iterable[Mapping[str, Any]],
              found: Iterable[Mapping[str, Any]]) -> list[str]:
    """The model interfaces whose live MTU is not the configured one (set by hand with
    ``ip link``, or a link that came up before its configuration), as ``name: MTU live,
    configured wanted``: the files are as wanted, but the configuration must be applied
    again."""
    found = list(found)
    out = []
    for item in items:
        want = item.get("mtu")
        live = find_interface(item, found)
        if want and live and live.get("mtu") and live["mtu"] != want:
            out.append(f"{live['name']}: MTU {live['mtu']} live, configured {want}")
    return out


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
    if address is None or network is None:
        return errors
    addr = ipaddress.ip_address(str(address))
    subnet = cluster.spec.networks[network].subnet
    if addr not in subnet:
        errors.append(f"{where}: {fld}.address: {addr} is outside the {network} network "
                      f"{subnet}")
    elif subnet.version == 4 and subnet.prefixlen < 31 \
            and addr in (subnet.network_address, subnet.broadcast_address):
        which = "network" if addr == subnet.network_address else "broadcast"
        errors.append(f"{where}: {fld}.address: {addr} is the {which} address of the "
                      f"{network} network {subnet}, not a host's; give an address between them")
    if str(addr) in seen:
        errors.append(f"{where}: {fld}.address: address {addr} is also used by "
                      f"{seen[str(addr)]}")
    seen[str(addr)] = f"{where} ({fld}.address)"
    return errors


def validate(cluster: Cluster) -> list[str]:
    """network's checks that need the whole inventory (host and field named): the NICs,
    networks and addresses bonds and VLANs refer to. The type and shape of each setting
    is network's settings model's (aicluster.components.network.model)."""
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
    allow = v["network_allow_management_change"]
    for i, nic in enumerate(hw.nics):
        if nic.network == "management" and not allow:
            errors.append(
                f"{where}: hardware.nics[{i}].network: the management network carries the "
                "deploy's own connection; aicluster configures it only with "
                "network_allow_management_change: true"
            )
        elif nic.address is not None and str(nic.address) == h.address and not allow:
            errors.append(
                f"{where}: hardware.nics[{i}].address: {nic.address} is the host's "
                "ssh_hostname (the management interface); aicluster configures it only with "
                "network_allow_management_change: true"
            )
    bonds = v["network_bonds"]
    vlans = v["network_vlans"]
    nic_names = {nic.name for nic in hw.nics if nic.name}
    bond_names: list[str] = []
    used: dict[str, str] = {}
    for i, bond in enumerate(bonds):
        fld = f"network_bonds[{i}]"
        bname = bond["name"]
        if bname in nic_names or bname in bond_names:
            errors.append(f"{where}: {fld}.name: {bname} is already the name of another "
                          "interface of this host")
        else:
            bond_names.append(bname)
        for j, ref in enumerate(bond["members"]):
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
        errors += _check_address(cluster, where, fld, bond.get("network"), bond.get("address"),
                                 seen)
    links = set(bond_names)
    links |= {n.name for n in hw.nics if n.name} | {n.mac for n in hw.nics if n.mac}
    vlan_keys: dict[tuple[str, int], int] = {}
    for i, vlan in enumerate(vlans):
        fld = f"network_vlans[{i}]"
        vid = vlan["id"]
        link = vlan["link"]
        if str(link).lower() not in {str(x).lower() for x in links}:
            errors.append(f"{where}: {fld}.link: {link!r} is not a NIC (name or MAC) or bond "
                          "of this host")
        else:
            key = (str(link).lower(), vid)
            if key in vlan_keys:
                errors.append(f"{where}: {fld}.id: VLAN {vid} on {link} is already "
                              f"network_vlans[{vlan_keys[key]}]")
            vlan_keys[key] = i
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

