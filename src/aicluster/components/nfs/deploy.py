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

import shlex
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import LinuxDistribution, Mounts
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from aicluster.common.mounts import FSTAB
from aicluster.common.ops import (
    current_cluster,
    install_packages,
    owned_directory,
    put_template,
    say,
)
from aicluster.common.settings import os_family, template_vars
from aicluster.components.nfs.derive import (
    EXPORTS_FILE,
    GANESHA_CONF,
    NFS_CONF_FILE,
    client_skip_reason,
    server_problem,
)
from aicluster.components.nfs.facts import NfsKernel
from aicluster.render import defaults, render

# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


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
        _if=any_changed(*fstab),
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
        _if=any_changed(*changed),
    )


def _export_dirs(v: dict[str, Any]) -> None:
    for e in v["nfs_export_list"]:
        owned_directory(f"Export directory {e['path']}", e["path"], e["owner"], e["group"],
                        e["mode"])


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
        server.shell(name=f"Mount {m['path']}", commands=[m["command"]])
