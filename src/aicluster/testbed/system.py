"""Small host helpers: commands with timeouts, our own daemons, pids, mounts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from aicluster.testbed.errors import TestbedError


def log(message: str) -> None:
    """Progress output for the operator (stderr, so stdout stays machine-readable)."""
    print(f"testbed: {message}", file=sys.stderr, flush=True)


def run(
    argv: Sequence[str],
    *,
    timeout: float = 60,
    check: bool = True,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    capture: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run *argv* with a timeout; raise :class:`TestbedError` on timeout or (if *check*) failure.

    *env* entries are added to the current environment.
    """
    full_env = dict(os.environ, **env) if env else None
    try:
        proc = subprocess.run(
            list(argv),
            input=input,
            text=True,
            capture_output=capture,
            timeout=timeout,
            env=full_env,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from exc
    except FileNotFoundError as exc:
        raise TestbedError(f"`{argv[0]}` is not installed on this host") from exc
    if check and proc.returncode != 0:
        detail = ((proc.stderr or "") + (proc.stdout or "")).strip()[-2000:] if capture else ""
        raise TestbedError(f"`{' '.join(argv)}` failed with exit code {proc.returncode}\n{detail}")
    return proc


def run_retry(
    argv: Sequence[str],
    *,
    timeout: float,
    attempts: int = 3,
    delay: float = 5,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """:func:`run` up to *attempts* times (each with its own *timeout*), pausing *delay* s."""
    for attempt in range(1, attempts + 1):
        try:
            return run(argv, timeout=timeout, env=env)
        except TestbedError as exc:
            if attempt == attempts:
                raise
            log(f"attempt {attempt}/{attempts} failed, retrying in {delay:.0f} s: {exc.message}")
            time.sleep(delay)
    raise AssertionError("unreachable")


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Poll *predicate* until it is true (return True) or *timeout* s pass (return False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def pid_cmdline(pid: int | None) -> list[str] | None:
    """Command line of a live process, or None when it is gone (zombies count as gone)."""
    if not pid or pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # The state letter follows the parenthesised command name.
        if stat[stat.rindex(")") + 2] in "ZX":
            return None
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def pid_matches(pid: int | None, *needles: str) -> bool:
    """True when *pid* is alive and its command line contains every one of *needles*.

    This is how we recognise our own processes, so a recycled pid is never signalled.
    """
    cmdline = pid_cmdline(pid)
    if cmdline is None:
        return False
    joined = "\0".join(cmdline)
    return all(needle in joined for needle in needles)


def signal_pid(pid: int, sig: int) -> None:
    """Send *sig* to *pid*, ignoring a process that is already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_pids(pids: Iterable[int], timeout: float, sig: int = signal.SIGTERM) -> list[int]:
    """Send *sig* to each pid, wait up to *timeout* s, SIGKILL the survivors.

    The caller has already checked that the pids are ours. Returns the pids that
    needed SIGKILL.
    """
    pids = [p for p in pids if pid_cmdline(p) is not None]
    for pid in pids:
        signal_pid(pid, sig)
    wait_until(lambda: all(pid_cmdline(p) is None for p in pids), timeout)
    killed = [p for p in pids if pid_cmdline(p) is not None]
    for pid in killed:
        signal_pid(pid, signal.SIGKILL)
    wait_until(lambda: all(pid_cmdline(p) is None for p in killed), 10)
    return killed


def spawn_daemon(
    argv: Sequence[str],
    log_path: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
) -> int:
    """Start *argv* as a daemon (own session, reparented away from us) and return its pid.

    The classic double fork: the intermediate child exits at once so the daemon is
    never our zombie; the daemon writes its pid to *pid_file* before exec'ing, so
    the pid is exactly the process running *argv*. stdout and stderr go to *log_path*.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid_file.unlink(missing_ok=True)
    full_env = dict(os.environ, **(env or {}))
    argv = list(argv)
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # intermediate child
        try:
            os.close(read_fd)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            # the daemon
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            tmp = f"{pid_file}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, f"{os.getpid()}\n".encode())
            os.close(fd)
            os.rename(tmp, str(pid_file))
            os.chdir("/")
            os.closerange(3, write_fd)
            os.set_inheritable(write_fd, False)  # closes on exec: the parent sees EOF
            os.closerange(write_fd + 1, 65536)
            os.execvpe(argv[0], argv, full_env)
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            try:
                os.write(write_fd, f"{type(exc).__name__}: {exc}".encode())
            finally:
                os._exit(127)
    os.close(write_fd)
    os.waitpid(child, 0)
    error = _read_until_exec(read_fd, pid_file)
    if error:
        raise TestbedError(f"could not start {argv[0]}: {error}")
    try:
        return int(pid_file.read_text())
    except (FileNotFoundError, ValueError) as exc:
        raise TestbedError(f"could not start {argv[0]}: no pid file {pid_file}") from exc


#: How long spawn_daemon waits for the daemon's exec to close the pipe.
EXEC_WAIT = 30.0


def _read_until_exec(read_fd: int, pid_file: Path) -> str:
    """What the daemon reported before its exec (nothing when exec worked: the pipe's
    write end closes on exec). Polled without blocking, and bounded: in a process that
    gevent has monkey-patched (pyinfra's CLI module does that on import, e.g. in the
    test suite), a plain blocking read of this pipe once never returned although the
    daemon had started. After EXEC_WAIT seconds a daemon whose pid file names a running
    process has started."""
    chunks = []
    deadline = time.monotonic() + EXEC_WAIT
    os.set_blocking(read_fd, False)
    try:
        while True:
            try:
                chunk = os.read(read_fd, 4096)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    pid = read_pid(pid_file)
                    if pid is not None and _alive(pid):
                        return ""
                    return (f"no word from the daemon within {EXEC_WAIT:.0f} s and no "
                            "running pid")
                time.sleep(0.02)
                continue
            if not chunk:
                return b"".join(chunks).decode(errors="replace")
            chunks.append(chunk)
    finally:
        os.close(read_fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_pid(path: Path) -> int | None:
    """The pid in *path*, or None when the file is missing or malformed."""
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a TCP connection to *host*:*port* succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _unescape_mountinfo(field: str) -> str:
    """Undo the octal escapes (``\\040`` for space ...) of /proc/self/mountinfo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[str]:
    """Mount points listed in a /proc/self/mountinfo text, in order."""
    points = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(_unescape_mountinfo(fields[4]))
    return points


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below *path*, deepest first (the order to unmount them in)."""
    prefix = str(path).rstrip("/")
    points = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    found = {p for p in points if p == prefix or p.startswith(prefix + "/")}
    return sorted(found, key=lambda p: (-p.count("/"), p))


def is_mountpoint(path: Path) -> bool:
    """True when *path* itself is a mount point."""
    return str(path).rstrip("/") in parse_mountinfo(Path("/proc/self/mountinfo").read_text())
