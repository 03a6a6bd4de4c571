"""STAND-IN dcgm-exporter package for the end-to-end tests: "stand-in dcgm-exporter
(not NVIDIA's)".

NVIDIA ships dcgm-exporter as ``datacenter-gpu-manager-exporter`` in its CUDA
repository; the testbed has neither a GPU nor that repository. :func:`build` makes a
stand-in ``datacenter-gpu-manager-exporter`` .deb, at the version the monitoring role
pins by default (``monitoring_dcgm_exporter_version``) so the production path's pinned
install resolves it, with no dependency on DCGM (the real one depends on
datacenter-gpu-manager-4-core), holding:

- ``/usr/bin/dcgm-exporter``: ``dcgm_exporter_bin.py`` beside this file (a standard-
  library HTTP server taking the flags aicluster's command line passes and serving a
  captured exposition, see its docstring);
- ``/usr/share/aicluster-standin-dcgm/<state>.prom``: the fixtures of
  tests/fixtures/monitoring/dcgm (``healthy``, ``ecc-dbe-xid79``);
- ``/lib/systemd/system/nvidia-dcgm-exporter.service``: a unit named and started as
  NVIDIA's packaged one (its ExecStart, which aicluster's drop-in replaces);

and a flat apt repository around it (``Packages`` and ``Release`` written here).
:func:`node_commands` gives the shell commands that put that repository on a node
(``deb [trusted=yes] file:...``, read by apt at once) and set the stand-in's state;
:func:`install_repo` runs them on every testbed node; :func:`set_state` flips a node's
state (read at each scrape) with one ssh command.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from aicluster.render import default_value
from tests.e2e.standins import BANNER

WHAT = "stand-in dcgm-exporter (not NVIDIA's)"
PACKAGE = "datacenter-gpu-manager-exporter"
#: The version the monitoring role pins by default: the stand-in must carry it.
VERSION = str(default_value("monitoring", "monitoring_dcgm_exporter_version"))
SCRIPT = Path(__file__).with_name("dcgm_exporter_bin.py")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "monitoring" / "dcgm"
STATES = ("healthy", "ecc-dbe-xid79")
#: Where a node keeps the repository, the apt source naming it, and the state file.
REPO_ON_NODE = "/opt/aicluster-standin-dcgm"
SOURCE_ON_NODE = "/etc/apt/sources.list.d/aicluster-standin-dcgm.list"
STATE_FILE = "/etc/aicluster-standin-dcgm/state"
#: Fixed file times in the package, so the same inputs give the same .deb.
EPOCH = "1700000000"

UNIT = """\
# STAND-IN for NVIDIA's nvidia-dcgm-exporter.service (tests/e2e/standins/dcgm.py): the
# same name and ExecStart; aicluster's drop-in replaces the ExecStart.
[Unit]
Description=STAND-IN dcgm-exporter (not NVIDIA's)
Wants=nvidia-dcgm.service
After=nvidia-dcgm.service

[Service]
User=root
ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""


def banner() -> str:
    return BANNER.format(what=WHAT)


def script(version: str = VERSION) -> str:
    text = SCRIPT.read_text()
    text, n = re.subn(r'^VERSION = "unset"$', f"VERSION = {json.dumps(version + '-standin')}",
                      text, count=1, flags=re.M)
    assert n == 1, f"{SCRIPT} has no VERSION line to set"
    return text


def _write(root: Path, path: str, text: str | bytes, mode: int = 0o644) -> None:
    dest = root / path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    dest.write_bytes(text)
    dest.chmod(mode)


def deb(directory: Path, version: str = VERSION) -> Path:
    """The stand-in .deb, built with dpkg-deb in ``directory``."""
    if not shutil.which("dpkg-deb"):
        raise RuntimeError("dpkg-deb is needed to build the stand-in dcgm-exporter package")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pkg"
        _write(root, "DEBIAN/control", (
            f"Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\n"
            "Maintainer: aicluster tests <tests@aicluster.invalid>\nDepends: python3\n"
            f"Description: {WHAT}\n"
            " A STAND-IN for NVIDIA's dcgm-exporter package, made by\n"
            " tests/e2e/standins/dcgm.py for the end-to-end tests: a small Python HTTP\n"
            " server serving captured DCGM metrics. Not dcgm-exporter.\n"))
        _write(root, "usr/bin/dcgm-exporter", script(version), 0o755)
        _write(root, "lib/systemd/system/nvidia-dcgm-exporter.service", UNIT)
        for state in STATES:
            _write(root, f"usr/share/aicluster-standin-dcgm/{state}.prom",
                   (FIXTURES / f"{state}.prom").read_bytes())
        _write(root, "usr/share/doc/datacenter-gpu-manager-exporter/README.stand-in",
               f"{WHAT} {version}: tests/e2e/standins/dcgm.py, not NVIDIA's package.\n")
        for path in sorted(root.rglob("*"), reverse=True):
            os.utime(path, (int(EPOCH), int(EPOCH)))
        out = Path(directory) / f"{PACKAGE}_{version}_all.deb"
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root),
                        str(out)], check=True, capture_output=True,
                       env={**os.environ, "SOURCE_DATE_EPOCH": EPOCH})
    return out


