"""minio: distributed MinIO over the ``minio`` group's hosts and drives, from the
vendor's pinned release (aicluster.artifacts), run by systemd.

Defaults: roles/minio/defaults/main.yml. Templates: roles/minio/templates/.

Layout. Hosts are grouped in server pools (``minio_pool``); each pool is one argument
of ``MINIO_VOLUMES`` in MinIO's expansion notation, ``http://stor{1...4}-storage:9000
/mnt/minio{1...2}``, when its host names and drive paths run in sequence, else (one
pool only) an explicit list of every drive. A layout MinIO refuses (hosts of a pool
with different drive counts, a pool whose drive count no erasure set size of 2 to 16
divides, several pools not all in expansion notation) is refused by :func:`validate`
before any host is touched, with MinIO's own arithmetic (cmd/endpoint-ellipses.go).
One host alone gets plain paths (``/mnt/minio{1...4}``).

Drives. A device the inventory names is made XFS (label ``minio_fs_label``) and
mounted by UUID only when the disk-safety rule allows it
(:func:`aicluster.common.disks.check_devices`): empty, or ``wipe: true``. A drive
holding anything else, a directory drive on the system disk of a multi-drive cluster
(MinIO refuses those), or something else mounted where a drive goes, stops the host
before any operation runs on it. The Ansible role reaches the same decision
(:func:`plan`) through its filter plugin.

Credentials. The root password comes from the inventory's secret (a password given as
text, or derived from a file of random bytes generated once on the deploying machine);
it is written only into /etc/default/minio (mode 0600, owned by minio-user) and handed
to mc through the environment by aicluster-minio-mc; never printed.

Upgrade. A version bump puts the new release beside the running one on every
server (``minio.RELEASE.<version>``; ``minio`` is a link to it), then restarts every
server together (one operation on all hosts; MinIO does not support servers of
different releases running side by side, so there is no rolling restart). A server
still running a replaced binary counts as not upgraded.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.context import ctx_state
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from aicluster import artifacts
from aicluster.common.facts import BlockDevices
from aicluster.common.minio_credentials import root_password
from aicluster.common.mounts import FSTAB, fstab_regexp
from aicluster.common.ops import (
    install_packages,
    inventory_hosts,
    put_template,
    refuse,
    runs_here,
    system_user,
    this_host,
)
from aicluster.common.settings import layered
from aicluster.components.minio.derive import (
    ENV_FILE,
    UNIT,
    SecretText,
    bucket_commands,
    derived_vars,
    minio_hosts,
    mkfs_command,
    node_current,
    old_releases,
    plan,
)
from aicluster.components.minio.facts import MinioState
from aicluster.components.minio.probe import MC
from aicluster.inventory import Cluster
from aicluster.render import defaults, render
from aicluster.secrets import SecretError

# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


def read_states(cluster: Cluster) -> dict[str, tuple[dict[str, Any], str, str]]:
    """Every MinIO host's MinioState, its binary path and pinned checksum."""
    out = {}
    for name, other in inventory_hosts(minio_hosts(cluster)):
        data = other.data.dict()
        ov = {**layered("minio", data), **derived_vars(cluster, name, data)}
        state = other.get_fact(
            MinioState, binary=ov["minio_binary"], mc_binary=ov["minio_mc_binary"],
            directories=ov["minio_directory_list"],
            buckets=[b["name"] for b in ov["minio_bucket_list"]]
            if name == ov["minio_first_host"] else None,
        )
        sha = ov["minio_artifact_files"]["minio"]["sha256"]
        out[name] = (state, ov["minio_release_binary"], sha)
    return out


