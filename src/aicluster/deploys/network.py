"""network: the cluster NICs, LACP bonds, VLANs (and, for infiniband, IPoIB) from one
data model, rendered for netplan (Ubuntu), systemd-networkd (Debian) or
NetworkManager keyfiles (Rocky/RHEL).

Defaults: roles/network/defaults/main.yml. Templates: roles/network/templates/.

The model (:func:`interfaces`) is computed once from the inventory: each NIC of
``hardware.nics`` (matched by MAC or name) with its static address on its network and
its MTU, the bonds of ``network_bonds`` and the VLANs of ``network_vlans``. The
renderers (:func:`render_files`) turn it into files; the Ansible role reaches the same
functions through its filter plugin. The management interface (the one holding the
address the deploy connects to) is never changed unless the inventory says
``network_allow_management_change: true``; then the change is applied under a
rollback timer that restores the previous configuration unless the deploy reaches
the node again and confirms.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex
import uuid
from collections.abc import Iterable, Mapping
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha1File
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, server, systemd

from aicluster.deploys import (
    current_cluster,
    install_packages,
    layered,
    os_family,
    put_template,
)
from aicluster.facts.network import (
    INTERFACES_COMMAND,
    ManagementInterface,
    NetworkInterfaces,
    management_command,
)
from aicluster.facts.system import GlobPaths
from aicluster.inventory import IFNAME_RE, MTU_LIMITS, Cluster
from aicluster.render import defaults, os_vars, render

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

#: Where each renderer keeps its files, the prefix of ours, and the mode they need.
NETWORKD_DIR = "/etc/systemd/network"
NETPLAN_DIR = "/etc/netplan"
NM_DIR = "/etc/NetworkManager/system-connections"
PREFIX = "60-aicluster-"
NETPLAN_FILE = f"{NETPLAN_DIR}/60-aicluster.yaml"
ROLLBACK_UNIT = "aicluster-network-rollback"
ROLLBACK_DIR = "/var/lib/aicluster/network-rollback"
TUNING_UNIT = "/etc/systemd/system/aicluster-nic-tuning.service"
TUNING_SCRIPT = "/usr/local/sbin/aicluster-nic-tuning"


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


def _nic_id(nic: Any) -> str:
    return nic.name or "nic" + nic.mac.replace(":", "")[-6:]


def _connection_uuid(host_name: str, ident: str) -> str:
    """A stable NetworkManager connection UUID per host and interface."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"aicluster:{host_name}:{ident}"))


def _refers(nic: Any, ref: str) -> bool:
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
                if _refers(nic, ref):
                    member_of[_nic_id(nic)] = bond["name"]
    bond_mtu = {
        b["name"]: _mtu(cluster, v, b.get("network"), b.get("mtu")) for b in bonds
    }
    for nic in hw.nics:
        ident = _nic_id(nic)
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
            _nic_id(nic) for ref in bond.get("members") or [] for nic in hw.nics
            if _refers(nic, ref)
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
        parent = _link_id(hw, bonds, vlan.get("link"))
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


