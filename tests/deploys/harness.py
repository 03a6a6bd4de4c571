"""Plan a pyinfra deploy against fake hosts whose facts come from fixtures.

No host is contacted: ``Host.get_fact`` answers from a per-host dict keyed by the
fact's class name (and, for ``Command``, by the command), falling back to the fact's
own default (what pyinfra reads on a bare machine: nothing installed, no file).
The result is, per host, the operations in order with the shell commands each would
run.

Conditions (``_if``) are evaluated as pyinfra evaluates them when it executes: the
operations are walked in pyinfra's global order (every host runs operation i before
i + 1), and each one is marked complete, "changed" when its generator yielded commands
in this plan and "unchanged" when it yielded nothing (``host.noop``), before the
next one's ``_if`` is asked. So ``_if=conf.did_change`` or ``any_changed(a, b)`` holds
exactly when the plan changes ``conf`` (or ``a`` or ``b``). An operation whose
condition is false is kept in the plan, with no commands and ``skipped`` set, so a test
can assert both sides: the restart runs when its input changed, and not otherwise.

pyinfra internals used (test code only; all of them here):
- ``pyinfra.api.host.get_fact`` is replaced by the fixture lookup;
- ``pyinfra.api.operation.solve_operation_consistency`` is wrapped to learn each
  host's own operation name;
- ``StateOperationHostData`` (``state.get_op_data_for_host``): its
  ``command_generator``, ``global_arguments["_if"]`` and ``operation_meta``;
  ``OperationMeta.set_complete`` (public) records the planned outcome, so the
  callables of later ``_if`` arguments (``did_change``, ``any_changed``) can be called.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any
from unittest import mock

import pyinfra
from pyinfra.api import Config, Inventory, State
from pyinfra.api import host as api_host
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

import aicluster.common.ops as common_ops

# pyinfra.api re-exports a function named `operation`; the module holds the helpers.
api_operation = importlib.import_module("pyinfra.api.operation")


@dataclass
class PlannedOp:
    name: str
    #: The commands the plan runs: none where the operation has nothing to do or where
    #: its ``_if`` condition is false.
    commands: list[str]
    #: The operation has an ``_if`` condition.
    conditional: bool
    #: Position in pyinfra's global order: every host runs operation i before i + 1.
    index: int = -1
    #: Run with ``_serial``: one host at a time.
    serial: bool = False
    #: Its ``_if`` condition is false in this plan: it runs no command.
    skipped: bool = False
    #: What it uploads: destination -> the bytes.
    uploads: dict[str, bytes] = field(default_factory=dict)

    @property
    def runs(self) -> bool:
        """The operation runs commands in this plan (its condition, if any, holds)."""
        return bool(self.commands)

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

    def files(self, host: str) -> dict[str, NodeFile]:
        """The files the plan uploads to ``host``, with the owner and mode it sets:
        what the node holds once the plan ran (see :func:`file_facts`)."""
        found = {}
        for op in self.ops[host]:
            for dest, content in op.uploads.items():
                node_file = NodeFile(content)
                for command in op.commands:
                    words = command.split()
                    if len(words) == 3 and words[2] == dest and words[0] == "chmod":
                        node_file.mode = int(words[1])
                    elif len(words) == 3 and words[2] == dest and words[0] == "chown":
                        node_file.user, _, node_file.group = words[1].partition(":")
                found[dest] = node_file
        return found

    def commands(self, host: str) -> str:
        return "\n".join(op.text for op in self.ops[host])

    def changing(self, host: str) -> list[str]:
        """Names of the operations that would change something, restarts and reloads
        included when their condition holds."""
        return [op.name for op in self.ops[host] if op.commands]


@dataclass
class NodeFile:
    """A file on a fake node: its content, mode and owner."""

    content: bytes
    mode: int = 644
    user: str = "root"
    group: str = "root"


def file_facts(files: Mapping[str, NodeFile]) -> dict[str, Any]:
    """``File``, ``Sha1File`` and ``Directory`` facts of a node holding ``files``
    (path -> NodeFile) in directories that exist (0755, root), e.g.
    ``file_facts(first_plan.files(host))`` for a re-run after that plan."""
    dirs = {str(parent) for path in files for parent in PurePosixPath(path).parents}

    def file_fact(path, **kw):
        f = files.get(path)
        return None if f is None else {"mode": f.mode, "user": f.user, "group": f.group}

    def sha1(path, **kw):
        f = files.get(path)
        return None if f is None else hashlib.sha1(f.content).hexdigest()

    def directory(path, **kw):
        return {"mode": 755, "user": "root", "group": "root"} if path in dirs else None

    return {"File": file_fact, "Sha1File": sha1, "Directory": directory}


def _upload(command: Any) -> tuple[str, bytes] | None:
    src = getattr(command, "src", None)
    if not hasattr(src, "getvalue"):
        return None
    content = src.getvalue()
    return command.dest, content.encode() if isinstance(content, str) else content


def _command_text(command: Any) -> str:
    """A planned command as text; an upload shows its destination and content."""
    src = getattr(command, "src", None)
    if hasattr(src, "getvalue"):
        return f"upload {command.dest}\n{src.getvalue()}"
    if hasattr(command, "get_raw_value"):
        return str(command.get_raw_value())
    return str(command)


def _condition_holds(condition: Any) -> bool:
    """An ``_if`` argument evaluated as pyinfra's ``command_generator`` does."""
    if isinstance(condition, list):
        return all(check() for check in condition)
    if callable(condition):
        return bool(condition())
    return True


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
        # The cluster validated for this inventory, forgotten afterwards (keyed by id()).
        mock.patch.dict(common_ops._CLUSTERS, clear=True),
        ctx_inventory.use(inventory),
        ctx_state.use(state),
    ):
        # pyinfra connects every host before it runs the deploy file for any of them.
        for h in inventory:
            state.activate_host(h)
        for h in inventory:
            with ctx_host.use(h):
                deploy_func()
        for h in inventory:
            result.ops[h.name] = []
        # In pyinfra's order, operation by operation across hosts, so that an ``_if`` sees
        # the planned outcome of every operation before it, on any host.
        for index, op_hash in enumerate(state.get_op_order()):
            serial = bool(state.op_meta[op_hash].global_arguments.get("_serial"))
            for h in inventory:
                if op_hash not in state.ops[h]:
                    continue
                op = state.get_op_data_for_host(h, op_hash)
                with ctx_host.use(h):
                    condition = op.global_arguments.get("_if")
                    skipped = not _condition_holds(condition)
                    raw = [] if skipped else list(op.command_generator())
                op.operation_meta.set_complete(True, raw, CommandOutput([]))
                name = op_names[(h.name, op_hash)].split(" | ", 1)[-1]
                uploads = dict(u for u in map(_upload, raw) if u is not None)
                result.ops[h.name].append(PlannedOp(
                    name, [_command_text(c) for c in raw], bool(condition), index, serial,
                    skipped, uploads,
                ))
    return result