@deploy("minio", data_defaults=defaults("minio"))
def deploy() -> None:
    if not runs_here("minio"):
        return
    cluster, family, v = this_host("minio")
    states = read_states(cluster)
    state = states[host.name][0]
    block = host.get_fact(BlockDevices, devices=v["minio_device_list"],
                          paths=[d["path"] for d in v["minio_drive_list"]
                                 if d["kind"] == "device"]) \
        if v["minio_device_list"] else {"lsblk": [], "devices": {}, "mounts": {}}
    decided = plan(block, state, v["minio_request"])
    if decided["problems"]:
        refuse(decided["problems"])
        return
    if getattr(ctx_state.get().config, "DIFF", False):
        # pyinfra's --diff prints the old and new lines of every file it changes.
        refuse([f"host {host.name!r}: minio: pyinfra's --diff would show {ENV_FILE}, which "
                "holds the root credentials; deploy MinIO without --diff"])
        return
    try:
        password = root_password(v["minio_keys_ref"], v["minio_root_keys_name"],
                                 v["minio_root_keys_bytes"])
    except SecretError as exc:
        refuse([f"host {host.name!r}: minio: {exc}"])
        return
    upgrade = not all(node_current(s, b, sha) for s, b, sha in states.values())

    install_packages("Install MinIO's tools (XFS, curl)", v["minio_packages"], family)
    server.group(name=f"MinIO group {v['minio_group']}", group=v["minio_group"], system=True)
    system_user(
        name=f"MinIO user {v['minio_user']}", user=v["minio_user"], group=v["minio_group"],
        system=True, home="/var/lib/minio", create_home=False, shell="/usr/sbin/nologin",
    )
    _drives(v, decided)

    artifacts.put("minio", "minio", v["minio_release_binary"], mode="755",
                  op_name=f"Install the MinIO server {v['minio_version']}")
    binary = files.link(name=f"{v['minio_binary']} is MinIO {v['minio_version']}",
                        path=v["minio_binary"], target=v["minio_release_binary"],
                        force=True, force_backup=False)
    artifacts.put("minio", "mc", v["minio_mc_binary"], mode="755",
                  op_name="Install the MinIO client (mc)")
    changes = [binary]
    if v["minio_tls_enabled"]:
        changes += _certs(v)
    v["minio_root_password"] = password
    env = files.put(
        name=f"MinIO settings and root credentials ({ENV_FILE}, mode 0600, never shown)",
        src=SecretText(render("minio", "minio.j2", v)), dest=ENV_FILE,
        user=v["minio_user"], group=v["minio_group"], mode="600", create_remote_dir=False,
    )
    del v["minio_root_password"]
    unit = put_template("minio", "minio.service.j2", UNIT, v, name="MinIO unit (minio.service)")
    put_template("minio", "aicluster-minio-mc.j2", MC, v, mode="700",
                 name="mc with the cluster's root credentials (aicluster-minio-mc)")
    changes += [env, unit]
    systemd.daemon_reload(name="Reload systemd units (MinIO unit changed)", _if=unit.did_change)
    if state.get("enabled") != "enabled":
        server.shell(name="MinIO enabled (starts at boot)", commands=["systemctl enable minio"])
    # One operation on every MinIO host: pyinfra runs it on all hosts at once, after every
    # host has its new binary (MinIO restarts all servers together; never one by one).
    # It returns once the old server has stopped, without waiting for the peers.
    restart_name = "Restart MinIO on every server together"
    if upgrade:
        restart = server.shell(name=restart_name, commands=[v["minio_restart_command"]])
    else:
        restart = server.shell(name=restart_name, commands=[v["minio_restart_command"]],
                               _if=any_changed(*changes))
    started = None
    if state.get("active") != "active" and not upgrade:
        started = server.shell(name="Start MinIO", commands=["systemctl start --no-block minio"])
    server.shell(
        name="Wait until MinIO answers (/minio/health/live)",
        commands=[v["minio_live_wait_command"]],
        _if=lambda: restart.did_change() or bool(started and started.did_change()),
    )
    for path in host.loop(old_releases(state, v["minio_release_binary"])):
        files.file(name=f"Remove {path} (every server runs {v['minio_version']})", path=path,
                   present=False)
    if host.name == v["minio_first_host"]:
        commands = bucket_commands(state, v["minio_bucket_list"])
        if commands:
            server.shell(
                name="Wait until the MinIO cluster has write quorum (/minio/health/cluster)",
                commands=[v["minio_cluster_wait_command"]],
            )
            server.shell(name="Buckets and their anonymous access (mc)", commands=commands)


def _drives(v: dict[str, Any], decided: Mapping[str, Any]) -> None:
    for device in host.loop(decided["wipe"]):
        server.shell(name=f"Wipe the signatures on {device} (wipe: true in the inventory)",
                     commands=[f"wipefs -a {shlex.quote(device)}"])
    for item in host.loop(decided["mkfs"]):
        server.shell(name=f"Make XFS on {item['device']}",
                     commands=[mkfs_command(item["device"], v["minio_fs_label"], item["uuid"])])
    for item in host.loop(decided["fstab"]):
        fstab = files.line(
            name=f"Mount {item['path']} by UUID at boot (fstab, nofail)", path=FSTAB,
            line=fstab_regexp(item["path"]), replace=item["line"], extended_regex=True,
        )
        systemd.daemon_reload(name=f"Reload systemd units (fstab: {item['path']})",
                              _if=fstab.did_change)
    for item in host.loop(decided["mount"]):
        files.directory(name=f"Mount point {item['path']}", path=item["path"])
        server.shell(name=f"Mount {item['path']}", commands=[item["command"]])
    for d in host.loop(v["minio_drive_list"]):
        files.directory(name=f"MinIO drive {d['path']} (owned by {v['minio_user']})",
                        path=d["path"], user=v["minio_user"], group=v["minio_group"],
                        mode="750")


def _certs(v: dict[str, Any]) -> list:
    d = v["minio_certs_dir"]
    ops = [files.directory(name=f"{d} (MinIO's certificates)", path=d, user=v["minio_user"],
                           group=v["minio_group"], mode="750"),
           files.directory(name=f"{d}/CAs", path=f"{d}/CAs", user=v["minio_user"],
                           group=v["minio_group"], mode="750")]
    for src, dest, mode in (
        (v["minio_tls_cert_file"], f"{d}/public.crt", "644"),
        (v["minio_tls_key_file"], f"{d}/private.key", "600"),
        (v["minio_tls_ca_file"], f"{d}/CAs/aicluster-ca.crt", "644"),
    ):
        ops.append(files.put(name=f"TLS {dest.rsplit('/', 1)[-1]}", src=str(
            Path(str(src)).expanduser()), dest=dest, user=v["minio_user"],
            group=v["minio_group"], mode=mode, create_remote_dir=False))
    return ops[2:]
