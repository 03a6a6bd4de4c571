"""Block devices, and the one rule that keeps data safe: no data is lost.

A component formats, partitions, adds to an array or hands to Ceph only a block device
that the inventory names AND that

* exists and is a block device (inventories name stable ``/dev/disk/by-id/...`` paths;
  they are resolved on the node),
* is not the disk holding ``/`` (never, whatever the inventory says),
* holds no filesystem signature, partition table, RAID, LVM or Ceph label (what
  ``wipefs`` finds on it) and no partitions,
* is not mounted (nor any partition or holder of it, swap included) and is not in use
  by an md array or device-mapper (its ``holders``),

or, for the third point only, that the inventory marks ``wipe: true``. A device that
holds exactly what the component itself makes there (its own XFS label, its own md
array) is the component's and is left as it is.

Both engines read a node with the same shell (:func:`command_text`): pyinfra through the
:class:`aicluster.common.facts.BlockDevices` fact, Ansible through the command the
inventory hands it; both decide with :func:`check_devices` (Ansible through a filter plugin
that imports it).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from aicluster.common.settings import layered, setting

#: lsblk's columns (MOUNTPOINTS, all of a device's mount points, is util-linux 2.37+).
LSBLK_COLUMNS = "NAME,KNAME,PATH,MAJ:MIN,TYPE,SIZE,FSTYPE,LABEL,UUID,MOUNTPOINTS"
LSBLK_OLD_COLUMNS = LSBLK_COLUMNS.replace("MOUNTPOINTS", "MOUNTPOINT")


def command_text(devices: Iterable[str], paths: Iterable[str] = ()) -> str:
    """The shell that reads the node's block devices. Needs root (wipefs, blkid -p).

    Prints sections: ``@@lsblk`` (the whole lsblk tree as JSON), then per device
    ``@@device PATH`` with ``real=``, ``block=``, ``holders=``, the ``wipefs -n -J``
    JSON and ``wipefs-rc=``, ``blkid -p`` tags (``blkid:KEY=VALUE``), and per path
    ``@@mount PATH`` with the source and type of what is mounted there (nothing if
    nothing is)."""
    lines = [
        "echo @@lsblk",
        f"lsblk -J -b -o {LSBLK_COLUMNS} 2>/dev/null"
        f" || lsblk -J -b -o {LSBLK_OLD_COLUMNS} 2>/dev/null || echo '{{}}'",
    ]
    for device in devices:
        q = shlex.quote(device)
        lines.append(
            f"echo '@@device '{q}; r=$(readlink -f -- {q}); echo \"real=$r\"; "
            'if [ -b "$r" ]; then echo block=yes; '
            'k=$(basename "$(readlink -f "/sys/class/block/$(basename "$r")")"); '
            'echo "holders=$(ls "/sys/class/block/$k/holders" 2>/dev/null | tr \'\\n\' \' \')"; '
            'echo @@wipefs; wipefs -n -J -- "$r" 2>&1; echo "@@wipefs-rc=$?"; '
            'blkid -p -o export -- "$r" 2>/dev/null | sed \'s/^/blkid:/\'; '
            'elif [ -e "$r" ]; then echo block=no; fi'
        )
    for path in paths:
        q = shlex.quote(path)
        lines.append(
            f"echo '@@mount '{q}; findmnt -n -o SOURCE,FSTYPE -M {q} 2>/dev/null || true"
        )
    lines.append("true")
    return "; ".join(lines)


def _device_record(real: str = "") -> dict[str, Any]:
    return {
        "real": real,
        "exists": False,
        "block": None,
        "holders": [],
        "signatures": None,  # None: could not be read
        "wipefs_error": "",
        "blkid": {},
    }


def parse(lines: Iterable[str]) -> dict[str, Any]:
    """What :func:`command_text` printed, as ``{"lsblk": [...], "devices": {PATH:
    {...}}, "mounts": {PATH: {"source", "fstype"} or None}}``."""
    out: dict[str, Any] = {"lsblk": [], "devices": {}, "mounts": {}}
    section = None
    mount_path = ""
    current: dict[str, Any] | None = None
    buffer: list[str] = []

    def flush() -> None:
        nonlocal buffer
        text = "\n".join(buffer).strip()
        if section == "lsblk":
            try:
                out["lsblk"] = json.loads(text or "{}").get("blockdevices") or []
            except ValueError:
                out["lsblk"] = []
        elif section == "wipefs" and current is not None:
            current["_wipefs_text"] = text
        buffer = []

    for raw in lines:
        line = str(raw).rstrip("\n")
        if line.startswith("@@"):
            flush()
            if line == "@@lsblk":
                section = "lsblk"
            elif line.startswith("@@device "):
                section = "device"
                current = _device_record()
                out["devices"][line[len("@@device "):]] = current
            elif line == "@@wipefs":
                section = "wipefs"
            elif line.startswith("@@wipefs-rc="):
                section = "device"
                if current is not None:
                    text = current.pop("_wipefs_text", "")
                    current["signatures"], current["wipefs_error"] = _wipefs(
                        text, line.split("=", 1)[1]
                    )
            elif line.startswith("@@mount "):
                section = "mount"
                current = None
                mount_path = line[len("@@mount "):]
                out["mounts"][mount_path] = None
            continue
        if section in ("lsblk", "wipefs"):
            buffer.append(line)
        elif section == "device" and current is not None:
            key, _, value = line.partition("=")
            if key == "real":
                current["real"] = value
            elif key == "block":
                # Printed only when the path exists (readlink -f alone does not tell).
                current["block"] = value == "yes"
                current["exists"] = True
            elif key == "holders":
                current["holders"] = value.split()
            elif key.startswith("blkid:"):
                current["blkid"][key[len("blkid:"):]] = value
        elif section == "mount" and line.strip():
            source, _, fstype = line.strip().partition(" ")
            out["mounts"][mount_path] = {"source": source, "fstype": fstype.strip()}
    flush()
    return out


def _wipefs(text: str, rc: str) -> tuple[list[dict[str, str]] | None, str]:
    """Signatures from ``wipefs -n -J`` (nothing printed: none), or None and why."""
    if rc.strip() != "0":
        return None, text.strip().splitlines()[-1] if text.strip() else f"exit {rc}"
    if not text.strip():
        return [], ""
    try:
        data = json.loads(text)
    except ValueError:
        return None, text.strip().splitlines()[-1]
    return [
        {k: (s.get(k) or "") for k in ("type", "offset", "label", "uuid")}
        for s in data.get("signatures") or []
    ], ""


# ---------------------------------------------------------------------------
# The rule (one place; nvme_cache, and later ceph and minio, use it)
# ---------------------------------------------------------------------------


def _mountpoints(node: Mapping[str, Any]) -> list[str]:
    points = node.get("mountpoints")
    if points is None:
        points = [node.get("mountpoint")]
    return [p for p in points if p]


def _walk(node: Mapping[str, Any]):
    yield node
    for child in node.get("children") or []:
        yield from _walk(child)


def _find(tree: list[Mapping[str, Any]], real: str) -> list[list[Mapping[str, Any]]]:
    """Every path from a top-level device down to a node whose path is ``real`` (a
    device shows up under each disk it spans: an md array under every member)."""
    found = []

    def visit(node, trail):
        trail = [*trail, node]
        if node.get("path") == real or f"/dev/{node.get('kname', '')}" == real:
            found.append(trail)
        for child in node.get("children") or []:
            visit(child, trail)

    for top in tree:
        visit(top, [])
    return found


def root_disks(tree: list[Mapping[str, Any]]) -> list[str]:
    """The top-level devices whose tree holds the filesystem mounted at ``/``."""
    return [
        top.get("path") or f"/dev/{top.get('kname')}"
        for top in tree
        if any("/" in _mountpoints(n) for n in _walk(top))
    ]


def describe(signatures: Iterable[Mapping[str, str]]) -> str:
    """``ext4 (label 'data')``, ``gpt partition table``, ``linux_raid_member ('h:md0')``."""
    parts = []
    for s in signatures:
        kind = s.get("type") or "unknown signature"
        if kind in ("gpt", "dos", "PMBR"):
            text = f"a {kind} partition table"
        else:
            text = kind
        if s.get("label"):
            text += f" (label {s['label']!r})"
        if text not in parts:
            parts.append(text)
    return ", ".join(parts)


def _matches(signature: Mapping[str, str], ours: Iterable[Mapping[str, str]]) -> bool:
    return any(all(signature.get(k, "") == v for k, v in o.items()) for o in ours)


def check_devices(
    fact: Mapping[str, Any],
    wanted: Iterable[Mapping[str, Any]],
    ours: Iterable[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """Decide, for each device the inventory names (``{"device", "wipe"}``), whether it
    may be changed.

    ``ours`` describes what the caller itself makes on a device (``{"type": "xfs",
    "label": "nvme-cache"}``): a device holding only signatures matching one of them is
    the caller's own and is ``"ours"``. Returns ``{"problems": [lines], "devices":
    {device: {"state": "empty" | "ours" | "wipe" | "refused", "real": path,
    "found": text}}}``; a device is changed only when its state is ``empty`` or
    ``wipe``, and no device at all when there is any problem."""
    ours = list(ours)
    tree = fact.get("lsblk") or []
    roots = root_disks(tree)
    problems: list[str] = []
    states: dict[str, dict[str, Any]] = {}
    for item in wanted:
        device, wipe = item["device"], bool(item.get("wipe"))
        rec = (fact.get("devices") or {}).get(device) or _device_record()
        real = rec.get("real") or device
        entry = {"state": "refused", "real": real, "found": ""}
        states[device] = entry
        named = device if real == device else f"{device} ({real})"
        if not rec.get("exists"):
            problems.append(f"{named} does not exist on the node")
            continue
        if not rec.get("block"):
            problems.append(f"{named} is not a block device")
            continue
        trails = _find(tree, real)
        top_paths = {t[0].get("path") for t in trails}
        if top_paths & set(roots) or real in roots:
            problems.append(
                f"{named} holds / (the system disk); aicluster never changes it, "
                "wipe or not"
            )
            continue
        node = trails[0][-1] if trails else {}
        mounted = sorted({p for n in _walk(node) for p in _mountpoints(n)}) if node else []
        children = [
            c for c in (node.get("children") or []) if c.get("type") == "part"
        ] if node else []
        holders = list(rec.get("holders") or [])
        signatures = rec.get("signatures")
        if signatures is None:
            problems.append(
                f"{named}: cannot read its signatures (wipefs: "
                f"{rec.get('wipefs_error') or 'no answer'}); nothing is changed on a "
                "device that cannot be read"
            )
            continue
        blkid_type = (rec.get("blkid") or {}).get("TYPE")
        if not signatures and blkid_type:
            # Some formats blkid knows are not listed by wipefs (a Ceph bluestore OSD,
            # seen on util-linux 2.38): what blkid finds counts as much.
            signatures = [{"type": blkid_type, "offset": "",
                           "label": (rec.get("blkid") or {}).get("LABEL", ""),
                           "uuid": (rec.get("blkid") or {}).get("UUID", "")}]
        found = []
        if signatures:
            found.append(describe(signatures))
        if children:
            found.append(
                "partition(s) " + ", ".join(c.get("path") or c.get("name", "") for c in children)
            )
        if holders:
            found.append("in use by " + ", ".join(holders))
        if mounted:
            found.append("mounted at " + ", ".join(mounted))
        entry["found"] = "; ".join(found)
        is_ours = bool(signatures) and not children and all(
            _matches(s, ours) for s in signatures
        )
        if is_ours:
            entry["state"] = "ours"
        elif not found:
            entry["state"] = "empty"
        elif mounted or holders:
            why = f"is mounted at {', '.join(mounted)}" if mounted else (
                f"is in use by {', '.join(holders)}"
            )
            problems.append(
                f"{named} {why} (it holds {entry['found']}); a device in use is never "
                "wiped, even with wipe: true"
            )
        elif wipe:
            entry["state"] = "wipe"
        else:
            problems.append(
                f"{named} holds {entry['found']}; nothing is changed. If that data may "
                f"be destroyed, set wipe: true on this device in the inventory "
                "(hardware.nvme)"
            )
    return {"problems": problems, "devices": states}


# ---------------------------------------------------------------------------
# Which drives the inventory gives to which use (a device has one use)
# ---------------------------------------------------------------------------


def cache_devices(cluster: Any, host_name: str, data: Mapping[str, Any]) -> list[dict]:
    """The NVMe cache's drives as ``{"device", "wipe"}``, in the inventory's order: the
    listed nvme_cache_devices (each must be a hardware.nvme drive), or every drive."""
    h = cluster.hosts[host_name]
    nvme = {d.device: d for d in h.spec.hardware.nvme}
    chosen = setting("nvme_cache", data, "nvme_cache_devices")
    names = list(nvme) if chosen is None else [d for d in chosen if d in nvme]
    return [{"device": d, "wipe": nvme[d].wipe} for d in names]


def osd_devices(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The host's ``ceph_osd_devices`` as ``{"device", "wipe"}`` (a plain path means
    wipe: false)."""
    out = []
    for item in layered("ceph", data)["ceph_osd_devices"] or []:
        if isinstance(item, str):
            out.append({"device": item, "wipe": False})
        elif isinstance(item, Mapping) and "device" in item:
            out.append({"device": str(item["device"]), "wipe": item.get("wipe") is True})
    return out


