"""One testbed node: overlay root, cgroups, the nspawn command line, start, stop, SSH."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aicluster.testbed import state as st
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.host import cgroup_hierarchies
from aicluster.testbed.network import wait_links_gone
from aicluster.testbed.system import (
    is_mountpoint,
    log,
    mounts_under,
    pid_cmdline,
    pid_matches,
    read_pid,
    run,
    signal_pid,
    spawn_daemon,
    wait_until,
)

SUPERVISOR_MODULE = "aicluster.testbed.supervisor"
#: Where nspawn looks for a node's mount propagation directory (see docs/testbed.md).
PROPAGATE_ROOT = Path("/run/systemd/nspawn/propagate")

SSH_OPTIONS = [
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "IdentitiesOnly=yes",
]


# --- paths and names ---------------------------------------------------------------


def launch_file(name: str) -> Path:
    """The supervisor's configuration file for node *name* (also its identity mark)."""
    return st.node_dir(name) / "launch.json"


def node_log(name: str) -> Path:
    """Supervisor and nspawn output of node *name*."""
    return st.node_dir(name) / "node.log"


def cgroup_dirs(name: str, hierarchies: list[Path] | None = None) -> list[Path]:
    """The node's own cgroup directories, one per hierarchy (``.../aicluster-testbed/NAME``)."""
    roots = cgroup_hierarchies() if hierarchies is None else hierarchies
    return [root / st.CGROUP_PARENT / name for root in roots]


#: The FUSE device the nodes are given (when the host has it).
FUSE_DEVICE = "/dev/fuse"


def nspawn_command(name: str, root: Path | str) -> list[str]:
    """The systemd-nspawn command line that boots node *name* from *root*.

    ``--register=no --keep-unit`` let nspawn run without systemd as the host's init;
    the node stays in the cgroup its launcher put it in.
    """
    _, fabric_veth = st.host_veth_names(name)
    return [
        "systemd-nspawn",
        "-D", str(root),
        "-M", name,
        "--boot",
        "--register=no",
        "--keep-unit",
        f"--network-bridge={st.MGMT_BRIDGE}",
        f"--network-veth-extra={fabric_veth}:{st.FABRIC_NIC}",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=passive",
        "--system-call-filter=open_by_handle_at",
        # nspawn drops CAP_SYS_RESOURCE, so a node cannot raise its own locked-memory
        # limit the way a real machine does for RDMA: give it the limit at boot.
        "--rlimit=MEMLOCK=infinity",
        # nspawn gives a node no /dev/fuse; a real host has it, and FUSE clients
        # (ceph-fuse) need it: the host's own device, shared.
        *([f"--bind={FUSE_DEVICE}"] if Path(FUSE_DEVICE).exists() else []),
    ]


def ssh_command(key: str | Path, address: str, command: list[str] | None = None,
                batch: bool = False) -> list[str]:
    """``ssh`` argv for root@*address* with the testbed key (host keys not checked)."""
    argv = ["ssh", "-i", str(key), *SSH_OPTIONS]
    if batch:
        argv += ["-o", "BatchMode=yes", "-o", "ConnectTimeout=3"]
    argv.append(f"root@{address}")
    return argv + list(command or [])


# --- cgroups -----------------------------------------------------------------------


def make_cgroups(name: str) -> list[Path]:
    """Create the node's cgroup directories (its launcher moves itself into them)."""
    dirs = cgroup_dirs(name)
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def cgroup_pids(name: str) -> set[int]:
    """Every pid in the node's cgroups (all levels): the node's processes."""
    pids: set[int] = set()
    for top in cgroup_dirs(name):
        if not top.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    text = Path(dirpath, "cgroup.procs").read_text()
                except OSError:
                    continue
                pids.update(int(p) for p in text.split())
    return pids


def remove_cgroups(name: str) -> None:
    """Remove the node's cgroup directories (deepest first), then the shared parent if
    empty. The node's processes must be gone."""
    for top in cgroup_dirs(name):
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in os.walk(top, topdown=False):
            try:
                os.rmdir(dirpath)
            except OSError as exc:
                raise TestbedError(f"cannot remove cgroup {dirpath}: {exc}") from exc
    for parent in {d.parent for d in cgroup_dirs(name)}:
        try:
            parent.rmdir()
        except OSError:
            pass  # other nodes' cgroups are still there


# --- mounts ------------------------------------------------------------------------


