"""``up``, ``down`` and ``status``: the testbed as a whole."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aicluster.testbed import state as st
from aicluster.testbed.disks import add_disk, parse_size, remove_disks
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.host import check_host, ensure_host_packages, require_root
from aicluster.testbed.image import (
    ensure_base_dir,
    ensure_base_tarball,
    remove_stale_bases,
    write_node_config,
)
from aicluster.testbed.network import ensure_bridges, link_exists, remove_bridges
from aicluster.testbed.node import (
    PROPAGATE_ROOT,
    cgroup_dirs,
    mount_root,
    nspawn_pid,
    refresh_package_index,
    remove_node,
    ssh_ok,
    start_node,
    stop_nodes,
    supervisor_alive,
    wait_ssh,
)
from aicluster.testbed.proxy import ensure_proxies, proxy_running, stop_proxies
from aicluster.testbed.sources import host_mirror
from aicluster.testbed.system import log, mounts_under, run, wait_until

#: nspawn's runtime directory on the host (it makes locks/ there; we make propagate/).
NSPAWN_RUN_DIR = Path("/run/systemd/nspawn")

#: Files and directories ``down`` removes from the state directory (nothing else).
#: What `down` removes from the state directory: the state, the nodes, the proxies'
#: files, the key, the secrets the testbed's deploys generated (its munge key) and
#: rehearsal overrides (inventories/testbed.py reads overrides.json).
STATE_ENTRIES = ["state.json", "state.json.tmp", "nodes", "proxies", "id_ed25519",
                 "id_ed25519.pub", "secrets", "overrides.json", "disks"]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise testbed operations on this host (a lock file in the cache directory)."""
    cache = st.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "testbed.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another testbed operation is running; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _ensure_key(base: Path) -> Path:
    """The testbed's SSH key pair (ed25519), generated once in the state directory."""
    key = base / "id_ed25519"
    if not key.exists() or not key.with_suffix(".pub").exists():
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "aicluster-testbed",
             "-f", str(key)], timeout=30)
    return key


def up(nodes: int = 2, disks: int = 0, disk_size: str = "1G") -> dict[str, Any]:
    """Bring the testbed up with (at least) *nodes* nodes and return its state.

    Idempotent: running nodes are left untouched, missing ones are created or
    restarted, and nodes beyond *nodes* that already exist are kept. With *disks*,
    every node has (at least) disks ``disk1`` .. ``diskK`` of *disk_size*
    (:mod:`aicluster.testbed.disks`).
    """
    if not isinstance(nodes, int) or not 1 <= nodes <= st.MAX_NODES:
        raise TestbedError(f"--nodes must be between 1 and {st.MAX_NODES}")
    if not isinstance(disks, int) or not 0 <= disks <= 8:
        raise TestbedError("--disks must be between 0 and 8")
    if disks:
        parse_size(disk_size)
    require_root()
    with _locked():
        data = _up(nodes)
        for node in data["nodes"]:
            for i in range(1, disks + 1):
                add_disk(data, node["name"], f"disk{i}", disk_size)
        return data


def disk_add(node: str, name: str, size: str = "1G") -> dict[str, Any]:
    """Give a running node a disk (a loop device on the host), named in the node
    ``/dev/disk/by-id/aicluster-testbed-NODE-NAME``. Returns the disk's record."""
    parse_size(size)
    require_root()
    with _locked():
        data = st.load_state()
        if data is None:
            raise TestbedError("no testbed (run: aicluster testbed up)")
        return add_disk(data, node, name, size)


def _up(count: int) -> dict[str, Any]:
    started_at = time.monotonic()
    ensure_host_packages()
    check_host()
    sdir = st.state_dir()
    data = st.load_state()
    if data is None:
        data = st.empty_state()
        # Directories that only the testbed will have made; ``down`` removes them if empty.
        data["created_dirs"] = _missing_dirs(sdir.parent) + _missing_dirs(NSPAWN_RUN_DIR)
    sdir.mkdir(parents=True, exist_ok=True)
    sdir.chmod(0o700)
    st.save_state(data)
    mirror = host_mirror()
    key = _ensure_key(sdir)
    pubkey = key.with_suffix(".pub").read_text()

    running = {e["name"] for e in data["nodes"] if supervisor_alive(e["name"], e.get("pid"))}
    if data.get("base") and Path(data["base"]).is_dir() and data["nodes"]:
        # Existing nodes keep the lower layer they were made with.
        base = Path(data["base"])
    else:
        base = ensure_base_dir(ensure_base_tarball(mirror))
        data["base"] = str(base)
        remove_stale_bases({base})

    ensure_bridges()
    st.save_state(data)
    data["proxies"] = ensure_proxies(data, mirror)
    st.save_state(data)

    existing = {e["name"]: e for e in data["nodes"]}
    wanted = max([count] + [st.node_number(name) for name in existing])
    started: list[dict[str, Any]] = []
    for n in range(1, wanted + 1):
        name = st.node_name(n)
        if name in running:
            continue
        if name not in existing and n > count:
            continue
        ndir = st.node_dir(name)
        fresh = not (ndir / "upper").exists()
        if not fresh:
            log(f"{name} is not running; starting it again (its files are kept)")
            stop_nodes([existing.get(name) or {"name": name}], timeout=30)
        if fresh:
            root = mount_root(name, base)
            write_node_config(root, n, wanted, pubkey, mirror)
        pid = start_node(n, base)
        entry = st.node_entry(n, pid)
        existing[name] = entry
        data["nodes"] = list(existing.values())
        st.save_state(data)
        started.append(entry)
        log(f"{name} started (supervisor pid {pid}, {entry['address']})")
    if started:
        wait_ssh(started, key)
        refresh_package_index(started, key)
    log(
        f"up: {len(data['nodes'])} node(s) ready in {time.monotonic() - started_at:.1f} s "
        f"({len(started)} started, {len(running)} already running)"
    )
    return data


