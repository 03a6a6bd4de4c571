"""Plan a pyinfra deploy against fake hosts whose facts come from fixtures.

No host is contacted: ``Host.get_fact`` answers from a per-host dict keyed by the
fact's class name (and, for ``Command``, by the command), falling back to the fact's
own default (what pyinfra reads on a bare machine: nothing installed, no file).
The result is, per host, the operations in order with the shell commands each would
run; an operation guarded by ``_if`` (a restart after a change) is planned as if the
change happened and marked ``conditional``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pyinfra
from pyinfra.api import Config, Inventory, State
from pyinfra.api import host as api_host
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

import aicluster.common.ops as common_ops

# pyinfra.api re-exports a function named `operation`; the module holds the helpers.
api_operation = importlib.import_module("pyinfra.api.operation")


@dataclass
class PlannedOp:
    name: str
    commands: list[str]
    conditional: bool
    #: Position in pyinfra's global order: every host runs operation i before i + 1.
    index: int = -1
    #: Run with ``_serial``: one host at a time.
    serial: bool = False

    @property
    def text(self) -> str:
        return "\n".join(self.commands)


@dataclass
class Plan:
    ops: dict[str, list[PlannedOp]] = field(default_factory=dict)

    def names(self, host: str) -> list[str]:
        return [op.name for op in self.ops[host]]

    def upload(self, host: str, dest: str) -> str:
        """The text the plan uploads to ``dest`` on ``host``."""
        for op in self.ops[host]:
            for command in op.commands:
                if command.startswith(f"upload {dest}\n"):
                    return command.split("\n", 1)[1]
        raise AssertionError(f"{host}: nothing is uploaded to {dest}")

    def op(self, host: str, name: str) -> PlannedOp:
        found = [op for op in self.ops[host] if op.name == name]
        assert found, f"{host}: no operation named {name!r}; have {self.names(host)}"
        return found[0]

    def commands(self, host: str) -> str:
        return "\n".join(op.text for op in self.ops[host])

    def changing(self, host: str) -> list[str]:
        """Names of the unconditional operations that would change something."""
        return [op.name for op in self.ops[host] if op.commands and not op.conditional]


def _command_text(command: Any) -> str:
    """A planned command as text; an upload shows its destination and content."""
    src = getattr(command, "src", None)
    if hasattr(src, "getvalue"):
        return f"upload {command.dest}\n{src.getvalue()}"
    if hasattr(command, "get_raw_value"):
        return str(command.get_raw_value())
    return str(command)


def _fake_get_fact(facts: Mapping[str, Mapping[str, Any]]):
    def get_fact(state, host, cls, args=None, kwargs=None, **rest):
        mine = facts.get(host.name, {})
        key = cls.__name__
        if key == "Command" and args:
            commands = mine.get("Command", {})
            if args[0] in commands:
                return commands[args[0]]
            return ""
        if key in mine:
            value = mine[key]
            return value(*(args or ()), **(kwargs or {})) if callable(value) else value
        return cls().default() if hasattr(cls, "default") else None

    return get_fact


def plan(
    hosts: list[tuple[str, dict[str, Any]]],
    groups: Mapping[str, list[str]],
    all_data: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    deploy_func: Callable[[], None],
) -> Plan:
    """Run ``deploy_func`` for every host against fixture facts; return the plan."""
    inventory = Inventory(
        (hosts, dict(all_data)), **{g: (list(m), {}) for g, m in groups.items()}
    )
    state = State(inventory, Config())
    state.set_stage(StateStage.Prepare)
    common_ops._CLUSTERS.clear()
    fake = _fake_get_fact(facts)
    result = Plan()
    # Each host's own operation names (pyinfra keeps the union of all hosts' names).
    op_names: dict[tuple[str, str], str] = {}
    real_solve = api_operation.solve_operation_consistency

    def solve(names, state, host):
        op_order, op_hash = real_solve(names, state, host)
        op_names[(host.name, op_hash)] = ", ".join(sorted(names))
        return op_order, op_hash

    with (
        mock.patch.object(api_host, "get_fact", fake),
        mock.patch.object(api_operation, "solve_operation_consistency", solve),
        mock.patch.object(pyinfra, "is_cli", True),
        ctx_inventory.use(inventory),
        ctx_state.use(state),
    ):
        for h in inventory:
            state.activate_host(h)
            with ctx_host.use(h):
                deploy_func()
        for h in inventory:
            ops = []
            with ctx_host.use(h):
                for index, op_hash in enumerate(state.get_op_order()):
                    op = state.ops[h].get(op_hash)
                    if op is None:
                        continue
                    name = op_names[(h.name, op_hash)].split(" | ", 1)[-1]
                    commands = [_command_text(c) for c in op.command_generator()]
                    conditional = bool(op.global_arguments.get("_if"))
                    serial = bool(state.op_meta[op_hash].global_arguments.get("_serial"))
                    ops.append(PlannedOp(name, commands, conditional, index, serial))
            result.ops[h.name] = ops
    return result
