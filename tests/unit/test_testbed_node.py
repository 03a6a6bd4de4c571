"""Unit tests of aicluster.testbed.node and host (command lines, cgroup paths)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aicluster.testbed import node
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.host import cgroup_hierarchies


def test_nspawn_command() -> None:
    argv = node.nspawn_command("node2", Path("/s/nodes/node2/root"))
    assert argv[:5] == ["systemd-nspawn", "-D", "/s/nodes/node2/root", "-M", "node2"]
    for flag in (
        "--boot",
        "--register=no",
        "--keep-unit",
        "--network-bridge=acmgmt0",
        "--network-veth-extra=vf-node2:fabric0",
        "--resolv-conf=off",
        "--timezone=off",
        "--console=passive",
        "--system-call-filter=open_by_handle_at",
        "--rlimit=MEMLOCK=infinity",
    ):
        assert flag in argv


def test_nspawn_command_gives_fuse_when_the_host_has_it(monkeypatch, tmp_path) -> None:
    fuse = tmp_path / "fuse"
    monkeypatch.setattr(node, "FUSE_DEVICE", str(fuse))
    assert not any(a.startswith("--bind=") for a in node.nspawn_command("n", "/r"))
    fuse.touch()
    assert f"--bind={fuse}" in node.nspawn_command("n", "/r")


def test_ssh_command() -> None:
    argv = node.ssh_command("/k/id", "10.213.0.11", ["ping", "-c1", "x"])
    assert argv[:3] == ["ssh", "-i", "/k/id"]
    assert "StrictHostKeyChecking=no" in argv
    assert "UserKnownHostsFile=/dev/null" in argv
    assert "LogLevel=ERROR" in argv
    assert argv[-4:] == ["root@10.213.0.11", "ping", "-c1", "x"]
    assert "BatchMode=yes" in node.ssh_command("/k/id", "a", batch=True)


def test_cgroup_paths(tmp_path) -> None:
    for name in ("systemd", "unified", "memory"):
        (tmp_path / name).mkdir()
    roots = cgroup_hierarchies(tmp_path)
    assert roots == [tmp_path / "systemd", tmp_path / "unified"]
    assert node.cgroup_dirs("node1", roots) == [
        tmp_path / "systemd/aicluster-testbed/node1",
        tmp_path / "unified/aicluster-testbed/node1",
    ]


def test_cgroup_v2_only(tmp_path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert cgroup_hierarchies(tmp_path) == [tmp_path]
    assert cgroup_hierarchies(tmp_path / "missing") == []


def test_wait_ssh_names_the_dead_node(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("AICLUSTER_TESTBED_DIR", str(tmp_path))
    log = node.node_log("node2")
    log.parent.mkdir(parents=True)
    log.write_text("Failed to add new veth interfaces (vb-node2:host0): File exists\n")
    entry = {"name": "node2", "address": "10.213.0.12", "pid": None}
    with pytest.raises(TestbedError) as err:
        node.wait_ssh([entry], tmp_path / "key", timeout=5)
    message = err.value.message
    assert "node2: its systemd-nspawn supervisor exited" in message
    assert "File exists" in message


class _FakeSsh:
    """Stands in for subprocess.run of the refresh over SSH: records which node ran it
    when, and fails the nodes named in *failing*."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.calls: list[str] = []
        self.running = 0
        self.most_at_once = 0

    def __call__(self, argv, **kwargs):
        import subprocess

        address = next(a for a in argv if a.startswith("root@")).removeprefix("root@")
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.calls.append(address)
        assert argv[-1] == node.REFRESH_INDEX
        self.running -= 1
        rc = 100 if address in self.failing else 0
        return subprocess.CompletedProcess(argv, rc, "", "E: Failed to fetch InRelease")


def test_package_index_is_refreshed_one_node_at_a_time(monkeypatch) -> None:
    fake = _FakeSsh(set())
    monkeypatch.setattr(node.subprocess, "run", fake)
    entries = [{"name": f"node{i}", "address": f"10.213.0.{10 + i}"} for i in (1, 2, 3)]
    node.refresh_package_index(entries, "/k/id")
    assert fake.calls == ["10.213.0.11", "10.213.0.12", "10.213.0.13"]
    assert fake.most_at_once == 1
    # The stamp apt's periodic job writes is what both engines' cache times read.
    assert "/var/lib/apt/periodic/update-success-stamp" in node.REFRESH_INDEX


def test_package_index_refresh_failure_names_the_node(monkeypatch) -> None:
    fake = _FakeSsh({"10.213.0.12"})
    monkeypatch.setattr(node.subprocess, "run", fake)
    monkeypatch.setattr(node.time, "sleep", lambda s: None)
    entries = [{"name": f"node{i}", "address": f"10.213.0.{10 + i}"} for i in (1, 2, 3)]
    with pytest.raises(TestbedError) as err:
        node.refresh_package_index(entries, "/k/id", attempts=2)
    assert "node2: apt-get update through the package proxy failed 2 times" in err.value.message
    assert "Failed to fetch InRelease" in err.value.message
    # node3 is never asked once node2 failed.
    assert fake.calls == ["10.213.0.11", "10.213.0.12", "10.213.0.12"]
