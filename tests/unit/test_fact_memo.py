"""aicluster.deploys.memoize_facts_while_preparing: one read per fact and host while
pyinfra prepares operations, a fresh read while they execute."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyinfra.api import host as api_host
from pyinfra.api.state import StateStage
from pyinfra.facts.files import File
from pyinfra.facts.server import Os

from aicluster import deploys


@pytest.fixture
def reads(monkeypatch):
    calls: list[tuple] = []

    def real(state, host, cls, args=None, kwargs=None, **rest):
        calls.append((host.name, cls.__name__, args, kwargs))
        return {"path": (kwargs or {}).get("path"), "reads": len(calls)}

    monkeypatch.setattr(api_host, "get_fact", real)
    deploys.memoize_facts_while_preparing()
    assert api_host.get_fact is not real
    return calls


def _host(name, **connector):
    return SimpleNamespace(name=name, current_op_global_arguments=connector)


def test_repeated_reads_while_preparing_run_once_per_host(reads):
    state = SimpleNamespace(current_stage=StateStage.Prepare)
    a, b = _host("a"), _host("b")
    first = api_host.get_fact(state, a, File, kwargs={"path": "/etc/x"})
    again = api_host.get_fact(state, a, File, kwargs={"path": "/etc/x"})
    assert first == again == {"path": "/etc/x", "reads": 1}
    # Another path, another fact, another host, another sudo user: each read once.
    api_host.get_fact(state, a, File, kwargs={"path": "/etc/y"})
    api_host.get_fact(state, a, Os)
    api_host.get_fact(state, b, File, kwargs={"path": "/etc/x"})
    api_host.get_fact(state, _host("a", _sudo=True, _sudo_user="slurm"), File,
                      kwargs={"path": "/etc/x"})
    assert len(reads) == 5


def test_answers_are_copies(reads):
    state = SimpleNamespace(current_stage=StateStage.Prepare)
    first = api_host.get_fact(state, _host("a"), File, kwargs={"path": "/p"})
    first["path"] = "changed by an operation"
    assert api_host.get_fact(state, _host("a"), File, kwargs={"path": "/p"})["path"] == "/p"


def test_reads_while_executing_are_always_fresh(reads):
    state = SimpleNamespace(current_stage=StateStage.Execute)
    for _ in range(3):
        api_host.get_fact(state, _host("a"), File, kwargs={"path": "/p"})
    assert len(reads) == 3


def test_installing_twice_wraps_once(reads):
    wrapped = api_host.get_fact
    deploys.memoize_facts_while_preparing()
    assert api_host.get_fact is wrapped
