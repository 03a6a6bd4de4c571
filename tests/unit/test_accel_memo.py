"""aicluster.accel.memo.memoize_facts: one read per fact and host until a command,
an upload or a Python callback runs on any host; never memoised inside a callback."""

from __future__ import annotations

import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest
from pyinfra.api import host as api_host
from pyinfra.api.state import StateStage
from pyinfra.facts.files import File
from pyinfra.facts.server import Os

from aicluster.accel import memo as deploys


@pytest.fixture(autouse=True)
def pyinfra_as_it_was(monkeypatch):
    """memoize_facts patches pyinfra for the process: undo it after each test."""
    from pyinfra.api.command import FunctionCommand

    for owner, name in ((api_host, "get_fact"), (api_host.Host, "run_shell_command"),
                        (api_host.Host, "put_file"), (api_host.Host, "rsync"),
                        (FunctionCommand, "execute")):
        monkeypatch.setattr(owner, name, getattr(owner, name))


@pytest.fixture
def reads(monkeypatch):
    calls: list[tuple] = []

    def real(state, host, cls, args=None, kwargs=None, **rest):
        calls.append((host.name, cls.__name__, args, kwargs))
        return {"path": (kwargs or {}).get("path"), "reads": len(calls)}

    monkeypatch.setattr(api_host, "get_fact", real)
    deploys.memoize_facts()
    assert api_host.get_fact is not real
    return calls


def _host(name, **connector):
    return SimpleNamespace(name=name, current_op_global_arguments=connector)


def test_repeated_reads_while_preparing_run_once_per_host(reads):
    state = SimpleNamespace(current_stage=StateStage.Prepare)
    a, b = _host("a"), _host("b")
    first = api_host.get_fact(state, a, File, kwargs={"path": "/etc/x"})
    again = api_host.get_fact(state, a, File, kwargs={"path": "/etc/x"})
    assert first == again == {"path": "/etc/x", "reads": 1}
    # Another path, another fact, another host, another sudo user: each read once.
    api_host.get_fact(state, a, File, kwargs={"path": "/etc/y"})
    api_host.get_fact(state, a, Os)
    api_host.get_fact(state, b, File, kwargs={"path": "/etc/x"})
    api_host.get_fact(state, _host("a", _sudo=True, _sudo_user="slurm"), File,
                      kwargs={"path": "/etc/x"})
    assert len(reads) == 5


def test_answers_are_copies(reads):
    state = SimpleNamespace(current_stage=StateStage.Prepare)
    first = api_host.get_fact(state, _host("a"), File, kwargs={"path": "/p"})
    first["path"] = "changed by an operation"
    assert api_host.get_fact(state, _host("a"), File, kwargs={"path": "/p"})["path"] == "/p"


def test_reads_while_executing_are_answered_until_a_host_changes(reads):
    from pyinfra.api.command import StringCommand

    state, host = _local_state()
    other = state.inventory.get_host("@local")  # any host: a change anywhere forgets all
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    state.set_stage(StateStage.Execute)
    # Nothing ran since operations were prepared: the prepared answer still holds.
    for _ in range(3):
        api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    assert len(reads) == 1
    assert other.run_shell_command(StringCommand("true"))[0]
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    assert len(reads) == 2  # read afresh once after the command, then remembered again


def test_uploads_forget_too(reads, tmp_path):
    state, host = _local_state()
    state.set_stage(StateStage.Execute)
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    source = tmp_path / "src"
    source.write_text("x")
    assert host.put_file(str(source), str(tmp_path / "dst"))
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    assert len(reads) == 2


def test_python_callbacks_always_read_afresh_and_forget(reads):
    from pyinfra.api.command import FunctionCommand

    state, host = _local_state()
    state.set_stage(StateStage.Execute)
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})

    def poll():  # e.g. waiting for a node to come back: every read must be real
        for _ in range(3):
            api_host.get_fact(state, host, File, kwargs={"path": "/p"})

    FunctionCommand(poll, (), {}).execute(state, host, {})
    assert len(reads) == 4
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    assert len(reads) == 5  # the callback may have changed the host: read afresh


def test_prepare_never_forgets(reads):
    from pyinfra.api.command import StringCommand

    state, host = _local_state()
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    host.run_shell_command(StringCommand("true"))  # e.g. the prefetch's one command
    api_host.get_fact(state, host, File, kwargs={"path": "/p"})
    assert len(reads) == 1