def _control(path: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(path)], check=True, capture_output=True,
                          text=True).stdout.strip()


def build(directory: Path, version: str = VERSION) -> Path:
    """A flat apt repository in ``directory`` holding the stand-in package (its
    ``Packages`` and ``Release`` written here); returns ``directory``."""
    directory = Path(directory)
    package = deb(directory, version)
    data = package.read_bytes()
    packages = (f"{_control(package)}\nFilename: ./{package.name}\nSize: {len(data)}\n"
                f"MD5sum: {hashlib.md5(data).hexdigest()}\n"  # noqa: S324 (apt's index)
                f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n")
    (directory / "Packages").write_text(packages)
    raw = packages.encode()
    (directory / "Release").write_text(
        "Origin: aicluster-standin\nLabel: STAND-IN dcgm-exporter (tests only)\n"
        "Suite: standin\nCodename: standin\nArchitectures: all\n"
        "Date: Tue, 14 Nov 2023 22:13:20 UTC\n"
        f"MD5Sum:\n {hashlib.md5(raw).hexdigest()} {len(raw)} Packages\n"  # noqa: S324
        f"SHA256:\n {hashlib.sha256(raw).hexdigest()} {len(raw)} Packages\n")
    return directory


def _put(path: str, data: bytes, mode: str = "0644") -> str:
    encoded = base64.b64encode(data).decode()
    return (f"mkdir -p {shlex.quote(str(Path(path).parent))} && echo {encoded} | base64 -d "
            f"> {shlex.quote(path)} && chmod {mode} {shlex.quote(path)}")


def node_commands(repo: Path, state: str = "healthy") -> list[str]:
    """Shell commands (each for one ssh) that put the repository on a node, name it to
    apt and read its index at once (only this source: the deploy's own apt update may
    be skipped as fresh), and set the stand-in's state."""
    repo = Path(repo)
    cmds = [f"rm -rf {REPO_ON_NODE} && mkdir -p {REPO_ON_NODE}"]
    for path in sorted(repo.iterdir()):
        cmds.append(_put(f"{REPO_ON_NODE}/{path.name}", path.read_bytes()))
    cmds.append(_put(SOURCE_ON_NODE, (
        f"# {WHAT}: tests/e2e/standins/dcgm.py (tests only)\n"
        f"deb [trusted=yes] file:{REPO_ON_NODE} ./\n").encode()))
    cmds.append(f"apt-get update -o Dir::Etc::sourcelist={SOURCE_ON_NODE} "
                "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0")
    cmds.append(set_state_command(state))
    return cmds


def set_state_command(state: str) -> str:
    if state not in STATES:
        raise ValueError(f"{state!r}: the stand-in's states are {', '.join(STATES)}")
    return _put(STATE_FILE, f"{state}\n".encode())


def install_repo(testbed, repo: Path, nodes: list[str] | None = None) -> None:
    """Put the stand-in repository on ``nodes`` (every testbed node by default)."""
    for name in nodes or [n["name"] for n in testbed.nodes]:
        for command in node_commands(repo):
            testbed.ssh(name, command)


def set_state(testbed, node: str, state: str) -> None:
    """Flip what a node's stand-in serves from its next scrape on."""
    testbed.ssh(node, set_state_command(state))
