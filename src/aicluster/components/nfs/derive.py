"""The nfs component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from aicluster.common.networks import host_address, pick_network
from aicluster.common.settings import layered, unknown_keys
from aicluster.components.nfs.probe import KERNEL_COMMAND
from aicluster.inventory import NETWORK_NAMES, Cluster

FSTAB = "/etc/fstab"
EXPORTS_FILE = "/etc/exports.d/aicluster.exports"
NFS_CONF_FILE = "/etc/nfs.conf.d/aicluster-nfs.conf"
GANESHA_CONF = "/etc/ganesha/ganesha.conf"
#: Units that mount rpc_pipefs (Debian and Ubuntu name it after /run/rpc_pipefs,
#: Rocky after /var/lib/nfs/rpc_pipefs): masked where the kernel has no rpc_pipefs, so
#: they do not fail at every boot and take the NFS daemons with them.
RPC_PIPEFS_UNITS = ("run-rpc_pipefs.mount", "var-lib-nfs-rpc_pipefs.mount")
IMPLS = ("kernel", "ganesha")
VERSIONS = ("3", "4", "4.0", "4.1", "4.2")
#: Absolute paths: letters, digits, '_', '-', '.'; no "..".
PATH_RE = re.compile(r"^/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
MODE_RE = re.compile(r"^[0-7]{3,4}$")
MOUNT_OPTION_RE = re.compile(r"^[A-Za-z0-9_.=:+/-]+$")
#: exports(5) options without a value, and those taking one.
EXPORT_FLAGS = frozenset({
    "rw", "ro", "sync", "async", "secure", "insecure", "wdelay", "no_wdelay", "hide",
    "nohide", "crossmnt", "subtree_check", "no_subtree_check", "secure_locks",
    "insecure_locks", "auth_nlm", "no_auth_nlm", "mountpoint", "mp", "root_squash",
    "no_root_squash", "all_squash", "no_all_squash", "pnfs", "no_pnfs", "security_label",
})
EXPORT_VALUED = frozenset({"anonuid", "anongid", "fsid", "sec", "refer", "replicas",
                           "mountpoint", "mp", "xprtsec"})
#: Options of which an export may give at most one.
EXCLUSIVE = (("rw", "ro"), ("sync", "async"), ("root_squash", "no_root_squash"),
             ("all_squash", "no_all_squash"), ("subtree_check", "no_subtree_check"),
             ("secure", "insecure"))
EXPORT_KEYS = frozenset({"path", "networks", "options", "owner", "group", "mode",
                         "export_id"})
MOUNT_KEYS = frozenset({"export", "path", "options"})
SYSTEM_DIRS = ("/", "/boot", "/etc", "/usr", "/var", "/proc", "/sys", "/dev", "/run",
               "/bin", "/sbin", "/lib", "/lib64")


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
            "export_id": int(entry.get("export_id") or i + 1),
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
            "options": ",".join(options),
            # The fstab line that mounts something at the path: Python's re (Ansible)
            # and POSIX extended (pyinfra's files.line, grep -E / sed -E).
            "regexp": rf"^[^#\s]+\s+{re.escape(path)}\s",
            "regexp_posix": rf"^[^#[:space:]]+[[:space:]]+{path.replace('.', '[.]')}"
                            "[[:space:]]",
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
    """nfs's own checks of the inventory (host and field named)."""
    errors: list[str] = []
    server = server_host(cluster)
    exported: list[str] = []
    if server is not None:
        errors += _check_server(cluster, server)
        v = layered("nfs", cluster.hosts[server].data)
        exports = v["nfs_exports"]
        if isinstance(exports, list):
            exported = [str(e["path"]).rstrip("/") for e in exports
                        if isinstance(e, Mapping) and isinstance(e.get("path"), str)]
    for name in cluster.group("nfs_clients"):
        errors += _check_client(cluster, name, server, exported)
    return errors


