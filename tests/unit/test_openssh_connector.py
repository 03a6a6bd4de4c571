"""aicluster.connectors.openssh: pyinfra's commands run by the OpenSSH client over a
master connection per host kept open between runs.

No node and no sshd here: a STAND-IN ``ssh`` client first on PATH (``fake_ssh``) logs
its command line and environment, keeps a "master" as a file at the ControlPath the
client is given (made by the first client when there is none, as ControlMaster=auto
does), answers ``-O check``/``-O exit`` from it, and runs the remote command in a local
shell. So commands, uploads and downloads go through the connector's process handling
for real; what the real client and master do is proven by the testbed's e2e deploys
(tests/e2e/test_lab_pyinfra.py counts the masters made there).
"""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.connectors import get_all_connectors
from pyinfra.api.exceptions import ConnectError, InventoryError
from pyinfra.connectors.ssh import SSHConnector

from aicluster.connectors import openssh
from aicluster.connectors.openssh import OpenSSHConnector

FAKE_SSH = r'''#!{python}
# STAND-IN OpenSSH client (tests/unit/test_openssh_connector.py).
import json, os, subprocess, sys
state = os.environ["FAKE_SSH_STATE"]
argv = sys.argv[1:]
control = argv[argv.index("-o", argv.index("ControlMaster=auto")) + 1].split("=", 1)[1]
master = os.path.exists(control)
with open(state + ".log", "a") as log:
    log.write(json.dumps({{"argv": argv, "master": master, "locale": sorted(
        k for k in os.environ if k.startswith(("LANG", "LC_")))}}) + "\n")
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
    open(control, "w").close()  # the master, made by the first client (ControlMaster=auto)
command = argv[argv.index("--") + 2]
sys.exit(subprocess.run(["sh", "-c", command]).returncode)
'''


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """The STAND-IN client first on PATH; returns its state file's stem."""
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


def calls(stem: Path) -> list[dict]:
    log = Path(str(stem) + ".log")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def ops(stem: Path) -> list[str]:
    """What each call of the stand-in client did: ``check``, ``exit`` or ``run``."""
    return [c["argv"][1] if c["argv"][0] == "-O" else "run" for c in calls(stem)]


def clear(stem: Path) -> None:
    Path(str(stem) + ".log").unlink(missing_ok=True)


def connector(data: dict | None = None) -> OpenSSHConnector:
    host_data = {"ssh_hostname": "10.0.0.9", "ssh_user": "ops", "ssh_port": 2222,
                 "ssh_key": "/keys/id_ed25519", **(data or {})}  # fmt: skip
    inventory = Inventory(([("@openssh/node9", host_data)], {}))
    state = State(inventory, Config())
    host = inventory.get_host("node9")
    return host.connector_cls(state, host)


# --- chosen by name, through pyinfra's entry point -----------------------------------


def test_registered_as_pyinfras_openssh_connector():
    assert get_all_connectors()["openssh"] is OpenSSHConnector


def test_a_host_named_at_openssh_keeps_its_plain_name_groups_and_data():
    inventory = Inventory(
        ([("@openssh/node1", {"ssh_hostname": "10.0.0.1"}), "node2", "@local"], {}),
        slurm_workers=(["node1", "node2"], {"slurm_version": "23.11.4"}),
        cluster=(["@openssh/node1", "node2"], {}),
    )
    node1, node2 = inventory.get_host("node1"), inventory.get_host("node2")
    assert sorted(h.name for h in inventory) == ["@local", "node1", "node2"]
    assert node1.connector_cls is OpenSSHConnector
    assert sorted(node1.groups) == ["cluster", "slurm_workers"]
    assert node1.data.ssh_hostname == "10.0.0.1" and node1.data.slurm_version == "23.11.4"
    # Left out: pyinfra's own connector.
    assert node2.connector_cls is SSHConnector
    assert inventory.get_host("@local").connector_cls.__name__ == "LocalConnector"


def test_at_openssh_without_a_name_is_refused():
    with pytest.raises(InventoryError, match="@openssh/NAME"):
        Inventory((["@openssh"], {}))


# --- the client's command line -------------------------------------------------------


def test_command_line_asks_for_a_shared_master_and_the_hosts_own_settings(fake_ssh):
    argv = connector({"ssh_known_hosts_file": "/dev/null",
                      "ssh_strict_host_key_checking": "no"}).ssh_argv()  # fmt: skip
    text = " ".join(argv)
    assert argv[0] == "ssh" and argv[-2:] == ["--", "10.0.0.9"]
    for option in ("ControlMaster=auto", "ControlPersist=60", "BatchMode=yes",
                   "UserKnownHostsFile=/dev/null", "StrictHostKeyChecking=no",
                   "IdentitiesOnly=yes", "IdentityAgent=none", "ConnectTimeout=10",
                   "ServerAliveInterval=5", "ServerAliveCountMax=3"):  # fmt: skip
        assert f"-o {option}" in text
    assert f"ControlPath={fake_ssh.parent}/aicluster-ssh/" in text
    # Another way of reaching the same address gets a master of its own.
    assert connector({"ssh_user": "root"}).ssh_argv()[5] != argv[5]
    assert "-p 2222" in text and "-l ops" in text and "-i /keys/id_ed25519" in text
    assert "-A" not in argv
    assert "ControlPersist=300" in " ".join(connector({"ssh_control_persist": 300}).ssh_argv())


