"""aicluster.ssh_mux: pyinfra's SSH connection through an OpenSSH master kept open
between runs.

No node here: a stand-in ``ssh`` client first on PATH (``fake_ssh``) logs its command
line and environment, answers ``-O check``/``-O exit`` from a state file, and runs the
remote command in a local shell, so commands, uploads and downloads go through the
connector for real. A stand-in master (``fake_master``) listens on a control socket and
speaks OpenSSH's multiplexing protocol, running each session's command in a local
shell on the descriptors it is passed. The testbed's e2e deploys run through the real
OpenSSH client and master (tests/e2e/test_pyinfra.py).
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import ConnectError

from aicluster import ssh_mux
from aicluster.ssh_mux import MuxSSHConnector

FAKE_SSH = r'''#!{python}
# Stand-in OpenSSH client (tests/unit/test_ssh_mux.py).
import json, os, subprocess, sys
state = os.environ["FAKE_SSH_STATE"]
argv = sys.argv[1:]
with open(state + ".log", "a") as log:
    log.write(json.dumps({{"argv": argv, "locale": sorted(
        k for k in os.environ if k.startswith(("LANG", "LC_")))}}) + "\n")
control = argv[argv.index("-o", argv.index("ControlMaster=auto")) + 1].split("=", 1)[1]
master = os.path.exists(control)
if "-O" in argv:
    op = argv[argv.index("-O") + 1]
    if op == "exit" and master:
        os.remove(control)
    sys.exit(0 if master else 255)
if os.path.exists(state + ".stale") and master:
    os.remove(state + ".stale")
    sys.stderr.write("mux_client_request_session: read from master failed: Broken pipe\n")
    sys.exit(255)
if os.path.exists(state + ".refuse"):
    sys.stderr.write("ssh: connect to host 10.0.0.9 port 22: Connection refused\n")
    sys.exit(255)
if not master:
    open(control, "w").close()  # the master, made by the first session
command = argv[argv.index("--") + 2]
sys.exit(subprocess.run(["sh", "-c", command]).returncode)
'''


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """The stand-in client first on PATH; returns its state file's stem."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH.format(python=sys.executable))
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_STATE", str(tmp_path / "ssh"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    monkeypatch.setenv("PYTHONCOERCECLOCALE", "0")  # the stand-in's Python sets none
    return tmp_path / "ssh"


FAKE_MASTER = r'''
# Stand-in OpenSSH master (tests/unit/test_ssh_mux.py): on its control socket, the
# multiplexing protocol's hello and new-session messages; each session's command runs
# in a local shell on the three descriptors passed, and its exit status is sent back.
# A client that closes the socket early ends its session: the command is killed.
import json, os, select, socket, struct, subprocess, sys
path, log, mode = sys.argv[1:4]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(8)
print("ready", flush=True)

def exact(conn, size):
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data

def message(conn):
    return exact(conn, struct.unpack(">I", exact(conn, 4))[0])

def send(conn, payload):
    conn.sendall(struct.pack(">I", len(payload)) + payload)

def string(data, offset):
    size = struct.unpack_from(">I", data, offset)[0]
    return data[offset + 4:offset + 4 + size], offset + 4 + size

while True:
    conn, _ = server.accept()
    with conn:
        if message(conn)[:8] != struct.pack(">II", 1, 4):
            continue
        send(conn, struct.pack(">II", 1, 4))
        request = message(conn)
        kind, rid = struct.unpack_from(">II", request)
        _, offset = string(request, 8)
        flags = struct.unpack_from(">IIIII", request, offset)
        term, offset = string(request, offset + 20)
        command, offset = string(request, offset)
        fds = []
        for _ in range(3):
            _, ancillary, _, _ = conn.recvmsg(1, socket.CMSG_SPACE(4))
            fds.append(struct.unpack("i", ancillary[0][2][:4])[0])
        with open(log, "a") as out:
            out.write(json.dumps({"kind": kind, "command": command.decode(), "flags": flags,
                                  "term": term.decode(),
                                  "environment": len(request) - offset}) + "\n")
        if mode == "refuse":
            send(conn, struct.pack(">III", 0x80000003, rid, 7) + b"refused")
            for fd in fds:
                os.close(fd)
            continue
        proc = subprocess.Popen(["sh", "-c", command.decode()], stdin=fds[0], stdout=fds[1],
                                stderr=fds[2])
        for fd in fds:
            os.close(fd)
        send(conn, struct.pack(">III", 0x80000006, rid, 7))
        while proc.poll() is None:
            if select.select([conn], [], [], 0.05)[0] and not conn.recv(1):
                proc.kill()
        if proc.wait() < 0:
            continue  # killed: closed without an exit status, as OpenSSH's master does
        send(conn, struct.pack(">III", 0x80000004, 7, proc.returncode))
'''