def test_installing_twice_wraps_once(reads):
    wrapped = api_host.get_fact
    deploys.memoize_facts()
    assert api_host.get_fact is wrapped


# --- the previous run's reads, fetched in one command (real facts, on this machine) ---


def _local_state():
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    state.set_stage(StateStage.Prepare)
    host = inventory.get_host("@local")
    return state, host


def test_reads_are_remembered_and_prefetched_in_one_command(tmp_path, monkeypatch):
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra.facts.files import Directory, Link, Sha1File
    from pyinfra.facts.server import Hostname, Kernel, LinuxDistribution

    from aicluster.accel import memo

    monkeypatch.setattr(memo, "READS_DIR", tmp_path / "reads")
    memo.memoize_facts()
    d = tmp_path / "files"
    d.mkdir()
    (d / "a.conf").write_text("x = 1\n")
    (d / "with space.conf").write_text("y\n")
    (d / "odd'name").write_text("z\n")
    (d / "link").symlink_to(d / "a.conf")
    asks = [
        (File, {"path": str(d / "a.conf")}),
        (Sha1File, {"path": str(d / "a.conf")}),
        (File, {"path": str(d / "missing")}),
        (Directory, {"path": str(d)}),
        (LinuxDistribution, {}),
        # File, Directory and Link of many paths are read in one stat, checksums in one
        # sha1sum: each answer must be what the fact's own command gives.
        (File, {"path": str(d)}),  # a directory: False
        (Directory, {"path": str(d / "a.conf")}),  # a file: False
        (Link, {"path": str(d / "link")}),
        (File, {"path": str(d / "link")}),
        (Sha1File, {"path": str(d / "missing")}),
        (Sha1File, {"path": str(d)}),
        (Sha1File, {"path": str(d / "with space.conf")}),
        (File, {"path": str(d / "with space.conf")}),
        (Sha1File, {"path": str(d / "odd'name")}),  # not plain: read on its own
        (File, {"path": str(d / "odd'name")}),
        # read with shell builtins instead of their own commands
        (Hostname, {}),
        (Kernel, {}),
        (Os, {}),
    ]

    state, host = _local_state()
    with ctx_state.use(state), ctx_host.use(host):
        first = [host.get_fact(cls, **kw) for cls, kw in asks]
        host.get_fact(File, path=str(d / "a.conf"))  # a repeat is not noted twice
        memo.save_reads(host)
    saved = memo.reads_file(host).read_text()
    assert saved.count("a.conf\"") == 3 and "x = 1" not in saved  # names, never values

    # The next run: one command answers all of them; no fact command runs after it.
    state, host, commands = _counting_local_state(monkeypatch)
    with ctx_state.use(state), ctx_host.use(host):
        assert memo.prefetch_facts(host) == len(asks)
        assert len(commands) == 1
        again = [host.get_fact(cls, **kw) for cls, kw in asks]
    assert len(commands) == 1
    # (reading the file's checksum may move its access time: compare without it)
    assert [_no_atime(v) for v in again] == [_no_atime(v) for v in first]
    assert again[0] is not None and again[2] is None
    assert again[5] is False and again[6] is False and again[7]["link_target"]
    assert again[9] is None and again[11] and again[13]
    script = commands[0].get_raw_value()
    assert "sha1sum -- " in script and "stat -c " in script
    assert "/proc/sys/kernel/ostype" in script and "ls -pdL" not in script


def test_a_read_plan_is_worked_out_once_unless_its_command_reads_the_host(
        tmp_path, monkeypatch):
    """Hosts share how a read is prefetched (its command text), except a fact whose
    command reads another fact of the host (pyinfra's Mounts reads the kernel): that
    one is worked out for each host."""
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra.facts.server import Mounts

    from aicluster.accel import memo

    monkeypatch.setattr(memo, "READS_DIR", tmp_path / "reads")
    memo.memoize_facts()
    state, host = _local_state()
    with ctx_state.use(state), ctx_host.use(host):
        host.get_fact(File, path="/etc/hostname")
        first = host.get_fact(Mounts)
        memo.save_reads(host)

    state, host, commands = _counting_local_state(monkeypatch)
    made = []
    real_plan = memo._read_plan
    monkeypatch.setattr(memo, "_read_plan", lambda entry: made.append(entry[0])
                        or real_plan(entry))
    with ctx_state.use(state), ctx_host.use(host):
        assert memo.prefetch_facts(host) == 3  # File, Mounts and the kernel it read
        assert memo.prefetch_facts(host) == 3  # as a second host asked the same would
        assert host.get_fact(Mounts) == first
    assert made.count("pyinfra.facts.files:File") == 1
    assert made.count("pyinfra.facts.server:Kernel") == 1
    assert made.count("pyinfra.facts.server:Mounts") == 2
    plans = state.__dict__["aicluster_prefetch_plans"]
    assert sorted(text.split("'")[1] for text in plans) == [
        "pyinfra.facts.files:File", "pyinfra.facts.server:Kernel"]