def test_socket_directory_is_private_and_refused_when_open_to_others(fake_ssh):
    path = Path(openssh.control_directory())
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)
    with pytest.raises(ConnectError, match="mode 0700"):
        openssh.control_directory()


# --- commands, files, masters --------------------------------------------------------


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


def test_every_command_is_a_client_on_the_one_master_connect_made(fake_ssh):
    conn = connector()
    conn.connect()
    for n in range(3):
        assert conn.run_shell_command(StringCommand(f"echo {n}"))[1].stdout_lines == [str(n)]
    made = calls(fake_ssh)
    # One client found no master and made it (connect's); the commands' found it.
    assert [c["master"] for c in made] == [False, True, True, True]
    assert made[0]["argv"][-1] == "true"
    assert len({c["argv"][c["argv"].index("ControlMaster=auto") + 2] for c in made}) == 1


def test_a_command_that_prints_nothing_ends_under_geventss_close(fake_ssh, monkeypatch):
    """pyinfra patches gevent into everything, and gevent's ``os.close`` defers the
    close to the next turn of its loop. The client's ends of its pipes must be closed
    when it starts: while our copy of its stdout stays open, a command printing nothing
    never reaches EOF unless something else wakes the loop (a first deploy hung on
    ``useradd`` that way)."""
    import gevent.os

    monkeypatch.setattr(os, "close", gevent.os.close)
    made: list[int] = []
    real_pipe = os.pipe

    def pipe():
        ends = real_pipe()
        made.extend(ends)
        return ends

    monkeypatch.setattr(os, "pipe", pipe)
    client = openssh.Client(["sh", "-c", "sleep 0.2"])
    r_in, w_in, r_out, w_out, r_err, w_err = made[-6:]
    for fd in (r_in, w_out, w_err):  # the client's now, not ours
        with pytest.raises(OSError):
            os.fstat(fd)
    assert client.communicate(timeout=10) == (0, b"", b"")
    conn = connector()
    ok, out = conn.run_shell_command(StringCommand("true"), _timeout=10)
    assert ok and out.stdout_lines == [] and out.stderr_lines == []


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
    # Both through the client, on the master connect made.
    assert ops(fake_ssh) == ["run"] * 4 and all(c["master"] for c in calls(fake_ssh)[1:])


def test_files_go_through_the_operations_sudo(fake_ssh, tmp_path):
    conn = connector()
    remote = tmp_path / "file"
    with pytest.raises(OSError):  # no sudo without a password here, or no sudo at all
        conn.put_file(io.BytesIO(b"x"), str(remote), _sudo=True, _sudo_user="ops")
    command = calls(fake_ssh)[-1]["argv"][-1]
    assert command.startswith("sudo ") and "-u ops" in command and f"cat > {remote}" in command


def test_connect_reuses_a_live_master_and_replaces_a_stale_one(fake_ssh):
    conn = connector()
    conn.connect()  # no master yet: one is made by a first client
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


def test_a_stale_master_found_by_an_upload_is_replaced_too(fake_ssh, tmp_path):
    connector().connect()
    Path(str(fake_ssh) + ".stale").touch()
    clear(fake_ssh)
    conn = connector()
    conn.connect()
    assert conn.put_file(io.BytesIO(b"data"), str(tmp_path / "up"))
    assert (tmp_path / "up").read_bytes() == b"data"
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
    # The client's own failure (255) is followed by one check that the node answers
    # (`true`); it does, so the node is not lost and the command is not run again.
    assert ops(fake_ssh) == ["run", "run"]
    assert calls(fake_ssh)[-1]["argv"][-1] == "true" and conn.lost is None


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
    monkeypatch.setattr(SSHConnector, "run_shell_command",
                        lambda self, *a, **k: used.append(a) or (True, None))  # fmt: skip
    monkeypatch.setattr(SSHConnector, "put_file", lambda self, *a, **k: used.append(a) or True)
    conn = connector(data)
    conn.run_shell_command(StringCommand("true"))
    conn.put_file(io.BytesIO(b"x"), "/tmp/x")
    assert len(used) == 2 and calls(fake_ssh) == []


@pytest.mark.parametrize("prefix", ["@openssh/", ""])
def test_an_inventory_names_its_hosts_the_same_with_or_without_the_connector(spec, prefix):
    from aicluster.inventory import ansible_inventory, load_cluster, load_hosts

    spec.connector = prefix
    spec.groups["slurm_workers"] = ["n1", "n2"]
    spec.groups["slurm_controller"] = ["n1"]
    path = spec.write()
    assert (f"('{prefix}n1', " in path.read_text()) and sorted(load_hosts(path)) == ["n1", "n2"]
    assert load_cluster(path).group("slurm_workers") == ("n1", "n2")
    assert ansible_inventory(path)["slurm_workers"]["hosts"] == ["n1", "n2"]


