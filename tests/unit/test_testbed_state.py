"""Unit tests of aicluster.testbed.state (names, addresses, the state file)."""

from __future__ import annotations

import json

import pytest

from aicluster.testbed import state as st


def test_names_and_addresses() -> None:
    assert st.node_name(1) == "node1"
    assert st.node_number("node12") == 12
    assert st.management_address(1) == "10.213.0.11"
    assert st.management_address(3) == "10.213.0.13"
    assert st.fabric_address(2) == "10.213.1.12"
    assert st.fabric_mac(1) == "02:ac:13:01:00:01"
    assert st.fabric_mac(200) == "02:ac:13:01:00:c8"
    assert st.host_veth_names("node7") == ("vb-node7", "vf-node7")


def test_fabric_address_exported_from_package() -> None:
    from aicluster.testbed import fabric_address

    assert fabric_address(5) == "10.213.1.15"


def test_mac_is_locally_administered_unicast() -> None:
    first = int(st.fabric_mac(9).split(":")[0], 16)
    assert first & 0b10 and not first & 0b01


@pytest.mark.parametrize("bad", [0, -1, st.MAX_NODES + 1, True, "1"])
def test_bad_node_numbers(bad: object) -> None:
    with pytest.raises(ValueError):
        st.node_name(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["node", "node0", "node01", "Node1", "host1", "node1x"])
def test_bad_node_names(bad: str) -> None:
    with pytest.raises(ValueError):
        st.node_number(bad)


def test_dirs_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(st.STATE_DIR_ENV, raising=False)
    monkeypatch.delenv(st.CACHE_DIR_ENV, raising=False)
    assert str(st.state_dir()) == "/var/lib/aicluster/testbed"
    assert str(st.cache_dir()) == "/var/cache/aicluster/testbed"
    monkeypatch.setenv(st.STATE_DIR_ENV, str(tmp_path / "s"))
    monkeypatch.setenv(st.CACHE_DIR_ENV, str(tmp_path / "c"))
    assert st.state_dir() == tmp_path / "s"
    assert st.cache_dir() == tmp_path / "c"
    assert st.state_file() == tmp_path / "s" / "state.json"


def test_load_state_none_without_testbed(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv(st.STATE_DIR_ENV, str(tmp_path))
    assert st.load_state() is None


def test_state_round_trip(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv(st.STATE_DIR_ENV, str(tmp_path))
    data = st.empty_state()
    data["nodes"] = [st.node_entry(10, 99), st.node_entry(2, 42)]
    data["proxies"] = {"apt-cacher-ng": {"pid": 7}, "tinyproxy": {"pid": 8}}
    path = st.save_state(data)
    assert path == tmp_path / "state.json"
    loaded = st.load_state()
    assert loaded is not None
    assert [n["name"] for n in loaded["nodes"]] == ["node2", "node10"]  # numeric order
    assert loaded["nodes"][0] == {
        "name": "node2",
        "address": "10.213.0.12",
        "fabric_nic": "fabric0",
        "fabric_mac": "02:ac:13:01:00:02",
        "pid": 42,
        "root": str(tmp_path / "nodes" / "node2" / "root"),
    }
    assert loaded["management"] == {
        "bridge": "acmgmt0", "subnet": "10.213.0.0/24", "host_address": "10.213.0.1",
    }
    assert loaded["fabric"] == {"bridge": "acfab0", "subnet": "10.213.1.0/24"}
    assert loaded["ssh_key"] == str(tmp_path / "id_ed25519")
    assert loaded["package_proxy"] == "http://10.213.0.1:3142"
    assert loaded["pip_proxy"] == "http://10.213.0.1:8888"
    assert loaded["proxies"]["tinyproxy"]["pid"] == 8
    # Plain JSON on disk, no temporary file left behind.
    assert json.loads(path.read_text())["nodes"][1]["name"] == "node10"
    assert not (tmp_path / "state.json.tmp").exists()


def test_load_state_from_package(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from aicluster.testbed import load_state

    monkeypatch.setenv(st.STATE_DIR_ENV, str(tmp_path))
    assert load_state() is None
    st.save_state(st.empty_state())
    assert load_state() == st.empty_state()
