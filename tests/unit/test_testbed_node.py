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
