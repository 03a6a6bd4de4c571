"""pyinfra's ``openssh`` connector: every command run by the OpenSSH client, over a
master connection per host kept open between runs (OpenSSH connection sharing).

A host is given to it by its name in the inventory: ``@openssh/gpu1`` is the host
``gpu1`` (its name everywhere: groups, Slurm, Ansible) reached this way; a host named
plainly ``gpu1`` gets pyinfra's own ``ssh`` connector (paramiko). The connector is
registered under pyinfra's ``pyinfra.connectors`` entry point (pyproject.toml), as
pyinfra registers its own.

pyinfra's own connector makes a new SSH connection to every host on every run: key
exchange, host key, authentication, PAM session. On a re-run that changes nothing this
handshake is most of what a node does (``docs/rerunning.md``). Here each command,
upload and download is one run of the OpenSSH client (``ssh``) with
``ControlMaster=auto``, ``ControlPath`` and ``ControlPersist=ssh_control_persist``:
the first client to a host makes its master, which stays open that many seconds after
its last use, and every later client, in this run or the next, opens a session on it
and skips the handshake. This is what Ansible does (``ansible.cfg`` here asks for
``ControlPersist=60s``), so both engines connect the same way.

The control sockets live in a directory of this user's own, mode 0700
(``$XDG_RUNTIME_DIR/aicluster-ssh`` or ``/tmp/aicluster-ssh-UID``), one per host
address, port, user and connection options. Nothing is sent that pyinfra's connector
would not send: the client is started without ``LANG``/``LC_*`` in its environment,
so the nodes' commands run in their own locale, as they do over paramiko. The client
is started with ``posix_spawn`` (a fork of this large Python process would cost more
than the client itself) and waited for through gevent, so hosts still run side by
side. A master found from an earlier run whose node went away (its first command
fails in the client's multiplexer) is closed and that command run again over a new
connection. Every wait is bounded: ``ConnectTimeout``, server keep-alives, and the
command's own ``_timeout``.

A node lost mid-run (its link cut, powered off) is let go at once. A command the client
fails with its own exit status (255) is followed by one bounded check: a ``true`` over
the master (a few seconds), then, if that fails, over a new connection
(``ConnectTimeout``). A node that answers is not lost: the command's failure is the
operation's, as always. A node that does not is out of this run: one line names it,
says why and how many of its operations are skipped (:func:`lost_line`); every later
command for it fails at once without starting a client. While its deploy is being
planned that failure is :class:`HostLost`, which ``deploy.py`` catches to stop planning
for it (and fail it, so pyinfra runs nothing on it and exits non-zero); while
operations run a command fails with no output and an upload or download with an
``OSError``: pyinfra fails the operation under way (one error line for each of its
fact reads) and drops the host from the rest of the run. The master's keep-alives
(``ServerAliveInterval``/``ServerAliveCountMax``) bound how long a command waits on a
node that stopped answering.

A host falls back to pyinfra's ``ssh`` connector, unchanged, when its data asks for
something only paramiko does: ``ssh_password``, ``ssh_key_password``,
``ssh_paramiko_connect_kwargs``, or ``ssh_control_persist: 0``.
"""

from __future__ import annotations

import hashlib
import os
import posix
import signal
import stat
from collections.abc import Mapping
from typing import Any

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import ConnectError, InventoryError
from pyinfra.api.output import echo
from pyinfra.api.state import StateStage
from pyinfra.api.util import get_file_io
from pyinfra.connectors.base import BaseConnector, DataMeta
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
from pyinfra.context import ctx_host

