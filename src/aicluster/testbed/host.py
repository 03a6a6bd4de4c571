"""Host preparation: root check, the packages the testbed needs, and a preflight check."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from aicluster.testbed.errors import TestbedError
from aicluster.testbed.system import log, run, run_retry

#: Debian package -> a program it provides (used only for the error message).
HOST_PACKAGES: dict[str, str] = {
    "debootstrap": "debootstrap",
    "systemd-container": "systemd-nspawn",
    "apt-cacher-ng": "apt-cacher-ng",
    "tinyproxy": "tinyproxy",
    "iproute2": "ip",
    "openssh-client": "ssh",
    "zstd": "zstd",
    "debian-archive-keyring": "",
    "ca-certificates": "update-ca-certificates",
}

APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
APT_OPTS = ["-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")

CGROUP_ROOT = Path("/sys/fs/cgroup")


def require_root() -> None:
    """Raise unless running as root (bridges, mounts, cgroups and nspawn need it)."""
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (it creates bridges, mounts and containers)")


def missing_packages(packages: list[str]) -> list[str]:
    """Which of *packages* dpkg does not have installed."""
    missing = []
    for pkg in packages:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", pkg],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0 or not proc.stdout.endswith(" installed"):
            missing.append(pkg)
    return missing


def ensure_host_packages() -> None:
    """Install the host packages the testbed needs (only those missing) with apt-get.

    Package services are not started (a ``policy-rc.d`` that denies starts is put
    in place for the install if the host has none): the testbed runs its own
    apt-cacher-ng and tinyproxy instances with its own configuration.
    """
    if shutil.which("dpkg-query") is None or shutil.which("apt-get") is None:
        raise TestbedError("the testbed needs a Debian host (dpkg and apt-get)")
    missing = missing_packages(list(HOST_PACKAGES))
    if not missing:
        return
    log(f"installing host packages: {' '.join(missing)}")
    ours = not POLICY_RC_D.exists()
    if ours:
        POLICY_RC_D.write_text("#!/bin/sh\n# aicluster testbed: no service starts\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        run_retry(["apt-get", "update"], timeout=300, attempts=3, env=APT_ENV)
        run_retry(
            ["apt-get", "install", "-y", "--no-install-recommends", *APT_OPTS, *missing],
            timeout=900, attempts=3, env=APT_ENV,
        )
    finally:
        if ours:
            POLICY_RC_D.unlink(missing_ok=True)
    still = missing_packages(missing)
    if still:
        raise TestbedError(f"host packages still missing after apt-get: {' '.join(still)}")


def cgroup_hierarchies(root: Path = CGROUP_ROOT) -> list[Path]:
    """The cgroup hierarchies a node gets its own directory in.

    On a cgroup v1/hybrid host: the ``systemd`` named hierarchy and the ``unified``
    (v2) one, whichever exist. On a pure cgroup v2 host: the root itself.
    """
    found = [root / name for name in ("systemd", "unified") if (root / name).is_dir()]
    if not found and (root / "cgroup.controllers").exists():
        found = [root]
    return found


def check_host() -> None:
    """Raise :class:`TestbedError` when systemd-nspawn nodes cannot work on this host."""
    problems = []
    try:
        run(["systemd-nspawn", "--version"], timeout=30)
    except TestbedError as exc:
        problems.append(f"systemd-nspawn does not run: {exc.message}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        problems.append("the kernel has no overlayfs")
    if not cgroup_hierarchies():
        problems.append(
            "no usable cgroup hierarchy (need /sys/fs/cgroup/systemd, /sys/fs/cgroup/unified "
            "or a cgroup v2 mount at /sys/fs/cgroup)"
        )
    for ns in ("net", "pid", "mnt", "uts", "ipc"):
        if not Path(f"/proc/self/ns/{ns}").exists():
            problems.append(f"the kernel has no {ns} namespaces")
    if not Path("/sys/class/net").is_dir():
        problems.append("/sys/class/net is missing")
    if problems:
        raise TestbedError(
            "systemd-nspawn cannot work on this host:\n  " + "\n  ".join(problems)
        )
