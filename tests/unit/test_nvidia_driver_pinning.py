"""The driver installer's `install` and `pin` from branch 590 on
(roles/nvidia/templates/aicluster-nvidia-driver.j2 with roles/nvidia/vars/Debian.yml), run
here with STAND-IN apt-cache, apt-get, apt-mark, dpkg-query, modinfo, uname and systemctl
on PATH: NVIDIA's pinning package goes in first, in an apt run of its own (apt resolves the
driver with its preferences file in place), the exact version's where the repository has
one, else the branch's; with neither, nothing of the driver is installed. The stand-ins
record the commands; no package is installed and no real repository is read."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from aicluster.render import defaults, os_vars, render

VERSION = "590.48.01"
PIN_BRANCH = "nvidia-driver-pinning-590"
PIN_VERSION = f"nvidia-driver-pinning-{VERSION}"


#: What the Debian archive (main and contrib) has beside NVIDIA's repository: the running
#: kernel's headers, contrib's glx-alternative-nvidia.
ARCHIVE = ["linux-headers-6.8.0-45-generic", "glx-alternative-nvidia"]


def _run(tmp_path: Path, known: list[str], *args: str, archive: list[str] = ARCHIVE,
         distro: str = "debian") -> tuple[subprocess.CompletedProcess, list[str]]:
    v = {**defaults("nvidia"), **os_vars("nvidia", "Debian"), "inventory_hostname": "gpu1",
         "nvidia_driver_branch": "590", "nvidia_driver_version": VERSION,
         "nvidia_expected_gpus": 8}
    script = tmp_path / "aicluster-nvidia-driver"
    script.write_text(render("nvidia", "aicluster-nvidia-driver.j2", v))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "awk", "sed", "head", "grep", "cat", "printf"):
        if shutil.which(tool):
            (bindir / tool).symlink_to(shutil.which(tool))
    log = tmp_path / "log"
    module = tmp_path / "module-version"
    (tmp_path / "repository").write_text("".join(f"{p}\n" for p in [*known, *archive]))
    (tmp_path / "os-release").write_text(f"ID={distro}\n")
    sh = shutil.which("sh")
    stubs = {
        # The repository knows the packages listed in `repository`.
        "apt-cache": f'[ "$1" = show ] && grep -qx "$2" {tmp_path}/repository',
        # Installing the driver's meta package builds the module (modinfo answers then).
        "apt-get": (f'echo "apt-get $*" >> {log}\n'
                    f'case " $* " in *" nvidia-open "*) echo {VERSION} > {module} ;; esac'),
        "apt-mark": f'echo "apt-mark $*" >> {log}',
        "modinfo": f'[ -s {module} ] && cat {module} || true',
        "dpkg-query": (f'case "$*" in *Status-Abbrev*) [ -s {module} ] && printf '
                       f'"ii nvidia-open {VERSION}-1ubuntu1\\nii nvidia-fabricmanager '
                       f'{VERSION}-1ubuntu1\\n" ;; *) echo {VERSION}-1ubuntu1 ;; esac'),
        "uname": 'echo 6.8.0-45-generic',
        "systemctl": "true",
    }
    for tool, body in stubs.items():
        (bindir / tool).write_text(f"#!{sh}\n{body}\n")
        (bindir / tool).chmod(0o755)
    proc = subprocess.run([str(bindir / "sh"), str(script), *args], capture_output=True,
                          text=True, timeout=60, env={
                              "PATH": str(bindir),
                              "AICLUSTER_OS_RELEASE": str(tmp_path / "os-release")})
    return proc, (log.read_text().splitlines() if log.exists() else [])


def _installed(calls: list[str]) -> list[str]:
    """The packages of each `apt-get install` run, one entry per run."""
    return [" ".join(w for w in c.split() if not w.startswith("-") and "=" not in w
                     and w not in ("apt-get", "install"))
            for c in calls if c.startswith("apt-get ")]


INSTALL = ("install", "--pinning", PIN_VERSION, "--pinning", PIN_BRANCH,
           "--fabric-manager", "nvidia-fabricmanager", "--fabric-manager", "libnvidia-nscq",
           "nvidia-open")


def test_the_branchs_pinning_package_goes_in_alone_before_the_driver(tmp_path):
    """The repository has no pinning package for the exact version: the branch's is
    installed, in an apt run of its own, before the kernel headers and the driver."""
    proc, calls = _run(tmp_path, [PIN_BRANCH, "nvidia-open"], *INSTALL)
    assert proc.returncode == 0, proc.stderr
    # Fabric Manager and NSCQ after the driver, in one run, each checked at its version.
    assert _installed(calls) == [PIN_BRANCH, "linux-headers-6.8.0-45-generic", "nvidia-open",
                                 "nvidia-fabricmanager libnvidia-nscq"], calls
    assert f"gpu1: NVIDIA's pinning package {PIN_BRANCH} installed" in proc.stdout
    assert f"gpu1: driver {VERSION} installed" in proc.stdout
    assert f"gpu1: nvidia-fabricmanager libnvidia-nscq {VERSION} installed" in proc.stdout
    # Held at the driver's version afterwards (the names without the branch).
    assert calls[-1] == "apt-mark hold nvidia-open nvidia-fabricmanager", calls


def test_the_exact_versions_pinning_package_where_the_repository_has_one(tmp_path):
    proc, calls = _run(tmp_path, [PIN_VERSION, PIN_BRANCH], *INSTALL)
    assert proc.returncode == 0, proc.stderr
    assert _installed(calls)[0] == PIN_VERSION


def test_no_pinning_package_in_the_repository_installs_nothing_of_the_driver(tmp_path):
    proc, calls = _run(tmp_path, ["nvidia-open"], *INSTALL)
    assert proc.returncode == 1
    assert (f"gpu1: none of {PIN_VERSION} {PIN_BRANCH} is in the repository (apt-cache "
            f"show): does NVIDIA's CUDA repository (or its mirror) have driver {VERSION}?"
            in proc.stderr)
    assert _installed(calls) == []


def test_pin_alone(tmp_path):
    proc, calls = _run(tmp_path, [PIN_BRANCH], "pin", PIN_VERSION, PIN_BRANCH)
    assert proc.returncode == 0, proc.stderr
    assert _installed(calls) == [PIN_BRANCH]


def test_the_running_kernels_headers_missing_stops_before_anything_changes(tmp_path):
    """Debian dropped the running kernel's packages at a point release: nothing is
    installed or released, and the message says to upgrade the kernel first."""
    proc, calls = _run(tmp_path, [PIN_BRANCH, "nvidia-open"], *INSTALL,
                       archive=["glx-alternative-nvidia"])
    assert proc.returncode == 1
    assert calls == []
    assert "gpu1: the headers of the running kernel 6.8.0-45-generic" in proc.stderr
    assert "upgrade the kernel" in proc.stderr


def test_debian_without_contrib_stops_before_anything_changes(tmp_path):
    """NVIDIA's Debian packages depend on contrib's (NVIDIA's instructions add contrib):
    without it nothing is installed, and the message says to add it. Ubuntu has no such
    area: the same sources pass there."""
    proc, calls = _run(tmp_path, [PIN_BRANCH, "nvidia-open"], *INSTALL,
                       archive=["linux-headers-6.8.0-45-generic"])
    assert proc.returncode == 1 and calls == []
    assert "gpu1: Debian's contrib area is not in the apt sources" in proc.stderr
    assert "add-apt-repository contrib" in proc.stderr
    (tmp_path / "ubuntu").mkdir()
    proc, calls = _run(tmp_path / "ubuntu", [PIN_BRANCH, "nvidia-open"], *INSTALL,
                       archive=["linux-headers-6.8.0-45-generic"], distro="ubuntu")
    assert proc.returncode == 0, proc.stderr