def down() -> None:
    """Stop and remove everything the testbed made, except the cached base tarball and the
    apt cache (both in the cache directory)."""
    require_root()
    with _locked():
        _down()


def _down() -> None:
    sdir = st.state_dir()
    data = st.load_state(sdir)
    entries = list((data or {}).get("nodes") or [])
    known = {e["name"] for e in entries}
    nodes_dir = sdir / "nodes"
    if nodes_dir.is_dir():  # nodes that never made it into state.json
        for path in sorted(nodes_dir.iterdir()):
            if path.name not in known:
                entries.append({"name": path.name})
    if data is None and not entries and not sdir.exists():
        log(f"no testbed in {sdir}; nothing to remove")
        return
    # Our long-lived processes (children of the host's init once daemonized), to wait
    # below until init has reaped them, so that nothing of ours is left, not even a zombie.
    ours = [e["pid"] for e in entries if supervisor_alive(e["name"], e.get("pid"))]
    ours += [p["pid"] for n, p in ((data or {}).get("proxies") or {}).items()
             if proxy_running(n, p.get("pid"))]
    stop_nodes(entries)
    remove_disks(data, sdir)
    for entry in entries:
        remove_node(entry["name"])
    if _empty_dir(PROPAGATE_ROOT):
        PROPAGATE_ROOT.rmdir()
    stop_proxies(data)
    if data is not None or link_exists(st.MGMT_BRIDGE) or link_exists(st.FABRIC_BRIDGE):
        remove_bridges()
    if mounts_under(sdir):
        raise TestbedError(f"still mounted under {sdir}: {mounts_under(sdir)}")
    for name in STATE_ENTRIES:
        path = sdir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    if _empty_dir(sdir):
        sdir.rmdir()
    for path in sorted((data or {}).get("created_dirs") or [], key=len, reverse=True):
        _remove_empty_tree(Path(path))
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ours), 10)
    log("down: testbed removed (cache kept in " + str(st.cache_dir()) + ")")


def _missing_dirs(path: Path) -> list[str]:
    """*path* and those of its ancestors that do not exist yet (deepest first)."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(str(path))
        path = path.parent
    return missing


def _remove_empty_tree(path: Path) -> None:
    """Remove *path* and the directories below it, as long as they hold no files."""
    if not path.is_dir() or path.is_symlink() or mounts_under(path):
        return
    for dirpath, _dirs, _files in os.walk(path, topdown=False):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass  # not empty: something else uses it


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def status() -> dict[str, Any]:
    """The testbed as it is now: each node's address, whether its supervisor and nspawn
    are alive and whether it answers SSH, and the proxies.

    ``{"exists": False, ...}`` when there is no testbed. Needs no lock; SSH checks
    need root only to read the key.
    """
    try:
        data = st.load_state()
    except PermissionError as exc:
        raise TestbedError(f"cannot read the testbed state ({exc}); run as root") from exc
    if data is None:
        return {"exists": False, "nodes": [], "proxies": {}}
    nodes = []
    for entry in data["nodes"]:
        name = entry["name"]
        alive = supervisor_alive(name, entry.get("pid"))
        nodes.append({
            **entry,
            "supervisor_alive": alive,
            "nspawn_pid": nspawn_pid(name) if alive else None,
            "cgroups": [str(c) for c in cgroup_dirs(name)],
            "ssh": False,
        })

    def probe(node: dict[str, Any]) -> None:
        node["ssh"] = bool(node["nspawn_pid"]) and ssh_ok(data["ssh_key"], node["address"], 8)

    threads = [threading.Thread(target=probe, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for node in nodes:
        node["running"] = node["supervisor_alive"] and node["ssh"]
    proxies = {
        name: {**entry, "running": proxy_running(name, entry.get("pid"))}
        for name, entry in (data.get("proxies") or {}).items()
    }
    return {**data, "exists": True, "nodes": nodes, "proxies": proxies}
