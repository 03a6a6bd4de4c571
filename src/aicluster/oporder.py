"""pyinfra's operation order, worked out without reading source files.

In CLI mode pyinfra orders operations by the line numbers of the deploy code that
called them: for every operation on every host it calls ``inspect.stack()``, which
opens and scans the source file of every frame on the stack (``findsource``) only to
be given ``frame.f_lineno`` and the file name, both of which the frame already holds.
On the whole stack that was most of the deploying machine's CPU in a no-op re-run
(about 5 ms per operation per host).

:func:`fast_operation_order` replaces pyinfra's ``get_operation_order_from_stack``
with one that walks the frames directly and returns the same list: the operation
file's number, then the line number of every frame from the outermost frame of the
deploy file inwards, leaving out frames inside pyinfra. It is the same function, made
cheap; tests/unit/test_oporder.py checks both give the same answer.
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


def fast_operation_order() -> None:
    """Use the frame walk for pyinfra's operation order (idempotent)."""
    if _INSTALLED:
        return
    # importlib: the name pyinfra.api.operation is the decorator, not the module.
    operation = importlib.import_module("pyinfra.api.operation")
    operation.get_operation_order_from_stack = _get_operation_order_from_stack
    _INSTALLED.append(True)
