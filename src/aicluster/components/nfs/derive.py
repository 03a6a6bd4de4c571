"""The nfs component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from aicluster.common.mounts import fstab_python_regexp, fstab_regexp, mount_command
from aicluster.common.networks import host_address, pick_network
from aicluster.common.settings import layered
from aicluster.components.nfs.probe import KERNEL_COMMAND
from aicluster.inventory import NETWORK_NAMES, Cluster

EXPORTS_FILE = "/etc/exports.d/aicluster.exports"
NFS_CONF_FILE = "/etc/nfs.conf.d/aicluster-nfs.conf"
GANESHA_CONF = "/etc/ganesha/ganesha.conf"
#: Units that mount rpc_pipefs (Debian and Ubuntu name it after /run/rpc_pipefs,
#: Rocky after /var/lib/nfs/rpc_pipefs): masked where the kernel has no rpc_pipefs, so
#: they do not fail at every boot and take the NFS daemons with them.
RPC_PIPEFS_UNITS = ("run-rpc_pipefs.mount", "var-lib-nfs-rpc_pipefs.mount")


# ---------------------------------------------------------------------------
# Values computed from the inventory (both engines use these)
# ---------------------------------------------------------------------------


def server_host(cluster: Cluster) -> str | None:
    servers = cluster.group("nfs_server")
    return servers[0] if servers else None


def nfs_network(cluster: Cluster) -> str:
    """The network clients reach the server on: ``nfs_network`` (the server's data), or
    storage where the server has an address, else fabric, else management."""
    name = server_host(cluster)
    if name is None:
        return "management"
    return pick_network(cluster, layered("nfs", cluster.hosts[name].data)["nfs_network"],
                        [name], ("storage", "fabric"))


def server_address(cluster: Cluster) -> str | None:
    name = server_host(cluster)
    if name is None:
        return None
    return host_address(cluster, name, nfs_network(cluster)) or cluster.hosts[name].address


def _option_map(options: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for option in options:
        key, sep, value = option.partition("=")
        out[key] = value if sep else None
    return out


def _cidrs(cluster: Cluster, networks: list[str]) -> list[str]:
    out = []
    for n in networks:
        if n in cluster.spec.networks:
            cidr = str(cluster.spec.networks[n].subnet)
        else:
            cidr = str(ipaddress.ip_network(n, strict=False))
        if cidr not in out:
            out.append(cidr)
    return out


def export_id(entry: Mapping[str, Any], index: int) -> int:
    """An export's nfs-ganesha Export_Id: its own, else its position (from 1)."""
    return int(entry.get("export_id") or index + 1)


def export_list(cluster: Cluster, data: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The server's exports, every default filled in, as the templates use them (from
    ``data``, the server's own, when given)."""
    name = server_host(cluster)
    if name is None:
        return []
    v = layered("nfs", cluster.hosts[name].data if data is None else data)
    out = []
    for i, entry in enumerate(v["nfs_exports"] or []):
        options = list(entry.get("options") or v["nfs_export_default_options"])
        opts = _option_map(options)
        if "all_squash" in opts:
            squash = "All_Squash"
        elif "no_root_squash" in opts:
            squash = "No_Root_Squash"
        else:
            squash = "Root_Squash"
        networks = entry.get("networks") or list(cluster.spec.networks)
        path = str(entry["path"]).rstrip("/")
        out.append({
            "path": path,
            "pseudo": path,
            "export_id": export_id(entry, i),
            "networks": _cidrs(cluster, list(networks)),
            "options": ",".join(options),
            # exports(5): each network with the options, as the kernel's exports line.
            "clients": " ".join(f"{cidr}({','.join(options)})"
                                for cidr in _cidrs(cluster, list(networks))),
            "access_type": "RO" if "ro" in opts else "RW",
            "squash": squash,
            # Squashed users: the kernel's default (65534, nobody) unless the options
            # say (ganesha's own default would be 4294967294).
            "anonuid": opts.get("anonuid") or "65534",
            "anongid": opts.get("anongid") or "65534",
            "owner": entry.get("owner", "root"),
            "group": entry.get("group", entry.get("owner", "root")),
            "mode": str(entry.get("mode", "0755")),
        })
    return out


def thread_count(cluster: Cluster, data: Mapping[str, Any]) -> int:
    """nfsd threads: ``nfs_server_threads``, or max(8, 4 x the number of clients)."""
    chosen = layered("nfs", data)["nfs_server_threads"]
    if chosen:
        return int(chosen)
    return max(8, 4 * len(cluster.group("nfs_clients")))


def nfs_conf_sections(cluster: Cluster, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The kernel server's nfs.conf drop-in: ours merged with ``nfs_server_config``."""
    v = layered("nfs", data)
    merged: dict[str, dict[str, Any]] = {
        "nfsd": {"threads": thread_count(cluster, data), "vers3": "y", "vers4": "y",
                 "vers4.1": "y", "vers4.2": "y"},
    }
    for section, settings in (v["nfs_server_config"] or {}).items():
        target = merged.setdefault(str(section), {})
        for key, value in (settings or {}).items():
            if value is None:
                target.pop(str(key), None)
            else:
                target[str(key)] = value
    return [
        {"name": section, "settings": [[k, _conf_value(val)] for k, val in settings.items()]}
        for section, settings in merged.items() if settings
    ]


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "y" if value else "n"
    return str(value)


def client_speed(cluster: Cluster, name: str, network: str) -> int:
    """The fastest NIC the client has on the NFS network (0 when none is declared)."""
    speeds = [n.speed_gbps for n in cluster.hosts[name].spec.hardware.nics
              if n.network == network]
    return max(speeds, default=0)


def mount_list(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> list[dict]:
    """The client's mounts: source, mount point, options and the fstab line's regexp."""
    v = layered("nfs", data)
    address = server_address(cluster)
    if address is None:
        return []
    exports = {e["path"]: e for e in export_list(cluster)}
    chosen = v["nfs_mounts"]
    if chosen is None:
        chosen = [{"export": path} for path in exports]
    network = nfs_network(cluster)
    common = [*(v["nfs_mount_options"] or [])]
    for required in ("_netdev", "nofail"):
        if required not in common:
            common.append(required)
    common.append(f"vers={v['nfs_version']}")
    if client_speed(cluster, host_name, network) >= int(v["nfs_nconnect_min_speed_gbps"]) \
            and int(v["nfs_nconnect"]) > 1:
        common.append(f"nconnect={int(v['nfs_nconnect'])}")
    if v["nfs_fscache"]:
        common.append("fsc")
    host_part = f"[{address}]" if ":" in address else address
    out = []
    for m in chosen:
        export = str(m["export"]).rstrip("/")
        path = str(m.get("path") or export).rstrip("/")
        options = [*common, *(o for o in m.get("options") or [] if o not in common)]
        out.append({
            "export": export,
            "path": path,
            "src": f"{host_part}:{export}",
            "fstype": "nfs",
            # Mounts it and proves it is mounted (aicluster.common.mounts).
            "command": mount_command(path, ["nfs", "nfs4"], f"{host_part}:{export}"),
            "options": ",".join(options),
            # The fstab line that mounts something at the path: Python's re (Ansible)
            # and POSIX extended (pyinfra's files.line, grep -E / sed -E).
            "regexp": fstab_python_regexp(path),
            "regexp_posix": fstab_regexp(path),
        })
    return out


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    h = cluster.hosts[host_name]
    is_server = "nfs_server" in h.groups
    return {
        "nfs_is_server": is_server,
        "nfs_is_client": "nfs_clients" in h.groups,
        "nfs_server_host": server_host(cluster) or "",
        "nfs_server_address": server_address(cluster) or "",
        "nfs_network_name": nfs_network(cluster),
        "nfs_export_list": export_list(cluster, data) if is_server else [],
        "nfs_server_thread_count": thread_count(cluster, data),
        "nfs_conf_sections": nfs_conf_sections(cluster, data),
        "nfs_mount_list": mount_list(cluster, host_name, data) if "nfs_clients" in h.groups
        else [],
        "nfs_rpc_pipefs_units": list(RPC_PIPEFS_UNITS),
        # What the Ansible role runs to read the kernel's NFS (the pyinfra fact's command).
        "nfs_fact_command": KERNEL_COMMAND,
    }


# ---------------------------------------------------------------------------
# The inventory's checks
# ---------------------------------------------------------------------------


def validate(cluster: Cluster) -> list[str]:
    """nfs's checks that need the whole inventory (host and field named): the server's
    network and exports, the exports a client mounts, FS-Cache on a client. The
    settings' own types and shapes are checked by aicluster.components.nfs.model."""
    errors: list[str] = []
    server = server_host(cluster)
    exported: list[str] = []
    if server is not None:
        errors += _check_server(cluster, server)
        exported = [e["path"] for e in layered("nfs", cluster.hosts[server].data)["nfs_exports"]]
    for name in cluster.group("nfs_clients"):
        errors += _check_client(cluster, name, server, exported)
    return errors


def _check_server(cluster: Cluster, name: str) -> list[str]:
    where = f"host {name!r}"
    v = layered("nfs", cluster.hosts[name].data)
    errors = []
    declared = ", ".join(cluster.spec.networks)
    network = v["nfs_network"]
    if network is not None:
        if network not in cluster.spec.networks:
            errors.append(f"{where}: nfs_network: {network!r} is not a network of the "
                          f"inventory ({declared})")
        elif not host_address(cluster, name, network):
            errors.append(f"{where}: nfs_network: the NFS server has no address on the "
                          f"{network} network")
    if not v["nfs_exports"]:
        errors.append(f"{where}: nfs_exports: the nfs_server exports nothing; give at least "
                      "one {path: ...}")
    for i, e in enumerate(v["nfs_exports"]):
        for j, n in enumerate(e.get("networks") or []):
            if n in NETWORK_NAMES and n not in cluster.spec.networks:
                errors.append(f"{where}: nfs_exports[{i}].networks[{j}]: {n!r} is not a "
                              f"network of the inventory ({declared})")
    return errors


def _check_client(cluster: Cluster, name: str, server: str | None,
                  exported: list[str]) -> list[str]:
    where = f"host {name!r}"
    h = cluster.hosts[name]
    v = layered("nfs", h.data)
    errors = []
    if v["nfs_fscache"]:
        cache = "nvme_cache" in h.components() and h.data.get("nvme_cache_fscache") is True
        if not cache:
            errors.append(f"{where}: nfs_fscache: FS-Cache needs cachefilesd on this host: "
                          "give it an NVMe cache with nvme_cache_fscache: true")
    for i, m in enumerate(v["nfs_mounts"] or []):
        if m["export"] not in exported:
            errors.append(f"{where}: nfs_mounts[{i}].export: {m['export']!r} is not exported "
                          f"by the nfs_server {server!r} (its nfs_exports: "
                          f"{', '.join(exported) or 'none'})")
    return errors


def client_skip_reason(kernel: Mapping[str, Any]) -> str:
    """Why a client's mounts are skipped ("" when they are not)."""
    if kernel.get("client"):
        return ""
    return ("nfs: mounts skipped: this node's kernel has no NFS client (no nfs or nfs4 in "
            "/proc/filesystems, and modprobe cannot load nfs); the NFS tools are installed, "
            "nothing is added to /etc/fstab")


def server_problem(host_name: str, impl: str, kernel: Mapping[str, Any]) -> str:
    """Why the kernel server cannot run here ("" when it can)."""
    if impl == "kernel" and not kernel.get("server"):
        return (f"host {host_name!r}: nfs_server_impl: 'kernel', but this node's kernel has "
                "no NFS server (no nfsd in /proc/filesystems, and modprobe cannot load "
                "nfsd); set nfs_server_impl: ganesha to serve NFS from user space")
    return ""


def mounts(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> list[str]:
    """The network mounts this host gets as a client (recorded; unmounted when it
    leaves ``nfs_clients``, :data:`REMOVAL`)."""
    if "nfs_clients" not in cluster.hosts[host_name].groups:
        return []
    return [m["path"] for m in mount_list(cluster, host_name, data)]


#: What a deploy takes off a host the inventory no longer gives a role of NFS (and the
#: component's own key when the host loses it altogether): services stopped and
#: disabled, configuration files the deploy wrote removed, services reloaded afterwards,
#: a client's mounts unmounted and their fstab lines removed (aicluster.common.absence).
#: Data stays (the exported directories, the files on the server); the packages too,
#: unless the inventory's remove_packages names nfs (then the server's NFS packages go
#: with the server role (Debian: nfs-kernel-server; RedHat has one package for both),
#: the client's with the component).
REMOVAL = {
    "nfs_server": {"services": ["nfs-ganesha", "nfs-server"],
                   "files": [EXPORTS_FILE, NFS_CONF_FILE, GANESHA_CONF],
                   "packages": ["nfs-kernel-server", "nfs-ganesha", "nfs-ganesha-vfs"]},
    "nfs_clients": {"unmount": True},
    "nfs": {"packages": ["nfs_client_packages"]},
}
