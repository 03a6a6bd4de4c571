"""The base root filesystem (debootstrap, cached as a tarball) and per-node configuration.

The base is built once per *base key* (image recipe version, suite, package list
and the host's extra CA certificates) and kept as ``base-<suite>-<key>.tar.zst``
under the cache directory, and unpacked once beside it into ``base-<suite>-<key>/``,
the shared (read-only) lower layer of every node's overlayfs. Per-node files are written into the
node's own (upper) layer before it first boots.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from aicluster.testbed import state as st
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.sources import SUITE, Mirror, node_sources
from aicluster.testbed.system import log, mounts_under, run

#: Bump when the recipe below changes, so cached tarballs are rebuilt.
IMAGE_VERSION = 1

BASE_PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "iproute2",
    "ca-certificates",
    "sudo",
    "procps",
    "iputils-ping",
]

HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
BASE_MARKER = ".aicluster-testbed-base"
TAR_OPTS = ["--numeric-owner", "--xattrs", "--xattrs-include=*"]

SSH_KEYGEN_UNIT = """\
[Unit]
Description=Generate this node's SSH host keys (aicluster testbed)
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
RemainAfterExit=yes

[Install]
WantedBy=ssh.service multi-user.target
"""

FABRIC_UNIT = f"""\
[Unit]
Description=Fabric NIC {st.FABRIC_NIC}: stable MAC address, link up (aicluster testbed)
DefaultDependencies=no
Before=network-pre.target systemd-networkd.service
Wants=network-pre.target
ConditionPathExists=/etc/aicluster-testbed/fabric.env
ConditionPathExists=/sys/class/net/{st.FABRIC_NIC}

[Service]
Type=oneshot
RemainAfterExit=yes
EnvironmentFile=/etc/aicluster-testbed/fabric.env
ExecStart=ip link set dev {st.FABRIC_NIC} address ${{FABRIC_MAC}}
ExecStart=ip link set dev {st.FABRIC_NIC} up

[Install]
WantedBy=multi-user.target
"""

#: The testbed's stand-in GPU: a device node (a copy of /dev/null) made at each boot,
#: which the testbed inventory names as the node's one GPU, so a Slurm job asking
#: --gres=gpu:1 is scheduled and sees its allocation. A production node has real ones.
STANDIN_GPU = "/dev/aicluster-standin-gpu0"
STANDIN_GPU_UNIT = f"""\
[Unit]
Description=Stand-in GPU device {STANDIN_GPU} (aicluster testbed; no real GPU here)
DefaultDependencies=no
Before=slurmd.service sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'test -e {STANDIN_GPU} || mknod -m 666 {STANDIN_GPU} c 1 3'

[Install]
WantedBy=sysinit.target
"""

#: No name servers: lookups fail at once instead of timing out (nodes have no DNS;
#: apt and pip reach the registries through the host's proxies, by URL).
RESOLV_CONF = "# aicluster testbed: no DNS; apt and pip use the proxies on the host\n"


def host_ca_files(ca_dir: Path = HOST_CA_DIR) -> list[Path]:
    """The host's extra CA certificates (``*.crt`` under /usr/local/share/ca-certificates)."""
    if not ca_dir.is_dir():
        return []
    return sorted(p for p in ca_dir.rglob("*.crt") if p.is_file())


def base_key(ca_files: list[Path], ca_dir: Path = HOST_CA_DIR) -> str:
    """Cache key of the base image: recipe version, suite, packages and CA certificates."""
    digest = hashlib.sha256(f"{IMAGE_VERSION}\n{SUITE}\n{' '.join(BASE_PACKAGES)}\n".encode())
    for path in ca_files:
        digest.update(str(path.relative_to(ca_dir)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def tarball_path(cache: Path, key: str) -> Path:
    """Where the base tarball with *key* is cached."""
    return cache / f"base-{SUITE}-{key}.tar.zst"


def _safe_path(root: Path, relpath: str) -> Path:
    """*root*/*relpath*, refusing any path that a symlink would lead out of *root*.

    Files of a node image are written from the host, where an absolute symlink
    inside the image would point at the host's own files.
    """
    target = root / relpath.lstrip("/")
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(parent)]) != real_root:
        raise TestbedError(f"{parent} leads outside the node image {root}")
    if target.is_symlink():
        target.unlink()
    return target


def write_file(root: Path, relpath: str, content: str, mode: int = 0o644) -> Path:
    """Write *content* to *relpath* inside image *root* (replacing a symlink there)."""
    target = _safe_path(root, relpath)
    target.write_text(content)
    target.chmod(mode)
    return target


def _unit_path(root: Path, unit: str) -> str:
    for d in ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system"):
        if (root / d / unit).is_file():
            return "/" + d + "/" + unit
    raise TestbedError(f"unit {unit} not found in image {root}")