def _counting_local_state(monkeypatch):
    """A local host whose shell commands are listed as they run."""
    state, host = _local_state()
    commands = []
    real_run = host.run_shell_command

    def counting(*args, **kwargs):
        commands.append(args[0])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(host, "run_shell_command", counting)
    return state, host, commands


def _no_atime(value):
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "atime"}
    return value


def test_a_part_that_fails_is_read_the_normal_way(tmp_path, monkeypatch):
    from aicluster.accel import memo

    monkeypatch.setattr(memo, "READS_DIR", tmp_path)
    lines = [
        "@@aicluster-fact@@ 0 begin", "one", "@@aicluster-fact@@ 0 rc 0",
        "@@aicluster-fact@@ 1 begin", "partial", "@@aicluster-fact@@ 1 rc 2",
        "@@aicluster-fact@@ 2 begin",  # cut off: no exit code
    ]
    assert memo.split_output(lines) == {0: (0, ["one"]), 1: (2, ["partial"])}
    script = memo.batch_command([(0, "cat /etc/x", None), (1, "nvidia-smi -L", "nvidia-smi")])
    assert "( cat /etc/x\n) 2>/dev/null" in script
    assert "if command -v nvidia-smi >/dev/null 2>&1; then ( nvidia-smi -L\n)" in script
    # No file from a previous run: nothing prefetched, nothing run.
    state, host = _local_state()
    assert memo.prefetch_facts(host) == 0


def test_timeouts_and_retries_do_not_make_another_read(reads):
    state = SimpleNamespace(current_stage=StateStage.Prepare)
    api_host.get_fact(state, _host("a", _timeout=900, _retries=2,
                                   _retry_until=lambda out: True), File, kwargs={"path": "/p"})
    api_host.get_fact(state, _host("a"), File, kwargs={"path": "/p"})
    assert len(reads) == 1


def test_reads_while_executing_are_saved_at_disconnect(
        tmp_path, monkeypatch):
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.context import ctx_host, ctx_state

    from aicluster.accel import memo

    monkeypatch.setattr(memo, "READS_DIR", tmp_path / "reads")
    memo.memoize_facts()
    (tmp_path / "b.conf").write_text("y = 2\n")
    state, host = _local_state()
    connect_all(state)
    memo.remember_reads(state)
    memo.remember_reads(state)  # once per run, however many hosts run deploy.py
    state.set_stage(StateStage.Execute)
    with ctx_state.use(state), ctx_host.use(host):
        # pyinfra -y reads an operation's facts only while executing it
        value = host.get_fact(File, path=str(tmp_path / "b.conf"))
    assert not memo.reads_file(host).exists()
    disconnect_all(state)
    assert "b.conf" in memo.reads_file(host).read_text()

    state, host = _local_state()
    connect_all(state)
    assert memo.prefetch_facts(host) == 1
    reads_before = []
    monkeypatch.setattr(api_host, "get_fact", api_host.get_fact)
    with ctx_state.use(state), ctx_host.use(host):
        monkeypatch.setattr(host, "run_shell_command",
                            lambda *a, **k: reads_before.append(a) or (False, None))
        assert host.get_fact(File, path=str(tmp_path / "b.conf")) == value
    assert reads_before == []


def test_fact_arguments_match_pyinfra(tmp_path):
    from pyinfra.api.facts import _handle_fact_kwargs
    from pyinfra.facts.files import FindFiles
    from pyinfra.facts.systemd import SystemdStatus

    from aicluster.accel import memo

    state, host = _local_state()
    for cls, args, kwargs in [
        (File, [], {"path": "/etc/x"}),
        (File, ["/etc/x"], {}),
        (FindFiles, ["/etc"], {"quote_path": False}),
        (SystemdStatus, [], {}),
        (SystemdStatus, [], {"services": ["a", "b"]}),
    ]:
        theirs, _ = _handle_fact_kwargs(state, host, cls, args, kwargs)
        theirs.pop("self", None)  # pyinfra's _make_command drops it too
        assert memo._fact_kwargs(cls(), args, kwargs) == theirs, cls