def _link_id(hw: Any, bonds: list[Mapping[str, Any]], ref: Any) -> str | None:
    for bond in bonds:
        if bond.get("name") == ref:
            return str(ref)
    for nic in hw.nics:
        if ref is not None and _refers(nic, ref):
            return _nic_id(nic)
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
    links, ``netplan apply``, or ``nmcli connection reload`` and ``up`` of each."""
    names = [i["name"] for i in items if i.get("name")]
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
    if renderer_name == "netplan":
        return ["netplan generate", "netplan apply"]
    return ["nmcli connection reload"] + [
        f"nmcli connection up uuid {i['uuid']}" for i in items if not i.get("bond")
    ]


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
            nics = [(k, n) for k, n in enumerate(hw.nics) if _refers(n, str(ref))]
            if not nics:
                errors.append(f"{where}: {fld}.members[{j}]: {ref!r} is not a NIC of this host "
                              "(hardware.nics, by name or MAC)")
                continue
            k, nic = nics[0]
            ident = _nic_id(nic)
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
            ident = vlan_name(vlan, items.get(_link_id(hw, bonds, vlan.get("link")) or ""))
            parent = items.get(items[ident]["link"] or "")
            if parent and items[ident]["mtu"] > parent["mtu"]:
                errors.append(f"{where}: network_vlans[{i}].mtu: {items[ident]['mtu']} is "
                              f"above the MTU of its link {parent['id']} ({parent['mtu']})")
    return errors


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


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def write_config(
    component: str,
    items: list[dict],
    v: Mapping[str, Any],
    renderer_name: str,
    *,
    label: str,
    netplan_file: str = NETPLAN_FILE,
    prefix: str = PREFIX,
    glob: str | None = None,
    keep: Iterable[str] = (),
    mgmt: Mapping[str, Any] | None = None,
) -> None:
    """Write ``items`` in ``renderer_name``'s format, remove our files the model no
    longer has, apply only when something changed. ``mgmt`` set: the change touches
    the management interface and is applied under a rollback timer."""
    wanted = []
    for f in render_files(items, renderer_name, netplan_file, prefix):
        text = render("network", f["template"], {**v, "network_render_interfaces": items,
                                                 "network_interface": f["interface"]})
        wanted.append((f, text))
    pattern = glob or file_glob(renderer_name)
    present = host.get_fact(GlobPaths, pattern=pattern) or []
    keep = set(keep) | {f["dest"] for f, _ in wanted}
    stale = [p for p in present if p not in keep]
    differs = [
        f["dest"] for f, text in wanted if host.get_fact(Sha1File, path=f["dest"]) != _sha1(text)
    ]
    if not differs and not stale:
        host.noop(f"{label}: the configuration is as wanted ({renderer_name})")
        return
    confirm = None
    if mgmt is not None:
        arm, confirm = rollback_commands(
            renderer_name, [f["dest"] for f, _ in wanted] + stale, items,
            v["network_rollback_seconds"],
        )
        server.shell(
            name=f"Arm the network rollback ({v['network_rollback_seconds']} s): the "
            f"management interface {mgmt['name']} changes",
            commands=arm,
        )
    for f, text in wanted:
        files.put(
            name=f"{label}: write {f['dest']}",
            src=StringIO(text),
            dest=f["dest"],
            mode=f["mode"],
            user="root",
            group="root",
        )
    for path in stale:
        files.file(name=f"{label}: remove {path} (no longer in the inventory)", path=path,
                   present=False)
    server.shell(
        name=f"{label}: apply the changed configuration ({renderer_name})",
        commands=apply_commands(renderer_name, items),
    )
    if confirm:
        server.shell(
            name="The node answers after the change: confirm it (disarm the rollback)",
            commands=[confirm],
        )


@deploy("network", data_defaults=defaults("network"))
def deploy() -> None:
    cluster = current_cluster()
    distribution = host.get_fact(LinuxDistribution)
    family = os_family(distribution)
    data = host.data.dict()
    v = {**layered("network", data), **os_vars("network", family),
         **derived_vars(cluster, host.name, data)}
    v["inventory_hostname"] = host.name
    items = v["network_interfaces"]
    chosen = renderer(v["network_renderer"], distribution_name(distribution),
                      v["network_os_renderer"], v["network_distribution_renderer"])

    found = host.get_fact(NetworkInterfaces) or []
    declared = [n.model_dump(include={"name", "mac"})
                for n in cluster.hosts[host.name].spec.hardware.nics]
    problem = missing_nics(declared, host.name, found)
    if problem:
        raise DeployError(problem)
    mgmt = host.get_fact(ManagementInterface, address=v["network_ssh_address"])
    hit = touches(items, mgmt)
    if hit and not v["network_allow_management_change"]:
        raise DeployError(management_refusal(host.name, mgmt, hit))

    install_packages(f"Install the network tools ({chosen})",
                     v["network_packages"][chosen], family)
    service = {"networkd": "systemd-networkd", "netplan": None,
               "networkmanager": "NetworkManager"}[chosen]
    if service and items:
        systemd.service(name=f"{service} running and enabled", service=service,
                        running=True, enabled=True)
    if not items:
        host.noop("network: the inventory declares no cluster NIC, bond or VLAN for this host")
    write_config("network", items, v, chosen, label="Cluster network",
                 mgmt=mgmt if hit else None)
    _tuning(v)


def _tuning(v: dict[str, Any]) -> None:
    if not v["network_tuning_interfaces"]:
        files.file(name="No NIC tuning unit", path=TUNING_UNIT, present=False)
        files.file(name="No NIC tuning script", path=TUNING_SCRIPT, present=False)
        return
    script = put_template("network", "aicluster-nic-tuning.j2", TUNING_SCRIPT, v,
                          name="NIC tuning script (ring buffers)", mode="755")
    unit = put_template("network", "aicluster-nic-tuning.service.j2", TUNING_UNIT, v,
                        name="NIC tuning unit")
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    systemd.service(name="Apply the NIC tuning now (it changed)",
                    service="aicluster-nic-tuning", restarted=True,
                    _if=lambda: script.did_change() or unit.did_change())
    systemd.service(name="NIC tuning enabled", service="aicluster-nic-tuning", enabled=True)
