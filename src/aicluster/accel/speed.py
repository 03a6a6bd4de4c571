"""pyinfra's own bookkeeping for each operation on each host, made cheap, with the
same results: :func:`speed_up_pyinfra` installs all four of these (through
``aicluster.accel.enable``, which checks first that pyinfra is as expected).

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
cheap; tests/unit/test_accel_speed.py checks both give the same answer.

The global arguments. pyinfra lists the global operation arguments (``_sudo``,
``_if`` ...) with ``typing.get_type_hints`` of its ``AllArguments`` type for every
operation on every host, re-evaluating every annotation each time;
:func:`cached_global_arguments` gives the same list, worked out once. Then, for each
of those thirty-odd arguments, it looks the name up in the host's data, and every
lookup works out the host's group data afresh (one merge over all its groups per
argument), though almost none is ever set there: :func:`pop_global_arguments` gives
the same answer with the host's data layers worked out once per operation.

The argument check. With ``-y`` pyinfra checks each operation call's arguments with
``inspect.signature(func).bind(...)``, working the operation's signature out afresh
for every call on every host; :func:`operation_signature` works it out once per
operation function (a signature never changes; ``bind`` still raises the same
TypeError).

The formatted commands. ``make_formatted_string_command`` splits its template with
``shlex.split`` and parses each word's ``{0}`` fields on every call, though facts and
operations pass the same few templates (``Sha1File``'s, for every file on every host);
:func:`formatted_string_command` splits and parses each template once and fills in
the values as pyinfra does.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import shlex
import sys
from string import Formatter

from aicluster.accel.guard import PATCHES

_INSTALLED = []
#: pyinfra's own functions this module stands in for, by name (once installed).
ORIGINALS: dict = {}


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


@functools.cache
def _global_argument_names() -> frozenset:
    """The names of :func:`cached_global_arguments`, as a set (worked out once)."""
    return frozenset(key for key, _ in cached_global_arguments())


def pop_global_arguments(state, host, kwargs):
    """What ``pyinfra.api.arguments.pop_global_arguments`` returns (and pops from
    *kwargs*), in the same order of preference: the call's own arguments, the current
    @deploy's, the host's data, the config. The host's data is read as
    ``HostData.__getattr__`` reads it (the first layer holding the name, shallow-copied),
    with its layers worked out once instead of once per argument."""
    from copy import copy

    from pyinfra.api.arguments import (
        ArgumentTypeError,
        all_argument_meta,
        raise_if_bad_type,
    )
    from pyinfra.api.host import extract_callable_datas
    from pyinfra.context import ctx_config

    config = state.config
    if ctx_config.isset():
        config = ctx_config.get()
        assert config is not None

    meta_kwargs = host.current_deploy_kwargs or {}
    global_arguments = cached_global_arguments()
    # Each argument the host's data sets, from the first layer that holds it: one
    # pass over the layers' keys, not a lookup in every layer for every argument.
    names = _global_argument_names()
    in_data: dict = {}
    for layer in extract_callable_datas(host.data.datas):
        keys = names.intersection(layer) if type(layer) is dict else names
        for key in keys:
            if key in in_data:
                continue
            try:
                in_data[key] = layer[key]
            except KeyError:
                continue

    arguments = {}
    found_keys = []
    for key, type_ in global_arguments:
        argument_meta = all_argument_meta[key]
        handler = argument_meta.handler
        if key in in_data:
            default = copy(in_data[key])
        else:
            default = argument_meta.default(config)

        if key in kwargs:
            found_keys.append(key)
            value = kwargs.pop(key)
        else:
            value = meta_kwargs.get(key, default)

        if handler:
            value = handler(config, value)

        # A value of a plain class's own type (an operation's ``name``) passes pyinfra's
        # check (typeguard: isinstance) without it; any other value is checked by it.
        if value != default and not (type(type_) is type and isinstance(value, type_)):
            raise_if_bad_type(value, type_, ArgumentTypeError, f"Invalid argument `{key}`:")

        arguments[key] = value
    return arguments, found_keys


@functools.cache
def operation_signature(func) -> inspect.Signature:
    """``inspect.signature(func)``, worked out once per function."""
    return inspect.signature(func)


@functools.lru_cache(maxsize=1024)
def _template_words(string: str) -> tuple:
    """*string* split as ``shlex.split`` splits it, each word as its ``(literal, field)``
    pairs from ``Formatter.parse`` (worked out once per template)."""
    formatter = Formatter()
    return tuple(tuple((literal, field) for literal, field, _, _ in formatter.parse(word))
                 for word in shlex.split(string))


def formatted_string_command(string: str, *args, **kwargs):
    """What ``pyinfra.api.command.make_formatted_string_command`` returns: a
    ``StringCommand`` of the template's words, each ``{field}`` replaced by its value
    (a word of several parts joined without a separator)."""
    from pyinfra.api.command import StringCommand

    formatter = Formatter()
    string_bits: list = []
    for word in _template_words(string):
        token_bits = []
        for literal, field in word:
            if literal:
                token_bits.append(literal)
            if field:
                value, _ = formatter.get_field(field, args, kwargs)
                token_bits.append(value)
        if len(token_bits) == 1:
            string_bits.append(token_bits[0])
        elif len(token_bits) > 1:
            string_bits.append(StringCommand(*token_bits, _separator=""))
    return StringCommand(*string_bits)


#: The modules that import ``make_formatted_string_command`` by name.
_FORMATTED_COMMAND_USERS = (
    "pyinfra.api.command", "pyinfra.facts.files", "pyinfra.facts.server",
    "pyinfra.facts.deb", "pyinfra.facts.rpm", "pyinfra.facts.pacman",
    "pyinfra.facts.freebsd", "pyinfra.operations.files", "pyinfra.operations.util.service",
)


def speed_up_pyinfra() -> None:
    """Use the frame walk for pyinfra's operation order, the cached list of global
    arguments, the quicker global-argument lookup, the once-worked-out operation
    signatures and the once-split command templates (idempotent; each change noted in
    :data:`aicluster.accel.guard.PATCHES`, undone by ``aicluster.accel.disable``)."""
    if _INSTALLED:
        return
    # importlib: the name pyinfra.api.operation is the decorator, not the module.
    operation = importlib.import_module("pyinfra.api.operation")
    PATCHES.replace(operation, "get_operation_order_from_stack",
                    _get_operation_order_from_stack)
    PATCHES.replace(operation, "signature", operation_signature)
    arguments = importlib.import_module("pyinfra.api.arguments")
    if arguments.pop_global_arguments is not pop_global_arguments:
        ORIGINALS["pop_global_arguments"] = arguments.pop_global_arguments
    # Each module that imported them by name has its own reference to replace.
    for name in ("pyinfra.api.arguments", "pyinfra.api.facts", "pyinfra.api.deploy",
                 "pyinfra.api.operation"):
        module = importlib.import_module(name)
        if hasattr(module, "all_global_arguments"):
            PATCHES.replace(module, "all_global_arguments", cached_global_arguments)
        if hasattr(module, "pop_global_arguments"):
            PATCHES.replace(module, "pop_global_arguments", pop_global_arguments)
    command = importlib.import_module("pyinfra.api.command")
    if command.make_formatted_string_command is not formatted_string_command:
        ORIGINALS["make_formatted_string_command"] = command.make_formatted_string_command
    for name in _FORMATTED_COMMAND_USERS:
        module = importlib.import_module(name)
        if hasattr(module, "make_formatted_string_command"):
            PATCHES.replace(module, "make_formatted_string_command", formatted_string_command)
    _INSTALLED.append(True)
