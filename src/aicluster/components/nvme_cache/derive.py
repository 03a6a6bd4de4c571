"""The nvme_cache component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from aicluster.common.disks import (
    cache_devices,
    cache_directories,
    check_devices,
    command_text,
    describe,
    parse,
)
from aicluster.common.mounts import fstab_python_regexp, mount_command
from aicluster.common.settings import layered
from aicluster.inventory import Cluster

PROFILE_FILE = "/etc/profile.d/aicluster-nvme-cache.sh"
SYSTEMD_ENV_FILE = "/etc/systemd/system.conf.d/90-aicluster-nvme-cache.conf"
CACHEFILESD_CONF = "/etc/cachefilesd.conf"
CACHEFILESD_DEFAULT = "/etc/default/cachefilesd"
#: A namespace for the UUID the cache filesystem is made with (so both engines, and
#: the fstab line, know it before the filesystem exists).
UUID_NAMESPACE = uuid.UUID("7b0c3f62-52a9-4d43-9d53-5d1f0f3c2a61")


# ---------------------------------------------------------------------------
# Values computed from the inventory (both engines use these)
# ---------------------------------------------------------------------------


def wants_cache(cluster: Cluster, host_name: str) -> bool:
    """Whether the component applies: gpu_nodes, or a host that sets nvme_cache_devices."""
    return "nvme_cache" in cluster.hosts[host_name].components()


def fs_uuid(cluster: Cluster, host_name: str, devices: Iterable[str]) -> str:
    """The UUID a new cache filesystem is made with (fixed by cluster, host, drives)."""
    key = f"{cluster.spec.cluster_name}/{host_name}/{','.join(devices)}"
    return str(uuid.uuid5(UUID_NAMESPACE, key))


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("nvme_cache", data)
    devices = cache_devices(cluster, host_name, data)
    names = [d["device"] for d in devices]
    layout = "none" if not devices else ("single" if len(devices) == 1 else "raid0")
    raid_device = f"/dev/md/{v['nvme_cache_raid_name']}"
    path = str(v["nvme_cache_path"]).rstrip("/") or "/"
    request = {
        "host": host_name,
        "devices": devices,
        "layout": layout,
        "label": v["nvme_cache_fs_label"],
        "raid_device": raid_device,
        "raid_md_name": f"{host_name}:{v['nvme_cache_raid_name']}",
        "path": path,
        "uuid": fs_uuid(cluster, host_name, names),
    }
    probe = names + ([raid_device] if layout == "raid0" else [])
    options = [*(v["nvme_cache_mount_options"] or [])]
    if "nofail" not in options:
        options.append("nofail")
    directories, environment = cache_directories(data)
    return {
        "nvme_cache_enabled": bool(devices),
        "nvme_cache_request": request,
        "nvme_cache_layout": layout,
        "nvme_cache_device_list": names,
        "nvme_cache_raid_device": raid_device,
        "nvme_cache_raid_md_name": request["raid_md_name"],
        # The UUID of the filesystem: the deploys replace it with what they read on
        # the node when the cache filesystem already exists.
        "nvme_cache_fs_uuid": request["uuid"],
        "nvme_cache_fstab_options": ",".join(options),
        # Mounts the cache and proves it is mounted (aicluster.common.mounts).
        "nvme_cache_mount_command": mount_command(
            path, ["xfs"], f"the NVMe cache ({', '.join(names) or 'no drive'})"),
        # The fstab line that mounts something at the path (Python's re, for Ansible).
        "nvme_cache_fstab_regexp": fstab_python_regexp(path),
        "nvme_cache_directory_list": directories,
        "nvme_cache_service_users": service_users(directories),
        "nvme_cache_environment": environment,
        # What the Ansible role runs to read the drives (the pyinfra fact's command).
        "nvme_cache_fact_command": command_text(probe, [path]),
    }


def service_users(directories: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The owners (other than root) of the cache directories, made if missing."""
    seen: dict[str, dict[str, str]] = {}
    for d in directories:
        if d["owner"] != "root" and d["owner"] not in seen:
            seen[d["owner"]] = {"name": d["owner"], "group": d["group"], "home": d["home"]}
    return list(seen.values())


def validate(cluster: Cluster) -> list[str]:
    """nvme_cache's checks that need the whole inventory (host and field named): the
    drives are the host's hardware.nvme drives. The settings' own types and shapes are
    checked by aicluster.components.nvme_cache.model."""
    errors: list[str] = []
    for name, h in cluster.hosts.items():
        if not wants_cache(cluster, name):
            continue
        chosen = layered("nvme_cache", h.data)["nvme_cache_devices"]
        nvme = [d.device for d in h.spec.hardware.nvme]
        for i, dev in enumerate(chosen or []):
            if dev not in nvme:
                errors.append(
                    f"host {name!r}: nvme_cache_devices[{i}]: {dev} is not one of the host's "
                    f"hardware.nvme devices ({', '.join(nvme) or 'none declared'}); "
                    "declare it there (with wipe: true only if its data may go)"
                )
    return errors


# ---------------------------------------------------------------------------
# The decision (both engines): what the drives hold, and what to do
# ---------------------------------------------------------------------------


