"""The nvidia deploy planned on fake hosts: 8x H100 SXM with NVSwitches on Ubuntu 22.04,
24.04, Debian 12 and Rocky 9; the same driver already installed and loaded (no
change); a version bump (drain, install, reboot, verify, resume in that order, a
batch at a time); driver branch 590 and later from NVIDIA's CUDA repository (its
pinning package first, the package names without the branch) and a bump from 580 to
590; a node without an NVIDIA GPU and a node with a stand-in GPU (nothing); the
inventory declaring 8 GPUs where the node shows 4 (this host stops); InfiniBand present
and absent.

Fake hosts: no host is contacted; what a node shows comes from the output of the
fact's command, written here as a node would print it (tests/deploys/harness.py).
"""

from __future__ import annotations

import copy
import hashlib
import re

import pytest
from pyinfra import host

from aicluster.common.ops import Rollout, current_cluster
from aicluster.common.settings import layered
from aicluster.components.nvidia import deploy as nvidia
from aicluster.components.nvidia import derive as nvidia_derive
from aicluster.components.nvidia.probe import parse, turing_or_newer
from aicluster.inventory import InventoryError, validate
from tests.deploys.conftest import CLUSTER, DISTRIBUTIONS
from tests.deploys.harness import plan

#: A site's mirror of NVIDIA's CUDA repository (aicluster names no package host).
MIRROR = "https://mirror.example.org/nvidia/cuda/repos"

H100 = {"model": "H100-SXM5-80GB", "count": 8, "memory_gb": 80, "nvswitch": True}
IB = [{"device": f"mlx5_{i}", "rate_gbps": 400} for i in range(4)]
HOSTS = [
    ("head", {"ssh_hostname": "10.10.0.10"}),
    *[
        (f"gpu{n}", {"ssh_hostname": f"10.10.0.{20 + n}",
                     "hardware": {"cpus": 112, "memory_gb": 2048, "gpus": H100}})
        for n in (1, 2, 3)
    ],
]
GROUPS = {"gpu_nodes": ["gpu1", "gpu2", "gpu3"]}
GPUS = ("gpu1", "gpu2", "gpu3")
VERSION = "570.133.20"
OLD = "570.124.06"
H100_DEVICE = "0x2330"
DIRECTORIES = {"/etc/apt/keyrings", "/etc/apt/sources.list.d", "/etc/apt/preferences.d",
               "/etc/apt/apt.conf.d", "/usr/local/sbin", "/etc/yum.repos.d",
               "/etc/modules-load.d", "/etc/systemd/system/nvidia-persistenced.service.d"}


def node_output(gpus=8, device=H100_DEVICE, nvswitches=4, loaded="", open_modules=True,
                rdma=(), held=True, runtimes=(), packages=("nvidia-open-570",), ofed=""):
    """What the fact's command prints on a node (see aicluster.components.nvidia.facts)."""
    lines = [f"pci=0000:{0x18 + i:02x}:00.0 0x030200 {device}" for i in range(gpus)]
    lines += [f"pci=0000:{0x80 + i:02x}:00.0 0x068000 0x22a3" for i in range(nvswitches)]
    if loaded:
        lines += [
            f"smi={i}, NVIDIA H100 80GB HBM3, 81559, {loaded}, Enabled, "
            f"00000000:{0x18 + i:02X}:00.0"
            for i in range(gpus)
        ]
        lines += [f"loaded={loaded}", f"installed={loaded}",
                  "license=Dual MIT/GPL" if open_modules else "license=NVIDIA"]
        lines += [f"pkg={p}" for p in packages]
        if held:
            lines += [f"held={p}" for p in packages]
    lines += [f"rdma={d}" for d in rdma]
    if ofed:
        # ofed_info -s, and MLNX_OFED's ib_core exports the peer-memory API.
        lines += [f"ofed={ofed}", "peer_memory=ib_core"]
    lines += [f"runtime={r}" for r in runtimes]
    return lines


def _deploy():
    """What deploy.py does for the nvidia component: only on the hosts that ask for it."""
    if "nvidia" in current_cluster().hosts[host.name].components():
        nvidia.deploy()


def _existing(files: dict[str, str]):
    def file_fact(path, **kw):
        if path not in files:
            return None
        return {"mode": 755 if path == nvidia_derive.DRIVER_SCRIPT else 644, "user": "root",
                "group": "root"}

    def sha1_fact(path, **kw):
        return hashlib.sha1(files[path].encode()).hexdigest() if path in files else None

    def directory_fact(path, **kw):
        if path not in DIRECTORIES:
            return None
        return {"mode": 755, "user": "root", "group": "root"}

    return {"File": file_fact, "Sha1File": sha1_fact, "Directory": directory_fact}


def _plan(distro="ubuntu2204", extra=None, nodes=None, facts=None, hosts=None, groups=None):
    data = {**CLUSTER, "nvidia_driver_version": VERSION, "nvidia_cuda_repo_url": MIRROR,
            **(extra or {})}
    data.pop("package_cache", None)
    if "head" not in [h[0] for h in (hosts or HOSTS)]:
        data.pop("base_chrony_server_host", None)
    hosts = copy.deepcopy(hosts or HOSTS)
    host_facts = {}
    for name, _ in hosts:
        host_facts[name] = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "Arch": "x86_64",
            "NvidiaNode": parse((nodes or {}).get(name, node_output())),
            **(facts or {}).get(name, {}),
        }
    return plan(hosts, groups or GROUPS, data, host_facts, _deploy)