def test_a_read_waits_for_that_hosts_prefetch_under_way(tmp_path, monkeypatch):
    """Another host's deploy asking for this host's fact while this host's one-command
    read runs gets the prefetched answer, not a read of its own."""
    import gevent
    import gevent.event
    from pyinfra.context import ctx_host, ctx_state

    from aicluster.accel import memo

    monkeypatch.setattr(memo, "READS_DIR", tmp_path / "reads")
    memo.memoize_facts()
    state, host = _local_state()
    pending = gevent.event.Event()
    state.__dict__["aicluster_prefetching"] = {host.name: (pending, None)}
    commands = []
    monkeypatch.setattr(host, "run_shell_command",
                        lambda *a, **k: commands.append(a) or (False, None))
    path = str(tmp_path / "c.conf")

    def ask():
        with ctx_state.use(state), ctx_host.use(host):
            return host.get_fact(File, path=path)

    asking = gevent.spawn(ask)
    gevent.sleep(0.05)
    assert not asking.ready()  # waiting for the prefetch
    answer = {"user": "root", "group": "root", "mode": 644, "size": 1}
    memo._memo(state, host.name)[memo.fact_key(host, File, None, {"path": path})] = answer
    pending.set()
    assert asking.get(timeout=5) == answer
    assert commands == []


def test_answers_are_copies_no_operation_can_alter():
    import copy
    import datetime

    from aicluster.render import plain_copy

    value = {"pkgs": {"curl": ["7.88", "8.0"]}, "units": [{"a": True}], "t": (1, [2]),
             "when": datetime.datetime(2026, 1, 1), "s": {"x"}, "n": None,
             "other": SimpleNamespace(x=[1])}
    got = plain_copy(value)
    assert got == value == copy.deepcopy(value) and got["other"] is not value["other"]
    got["pkgs"]["curl"].append("9")
    got["units"][0]["a"] = False
    got["t"][1].append(3)
    got["s"].add("y")
    got["other"].x.append(2)
    assert value == {"pkgs": {"curl": ["7.88", "8.0"]}, "units": [{"a": True}], "t": (1, [2]),
                     "when": datetime.datetime(2026, 1, 1), "s": {"x"}, "n": None,
                     "other": value["other"]}
    assert value["other"].x == [1]


#: A STAND-IN systemctl for this machine, which has no systemd: ``show`` prints what
#: systemd 252 printed on a testbed node for these units (one block per unit named, in
#: the order named, blank line between; the properties asked for in systemd's own order,
#: Id, LoadState, SubState, UnitFileState, whatever order they were asked in).
_FAKE_SYSTEMCTL = r"""#!/usr/bin/env python3
import sys
UNITS = {"chrony.service": ("running", "enabled"), "slurmd.service": ("dead", "disabled"),
         "ssh.service": ("running", "enabled")}
ALIASES = {"sshd.service": "ssh.service"}
args = sys.argv[1:]
assert args[0] == "show", args
props, units, i = [], [], 1
while i < len(args):
    if args[i] == "--property":
        props.append(args[i + 1]); i += 2
    elif args[i] == "--all":
        i += 1
    else:
        units.append(args[i]); i += 1
if "--value" in units:  # one unit, the values alone (UnitLoaded's own command)
    units.remove("--value")
    unit = ALIASES.get(units[0], units[0])
    print("loaded" if unit in UNITS else "not-found")
    sys.exit(0)
blocks = []
for unit in units:
    unit = ALIASES.get(unit, unit)
    sub, enabled = UNITS.get(unit, ("dead", ""))
    load = "loaded" if unit in UNITS else "not-found"
    values = {"Id": unit, "LoadState": load, "SubState": sub, "UnitFileState": enabled}
    blocks.append("\n".join(f"{p}={values[p]}" for p in values if p in props))
print("\n\n".join(blocks))
"""