# ---------------------------------------------------------------------------
# The NVMe cache's directories, where other components put their data
# ---------------------------------------------------------------------------


def cache_directories(data: Mapping[str, Any]) -> tuple[list[dict], list[list[str]]]:
    """The cache's directories (path, owner, group, mode, home) and the environment
    variables that point at them (``[[name, path], ...]``)."""
    v = layered("nvme_cache", data)
    path = str(v["nvme_cache_path"]).rstrip("/") or "/"
    directories = []
    environment = []
    for entry in v["nvme_cache_directories"] or []:
        full = f"{path}/{entry['path']}"
        owner = entry.get("owner", "root")
        directories.append({
            "path": full,
            "owner": owner,
            "group": entry.get("group", owner),
            "mode": str(entry.get("mode", "0755")),
            "home": entry.get("home") or ("/root" if owner == "root" else f"/var/lib/{owner}"),
        })
        environment += [[name, full] for name in entry.get("env") or []]
    return directories, environment


def cache_environment(cluster: Any, host_name: str, data: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables the host's NVMe cache sets (``RAY_TMPDIR``,
    ``OLLAMA_MODELS`` ...), or nothing when the host has no cache drive."""
    if "nvme_cache" not in cluster.hosts[host_name].components():
        return {}
    if not cache_devices(cluster, host_name, data):
        return {}
    return dict(cache_directories(data)[1])
