"""aicluster.accel.enable: on only for the pyinfra it was tested with and without an
off switch; a pyinfra that lacks a name it uses makes it step aside, installing
nothing, and the deploy plans on stock pyinfra. Every test leaves pyinfra stock
(tests/unit/conftest.py calls ``accel.disable()`` after each)."""

from __future__ import annotations

import ast
import importlib
import logging
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State

from aicluster import accel
from aicluster.accel import guard

ACCEL_DIR = Path(accel.__file__).parent


def _patched_points() -> dict[str, object]:
    """What the accelerator replaces when on, as pyinfra has it now."""
    from pyinfra.api import host as api_host
    from pyinfra.api.command import FunctionCommand
    from pyinfra.api.host import Host

    operation = importlib.import_module("pyinfra.api.operation")
    points: dict[str, object] = {
        "get_fact": api_host.get_fact,
        "Host.connect": Host.__dict__["connect"],
        "Host.run_shell_command": Host.__dict__["run_shell_command"],
        "Host.put_file": Host.__dict__["put_file"],
        "Host.rsync": Host.__dict__["rsync"],
        "FunctionCommand.execute": FunctionCommand.__dict__["execute"],
        "operation.get_operation_order_from_stack": operation.get_operation_order_from_stack,
        "operation.signature": operation.signature,
    }
    for name in ("pyinfra.api.arguments", "pyinfra.api.facts", "pyinfra.api.deploy",
                 "pyinfra.api.operation", "pyinfra.api.command", "pyinfra.facts.files",
                 "pyinfra.operations.files"):
        module = importlib.import_module(name)
        for attr in ("all_global_arguments", "pop_global_arguments",
                     "make_formatted_string_command"):
            if hasattr(module, attr):
                points[f"{name}.{attr}"] = getattr(module, attr)
    return points


def _state_and_host():
    inventory = Inventory((["node1", "node2"], {}))
    state = State(inventory, Config())
    return state, inventory.get_host("node1")


@pytest.fixture
def stock(monkeypatch, tmp_path):
    """pyinfra as installed (3.10.x, where the accelerator turns on), no switch set, no
    reads remembered; yields what pyinfra's patched points are before any change."""
    from aicluster.accel import memo

    monkeypatch.delenv(accel.ENV_SWITCH, raising=False)
    monkeypatch.setattr(memo, "READS_DIR", tmp_path / "reads")
    accel.disable()
    return _patched_points()


def _stock_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "stock pyinfra" in r.getMessage()]


def test_on_for_the_tested_pyinfra_and_disable_undoes_it(stock, caplog):
    state, host = _state_and_host()
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        assert accel.enable(host, state) is True
        assert accel.enable(state.inventory.get_host("node2"), state) is True
    now = _patched_points()
    changed = {k for k in stock if now[k] is not stock[k]}
    # Every point was replaced (a check that the comparison below can fail).
    assert changed == set(stock), set(stock) - changed
    assert not _stock_lines(caplog)
    handlers = list(state.callback_handlers)
    assert len(handlers) == 1  # the reads are saved once per run, not once per host
    accel.disable()
    assert _patched_points() == stock
    assert state.callback_handlers == []
    assert not guard.PATCHES


def test_a_missing_private_name_steps_aside_and_installs_nothing(stock, monkeypatch, caplog):
    monkeypatch.delattr("pyinfra.api.facts._make_command")
    state, host = _state_and_host()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert accel.enable(host, state) is False
        assert accel.enable(state.inventory.get_host("node2"), state) is False
    assert _patched_points() == stock
    assert not guard.PATCHES and state.callback_handlers == []
    lines = _stock_lines(caplog)
    assert len(lines) == 1, lines  # one line per run, however many hosts
    assert "stepped aside" in lines[0] and "_make_command" in lines[0]


def test_a_changed_signature_steps_aside(stock, monkeypatch, caplog):
    monkeypatch.setattr("pyinfra.api.facts._make_command", lambda command: command)
    state, host = _state_and_host()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert accel.enable(host, state) is False
    assert _patched_points() == stock
    (line,) = _stock_lines(caplog)
    assert "stepped aside" in line and "_make_command takes (command)" in line


def test_a_failure_while_installing_undoes_what_was_installed(stock, monkeypatch, caplog):
    from aicluster.accel import memo

    def broken():
        raise AttributeError("pyinfra changed under the memo")

    # speed and connect_once are installed first, then the memo fails.
    monkeypatch.setattr(memo, "memoize_facts", broken)
    state, host = _state_and_host()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert accel.enable(host, state) is False
    assert _patched_points() == stock
    (line,) = _stock_lines(caplog)
    assert "stepped aside (AttributeError: pyinfra changed under the memo)" in line