def test_unit_states_are_read_in_one_systemctl(tmp_path, monkeypatch):
    """SystemdStatus, SystemdEnabled and UnitLoaded of many units come from one
    ``systemctl show``; each answer is what the fact's own command gives (an alias, a
    unit that does not exist, one asked as a list); a unit named oddly, or a user-mode
    read, alone."""
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

    from aicluster.accel import memo
    from aicluster.common.facts import UnitLoaded

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "systemctl"
    fake.write_text(_FAKE_SYSTEMCTL)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setattr(memo, "READS_DIR", tmp_path / "reads")
    memo.memoize_facts()
    asks = [
        (SystemdStatus, {"services": "chrony.service"}),
        (SystemdEnabled, {"services": "chrony.service"}),
        (SystemdStatus, {"services": ["slurmd.service"]}),
        (SystemdEnabled, {"services": "slurmd.service"}),
        (SystemdStatus, {"services": "sshd.service"}),  # an alias: Id is ssh.service
        (SystemdEnabled, {"services": "missing.service"}),
        (UnitLoaded, {"unit": "slurmd.service"}),
        (UnitLoaded, {"unit": "sshd.service"}),
        (UnitLoaded, {"unit": "missing.service"}),
        (SystemdStatus, {"services": "bad\\x20name.service"}),  # not plain: alone
        (SystemdStatus, {"services": "chrony.service", "user_mode": True}),  # alone
    ]
    state, host = _local_state()
    with ctx_state.use(state), ctx_host.use(host):
        first = [host.get_fact(cls, **kw) for cls, kw in asks]
        memo.save_reads(host)
    assert first[0] == {"chrony.service": True} and first[3] == {"slurmd.service": False}
    assert first[4] == {"ssh.service": True} and first[5] == {"missing.service": False}
    assert first[6:9] == [True, True, False]

    state, host, commands = _counting_local_state(monkeypatch)
    with ctx_state.use(state), ctx_host.use(host):
        assert memo.prefetch_facts(host) == len(asks)
        again = [host.get_fact(cls, **kw) for cls, kw in asks]
    assert len(commands) == 1 and again == first
    script = commands[0].get_raw_value()
    group = ("systemctl show --all --property Id --property SubState --property UnitFileState"
             " --property LoadState chrony.service slurmd.service sshd.service missing.service &&")
    assert script.count("--property UnitFileState") == 1 and group in script


def test_a_systemctl_answer_that_does_not_fit_is_not_used():
    from aicluster.accel.memo import _SystemdGroup

    keys = ["SubState a.service", "UnitFileState b.service"]
    done = "@@aicluster-fact@@done"
    # One block short (a unit systemctl skipped): nothing is taken from it.
    assert _SystemdGroup.split(["Id=a.service", "SubState=running", done], keys) is None
    # Cut off before the closing mark.
    assert _SystemdGroup.split(["Id=a.service", "SubState=running", ""], keys) is None
    got = _SystemdGroup.split(["Id=a.service", "SubState=running", "UnitFileState=enabled", "",
                               "Id=b.service", "SubState=dead", "UnitFileState=", done], keys)
    assert got == {"SubState a.service": ["Id=a.service", "SubState=running"],
                   "UnitFileState b.service": ["Id=b.service", "UnitFileState="]}


def _lines_as_pyinfra_reads(stdout: bytes) -> list[str]:
    """A command's output lines as pyinfra's read_buffer makes them."""
    return [line.decode("utf-8").rstrip("\n") for line in stdout.splitlines(keepends=True)]