#: Seconds a master connection stays open after its last use (as ansible.cfg's).
DEFAULT_PERSIST = 60
#: The OpenSSH client's exit status for its own errors (not the remote command's).
SSH_ERROR = 255
#: Seconds between the master's keep-alives, and how many may go unanswered before it
#: gives the node up (and every command through it fails): about 15 s for a node that
#: stopped answering, whatever its commands are doing (``ansible.cfg`` asks the same).
SERVER_ALIVE_INTERVAL = 5
SERVER_ALIVE_COUNT_MAX = 3
#: Seconds a check over the master may take before a new connection is tried.
PROBE_TIMEOUT = 5
#: Environment variables never passed to the OpenSSH client (Debian's ssh_config sends
#: LANG and LC_* to the node, which would change the locale nodes' commands print in).
_LOCALE_VARIABLES = ("LANG", "LANGUAGE", "LC_")
#: Arguments of pyinfra's that are the connector's to handle, not the remote shell's.
_OWN_ARGUMENTS = ("_get_pty", "_timeout", "_stdin", "_success_exit_codes")


class OpenSSHConnectorData(ConnectorData):
    ssh_control_persist: int


openssh_data_meta: dict[str, DataMeta] = {
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
    key of :data:`openssh_data_meta`) up to the remote command, and its master's
    control socket."""
    options = [
        "-o", "BatchMode=yes",
        # Not "Permanently added ... to the list of known hosts" in a command's output.
        "-o", "LogLevel=ERROR",
        "-o", f"ServerAliveInterval={SERVER_ALIVE_INTERVAL}",
        "-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT_MAX}",
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


# --- one OpenSSH client process, waited for through gevent ---------------------------


def _close_now(fd: int) -> None:
    """Close a descriptor of ours that no gevent watcher uses, now. gevent's patched
    ``os.close`` (pyinfra patches everything) defers the close to the next turn of its
    loop: a pipe end the remote command's output goes through stayed open while the
    loop waited for that very output, and a command printing nothing hung until
    something else woke the loop."""
    posix.close(fd)


class Client:
    """One run of the OpenSSH client: started with ``posix_spawn`` without our locale
    variables, its ``stdin`` (to write), ``stdout`` and ``stderr`` (to read) gevent file
    objects, its exit waited for cooperatively, so other hosts run meanwhile."""

    def __init__(self, argv: list[str]) -> None:
        from gevent import get_hub
        from gevent.event import AsyncResult
        from gevent.fileobject import FileObjectPosix

        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        hub = get_hub()
        hub.loop.install_sigchld()  # libev reaps children and feeds child watchers
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith(_LOCALE_VARIABLES)}  # fmt: skip
        try:
            self.pid = os.posix_spawnp(argv[0], argv, environment, file_actions=[
                (os.POSIX_SPAWN_DUP2, r_in, 0),
                (os.POSIX_SPAWN_DUP2, w_out, 1),
                (os.POSIX_SPAWN_DUP2, w_err, 2),
            ])  # fmt: skip
        except OSError:
            for fd in (r_in, w_in, r_out, w_out, r_err, w_err):
                _close_now(fd)
            raise
        # Watched before anything yields to the loop, so its exit status is caught.
        self._status = AsyncResult()
        watcher = hub.loop.child(self.pid, False)

        def exited() -> None:
            self._status.set(watcher.rstatus)
            watcher.close()

        watcher.start(exited)
        # The client's ends are its own now: closed at once (see _close_now).
        for fd in (r_in, w_out, w_err):
            _close_now(fd)
        self.stdin = FileObjectPosix(w_in, "wb")
        self.stdout = FileObjectPosix(r_out, "rb")
        self.stderr = FileObjectPosix(r_err, "rb")

    def _close_pipes(self) -> None:
        for pipe in (self.stdin, self.stdout, self.stderr):
            pipe.close()

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
        try:
            with gevent.Timeout(timeout, TimeoutError):
                out = self.stdout.read()
                err = errors.get()
                feeder.join()
                return self.wait(), out, err
        except TimeoutError:
            errors.kill()
            feeder.kill()
            self.kill()
            raise


def _stale_master(stdout_empty: bool, stderr_lines: list[str]) -> bool:
    """Whether a client's output is its word that the master it found could not open a
    session (nothing ran on the node)."""
    return stdout_empty and any(
        line.startswith(("mux_client_", "Control socket connect")) for line in stderr_lines
    )


def _reason(exc: ConnectError) -> str:
    """What a connection error says, without pyinfra's host prefix."""
    return str(exc).strip()