def mount_root(name: str, base: Path) -> Path:
    """Mount the node's overlayfs (lower: *base*, upper: the node's own) at its root dir.
    Returns the root; a root that is already mounted is left alone."""
    ndir = st.node_dir(name)
    upper, work, root = ndir / "upper", ndir / "work", ndir / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    if not is_mountpoint(root):
        run(
            ["mount", "-t", "overlay", f"aicluster-{name}", "-o",
             f"lowerdir={base},upperdir={upper},workdir={work}", str(root)],
            timeout=30,
        )
    return root


def prepare_propagation(name: str) -> None:
    """Make the node's nspawn propagation directory a shared mount before it boots, so
    mounts made there later on the host show up in the node at /run/host/incoming."""
    pdir = PROPAGATE_ROOT / name
    pdir.mkdir(parents=True, exist_ok=True)
    if not is_mountpoint(pdir):
        run(["mount", "--bind", str(pdir), str(pdir)], timeout=15)
        run(["mount", "--make-shared", str(pdir)], timeout=15)


def unmount_node(name: str) -> None:
    """Unmount everything of node *name* (its root and its propagation directory)."""
    for top in (PROPAGATE_ROOT / name, st.node_dir(name)):
        for point in mounts_under(top):
            for _attempt in range(20):
                if run(["umount", point], timeout=30, check=False).returncode == 0:
                    break
                if not is_mountpoint(Path(point)):
                    break
                time.sleep(0.5)
            else:
                raise TestbedError(f"cannot unmount {point} (still busy)")
    pdir = PROPAGATE_ROOT / name
    if pdir.is_dir() and not mounts_under(pdir):
        shutil.rmtree(pdir, ignore_errors=True)


# --- processes ---------------------------------------------------------------------


def supervisor_alive(name: str, pid: int | None) -> bool:
    """True when *pid* is node *name*'s supervisor (alive, right command line)."""
    return pid_matches(pid, SUPERVISOR_MODULE, str(launch_file(name)))


def nspawn_pid(name: str) -> int | None:
    """Pid of the node's current systemd-nspawn, if it is running."""
    pid = read_pid(st.node_dir(name) / "nspawn.pid")
    root = str(st.node_dir(name) / "root")
    return pid if pid_matches(pid, "systemd-nspawn", root) else None


def start_node(n: int, base: Path) -> int:
    """Mount node *n*'s root, write its launch config and start its supervisor.
    Returns the supervisor pid. Node files must already be in its root."""
    name = st.node_name(n)
    mgmt_veth, fabric_veth = st.host_veth_names(name)
    # A previous instance of this node must be fully gone (veth names are reused).
    wait_links_gone([mgmt_veth, fabric_veth], timeout=30)
    root = mount_root(name, base)
    prepare_propagation(name)
    cgroups = make_cgroups(name)
    config = {
        "name": name,
        "argv": nspawn_command(name, root),
        "cgroups": [str(c) for c in cgroups],
        "host_veths": [mgmt_veth, fabric_veth],
        "fabric_veth": fabric_veth,
        "nspawn_pid_file": str(st.node_dir(name) / "nspawn.pid"),
    }
    launch_file(name).write_text(json.dumps(config, indent=2) + "\n")
    argv = [sys.executable, "-m", SUPERVISOR_MODULE, str(launch_file(name))]
    return spawn_daemon(argv, node_log(name), st.node_dir(name) / "supervisor.pid")


def stop_nodes(entries: list[dict[str, Any]], timeout: float = 90) -> None:
    """Stop nodes: SIGTERM to each supervisor (it passes it on to nspawn, which powers the
    node off), wait up to *timeout* s, then SIGKILL what is left of ours: the
    supervisor, nspawn and every process in the node's cgroups. Waits until the
    host-side veths are gone. Never signals a pid that is not ours."""
    names = [e["name"] for e in entries]
    watched: dict[str, list[int]] = {}
    for entry in entries:
        name = entry["name"]
        pids = []
        sup = entry.get("pid") or read_pid(st.node_dir(name) / "supervisor.pid")
        if supervisor_alive(name, sup):
            pids.append(sup)
        nsp = nspawn_pid(name)
        if nsp:
            pids.append(nsp)
        # The supervisor passes SIGTERM on to nspawn and then does not restart it.
        if supervisor_alive(name, sup):
            signal_pid(sup, signal.SIGTERM)
        elif nsp:
            signal_pid(nsp, signal.SIGTERM)
        watched[name] = pids
    all_pids = [p for pids in watched.values() for p in pids]
    if all_pids:
        log(f"stopping {', '.join(names)}")
    if not wait_until(lambda: all(pid_cmdline(p) is None for p in all_pids), timeout, 0.3):
        late = [n for n, pids in watched.items() if any(pid_cmdline(p) for p in pids)]
        log(f"{', '.join(late)} did not stop within {timeout:.0f} s; killing")
        for pid in all_pids:
            if pid_cmdline(pid) is not None:
                signal_pid(pid, signal.SIGKILL)
    # Whatever is left in the nodes' own cgroups is the nodes' (and so ours).
    for _ in range(50):
        leftovers = set().union(*(cgroup_pids(n) for n in names)) if names else set()
        leftovers = {p for p in leftovers if pid_cmdline(p) is not None}
        if not leftovers and all(pid_cmdline(p) is None for p in all_pids):
            break
        for pid in leftovers:
            signal_pid(pid, signal.SIGKILL)
        time.sleep(0.2)
    for name in names:
        left = wait_links_gone(list(st.host_veth_names(name)), timeout=30)
        if left:
            log(f"deleted leftover interfaces of {name}: {', '.join(left)}")


