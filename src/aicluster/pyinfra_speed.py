"""pyinfra's own bookkeeping for each operation on each host, made cheap, with the
same results: :func:`speed_up_pyinfra` installs both of these.

The operation order. In CLI mode pyinfra orders operations by the line numbers of the
deploy code that called them: for every operation on every host it calls
``inspect.stack()``, which
opens and scans the source file of every frame on the stack (``findsource``) only to
be given ``frame.f_lineno`` and the file name, both of which the frame already holds.
On the whole stack that was most of the deploying machine's CPU in a no-op re-run
(about 5 ms per operation per host).

:func:`speed_up_pyinfra` replaces pyinfra's ``get_operation_order_from_stack`` with
one that walks the frames directly and returns the same list: the operation
file's number, then the line number of every frame from the outermost frame of the
deploy file inwards, leaving out frames inside pyinfra. It is the same function, made
cheap; tests/unit/test_pyinfra_speed.py checks both give the same answer.

The global arguments. pyinfra lists the global operation arguments (``_sudo``,
``_if`` ...) with ``typing.get_type_hints`` of its ``AllArguments`` type for every
operation on every host, re-evaluating every annotation each time;
:func:`cached_global_arguments` gives the same list, worked out once.
"""

from __future__ import annotations

import importlib
import sys

_INSTALLED = []


def operation_order_from_frames(state, frame) -> list[int]:
    """What ``pyinfra.api.util.get_operation_order_from_stack`` returns when *frame*
    calls it (pyinfra's own frame, innermost on its stack, is always left out)."""
    import pyinfra
    from pyinfra.api.util import PYINFRA_INSTALL_DIR

    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()  # outermost first, as pyinfra reverses inspect.stack()

    i = 0
    deploy_file = state.current_deploy_filename
    if deploy_file:
        # From the first frame of the deploy file; pyinfra's loop, finding none, stops
        # at the last frame, its own, which it leaves out: so no frame at all.
        i = next((n for n, item in enumerate(frames)
                  if item.f_code.co_filename == deploy_file), len(frames))

    line_numbers = []
    if pyinfra.is_cli:
        line_numbers.append(state.current_op_file_number)
    for item in frames[i:]:
        if item.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR):
            continue
        line_numbers.append(item.f_lineno)
    return line_numbers


def _get_operation_order_from_stack(state) -> list[int]:
    # Frame 1 is pyinfra's caller (solve_operation_consistency), as inspect.stack()
    # inside pyinfra's own function starts from a pyinfra frame: skipped either way.
    return operation_order_from_frames(state, sys._getframe(1))


_GLOBAL_ARGUMENTS: list[tuple[str, type]] = []


def cached_global_arguments() -> list[tuple[str, type]]:
    """What ``pyinfra.api.arguments.all_global_arguments`` returns (a fresh list of
    the same ``(name, type)`` pairs), with the type hints evaluated once."""
    if not _GLOBAL_ARGUMENTS:
        from typing import get_type_hints

        from pyinfra.api.arguments import AllArguments

        _GLOBAL_ARGUMENTS.extend(get_type_hints(AllArguments).items())
    return list(_GLOBAL_ARGUMENTS)


def speed_up_pyinfra() -> None:
    """Use the frame walk for pyinfra's operation order and the cached list of global
    arguments (idempotent)."""
    if _INSTALLED:
        return
    # importlib: the name pyinfra.api.operation is the decorator, not the module.
    operation = importlib.import_module("pyinfra.api.operation")
    operation.get_operation_order_from_stack = _get_operation_order_from_stack
    for name in ("pyinfra.api.arguments", "pyinfra.api.facts"):
        module = importlib.import_module(name)
        if hasattr(module, "all_global_arguments"):
            module.all_global_arguments = cached_global_arguments
    _INSTALLED.append(True)
