"""aicluster.accel.speed gives what pyinfra's own functions give."""

import importlib
import sys
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api.util import get_operation_order_from_stack

from aicluster.accel.speed import (
    cached_global_arguments,
    operation_order_from_frames,
    speed_up_pyinfra,
)


@pytest.fixture(autouse=True)
def pyinfra_as_it_was(monkeypatch):
    """speed_up_pyinfra patches pyinfra's modules for the process: every function and
    method of pyinfra's loaded modules is put back after each test."""
    from aicluster.accel import speed as pyinfra_speed

    monkeypatch.setattr(pyinfra_speed, "_INSTALLED", [])
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("pyinfra"):
            continue
        for key, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == name:
                for attr, member in list(vars(value).items()):
                    if callable(member) and not attr.startswith("__"):
                        monkeypatch.setattr(value, attr, member)
            elif callable(value) and not isinstance(value, type):
                monkeypatch.setattr(module, key, value)


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
    from aicluster.accel import speed as pyinfra_speed

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

    from aicluster.accel.speed import operation_signature

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

    from aicluster.accel import speed as pyinfra_speed

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

    from aicluster.accel import speed as pyinfra_speed

    state, host = _host_with_data({}, {})
    with pytest.raises(ArgumentTypeError, match="_retries"):
        pyinfra_speed.pop_global_arguments(state, host, {"_retries": "many"})


@pytest.mark.parametrize("key, value", [
    ("_retries", "many"), ("_sudo", 1), ("_timeout", 1.5), ("name", 3), ("_chdir", b"/"),
    ("_env", {"A": 1}), ("_success_exit_codes", 5),
])
def test_global_argument_types_refused_as_pyinfra_refuses_them(key, value):
    """Values of a plain class's type skip pyinfra's typeguard call; every other value
    still meets it, so what pyinfra refuses is refused with its message."""
    from pyinfra.api import arguments as pyinfra_arguments
    from pyinfra.api.exceptions import ArgumentTypeError

    from aicluster.accel import speed as pyinfra_speed

    real = pyinfra_speed.ORIGINALS.get("pop_global_arguments",
                                       pyinfra_arguments.pop_global_arguments)
    state, host = _host_with_data({}, {})
    with pytest.raises(ArgumentTypeError) as theirs:
        real(state, host, {key: value})
    with pytest.raises(ArgumentTypeError) as ours:
        pyinfra_speed.pop_global_arguments(state, host, {key: value})
    assert str(ours.value) == str(theirs.value)
    # and what pyinfra takes is taken alike
    for good in ({"name": "Install"}, {"_sudo": True}, {"_timeout": 30}, {"_retry_delay": 2}):
        assert (pyinfra_speed.pop_global_arguments(state, host, dict(good))
                == real(state, host, dict(good)))


def _real_formatted_string_command():
    from pyinfra.api import command

    from aicluster.accel import speed as pyinfra_speed

    real = pyinfra_speed.ORIGINALS.get("make_formatted_string_command",
                                       command.make_formatted_string_command)
    assert real.__module__ == "pyinfra.api.command" and real.__name__ != "formatted_string_command"
    return real


def _shape(value):
    """A command's words: their kinds, separators and raw text, nested."""
    from pyinfra.api.command import StringCommand

    if isinstance(value, StringCommand):
        return ("cmd", value.separator, tuple(_shape(bit) for bit in value.bits))
    return (type(value).__name__, str(value))


@pytest.mark.parametrize("template, args, kwargs", [
    # Sha1File's template, a path with spaces and quotes
    ("test -e {0} && ( sha1sum {0} 2> /dev/null || shasum {0} 2> /dev/null || "
     "sha1 {0} 2> /dev/null ) || true", ("/etc/it's here",), {}),
    ("cat {0} 2>/dev/null || true", ("/etc/slurm/slurm.conf",), {}),
    ("systemctl {1} {0}", ("ray-worker.service", "restart"), {}),
    ("chown {0}:{1} '{2}'", ("ray", "ray", "/var/lib/ray dir"), {}),
    ("curl -sSLf {url} -o {dest}", (), {"url": "http://10.213.0.1/a b", "dest": "/tmp/x"}),
    ('echo "{0} and {1}" > {2}', ("one", "two", "/tmp/out"), {}),
    ("true", (), {}),
])
@pytest.mark.parametrize("quoted", [False, True])
def test_formatted_commands_as_pyinfra_makes_them(template, args, kwargs, quoted):
    """The once-split template gives the command pyinfra's own function gives: the
    same words, the same raw text, the same masked text; QuoteString values quoted."""
    from pyinfra.api.command import QuoteString

    from aicluster.accel.speed import formatted_string_command

    real = _real_formatted_string_command()
    if quoted:
        args = tuple(QuoteString(a) for a in args)
        kwargs = {k: QuoteString(v) for k, v in kwargs.items()}
    for _ in range(2):  # the second call is served from the cache
        ours = formatted_string_command(template, *args, **kwargs)
        theirs = real(template, *args, **kwargs)
        assert _shape(ours) == _shape(theirs)
        assert ours.get_raw_value() == theirs.get_raw_value()
        assert str(ours) == str(theirs)


def test_formatted_command_errors_as_pyinfras():
    from aicluster.accel.speed import formatted_string_command

    real = _real_formatted_string_command()
    for template, args in (("echo {1}", ("only one",)), ("echo 'unclosed {0}", ("x",))):
        with pytest.raises(Exception) as theirs:
            real(template, *args)
        with pytest.raises(type(theirs.value)):
            formatted_string_command(template, *args)


def test_formatted_command_installed_where_pyinfra_imported_it(monkeypatch):
    from aicluster.accel import speed as pyinfra_speed

    names = pyinfra_speed._FORMATTED_COMMAND_USERS
    modules = [importlib.import_module(name) for name in names]
    for module in modules:
        monkeypatch.setattr(module, "make_formatted_string_command",
                            _real_formatted_string_command())
    monkeypatch.setattr(pyinfra_speed, "_INSTALLED", [])
    speed_up_pyinfra()
    for module in modules:
        assert module.make_formatted_string_command is pyinfra_speed.formatted_string_command
    # every module of pyinfra that imports it by name is in the list
    import pkgutil

    import pyinfra as package
    for info in pkgutil.walk_packages(package.__path__, "pyinfra."):
        if info.name.startswith(("pyinfra.connectors", "pyinfra_cli")):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "make_formatted_string_command") and info.name not in names:
            pytest.fail(f"{info.name} imports make_formatted_string_command: add it")