def _deployed(distro="ubuntu2204", version=VERSION, extra=None, **output):
    """Facts of nodes that run ``version`` with everything the deploy writes now."""
    fresh = _plan(distro, extra={"nvidia_driver_version": version, **(extra or {})})
    debian = distro != "rocky9"
    packages = {"datacenter-gpu-manager-4-core": ["1:4.2.3-1"],
                "datacenter-gpu-manager-4-cuda12": ["1:4.2.3-1"],
                "nvidia-container-toolkit": ["1.17.4-1"],
                f"nvidia-fabricmanager-{version.split('.')[0]}": [f"{version}-1"],
                f"libnvidia-nscq-{version.split('.')[0]}": [f"{version}-1"],
                "nvidia-fabric-manager": [f"{version}-1"],
                # Branch 580 on: DCGM for CUDA 13; branch 590 on: Fabric Manager's name
                # without the branch.
                "datacenter-gpu-manager-4-cuda13": ["1:4.2.3-1"],
                "nvidia-fabricmanager": [f"{version}-1"],
                "libnvidia-nscq": [f"{version}-1"],
                "python3-dnf-plugin-versionlock": ["4.3.0-16.el9"]}
    paths = [nvidia_derive.DRIVER_SCRIPT, nvidia_derive.PERSISTENCED_DROPIN,
             "/etc/apt/sources.list.d/aicluster-nvidia-cuda.list" if debian
             else "/etc/yum.repos.d/aicluster-nvidia-cuda.repo"]
    if debian:
        paths += [nvidia_derive.APT_PIN, nvidia_derive.UNATTENDED]
    facts, nodes = {}, {}
    for name in GPUS:
        files = {p: fresh.upload(name, p) for p in paths}
        files["/etc/apt/keyrings/aicluster-nvidia-cuda.asc"] = "key"
        if nvidia_derive.PEERMEM_CONF in fresh.commands(name):
            files[nvidia_derive.PEERMEM_CONF] = fresh.upload(name, nvidia_derive.PEERMEM_CONF)
        units = {f"{s}.service": True for s in
                 ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm")}
        facts[name] = {
            "DebPackages" if debian else "RpmPackages": packages,
            "SystemdStatus": units,
            "SystemdEnabled": units,
            **_existing(files),
        }
        nodes[name] = node_output(loaded=version, **output)
    return facts, nodes


# --- what DKMS needs: the running kernel's headers, EPEL and CRB on Rocky ----------------


@pytest.mark.parametrize(("distro", "headers", "prepare"), [
    ("debian12", "linux-headers-$(uname -r)", None),
    ("ubuntu2404", "linux-headers-$(uname -r)", None),
    # The one EPEL command every EPEL install shares (aicluster.common.epel): CRB first.
    ("rocky9", "kernel-devel-$(uname -r)",
     "dnf -y install dnf-plugins-core && dnf config-manager --set-enabled crb"
     " && dnf -y install epel-release"),
])
def test_the_installer_gets_what_dkms_builds_with_before_the_driver(distro, headers, prepare):
    """DKMS builds the modules against the running kernel's headers, which no driver
    package installs for that kernel; on Rocky dkms is EPEL's, which needs CRB."""
    p = _plan(distro)
    script = p.upload("gpu1", nvidia_derive.DRIVER_SCRIPT)
    body = script.split("\ninstall() {", 1)[1].split("\n}\n", 1)[0]
    lines = [line.strip() for line in body.splitlines()]
    driver = next(i for i, line in enumerate(lines) if line.endswith(' "$@"'))
    header = next(i for i, line in enumerate(lines) if line.endswith(f" {headers}"))
    assert header < driver, body
    if prepare:
        assert lines.index(prepare) < header
    else:
        assert "epel" not in body


# --- persistence mode ------------------------------------------------------------------


def test_persistenced_runs_with_persistence_mode_on_and_restarts_only_on_a_change():
    """The packaged nvidia-persistenced unit runs with --no-persistence-mode: a drop-in
    turns it on (as NVIDIA's own role does); nvidia-persistenced restarts only when the
    drop-in changes, and nvidia_persistenced: false takes the drop-in away."""
    p = _plan("debian12")
    dropin = p.upload("gpu1", nvidia_derive.PERSISTENCED_DROPIN)
    assert "[Service]\nExecStart=\nExecStart=/usr/bin/nvidia-persistenced --user " \
        "nvidia-persistenced --persistence-mode --verbose\n" in dropin
    assert "--no-persistence-mode" not in dropin.split("[Service]")[1]
    assert p.op("gpu1", "Restart nvidia-persistenced (persistence mode changed)").runs
    facts, nodes = _deployed("debian12")
    again = _plan("debian12", facts=facts, nodes=nodes)
    assert not again.op("gpu1", "Restart nvidia-persistenced (persistence mode changed)").runs
    off = _plan("debian12", extra={"nvidia_persistenced": False}, facts=facts, nodes=nodes)
    assert "No nvidia-persistenced drop-in (nvidia_persistenced: false)" in off.changing("gpu1")


# --- 8x H100 SXM with NVSwitch, first install ------------------------------------------


@pytest.mark.parametrize("distro", ["ubuntu2204", "ubuntu2404", "debian12"])
def test_h100_nvswitch_first_install_debian_family(distro):
    p = _plan(distro)
    repo = {"ubuntu2204": "ubuntu2204", "ubuntu2404": "ubuntu2404", "debian12": "debian12"}
    source = p.upload("gpu1", "/etc/apt/sources.list.d/aicluster-nvidia-cuda.list")
    assert (
        "deb [signed-by=/etc/apt/keyrings/aicluster-nvidia-cuda.asc] "
        f"https://mirror.example.org/nvidia/cuda/repos/{repo[distro]}/x86_64/ /\n"
    ) in source
    key = p.op("gpu1", "NVIDIA CUDA repository key").text
    assert f"/repos/{repo[distro]}/x86_64/3bf863cc.pub" in key
    # The driver's packages pinned at the exact version (apt pin, priority 1001).
    pin = p.upload("gpu1", nvidia_derive.APT_PIN)
    assert "Pin: version /^([0-9]+:)?570\\.133\\.20[.-]/\nPin-Priority: 1001\n" in pin
    assert "Package: nvidia-* libnvidia-* cuda-drivers*" in pin
    # Kept out of unattended upgrades.
    assert '    "nvidia-";\n    "libnvidia-";\n' in p.upload("gpu1", nvidia_derive.UNATTENDED)
    # The open kernel modules (Hopper), Fabric Manager at the driver's version, holds.
    install = p.op("gpu1", f"Install NVIDIA driver {VERSION} (open modules), reboot, verify")
    assert (
        f"{nvidia_derive.DRIVER_SCRIPT} install --fabric-manager nvidia-fabricmanager-570 "
        "--fabric-manager libnvidia-nscq-570 'nvidia-open-570'"
    ) in install.text
    script = p.upload("gpu1", nvidia_derive.DRIVER_SCRIPT)
    assert 'want="570.133.20"' in script
    assert "gpus=8\n" in script
    assert "apt-mark hold $pkgs" in script
    assert '$p ${fm:-(none)} is installed and the driver is $v' in script
    # DCGM 4: its core and the part for the CUDA major of driver 570 (CUDA 12).
    assert ("install datacenter-gpu-manager-4-core datacenter-gpu-manager-4-cuda12 "
            "nvidia-container-toolkit") in p.op(
        "gpu1", "Install datacenter-gpu-manager-4-core, datacenter-gpu-manager-4-cuda12, "
        "nvidia-container-toolkit").text
    for service in ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm"):
        op = p.op("gpu1", f"{service} running and enabled")
        assert f"systemctl enable {service}.service" in op.text
    # The new repository's index is read before anything is installed from it.
    names = p.names("gpu1")
    update = names.index("Read the CUDA repository's index (it was just added or changed)")
    assert update < names.index(install.name)
    assert p.op("gpu1", names[update]).runs, "a new repository: its index is read"


def test_h100_nvswitch_first_install_rocky9():
    p = _plan("rocky9")
    repo = p.upload("gpu1", "/etc/yum.repos.d/aicluster-nvidia-cuda.repo")
    base = "https://mirror.example.org/nvidia/cuda/repos/rhel9/x86_64"
    assert f"baseurl={base}\n" in repo
    assert "gpgcheck=1\n" in repo
    assert f"gpgkey={base}/D42D0685.pub\n" in repo
    assert nvidia_derive.APT_PIN not in p.commands("gpu1")
    names = p.names("gpu1")
    # dnf's versionlock plugin comes before the driver, which is held with it.
    lock = names.index("Install python3-dnf-plugin-versionlock")
    install_name = f"Install NVIDIA driver {VERSION} (open modules), reboot, verify"
    assert lock < names.index(install_name)
    install = p.op("gpu1", install_name).text
    assert (
        f"{nvidia_derive.DRIVER_SCRIPT} install --module nvidia-driver:570-open --fabric-manager "
        "nvidia-fabric-manager --fabric-manager libnvidia-nscq-570 "
        "'nvidia-driver-570.133.20*' 'nvidia-driver-cuda-570.133.20*' "
        "'nvidia-persistenced-570.133.20*' 'kmod-nvidia-open-dkms-570.133.20*'"
    ) in install
    script = p.upload("gpu1", nvidia_derive.DRIVER_SCRIPT)
    assert "dnf -y versionlock add $pkgs" in script
    # Fabric Manager exactly at the driver's version: name-version*.
    assert 'set -- "$@" "$p-$v*"' in script
    assert 'dnf install -y --allowerasing "$@"' in script
    assert ("dnf install -y datacenter-gpu-manager-4-core datacenter-gpu-manager-4-cuda12 "
            "nvidia-container-toolkit") in p.commands("gpu1")
    assert "systemctl enable nvidia-fabricmanager.service" in p.commands("gpu1")


def test_first_install_reboots_and_verifies_in_order():
    p = _plan()
    op = p.op("gpu1", f"Install NVIDIA driver {VERSION} (open modules), reboot, verify")
    text = op.text
    install = text.index(f"{nvidia_derive.DRIVER_SCRIPT} install")
    reboot = text.index("reboot ) </dev/null")
    verify = text.index(f"{nvidia_derive.DRIVER_SCRIPT} verify")
    assert install < reboot < text.index("wait_and_reconnect") < verify
    # Nothing ran here before: nothing to drain.
    assert "drain" not in text


def test_branch_only_pins_the_branch():
    p = _plan(extra={"nvidia_driver_version": None, "nvidia_driver_branch": "575"})
    assert "Pin: version /^([0-9]+:)?575[.-]/\n" in p.upload("gpu1", nvidia_derive.APT_PIN)
    assert "'nvidia-open-575'" in p.commands("gpu1")
    assert 'want="575"' in p.upload("gpu1", nvidia_derive.DRIVER_SCRIPT)
    rocky = _plan("rocky9", extra={"nvidia_driver_version": None})
    assert "--module nvidia-driver:570-open --fabric-manager nvidia-fabric-manager " \
           "--fabric-manager libnvidia-nscq-570 'nvidia-driver' 'nvidia-driver-cuda'" in \
        rocky.commands("gpu1")


def test_cuda_toolkit_at_its_pinned_version():
    p = _plan(extra={"nvidia_cuda_version": "12.8"})
    assert "cuda-toolkit-12-8" in p.op(
        "gpu1", "Install datacenter-gpu-manager-4-core, datacenter-gpu-manager-4-cuda12, "
        "nvidia-container-toolkit, cuda-toolkit-12-8"
    ).text


def test_proprietary_modules_before_turing_and_when_asked():
    volta = {n: node_output(device="0x1db1", nvswitches=0) for n in GPUS}
    p = _plan(nodes=volta)
    assert "'cuda-drivers-570'" in p.commands("gpu1")
    assert "(proprietary modules)" in " ".join(p.names("gpu1"))
    asked = _plan(extra={"nvidia_open_kernel_modules": False})
    assert "'cuda-drivers-570'" in asked.commands("gpu1")
    rocky = _plan("rocky9", extra={"nvidia_open_kernel_modules": False})
    assert "--module nvidia-driver:570-dkms" in rocky.commands("gpu1")
    assert "kmod-nvidia-latest-dkms" in rocky.commands("gpu1")


def test_blackwell_refuses_proprietary_modules():
    b200 = {n: node_output(device="0x2901") for n in GPUS}
    p = _plan(nodes=b200, extra={"nvidia_open_kernel_modules": False})
    op = p.ops["gpu1"][0]
    assert op.name.startswith("Stop: nvidia: host 'gpu1': nvidia_open_kernel_modules")
    assert "Blackwell" in op.text


def test_open_modules_by_generation():
    assert turing_or_newer(["0x2330"]) is True       # H100 SXM
    assert turing_or_newer(["0x1e04"]) is True       # TU102: Turing
    assert turing_or_newer(["0x1db1"]) is False      # V100: Volta
    assert turing_or_newer(["0x2330", "0x1db1"]) is False
    assert turing_or_newer([], "H100-SXM5-80GB") is True
    assert turing_or_newer([], "V100") is None


def test_distribution_packages_on_ubuntu_and_none_on_rocky():
    p = _plan("ubuntu2404", extra={"nvidia_source": "distribution", "nvidia_driver_version": None})
    assert "'nvidia-driver-570-server-open' 'nvidia-utils-570-server'" in p.commands("gpu1")
    assert "aicluster-nvidia-cuda" not in p.commands("gpu1")
    rocky = _plan("rocky9", extra={"nvidia_source": "distribution"})
    assert "ships no NVIDIA driver packages" in rocky.ops["gpu1"][0].name
    # Debian's own packages have no Fabric Manager: an NVSwitch node stops.
    debian = _plan("debian12", extra={"nvidia_source": "distribution"})
    assert "have no Fabric Manager" in debian.ops["gpu1"][0].text


# --- Secure Boot ---------------------------------------------------------------------------


def _secure(lines, kernel="6.8.0-45-generic"):
    return [*lines, f"kernel={kernel}", "secure_boot=1"]


def test_secure_boot_refuses_modules_dkms_would_build_unsigned():
    """With Secure Boot on, DKMS's unsigned modules would not load: the node stops before
    anything is installed, saying what to do."""
    nodes = {n: _secure(node_output()) for n in GPUS}
    p = _plan("ubuntu2404", nodes=nodes)
    stop = p.ops["gpu1"][0]
    assert "Secure Boot is on" in stop.text and "nvidia_precompiled_modules: true" in stop.text
    assert not any("Install NVIDIA driver" in n for n in p.names("gpu1"))
    # A driver already loaded under Secure Boot was signed: nothing to refuse.
    facts, done = _deployed("ubuntu2404")
    p = _plan("ubuntu2404", facts=facts, nodes={n: _secure(done[n]) for n in GPUS})
    assert not p.changing("gpu1")


def test_ubuntu_precompiled_signed_modules_for_the_running_kernel_flavour():
    extra = {"nvidia_source": "distribution", "nvidia_driver_version": None,
             "nvidia_precompiled_modules": True}
    nodes = {n: _secure(node_output(nvswitches=0), kernel="6.8.0-1019-nvidia") for n in GPUS}
    # PCIe GPUs (no NVSwitch: Ubuntu's packages have Fabric Manager, but none is needed).
    hosts = [(name, {**data, "hardware": {**data["hardware"],
                                          "gpus": {**H100, "nvswitch": False}}}
              if "hardware" in data else data)
             for name, data in HOSTS]
    p = _plan("ubuntu2404", extra=extra, nodes=nodes, hosts=hosts)
    install = next(op for op in p.ops["gpu1"] if "Install NVIDIA driver" in op.name)
    assert ("'linux-modules-nvidia-570-server-open-nvidia' 'nvidia-driver-570-server-open'"
            in install.text), install.text
    # Only Ubuntu has them: elsewhere the setting is refused by name.
    debian = _plan("debian12", extra=extra, nodes=nodes, hosts=hosts)
    assert "nvidia_precompiled_modules: only Ubuntu's own driver packages" in (
        debian.ops["gpu1"][0].text)


def test_the_fact_reads_secure_boot_and_the_kernel():
    from aicluster.components.nvidia.probe import parse as parse_node

    assert parse_node(["kernel=6.8.0-45-generic", "secure_boot=1"])["secure_boot"] is True
    assert parse_node(["secure_boot=0"])["secure_boot"] is False
    assert parse_node([])["secure_boot"] is False
    assert parse_node(["kernel=6.1.0-28-amd64"])["kernel"] == "6.1.0-28-amd64"


def test_debian_own_driver_takes_the_proprietary_modules_unless_told():
    """Debian 12's open modules (contrib) lag behind its driver's security updates
    (non-free): auto takes the proprietary ones there (tests/e2e/test_lab_archives.py
    resolves them against the real archive); true still asks for the open ones."""
    hosts = [(name, {**data, "hardware": {**data["hardware"],
                                          "gpus": {**H100, "nvswitch": False}}}
              if "hardware" in data else data)
             for name, data in HOSTS]
    nodes = {n: node_output(nvswitches=0) for n in GPUS}
    extra = {"nvidia_source": "distribution", "nvidia_driver_branch": "535",
             "nvidia_driver_version": None}
    auto = _plan("debian12", extra=extra, nodes=nodes, hosts=hosts)
    assert "'nvidia-kernel-dkms' 'nvidia-driver' 'nvidia-smi'" in auto.commands("gpu1")
    told = _plan("debian12", extra={**extra, "nvidia_open_kernel_modules": True},
                 nodes=nodes, hosts=hosts)
    assert "'nvidia-open-kernel-dkms' 'nvidia-driver' 'nvidia-smi'" in told.commands("gpu1")
    # Ubuntu's own open modules follow its driver: auto keeps them.
    ubuntu = _plan("ubuntu2404", extra=extra, nodes=nodes, hosts=hosts)
    assert "nvidia-driver-535-server-open" in ubuntu.commands("gpu1")


# --- the same driver already there: nothing changes ---------------------------------------


@pytest.mark.parametrize("distro", ["ubuntu2204", "rocky9"])
def test_same_driver_installed_and_loaded_changes_nothing(distro):
    facts, nodes = _deployed(distro)
    p = _plan(distro, nodes=nodes, facts=facts)
    for name in GPUS:
        assert not p.changing(name), p.changing(name)
        assert f"{name}: NVIDIA driver {VERSION} (open modules) installed and loaded" in p.names(
            name)
        assert not any(n.startswith(("Change NVIDIA", "Install NVIDIA")) for n in p.names(name))


def test_holds_restored_when_an_admin_released_them():
    facts, nodes = _deployed(held=False)
    p = _plan(nodes=nodes, facts=facts)
    op = p.op("gpu1", f"Hold the NVIDIA driver's packages at {VERSION} (nvidia-open-570)")
    assert op.text == f"{nvidia_derive.DRIVER_SCRIPT} hold"


# --- a version bump: drain, install, reboot, verify, resume ---------------------------


def test_version_bump_drains_installs_reboots_verifies_resumes_in_order():
    facts, nodes = _deployed(version=OLD)
    p = _plan(nodes=nodes, facts=facts, extra={"nvidia_upgrade_batch_size": 2})
    name = (
        f"Change NVIDIA driver {OLD} to {VERSION} (drain, install, reboot, verify, resume; "
        "2 node(s) at a time)"
    )
    for node in GPUS:
        op = p.op(node, name)
        text = op.text
        steps = [
            text.index("FunctionCommand(_begin"),
            text.index(f"{nvidia_derive.DRIVER_SCRIPT} drain"),
            text.index(f"{nvidia_derive.DRIVER_SCRIPT} install --fabric-manager"),
            text.index("reboot ) </dev/null"),
            text.index("wait_and_reconnect"),
            text.index(f"{nvidia_derive.DRIVER_SCRIPT} verify"),
            text.index(f"{nvidia_derive.DRIVER_SCRIPT} resume"),
            text.index("FunctionCommand(_end"),
        ]
        assert steps == sorted(steps), text
        # The new pin and installer are in place before the change starts.
        assert "570\\.133\\.20" in p.upload(node, nvidia_derive.APT_PIN)
        assert p.op(node, "NVIDIA driver installer (install, hold, drain, verify, resume)"
                    ).index < op.index
    # One batch of nodes at a time (pyinfra's _parallel on the one operation).
    from pyinfra.context import ctx_state  # noqa: F401  (the plan's state is gone; the
    # operation's arguments are checked through the deploy's own call below)
    assert p.op("gpu1", name).index == p.op("gpu3", name).index


def test_version_bump_batches_one_node_by_default(monkeypatch):
    calls = []
    real = nvidia.driver_change

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    facts, nodes = _deployed(version=OLD)
    monkeypatch.setattr(nvidia, "driver_change", spy)
    _plan(nodes=nodes, facts=facts)
    assert [c["_parallel"] for c in calls] == [1, 1, 1]
    assert all(c["drain"] for c in calls)


def test_drain_never_lifts_an_administrators_drain():
    script = _plan().upload("gpu1", nvidia_derive.DRIVER_SCRIPT)
    assert 'reason="aicluster: NVIDIA driver 570.133.20"' in script
    assert 'echo "$node: drained by an administrator; it stays drained"' in script
    assert 'scontrol update NodeName="$node" State=DRAIN Reason="$reason"' in script
    # Resume only where the drain made here is still the reason.
    resume = script[script.index("resume() {"):]
    assert '*"Reason=$reason"*|*"Reason=Node unexpectedly rebooted"*)' in resume
    assert "drained for another reason meanwhile; it stays drained" in resume
    verify = script[script.index("verify() {"):script.index("resume() {")]
    assert "the node stays drained" in verify
    assert 'if [ "$count" -ne "$gpus" ]' in verify


def test_k3s_nodes_are_cordoned_on_a_server(monkeypatch):
    calls = []
    real = nvidia.driver_change
    facts, nodes = _deployed(version=OLD)
    monkeypatch.setattr(nvidia, "driver_change",
                        lambda *a, **kw: (calls.append(kw), real(*a, **kw))[1])
    hosts = [*HOSTS]
    # k3s GPU nodes run NVIDIA's device plugin from an image the inventory names.
    _plan(nodes=nodes, facts=facts, hosts=hosts,
          groups={**GROUPS, "k3s_servers": ["head"], "k3s_agents": list(GPUS)},
          extra={"k3s_nvidia_device_plugin_image": "registry.example.org/k8s-device-plugin:v1"})
    assert {c["k3s_server"] for c in calls} == {"head"}
    cordon = calls[0]["k3s_cordon"]
    assert "k3s kubectl cordon gpu1" in cordon
    assert "cordoned by an administrator; it stays cordoned" in cordon
    assert "k3s kubectl uncordon gpu1" in calls[0]["k3s_uncordon"]


def test_loaded_driver_differs_from_installed_one_reboots_through_the_drain():
    facts, nodes = _deployed()
    nodes = {n: [line.replace(f"loaded={VERSION}", f"loaded={OLD}") for line in out]
             for n, out in nodes.items()}
    p = _plan(nodes=nodes, facts=facts)
    assert any(n.startswith(f"Change NVIDIA driver {VERSION} to {VERSION}") for n in
               p.names("gpu1"))


# --- no GPU, stand-in GPU, wrong count ---------------------------------------------------


def test_node_without_nvidia_gpu_gets_nothing_and_says_why():
    hosts = [("cpu1", {"ssh_hostname": "10.10.0.31"})]
    p = _plan(hosts=hosts, groups={"gpu_nodes": []}, nodes={"cpu1": node_output(gpus=0)})
    assert p.ops["cpu1"] == []  # not in gpu_nodes: the component does not run there
    decision = nvidia_derive.decide(
        {**layered("nvidia", {}), "nvidia_gpu_vendor": "nvidia",
         "nvidia_expected_gpus": 0, "nvidia_gpu_model": ""},
        parse(node_output(gpus=0, nvswitches=0)), "cpu1", "debian")
    assert decision["action"] == "skip"
    assert decision["message"] == (
        "cpu1: skipped: no NVIDIA GPU on the PCI bus or in the inventory")


def test_standin_gpu_gets_nothing_and_says_why():
    standin = {"model": "standin", "count": 1, "vendor": "standin"}
    hosts = [("node1", {"ssh_hostname": "10.10.0.51", "hardware": {"gpus": standin}})]
    p = _plan("debian12", hosts=hosts, groups={"gpu_nodes": ["node1"]},
              nodes={"node1": node_output(gpus=0, nvswitches=0)})
    (op,) = p.ops["node1"]
    assert op.name == (
        "node1: skipped: hardware.gpus declares a stand-in (1 x 'standin', vendor 'standin'), "
        "not an NVIDIA GPU; NVIDIA GPUs on the PCI bus: 0; nothing installed"
    )
    assert not p.changing("node1")


def test_inventory_says_8_gpus_node_shows_4_stops_that_host():
    nodes = {"gpu1": node_output(gpus=4), "gpu2": node_output(), "gpu3": node_output()}
    p = _plan(nodes=nodes)
    (op,) = p.ops["gpu1"]
    message = (
        "nvidia: host 'gpu1': hardware.gpus: the inventory declares 8 x H100-SXM5-80GB, the "
        "node shows 4 NVIDIA GPU(s) on its PCI bus (10de:2330 at 0000:18:00.0, 10de:2330 at "
        "0000:19:00.0, 10de:2330 at 0000:1a:00.0, 10de:2330 at 0000:1b:00.0); correct "
        "hardware.gpus.count or the node before deploying it"
    )
    assert op.name == f"Stop: {message}"
    assert message in op.text  # the host fails with the message; the others go on
    assert any(n.startswith("Install NVIDIA driver") for n in p.names("gpu2"))


def test_gpu_lost_after_boot_stops_that_host():
    facts, nodes = _deployed()
    nodes["gpu2"] = [line for line in nodes["gpu2"] if not line.startswith("smi=7,")]
    p = _plan(nodes=nodes, facts=facts)
    assert "nvidia-smi sees 7" in p.ops["gpu2"][0].name
    assert not p.changing("gpu1")


# --- InfiniBand present and absent -------------------------------------------------------


MLNX_OFED = "MLNX_OFED_LINUX-24.10-2.1.8.0:"


def test_infiniband_with_mlnx_ofed_loads_nvidia_peermem():
    rdma = {n: node_output(rdma=("mlx5_0", "mlx5_1"), ofed=MLNX_OFED) for n in GPUS}
    p = _plan(nodes=rdma)
    assert p.upload("gpu1", nvidia_derive.PEERMEM_CONF).endswith("\nnvidia-peermem\n")
    assert f"Load nvidia-peermem at boot: RDMA devices and {MLNX_OFED} here" in p.names("gpu1")
    # On a first install the module loads at the reboot.
    assert "nvidia-peermem loads at the reboot" in p.names("gpu1")
    # Declared in the inventory (hardware.ib_ports) counts too; the running node loads it.
    hosts = [(n, {**d, "hardware": {**d.get("hardware", {}), "ib_ports": IB}})
             for n, d in HOSTS]
    facts, nodes = _deployed(ofed=MLNX_OFED)
    again = _plan(nodes=nodes, facts=facts, hosts=hosts)
    assert "modprobe -a nvidia-peermem" in again.op("gpu1", "Load nvidia-peermem").text


INBOX = ("No nvidia-peermem: inbox RDMA stack, no MLNX_OFED/DOCA-OFED peer-memory API: "
         "GPUDirect RDMA goes through DMA-BUF")


def test_infiniband_with_the_inbox_rdma_stack_no_nvidia_peermem():
    """The kernel's own ib_core has no peer-memory API: nvidia-peermem's init fails
    (-EINVAL) there, so auto neither writes its boot load nor modprobes it, on the first
    deploy or any later one; DMA-BUF carries GPUDirect RDMA instead."""
    rdma = {n: node_output(rdma=("mlx5_0", "mlx5_1")) for n in GPUS}
    p = _plan(nodes=rdma)
    assert INBOX in p.names("gpu1")
    uploads = [c.split("\n")[0][7:] for c in p.commands("gpu1").split("upload ")]
    assert nvidia_derive.PEERMEM_CONF not in uploads
    assert "nvidia-peermem loads at the reboot" not in p.names("gpu1")
    hosts = [(n, {**d, "hardware": {**d.get("hardware", {}), "ib_ports": IB}})
             for n, d in HOSTS]
    facts, nodes = _deployed(rdma=("mlx5_0",))
    again = _plan(nodes=nodes, facts=facts, hosts=hosts)
    assert "modprobe" not in again.commands("gpu1")
    assert "Load nvidia-peermem" not in again.names("gpu1")
    assert not again.changing("gpu1"), again.changing("gpu1")
    # A boot load an earlier deploy wrote is taken away.
    file_fact = facts["gpu1"]["File"]
    facts["gpu1"]["File"] = lambda path, **kw: (
        {"mode": 644, "user": "root", "group": "root"} if path == nvidia_derive.PEERMEM_CONF
        else file_fact(path, **kw))
    removed = _plan(nodes=nodes, facts=facts, hosts=hosts).op("gpu1", INBOX)
    assert f"rm -f {nvidia_derive.PEERMEM_CONF}" in removed.text


def test_inbox_rdma_stack_peermem_when_the_inventory_says_so():
    rdma = {n: node_output(rdma=("mlx5_0",)) for n in GPUS}
    p = _plan(nodes=rdma, extra={"nvidia_peermem": True})
    assert p.upload("gpu1", nvidia_derive.PEERMEM_CONF).endswith("\nnvidia-peermem\n")
    assert "Load nvidia-peermem at boot: nvidia_peermem is true" in p.names("gpu1")


def test_peer_memory_api_decides_without_ofed_info():
    v = {**layered("nvidia", {}), "nvidia_ib_declared": True}
    node = parse(["rdma=mlx5_0"])
    assert nvidia_derive._peermem(v, node)[0] is False
    assert nvidia_derive._peermem(v, parse(["rdma=mlx5_0", "peer_memory=ib_core"]))[0] is True
    assert nvidia_derive._peermem(v, parse(["ofed=OFED-internal-25.01-0.6.0:"])) == (
        True, "RDMA devices and OFED-internal-25.01-0.6.0: here")


def test_infiniband_absent_no_nvidia_peermem():
    p = _plan()
    op = p.op("gpu1", "No nvidia-peermem: no RDMA device here")
    assert "modprobe" not in p.commands("gpu1")
    assert not op.commands  # no file there to remove


def test_peermem_can_be_turned_off():
    rdma = {n: node_output(rdma=("mlx5_0",), ofed=MLNX_OFED) for n in GPUS}
    p = _plan(nodes=rdma, extra={"nvidia_peermem": False})
    uploads = [c.split("\n")[0][7:] for c in p.commands("gpu1").split("upload ")]
    assert nvidia_derive.PEERMEM_CONF not in uploads
    assert "No nvidia-peermem: nvidia_peermem is false" in p.names("gpu1")


REPO_INDEX = "Read the CUDA repository's index (it was just added or changed)"
REPO_LIST = "/etc/apt/sources.list.d/aicluster-nvidia-cuda.list"


@pytest.mark.parametrize("distro", ["ubuntu2204", "debian12"])
def test_the_repository_index_is_read_only_when_the_repository_changed(distro):
    facts, nodes = _deployed(distro)
    p = _plan(distro, nodes=nodes, facts=facts)
    for name in GPUS:
        update = p.op(name, REPO_INDEX)
        assert update.skipped, f"{name}: the repository is unchanged"
    # gpu1 names another mirror (the inventory changed since): its list is rewritten.
    older = p.op("gpu1", f"NVIDIA CUDA repository ({distro})")
    assert not older.commands
    sha1 = facts["gpu1"]["Sha1File"]
    older_list = hashlib.sha1(b"deb https://old-mirror.example.org/cuda/ /\n").hexdigest()
    facts["gpu1"]["Sha1File"] = lambda path, **kw: (
        older_list if path == REPO_LIST else sha1(path, **kw))
    p = _plan(distro, nodes=nodes, facts=facts)
    assert REPO_LIST in p.op("gpu1", f"NVIDIA CUDA repository ({distro})").text
    update = p.op("gpu1", REPO_INDEX)
    assert update.runs and "apt-get update" in update.text
    assert update.index > p.op("gpu1", f"NVIDIA CUDA repository ({distro})").index
    for name in GPUS:
        if name != "gpu1":
            assert p.op(name, REPO_INDEX).skipped, name


# --- container runtimes ------------------------------------------------------------------


def test_container_toolkit_configures_the_runtimes_present():
    facts, nodes = _deployed(runtimes=("containerd", "docker"))
    p = _plan(nodes=nodes, facts=facts)
    text = p.op("gpu1", "Configure containerd for NVIDIA GPUs (nvidia-container-toolkit)").text
    assert text == "nvidia-ctk runtime configure --runtime=containerd\nsystemctl restart containerd"
    assert "Configure docker for NVIDIA GPUs (nvidia-container-toolkit)" in p.names("gpu1")
    configured = {n: [*out, "runtime_nvidia=containerd", "runtime_nvidia=docker"]
                  for n, out in nodes.items()}
    assert not _plan(nodes=configured, facts=facts).changing("gpu1")
    # One runtime configured, the other new: only the new one is configured and restarted.
    half = {n: [*out, "runtime_nvidia=containerd"] for n, out in nodes.items()}
    p = _plan(nodes=half, facts=facts)
    assert [n for n in p.changing("gpu1") if n.startswith("Configure")] == [
        "Configure docker for NVIDIA GPUs (nvidia-container-toolkit)"]


# --- the fact's parser and the inventory checks ------------------------------------------


def test_fact_parses_a_bare_node_as_none():
    empty = parse([])
    assert empty["pci_gpus"] == [] and empty["smi"] == [] and empty["loaded"] == ""
    assert parse(["smi_error=NVIDIA-SMI has failed because it couldn't communicate with the "
                  "NVIDIA driver."])["smi"] == []


def test_fact_parses_dnf_versionlock_entries():
    node = parse(["installed=570.133.20", "pkg=nvidia-driver", "pkg=kmod-nvidia-open-dkms",
                  "held=nvidia-driver-3:570.133.20-1.el9.*"])
    assert node["unheld"] == ["kmod-nvidia-open-dkms"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nvidia_driver_branch": 570}, "nvidia_driver_branch: Input should be a valid string"),
        ({"nvidia_driver_branch": "57"},
         "nvidia_driver_branch: String should match pattern '^[0-9]{3,4}$' (got '57')"),
        ({"nvidia_driver_version": "575.51.03"},
         "nvidia_driver_version: 575.51.03 is not of nvidia_driver_branch 570"),
        ({"nvidia_driver_version": "latest"},
         "nvidia_driver_version: String should match pattern '^[0-9]+(\\.[0-9]+){1,2}$' "
         "(got 'latest')"),
        ({"nvidia_source": "ppa"},
         "nvidia_source: Input should be 'cuda_repo' or 'distribution' (got 'ppa')"),
        ({"nvidia_open_kernel_modules": "yes"},
         "nvidia_open_kernel_modules: 'yes' is not 'auto', true or false"),
        ({"nvidia_cuda_version": "12"},
         "nvidia_cuda_version: String should match pattern '^[0-9]+\\.[0-9]+$' (got '12')"),
        ({"nvidia_upgrade_batch_size": 0},
         "nvidia_upgrade_batch_size: Input should be greater than or equal to 1 (got 0)"),
        ({"nvidia_dcgm": "no"}, "nvidia_dcgm: Input should be a valid boolean (got 'no')"),
        ({"nvidia_reboot_timeout": 30},
         "nvidia_reboot_timeout: Input should be greater than or equal to 60 (got 30)"),
        ({"nvidia_cuda_repo_url": ""},
         "nvidia_cuda_repo_url: not set; with nvidia_source 'cuda_repo' give the URL"),
        ({"nvidia_cuda_repo_url": "mirror/cuda"},
         "nvidia_cuda_repo_url: String should match pattern '^((https?|file)://\\S+)?$' "
         "(got 'mirror/cuda')"),
    ],
)
def test_inventory_errors_name_host_and_field(data, message):
    hosts = {
        "gpu1": (("gpu_nodes",), {**CLUSTER, "package_cache": None, "ssh_hostname": "10.10.0.21",
                                  "hardware": {"gpus": H100}, "nvidia_cuda_repo_url": MIRROR,
                                  **data}),
    }
    with pytest.raises(InventoryError) as exc:
        validate(hosts)
    assert any(e.startswith(f"host 'gpu1': {message}") for e in exc.value.errors), exc.value.errors