@pytest.fixture
def fake_master(fake_ssh):
    """Start a stand-in master on a connector's control socket; returns its log."""
    started = []

    def start(conn: MuxSSHConnector, mode: str = "run") -> Path:
        conn.ssh_argv()  # its control path
        log = Path(str(fake_ssh) + ".master.log")
        proc = subprocess.Popen([sys.executable, "-c", FAKE_MASTER, conn.control_path,
                                 str(log), mode], stdout=subprocess.PIPE, text=True)  # fmt: skip
        started.append(proc)
        assert proc.stdout.readline() == "ready\n"
        return log

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def sessions(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def calls(stem: Path) -> list[dict]:
    log = Path(str(stem) + ".log")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def ops(stem: Path) -> list[str]:
    """What each call of the stand-in client did: ``check``, ``exit`` or ``run``."""
    return [c["argv"][1] if c["argv"][0] == "-O" else "run" for c in calls(stem)]


def clear(stem: Path) -> None:
    Path(str(stem) + ".log").unlink(missing_ok=True)


def connector(data: dict | None = None) -> MuxSSHConnector:
    host_data = {"ssh_hostname": "10.0.0.9", "ssh_user": "ops", "ssh_port": 2222,
                 "ssh_key": "/keys/id_ed25519", **(data or {})}  # fmt: skip
    inventory = Inventory(([("node9", host_data)], {}))
    state = State(inventory, Config())
    host = inventory.get_host("node9")
    return MuxSSHConnector(state, host)


def test_command_line_asks_for_a_shared_master_and_the_hosts_own_settings(fake_ssh):
    argv = connector({"ssh_known_hosts_file": "/dev/null",
                      "ssh_strict_host_key_checking": "no"}).ssh_argv()  # fmt: skip
    text = " ".join(argv)
    assert argv[0] == "ssh" and argv[-2:] == ["--", "10.0.0.9"]
    for option in ("ControlMaster=auto", "ControlPersist=60", "BatchMode=yes",
                   "UserKnownHostsFile=/dev/null", "StrictHostKeyChecking=no",
                   "IdentitiesOnly=yes", "IdentityAgent=none"):  # fmt: skip
        assert f"-o {option}" in text
    assert f"ControlPath={fake_ssh.parent}/aicluster-ssh/" in text
    # Another way of reaching the same address gets a master of its own.
    assert connector({"ssh_user": "root"}).ssh_argv()[5] != argv[5]
    assert "-p 2222" in text and "-l ops" in text and "-i /keys/id_ed25519" in text
    assert "-A" not in argv
    assert "ControlPersist=300" in " ".join(connector({"ssh_control_persist": 300}).ssh_argv())


def test_socket_directory_is_private_and_refused_when_open_to_others(fake_ssh):
    path = Path(ssh_mux.control_directory())
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)
    with pytest.raises(ConnectError, match="mode 0700"):
        ssh_mux.control_directory()


def test_commands_run_with_their_output_exit_status_and_stdin(fake_ssh):
    conn = connector()
    conn.connect()
    ok, out = conn.run_shell_command(StringCommand("echo out; echo err >&2; cat"),
                                     _stdin="fed in")  # fmt: skip
    assert ok and out.stdout_lines == ["out", "fed in"] and out.stderr_lines == ["err"]
    ok, out = conn.run_shell_command(StringCommand("exit 3"))
    assert not ok
    ok, _ = conn.run_shell_command(StringCommand("exit 3"), _success_exit_codes=[3])
    assert ok
    # The nodes' commands run in their own locale: none of ours is passed to ssh.
    assert all(call["locale"] == [] for call in calls(fake_ssh))


def test_a_command_past_its_timeout_is_stopped(fake_ssh):
    conn = connector()
    with pytest.raises(TimeoutError):
        conn.run_shell_command(StringCommand("sleep 30"), _timeout=0.5)