def plan(fact: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """What to do on one host, from its BlockDevices fact and ``nvme_cache_request``.

    Returns ``problems`` (lines naming the host, the drive and what is on it: when
    any, nothing at all is done), ``wipe`` (drives whose signatures are erased first:
    ``wipe: true`` in the inventory), ``create_raid``, ``assemble_raid``, ``mkfs``
    (the device to make XFS on, or ""), ``fs_uuid`` and ``mounted`` (the cache is
    mounted at its path already)."""
    where = f"host {request['host']!r}: nvme_cache"
    out: dict[str, Any] = {
        "problems": [], "wipe": [], "create_raid": False, "assemble_raid": False,
        "mkfs": "", "fs_uuid": request["uuid"], "mounted": False,
    }
    layout = request["layout"]
    if layout == "none":
        return out
    label = request["label"]
    xfs_ours = [{"type": "xfs", "label": label}]
    member_ours = [{"type": "linux_raid_member", "label": request["raid_md_name"]}]
    checked = check_devices(
        fact, request["devices"], xfs_ours if layout == "single" else member_ours
    )
    problems = [f"{where}: {p}" for p in checked["problems"]]
    states = checked["devices"]
    devices = [d["device"] for d in request["devices"]]
    fs_device = devices[0] if layout == "single" else request["raid_device"]
    fs_record = (fact.get("devices") or {}).get(fs_device) or {}
    if layout == "raid0" and not problems:
        ours = [d for d in devices if states[d]["state"] == "ours"]
        if ours and len(ours) != len(devices):
            others = [d for d in devices if d not in ours]
            problems.append(
                f"{where}: {', '.join(others)} not in the existing NVMe cache array on "
                f"{', '.join(ours)}; a RAID0 cannot take a new member without being "
                "rebuilt. Stop the array and wipe its members (wipefs -a) by hand to "
                "rebuild the cache, or list only the array's devices"
            )
        elif ours:
            if not fs_record.get("exists"):
                out["assemble_raid"] = True
            elif fs_record.get("signatures") is None:
                problems.append(f"{where}: cannot read the signatures of "
                                f"{request['raid_device']}")
            else:
                sigs = fs_record.get("signatures") or []
                if not sigs:
                    out["mkfs"] = fs_device
                elif not all(s.get("type") == "xfs" and s.get("label") == label for s in sigs):
                    problems.append(
                        f"{where}: {request['raid_device']} (the cache array) holds "
                        f"{describe(sigs)}, not the cache's XFS; nothing is changed"
                    )
                else:
                    out["fs_uuid"] = sigs[0].get("uuid") or out["fs_uuid"]
        else:
            out["create_raid"] = True
            out["mkfs"] = fs_device
    elif layout == "single" and not problems:
        state = states[fs_device]["state"]
        if state == "ours":
            sig = (fs_record.get("signatures") or [{}])[0]
            out["fs_uuid"] = sig.get("uuid") or fs_record.get("blkid", {}).get("UUID") or (
                out["fs_uuid"]
            )
        else:
            out["mkfs"] = fs_device
    out["wipe"] = [d for d in devices if states.get(d, {}).get("state") == "wipe"]
    # What is mounted at the cache's path already.
    mounted = (fact.get("mounts") or {}).get(request["path"])
    if mounted and not problems:
        ours_real = {states[d]["real"] for d in devices} if layout == "single" else set()
        if layout == "raid0" and fs_record.get("real"):
            ours_real = {fs_record["real"]}
        source = mounted.get("source", "")
        if source in ours_real and not out["mkfs"]:
            out["mounted"] = True
        else:
            problems.append(
                f"{where}: {request['path']} already has {source or 'something'} "
                f"({mounted.get('fstype') or 'unknown type'}) mounted; the cache is not "
                "mounted over it. Unmount it, or set nvme_cache_path elsewhere"
            )
    out["problems"] = problems
    if problems:
        out.update(wipe=[], create_raid=False, assemble_raid=False, mkfs="", mounted=False)
    return out


def plan_from_output(lines: Iterable[str], request: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`plan` from the text the fact command printed (the Ansible filter)."""
    return plan(parse(lines), request)


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


def mkfs_command(device: str, label: str, fs_uuid_: str) -> str:
    """mkfs.xfs WITHOUT -f: it refuses a device that holds a signature after all."""
    return (
        f"mkfs.xfs -q -L {shlex.quote(label)} -m uuid={shlex.quote(fs_uuid_)} "
        f"{shlex.quote(device)}"
    )


def raid_create_command(v: Mapping[str, Any]) -> str:
    devices = " ".join(shlex.quote(d) for d in v["nvme_cache_device_list"])
    return (
        f"mdadm --create {shlex.quote(v['nvme_cache_raid_device'])} --run --metadata=1.2 "
        f"--level=0 --chunk={int(v['nvme_cache_raid_chunk_kb'])} "
        f"--raid-devices={len(v['nvme_cache_device_list'])} "
        f"--homehost={shlex.quote(v['inventory_hostname'])} "
        f"--name={shlex.quote(v['nvme_cache_raid_name'])} {devices}"
    )


def raid_assemble_command(v: Mapping[str, Any]) -> str:
    devices = " ".join(shlex.quote(d) for d in v["nvme_cache_device_list"])
    return f"mdadm --assemble {shlex.quote(v['nvme_cache_raid_device'])} {devices}"



def mounts(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> list[str]:
    """The cache's mount point, when the host has a cache drive (recorded; unmounted
    when the host no longer has the component, :data:`REMOVAL`)."""
    if not cache_devices(cluster, host_name, data):
        return []
    return [str(layered("nvme_cache", data)["nvme_cache_path"]).rstrip("/") or "/"]


#: What a deploy takes off a host the inventory no longer gives the NVMe cache
#: (aicluster.common.absence): the cache unmounted and its fstab line removed, the
#: environment that points programs at it, FS-Cache's daemon stopped. The drives and
#: what the cache holds stay (mount the drive again to reach it; a RAID stays
#: assembled); cachefilesd too, unless the inventory's remove_packages names nvme_cache.
REMOVAL = {
    "nvme_cache": {"unmount": True, "services": ["cachefilesd"],
                   "files": [PROFILE_FILE, SYSTEMD_ENV_FILE],
                   "packages": ["nvme_cache_fscache_packages"]},
}