def test_gpu_vendor_is_nvidia_or_standin():
    hosts = {
        "gpu1": (("gpu_nodes",), {**CLUSTER, "package_cache": None, "ssh_hostname": "10.10.0.21",
                                  "hardware": {"gpus": {**H100, "vendor": "amd"}}}),
    }
    with pytest.raises(InventoryError) as exc:
        validate(hosts)
    assert "host 'gpu1': hardware.gpus.vendor: Input should be 'nvidia' or 'standin' " \
           "(got 'amd')" in exc.value.errors


def test_one_batch_size_for_the_cluster():
    def gpu(n, batch):
        return ((("gpu_nodes",), {**CLUSTER, "package_cache": None,
                                  "ssh_hostname": f"10.10.0.{20 + n}",
                                  "hardware": {"gpus": H100},
                                  "nvidia_upgrade_batch_size": batch}))

    with pytest.raises(InventoryError) as exc:
        validate({"gpu1": gpu(1, 2), "gpu2": gpu(2, 1)})
    assert any(e.startswith("host 'gpu2': nvidia_upgrade_batch_size: 1 differs from 2 on host "
                            "'gpu1'") for e in exc.value.errors), exc.value.errors


# --- the Ansible role decides alike (its filter plugin calls decide()) -------------------


def _ansible_role(tmp_path, hosts: dict[str, dict]) -> str:
    """Run the nvidia role with Ansible on this machine (local connection) for hosts
    whose node output is given: each host's vars are the lab inventory's gpu1's, with
    the fact command replaced by one that prints that output. Returns the output."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from aicluster import PROJECT_ROOT, ROLES_DIR
    from aicluster.inventory import ansible_inventory

    lab = ansible_inventory(PROJECT_ROOT / "inventories" / "lab.py")["_meta"]["hostvars"]["gpu1"]
    inventory = {}
    for name, (lines, extra) in hosts.items():
        hv = {k: v for k, v in lab.items() if not k.startswith("ansible_")}
        hv.update(extra)
        hv["nvidia_fact_command"] = "printf '%s\\n' " + " ".join(f"'{x}'" for x in lines)
        hv["ansible_connection"] = "local"
        hv["ansible_python_interpreter"] = sys.executable
        inventory[name] = hv
    (tmp_path / "inventory.json").write_text(json.dumps({"all": {"hosts": inventory}}))
    (tmp_path / "play.yml").write_text(
        "- hosts: all\n  gather_facts: true\n  gather_subset: [min]\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: nvidia\n"
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "--check", "-i",
         str(tmp_path / "inventory.json"), str(tmp_path / "play.yml")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
             "ANSIBLE_ROLES_PATH": str(ROLES_DIR), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")},
    )
    return proc.stdout + proc.stderr


def test_ansible_role_stops_and_skips_with_the_same_messages(tmp_path):
    standin = {"nvidia_gpu_vendor": "standin", "nvidia_expected_gpus": 1,
               "nvidia_gpu_model": "standin"}
    output = _ansible_role(tmp_path, {
        "gpu1": (node_output(gpus=4), {}),
        "node1": (node_output(gpus=0, nvswitches=0), standin),
    })
    stop = _plan(nodes={"gpu1": node_output(gpus=4)}).ops["gpu1"][0].name.removeprefix("Stop: ")
    assert f'"msg": "{stop}"' in output, output
    skip = ("node1: skipped: hardware.gpus declares a stand-in (1 x 'standin', vendor "
            "'standin'), not an NVIDIA GPU; NVIDIA GPUs on the PCI bus: 0; nothing installed")
    assert f'"msg": "{skip}"' in output, output
    assert re.search(r"node1\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", output), output
    assert re.search(r"gpu1\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=1", output), output


class _FakeHost:
    def __init__(self, name):
        self.name = name
        self.logged = []

    def log_styled(self, message, **kw):
        self.logged.append(message)


class _FakeState:
    def __init__(self, names):
        hosts = [_FakeHost(n) for n in names]
        self.hosts = {h.name: h for h in hosts}
        self.inventory = type("Inventory", (), {"get_active_hosts": lambda _self: hosts})()


@pytest.fixture
def batches(monkeypatch):
    """The driver change's record of started and finished hosts, empty, and undone after
    the test (it is keyed by id(state): a later test's state may get the same id)."""
    monkeypatch.setattr(nvidia, "_ROLLOUT", Rollout("nvidia"))


def _steps(batch_size):
    """The driver change's guard and finish callbacks, as pyinfra would run them."""
    commands = list(nvidia.driver_change._inner(install_args="'nvidia-open-570'", drain=True,
                                                batch_size=batch_size))
    functions = {c.function.__name__: c.function for c in commands if hasattr(c, "function")}
    return functions["_begin"], functions["_end"]


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_batch_does_not_start_after_a_node_of_an_earlier_one_failed(batch_size, batches):
    guard, finished = _steps(batch_size)
    state = _FakeState(["gpu1", "gpu2", "gpu3"])
    gpu1, gpu2, gpu3 = (state.hosts[n] for n in ("gpu1", "gpu2", "gpu3"))
    assert guard(state, gpu1) is True
    # gpu1 fails (verification): it never reaches its end.
    if batch_size == 2:
        assert guard(state, gpu2) is True  # the same batch: it runs beside gpu1
        finished(state, gpu2)
    else:
        assert guard(state, gpu2) is False
        assert gpu2.logged == ["nvidia: not changing the driver here: gpu1 failed in an "
                               "earlier batch (see above); nothing was drained here"]
    assert guard(state, gpu3) is False


def test_batches_go_on_when_every_node_of_the_earlier_ones_ended_well(batches):
    guard, finished = _steps(1)
    state = _FakeState(["gpu1", "gpu2", "gpu3"])
    for name in ("gpu1", "gpu2", "gpu3"):
        assert guard(state, state.hosts[name]) is True
        finished(state, state.hosts[name])


# --- what the lab's GPU nodes get, kept as golden files ----------------------------------

GOLDEN_FILES = {
    "Debian": {
        "aicluster-nvidia-driver": "aicluster-nvidia-driver.j2",
        "aicluster-nvidia.pref": "aicluster-nvidia.pref.j2",
        "51aicluster-nvidia": "aicluster-nvidia-unattended.conf.j2",
        "aicluster-nvidia-cuda.list": "aicluster-nvidia-cuda.list.j2",
        "aicluster-nvidia-peermem.conf": "aicluster-nvidia-peermem.conf.j2",
    },
    "RedHat": {
        "aicluster-nvidia-driver": "aicluster-nvidia-driver.j2",
        "aicluster-nvidia-cuda.repo": "aicluster-nvidia-cuda.repo.j2",
    },
}


@pytest.mark.parametrize("family", sorted(GOLDEN_FILES))
def test_lab_gpu_node_files_match_golden_files(family):
    """tests/fixtures/golden/nvidia/<family>/: what gpu1 of inventories/lab.py gets
    (regenerate with AICLUSTER_UPDATE_GOLDEN=1 and review the diff)."""
    from aicluster import PROJECT_ROOT
    from aicluster.common.settings import template_vars
    from aicluster.inventory import load_cluster
    from aicluster.render import render
    from tests.golden import GOLDEN_DIR, assert_golden

    cluster = load_cluster(PROJECT_ROOT / "inventories" / "lab.py")
    v = template_vars("nvidia", cluster, "gpu1", cluster.hosts["gpu1"].data, family)
    v["nvidia_cuda_repo_distro"] = "ubuntu2204" if family == "Debian" else "rhel9"
    v["nvidia_cuda_repo_arch"] = "x86_64"
    for dest, template in GOLDEN_FILES[family].items():
        assert_golden(GOLDEN_DIR / "nvidia" / family / dest, render("nvidia", template, v))


def test_nvswitch_nodes_verify_fabric_manager_and_the_fabric():
    """After the reboot an NVSwitch node is verified with --fabric-manager (Fabric
    Manager active, every GPU's fabric state Completed: tests/unit/
    test_nvidia_driver_verify.py runs it); a node without NVSwitches is not."""
    p = _plan()
    install = p.op("gpu1", f"Install NVIDIA driver {VERSION} (open modules), reboot, verify")
    assert f"{nvidia_derive.DRIVER_SCRIPT} verify --fabric-manager" in install.text
    facts, nodes = _deployed(version=OLD)
    bump = _plan(nodes=nodes, facts=facts)
    assert f"{nvidia_derive.DRIVER_SCRIPT} verify --fabric-manager" in bump.commands("gpu1")
    pcie = {n: node_output(nvswitches=0) for n in GPUS}
    hosts = [(n, {**d, "hardware": {**d["hardware"], "gpus": {**H100, "nvswitch": False}}})
             if "hardware" in d else (n, d) for n, d in HOSTS]
    plain = _plan(nodes=pcie, hosts=hosts)
    text = plain.op("gpu1", f"Install NVIDIA driver {VERSION} (open modules), reboot, "
                    "verify").text
    assert f"{nvidia_derive.DRIVER_SCRIPT} verify" in text
    assert "--fabric-manager" not in text


def test_dcgm_4_matches_the_drivers_cuda_major():
    assert nvidia_derive.cuda_major("570") == 12
    assert nvidia_derive.cuda_major("575") == 12
    assert nvidia_derive.cuda_major("580") == 13
    p = _plan(extra={"nvidia_driver_branch": "580", "nvidia_driver_version": None})
    assert "datacenter-gpu-manager-4-cuda13" in p.commands("gpu1")
    assert "datacenter-gpu-manager-4-cuda12" not in p.commands("gpu1")


# --- branch 590 and later: NVIDIA's pinning package, names without the branch ------------
# NVIDIA's CUDA repository for apt drops the branch from the driver's package names from
# branch 590 on and selects the branch or version with nvidia-driver-pinning-<branch> or
# -<version>, installed before the driver (NVIDIA driver installation guide: "Recent
# Updates", "Version locking"; docs/components/nvidia.md). Fake hosts only: no real
# repository is read here (tests/unit/test_nvidia_apt_pin.py resolves the pin against a
# SYNTHETIC 590 index).

PIN_590 = "nvidia-driver-pinning-590"


def _install_op(p, host="gpu1"):
    return next(op for op in p.ops[host] if op.name.startswith(("Install NVIDIA driver",
                                                                "Change NVIDIA driver")))


@pytest.mark.parametrize("distro", ["ubuntu2404", "debian12"])
def test_branch_590_installs_nvidias_pinning_package_first_and_the_unbranched_names(distro):
    p = _plan(distro, extra={"nvidia_driver_branch": "590", "nvidia_driver_version": None})
    install = _install_op(p)
    assert install.name == "Install NVIDIA driver 590 (open modules), reboot, verify"
    assert (f"{nvidia_derive.DRIVER_SCRIPT} install --pinning {PIN_590} --fabric-manager "
            "nvidia-fabricmanager --fabric-manager libnvidia-nscq 'nvidia-open'") in install.text
    commands = p.commands("gpu1")
    for old_name in ("nvidia-open-590", "nvidia-fabricmanager-590", "cuda-drivers-590"):
        assert old_name not in commands
    # Our own pin: the same branch, the same package family as before 590 (the new names
    # are nvidia-*, libnvidia-*, cuda-drivers*: tests/unit/test_nvidia_apt_pin.py).
    pin = p.upload("gpu1", nvidia_derive.APT_PIN)
    assert "Pin: version /^([0-9]+:)?590[.-]/\nPin-Priority: 1001\n" in pin
    assert "Package: nvidia-* libnvidia-* cuda-drivers*" in pin
    # The installer: the pinning package in an apt run of its own, after the old
    # driver's holds are released and before the kernel headers and the driver.
    script = p.upload("gpu1", nvidia_derive.DRIVER_SCRIPT)
    body = script.split("\ninstall() {", 1)[1].split("\n}\n", 1)[0]
    lines = [line.strip() for line in body.splitlines()]
    unhold = next(i for i, line in enumerate(lines) if "apt-mark unhold" in line)
    pin_run = lines.index('[ -z "$pins" ] || pin $pins')
    headers = next(i for i, line in enumerate(lines) if line.endswith("linux-headers-$(uname -r)"))
    driver = next(i for i, line in enumerate(lines) if line.endswith(' "$@"'))
    assert unhold < pin_run < headers < driver, body
    pin_fn = script.split("\npin() {", 1)[1].split("\n}\n", 1)[0]
    assert 'if apt-cache show "$p" >/dev/null 2>&1; then' in pin_fn
    assert "apt-get install -y" in pin_fn and '"$p"' in pin_fn
    # DCGM for CUDA 13 (branch 590 runs CUDA 13.1).
    assert "datacenter-gpu-manager-4-cuda13" in commands
    # The proprietary modules: cuda-drivers, without the branch.
    asked = _plan(distro, extra={"nvidia_driver_branch": "590", "nvidia_driver_version": None,
                                 "nvidia_open_kernel_modules": False})
    assert (f"install --pinning {PIN_590} --fabric-manager nvidia-fabricmanager "
            "--fabric-manager libnvidia-nscq 'cuda-drivers'") in _install_op(asked).text


@pytest.mark.parametrize("distro", ["ubuntu2404", "debian12"])
def test_branch_590_exact_version_tries_the_versions_pinning_package_first(distro):
    p = _plan(distro, extra={"nvidia_driver_branch": "590",
                             "nvidia_driver_version": "590.48.01"})
    assert (f"install --pinning {PIN_590}.48.01 --pinning {PIN_590} --fabric-manager "
            "nvidia-fabricmanager --fabric-manager libnvidia-nscq 'nvidia-open'") in \
        _install_op(p).text
    assert "Pin: version /^([0-9]+:)?590\\.48\\.01[.-]/\n" in p.upload(
        "gpu1", nvidia_derive.APT_PIN)
    assert 'want="590.48.01"' in p.upload("gpu1", nvidia_derive.DRIVER_SCRIPT)


def test_a_later_branch_595_takes_the_same_path():
    p = _plan("ubuntu2404", extra={"nvidia_driver_branch": "595", "nvidia_driver_version": None})
    assert ("install --pinning nvidia-driver-pinning-595 --fabric-manager nvidia-fabricmanager "
            "--fabric-manager libnvidia-nscq 'nvidia-open'") in _install_op(p).text


@pytest.mark.parametrize("branch", ["570", "575", "580"])
def test_branches_before_590_keep_their_names_and_no_pinning_package(branch):
    p = _plan("ubuntu2404", extra={"nvidia_driver_branch": branch, "nvidia_driver_version": None})
    install = _install_op(p)
    assert (f"install --fabric-manager nvidia-fabricmanager-{branch} --fabric-manager "
            f"libnvidia-nscq-{branch} 'nvidia-open-{branch}'" in install.text)
    assert "--pinning" not in p.commands("gpu1")
    script = p.upload("gpu1", nvidia_derive.DRIVER_SCRIPT)
    assert "pin()" not in script and "--pinning" not in script and "pins" not in script


def test_rocky_branch_590_keeps_the_module_stream():
    """dnf systems select the branch with the nvidia-driver module stream from 590 on too
    (NVIDIA driver installation guide, "Kernel Modules"): nothing changes there."""
    p = _plan("rocky9", extra={"nvidia_driver_branch": "590", "nvidia_driver_version": None})
    text = _install_op(p).text
    assert ("install --module nvidia-driver:590-open --fabric-manager nvidia-fabric-manager "
            "--fabric-manager libnvidia-nscq-590 'nvidia-driver' 'nvidia-driver-cuda' "
            "'nvidia-persistenced' 'kmod-nvidia-open-dkms'") in text
    assert "--pinning" not in p.commands("gpu1")
    assert "pin()" not in p.upload("gpu1", nvidia_derive.DRIVER_SCRIPT)


OLD_580 = "580.95.05"
PACKAGES_580 = ("nvidia-open-580", "nvidia-driver-580-open", "libnvidia-compute-580",
                "nvidia-fabricmanager-580")


@pytest.mark.parametrize("distro", ["ubuntu2404", "debian12"])
def test_bump_from_580_to_590_drains_installs_the_pinning_package_and_the_new_names(distro):
    facts, nodes = _deployed(distro, version=OLD_580, extra={"nvidia_driver_branch": "580"},
                             packages=PACKAGES_580)
    p = _plan(distro, nodes=nodes, facts=facts,
              extra={"nvidia_driver_branch": "590", "nvidia_driver_version": None})
    name = (f"Change NVIDIA driver {OLD_580} to 590 (drain, install, reboot, verify, resume; "
            "1 node(s) at a time)")
    for node in GPUS:
        op = p.op(node, name)
        text = op.text
        steps = [
            text.index(f"{nvidia_derive.DRIVER_SCRIPT} drain"),
            text.index(f"{nvidia_derive.DRIVER_SCRIPT} install --pinning {PIN_590} "
                       "--fabric-manager nvidia-fabricmanager --fabric-manager "
                       "libnvidia-nscq 'nvidia-open'"),
            text.index("reboot ) </dev/null"),
            text.index(f"{nvidia_derive.DRIVER_SCRIPT} verify --fabric-manager"),
            text.index(f"{nvidia_derive.DRIVER_SCRIPT} resume"),
        ]
        assert steps == sorted(steps), text
        # The 590 pin and the installer that knows the pinning package are in place
        # before the change starts.
        assert "Pin: version /^([0-9]+:)?590[.-]/" in p.upload(node, nvidia_derive.APT_PIN)
        installer = p.op(node, "NVIDIA driver installer (install, hold, drain, verify, resume)")
        assert installer.index < op.index
        assert "\npin() {" in p.upload(node, nvidia_derive.DRIVER_SCRIPT)
    # Nothing of the old branch's names is installed.
    assert "nvidia-open-590" not in p.commands("gpu1")


def _with_pinning(nodes, *packages):
    return {n: [*out, *(f"pinning={p}" for p in packages)] for n, out in nodes.items()}


def test_branch_590_second_run_changes_nothing_and_puts_a_removed_pinning_package_back():
    extra = {"nvidia_driver_branch": "590"}
    facts, nodes = _deployed("ubuntu2404", version="590.48.01", extra=extra,
                             packages=("nvidia-open", "nvidia-driver-open"))
    again = _plan("ubuntu2404", nodes=_with_pinning(nodes, f"{PIN_590}.48.01"), facts=facts,
                  extra={**extra, "nvidia_driver_version": "590.48.01"})
    for name in GPUS:
        assert not again.changing(name), again.changing(name)
        assert f"{name}: NVIDIA driver 590.48.01 (open modules) installed and loaded" in (
            again.names(name))
    # The branch's pinning package is also one the plan accepts for an exact version
    # (the repository may have no version's one).
    branch_pin = _plan("ubuntu2404", nodes=_with_pinning(nodes, PIN_590), facts=facts,
                       extra={**extra, "nvidia_driver_version": "590.48.01"})
    assert not branch_pin.changing("gpu1"), branch_pin.changing("gpu1")
    # An administrator removed it: it is put back, nothing else changes.
    removed = _plan("ubuntu2404", nodes=nodes, facts=facts,
                    extra={**extra, "nvidia_driver_version": "590.48.01"})
    op = removed.op("gpu1", "Install NVIDIA's pinning package for 590.48.01 (the first of "
                            f"{PIN_590}.48.01, {PIN_590} the repository has)")
    assert op.text == f"{nvidia_derive.DRIVER_SCRIPT} pin {PIN_590}.48.01 {PIN_590}"
    assert removed.changing("gpu1") == [op.name]


def test_a_pinning_package_of_another_branch_stops_a_branch_before_590():
    """A pinning package left from branch 590 would pin apt elsewhere than this deploy's
    own pin for 580: the host stops before anything is changed, saying what to remove. One
    of the branch wanted is no conflict."""
    facts, nodes = _deployed("debian12", version=OLD_580, extra={"nvidia_driver_branch": "580"},
                             packages=PACKAGES_580)
    extra = {"nvidia_driver_branch": "580", "nvidia_driver_version": OLD_580}
    p = _plan("debian12", nodes=_with_pinning(nodes, PIN_590), facts=facts, extra=extra)
    stop = p.ops["gpu1"][0]
    assert stop.name == (
        "Stop: nvidia: host 'gpu1': nvidia_driver_branch: NVIDIA's pinning package "
        f"{PIN_590} is installed and pins the driver's packages to another branch or version "
        f"than {OLD_580}, which this deploy pins itself ({nvidia_derive.APT_PIN}): remove it "
        f"(apt-get remove {PIN_590}) and deploy again")
    same = _plan("debian12", nodes=_with_pinning(nodes, "nvidia-driver-pinning-580"),
                 facts=facts, extra=extra)
    assert not same.changing("gpu1"), same.changing("gpu1")


def test_the_fact_reads_nvidias_pinning_package():
    node = parse(["installed=590.48.01", f"pinning={PIN_590}"])
    assert node["pinning"] == [PIN_590]
    assert parse([])["pinning"] == []
    assert "'nvidia-driver-pinning-*'" in nvidia_derive.FACT_COMMAND


# --- the Ansible role decides alike: its filter plugin hands decide() only DECIDE_KEYS -----


def _filter_plugin():
    import importlib.util

    from aicluster import ROLES_DIR

    path = ROLES_DIR / "nvidia" / "filter_plugins" / "aicluster_nvidia.py"
    spec = importlib.util.spec_from_file_location("aicluster_nvidia_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


@pytest.mark.parametrize(("family", "distro_id", "extra"), [
    ("Debian", "ubuntu", {"nvidia_driver_branch": "590", "nvidia_driver_version": "590.48.01"}),
    ("Debian", "debian", {"nvidia_driver_branch": "595", "nvidia_driver_version": None}),
    ("Debian", "ubuntu", {"nvidia_driver_branch": "570", "nvidia_driver_version": VERSION}),
    ("RedHat", "rocky", {"nvidia_driver_branch": "590", "nvidia_driver_version": None}),
])
def test_the_ansible_filter_decides_what_pyinfra_decides(family, distro_id, extra):
    """validate.yml hands aicluster_nvidia_decide the variables named in DECIDE_KEYS only:
    from them it plans the same packages, pinning package and install arguments as decide()
    with every variable (what the pyinfra deploy hands it)."""
    full = {**layered("nvidia", {}), **extra, **nvidia_derive_os(family),
            "nvidia_expected_gpus": 8, "nvidia_gpu_model": "H100-SXM5-80GB",
            "nvidia_gpu_vendor": "nvidia", "nvidia_nvswitch_declared": True,
            "nvidia_ib_declared": False}
    ansible_view = {k: full[k] for k in nvidia_derive.DECIDE_KEYS}
    node = parse(node_output())
    by_filter = _filter_plugin()["aicluster_nvidia_decide"](node, ansible_view, "gpu1",
                                                             distro_id)
    assert by_filter["action"] == "install", by_filter["message"]
    assert by_filter == nvidia_derive.decide(full, node, "gpu1", distro_id)


def nvidia_derive_os(family):
    from aicluster.render import os_vars

    return os_vars("nvidia", family)
