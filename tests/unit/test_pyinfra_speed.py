"""aicluster.pyinfra_speed gives what pyinfra's own functions give."""

import importlib
import sys
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api.util import get_operation_order_from_stack

from aicluster.pyinfra_speed import (
    cached_global_arguments,
    operation_order_from_frames,
    speed_up_pyinfra,
)


def _both(state):
    # One line, so the innermost frame's line number is the same for both.
    return get_operation_order_from_stack(state), operation_order_from_frames(state, sys._getframe(0))  # noqa: E501


def _nested(state, depth):
    if depth:
        return _nested(state, depth - 1)
    return _both(state)


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_file", [__file__, "/nowhere/deploy.py", None])
@pytest.mark.parametrize("depth", [0, 3])
def test_same_order_as_pyinfra(monkeypatch, is_cli, deploy_file, depth):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=7)
    theirs, ours = _nested(state, depth)
    assert ours == theirs
    head = [7] if is_cli else []
    if deploy_file == __file__:
        # The lines from this test down: the test, each _nested call, _both.
        assert ours[:len(head)] == head and len(ours) == len(head) + depth + 3
    elif deploy_file is not None:
        assert ours == head  # the deploy file is not on the stack


def test_global_arguments_are_pyinfras():
    from pyinfra.api.arguments import all_global_arguments

    assert cached_global_arguments() == all_global_arguments()
    # a fresh list each time, as pyinfra's: a caller changing it changes nothing else
    cached_global_arguments().clear()
    assert cached_global_arguments() == all_global_arguments()


def test_installed_into_pyinfra_once(monkeypatch):
    from aicluster import pyinfra_speed

    operation = importlib.import_module("pyinfra.api.operation")
    arguments = importlib.import_module("pyinfra.api.arguments")
    facts = importlib.import_module("pyinfra.api.facts")
    monkeypatch.setattr(operation, "get_operation_order_from_stack",
                        operation.get_operation_order_from_stack)
    monkeypatch.setattr(arguments, "all_global_arguments", arguments.all_global_arguments)
    monkeypatch.setattr(facts, "all_global_arguments", facts.all_global_arguments)
    monkeypatch.setattr(operation, "signature", operation.signature)
    monkeypatch.setattr(pyinfra_speed, "_INSTALLED", [])
    speed_up_pyinfra()
    speed_up_pyinfra()
    assert (operation.get_operation_order_from_stack
            is pyinfra_speed._get_operation_order_from_stack)
    assert arguments.all_global_arguments is cached_global_arguments
    assert facts.all_global_arguments is cached_global_arguments
    assert operation.signature is pyinfra_speed.operation_signature


def test_the_operation_signature_is_inspects_and_binds_alike():
    """Worked out once, the same Signature: a call with bad arguments is refused with
    the TypeError pyinfra's own check raises."""
    import inspect

    import pytest
    from pyinfra.operations import files

    from aicluster.pyinfra_speed import operation_signature

    func = files.directory._inner
    assert operation_signature(func) == inspect.signature(func)
    assert operation_signature(func) is operation_signature(func)
    operation_signature(func).bind(path="/tmp/x")
    with pytest.raises(TypeError) as ours:
        operation_signature(func).bind(nonsense=1)
    with pytest.raises(TypeError) as theirs:
        inspect.signature(func).bind(nonsense=1)
    assert str(ours.value) == str(theirs.value)


def _host_with_data(host_data, group_data):
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory(
        (["node1", ("node2", host_data)], {}),
        workers=(["node2"], group_data),
    )
    state = State(inventory, Config())
    return state, inventory.get_host("node2")


@pytest.mark.parametrize("host_data,group_data,kwargs,deploy_kwargs", [
    ({}, {}, {}, None),
    ({"_sudo": True, "_sudo_user": "ray"}, {}, {"packages": ["x"]}, None),
    ({}, {"_env": {"A": "1"}, "_retries": 2}, {"_sudo": False, "src": "a"}, None),
    ({"_env": {"B": "2"}}, {"_env": {"A": "1"}}, {"_ignore_errors": True},
     {"_sudo": True}),
    ({"_chdir": "/tmp"}, {}, {"_shell_executable": "bash"}, {"_chdir": "/srv"}),
])
def test_same_global_arguments_as_pyinfra(host_data, group_data, kwargs, deploy_kwargs):
    """The quicker lookup gives the same arguments, in the same order, pops the same
    keys, and leaves the same operation arguments as pyinfra's own."""
    from pyinfra.api import arguments as pyinfra_arguments

    from aicluster import pyinfra_speed

    real = pyinfra_speed.ORIGINALS.get("pop_global_arguments",
                                       pyinfra_arguments.pop_global_arguments)
    assert real.__module__ == "pyinfra.api.arguments"
    state, host = _host_with_data(host_data, group_data)
    host.current_deploy_kwargs = deploy_kwargs
    theirs_kwargs, ours_kwargs = dict(kwargs), dict(kwargs)
    theirs = real(state, host, theirs_kwargs)
    ours = pyinfra_speed.pop_global_arguments(state, host, ours_kwargs)
    assert ours == theirs
    assert list(ours[0]) == list(theirs[0])
    assert ours_kwargs == theirs_kwargs


def test_global_arguments_checked_as_pyinfra_checks_them():
    from pyinfra.api.exceptions import ArgumentTypeError

    from aicluster import pyinfra_speed

    state, host = _host_with_data({}, {})
    with pytest.raises(ArgumentTypeError, match="_retries"):
        pyinfra_speed.pop_global_arguments(state, host, {"_retries": "many"})
