"""The nvidia and slurm package plans resolved by apt against the real Debian 12 archive,
in a node of the lab in miniature (shared with the other ``test_lab*.py`` modules).

The GPU paths cannot run here (no GPU), but what apt would install can be checked for
real: node1 reads Debian 12's indexes with contrib, non-free and non-free-firmware
added, through the testbed's package cache, into a private apt state under /tmp
(``Dir::State::Lists``, ``Dir::Cache``, the sources and the pins: the node's own apt
configuration is not touched), lays the deploy's own pin files over them (rendered from
roles/nvidia and roles/slurm, as both engines write them), and asks ``apt-get install
-s`` for the packages the deploys install:

- nvidia, ``nvidia_source: distribution`` on Debian 12 (branch 535, the one Debian
  ships): ``nvidia-open-kernel-dkms nvidia-driver nvidia-smi`` resolve with the pin, and
  what they depend on at their exact version (``firmware-nvidia-gsp``,
  ``nvidia-driver-libs``, ``libgl1-nvidia-glvnd-glx`` ...) is at the branch (issue 21's
  first item);
- slurm, pinned at ``slurm_version`` 22.05.8: the controller's, the workers' and the
  database daemon's packages resolve at that version.

NVIDIA's own CUDA repository cannot be reached from these machines: the same pin is
resolved against a captured index in tests/unit/test_nvidia_apt_pin.py.
"""

from __future__ import annotations

import re
import shlex

import pytest

from aicluster.render import os_vars, render
from tests.e2e.conftest import Lab

STATE = "/tmp/aicluster-archive-check"
#: apt with a private state: the node's own lists, cache, sources and pins untouched
#: (its proxy configuration, apt.conf.d, still applies); an empty package status, so
#: that apt plans as for a fresh node, whatever the lab installed.
APT = (f"apt-get -o Dir::State::Lists={STATE}/lists -o Dir::Cache={STATE}/cache "
       f"-o Dir::State::status={STATE}/status "
       f"-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts={STATE}/sources "
       f"-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts={STATE}/pins "
       "-o Acquire::Retries=3 -q")
#: Debian 12's branch (its non-free nvidia-graphics-drivers).
DEBIAN_BRANCH = "535"
SLURM_VERSION = "22.05.8"
#: Packages the Debian 12 driver depends on at its exact version (Depends: ... (= V)).
EXACT = ("nvidia-driver-libs", "nvidia-driver-bin", "xserver-xorg-video-nvidia",
         "nvidia-vdpau-driver", "nvidia-alternative", "firmware-nvidia-gsp",
         "libgl1-nvidia-glvnd-glx", "nvidia-egl-icd")


def _pin(component: str, template: str, **values) -> str:
    return render(component, template, {**os_vars(component, "Debian"), **values})


@pytest.fixture
def archive(lab: Lab):
    """node1's private apt state over Debian 12 with contrib and non-free, both pins in
    (made by the first test that asks; it stays in the node's /tmp, which the lab's
    teardown takes away with the node)."""
    node = lab.nodes[0]["name"]
    pins = {
        "aicluster-nvidia": _pin("nvidia", "aicluster-nvidia.pref.j2",
                                 nvidia_driver_version=None,
                                 nvidia_driver_branch=DEBIAN_BRANCH),
        "aicluster-slurm": _pin("slurm", "aicluster-slurm.pref.j2",
                                slurm_version=SLURM_VERSION),
    }
    setup = [f"rm -rf {STATE}",
             f"mkdir -p {STATE}/lists/partial {STATE}/cache/archives/partial "
             f"{STATE}/sources {STATE}/pins",
             f": > {STATE}/status",
             # The node's own Debian sources, with the other components added.
             "sed -E 's/^Components: .*$/Components: main contrib non-free "
             f"non-free-firmware/' /etc/apt/sources.list.d/debian.sources "
             f"> {STATE}/sources/debian.sources"]
    setup += [f"printf '%s' {shlex.quote(text)} > {STATE}/pins/{name}"
              for name, text in pins.items()]
    if lab.ssh(node, f"ls {STATE}/lists 2>/dev/null | grep -c _Packages || true").strip() \
            in ("", "0"):
        lab.ssh(node, " && ".join(setup))
        lab.ssh(node, f"timeout 600 {APT} update >/dev/null")
    return lab, node


def _simulate(lab: Lab, node: str, packages: list[str]) -> dict[str, str]:
    """``apt-get install -s`` of *packages*: every package apt would install -> its
    version (the command must succeed: a plan that does not resolve fails here)."""
    out = lab.ssh(node, f"DEBIAN_FRONTEND=noninteractive {APT} install -s "
                        + " ".join(packages))
    return dict(re.findall(r"^Inst (\S+) (?:\[\S+\] )?\((\S+)", out, re.M))


def test_debian_nvidia_driver_resolves_at_its_branch_with_the_pin(archive):
    """The packages the deploy installs for Debian's own driver, as it decides them for
    an H100 node (``nvidia_open_kernel_modules: auto``: the proprietary modules on
    Debian, whose open ones lag behind the driver's security updates)."""
    from aicluster.components.nvidia.derive import decide
    from aicluster.render import defaults

    lab, node = archive
    v = {**defaults("nvidia"), **os_vars("nvidia", "Debian"), "nvidia_source": "distribution",
         "nvidia_driver_branch": DEBIAN_BRANCH, "nvidia_expected_gpus": 1,
         "nvidia_gpu_model": "H100-PCIE-80GB", "nvidia_gpu_vendor": "nvidia",
         "nvidia_nvswitch_declared": False, "nvidia_ib_declared": False}
    decided = decide(v, {"pci_gpus": [{"address": "0000:18:00.0", "device": "0x2331"}]},
                     node, "debian")
    assert decided["action"] == "install", decided
    packages = decided["packages"]
    assert packages == ["nvidia-kernel-dkms", "nvidia-driver", "nvidia-smi"], packages
    plan = _simulate(lab, node, packages)
    print(f"apt would install {len(plan)} packages; the driver's: "
          f"{ {p: v for p, v in plan.items() if 'nvidia' in p or 'cuda' in p} }")
    for package in packages:
        assert plan.get(package, "").startswith(f"{DEBIAN_BRANCH}."), (package, plan)
    # What the driver and its modules depend on at their exact version (Debian 12's
    # index: nvidia-driver, nvidia-driver-libs, nvidia-open-kernel-dkms), at the branch.
    for package in EXACT:
        assert plan.get(package, "").startswith(f"{DEBIAN_BRANCH}."), (package, plan)


def test_slurm_packages_resolve_at_the_pinned_version(archive):
    lab, node = archive
    debian = os_vars("slurm", "Debian")
    packages = [*debian["slurm_munge_packages"], *debian["slurm_common_packages"],
                *debian["slurm_controller_packages"], *debian["slurm_worker_packages"],
                *debian["slurm_dbd_packages"]]
    plan = _simulate(lab, node, packages)
    slurm = {p: v for p, v in plan.items() if re.match(r"^(slurm|libslurm|libpmi)", p)}
    print(f"apt would install Slurm's {slurm}")
    for package in ("slurmd", "slurmctld", "slurm-client", "slurmdbd"):
        assert plan.get(package, "").startswith(SLURM_VERSION), (package, plan)
    assert all(v.startswith(SLURM_VERSION) for v in slurm.values()), slurm
