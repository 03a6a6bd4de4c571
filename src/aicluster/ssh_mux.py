"""pyinfra's SSH connection, kept open between runs (OpenSSH connection sharing).

pyinfra's own ``ssh`` connector (paramiko) makes a new SSH connection to every host on
every run: key exchange, host key, authentication, PAM session. On a re-run that
changes nothing this handshake is most of what a node does (``docs/rerunning.md``).
:class:`MuxSSHConnector` runs each command with the OpenSSH client instead, through a
master connection per host that stays open ``ssh_control_persist`` seconds after its
last use (``ControlMaster=auto``, ``ControlPersist``): a run started while it is open
opens a channel on it and skips the handshake. This is what Ansible does by default,
and what ``ansible.cfg`` here asks for (``ControlPersist=60s``), so both engines
connect the same way.

The control sockets live in a directory of this user's own, mode 0700
(``$XDG_RUNTIME_DIR/aicluster-ssh`` or ``/tmp/aicluster-ssh-UID``), one per host
address, port, user and connection options. Nothing is sent that pyinfra's connector
would not send: the OpenSSH client is started without ``LANG``/``LC_*`` in its
environment, so the nodes' commands run in their own locale, as they do over paramiko.

Where a master's socket is there, each command is a session the master opens when
asked on that socket (:class:`_Session`: OpenSSH's multiplexing protocol, the command's
stdin, stdout and stderr passed to the master as descriptors): no process is started
for it. Otherwise (no master yet, a tty wanted, or a master that refuses) the OpenSSH
client runs it, started with ``posix_spawn`` (a fork of this large Python process would
cost more than the client itself). Both are waited for through gevent, so hosts still
run side by side. A master whose node went away (its first command fails in the
multiplexer) is closed and that command run again over a new connection.

A host falls back to pyinfra's connector, unchanged, when its data asks for something
only paramiko does: ``ssh_password``, ``ssh_key_password``,
``ssh_paramiko_connect_kwargs``, or ``ssh_control_persist: 0``.

Installed by the inventory file (:func:`aicluster.inventory.finish`, through
:func:`use_mux_connector`) before pyinfra makes its hosts, for every host pyinfra would
reach with its ``ssh`` connector.
"""

from __future__ import annotations

import array
import hashlib
import os
import posix
import shlex
import signal
import socket
import stat
import struct
from collections.abc import Mapping
from typing import IO, Any

from pyinfra import logger
from pyinfra.api.exceptions import ConnectError
from pyinfra.api.util import get_file_io
from pyinfra.connectors.base import DataMeta
from pyinfra.connectors.ssh import ConnectorData, SSHConnector, connector_data_meta
from pyinfra.connectors.ssh_util import raise_connect_error
from pyinfra.connectors.util import (
    CommandOutput,
    OutputLine,
    execute_command_with_sudo_retry,
    make_unix_command_for_host,
    read_output_buffers,
    write_stdin,
)

#: Seconds a master connection stays open after its last use (as ansible.cfg's).
DEFAULT_PERSIST = 60
#: The OpenSSH client's exit status for its own errors (not the remote command's).
SSH_ERROR = 255
#: Environment variables never passed to the OpenSSH client (Debian's ssh_config sends
#: LANG and LC_* to the node, which would change the locale nodes' commands print in).
_LOCALE_VARIABLES = ("LANG", "LANGUAGE", "LC_")


class MuxConnectorData(ConnectorData):
    ssh_control_persist: int


mux_connector_data_meta: dict[str, DataMeta] = {
    **connector_data_meta,
    "ssh_control_persist": DataMeta(
        "Seconds an OpenSSH master connection stays open after its last use; "
        "0: pyinfra's own (paramiko) connection per run",
        DEFAULT_PERSIST,
    ),
}


