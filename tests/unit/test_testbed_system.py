"""Unit tests of aicluster.testbed.system (daemons, pids, mountinfo); no root needed."""

from __future__ import annotations

import os
import sys
import time

import pytest

from aicluster.testbed import system
from aicluster.testbed.errors import TestbedError


def test_parse_mountinfo_unescapes() -> None:
    text = (
        "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "40 22 0:39 / /var/lib/a\\040b/root rw - overlay x rw,lowerdir=/b\n"
    )
    assert system.parse_mountinfo(text) == ["/", "/var/lib/a b/root"]


def test_mounts_under_nothing(tmp_path) -> None:
    assert system.mounts_under(tmp_path) == []
    assert not system.is_mountpoint(tmp_path)


def test_run_errors() -> None:
    assert system.run(["true"]).returncode == 0
    with pytest.raises(TestbedError, match="exit code 3"):
        system.run(["sh", "-c", "echo boom >&2; exit 3"])
    with pytest.raises(TestbedError, match="did not finish"):
        system.run(["sleep", "5"], timeout=0.2)
    with pytest.raises(TestbedError, match="not installed"):
        system.run(["/nonexistent/tool"])


def test_pid_helpers() -> None:
    me = os.getpid()
    assert system.pid_cmdline(me)
    assert system.pid_matches(me, sys.executable.split("/")[-1][:6])
    assert not system.pid_matches(me, "certainly-not-in-my-command-line")
    assert system.pid_cmdline(None) is None
    assert system.pid_cmdline(0) is None


def test_spawn_daemon_and_stop(tmp_path) -> None:
    pid_file = tmp_path / "d.pid"
    log = tmp_path / "d.log"
    pid = system.spawn_daemon(
        ["sh", "-c", "echo started; exec sleep 60 # aicluster-unit-test"], log, pid_file
    )
    assert system.read_pid(pid_file) == pid
    assert system.wait_until(lambda: system.pid_matches(pid, "sleep"), 5)
    assert os.getsid(pid) != os.getsid(0)  # its own session
    assert system.wait_until(lambda: "started" in log.read_text(), 5)
    assert system.stop_pids([pid], timeout=5) == []
    assert system.pid_cmdline(pid) is None


def test_spawn_daemon_missing_program(tmp_path) -> None:
    with pytest.raises(TestbedError, match="could not start"):
        system.spawn_daemon(["/nonexistent/prog"], tmp_path / "l", tmp_path / "p")


def test_wait_until() -> None:
    start = time.monotonic()
    assert not system.wait_until(lambda: False, 0.2, 0.05)
    assert time.monotonic() - start >= 0.2
    assert system.wait_until(lambda: True, 0)


def test_spawn_daemon_wait_is_bounded_when_the_pipe_stays_open(tmp_path, monkeypatch) -> None:
    """A write end still held somewhere (a racing fork) must not block forever: after
    the wait, a running pid in the pid file means the daemon started."""
    import os

    monkeypatch.setattr(system, "EXEC_WAIT", 0.3)
    pid_file = tmp_path / "pid"
    pid_file.write_text(f"{os.getpid()}\n")
    read_fd, write_fd = os.pipe()
    try:
        assert system._read_until_exec(read_fd, pid_file) == ""
        read_fd, other = os.pipe()
        pid_file.write_text("999999999\n")  # no such process
        assert "no word from the daemon" in system._read_until_exec(read_fd, pid_file)
        os.close(other)
    finally:
        os.close(write_fd)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"OSError: boom")
    os.close(write_fd)
    assert system._read_until_exec(read_fd, pid_file) == "OSError: boom"
