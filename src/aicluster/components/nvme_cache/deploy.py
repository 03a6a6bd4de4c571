"""nvme_cache: the local NVMe drives as one XFS cache (RAID0 when several), mounted by
UUID with nofail, with model/dataset cache directories and FS-Cache for NFS.

Defaults: roles/nvme_cache/defaults/main.yml. Templates: roles/nvme_cache/templates/.

Nothing is formatted unless the disk-safety rule allows it
(:func:`aicluster.common.disks.check_devices`): the drives are read first, and a
host whose drives hold anything (and are not marked ``wipe: true``) is stopped before
any operation runs on it, with the drive and what was found on it named. The Ansible
role reaches the very same decision (:func:`plan`) through its filter plugin.

md RAID0 cannot be built on the local testbed (no md driver there): the several-drive
path is proven on fake hosts (tests/deploys/test_nvme_cache.py) only.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, server, systemd

from aicluster.common.facts import BlockDevices
from aicluster.common.mounts import FSTAB, fstab_regexp
from aicluster.common.ops import (
    current_cluster,
    install_packages,
    owned_directory,
    put_template,
    refuse,
    system_user,
    systemd_manager_conf,
)
from aicluster.common.settings import os_family, template_vars
from aicluster.components.nvme_cache.derive import (
    CACHEFILESD_CONF,
    CACHEFILESD_DEFAULT,
    PROFILE_FILE,
    SYSTEMD_ENV_FILE,
    mkfs_command,
    plan,
    raid_assemble_command,
    raid_create_command,
    wants_cache,
)
from aicluster.render import defaults, render


@deploy("nvme_cache", data_defaults=defaults("nvme_cache"))
def deploy() -> None:
    cluster = current_cluster()
    data = host.data.dict()
    if not wants_cache(cluster, host.name):
        return
    family = os_family(host.get_fact(LinuxDistribution))
    v = template_vars("nvme_cache", cluster, host.name, data, family)
    if not v["nvme_cache_enabled"]:
        host.noop("nvme_cache: the host has no NVMe cache drives (hardware.nvme)")
        return
    request = v["nvme_cache_request"]
    probe = list(v["nvme_cache_device_list"])
    if v["nvme_cache_layout"] == "raid0":
        probe.append(v["nvme_cache_raid_device"])
    fact = host.get_fact(BlockDevices, devices=probe, paths=[request["path"]])
    decided = plan(fact, request)
    if decided["problems"]:
        refuse(decided["problems"])
        return
    v["nvme_cache_fs_uuid"] = decided["fs_uuid"]
    raid = v["nvme_cache_layout"] == "raid0"

    packages = list(v["nvme_cache_packages"])
    if raid:
        packages += v["nvme_cache_raid_packages"]
    if v["nvme_cache_fscache"]:
        packages += v["nvme_cache_fscache_packages"]
    install_packages("Install the NVMe cache's tools", packages, family)

    for device in decided["wipe"]:
        server.shell(
            name=f"Wipe the signatures on {device} (wipe: true in the inventory)",
            commands=[f"wipefs -a {shlex.quote(device)}"],
        )
    if raid:
        _raid(v, family, decided)
    if decided["mkfs"]:
        server.shell(
            name=f"Make the cache's XFS on {decided['mkfs']}",
            commands=[mkfs_command(decided["mkfs"], v["nvme_cache_fs_label"],
                                   decided["fs_uuid"])],
        )
    _mount(v, decided)
    _directories(v)
    if v["nvme_cache_fscache"]:
        _fscache(v, family)


def _raid(v: dict[str, Any], family: str, decided: Mapping[str, Any]) -> None:
    if decided["create_raid"]:
        server.shell(
            name=f"Create the RAID0 {v['nvme_cache_raid_device']} of "
                 f"{len(v['nvme_cache_device_list'])} drives",
            commands=[raid_create_command(v)],
        )
    elif decided["assemble_raid"]:
        server.shell(
            name=f"Assemble the RAID0 {v['nvme_cache_raid_device']}",
            commands=[raid_assemble_command(v)],
        )
    if family == "RedHat":
        files.file(
            name=f"{v['nvme_cache_mdadm_main_conf']} exists (mdadm then reads its .d)",
            path=v["nvme_cache_mdadm_main_conf"],
            present=True,
        )
    files.directory(name="mdadm configuration directory", path=v["nvme_cache_mdadm_conf_dir"])
    conf = put_template(
        "nvme_cache",
        "aicluster-nvme-cache.conf.j2",
        f"{v['nvme_cache_mdadm_conf_dir']}/aicluster-nvme-cache.conf",
        v,
        name="Record the RAID0 in mdadm's configuration (assembled at boot)",
    )
    server.shell(
        name="Rebuild the initramfs (it carries mdadm's configuration)",
        commands=[v["nvme_cache_initramfs_command"]],
        _if=conf.did_change,
    )


def _mount(v: dict[str, Any], decided: Mapping[str, Any]) -> None:
    path = v["nvme_cache_path"]
    line = render("nvme_cache", "fstab.j2", v).strip("\n")
    fstab = files.line(
        name=f"Mount the cache at {path} by UUID at boot (fstab, nofail)",
        path=FSTAB,
        line=fstab_regexp(path),
        replace=line,
        extended_regex=True,
    )
    systemd.daemon_reload(name="Reload systemd units (fstab changed)", _if=fstab.did_change)
    if decided["mounted"]:
        server.shell(
            name=f"Remount {path} with the options of fstab",
            commands=[f"mount -o remount {shlex.quote(path)}"],
            _if=fstab.did_change,
        )
        return
    files.directory(name=f"Mount point {path}", path=path)
    server.shell(name=f"Mount the cache at {path}", commands=[v["nvme_cache_mount_command"]])


def _directories(v: dict[str, Any]) -> None:
    for user in v["nvme_cache_service_users"]:
        server.group(name=f"Group {user['group']}", group=user["group"], system=True)
        system_user(
            name=f"User {user['name']}",
            user=user["name"],
            group=user["group"],
            system=True,
            home=user["home"],
            create_home=True,
            shell="/usr/sbin/nologin",
        )
    for d in v["nvme_cache_directory_list"]:
        owned_directory(f"Cache directory {d['path']}", d["path"], d["owner"], d["group"],
                        d["mode"])
    put_template(
        "nvme_cache",
        "aicluster-nvme-cache.sh.j2",
        PROFILE_FILE,
        v,
        name="Cache locations for login shells",
    )
    systemd_manager_conf(
        "nvme_cache", "90-aicluster-nvme-cache.conf.j2", SYSTEMD_ENV_FILE, v,
        name="Cache locations for services", reload_name="Reload systemd's manager environment",
    )


def _fscache(v: dict[str, Any], family: str) -> None:
    files.directory(
        name="FS-Cache directory",
        path=f"{v['nvme_cache_path']}/{v['nvme_cache_fscache_dir']}",
        user="root",
        group="root",
        mode="700",
    )
    conf = put_template(
        "nvme_cache", "cachefilesd.conf.j2", CACHEFILESD_CONF, v, name="cachefilesd configuration"
    )
    default = None
    if family == "Debian":
        default = files.line(
            name="cachefilesd enabled (Debian's RUN=yes)",
            path=CACHEFILESD_DEFAULT,
            line="^#?RUN=.*$",
            replace="RUN=yes",
        )
    systemd.service(
        name="Restart cachefilesd (its configuration changed)",
        service="cachefilesd",
        restarted=True,
        _if=lambda: conf.did_change() or bool(default and default.did_change()),
    )
    systemd.service(
        name="cachefilesd running and enabled", service="cachefilesd", running=True,
        enabled=True,
    )