def test_a_packed_answer_reads_as_the_plain_one(tmp_path):
    """The one-command read comes back gzipped in one base64 line where the node has
    gzip and base64, and reads exactly as the plain output would (empty lines, a last
    line without newline, UTF-8); without gzip it is the plain output."""
    from aicluster.accel import memo

    script = memo.batch_command([
        (0, "printf 'a\\n\\n  b c \\n\\n'", None),
        (1, "printf 'gr\\303\\274n\\n'; seq 1 3000", None),
        (2, "printf 'last'", None),
    ])
    plain = _lines_as_pyinfra_reads(subprocess.run(
        ["sh", "-c", script], capture_output=True, check=True).stdout)
    packed = _lines_as_pyinfra_reads(subprocess.run(
        ["sh", "-c", memo.packed(script)], capture_output=True, check=True).stdout)
    assert len(packed) == 2 and packed[0] == "@@aicluster-fact@@ gzip"
    assert memo.unpacked(packed) == plain
    assert memo.split_output(plain)[1][1][0] == "grün"
    assert memo.unpacked(plain) == plain
    with pytest.raises(ValueError):
        memo.unpacked([packed[0], packed[1][: len(packed[1]) // 2]])
    bindir = tmp_path
    for tool in ("sh", "printf", "seq"):
        (bindir / tool).symlink_to(shutil.which(tool))
    without_gzip = subprocess.run(["sh", "-c", memo.packed(script)], capture_output=True,
                                  check=True, env={"PATH": str(bindir)}).stdout
    assert _lines_as_pyinfra_reads(without_gzip) == plain


def test_a_put_to_a_missing_file_notes_its_checksum_for_the_next_run(tmp_path, monkeypatch):
    """files.put of a file not there yet reads File only; the next run reads its Sha1File
    too, so that read is noted now (and prefetched with the rest next time). A File read
    outside files.put, or of a file that is there, notes nothing more."""
    from io import StringIO

    from pyinfra.api.connect import connect_all
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra.operations import files

    from aicluster.accel import memo

    monkeypatch.setattr(memo, "READS_DIR", tmp_path / "reads")
    memo.memoize_facts()
    (tmp_path / "there.conf").write_text("x\n")
    state, host = _local_state()
    connect_all(state)
    state.set_stage(StateStage.Execute)
    with ctx_state.use(state), ctx_host.use(host):
        new = str(tmp_path / "new.conf")
        commands = list(files.put._inner(src=StringIO("y\n"), dest=new))
        assert commands  # it would upload
        host.get_fact(File, path=str(tmp_path / "elsewhere"))  # missing, not a put
        host.get_fact(File, path=str(tmp_path / "there.conf"))
    memo.save_reads(host)
    saved = memo.reads_file(host).read_text()
    assert f'"pyinfra.facts.files:Sha1File", [], {{"path": "{new}"}}' in saved
    assert saved.count("Sha1File") == 1


def _run_sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def test_cheaper_commands_print_what_pyinfras_print(tmp_path):
    """Each stand-in for one of pyinfra's fact commands prints what that command prints,
    exit code included: on this machine, in a release-file directory with every kind
    of entry, and with /proc unreadable (the fallback runs pyinfra's command)."""
    from pyinfra.facts.server import Hostname, Kernel, LinuxDistribution

    from aicluster.accel import memo

    for fact in (Hostname, Kernel, Os, LinuxDistribution):
        assert fact().command() in memo.CHEAPER_COMMANDS, fact.__name__
    for theirs, ours in memo.CHEAPER_COMMANDS.items():
        a, b = _run_sh(theirs), _run_sh(ours)
        assert (b.stdout, b.returncode) == (a.stdout, a.returncode), theirs
        assert b.stdout.strip()
        gone = ours.replace("/proc/sys/kernel/", str(tmp_path / "nothing") + "/")
        if gone != ours:
            c = _run_sh(gone)
            assert (c.stdout, c.returncode) == (a.stdout, a.returncode)

    release = LinuxDistribution().command()
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "os-release").write_text('ID=rocky\nNAME="Rocky Linux"\nVERSION_ID="9.4"\n')
    (etc / "rocky-release").write_text("Rocky Linux release 9.4 (Blue Onyx)\n")
    (etc / "system-release").symlink_to("rocky-release")
    (etc / "empty-release").write_text("")
    (etc / "dir-release").mkdir()
    (etc / "linked-dir-release").symlink_to("dir-release")
    (etc / "dangling-release").symlink_to("nowhere")
    (etc / "release.bak").write_text("not a release file\n")
    theirs = _run_sh(release.replace("/etc/", f"{etc}/"))
    ours = _run_sh(memo.CHEAPER_COMMANDS[release].replace("/etc/", f"{etc}/"))
    assert ours.returncode == theirs.returncode == 0
    assert ours.stdout == theirs.stdout
    assert LinuxDistribution().process(ours.stdout.splitlines())["name"] == "Rocky Linux"
    for entry in list(etc.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            entry.rmdir()
        else:
            entry.unlink()
    theirs = _run_sh(release.replace("/etc/", f"{etc}/"))
    ours = _run_sh(memo.CHEAPER_COMMANDS[release].replace("/etc/", f"{etc}/"))
    assert (ours.stdout, ours.returncode) == (theirs.stdout, theirs.returncode) == ("", 0)


def test_stat_in_one_command_only_where_stat_knows_c(tmp_path):
    """The one stat asks for / first: a stat that does not know ``-c`` prints no line
    for it, and the files are then read one by one (each with its own fallback)."""
    from aicluster.accel import memo

    group = memo.GROUPED["stat"]
    mark = "@@aicluster-fact@@"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "stat").write_text("#!/bin/sh\necho 'stat: illegal option -- c' >&2; exit 1\n")
    (bindir / "stat").chmod(0o755)
    command = group.command([str(tmp_path)])
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    bsd = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    assert group.split(bsd.stdout.splitlines(), [str(tmp_path)]) is None
    gnu = _run_sh(command).stdout.splitlines()
    answers = group.split(gnu, [str(tmp_path)])
    assert answers is not None and "mode=d" in answers[str(tmp_path)][0]
    assert group.split([f"{mark}done"], [str(tmp_path)]) is None


def test_answers_parsed_once_for_hosts_that_print_the_same():
    from pyinfra.facts.deb import DebPackages
    from pyinfra.facts.server import Hostname

    from aicluster.accel import memo

    state = SimpleNamespace()
    lines = ["ii  bash    5.2.15-2+b2  amd64  GNU Bourne Again SHell",
             "ii  zlib1g:amd64  1:1.2.13.dfsg-1  amd64  compression library"]
    calls = []

    class Counting(DebPackages):
        def process(self, output):
            calls.append(list(output))
            return super().process(output)

    Counting.__module__, Counting.__qualname__ = DebPackages.__module__, "DebPackages"
    first = memo._processed(state, Counting, Counting(), lines)
    again = memo._processed(state, Counting, Counting(), list(lines))
    assert again == first == DebPackages().process(lines) and len(calls) == 1
    memo._processed(state, Counting, Counting(), lines[:1])
    assert len(calls) == 2  # other output: parsed again
    # a fact not known to depend on its output alone is parsed for every host
    assert memo._processed(state, Hostname, Hostname(), ["node1"]) == "node1"
    assert "pyinfra.facts.server:Hostname" not in memo.SHARED_PROCESS


def _shared_shell_samples(tmp_path):
    """Each command that may run in the batch's own shell, with arguments to run it."""
    import importlib
    import inspect
    import pkgutil

    from pyinfra.api import FactBase

    import aicluster
    from aicluster.accel import memo

    venv = tmp_path / "ray" / "2.60.0" / "venv"
    (venv / "lib/python3.11/site-packages/ray-2.60.0.dist-info").mkdir(parents=True)
    (venv / "lib/python3.11/site-packages/ray-2.60.0.dist-info/METADATA").write_text("x\n")
    (tmp_path / "a file").write_text("x\n")
    samples = {
        "ContainerVirt": {}, "NftTable": {"family": "inet", "table": "aicluster"},
        "GlobPaths": {"pattern": "/etc/*-release"}, "UserAccount": {"user": "root"},
        "UnitLoaded": {"unit": "ssh.service"}, "CgroupWritable": {}, "NvidiaDriver": {},
        "SlurmConf": {}, "NetworkInterfaces": {},
        "ManagementInterface": {"address": "127.0.0.1"}, "InfinibandPorts": {},
        "RayNode": {"python": "python3", "venv": str(venv),
                    "install_dir": str(tmp_path / "ray")},
    }
    commands = {}
    fact_modules = [info.name for info in pkgutil.walk_packages(aicluster.__path__, "aicluster.")
                    if info.name.endswith(".facts") and ".testbed" not in info.name]
    assert "aicluster.common.facts" in fact_modules
    for name in fact_modules:
        module = importlib.import_module(name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if (issubclass(cls, FactBase) and cls.__module__ == name
                    and getattr(cls, "shares_shell", False)):
                assert name in samples, f"{name} shares the shell: give it a sample here"
                commands[name] = cls().command(**samples[name])
    commands.update({f"cheaper {n}": c for n, c in enumerate(memo.CHEAPER_COMMANDS.values())})
    commands["command -v"] = "command -v sh || true"
    commands["stat group"] = memo.GROUPED["stat"].command([str(tmp_path / "a file"), "/no"])
    commands["sha1 group"] = memo.GROUPED["sha1"].command([str(tmp_path / "a file"), "/no"])
    commands["systemd group"] = memo.GROUPED["systemd"].command(
        ["SubState ssh.service", "UnitFileState ssh.service"])
    return commands


def test_commands_sharing_the_shell_leave_it_as_they_found_it(tmp_path):
    """A command run in the batch's own shell prints what it prints in a subshell of its
    own, with every variable it names set beforehand (it must set each before reading
    it), and leaves the directory, IFS and the shell itself as they were."""
    import re

    from aicluster.accel import memo

    work = tmp_path / "work"
    work.mkdir()
    for name, command in _shared_shell_samples(tmp_path).items():
        from pyinfra.api.command import StringCommand

        if isinstance(command, StringCommand):
            command = command.get_raw_value()
        if not name.endswith(" group"):  # (a group's one command always shares it)
            assert memo.shares_shell(type("Any", (), {"shares_shell": name[0].isupper()}),
                                     command), name
        names = set(re.findall(r"\$\{?#?([A-Za-z_][A-Za-z0-9_]*)", command))
        names |= set(re.findall(r"(?<![A-Za-z0-9_$])([A-Za-z_][A-Za-z0-9_]*)=", command))
        names -= {"IFS", "PATH", "HOME"}
        poison = "; ".join(f"{n}=poison" for n in sorted(names)) or ":"
        probe = 'echo "rc=$?"; [ "$IFS" = "$saved" ] && echo ifs-kept; pwd'
        alone = _run_sh(f"cd {work}; saved=$IFS; ( {command}\n) 2>/dev/null; {probe}")
        shared = _run_sh(f"cd {work}; saved=$IFS; {poison}; {{ {command}\n}} 2>/dev/null; "
                         f"{probe}")
        assert shared.stdout == alone.stdout, name
        assert shared.stdout.endswith(f"ifs-kept\n{work}\n"), name
    # what the batch runs: shared parts in braces, the others in a subshell each
    script = memo.batch_command([(0, "cat /etc/x", None, False), (1, "uname -n", None, True),
                                 (2, "dpkg -l", "dpkg", True)])
    assert "( cat /etc/x\n)" in script and "{ uname -n\n}" in script
    assert "then { dpkg -l\n}; else" in script


def _dpkg_status(packages: list[tuple[str, str, str, str]]) -> str:
    """A dpkg status file: (name, status, architecture, version) each; the last
    paragraph without a blank line after it."""
    return "\n".join(
        f"Package: {name}\nStatus: {status}\nPriority: optional\nMaintainer: t <t@t>\n"
        f"Architecture: {arch}\n" + ("Multi-Arch: same\n" if name.startswith("lib") else "")
        + f"Version: {version}\nDescription: {name}\n a longer text\n .\n Version: 9\n"
        for name, status, arch, version in packages)


def test_dpkg_packages_read_from_the_status_file_parse_as_dpkg_l(tmp_path):
    """The awk read of dpkg's status file gives pyinfra's DebPackages the answer that
    ``dpkg -l`` gives it: on this machine, and on a status file with every state."""
    from pyinfra.facts.deb import DebPackages

    from aicluster.accel import memo

    ours = memo.CHEAPER_PARSED[("pyinfra.facts.deb:DebPackages", DebPackages().command())]
    plan = memo._read_plan(["pyinfra.facts.deb:DebPackages", [], {}])
    assert plan[4] == ours and not plan[6]  # it sets variables: a subshell of its own

    def answer(command: str):
        run = _run_sh(command)
        assert run.returncode == 0, run.stderr
        return DebPackages().process(run.stdout.splitlines())

    if shutil.which("dpkg"):
        here = answer(ours)
        assert here and here == answer("dpkg -l")

    admin = tmp_path / "dpkg"
    (admin / "updates").mkdir(parents=True)
    (admin / "status").write_text(_dpkg_status([
        ("libfoo", "install ok installed", "amd64", "1:2.3-4"),
        ("libfoo", "install ok installed", "i386", "1:2.3-4"),
        ("held", "hold ok installed", "all", "0.9~rc1+dfsg"),
        ("gone", "deinstall ok config-files", "amd64", "1.0"),
        ("broken", "install reinstreq installed", "amd64", "1.1"),
        ("unpacked", "install ok unpacked", "amd64", "1.2"),
        ("halfway", "install ok half-configured", "amd64", "1.3"),
        ("last", "install ok installed", "amd64", "2.0"),
    ]))
    local = ours.replace("/var/lib/dpkg/", f"{admin}/").replace(
        "dpkg -l", f"dpkg --admindir={admin} -l")
    expected = {"libfoo": {"1:2.3-4"}, "held": {"0.9~rc1+dfsg"}, "last": {"2.0"}}
    assert answer(local) == expected
    if shutil.which("dpkg"):
        assert answer(f"dpkg --admindir={admin} -l 2>/dev/null") == expected
        # A dpkg run left updates not merged into the status file yet: dpkg reads them.
        (admin / "updates" / "0000").write_text(_dpkg_status([
            ("newer", "install ok installed", "amd64", "3.0")]))
        assert answer(local) == answer(f"dpkg --admindir={admin} -l 2>/dev/null")
        assert "newer" in answer(local)