def control_directory() -> str:
    """This user's directory for control sockets, made mode 0700 if missing; refused
    when it is a link, someone else's, or open to others (a socket there lets anyone
    who can reach it run commands as us on the nodes)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    uid = os.getuid()
    if runtime and os.path.isdir(runtime):
        path = os.path.join(runtime, "aicluster-ssh")
    else:
        path = f"/tmp/aicluster-ssh-{uid}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
        raise ConnectError(
            f"{path}: not a directory of this user's with mode 0700; "
            "it holds the SSH control sockets: remove it"
        )
    return path


def _client_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_LOCALE_VARIABLES)}


def _spawn(argv: list[str], stdin: int, stdout: int, stderr: int):
    """Start ``argv`` with these descriptors as its 0, 1 and 2 (``posix_spawn``); its
    pid, and a gevent AsyncResult set to its wait status when it exits."""
    from gevent import get_hub
    from gevent.event import AsyncResult

    hub = get_hub()
    hub.loop.install_sigchld()  # libev reaps children and feeds child watchers
    pid = os.posix_spawnp(argv[0], argv, _client_environment(), file_actions=[
        (os.POSIX_SPAWN_DUP2, stdin, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
    ])  # fmt: skip
    # Watched before anything yields to the loop, so its exit status is caught.
    status = AsyncResult()
    watcher = hub.loop.child(pid, False)

    def exited() -> None:
        status.set(watcher.rstatus)
        watcher.close()

    watcher.start(exited)
    return pid, status


def _close_now(fd: int) -> None:
    """Close a descriptor of ours that no gevent watcher uses, now. gevent's patched
    ``os.close`` (pyinfra patches everything) defers the close to the next turn of its
    loop: a pipe end the remote command's output goes through stayed open while the
    loop waited for that very output, and the run hung until something else woke it."""
    posix.close(fd)


def _pipes() -> tuple[list[int], list[int]]:
    """Three pipes for a command: the ends it uses (its stdin, stdout and stderr), and
    ours (to write its stdin, to read its stdout and stderr)."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    return [r_in, w_out, w_err], [w_in, r_out, r_err]


class _Process:
    """What a command run on a host gives back: its ``stdin`` (to write), ``stdout`` and
    ``stderr`` (to read, gevent file objects), ``wait()`` and ``kill()``."""

    stdin: Any
    stdout: Any
    stderr: Any

    def _keep(self, theirs: list[int], ours: list[int]) -> None:
        """Close the command's ends of its pipes (whoever runs it holds them now) and
        keep ours as gevent file objects."""
        from gevent.fileobject import FileObjectPosix

        for fd in theirs:
            _close_now(fd)
        self.stdin = FileObjectPosix(ours[0], "wb")
        self.stdout = FileObjectPosix(ours[1], "rb")
        self.stderr = FileObjectPosix(ours[2], "rb")

    def _close_pipes(self) -> None:
        for pipe in (self.stdin, self.stdout, self.stderr):
            pipe.close()

    def wait(self, timeout: float | None = None) -> int:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def communicate(
        self, stdin: bytes = b"", timeout: float | None = None
    ) -> tuple[int, bytes, bytes]:
        """Feed ``stdin``, read both outputs to their end, wait: (status, out, err)."""
        import gevent

        def feed() -> None:
            try:
                if stdin:
                    self.stdin.write(stdin)
            except BrokenPipeError:
                pass
            finally:
                self.stdin.close()

        feeder = gevent.spawn(feed)
        errors = gevent.spawn(self.stderr.read)
        with gevent.Timeout(timeout, TimeoutError):
            try:
                out = self.stdout.read()
                err = errors.get()
                feeder.join()
            except TimeoutError:
                errors.kill()
                feeder.kill()
                self.kill()
                raise
        return self.wait(), out, err


