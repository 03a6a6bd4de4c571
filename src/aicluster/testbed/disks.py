"""Disks for testbed nodes: sparse files on the host, attached as loop devices and
given to a node under a stable name, ``/dev/disk/by-id/aicluster-testbed-NODE-NAME``.

    aicluster testbed up --nodes 2 --disks 1 --disk-size 1G
    aicluster testbed disk add node1 data --size 1G

How a disk reaches a node (TESTBED.md: loop devices and XFS work inside a node):

* the file is ``<state>/disks/NODE/NAME.img`` (sparse: it takes no space until written)
  and is attached on the host with ``losetup --find --show``;
* the node gets the same device node, ``/dev/loopN`` (block, major 7), made with
  ``mknod`` inside the node, and the symlink
  ``/dev/disk/by-id/aicluster-testbed-NODE-NAME -> ../../loopN`` (nodes run no udev,
  so nothing else makes one), by ``/usr/local/sbin/aicluster-testbed-disks``: run at
  once over SSH, and at every boot of the node by ``aicluster-testbed-disks.service``
  from ``/etc/aicluster-testbed/disks``. No device cgroup rule is needed: the testbed
  puts nodes in cgroups of the ``systemd`` and ``unified`` hierarchies only, never in
  one of the ``devices`` controller, so a node may open any device node it has.
* ``down`` detaches the loop devices it recorded (each only if it is still backed by
  the recorded file) and deletes the files.

md RAID cannot be tested here (the kernel has no md driver): a testbed disk is a
single drive.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from aicluster.testbed import state as st
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.system import log, run

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
SIZE_RE = re.compile(r"^([1-9][0-9]*)([MG])$")
#: XFS refuses filesystems under 300 MiB; a sparse file costs nothing until written.
MIN_BYTES = 300 * 1024**2
MAX_BYTES = 64 * 1024**3
LOOP_MAJOR = 7

NODE_CONFIG = "etc/aicluster-testbed/disks"
NODE_SCRIPT = "usr/local/sbin/aicluster-testbed-disks"
NODE_UNIT = "etc/systemd/system/aicluster-testbed-disks.service"
NODE_UNIT_LINK = "etc/systemd/system/sysinit.target.wants/aicluster-testbed-disks.service"

#: Makes the loop device nodes and their by-id names in the node (no udev there).
SCRIPT = """\
#!/bin/sh
# aicluster testbed: the node's disks (loop devices attached on the host), each as
# /dev/loopN and /dev/disk/by-id/aicluster-testbed-NODE-NAME. Lines of
# /etc/aicluster-testbed/disks: BY_ID_NAME LOOP_NAME MAJOR MINOR.
set -eu
mkdir -p /dev/disk/by-id
while read -r by_id loop major minor; do
    [ -n "$by_id" ] || continue
    [ -b "/dev/$loop" ] || mknod -m 660 "/dev/$loop" b "$major" "$minor"
    ln -sfn "../../$loop" "/dev/disk/by-id/$by_id"
done < /etc/aicluster-testbed/disks
"""

UNIT = """\
[Unit]
Description=Testbed disks: loop device nodes and /dev/disk/by-id names (aicluster testbed)
DefaultDependencies=no
Before=sysinit.target local-fs-pre.target
ConditionPathExists=/etc/aicluster-testbed/disks

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/aicluster-testbed-disks