# --- a node lost mid-run -------------------------------------------------------------


def _cut(stem: Path) -> None:
    """The node stops answering: the master's next session fails (as when its keep-
    alives give up), and every new connection is refused."""
    Path(str(stem) + ".stale").touch()
    Path(str(stem) + ".refuse").touch()


def test_a_node_lost_mid_run_is_named_once_and_not_contacted_again(fake_ssh, caplog):
    conn = connector()
    conn.connect()
    assert conn.run_shell_command(StringCommand("true"))[0]
    _cut(fake_ssh)
    clear(fake_ssh)
    ok, out = conn.run_shell_command(StringCommand("echo five"))
    assert not ok and out.stderr.startswith("mux_client_")  # the client's own word
    # One bounded check: `true` over the master, then the master closed and one new
    # connection tried; refused, so the node is out of this run.
    assert ops(fake_ssh) == ["run", "run", "exit", "run"]
    assert "Connection refused" in conn.lost
    lost = [r.getMessage() for r in caplog.records if "LOST" in r.getMessage()]
    assert len(lost) == 1 and lost[0].startswith("aicluster: node9 LOST: ")
    assert "Connection refused" in lost[0] and "out of this run" in lost[0]
    # Every later command, upload and download fails at once, starting no client: a
    # command with no output (pyinfra's error for it is then one line), a transfer with
    # an OSError.
    clear(fake_ssh)
    ok, out = conn.run_shell_command(StringCommand("echo six"))
    assert not ok and list(out) == []
    for attempt in (
        lambda: conn.put_file(io.BytesIO(b"x"), "/tmp/x"),
        lambda: conn.get_file("/tmp/x", io.BytesIO()),
    ):
        with pytest.raises(OSError, match="node9: lost earlier in this run"):
            attempt()
    assert ops(fake_ssh) == []
    assert len([r for r in caplog.records if "LOST" in r.getMessage()]) == 1


def test_a_remote_command_exiting_255_on_a_node_that_answers_is_not_a_lost_node(fake_ssh):
    conn = connector()
    conn.connect()
    ok, out = conn.run_shell_command(StringCommand("echo out; exit 255"))
    assert not ok and out.stdout_lines == ["out"] and conn.lost is None
    assert conn.run_shell_command(StringCommand("echo seven"))[1].stdout_lines == ["seven"]


def test_an_upload_that_finds_the_node_lost_fails_as_an_oserror(fake_ssh):
    conn = connector()
    conn.connect()
    _cut(fake_ssh)
    with pytest.raises(OSError, match="lost"):
        conn.put_file(io.BytesIO(b"x"), "/tmp/never")
    assert conn.lost is not None


def _planning(conn: OpenSSHConnector):
    """pyinfra planning this host's own deploy (deploy.py runs for it)."""
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_host

    conn.state.current_stage = StateStage.Prepare
    return ctx_host.use(conn.host)


def test_while_its_deploy_is_planned_a_lost_node_raises_host_lost(fake_ssh, caplog):
    conn = connector()
    conn.connect()
    conn.state.ops[conn.host] = {"a": None, "b": None}  # two operations planned so far
    _cut(fake_ssh)
    with _planning(conn), pytest.raises(openssh.HostLost) as raised:
        conn.run_shell_command(StringCommand("echo eight"))
    assert raised.value.host is conn.host and "Connection refused" in raised.value.reason
    (line,) = [r.getMessage() for r in caplog.records if "LOST" in r.getMessage()]
    assert "while being planned, the 2 operation(s) planned so far" in line
    with _planning(conn), pytest.raises(openssh.HostLost):  # and at once, after
        conn.run_shell_command(StringCommand("echo nine"))
    # Another host's deploy reading this host's facts gets pyinfra's own error (its
    # "could not load fact"), not an exception that would stop that other deploy.
    ok, _ = conn.run_shell_command(StringCommand("echo ten"))  # (no host of its own here)
    assert not ok


def test_while_operations_run_the_line_counts_the_operations_skipped(fake_ssh, caplog):
    from pyinfra.api.state import StateStage

    conn = connector()
    conn.connect()
    state, host = conn.state, conn.host
    state.current_stage = StateStage.Execute
    order = ["op1", "op2", "op3", "op4"]
    state.get_op_order = lambda: order
    state.ops[host] = {"op1": None, "op2": None, "op4": None}  # op3 is not this host's
    host.executing_op_hash = "op2"
    _cut(fake_ssh)
    ok, _ = conn.run_shell_command(StringCommand("echo eleven"))
    assert not ok
    (line,) = [r.getMessage() for r in caplog.records if "LOST" in r.getMessage()]
    assert "its current operation failed and its 1 remaining operation(s) are skipped" in line