def _check_server(cluster: Cluster, name: str) -> list[str]:
    where = f"host {name!r}"
    v = layered("nfs", cluster.hosts[name].data)
    errors = []
    if v["nfs_server_impl"] not in IMPLS:
        errors.append(f"{where}: nfs_server_impl: {v['nfs_server_impl']!r} is not one of "
                      f"{', '.join(IMPLS)}")
    threads = v["nfs_server_threads"]
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= 4096):
        errors.append(f"{where}: nfs_server_threads: {threads!r} is not a number of threads "
                      "(1-4096), or null to size it by the number of clients")
    config = v["nfs_server_config"]
    if not isinstance(config, Mapping) or not all(
        isinstance(s, Mapping) or s is None for s in config.values()
    ):
        errors.append(f"{where}: nfs_server_config: give sections of key: value settings "
                      "(nfs.conf(5)), e.g. {'nfsd': {'lease-time': 60}}")
    network = v["nfs_network"]
    if network is not None:
        if network not in NETWORK_NAMES or network not in cluster.spec.networks:
            errors.append(f"{where}: nfs_network: {network!r} is not a network of the "
                          f"inventory ({', '.join(cluster.spec.networks)})")
        elif not host_address(cluster, name, network):
            errors.append(f"{where}: nfs_network: the NFS server has no address on the "
                          f"{network} network")
    exports = v["nfs_exports"]
    if not isinstance(exports, list):
        return [*errors, f"{where}: nfs_exports: must be a list of exports"]
    if not exports:
        errors.append(f"{where}: nfs_exports: the nfs_server exports nothing; give at least "
                      "one {path: ...}")
    seen: list[str] = []
    ids: list[int] = []
    for i, e in enumerate(exports):
        at = f"{where}: nfs_exports[{i}]"
        if not isinstance(e, Mapping) or not isinstance(e.get("path"), str):
            errors.append(f"{at}: must be a mapping with at least a path")
            continue
        errors += unknown_keys(at, e, EXPORT_KEYS)
        path = e["path"].rstrip("/") or "/"
        if not PATH_RE.match(path) or ".." in path.split("/"):
            errors.append(f"{at}.path: {e['path']!r} is not an absolute path (letters, "
                          "digits, '_', '-', '.')")
        elif path in SYSTEM_DIRS:
            errors.append(f"{at}.path: {e['path']!r} is a system directory")
        elif path in seen:
            errors.append(f"{at}.path: {path} is exported twice")
        seen.append(path)
        errors += _check_networks(cluster, at, e.get("networks"))
        if "options" in e:
            errors += _check_export_options(f"{at}.options", e["options"])
        for key in ("owner", "group"):
            if key in e and not (isinstance(e[key], str) and NAME_RE.match(e[key])):
                errors.append(f"{at}.{key}: {e[key]!r} is not a user or group name")
        if "mode" in e and not (isinstance(e["mode"], str) and MODE_RE.match(e["mode"])):
            errors.append(f"{at}.mode: {e['mode']!r} is not an octal mode such as '0755' "
                          "(quote it)")
        export_id = e.get("export_id", i + 1)
        if isinstance(export_id, bool) or not isinstance(export_id, int) or \
                not 1 <= export_id <= 65535:
            errors.append(f"{at}.export_id: {export_id!r} is not a number from 1 to 65535")
        elif export_id in ids:
            errors.append(f"{at}.export_id: {export_id} is used by another export")
        else:
            ids.append(export_id)
    errors += _check_export_options(f"{where}: nfs_export_default_options",
                                    v["nfs_export_default_options"])
    return errors


def _check_networks(cluster: Cluster, at: str, networks: Any) -> list[str]:
    if networks is None:
        return []
    if not isinstance(networks, list) or not networks:
        return [f"{at}.networks: must be a list of network names or CIDR subnets"]
    errors = []
    for j, n in enumerate(networks):
        if isinstance(n, str) and n in cluster.spec.networks:
            continue
        try:
            if not isinstance(n, str) or "/" not in n:
                raise ValueError
            ipaddress.ip_network(n, strict=True)
        except ValueError:
            errors.append(f"{at}.networks[{j}]: {n!r} is neither a network of the inventory "
                          f"({', '.join(cluster.spec.networks)}) nor a subnet such as "
                          "'10.30.0.0/24'")
    return errors