@pytest.mark.parametrize("value", ["0", "false", "OFF", "no"])
def test_the_environment_switch_turns_it_off(stock, monkeypatch, caplog, value):
    monkeypatch.setenv(accel.ENV_SWITCH, value)
    state, host = _state_and_host()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert accel.enable(host, state) is False
    assert _patched_points() == stock and not guard.PATCHES
    (line,) = _stock_lines(caplog)
    assert f"off by AICLUSTER_ACCEL={value}" in line


def test_the_inventory_setting_turns_it_off(stock, caplog):
    state, host = _state_and_host()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert accel.enable(host, state, wanted=False) is False
    assert _patched_points() == stock and not guard.PATCHES
    (line,) = _stock_lines(caplog)
    assert "pyinfra_accelerator = False" in line


@pytest.mark.parametrize("version", ["3.11.0", "3.9.2", "4.0.0", "3.10.0rc1", "not a version"])
def test_off_on_a_pyinfra_it_was_not_tested_with(stock, monkeypatch, caplog, version):
    monkeypatch.setattr(accel, "pyinfra_version", lambda: version)
    state, host = _state_and_host()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert accel.enable(host, state) is False
    assert _patched_points() == stock and not guard.PATCHES
    (line,) = _stock_lines(caplog)
    assert "off" in line and ("3.10" in line or "cannot be read" in line)


def test_on_for_any_3_10_release(stock, monkeypatch):
    monkeypatch.setattr(accel, "pyinfra_version", lambda: "3.10.7")
    state, host = _state_and_host()
    assert accel.enable(host, state) is True


def test_a_deploy_plans_on_fake_hosts_with_a_private_name_missing(stock, monkeypatch):
    from aicluster.components.base import deploy as base
    from tests.deploys.conftest import CLUSTER, DISTRIBUTIONS, HOSTS
    from tests.deploys.harness import plan

    monkeypatch.delattr("pyinfra.api.facts._make_command")
    on = []

    def deploy():
        from pyinfra import host

        on.append(accel.enable(host, host.state))
        base.deploy()

    facts = {name: {"LinuxDistribution": DISTRIBUTIONS["debian12"]} for name, _ in HOSTS}
    p = plan(HOSTS, {"gpu_nodes": ["gpu1"]}, dict(CLUSTER), facts, deploy)
    assert on == [False, False]
    assert "Install base packages" in p.names("gpu1")
    assert "chrony" in p.op("gpu1", "Install base packages").text


def _pyinfra_names_imported() -> set[tuple[str, str]]:
    """``(module, name)`` for each name the accelerator's modules import from pyinfra
    (a submodule imported by name is no name of pyinfra's to check)."""
    out = set()
    for path in ACCEL_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyinfra":
                for alias in node.names:
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        out.add((node.module, alias.name))
    return out


def test_every_pyinfra_name_the_accelerator_imports_is_checked_first():
    checked = {(module, dotted.split(".")[0]) for module, dotted, _ in guard.PYINFRA_NAMES}
    imported = _pyinfra_names_imported()
    assert ("pyinfra.api.facts", "_make_command") in imported  # the scan sees them
    assert imported - checked == set()


def test_the_tested_range_is_one_minor_release():
    assert "3.10.0" in accel.TESTED_PYINFRA and "3.10.9" in accel.TESTED_PYINFRA
    assert "3.11.0" not in accel.TESTED_PYINFRA and "3.9.9" not in accel.TESTED_PYINFRA


def test_the_inventory_setting_is_a_cluster_wide_bool(spec):
    from aicluster.inventory import InventoryError, load_cluster

    assert load_cluster(spec.write()).spec.pyinfra_accelerator is True
    spec.set("all.pyinfra_accelerator", False)
    assert load_cluster(spec.write()).spec.pyinfra_accelerator is False
    spec.set("all.pyinfra_accelerator", "sometimes")
    with pytest.raises(InventoryError) as caught:
        load_cluster(spec.write())
    assert "pyinfra_accelerator" in str(caught.value)


def test_a_host_lost_during_its_prefetch_is_not_taken_for_a_failed_prefetch(monkeypatch):
    """The connector's HostLost (aicluster.connectors.openssh) reaches deploy.py, which
    stops planning for that host; any other prefetch failure is only a warning."""
    from types import SimpleNamespace

    from aicluster import accel
    from aicluster.accel import memo
    from aicluster.connectors.openssh import HostLost

    monkeypatch.setattr(accel, "_DECISION", [True])
    host = SimpleNamespace(name="n1")

    def lost(h):
        raise HostLost(h, "Could not connect (No route to host)")

    monkeypatch.setattr(memo, "prefetch_facts", lost)
    with pytest.raises(HostLost):
        accel.enable(host, SimpleNamespace())

    def broken(h):
        raise ValueError("garbled answer")

    monkeypatch.setattr(memo, "prefetch_facts", broken)
    monkeypatch.setattr(memo, "remember_reads", lambda state: None)
    assert accel.enable(host, SimpleNamespace()) is True