def test_files_go_up_and_come_back_byte_for_byte(fake_ssh, tmp_path):
    conn = connector()
    conn.connect()
    payload = bytes(range(256)) * 64
    remote = tmp_path / "remote dir's file"
    assert conn.put_file(io.BytesIO(payload), str(remote))
    assert remote.read_bytes() == payload
    back = io.BytesIO()
    assert conn.get_file(str(remote), back)
    assert back.getvalue() == payload
    with pytest.raises(OSError, match="missing"):
        conn.get_file(str(tmp_path / "missing"), io.BytesIO())


def test_connect_reuses_a_live_master_and_replaces_a_stale_one(fake_ssh):
    conn = connector()
    conn.connect()  # no master yet: one is made by a first session
    assert ops(fake_ssh) == ["run"]
    assert conn.control_path.startswith(f"{fake_ssh.parent}/aicluster-ssh/")

    clear(fake_ssh)
    conn = connector()
    conn.connect()  # the next run: the master's socket is there, nothing is started
    assert ops(fake_ssh) == []
    assert conn.run_shell_command(StringCommand("echo one"))[1].stdout_lines == ["one"]
    assert ops(fake_ssh) == ["run"]

    clear(fake_ssh)
    Path(str(fake_ssh) + ".stale").touch()  # its node went away under it
    conn = connector()
    conn.connect()
    ok, out = conn.run_shell_command(StringCommand("echo two"))
    assert ok and out.stdout_lines == ["two"] and out.stderr_lines == []
    assert ops(fake_ssh) == ["run", "exit", "run", "run"]


def test_a_stale_master_whose_node_is_gone_fails_the_command_by_name(fake_ssh):
    connector().connect()
    Path(str(fake_ssh) + ".stale").touch()
    Path(str(fake_ssh) + ".refuse").touch()  # and the node no longer answers
    conn = connector()
    conn.connect()
    ok, out = conn.run_shell_command(StringCommand("echo four"))
    assert not ok and "Could not connect" in out.stderr and "Connection refused" in out.stderr


def test_a_failure_after_the_first_command_is_not_retried(fake_ssh):
    conn = connector()
    conn.connect()
    assert conn.run_shell_command(StringCommand("true"))[0]
    Path(str(fake_ssh) + ".stale").touch()
    clear(fake_ssh)
    ok, out = conn.run_shell_command(StringCommand("echo three"))
    assert not ok and out.stderr_lines[0].startswith("mux_client_")
    assert ops(fake_ssh) == ["run"]


def test_a_reconnect_in_the_same_run_makes_a_new_master(fake_ssh):
    conn = connector()
    conn.connect()
    conn.disconnect()  # pyinfra's reboot: disconnect, then connect again
    clear(fake_ssh)
    conn.connect()
    assert ops(fake_ssh) == ["exit", "run"]


def test_a_host_that_cannot_be_reached_is_named_with_ssh_s_reason(fake_ssh):
    Path(str(fake_ssh) + ".refuse").touch()
    with pytest.raises(ConnectError, match="Connection refused"):
        connector().connect()


@pytest.mark.parametrize("data", [{"ssh_password": "pw"}, {"ssh_key_password": "pw"},
                                  {"ssh_paramiko_connect_kwargs": {"banner_timeout": 5}},
                                  {"ssh_control_persist": 0}])  # fmt: skip
def test_what_only_paramiko_does_keeps_pyinfras_own_connection(fake_ssh, data, monkeypatch):
    used = []
    monkeypatch.setattr("pyinfra.connectors.ssh.SSHConnector.run_shell_command",
                        lambda self, *a, **k: used.append(a) or (True, None))  # fmt: skip
    conn = connector(data)
    conn.run_shell_command(StringCommand("true"))
    assert used and calls(fake_ssh) == []


def test_installed_for_the_hosts_pyinfra_would_reach_with_ssh(monkeypatch):
    import pyinfra.api.inventory as inventory

    monkeypatch.setattr(ssh_mux, "_INSTALLED", [])
    monkeypatch.setattr(inventory, "get_execution_connectors", inventory.get_execution_connectors)
    ssh_mux.use_mux_connector()
    made = Inventory((["node1", "@local"], {}))
    assert made.get_host("node1").connector_cls is MuxSSHConnector
    assert made.get_host("@local").connector_cls.__name__ == "LocalConnector"


