"""aicluster.common.mounts: the mount command both engines run fails when the mount did
not happen, whatever ``mount`` itself said.

``mount`` and ``findmnt`` are replaced by small scripts on PATH (what each prints and
returns is the test's), and the command runs in ``sh`` as on a node.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from aicluster.common.mounts import mount_command


def _run(tmp_path: Path, mount_rc: int, mount_says: str, findmnt_says: str,
         types=("fuse.ceph-fuse",)) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mount").write_text(f"#!/bin/sh\necho {shlex.quote(mount_says)}\nexit {mount_rc}\n")
    (bin_dir / "findmnt").write_text(f"#!/bin/sh\nprintf '%s' {shlex.quote(findmnt_says)}\n")
    for tool in ("mount", "findmnt"):
        (bin_dir / tool).chmod(0o755)
    command = mount_command("/mnt/cephfs", types, "CephFS cephfs (fuse client)", wait=1)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True,
                          timeout=30)


def test_a_mount_that_exits_0_but_mounted_nothing_fails_with_the_tools_message(tmp_path):
    # ceph-fuse without /dev/fuse: mount.fuse.ceph exits 0, nothing is mounted.
    proc = _run(tmp_path, 0, "fuse: device not found, try 'modprobe fuse' first", "",
                types=("fuse.ceph-fuse", "fuse.ceph"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "CephFS cephfs (fuse client) is not mounted at /mnt/cephfs (mount exited 0; the "
        "mount point has no filesystem, expected fuse.ceph fuse.ceph-fuse): "
        "fuse: device not found, try 'modprobe fuse' first")


def test_a_failing_mount_fails_with_its_exit_status(tmp_path):
    proc = _run(tmp_path, 32, "mount: /mnt/cephfs: can't find in /etc/fstab.", "")
    assert proc.returncode == 1
    assert "(mount exited 32;" in proc.stderr
    assert "can't find in /etc/fstab." in proc.stderr


def test_another_filesystem_at_the_mount_point_is_not_the_mount(tmp_path):
    proc = _run(tmp_path, 0, "", "xfs")
    assert proc.returncode == 1
    assert "the mount point has xfs, expected" in proc.stderr
    assert "mount printed nothing" in proc.stderr


def test_the_expected_filesystem_at_the_mount_point_succeeds(tmp_path):
    proc = _run(tmp_path, 0, "", "fuse.ceph-fuse")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_already_mounted_is_mounted(tmp_path):
    # `mount` refuses (already mounted, 32) but the filesystem is there: done.
    proc = _run(tmp_path, 32, "mount: /mnt/cephfs: already mounted", "nfs4",
                types=("nfs", "nfs4"))
    assert proc.returncode == 0, proc.stderr


def test_a_path_with_spaces_is_quoted(tmp_path):
    command = mount_command("/mnt/my cache", ["xfs"], "UUID=1")
    assert "mount '/mnt/my cache'" in command
    assert "--mountpoint '/mnt/my cache'" in command


def test_no_filesystem_type_is_a_programming_error():
    with pytest.raises(ValueError):
        mount_command("/mnt/x", [], "x")