def _check_export_options(at: str, options: Any) -> list[str]:
    if not isinstance(options, list) or not options or not all(
        isinstance(o, str) for o in options
    ):
        return [f"{at}: must be a list of exports(5) options such as ['rw', 'sync']"]
    errors = []
    for o in options:
        key, sep, value = o.partition("=")
        if (not sep and key not in EXPORT_FLAGS) or (sep and key not in EXPORT_VALUED) or (
            sep and not value
        ):
            errors.append(f"{at}: unknown export option {o!r} (exports(5))")
        elif key in ("anonuid", "anongid") and not value.isdigit():
            errors.append(f"{at}: {o!r}: {key} takes a number")
    keys = {o.partition("=")[0] for o in options if isinstance(o, str)}
    for pair in EXCLUSIVE:
        if set(pair) <= keys:
            errors.append(f"{at}: {pair[0]} and {pair[1]} contradict each other")
    return errors


def _check_client(cluster: Cluster, name: str, server: str | None,
                  exported: list[str]) -> list[str]:
    where = f"host {name!r}"
    h = cluster.hosts[name]
    v = layered("nfs", h.data)
    errors = []
    if v["nfs_version"] not in VERSIONS:
        errors.append(f"{where}: nfs_version: {v['nfs_version']!r} is not one of "
                      f"{', '.join(VERSIONS)}")
    options = v["nfs_mount_options"]
    if not isinstance(options, list) or not all(
        isinstance(o, str) and MOUNT_OPTION_RE.match(o) for o in options
    ):
        errors.append(f"{where}: nfs_mount_options: must be a list of mount options such as "
                      "['_netdev', 'nofail']")
    for key, low, high in (("nfs_nconnect", 1, 16), ("nfs_nconnect_min_speed_gbps", 1, 800)):
        value = v[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            errors.append(f"{where}: {key}: {value!r} is not a number from {low} to {high}")
    if not isinstance(v["nfs_fscache"], bool):
        errors.append(f"{where}: nfs_fscache: {v['nfs_fscache']!r} is not true or false")
    elif v["nfs_fscache"]:
        cache = "nvme_cache" in h.components() and h.data.get("nvme_cache_fscache") is True
        if not cache:
            errors.append(f"{where}: nfs_fscache: FS-Cache needs cachefilesd on this host: "
                          "give it an NVMe cache with nvme_cache_fscache: true")
    mounts = v["nfs_mounts"]
    if mounts is None:
        return errors
    if not isinstance(mounts, list):
        return [*errors, f"{where}: nfs_mounts: must be a list of {{export, path}} or null"]
    points: list[str] = []
    for i, m in enumerate(mounts):
        at = f"{where}: nfs_mounts[{i}]"
        if not isinstance(m, Mapping) or not isinstance(m.get("export"), str):
            errors.append(f"{at}: must be a mapping with at least an export")
            continue
        errors += unknown_keys(at, m, MOUNT_KEYS)
        export = m["export"].rstrip("/")
        if export not in exported:
            errors.append(f"{at}.export: {m['export']!r} is not exported by the nfs_server "
                          f"{server!r} (its nfs_exports: {', '.join(exported) or 'none'})")
        path = m.get("path", export)
        if not isinstance(path, str) or not PATH_RE.match(path.rstrip("/") or "/") or \
                ".." in path.split("/"):
            errors.append(f"{at}.path: {path!r} is not an absolute path")
        elif path.rstrip("/") in SYSTEM_DIRS:
            errors.append(f"{at}.path: {path!r} is a system directory")
        elif path.rstrip("/") in points:
            errors.append(f"{at}.path: {path} is mounted twice")
        else:
            points.append(path.rstrip("/"))
        extra = m.get("options", [])
        if not isinstance(extra, list) or not all(
            isinstance(o, str) and MOUNT_OPTION_RE.match(o) for o in extra
        ):
            errors.append(f"{at}.options: must be a list of mount options")
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