class _Client(_Process):
    """One OpenSSH client process: started with ``posix_spawn``, its pipes read and
    its exit waited for cooperatively (gevent), so other hosts run meanwhile."""

    def __init__(self, argv: list[str]) -> None:
        theirs, ours = _pipes()
        try:
            self.pid, self._status = _spawn(argv, *theirs)
        except OSError:
            for fd in theirs + ours:
                _close_now(fd)
            raise
        self._keep(theirs, ours)

    def wait(self, timeout: float | None = None) -> int:
        """The client's exit status; on ``timeout`` it is killed and TimeoutError raised."""
        from gevent import Timeout

        try:
            status = self._status.get(timeout=timeout)
        except Timeout:
            self.kill()
            raise TimeoutError() from None
        self._close_pipes()
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        """Stop the client (SIGKILL to its own pid), wait for it, close its pipes."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._status.get()
        self._close_pipes()

# OpenSSH's multiplexing protocol (PROTOCOL.mux in OpenSSH's sources): messages are a
# uint32 length, then a uint32 type and its fields (uint32s, and strings as a uint32
# length and the bytes).
_MUX_HELLO = 0x00000001
_MUX_VERSION = 4
_MUX_C_NEW_SESSION = 0x10000002
_MUX_S_PERMISSION_DENIED = 0x80000002
_MUX_S_FAILURE = 0x80000003
_MUX_S_EXIT_MESSAGE = 0x80000004
_MUX_S_SESSION_OPENED = 0x80000006
_MUX_NO_ESCAPE_CHAR = 0xFFFFFFFF


class MasterUnavailable(Exception):
    """The master did not open a session (not there, another protocol, refused):
    nothing ran on the host."""


def _mux_string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


class _Session(_Process):
    """One command run by asking this host's master for a session over its control
    socket, as the OpenSSH client does with ``ControlMaster=auto`` when a master is
    there: no client process is started. The master reads and writes the command's
    stdin, stdout and stderr through pipes of ours, passed to it on the socket; it
    says the command's exit status there, then closes it. No environment variable is
    sent, as over pyinfra's own connection. Raises :class:`MasterUnavailable` when no
    session was opened."""

    def __init__(self, control_path: str, command: str, forward_agent: bool = False) -> None:
        from gevent import socket as gsocket

        self._sock = gsocket.socket(gsocket.AF_UNIX, gsocket.SOCK_STREAM)
        self._buffer = b""
        fds: list[int] = []
        try:
            self._sock.connect(control_path)
            self._send(struct.pack(">II", _MUX_HELLO, _MUX_VERSION))
            kind, body = self._receive()
            if kind != _MUX_HELLO or body[:4] != struct.pack(">I", _MUX_VERSION):
                raise MasterUnavailable(f"the master speaks another protocol ({kind:#x})")
            self._send(
                struct.pack(">II", _MUX_C_NEW_SESSION, 1)
                + _mux_string(b"")  # reserved
                # no tty, no X11, the agent as the master was asked, no subsystem
                + struct.pack(">IIIII", 0, 0, int(forward_agent), 0, _MUX_NO_ESCAPE_CHAR)
                + _mux_string(b"")  # terminal type
                + _mux_string(command.encode())
            )
            theirs, ours = _pipes()
            fds = theirs + ours
            for fd in theirs:  # the command's stdin, stdout, stderr
                self._sock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                              array.array("i", [fd]))])
            kind, body = self._receive()
            if kind != _MUX_S_SESSION_OPENED:
                reason = body[8:].decode(errors="replace") if kind in (
                    _MUX_S_FAILURE, _MUX_S_PERMISSION_DENIED) else f"reply {kind:#x}"
                raise MasterUnavailable(f"the master opened no session: {reason}")
        except (OSError, EOFError, struct.error) as exc:
            self._close(fds)
            raise MasterUnavailable(str(exc)) from None
        except MasterUnavailable:
            self._close(fds)
            raise
        self._keep(theirs, ours)  # the master holds its own copies of theirs now
        self._status: int | None = None

    def _close(self, fds: list[int]) -> None:
        self._sock.close()
        for fd in fds:
            _close_now(fd)

    def _send(self, message: bytes) -> None:
        self._sock.sendall(_mux_string(message))

    def _receive(self) -> tuple[int, bytes]:
        """The master's next message (its type, the rest); EOFError when it closed."""
        while True:
            if len(self._buffer) >= 4:
                size = struct.unpack(">I", self._buffer[:4])[0]
                if len(self._buffer) >= 4 + size:
                    message = self._buffer[4:4 + size]
                    self._buffer = self._buffer[4 + size:]
                    return struct.unpack(">I", message[:4])[0], message[4:]
            chunk = self._sock.recv(65536)
            if not chunk:
                raise EOFError("the master closed the control socket")
            self._buffer += chunk

    def wait(self, timeout: float | None = None) -> int:
        """The command's exit status, once the master has closed the session (255, as
        the OpenSSH client's, when it closed without one); on ``timeout`` the session
        is closed and TimeoutError raised."""
        from gevent import Timeout

        if self._status is None:
            status = SSH_ERROR
            try:
                with Timeout(timeout):
                    while True:
                        try:
                            kind, body = self._receive()
                        except (OSError, EOFError):
                            break
                        if kind == _MUX_S_EXIT_MESSAGE and len(body) >= 8:
                            status = struct.unpack(">II", body[:8])[1]
            except Timeout:
                self.kill()
                raise TimeoutError() from None
            self._status = status
            self.kill()
        return self._status

    def kill(self) -> None:
        """Close the control socket (the master ends the session) and the pipes."""
        self._sock.close()
        self._close_pipes()


