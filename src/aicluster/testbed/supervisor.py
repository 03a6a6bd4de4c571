"""Per-node supervisor: ``python -m aicluster.testbed.supervisor LAUNCH_JSON``.

Started (daemonized) by ``up`` for each node. It loops:

1. wait until the node's host-side veths from a previous run are gone;
2. start systemd-nspawn, having first moved the child into the node's own cgroups
   (``systemd`` and ``unified`` hierarchies) so that nodes do not share a cgroup;
3. attach the host side of the fabric veth to the fabric bridge (MTU 9000);
4. wait for nspawn: exit code 133 means the node rebooted, so start it again;
   anything else (or a SIGTERM to the supervisor, which it passes on to nspawn)
   ends the loop.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REBOOT_EXIT_CODE = 133


def _say(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} supervisor[{os.getpid()}]: {message}", flush=True)


def _join_cgroups(paths: list[str]) -> None:
    """Move the calling process into each cgroup in *paths* (runs in the child, pre-exec)."""
    for path in paths:
        fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, b"0\n")
        finally:
            os.close(fd)


def _link_exists(ifname: str) -> bool:
    return Path("/sys/class/net", ifname).exists()


class Supervisor:
    """Runs one node's systemd-nspawn, restarting it after a reboot."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def on_signal(self, signum: int, _frame: object) -> None:
        """SIGTERM/SIGINT/SIGHUP: stop for good, passing SIGTERM on to nspawn."""
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def wait_veths_gone(self) -> None:
        from aicluster.testbed.network import wait_links_gone

        left = wait_links_gone(self.config["host_veths"], timeout=30)
        if left:
            _say(f"deleted leftover interfaces {left}")

    def attach_fabric(self) -> None:
        from aicluster.testbed.network import attach_to_fabric

        veth = self.config["fabric_veth"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.child is None or self.child.poll() is not None:
                return
            if _link_exists(veth):
                try:
                    attach_to_fabric(veth)
                    _say(f"{veth} attached to the fabric bridge")
                    return
                except Exception as exc:  # noqa: BLE001 - keep the node running, report
                    _say(f"attaching {veth} failed, retrying: {exc}")
            time.sleep(0.1)
        _say(f"{veth} did not appear within 30 s; the fabric NIC is not connected")

    def run(self) -> int:
        """The supervision loop; returns the last nspawn exit code."""
        rc = 0
        pid_file = Path(self.config["nspawn_pid_file"])
        join = functools.partial(_join_cgroups, list(self.config["cgroups"]))
        while not self.stopping:
            self.wait_veths_gone()
            if self.stopping:
                break
            _say("starting: " + " ".join(self.config["argv"]))
            self.child = subprocess.Popen(
                self.config["argv"],
                stdin=subprocess.DEVNULL,
                preexec_fn=join,
            )
            pid_file.write_text(f"{self.child.pid}\n")
            if self.stopping:  # a signal arrived while starting
                self.child.send_signal(signal.SIGTERM)
            self.attach_fabric()
            rc = self.child.wait()
            pid_file.unlink(missing_ok=True)
            _say(f"systemd-nspawn exited with code {rc}")
            if rc != REBOOT_EXIT_CODE:
                break
            _say("the node rebooted; starting it again")
        self.wait_veths_gone()
        _say("stopped")
        return rc


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m aicluster.testbed.supervisor LAUNCH_JSON``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m aicluster.testbed.supervisor LAUNCH_JSON", file=sys.stderr)
        return 2
    config = json.loads(Path(args[0]).read_text())
    sup = Supervisor(config)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, sup.on_signal)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