def parse_install_section(text: str) -> dict[str, list[str]]:
    """The ``[Install]`` section of a unit file: key -> list of (space-separated) values."""
    section = None
    found: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section == "Install" and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).extend(value.split())
    return found


def enable_unit(root: Path, unit: str, _seen: set[str] | None = None) -> list[str]:
    """Enable *unit* in image *root* the way ``systemctl enable`` would, without needing
    systemctl: symlinks for WantedBy/RequiredBy/Alias, recursing into Also.

    Returns the symlinks created (paths relative to *root*).
    """
    seen = _seen if _seen is not None else set()
    if unit in seen:
        return []
    seen.add(unit)
    path = _unit_path(root, unit)
    install = parse_install_section((root / path.lstrip("/")).read_text())
    links = []
    for key, suffix in (("WantedBy", ".wants"), ("RequiredBy", ".requires")):
        for target in install.get(key, []):
            links.append(f"etc/systemd/system/{target}{suffix}/{unit}")
    for alias in install.get("Alias", []):
        links.append(f"etc/systemd/system/{alias}")
    made = []
    for link in links:
        link_path = root / link
        if link_path.is_symlink() and os.readlink(link_path) == path:
            continue
        link_path.parent.mkdir(parents=True, exist_ok=True)
        if link_path.is_symlink() or link_path.exists():
            link_path.unlink()
        link_path.symlink_to(path)
        made.append(link)
    for also in install.get("Also", []):
        made += enable_unit(root, also, seen)
    return made


def prepare_base_root(root: Path, ca_files: list[Path], ca_dir: Path = HOST_CA_DIR) -> None:
    """Turn a fresh debootstrap tree into the shared base of every node."""
    # The host's extra CA certificates (e.g. an egress proxy's), trusted system-wide.
    for src in ca_files:
        dst = _safe_path(root, str(HOST_CA_DIR / src.relative_to(ca_dir)))
        shutil.copyfile(src, dst)
        dst.chmod(0o644)
    if ca_files:
        run(["chroot", str(root), "update-ca-certificates"], timeout=120)
    # Host keys are made on each node's first boot, so every node has its own.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    write_file(root, "etc/systemd/system/aicluster-ssh-keygen.service", SSH_KEYGEN_UNIT)
    write_file(root, "etc/systemd/system/aicluster-testbed-fabric.service", FABRIC_UNIT)
    # An empty machine-id: systemd gives each node its own at boot.
    write_file(root, "etc/machine-id", "", 0o444)
    dbus_id = root / "var/lib/dbus/machine-id"
    if dbus_id.exists() and not dbus_id.is_symlink():
        dbus_id.unlink()
    for unit in (
        "systemd-networkd.service",
        "ssh.service",
        "aicluster-ssh-keygen.service",
        "aicluster-testbed-fabric.service",
    ):
        enable_unit(root, unit)
    write_file(root, "etc/resolv.conf", RESOLV_CONF)
    # debootstrap copies the host's hostname; each node writes its own.
    write_file(root, "etc/hostname", "localhost\n")
    # Downloaded packages are not part of the image.
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    for lst in (root / "var/lib/apt/lists").glob("*"):
        if lst.is_file():
            lst.unlink()


def _rmtree_checked(path: Path) -> None:
    """rm -rf *path*, refusing if anything is mounted below it."""
    if mounts_under(path):
        raise TestbedError(f"refusing to delete {path}: mounts below it: {mounts_under(path)}")
    if path.exists():
        shutil.rmtree(path)


