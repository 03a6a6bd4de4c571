"""Unit tests of ``aicluster testbed`` (no root, no testbed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from aicluster.cli import main
from aicluster.testbed import state as st


@pytest.fixture()
def empty_state(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv(st.STATE_DIR_ENV, str(tmp_path / "state"))
    monkeypatch.setenv(st.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path


def test_not_root_exits_2(monkeypatch: pytest.MonkeyPatch, empty_state) -> None:
    monkeypatch.setattr("aicluster.testbed.host.os.geteuid", lambda: 1000)
    for args in (["testbed", "up"], ["testbed", "down"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert "needs root" in result.output


def test_status_without_testbed(empty_state) -> None:
    result = CliRunner().invoke(main, ["testbed", "status"])
    assert result.exit_code == 0
    assert "no testbed" in result.output


def test_ssh_without_testbed(empty_state) -> None:
    result = CliRunner().invoke(main, ["testbed", "ssh", "node1"])
    assert result.exit_code == 2
    assert "no testbed" in result.output


def test_ssh_execs_with_key(monkeypatch: pytest.MonkeyPatch, empty_state) -> None:
    data = st.empty_state()
    data["nodes"] = [st.node_entry(1, 123)]
    st.save_state(data)
    seen: list[list[str]] = []
    monkeypatch.setattr("aicluster.testbed.cli.os.execvp", lambda f, argv: seen.append(argv))
    result = CliRunner().invoke(main, ["testbed", "ssh", "node1", "ping", "-c1", "10.213.0.12"])
    assert result.exit_code == 0, result.output
    argv = seen[0]
    assert argv[:3] == ["ssh", "-i", str(empty_state / "state" / "id_ed25519")]
    assert argv[-4:] == ["root@10.213.0.11", "ping", "-c1", "10.213.0.12"]
    result = CliRunner().invoke(main, ["testbed", "ssh", "node9"])
    assert result.exit_code == 2 and "no node 'node9'" in result.output


def test_up_rejects_bad_count(empty_state) -> None:
    result = CliRunner().invoke(main, ["testbed", "up", "--nodes", "0"])
    assert result.exit_code == 2