def needs_paramiko(data: Mapping[str, Any]) -> bool:
    """Whether a host with this connector data needs pyinfra's own connection."""
    return bool(
        data["ssh_password"]
        or data["ssh_key_password"]
        or data["ssh_paramiko_connect_kwargs"]
        or not data["ssh_control_persist"]
    )


def client_argv(
    data: Mapping[str, Any], name: str, connect_timeout: int = 10
) -> tuple[list[str], str]:
    """The OpenSSH client's command line to the host with this connector data (every
    key of :data:`mux_connector_data_meta`) up to the remote command, and its master's
    control socket."""
    options = [
        "-o", "BatchMode=yes",
        # Not "Permanently added ... to the list of known hosts" in a command's output.
        "-o", "LogLevel=ERROR",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4",
    ]  # fmt: skip
    if data["ssh_config_file"]:
        options += ["-F", os.path.expanduser(data["ssh_config_file"])]
    if data["ssh_known_hosts_file"]:
        options += ["-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}"]
    if data["ssh_strict_host_key_checking"]:
        options += ["-o", f"StrictHostKeyChecking={data['ssh_strict_host_key_checking']}"]
    if data["ssh_port"]:
        options += ["-p", str(int(data["ssh_port"]))]
    if data["ssh_user"]:
        options += ["-l", data["ssh_user"]]
    if data["ssh_key"]:
        # As pyinfra's connector: the key named, no agent, no other keys.
        options += ["-i", os.path.expanduser(data["ssh_key"]), "-o", "IdentitiesOnly=yes",
                    "-o", "IdentityAgent=none"]  # fmt: skip
    elif not data["ssh_allow_agent"]:
        options += ["-o", "IdentityAgent=none"]
    if data["ssh_forward_agent"]:
        options.append("-A")
    destination = ["--", data["ssh_hostname"] or name]
    # One master per address and way of connecting: a host reached with other options
    # (another key, user or port) gets a master of its own.
    digest = hashlib.sha256("\0".join(options + destination).encode()).hexdigest()[:24]
    control_path = os.path.join(control_directory(), digest)
    argv = [
        "ssh",
        "-T",
        "-o", "ControlMaster=auto",
        "-o", f"ControlPath={control_path}",
        "-o", f"ControlPersist={int(data['ssh_control_persist'])}",
        "-o", f"ConnectTimeout={int(connect_timeout)}",
        *options,
        *destination,
    ]  # fmt: skip
    return argv, control_path