class HostLost(ConnectError):
    """A host lost its connection during this run (and a new one failed): raised by its
    connector, while its deploy is planned, for every command of its own deploy, so
    ``deploy.py`` stops planning for it. ``host`` is the pyinfra host."""

    def __init__(self, host: Any, reason: str) -> None:
        super().__init__(f"{host.name}: lost its connection ({reason})")
        self.host = host
        self.reason = reason


def lost_line(name: str, reason: str, skipped: str) -> str:
    """The one line that says a node is out of this run: which, why, what is skipped."""
    return (f"aicluster: {name} LOST: {reason}; {name} is out of this run: {skipped}; "
            "the other nodes go on and the run will exit non-zero. Re-run the deploy "
            "once it answers again (docs/rerunning.md)")


class OpenSSHConnector(BaseConnector):
    """Run commands with the OpenSSH client over a master connection kept open between
    runs (module docstring); pyinfra's ``ssh`` connector where paramiko is needed."""

    handles_execution = True
    data_cls = OpenSSHConnectorData
    data_meta = openssh_data_meta

    @staticmethod
    def make_names_data(name=None):
        """``@openssh/NAME``: the host NAME, reached with this connector."""
        if not name:
            raise InventoryError("@openssh needs the host's name: @openssh/NAME")
        yield name, {}, []

    def __init__(self, state, host) -> None:
        super().__init__(state, host)
        #: pyinfra's own connector, for a host that needs paramiko (module docstring).
        self.paramiko: SSHConnector | None = (
            SSHConnector(state, host) if needs_paramiko(self.data) else None
        )
        self._argv: list[str] | None = None
        self.control_path = ""
        #: Set when this host was disconnected in this process (pyinfra's reboot): the
        #: next connect makes a new master instead of trusting the old one.
        self._disconnected = False
        #: Set while the master was found, not made, by this process and no command
        #: has gone through it yet: a multiplexer failure then means it is stale.
        self._unproven = False
        #: Why this host is out of this run (module docstring), once it is.
        self.lost: str | None = None

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
        try:
            return Client(argv).communicate(timeout=self.state.config.CONNECT_TIMEOUT + 5)[0]
        except TimeoutError:
            return SSH_ERROR

    def _new_master(self) -> None:
        """Make this host's master (its first session makes it); errors name the host."""
        try:
            code, _, err = Client(self.ssh_argv() + ["true"]).communicate(
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

    def _first_use_failed(self, code: int, stdout_empty: bool, stderr_lines: list[str]) -> bool:
        """After a command: whether it was the first through a master an earlier run
        left, and never reached the node because that master was stale (its node
        rebooted or readdressed). Then that master is closed and a new one made, and
        the command is to run again; ConnectError when the node is gone."""
        if not self._unproven:
            return False
        self._unproven = False
        if code != SSH_ERROR or not _stale_master(stdout_empty, stderr_lines):
            return False
        logger.debug("%s: the SSH master was stale; connecting again", self.host.name)
        self._control("exit")
        self._new_master()
        return True

    # --- a node lost mid-run ----------------------------------------------------------

    def _planning_own_deploy(self) -> bool:
        """Whether pyinfra is planning (running ``deploy.py``) and the command is this
        host's own deploy's (not another host's deploy reading this host's facts)."""
        return (self.state.current_stage == StateStage.Prepare
                and ctx_host.get() is self.host)

    def _skipped(self) -> str:
        """What of this host's run is skipped, for :func:`lost_line`."""
        ops = self.state.ops.get(self.host, {})
        if self.state.current_stage != StateStage.Execute:
            return (f"its deploy stopped while being planned, the {len(ops)} operation(s) "
                    "planned so far and the rest are skipped")
        order = self.state.get_op_order()
        current = getattr(self.host, "executing_op_hash", None)
        later = order[order.index(current) + 1:] if current in order else order
        skipped = sum(1 for op_hash in later if op_hash in ops)
        return f"its current operation failed and its {skipped} remaining operation(s) are skipped"

    def _probe(self) -> str | None:
        """After a client's own failure (exit 255): None when the host answers (over
        the master within :data:`PROBE_TIMEOUT` s, else over a new connection), or why
        it does not."""
        try:
            code, _, _ = Client(self.ssh_argv() + ["true"]).communicate(timeout=PROBE_TIMEOUT)
        except TimeoutError:
            code = SSH_ERROR
        if code == 0:
            return None
        self._control("exit")  # a master whose connection is dead, if any
        try:
            self._new_master()
        except ConnectError as exc:
            return _reason(exc)
        return None

    def _check_lost(self, code: int, gone: str | None = None) -> bool:
        """After a command: whether the client failed (255) and the host no longer
        answers (*gone*: why, when a new connection was just refused); then it is
        marked lost and its one line logged (once)."""
        if code != SSH_ERROR or self.lost is not None:
            return self.lost is not None
        reason = gone or self._probe()
        if reason is None or self.lost is not None:  # answers; or lost meanwhile
            return self.lost is not None
        self.lost = reason
        logger.error(lost_line(self.host.name, reason, self._skipped()))
        return True

    def _refuse(self) -> None:
        """For a lost host's upload or download: :class:`HostLost` while its own deploy
        is planned, else an ``OSError`` (pyinfra's error for a transfer that failed)."""
        if self._planning_own_deploy():
            raise HostLost(self.host, self.lost or "")
        raise OSError(f"{self.host.name}: lost earlier in this run ({self.lost}); not contacted")

    # --- pyinfra's connector interface ---------------------------------------------

    def connect(self) -> None:
        if self.paramiko:
            return self.paramiko.connect()
        self.ssh_argv()  # the control path, and the directory checked
        if self._disconnected:
            # Reconnecting in this run (after a reboot): the old master's connection
            # is gone or going; a new one is made.
            self._control("exit")
            self._disconnected = False
        elif os.path.exists(self.control_path):
            # An earlier run's master: its first command proves it.
            self._unproven = True
            return None
        self._new_master()
        return None

    def disconnect(self) -> None:
        # The master stays open for the next run (ControlPersist); only a reconnect in
        # this run replaces it.
        if self.paramiko:
            return self.paramiko.disconnect()
        self._disconnected = True
        return None

    def run_shell_command(
        self, command, print_output: bool = False, print_input: bool = False, **arguments
    ) -> tuple[bool, CommandOutput]:
        if self.paramiko:
            return self.paramiko.run_shell_command(
                command, print_output=print_output, print_input=print_input, **arguments)
        if self.lost is not None:
            if self._planning_own_deploy():
                raise HostLost(self.host, self.lost)
            # Not contacted: a failure with no output (the one LOST line said why), so
            # pyinfra's own error for it is one line ("could not load fact", "executed 0
            # commands") for the operation under way; later ones skip the host.
            return False, CommandOutput([])
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
            argv = self.ssh_argv()
            if get_pty:
                argv[1] = "-tt"
            client = Client(argv + [unix_command.get_raw_value()])
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
        gone = None
        try:
            again = self._first_use_failed(code, not output.stdout_lines, output.stderr_lines)
        except ConnectError as exc:  # the node is gone: this command failed
            output.combined_lines.append(OutputLine("stderr", str(exc)))
            again, gone = False, _reason(exc)
        if again:
            code, output = execute_command_with_sudo_retry(self.host, arguments, execute_command)
        if self._check_lost(code, gone):
            if self._planning_own_deploy():
                raise HostLost(self.host, self.lost or "")
            return False, output
        ok = code in success_exit_codes if success_exit_codes else code == 0
        return ok, output

    def _transfer(
        self, command: StringCommand, arguments: dict[str, Any], stdin: bytes = b""
    ) -> tuple[int, bytes, bytes]:
        """Run ``command`` (with the operation's sudo/su) feeding it ``stdin``: (exit
        status, stdout, stderr) as bytes."""
        if self.lost is not None:
            self._refuse()
        timeout = arguments.get("_timeout")
        arguments = {k: v for k, v in arguments.items() if k not in _OWN_ARGUMENTS}
        result: list[bytes] = []

        def execute_command() -> tuple[int, CommandOutput]:
            unix_command = make_unix_command_for_host(self.state, self.host, command, **arguments)
            code, out, err = Client(self.ssh_argv() + [unix_command.get_raw_value()]).communicate(
                stdin, timeout)
            result[:] = [out, err]
            lines = err.decode(errors="replace").splitlines()
            return code, CommandOutput([OutputLine("stderr", line) for line in lines])

        code, output = execute_command_with_sudo_retry(self.host, arguments, execute_command)
        gone = None
        try:
            again = self._first_use_failed(code, not result[0], output.stderr_lines)
        except ConnectError as exc:  # the node is gone: this transfer failed
            again, gone = False, _reason(exc)
        if again:
            code, output = execute_command_with_sudo_retry(self.host, arguments, execute_command)
        if self._check_lost(code, gone):
            self._refuse()
        return code, result[0], result[1]

    def put_file(
        self,
        filename_or_io,
        remote_filename,
        remote_temp_filename=None,  # unused: the file is written where it belongs
        print_output: bool = False,
        print_input: bool = False,
        **arguments,
    ) -> bool:
        """Upload by ``cat > FILE`` on the host, as the operation's sudo/su user."""
        if self.paramiko:
            return self.paramiko.put_file(filename_or_io, remote_filename, remote_temp_filename,
                                          print_output, print_input, **arguments)  # fmt: skip
        with get_file_io(filename_or_io) as file_io:
            data = file_io.read()
        if isinstance(data, str):
            data = data.encode()
        code, _, err = self._transfer(
            StringCommand("cat", ">", QuoteString(remote_filename)), arguments, data)
        if code != 0:
            raise OSError(f"upload to {remote_filename}: {err.decode(errors='replace').strip()}")
        if print_output:
            echo(f"{self.host.print_prefix}file uploaded: {remote_filename}", err=True)
        return True

    def get_file(
        self,
        remote_filename,
        filename_or_io,
        remote_temp_filename=None,  # unused: the file is read where it is
        print_output: bool = False,
        print_input: bool = False,
        **arguments,
    ) -> bool:
        """Download by ``cat FILE`` on the host, as the operation's sudo/su user."""
        if self.paramiko:
            return self.paramiko.get_file(remote_filename, filename_or_io, remote_temp_filename,
                                          print_output, print_input, **arguments)  # fmt: skip
        code, out, err = self._transfer(
            StringCommand("cat", QuoteString(remote_filename)), arguments)
        if code != 0:
            raise OSError(f"download of {remote_filename}: "
                          f"{err.decode(errors='replace').strip()}")  # fmt: skip
        with get_file_io(filename_or_io, "wb") as file_io:
            file_io.write(out)
        if print_output:
            echo(f"{self.host.print_prefix}file downloaded: {remote_filename}", err=True)
        return True

    def check_can_rsync(self) -> None:
        # pyinfra's rsync runs its own ssh command line: no master of ours to share.
        SSHConnector(self.state, self.host).check_can_rsync()

    def rsync(self, src, dest, flags, print_output: bool = False, print_input: bool = False,
              **arguments) -> bool:  # fmt: skip
        return SSHConnector(self.state, self.host).rsync(
            src, dest, flags, print_output=print_output, print_input=print_input, **arguments)
