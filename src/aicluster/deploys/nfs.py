"""nfs: one NFS server (group ``nfs_server``) exporting directories to the cluster's
networks, and clients (group ``nfs_clients``) mounting them from /etc/fstab.

Defaults: roles/nfs/defaults/main.yml. Templates: roles/nfs/templates/.

The server is the kernel's (``nfs_server_impl: kernel``, the default): NFSv3, v4.1 and
v4.2 with nfsd threads sized for the cluster (/etc/nfs.conf.d/aicluster-nfs.conf), the
exports in /etc/exports.d/aicluster.exports, applied with ``exportfs -ra`` when they
change (no restart: clients keep their mounts). ``nfs_server_impl: ganesha`` runs
nfs-ganesha (VFS backend) instead, for hosts whose kernel has no nfsd (the local
testbed), from /etc/ganesha/ganesha.conf made of the same export list; a change is
applied with a reload (SIGHUP: ganesha re-reads its exports).

Clients mount with ``_netdev,nofail``, ``vers=``, ``nconnect=`` on fast NICs and
``fsc`` when FS-Cache is asked for. A client whose kernel has no NFS client at all (a
container, such as the local testbed's nodes) gets the NFS tools only: nothing goes
in its /etc/fstab, and the deploy says why.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping
from typing import Any

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import LinuxDistribution, Mounts
from pyinfra.operations import files, server, systemd

from aicluster.deploys import (
    current_cluster,
    install_packages,
    layered,
    os_family,
    put_template,
    template_vars,
    unknown_keys,
)
from aicluster.facts.nfs import KERNEL_COMMAND, NfsKernel
from aicluster.inventory import NETWORK_NAMES, Cluster
from aicluster.render import defaults, render

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


def _address(cluster: Cluster, name: str, network: str) -> str | None:
    h = cluster.hosts[name]
    return h.address if network == "management" else h.network_address(network)


def nfs_network(cluster: Cluster) -> str:
    """The network clients reach the server on: ``nfs_network`` (the server's data), or
    storage where the server has an address, else fabric, else management."""
    name = server_host(cluster)
    if name is None:
        return "management"
    chosen = layered("nfs", cluster.hosts[name].data)["nfs_network"]
    if chosen:
        return str(chosen)
    for network in ("storage", "fabric"):
        if network in cluster.spec.networks and _address(cluster, name, network):
            return network
    return "management"


def server_address(cluster: Cluster) -> str | None:
    name = server_host(cluster)
    if name is None:
        return None
    return _address(cluster, name, nfs_network(cluster)) or cluster.hosts[name].address


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
        elif not _address(cluster, name, network):
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


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


def say(message: str) -> None:
    """What the deploy skipped and why, shown in the output at any verbosity."""
    host.noop(message)
    logger.warning(f"[{host.name}] {message}")


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


@deploy("nfs", data_defaults=defaults("nfs"))
def deploy() -> None:
    cluster = current_cluster()
    data = host.data.dict()
    family = os_family(host.get_fact(LinuxDistribution))
    v = template_vars("nfs", cluster, host.name, data, family)
    kernel = host.get_fact(NfsKernel)
    impl = v["nfs_server_impl"]
    if v["nfs_is_server"]:
        problem = server_problem(host.name, impl, kernel)
        if problem:
            raise DeployError(problem)
    if (v["nfs_is_server"] and impl == "ganesha") or (
        v["nfs_is_client"] and not kernel["client"]
    ):
        if not kernel["rpc_pipefs"]:
            _mask_rpc_pipefs(v)
    if v["nfs_is_server"]:
        if impl == "ganesha":
            _ganesha(v, family)
        else:
            _kernel_server(v, family)
    fstab = _client_fstab(v, family, kernel) if v["nfs_is_client"] else []
    # Called from this one line by the server and every client: pyinfra makes it one
    # operation, which every host reaches only after the operations before it, so the
    # server's exports are in place before any client mounts them.
    systemd.daemon_reload(
        name="Reload systemd units (fstab changed)",
        _if=lambda: any(op.did_change() for op in fstab),
    )
    if fstab:
        _client_mounts(v)


def _mask_rpc_pipefs(v: dict[str, Any]) -> None:
    changed = []
    for unit in v["nfs_rpc_pipefs_units"]:
        changed.append(files.link(
            name=f"Mask {unit} (the kernel has no rpc_pipefs)",
            path=f"/etc/systemd/system/{unit}",
            target="/dev/null",
        ))
    systemd.daemon_reload(
        name="Reload systemd units (rpc_pipefs masked)",
        _if=lambda: any(op.did_change() for op in changed),
    )


def _export_dirs(v: dict[str, Any]) -> None:
    for e in v["nfs_export_list"]:
        files.directory(
            name=f"Export directory {e['path']}",
            path=e["path"],
            user=e["owner"],
            group=e["group"],
            mode=e["mode"],
        )


def _kernel_server(v: dict[str, Any], family: str) -> None:
    install_packages("Install the kernel NFS server", v["nfs_server_packages"], family)
    files.directory(name="nfs.conf drop-in directory", path="/etc/nfs.conf.d")
    conf = put_template(
        "nfs", "aicluster-nfs.conf.j2", NFS_CONF_FILE, v,
        name=f"NFS server settings (NFSv4.2, {v['nfs_server_thread_count']} nfsd threads)",
    )
    _export_dirs(v)
    files.directory(name="exports drop-in directory", path="/etc/exports.d")
    exports = put_template("nfs", "aicluster.exports.j2", EXPORTS_FILE, v,
                           name="Write the exports")
    systemd.service(
        name="Restart the NFS server (its settings changed)",
        service=v["nfs_server_service"],
        restarted=True,
        _if=conf.did_change,
    )
    systemd.service(name="NFS server running and enabled", service=v["nfs_server_service"],
                    running=True, enabled=True)
    server.shell(
        name="Apply the exports (exportfs -ra; clients keep their mounts)",
        commands=["exportfs -ra"],
        _if=exports.did_change,
    )


def _ganesha(v: dict[str, Any], family: str) -> None:
    install_packages("Install nfs-ganesha (VFS) and rpcbind", v["nfs_ganesha_packages"], family)
    _export_dirs(v)
    conf = put_template("nfs", "ganesha.conf.j2", GANESHA_CONF, v,
                        name="Write the nfs-ganesha configuration and exports")
    systemd.service(name="rpcbind running and enabled (NFSv3)", service="rpcbind",
                    running=True, enabled=True)
    server.shell(
        name="Reload nfs-ganesha's exports (SIGHUP; started if it was not running)",
        commands=[f"systemctl reload-or-restart {shlex.quote(v['nfs_ganesha_service'])}"],
        _if=conf.did_change,
    )
    systemd.service(name="nfs-ganesha running and enabled", service=v["nfs_ganesha_service"],
                    running=True, enabled=True)


def _client_fstab(v: dict[str, Any], family: str, kernel: Mapping[str, Any]) -> list:
    """The client's tools and fstab lines (the operations writing them); none when the
    kernel has no NFS client or there is nothing to mount."""
    install_packages("Install the NFS client tools", v["nfs_client_packages"], family)
    why = client_skip_reason(kernel)
    if why:
        say(why)
        return []
    if not v["nfs_mount_list"]:
        host.noop("nfs: the server exports nothing to mount")
        return []
    ops = []
    for m in v["nfs_mount_list"]:
        line = render("nfs", "fstab.j2", {**v, "nfs_mount": m}).strip("\n")
        ops.append(files.line(
            name=f"Mount {m['src']} at {m['path']} at boot (fstab, {m['options']})",
            path=FSTAB,
            line=m["regexp_posix"],
            replace=line,
            extended_regex=True,
        ))
    return ops


def _client_mounts(v: dict[str, Any]) -> None:
    mounted = host.get_fact(Mounts) or {}
    for m in v["nfs_mount_list"]:
        if m["path"] in mounted:
            host.noop(f"{m['path']} is mounted (changed options apply at its next mount)")
            continue
        files.directory(name=f"Mount point {m['path']}", path=m["path"])
        server.shell(name=f"Mount {m['path']}", commands=[f"mount {shlex.quote(m['path'])}"])