class MuxSSHConnector(SSHConnector):
    """pyinfra's ``ssh`` connector, with each command run by the OpenSSH client over a
    master connection kept open between runs (module docstring)."""

    data_cls = MuxConnectorData
    data_meta = mux_connector_data_meta

    #: Set when this host was disconnected in this process (pyinfra's reboot): the
    #: next connect makes a new master instead of trusting the old one.
    _disconnected = False
    #: Set while the master was found, not made, by this process and no command has
    #: gone through it yet: a multiplexer failure then means the master is stale.
    _unproven = False

    def _paramiko(self) -> bool:
        """Whether this host needs pyinfra's own connection (module docstring)."""
        return needs_paramiko(self.data)

    _argv: list[str] | None = None
    control_path: str = ""

    def ssh_argv(self) -> list[str]:
        """The OpenSSH client's command line up to the remote command (a new list)."""
        if self._argv is None:
            self._argv, self.control_path = client_argv(
                self.data, self.host.name, self.state.config.CONNECT_TIMEOUT
            )
        return list(self._argv)

    def _control(self, operation: str) -> int:
        """``ssh -O operation``: ask this host's master (check, exit); its exit status."""
        argv = self.ssh_argv()
        argv[1:1] = ["-O", operation]
        return _Client(argv).communicate()[0]

    def _start(self, command: str, get_pty: bool = False) -> _Process:
        """Start ``command`` on the host (its login shell runs it, as over paramiko):
        in a session the master opens when it is there and no tty is asked for, else
        with the OpenSSH client (which makes the master, or finds it stale)."""
        if not get_pty and os.path.exists(self.control_path):
            try:
                return _Session(self.control_path, command,
                                forward_agent=bool(self.data["ssh_forward_agent"]))
            except MasterUnavailable as exc:
                logger.debug("%s: no session from the SSH master (%s); starting the "
                             "OpenSSH client", self.host.name, exc)  # fmt: skip
        argv = self.ssh_argv()
        if get_pty:
            argv[1] = "-tt"
        return _Client(argv + [command])

    def _run(self, command: str, stdin: bytes = b"",
             timeout: float | None = None) -> tuple[int, bytes, bytes]:  # fmt: skip
        """Run ``command`` on the host: (exit status, stdout, stderr)."""
        return self._start(command).communicate(stdin, timeout)

    def _new_master(self) -> None:
        """Make this host's master (the first session makes it); errors name the host."""
        try:
            # Always the OpenSSH client: the first session makes the master.
            code, _, err = _Client(self.ssh_argv() + ["true"]).communicate(
                timeout=self.state.config.CONNECT_TIMEOUT + 5)
        except OSError as exc:  # no OpenSSH client on this machine
            raise_connect_error(self.host, "Could not start the OpenSSH client", exc)
        except TimeoutError:
            self._control("exit")
            raise_connect_error(self.host, "Could not connect", "timed out")
        if code != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise_connect_error(
                self.host, "Could not connect", lines[-1] if lines else f"ssh exit {code}"
            )

    def connect(self) -> None:
        if self._paramiko():
            return super().connect()
        self.ssh_argv()  # the control path, and the directory checked
        if self._disconnected:
            # Reconnecting in this run (after a reboot): the old master's connection
            # is gone or going; a new one is made.
            self._control("exit")
            self._disconnected = False
        elif os.path.exists(self.control_path):
            # An earlier run's master: its first command proves it (run_shell_command).
            self._unproven = True
            return None
        self._new_master()
        return None

    def disconnect(self) -> None:
        # The master stays open for the next run (ControlPersist); only a reconnect in
        # this run replaces it.
        if self._paramiko():
            return super().disconnect()
        self._disconnected = True
        return None

    def run_shell_command(
        self, command, print_output: bool = False, print_input: bool = False, **arguments
    ) -> tuple[bool, CommandOutput]:
        if self._paramiko():
            return super().run_shell_command(command, print_output=print_output,
                                             print_input=print_input, **arguments)  # fmt: skip
        from pyinfra.api.output import echo

        get_pty = arguments.pop("_get_pty", False)
        timeout = arguments.pop("_timeout", None)
        stdin = arguments.pop("_stdin", None)
        success_exit_codes = arguments.pop("_success_exit_codes", None)

        def execute_command() -> tuple[int, CommandOutput]:
            unix_command = make_unix_command_for_host(self.state, self.host, command, **arguments)
            logger.debug("Running command on %s: (pty=%s) %s", self.host.name, get_pty,
                         unix_command)  # fmt: skip
            if print_input:
                echo(f"{self.host.print_prefix}>>> {unix_command}", err=True)
            client = self._start(unix_command.get_raw_value(), get_pty)
            if stdin:
                write_stdin(stdin, client.stdin)
            client.stdin.close()
            try:
                output = read_output_buffers(client.stdout, client.stderr, timeout=timeout,
                                             print_output=print_output,
                                             print_prefix=self.host.print_prefix)  # fmt: skip
            except TimeoutError:
                client.kill()
                raise
            return client.wait(), output

        code, output = execute_command_with_sudo_retry(self.host, arguments, execute_command)
        if self._unproven:
            self._unproven = False
            if code == SSH_ERROR and _stale_master(output):
                # The master from an earlier run lost its node (rebooted, readdressed):
                # the command never reached it. Close that master and run it again.
                logger.debug("%s: the SSH master was stale; connecting again", self.host.name)
                self._control("exit")
                try:
                    self._new_master()
                except ConnectError as exc:  # the node is gone: this command failed
                    output.combined_lines.append(OutputLine("stderr", str(exc)))
                else:
                    code, output = execute_command_with_sudo_retry(
                        self.host, arguments, execute_command
                    )
        ok = code in success_exit_codes if success_exit_codes else code == 0
        return ok, output

    def _put_file(self, filename_or_io, remote_location) -> None:
        if self._paramiko():
            return super()._put_file(filename_or_io, remote_location)
        with get_file_io(filename_or_io) as file_io:
            data = file_io.read()
        if isinstance(data, str):
            data = data.encode()
        code, _, err = self._run(f"cat > {shlex.quote(remote_location)}", stdin=data)
        if code != 0:
            raise OSError(f"upload to {remote_location}: {err.decode(errors='replace').strip()}")
        return None

    def _get_file(self, remote_filename: str, filename_or_io: str | IO[Any]) -> None:
        if self._paramiko():
            return super()._get_file(remote_filename, filename_or_io)
        code, out, err = self._run(f"cat {shlex.quote(remote_filename)}")
        if code != 0:
            raise OSError(f"download of {remote_filename}: "
                          f"{err.decode(errors='replace').strip()}")  # fmt: skip
        with get_file_io(filename_or_io, "wb") as file_io:
            file_io.write(out)
        return None


def _stale_master(output: CommandOutput) -> bool:
    """Whether a command's output is the OpenSSH client's word that the master it
    found could not open a session (nothing ran on the node)."""
    return not output.stdout_lines and any(
        line.startswith(("mux_client_", "Control socket connect")) for line in output.stderr_lines
    )


_INSTALLED: list[bool] = []


def use_mux_connector() -> None:
    """Make pyinfra reach every host it would reach with its ``ssh`` connector with
    :class:`MuxSSHConnector` (idempotent). Called before pyinfra makes its hosts."""
    if _INSTALLED:
        return
    import pyinfra.api.inventory as inventory

    real = inventory.get_execution_connectors

    def get_execution_connectors():
        connectors = dict(real())
        connectors["ssh"] = MuxSSHConnector
        return connectors

    inventory.get_execution_connectors = get_execution_connectors
    _INSTALLED.append(True)