def build_base(mirror: Mirror, tarball: Path, ca_files: list[Path]) -> None:
    """debootstrap the base tree from the host's mirror, customise it, pack it to *tarball*."""
    build = tarball.parent / "build"
    _rmtree_checked(build)
    root = build / "root"
    root.mkdir(parents=True)
    log_path = tarball.parent / "debootstrap.log"
    log(f"building the base image with debootstrap ({SUITE}, {mirror.url}); log: {log_path}")
    start = time.monotonic()
    argv = [
        "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
        SUITE, str(root), mirror.url,
    ]
    for attempt in (1, 2):
        with open(log_path, "w") as out:
            proc = None
            try:
                proc = subprocess.run(
                    argv, stdout=out, stderr=subprocess.STDOUT, timeout=1800,
                    stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                pass
        if proc is not None and proc.returncode == 0:
            break
        tail = log_path.read_text(errors="replace")[-2000:]
        if attempt == 2:
            raise TestbedError(f"debootstrap failed (see {log_path}):\n{tail}")
        log("debootstrap failed; retrying once")
        _rmtree_checked(root)
        root.mkdir(parents=True)
    prepare_base_root(root, ca_files)
    partial = build / tarball.name
    run(["tar", *TAR_OPTS, "-I", "zstd -T0 -3", "-C", str(root), "-cf", str(partial), "."],
        timeout=900)
    os.replace(partial, tarball)
    _rmtree_checked(build)
    log(f"base image built in {time.monotonic() - start:.0f} s: {tarball} "
        f"({tarball.stat().st_size / 1e6:.0f} MB)")


def ensure_base_tarball(mirror: Mirror) -> Path:
    """The cached base tarball for the current key, built first if missing.
    Tarballs of other keys are deleted once a new one is built."""
    cache = st.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    ca_files = host_ca_files()
    tarball = tarball_path(cache, base_key(ca_files))
    if not tarball.exists():
        build_base(mirror, tarball, ca_files)
    return tarball


def ensure_base_dir(tarball: Path) -> Path:
    """The unpacked base (lower layer of every node) for *tarball*, kept beside it in the
    cache directory: ``base-<suite>-<key>/``. Unpacked only if missing."""
    base = tarball.with_name(tarball.name.removesuffix(".tar.zst"))
    marker = base / BASE_MARKER
    if marker.exists() and marker.read_text().strip() == tarball.name:
        return base
    partial = base.with_name(base.name + ".partial")
    _rmtree_checked(partial)
    partial.mkdir(parents=True)
    start = time.monotonic()
    run(["tar", *TAR_OPTS, "-I", "zstd", "-C", str(partial), "-xf", str(tarball)], timeout=600)
    (partial / BASE_MARKER).write_text(tarball.name + "\n")
    _rmtree_checked(base)
    os.replace(partial, base)
    log(f"unpacked {tarball.name} in {time.monotonic() - start:.1f} s")
    return base


def remove_stale_bases(keep: set[Path]) -> None:
    """Delete cached tarballs and unpacked bases other than those in *keep* (and their
    tarballs), e.g. after the base key changed. Never touches a mounted tree."""
    cache = st.cache_dir()
    keep_names = {p.name.removesuffix(".tar.zst") for p in keep}
    for path in cache.glob(f"base-{SUITE}-*"):
        if path.name.removesuffix(".tar.zst").removesuffix(".partial") in keep_names:
            continue
        if path.is_dir():
            if not mounts_under(path):
                shutil.rmtree(path)
        else:
            path.unlink()


def hosts_file(n: int, count: int) -> str:
    """``/etc/hosts`` of node *n*: localhost, and every testbed node up to *count*."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for i in range(1, max(count, n) + 1):
        lines.append(f"{st.management_address(i)}\t{st.node_name(i)}")
    return "\n".join(lines) + "\n"


def host0_network(n: int) -> str:
    """systemd-networkd config of the management NIC: static address, default route via the
    host (which does not forward, so nothing leaves the bridge)."""
    return (
        "[Match]\nName=host0\n\n[Network]\n"
        f"Address={st.management_address(n)}/24\nGateway={st.HOST_ADDRESS}\n"
        "LinkLocalAddressing=no\nIPv6AcceptRA=no\n"
    )


def apt_proxy_conf() -> str:
    """``/etc/apt/apt.conf.d/01aicluster-proxy``."""
    return f'Acquire::http::Proxy "{st.PACKAGE_PROXY}";\n'


def apt_retry_conf() -> str:
    """``/etc/apt/apt.conf.d/02aicluster-retries``: no apt operation hangs forever."""
    return 'Acquire::Retries "3";\nAcquire::http::Timeout "60";\n'


def pip_conf() -> str:
    """``/etc/pip.conf``."""
    return f"[global]\nproxy = {st.PIP_PROXY}\n"


def write_node_config(root: Path, n: int, count: int, pubkey: str, mirror: Mirror) -> None:
    """Write node *n*'s own files into its (mounted, not yet booted) root."""
    name = st.node_name(n)
    write_file(root, "etc/hostname", name + "\n")
    write_file(root, "etc/hosts", hosts_file(n, count))
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    write_file(root, "root/.ssh/authorized_keys", pubkey.strip() + "\n", 0o600)
    write_file(root, "etc/systemd/network/10-aicluster-host0.network", host0_network(n))
    write_file(root, "etc/aicluster-testbed/fabric.env", f"FABRIC_MAC={st.fabric_mac(n)}\n")
    write_file(root, "etc/apt/apt.conf.d/01aicluster-proxy", apt_proxy_conf())
    write_file(root, "etc/apt/apt.conf.d/02aicluster-retries", apt_retry_conf())
    write_file(root, "etc/apt/sources.list", "# see sources.list.d/debian.sources\n")
    write_file(root, "etc/apt/sources.list.d/debian.sources", node_sources(mirror))
    write_file(root, "etc/pip.conf", pip_conf())
    write_file(root, "etc/systemd/system/aicluster-testbed-standin-gpu.service", STANDIN_GPU_UNIT)
    link = _safe_path(root, "etc/systemd/system/sysinit.target.wants/"
                      "aicluster-testbed-standin-gpu.service")
    if not link.is_symlink():
        link.symlink_to("/etc/systemd/system/aicluster-testbed-standin-gpu.service")
