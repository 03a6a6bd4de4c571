"""aicluster.accel.connect_once.connect_once: a host is connected once, however many
greenlets ask for one of its facts at the same time."""

from __future__ import annotations

from types import SimpleNamespace

import gevent
import pytest
from pyinfra.api import Config, Inventory, State

from aicluster.accel import connect_once as pyinfra_fixes
from aicluster.accel.connect_once import connect_once


@pytest.fixture(autouse=True)
def pyinfra_as_it_was(monkeypatch):
    """connect_once patches pyinfra's Host for the process: undo it after each test."""
    from pyinfra.api.host import Host

    monkeypatch.setattr(Host, "connect", Host.connect)
    monkeypatch.setattr(pyinfra_fixes, "_INSTALLED", [])


def _host():
    inventory = Inventory((["node1", "node3"], {}))
    state = State(inventory, Config())
    host = inventory.get_host("node3")
    connects = []

    def slow_connect():
        connects.append(gevent.getcurrent())
        gevent.sleep(0.05)  # the SSH handshake: other greenlets run meanwhile

    host.connector = SimpleNamespace(connect=slow_connect)
    return state, host, connects


def test_two_readers_of_a_left_out_host_connect_it_once():
    connect_once()
    _state, host, connects = _host()
    readers = [gevent.spawn(host.connect, reason="to load fact") for _ in range(3)]
    gevent.joinall(readers, raise_error=True)
    assert len(connects) == 1 and host.connected
    host.connect()  # connected: nothing more
    assert len(connects) == 1


def test_installing_twice_wraps_once():
    from pyinfra.api.host import Host

    connect_once()
    first = Host.connect
    connect_once()
    assert Host.connect is first and first.aicluster_connect_once
