"""aicluster.oporder gives the operation order pyinfra's own stack inspection gives."""

import importlib
import sys
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api.util import get_operation_order_from_stack

from aicluster.oporder import fast_operation_order, operation_order_from_frames


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


def test_installed_into_pyinfra_once(monkeypatch):
    operation = importlib.import_module("pyinfra.api.operation")
    monkeypatch.setattr(operation, "get_operation_order_from_stack",
                        operation.get_operation_order_from_stack)
    from aicluster import oporder

    monkeypatch.setattr(oporder, "_INSTALLED", [])
    fast_operation_order()
    fast_operation_order()
    assert operation.get_operation_order_from_stack is oporder._get_operation_order_from_stack