def test_a_live_master_runs_every_command_without_a_client(fake_ssh, fake_master, tmp_path):
    conn = connector()
    log = fake_master(conn)
    conn.connect()  # the master's socket is there: nothing is started
    ok, out = conn.run_shell_command(StringCommand("echo out; echo err >&2; cat"),
                                     _stdin="fed in")  # fmt: skip
    assert ok and out.stdout_lines == ["out", "fed in"] and out.stderr_lines == ["err"]
    ok, out = conn.run_shell_command(StringCommand("exit 3"))
    assert not ok
    assert conn.run_shell_command(StringCommand("exit 3"), _success_exit_codes=[3])[0]
    payload = bytes(range(256)) * 64
    remote = tmp_path / "remote file"
    assert conn.put_file(io.BytesIO(payload), str(remote))
    back = io.BytesIO()
    assert conn.get_file(str(remote), back) and back.getvalue() == payload
    assert calls(fake_ssh) == []  # no OpenSSH client was started
    asked = sessions(log)
    assert len(asked) == 5 and asked[0]["command"].endswith("echo out; echo err >&2; cat'")
    # No tty, X11, agent or subsystem, no escape character, no terminal type, and
    # no environment variable sent (as over pyinfra's own connection).
    assert all(s["kind"] == 0x10000002 and s["flags"] == [0, 0, 0, 0, 0xFFFFFFFF]
               and s["term"] == "" and s["environment"] == 0 for s in asked)


def test_a_session_the_master_refuses_runs_with_the_client(fake_ssh, fake_master):
    conn = connector()
    log = fake_master(conn, "refuse")
    ok, out = conn.run_shell_command(StringCommand("echo via the client"))
    assert ok and out.stdout_lines == ["via the client"]
    assert len(sessions(log)) == 1 and ops(fake_ssh) == ["run"]


def test_a_session_past_its_timeout_is_closed_and_its_command_stopped(fake_ssh, fake_master):
    conn = connector()
    fake_master(conn)
    with pytest.raises(TimeoutError):
        conn.run_shell_command(StringCommand("sleep 30"), _timeout=0.5)
    # The master went on to the next session: the sleep was stopped when ours closed.
    assert conn.run_shell_command(StringCommand("echo next"), _timeout=10)[1].stdout_lines == [
        "next"]
    assert calls(fake_ssh) == []


def test_a_command_asking_for_a_tty_runs_with_the_client(fake_ssh, fake_master):
    conn = connector()
    log = fake_master(conn)
    conn.run_shell_command(StringCommand("true"), _get_pty=True)
    assert sessions(log) == [] and calls(fake_ssh)[0]["argv"][0] == "-tt"


def test_our_ends_of_the_pipes_passed_to_the_master_close_at_once(
        fake_ssh, fake_master, monkeypatch):
    """pyinfra patches gevent into everything, and gevent's ``os.close`` defers the
    close to the next turn of its loop. Our copies of the descriptors passed to the
    master must be closed when the session opens: while our copy of the command's
    stdout stays open, a command printing nothing never reaches EOF unless something
    else wakes the loop (a first deploy hung on ``useradd`` that way)."""
    import gevent.os

    conn = connector()
    fake_master(conn)  # (its process started before: subprocess closes with os.close)
    monkeypatch.setattr(os, "close", gevent.os.close)
    made: list[int] = []
    real_pipe = os.pipe

    def pipe():
        ends = real_pipe()
        made.extend(ends)
        return ends

    monkeypatch.setattr(os, "pipe", pipe)
    session = ssh_mux._Session(conn.control_path, "sleep 1")
    r_in, w_in, r_out, w_out, r_err, w_err = made[-6:]
    for fd in (r_in, w_out, w_err):  # the master's now, not ours
        with pytest.raises(OSError):
            os.fstat(fd)
    assert (session.stdin.fileno(), session.stdout.fileno(), session.stderr.fileno()) == (
        w_in, r_out, r_err)
    session.stdin.close()
    assert session.stdout.read() == b"" and session.wait(5) == 0
    ok, out = conn.run_shell_command(StringCommand("true"), _timeout=5)
    assert ok and out.stdout_lines == [] and calls(fake_ssh) == []
