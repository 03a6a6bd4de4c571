"""The package proxies on the management bridge: apt-cacher-ng (apt) and tinyproxy (pip).

Both are started as our own processes, with our own configuration under the state
directory, bound to the bridge address only, and recorded by pid; the packaged
system services are never used. apt-cacher-ng's cache lives under the cache
directory so it survives ``down``/``up``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aicluster.testbed import state as st
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.sources import Mirror, node_url
from aicluster.testbed.system import (
    log,
    pid_matches,
    read_pid,
    spawn_daemon,
    stop_pids,
    tcp_open,
    wait_until,
)

ACNG = "apt-cacher-ng"
TINYPROXY = "tinyproxy"


def _merge_key(url: str) -> str:
    """``http://host/path`` -> ``host/path`` (apt-cacher-ng's URL prefix form)."""
    parts = urlsplit(url)
    return f"{parts.netloc}{parts.path.rstrip('/')}"


def acng_config(mirror: Mirror, cache: Path, run_dir: Path) -> str:
    """apt-cacher-ng configuration: bound to the bridge address, each repository of the
    host's mirror remapped to itself as the backend (the packaged default backend fails)."""
    lines = [
        "# aicluster testbed apt-cacher-ng instance (generated; not the system service)",
        f"CacheDir: {cache}",
        f"LogDir: {run_dir / 'log'}",
        "SupportDir: /usr/lib/apt-cacher-ng",
        f"Port: {st.APT_PROXY_PORT}",
        f"BindAddress: {st.HOST_ADDRESS}",
        f"SocketPath: {run_dir / 'socket'}",
        f"PidFile: {run_dir / 'acng.pid'}",
        "ForeGround: 1",
        "ReportPage: acng-report.html",
        "ExThreshold: 4",
        "NetworkTimeout: 60",
        "FollowIndexFileRemoval: 1",
        "UnbufferLogs: 1",
    ]
    for index, url in enumerate(mirror.repositories):
        merge = {_merge_key(url), _merge_key(node_url(url))}
        lines.append(f"Remap-aicl{index}: {' '.join(sorted(merge))} ; {url.rstrip('/')}/")
    return "\n".join(lines) + "\n"


def tinyproxy_config() -> str:
    """tinyproxy configuration: bridge address only, clients from the management subnet,
    HTTPS via CONNECT to port 443 (pip)."""
    return "\n".join(
        [
            "# aicluster testbed tinyproxy instance (generated; not the system service)",
            "User nobody",
            "Group nogroup",
            f"Port {st.PIP_PROXY_PORT}",
            f"Listen {st.HOST_ADDRESS}",
            "Timeout 600",
            "LogLevel Notice",
            "MaxClients 100",
            f"Allow {st.MGMT_SUBNET}",
            "ConnectPort 443",
            "DisableViaHeader Yes",
            "",
        ]
    )


def _dirs(base: Path | None = None) -> tuple[Path, Path]:
    root = base or st.state_dir()
    return root / "proxies" / ACNG, root / "proxies" / TINYPROXY


def proxy_running(name: str, pid: int | None, base: Path | None = None) -> bool:
    """True when *pid* is our instance of proxy *name* (checked by its command line)."""
    acng_dir, tiny_dir = _dirs(base)
    conf = acng_dir if name == ACNG else tiny_dir / "tinyproxy.conf"
    return pid_matches(pid, name, str(conf))


def ensure_proxies(data: dict[str, Any], mirror: Mirror) -> dict[str, Any]:
    """Start whichever of our proxies is not running; return the ``proxies`` state entry."""
    acng_dir, tiny_dir = _dirs()
    proxies: dict[str, Any] = dict(data.get("proxies") or {})

    acng = shutil.which(ACNG) or "/usr/sbin/apt-cacher-ng"
    tiny = shutil.which(TINYPROXY) or "/usr/bin/tinyproxy"
    for name, binary in ((ACNG, acng), (TINYPROXY, tiny)):
        pid = (proxies.get(name) or {}).get("pid")
        if proxy_running(name, pid):
            continue
        port = st.APT_PROXY_PORT if name == ACNG else st.PIP_PROXY_PORT
        if tcp_open(st.HOST_ADDRESS, port, timeout=0.5):
            raise TestbedError(
                f"{st.HOST_ADDRESS}:{port} is already in use by a process the testbed "
                f"did not start; stop it first"
            )
        if name == ACNG:
            cache = st.cache_dir() / ACNG
            cache.mkdir(parents=True, exist_ok=True)
            (acng_dir / "log").mkdir(parents=True, exist_ok=True)
            (acng_dir / "acng.conf").write_text(acng_config(mirror, cache, acng_dir))
            argv = [binary, "-c", str(acng_dir)]
            log_path = acng_dir / "log" / "stdout.log"
        else:
            tiny_dir.mkdir(parents=True, exist_ok=True)
            conf = tiny_dir / "tinyproxy.conf"
            conf.write_text(tinyproxy_config())
            argv = [binary, "-d", "-c", str(conf)]
            log_path = tiny_dir / "tinyproxy.log"
        pid = spawn_daemon(argv, log_path, log_path.parent / "daemon.pid")
        if not wait_until(lambda p=port: tcp_open(st.HOST_ADDRESS, p, 0.5), 20):
            tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
            stop_pids([pid], 5)
            raise TestbedError(f"{name} did not start listening on port {port}:\n{tail}")
        log(f"{name} listening on {st.HOST_ADDRESS}:{port} (pid {pid})")
        proxies[name] = {"pid": pid, "address": f"http://{st.HOST_ADDRESS}:{port}"}
    return proxies


def stop_proxies(data: dict[str, Any] | None) -> None:
    """Stop the proxy processes recorded in *data* (only if they are still ours)."""
    acng_dir, tiny_dir = _dirs()
    pidfiles = {ACNG: acng_dir / "log" / "daemon.pid", TINYPROXY: tiny_dir / "daemon.pid"}
    pids = set()
    for name, pidfile in pidfiles.items():
        entry = ((data or {}).get("proxies") or {}).get(name) or {}
        for pid in (entry.get("pid"), read_pid(pidfile)):
            if proxy_running(name, pid):
                pids.add(pid)
    if pids:
        stop_pids(pids, timeout=10)
