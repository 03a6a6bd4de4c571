"""Testbed disks without root: sizes, the files a node gets, and that `down` detaches
only loop devices backed by the testbed's own disk files."""

from __future__ import annotations

import subprocess

import pytest

from aicluster.testbed import disks
from aicluster.testbed import state as st
from aicluster.testbed.errors import TestbedError


def test_sizes():
    assert disks.parse_size("1G") == 1024**3
    assert disks.parse_size("512M") == 512 * 1024**2
    for bad in ("1", "1T", "0G", "100M", "65G", "1.5G", "-1G"):
        with pytest.raises(TestbedError):
            disks.parse_size(bad)


def test_the_node_files_name_each_disk_by_id(tmp_path):
    data = {"disks": [
        {"node": "node1", "name": "held", "loop": "/dev/loop8", "major": 7, "minor": 8,
         "by_id": "/dev/disk/by-id/aicluster-testbed-node1-held"},
        {"node": "node2", "name": "cache", "loop": "/dev/loop9", "major": 7, "minor": 9,
         "by_id": "/dev/disk/by-id/aicluster-testbed-node2-cache"},
    ]}
    disks._write_node_files(tmp_path, data, "node1")
    assert (tmp_path / disks.NODE_CONFIG).read_text() == "aicluster-testbed-node1-held loop8 7 8\n"
    assert (tmp_path / disks.NODE_SCRIPT).stat().st_mode & 0o755 == 0o755
    assert "mknod" in (tmp_path / disks.NODE_SCRIPT).read_text()
    link = tmp_path / disks.NODE_UNIT_LINK
    assert link.is_symlink() and str(link.readlink()) == "/" + disks.NODE_UNIT


def test_the_script_makes_the_device_nodes_and_names(tmp_path):
    """Run the node script against a scratch /dev (paths rewritten), with mknod
    recorded instead of run (no root needed)."""
    dev = tmp_path / "dev"
    (tmp_path / "disks").write_text("aicluster-testbed-node1-held loop8 7 8\n")
    script = disks.SCRIPT.replace("/dev/", f"{dev}/").replace(
        "/etc/aicluster-testbed/disks", str(tmp_path / "disks")
    ).replace('mknod -m 660 "', f'echo mknod >> {tmp_path}/calls; touch "').replace(
        ' b "$major" "$minor"', ""  # touch takes the node's path only
    )
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "calls").read_text() == "mknod\n"
    link = dev / "disk" / "by-id" / "aicluster-testbed-node1-held"
    assert str(link.readlink()) == "../../loop8"


def test_down_detaches_only_loops_backed_by_our_files(monkeypatch, tmp_path):
    monkeypatch.setenv(st.STATE_DIR_ENV, str(tmp_path / "state"))
    ours = disks.disks_dir() / "node1" / "held.img"
    ours.parent.mkdir(parents=True)
    ours.write_bytes(b"")
    data = {"disks": [
        {"node": "node1", "name": "held", "file": str(ours), "loop": "/dev/loop8"},
        # Reused by someone else since: never detached.
        {"node": "node2", "name": "cache", "file": str(tmp_path / "gone.img"),
         "loop": "/dev/loop9"},
    ]}
    attached = {str(ours): ["/dev/loop8"]}
    backing = {"/dev/loop8": None, "/dev/loop9": "/srv/other.img"}
    detached: list[str] = []
    monkeypatch.setattr(disks, "attached_to", lambda path: attached.get(str(path), []))
    monkeypatch.setattr(disks, "backing_file", lambda loop: backing[loop])

    def run(argv, **kw):
        assert argv[:2] == ["losetup", "--detach"], argv
        detached.append(argv[2])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(disks, "run", run)
    disks.remove_disks(data)
    assert detached == ["/dev/loop8"]
    assert not disks.disks_dir().exists()