def remove_node(name: str) -> None:
    """Unmount and delete everything of a stopped node (its dir, cgroups, mounts)."""
    unmount_node(name)
    remove_cgroups(name)
    ndir = st.node_dir(name)
    if ndir.exists():
        if mounts_under(ndir):
            raise TestbedError(f"refusing to delete {ndir}: still mounted")
        shutil.rmtree(ndir)


def ssh_ok(key: str | Path, address: str, timeout: float = 10) -> bool:
    """True when ``ssh root@address true`` succeeds with the testbed key."""
    try:
        proc = subprocess.run(
            ssh_command(key, address, ["true"], batch=True),
            capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def wait_ssh(entries: list[dict[str, Any]], key: str | Path, timeout: float = 120) -> None:
    """Wait (in parallel) until every node in *entries* answers SSH; raise naming the
    nodes that did not, with the end of their logs."""
    failures: dict[str, str] = {}

    def one(entry: dict[str, Any]) -> None:
        name = entry["name"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not supervisor_alive(name, entry.get("pid")):
                failures[name] = "its systemd-nspawn supervisor exited"
                return
            if ssh_ok(key, entry["address"]):
                return
            time.sleep(0.3)
        failures[name] = f"no SSH answer from {entry['address']} within {timeout:.0f} s"

    threads = [threading.Thread(target=one, args=(e,), daemon=True) for e in entries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        parts = []
        for name, why in sorted(failures.items()):
            tail = ""
            if node_log(name).exists():
                tail = node_log(name).read_text(errors="replace")[-1500:]
            parts.append(f"{name}: {why}\n--- {node_log(name)} (end) ---\n{tail}")
        raise TestbedError("node(s) did not come up:\n" + "\n".join(parts))


#: Refreshes each new node's package index once, through the apt proxy, and records
#: it the way apt's periodic job does (pyinfra's ``cache_time`` and Ansible's
#: ``cache_valid_time`` read that stamp), so the first deploy does not refresh it again.
REFRESH_INDEX = (
    "timeout 240 apt-get -q update && mkdir -p /var/lib/apt/periodic "
    "&& touch /var/lib/apt/periodic/update-success-stamp"
)


def refresh_package_index(entries: list[dict[str, Any]], key: str | Path,
                          attempts: int = 3) -> None:
    """Refresh the package index of each node in *entries*, ONE NODE AT A TIME.

    apt-cacher-ng hangs when many clients ask for the same fresh index file at once
    (TESTBED.md: ten nodes running ``apt-get update`` together stalled it for over 15
    minutes; one after the other never did). The first node fills the proxy's cache,
    the others are served from it, and the deploys that follow within the hour find a
    fresh index and do not ask again. Raises naming the node that could not refresh.
    """
    for entry in entries:
        start = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                proc = subprocess.run(
                    ssh_command(key, entry["address"], [REFRESH_INDEX], batch=True),
                    capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                why = "no answer within 300 s"
            else:
                if proc.returncode == 0:
                    log(f"{entry['name']}: package index refreshed in "
                        f"{time.monotonic() - start:.1f} s")
                    break
                why = f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}"
            if attempt == attempts:
                raise TestbedError(
                    f"{entry['name']}: apt-get update through the package proxy failed "
                    f"{attempts} times ({why})"
                )
            log(f"{entry['name']}: apt-get update failed ({why.splitlines()[0]}); retrying")
            time.sleep(2 * attempt)
