"""What the accelerator needs of pyinfra, looked up with a check, and every change it
makes to pyinfra, recorded so that it can be undone.

:data:`PYINFRA_NAMES` lists each pyinfra name the accelerator's modules use (public or
private), with the leading parameters it expects of a function it calls or stands in
for. :func:`check_pyinfra` looks every one up before anything is installed; a name
missing or a signature changed raises :class:`StepAside` naming it, and the deploy runs
on stock pyinfra. tests/unit/test_accel.py checks that the list covers every pyinfra
name the package's modules import.

:data:`PATCHES` is where each install function replaces a pyinfra attribute
(:meth:`Patches.replace`); :meth:`Patches.undo` puts every original back, last first.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any


class StepAside(Exception):
    """pyinfra is not as the accelerator expects: the message says what differs."""


#: ``(module, dotted name, leading parameter names or None)``: each pyinfra name the
#: accelerator uses, and what a function among them must accept.
PYINFRA_NAMES: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("pyinfra", "is_cli", None),
    # stood in for (speed.py)
    ("pyinfra.api.operation", "get_operation_order_from_stack", ("state",)),
    ("pyinfra.api.operation", "signature", None),
    ("pyinfra.api.arguments", "pop_global_arguments", ("state", "host", "kwargs")),
    ("pyinfra.api.arguments", "all_global_arguments", ()),
    ("pyinfra.api.command", "make_formatted_string_command", ("string",)),
    # read (speed.py, memo.py)
    ("pyinfra.api.util", "PYINFRA_INSTALL_DIR", None),
    ("pyinfra.api.arguments", "AllArguments", None),
    ("pyinfra.api.arguments", "ArgumentTypeError", None),
    ("pyinfra.api.arguments", "all_argument_meta", None),
    ("pyinfra.api.arguments", "default_sentinel", None),
    ("pyinfra.api.arguments", "raise_if_bad_type",
     ("value", "type_", "exception", "message_prefix")),
    ("pyinfra.api.host", "extract_callable_datas", ("datas",)),
    ("pyinfra.context", "ctx_config", None),
    ("pyinfra.api.command", "StringCommand", None),
    # wrapped (connect_once.py, memo.py)
    ("pyinfra.api.host", "Host.connect", ("self",)),
    ("pyinfra.api.host", "Host.connected", None),
    ("pyinfra.api.host", "Host.run_shell_command", ("self",)),
    ("pyinfra.api.host", "Host.put_file", ("self",)),
    ("pyinfra.api.host", "Host.rsync", ("self",)),
    ("pyinfra.api.host", "get_fact", ("state", "host", "cls", "args", "kwargs")),
    ("pyinfra.api.command", "FunctionCommand.execute",
     ("self", "state", "host", "connector_arguments")),
    # read (memo.py)
    ("pyinfra.api.facts", "_make_command", ("command_attribute", "host_args")),
    ("pyinfra.api.facts", "_MISSING_COMMAND_MARKER", None),
    ("pyinfra.api.state", "StateStage.Prepare", None),
    ("pyinfra.api.state", "StateStage.Execute", None),
    ("pyinfra.api.state", "BaseStateCallback.host_disconnect", None),
    ("pyinfra.api.state", "State.add_callback_handler", ("self", "handler")),
    ("pyinfra.facts.files", "LINUX_STAT_COMMAND", None),
    ("pyinfra.facts.files", "File", None),
    ("pyinfra.facts.files", "Sha1File", None),
    ("pyinfra.operations.files", "put._inner", None),
)


def lookup(module: str, dotted: str) -> Any:
    """``module.dotted``, or :class:`StepAside` naming what is missing."""
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise StepAside(f"{module} cannot be imported ({exc})") from None
    where = module
    for part in dotted.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            raise StepAside(f"{where} has no {part}")
        where = f"{where}.{part}"
    return obj


_MISSING = object()
_INHERITED = object()
_CALL = object()


def _leading_parameters(func: Any) -> tuple[str, ...] | None:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    return tuple(p.name for p in params
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def check_pyinfra() -> None:
    """Look up every name of :data:`PYINFRA_NAMES`; raise :class:`StepAside` at the
    first missing or whose parameters are not the ones expected."""
    for module, dotted, params in PYINFRA_NAMES:
        obj = lookup(module, dotted)
        if params is None:
            continue
        have = _leading_parameters(obj)
        if have is None or have[:len(params)] != params:
            raise StepAside(f"{module}.{dotted} takes ({', '.join(have or ('?',))}), "
                            f"not ({', '.join(params)}, ...)")
    # The stat format the grouped read reuses is the text between its quotes.
    stat = lookup("pyinfra.facts.files", "LINUX_STAT_COMMAND")
    if not isinstance(stat, str) or stat.count("'") != 2:
        raise StepAside("pyinfra.facts.files.LINUX_STAT_COMMAND is not the stat "
                        "command it was")
    if lookup("pyinfra.api.operation", "signature") is not inspect.signature:
        raise StepAside("pyinfra.api.operation.signature is not inspect.signature")


class Patches:
    """The pyinfra attributes replaced, with their originals, to undo them."""

    def __init__(self) -> None:
        self._done: list[tuple[Any, str, Any]] = []

    def on_undo(self, undo: Any) -> None:
        """Call *undo* (no arguments) on :meth:`undo`, in turn with the replacements."""
        self._done.append((undo, "", _CALL))

    def replace(self, owner: Any, name: str, new: Any) -> Any:
        """Set ``owner.name`` to *new*, noting the value it had (which must exist:
        :class:`StepAside` otherwise). Returns that value."""
        if not hasattr(owner, name):
            label = getattr(owner, "__name__", repr(owner))
            raise StepAside(f"{label} has no {name}")
        current = getattr(owner, name)
        old = vars(owner).get(name, _INHERITED)  # inherited: deleted again on undo
        setattr(owner, name, new)
        self._done.append((owner, name, old))
        return current

    def undo(self) -> None:
        """Put back every original, the last replaced first."""
        while self._done:
            owner, name, old = self._done.pop()
            if old is _CALL:
                owner()
            elif old is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, old)

    def __bool__(self) -> bool:
        return bool(self._done)


#: Every change the accelerator has made to pyinfra in this process.
PATCHES = Patches()