[Install]
WantedBy=sysinit.target
"""


def parse_size(size: str) -> int:
    """``"1G"`` -> bytes. Sizes are whole MiB or GiB, 300M to 64G."""
    m = SIZE_RE.match(str(size))
    if not m:
        raise TestbedError(f"disk size {size!r}: give it as e.g. 512M or 1G")
    value = int(m.group(1)) * (1024**2 if m.group(2) == "M" else 1024**3)
    if not MIN_BYTES <= value <= MAX_BYTES:
        raise TestbedError(f"disk size {size!r}: must be between 300M and 64G "
                           "(XFS needs 300 MiB)")
    return value


def by_id_name(node: str, name: str) -> str:
    return f"aicluster-testbed-{node}-{name}"


def disks_dir(base: Path | None = None) -> Path:
    return (base or st.state_dir()) / "disks"


def node_disks(data: dict[str, Any] | None, node: str) -> list[dict[str, Any]]:
    """The disks of one node recorded in the state."""
    return [d for d in (data or {}).get("disks") or [] if d["node"] == node]


def backing_file(loop: str) -> str | None:
    """The file a loop device is attached to (None: not attached)."""
    proc = subprocess.run(
        ["losetup", "--noheadings", "--output", "BACK-FILE", loop],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def _write_node_files(root: Path, data: dict[str, Any], node: str) -> None:
    from aicluster.testbed.image import _safe_path, write_file

    lines = []
    for d in node_disks(data, node):
        lines.append(f"{d['by_id'].rsplit('/', 1)[1]} {Path(d['loop']).name} "
                     f"{d['major']} {d['minor']}")
    write_file(root, NODE_CONFIG, "\n".join(lines) + "\n")
    write_file(root, NODE_SCRIPT, SCRIPT, 0o755)
    write_file(root, NODE_UNIT, UNIT)
    link = _safe_path(root, NODE_UNIT_LINK)
    if not link.is_symlink():
        link.symlink_to("/" + NODE_UNIT)


def add_disk(data: dict[str, Any], node: str, name: str, size: str) -> dict[str, Any]:
    """Give running node *node* a disk *name* of *size* (kept if it has one by that
    name). Saves the state as soon as the loop device is attached. Caller holds the
    testbed lock."""
    from aicluster.testbed.node import ssh_command

    if not NAME_RE.match(name):
        raise TestbedError(f"disk name {name!r}: use lowercase letters, digits and '-'")
    entry = next((n for n in data["nodes"] if n["name"] == node), None)
    if entry is None:
        names = ", ".join(n["name"] for n in data["nodes"]) or "none"
        raise TestbedError(f"no node {node!r} in the testbed (nodes: {names})")
    for d in node_disks(data, node):
        if d["name"] == name:
            return d
    size_bytes = parse_size(size)
    path = disks_dir() / node / f"{name}.img"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as f:  # a new, sparse file
        f.truncate(size_bytes)
    try:
        loop = run(["losetup", "--find", "--show", str(path)], timeout=30).stdout.strip()
    except TestbedError:
        path.unlink(missing_ok=True)
        raise
    rdev = os.stat(loop).st_rdev
    disk = {
        "node": node,
        "name": name,
        "file": str(path),
        "loop": loop,
        "major": os.major(rdev),
        "minor": os.minor(rdev),
        "size_bytes": size_bytes,
        "by_id": f"/dev/disk/by-id/{by_id_name(node, name)}",
    }
    data.setdefault("disks", []).append(disk)
    st.save_state(data)
    _write_node_files(Path(entry["root"]), data, node)
    proc = subprocess.run(
        ssh_command(data["ssh_key"], entry["address"], ["/" + NODE_SCRIPT], batch=True),
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise TestbedError(f"{node}: could not make {disk['by_id']} in the node: "
                           f"{(proc.stdout + proc.stderr).strip()[-1000:]}")
    log(f"{node}: disk {name} ({size}) is {loop} on the host, {disk['by_id']} in the node")
    return disk


def attached_to(path: Path) -> list[str]:
    """The loop devices attached to the file *path*."""
    proc = subprocess.run(
        ["losetup", "--noheadings", "--output", "NAME", "--associated", str(path)],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    return proc.stdout.split() if proc.returncode == 0 else []


def remove_disks(data: dict[str, Any] | None, base: Path | None = None) -> None:
    """Detach the loop devices the state records (only while still backed by the
    recorded file), and any loop device still attached to a disk file of the state
    directory (one attached just before a crash), then delete the files. Nodes must
    be stopped."""
    ddir = disks_dir(base)
    for img in sorted(ddir.glob("*/*.img")) if ddir.is_dir() else []:
        for loop in attached_to(img):
            run(["losetup", "--detach", loop], timeout=30)
            log(f"detached {loop} ({img})")
    for d in (data or {}).get("disks") or []:
        back = backing_file(d["loop"])
        if back is not None and back.removesuffix(" (deleted)") == d["file"]:
            run(["losetup", "--detach", d["loop"]], timeout=30)
            log(f"detached {d['loop']} ({d['node']} disk {d['name']})")
        elif back is not None:
            log(f"{d['loop']} is now backed by {back}, not {d['file']}; left alone")
    if ddir.is_dir():
        for img in sorted(ddir.glob("*/*.img")):
            img.unlink()
        for sub in sorted(ddir.iterdir()):
            if sub.is_dir():
                sub.rmdir()
        ddir.rmdir()
