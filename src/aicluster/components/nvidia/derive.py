"""The nvidia component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aicluster.common.epel import EPEL_COMMAND
from aicluster.common.rollout import drain_command, uncordon_command
from aicluster.common.settings import (
    layered,
)
from aicluster.common.versions import version_matches
from aicluster.components.nvidia.probe import FACT_COMMAND, turing_or_newer
from aicluster.inventory import Cluster

DRIVER_SCRIPT = "/usr/local/sbin/aicluster-nvidia-driver"
APT_PIN = "/etc/apt/preferences.d/aicluster-nvidia"
UNATTENDED = "/etc/apt/apt.conf.d/51aicluster-nvidia"
PEERMEM_CONF = "/etc/modules-load.d/aicluster-nvidia-peermem.conf"
#: nvidia-persistenced with persistence mode on (the packaged unit turns it off).
PERSISTENCED_DROPIN_DIR = "/etc/systemd/system/nvidia-persistenced.service.d"
PERSISTENCED_DROPIN = f"{PERSISTENCED_DROPIN_DIR}/aicluster.conf"

#: The first PCI device id of Blackwell: these GPUs run only with the open modules.
BLACKWELL_FIRST_DEVICE = 0x2900
#: The CUDA repository's directory per distribution (ID, major version).
REPO_DISTROS = {
    ("ubuntu", "22"): "ubuntu2204",
    ("ubuntu", "24"): "ubuntu2404",
    ("debian", "12"): "debian12",
    ("rhel", "9"): "rhel9",
    ("redhat", "9"): "rhel9",  # Ansible's name for RHEL
    ("rocky", "9"): "rhel9",
    ("almalinux", "9"): "rhel9",
}
REPO_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}
#: Annotation that marks a k3s node cordoned by this deploy (never an admin's cordon).
K3S_ANNOTATION = "aicluster.io/nvidia-drain"

#: The variables :func:`decide` reads (defaults, OS vars, derived values).
DECIDE_KEYS = (
    "nvidia_source", "nvidia_driver_branch", "nvidia_driver_version",
    "nvidia_open_kernel_modules", "nvidia_cuda_version", "nvidia_fabric_manager",
    "nvidia_peermem", "nvidia_persistenced", "nvidia_dcgm", "nvidia_container_toolkit",
    "nvidia_driver_packages", "nvidia_fabric_manager_packages", "nvidia_nscq_packages",
    "nvidia_module_streams",
    "nvidia_dcgm_packages", "nvidia_container_toolkit_packages", "nvidia_cuda_package",
    "nvidia_lock_packages", "nvidia_package_version_suffix", "nvidia_expected_gpus",
    "nvidia_gpu_model", "nvidia_gpu_vendor", "nvidia_nvswitch_declared", "nvidia_ib_declared",
    "nvidia_open_modules_lag", "nvidia_precompiled_modules", "nvidia_precompiled_packages",
    "nvidia_pinning_from_branch", "nvidia_pinning_packages",
)


# ---------------------------------------------------------------------------
# Inventory checks and derived values (both engines)
# ---------------------------------------------------------------------------


def wanted(v: Mapping[str, Any]) -> str:
    """The driver version wanted: the exact version, else the branch."""
    return str(v["nvidia_driver_version"] or v["nvidia_driver_branch"])



def validate(cluster: Cluster) -> list[str]:
    """nvidia's checks that need the whole inventory (host and field named): one upgrade
    batch size for the cluster, a repository URL where NVIDIA GPUs are declared. The
    type and shape of each setting is nvidia's settings model's
    (aicluster.components.nvidia.model)."""
    errors = []
    batch_sizes: dict[str, Any] = {}
    for name in cluster.group("gpu_nodes"):
        if name not in cluster.hosts:
            continue
        v = layered("nvidia", cluster.hosts[name].data)
        where = f"host {name!r}"
        first = next(iter(batch_sizes.items()), None)
        batch_sizes.setdefault(name, v["nvidia_upgrade_batch_size"])
        if first is not None and first[1] != v["nvidia_upgrade_batch_size"]:
            errors.append(
                f"{where}: nvidia_upgrade_batch_size: {v['nvidia_upgrade_batch_size']!r} "
                f"differs from {first[1]!r} on host {first[0]!r}; driver changes go one batch "
                "size for the whole cluster (set it in group_data)"
            )
        gpus = cluster.hosts[name].spec.hardware.gpus
        if (gpus.vendor == "nvidia" and gpus.count and v["nvidia_source"] == "cuda_repo"
                and not v["nvidia_cuda_repo_url"]):
            errors.append(
                f"{where}: nvidia_cuda_repo_url: not set; with nvidia_source 'cuda_repo' give "
                "the URL of NVIDIA's CUDA repository or of your site's mirror of it (the "
                "directory holding ubuntu2204/, rhel9/ ...)"
            )
    return errors


def upgrade_batches(cluster: Cluster, names: list[str]) -> tuple[int, list[list[str]]]:
    """``nvidia_upgrade_batch_size`` (one size for the cluster: validate()) and the
    batches a driver change on every one of ``names`` (NVIDIA GPU nodes, in inventory
    order) goes in, that many at a time."""
    if not names:
        return 0, []
    size = int(layered("nvidia", cluster.hosts[names[0]].data)["nvidia_upgrade_batch_size"])
    return size, [names[i:i + size] for i in range(0, len(names), size)]


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    h = cluster.hosts[host_name]
    gpus = h.spec.hardware.gpus
    v = layered("nvidia", data)
    k3s = [s for s in cluster.group("k3s_servers") if s != host_name]
    is_k3s = host_name in (*cluster.group("k3s_servers"), *cluster.group("k3s_agents"))
    return {
        "nvidia_expected_gpus": gpus.count,
        "nvidia_gpu_model": gpus.model,
        "nvidia_gpu_vendor": gpus.vendor,
        "nvidia_nvswitch_declared": gpus.nvswitch,
        "nvidia_ib_declared": bool(h.spec.hardware.ib_ports),
        # The k3s server that cordons and drains this node (none: no k3s here).
        "nvidia_k3s_server": (k3s[0] if k3s else host_name) if is_k3s else "",
        "nvidia_k3s_cordon_command": drain_command(
            host_name, int(v["nvidia_drain_timeout"]), K3S_ANNOTATION, "driver"),
        "nvidia_k3s_uncordon_command": uncordon_command(host_name, K3S_ANNOTATION),
        # What the Ansible role runs to read the node (the pyinfra fact's command), and
        # the variables it hands to decide() (through its filter plugin).
        "nvidia_fact_command": FACT_COMMAND,
        "nvidia_decide_keys": list(DECIDE_KEYS),
        # EL9: CodeReady Builder, then EPEL (dkms), as every EPEL install of the deploy
        # (the installer runs it where nvidia_prepare_epel).
        "nvidia_epel_command": EPEL_COMMAND,
    }


# ---------------------------------------------------------------------------
# What to do on a node (both engines)
# ---------------------------------------------------------------------------


#: The first driver branch of each CUDA major version (the newest CUDA the driver runs:
#: CUDA 12 needs 525, CUDA 13 needs 580): DCGM 4's datacenter-gpu-manager-4-cuda<major>.
CUDA_MAJOR_BRANCHES = ((580, 13), (525, 12), (450, 11))


def cuda_major(branch: Any) -> int:
    """The CUDA major version driver branch ``branch`` runs (570: 12, 580: 13)."""
    return next((major for first, major in CUDA_MAJOR_BRANCHES if int(branch) >= first), 11)


def _subst(text: str, v: Mapping[str, Any]) -> str:
    return (str(text).replace("{branch}", str(v["nvidia_driver_branch"]))
            .replace("{cuda_major}", str(cuda_major(v["nvidia_driver_branch"]))))


#: The driver-package table's entry for NVIDIA's CUDA repository from the branch on which
#: it names the packages without the branch and pins with a pinning package
#: (``nvidia_pinning_from_branch``, vars/Debian.yml).
PINNED_SOURCE = "cuda_repo_pinned"
PINNING_PREFIX = "nvidia-driver-pinning-"


def pinned_packaging(v: Mapping[str, Any]) -> bool:
    """Whether the node's driver comes from NVIDIA's CUDA repository at a branch whose
    packages carry no branch in their names, selected by NVIDIA's pinning package (apt,
    from branch 590 on; never on dnf systems)."""
    first = v["nvidia_pinning_from_branch"]
    return (v["nvidia_source"] == "cuda_repo" and first is not None
            and int(v["nvidia_driver_branch"]) >= int(first))


def pinning_packages(v: Mapping[str, Any]) -> list[str]:
    """NVIDIA's pinning packages for the driver wanted, the one to install first: the
    exact version's (when nvidia_driver_version is set), then the branch's."""
    version = v["nvidia_driver_version"]
    out = []
    for name in v["nvidia_pinning_packages"] or []:
        if "{version}" in str(name):
            if not version:
                continue
            name = str(name).replace("{version}", str(version))
        out.append(_subst(name, v))
    return out


def _auto(value: Any, detected: bool) -> bool:
    """``auto`` -> what was detected; else the value as a boolean (Ansible's extra vars
    give "false" as text)."""
    if value == "auto":
        return detected
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true")
    return bool(value)


def decide(
    v: Mapping[str, Any],
    node: Mapping[str, Any],
    host_name: str,
    distro_id: str,
    installed_packages: list[str] | None = None,
) -> dict[str, Any]:
    """What the nvidia component does on a node.

    ``v``: the role's variables for the node (defaults, OS vars, derived values);
    ``node``: :func:`aicluster.components.nvidia.facts.parse` of what the node shows;
    ``distro_id``: the distribution's id (``ubuntu``, ``debian``, ``rocky``);
    ``installed_packages``: names of the packages installed on the node.

    ``action`` is ``skip`` (nothing NVIDIA here; ``message`` says why), ``stop``
    (this host stops with ``message``), ``install`` (no driver yet: install, reboot,
    verify), ``change`` (another driver is installed or loaded: drain, install,
    reboot, verify, resume) or ``none`` (the driver wanted is installed and loaded).
    """
    have = set(installed_packages or [])
    pci = list(node.get("pci_gpus") or [])
    count = int(v["nvidia_expected_gpus"])
    model = str(v["nvidia_gpu_model"])
    out: dict[str, Any] = {"action": "skip", "message": "", "wanted": wanted(v)}
    where = f"nvidia: host {host_name!r}"
    devices = ", ".join(f"10de:{g['device'][2:]} at {g['address']}" for g in pci) or "none"

    if v["nvidia_gpu_vendor"] == "standin":
        out["message"] = (
            f"{host_name}: skipped: hardware.gpus declares a stand-in ({count} x {model!r}, "
            f"vendor 'standin'), not an NVIDIA GPU; NVIDIA GPUs on the PCI bus: {len(pci)}; "
            "nothing installed"
        )
        return out
    if not pci and not count:
        out["message"] = f"{host_name}: skipped: no NVIDIA GPU on the PCI bus or in the inventory"
        return out
    if len(pci) != count:
        out["action"] = "stop"
        out["message"] = (
            f"{where}: hardware.gpus: the inventory declares {count} x {model}, the node shows "
            f"{len(pci)} NVIDIA GPU(s) on its PCI bus ({devices}); correct hardware.gpus.count "
            "or the node before deploying it"
        )
        return out
    smi = list(node.get("smi") or [])
    if node.get("loaded") and smi and len(smi) != count:
        out["action"] = "stop"
        out["message"] = (
            f"{where}: hardware.gpus: the inventory declares {count} x {model}, nvidia-smi "
            f"sees {len(smi)} ({', '.join(g['name'] + ' ' + g['bus_id'] for g in smi)}); "
            "a GPU is lost (see nvidia-smi and the kernel log)"
        )
        return out

    ids = [g["device"] for g in pci]
    blackwell = any(int(d, 16) >= BLACKWELL_FIRST_DEVICE for d in ids)
    choice = v["nvidia_open_kernel_modules"]
    use_open = _auto(choice, bool(turing_or_newer(ids, model)))
    source = "cuda_repo" if v["nvidia_source"] == "cuda_repo" else distro_id
    if choice == "auto" and source in (v["nvidia_open_modules_lag"] or []) and not blackwell:
        # Debian 12: the open modules (contrib) are not rebuilt with the driver's
        # security updates (non-free), whose exact-version dependencies they then break
        # (tests/e2e/test_lab_archives.py): the proprietary ones follow the driver.
        use_open = False
    if blackwell and not use_open:
        out["action"] = "stop"
        out["message"] = (
            f"{where}: nvidia_open_kernel_modules: the node's GPUs ({devices}) are Blackwell, "
            "which runs only with the open kernel modules; set it to 'auto' or true"
        )
        return out
    flavour = "open" if use_open else "proprietary"
    table = v["nvidia_driver_packages"] or {}
    # From branch 590 on NVIDIA's CUDA repository for apt drops the branch from the
    # package names and pins with its pinning package (vars/Debian.yml).
    pinned = pinned_packaging(v)
    key = PINNED_SOURCE if pinned else source
    pinning = pinning_packages(v) if pinned else []
    installed_pins = sorted(node.get("pinning") or [])
    # A pinning package that selects another branch or version than the one wanted:
    # branches before 590 install none, so one there is left from a later branch (or an
    # administrator's) and would pin apt elsewhere than this deploy's pin.
    allowed = {f"{PINNING_PREFIX}{x}" for x in (v["nvidia_driver_branch"],
                                                 v["nvidia_driver_version"]) if x}
    stale = [p for p in installed_pins if p not in allowed]
    if not pinned and stale:
        out["action"] = "stop"
        out["message"] = (
            f"{where}: nvidia_driver_branch: NVIDIA's pinning package {', '.join(stale)} "
            f"is installed and pins the driver's packages to another branch or version "
            f"than {wanted(v)}, which this deploy pins itself ({APT_PIN}): remove it "
            f"(apt-get remove {' '.join(stale)}) and deploy again"
        )
        return out
    if key not in table:
        out["action"] = "stop"
        out["message"] = (
            f"{where}: nvidia_source: {distro_id or 'this distribution'} ships no NVIDIA "
            "driver packages aicluster knows; use nvidia_source 'cuda_repo'"
        )
        return out
    packages = [_subst(p, v) for p in table[key][flavour]]
    precompiled = bool(v["nvidia_precompiled_modules"])
    if precompiled:
        signed = (v["nvidia_precompiled_packages"] or {}).get(source, {}).get(flavour)
        if not signed:
            out["action"] = "stop"
            out["message"] = (
                f"{where}: nvidia_precompiled_modules: only Ubuntu's own driver packages "
                "(nvidia_source: distribution on Ubuntu) come as precompiled, signed "
                "modules; this node's would be built with DKMS"
            )
            return out
        kernel = str(node.get("kernel") or "")
        kernel_flavour = kernel.rsplit("-", 1)[-1] if "-" in kernel else ""
        if not kernel_flavour or kernel_flavour.isdigit():
            out["action"] = "stop"
            out["message"] = (
                f"{where}: nvidia_precompiled_modules: cannot tell the running kernel's "
                f"flavour from {kernel or 'nothing'!r} (uname -r, e.g. 6.8.0-45-generic)"
            )
            return out
        packages = [_subst(p, v).replace("{kernel_flavour}", kernel_flavour)
                    for p in signed] + packages
    suffix = str(v["nvidia_package_version_suffix"])
    if v["nvidia_driver_version"] and suffix:
        packages = [p + suffix.replace("{version}", str(v["nvidia_driver_version"]))
                    for p in packages]
    fm_wanted = _auto(v["nvidia_fabric_manager"],
                      bool(node.get("nvswitches")) or bool(v["nvidia_nvswitch_declared"]))
    fm_package = ""
    if fm_wanted:
        fm_package = _subst((v["nvidia_fabric_manager_packages"] or {}).get(key, ""), v)
        if not fm_package:
            out["action"] = "stop"
            out["message"] = (
                f"{where}: nvidia_fabric_manager: the node has NVSwitches, and "
                f"{distro_id}'s own packages have no Fabric Manager; use nvidia_source "
                "'cuda_repo'"
            )
            return out
    # The NVSwitch packages, at the driver's version: Fabric Manager first, then NSCQ,
    # the NVSwitch query library DCGM reads the switches through ("the version of
    # libnvidia-nscq must match the NVIDIA driver installed", NVIDIA's packaging).
    nvswitch_packages = [p for p in (
        fm_package, _subst((v["nvidia_nscq_packages"] or {}).get(key, ""), v) if fm_package
        else "") if p]
    streams = v["nvidia_module_streams"] or {}
    stream = _subst(streams[flavour], v) if source == "cuda_repo" and flavour in streams else ""

    installed, loaded = str(node.get("installed") or ""), str(node.get("loaded") or "")
    want = wanted(v)
    if not installed and not loaded:
        action = "install"
    elif (
        version_matches(installed, want)
        and version_matches(loaded, want)
        and installed == loaded
        and bool(node.get("open_modules")) == use_open
    ):
        action = "none"
    else:
        action = "change"
    if action != "none" and node.get("secure_boot") and not precompiled:
        out["action"] = "stop"
        out["message"] = (
            f"{where}: Secure Boot is on, and the driver's kernel modules would be built "
            "with DKMS, unsigned: the kernel would refuse to load them. On Ubuntu set "
            "nvidia_source: distribution and nvidia_precompiled_modules: true (Canonical's "
            "signed linux-modules-nvidia packages); elsewhere enroll a Machine Owner Key "
            "that signs DKMS's modules (mokutil --import), or turn Secure Boot off "
            "(docs/components/nvidia.md, Secure Boot)"
        )
        return out
    extra: list[str] = list(v["nvidia_lock_packages"] or [])
    if v["nvidia_dcgm"]:
        extra += [_subst(p, v) for p in v["nvidia_dcgm_packages"]]
    if v["nvidia_container_toolkit"]:
        extra += v["nvidia_container_toolkit_packages"]
    if v["nvidia_cuda_version"]:
        major, minor = str(v["nvidia_cuda_version"]).split(".")
        extra.append(str(v["nvidia_cuda_package"]).replace("{major}", major)
                     .replace("{minor}", minor))
    services = []
    if v["nvidia_persistenced"]:
        services.append("nvidia-persistenced")
    if fm_package:
        services.append("nvidia-fabricmanager")
    if v["nvidia_dcgm"]:
        services.append("nvidia-dcgm")
    peermem, peermem_reason = _peermem(v, node)
    runtimes = list(node.get("runtimes") or []) if v["nvidia_container_toolkit"] else []
    configured = set(node.get("runtimes_configured") or [])
    install_args = [f"--pinning {p}" for p in pinning] + (
        [f"--module {stream}"] if stream else []) + (
        [f"--fabric-manager {p}" for p in nvswitch_packages]
    ) + [f"'{p}'" for p in packages]
    out.update(
        {
            "action": action,
            "open": use_open,
            "flavour": flavour,
            "source": source,
            "packages": packages,
            "module_stream": stream,
            # NVIDIA's pinning package (branch 590 on, apt): the candidates, in order, and
            # whether none of them is installed (the driver installer installs the first
            # the repository has, before the driver).
            "pinning": pinning,
            "pinning_missing": bool(pinning) and not set(pinning) & set(installed_pins),
            # Fabric Manager and NSCQ (NVSwitch nodes), space-separated: what the
            # installer's fabric-manager installs at the driver's version.
            "fabric_manager": " ".join(nvswitch_packages),
            "fabric_manager_missing": any(p not in have for p in nvswitch_packages),
            "install_args": " ".join(install_args),
            # NVSwitch nodes: verify also waits for Fabric Manager and the GPUs' fabric.
            "verify_args": "--fabric-manager" if fm_package else "",
            "installed": installed,
            "loaded": loaded,
            "unheld": list(node.get("unheld") or []),
            "peermem": peermem,
            "peermem_reason": peermem_reason,
            "peermem_loaded": bool(node.get("peermem_loaded")),
            "extra_packages": extra,
            "extra_missing": [p for p in extra if p not in have],
            "services": services,
            "runtimes": [r for r in runtimes if r not in configured],
            "message": _summary(host_name, action, want, installed, loaded, flavour, count,
                                model),
        }
    )
    return out


def _peermem(v: Mapping[str, Any], node: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether nvidia-peermem is loaded here, and why (or why not).

    nvidia-peermem registers with ib_core's peer-memory API, which only MLNX_OFED's and
    DOCA-OFED's ib_core have: with the kernel's inbox RDMA stack its init fails
    (-EINVAL), at every boot. There GPUDirect RDMA goes through DMA-BUF (the open kernel
    modules and a recent kernel; NCCL and UCX use it by themselves), which needs no
    module. So ``auto`` loads it only where RDMA devices are (present or
    ``hardware.ib_ports`` declared) AND MLNX_OFED/DOCA-OFED is (``ofed_info``, or the
    running ib_core exports ib_register_peer_memory_client); true or false decide."""
    choice = v["nvidia_peermem"]
    if choice != "auto":
        wanted_here = _auto(choice, False)
        return wanted_here, "nvidia_peermem is " + ("true" if wanted_here else "false")
    if not (node.get("rdma") or v["nvidia_ib_declared"]):
        return False, "no RDMA device here"
    if node.get("ofed") or node.get("peer_memory_api"):
        return True, f"RDMA devices and {node.get('ofed') or 'a peer-memory ib_core'} here"
    return False, ("inbox RDMA stack, no MLNX_OFED/DOCA-OFED peer-memory API: GPUDirect "
                   "RDMA goes through DMA-BUF")


def _summary(name, action, want, installed, loaded, flavour, count, model) -> str:
    if action == "none":
        return f"{name}: NVIDIA driver {loaded} ({flavour} modules) installed and loaded"
    if action == "install":
        return (
            f"{name}: install NVIDIA driver {want} ({flavour} modules) for {count} x {model}, "
            "reboot, verify"
        )
    return (
        f"{name}: change the NVIDIA driver (installed {installed or 'none'}, loaded "
        f"{loaded or 'none'}) to {want} ({flavour} modules): drain, install, reboot, verify, "
        "resume"
    )


def repo_dirs(ident: str, major: Any, arch: str) -> list[str]:
    """The CUDA repository's distribution directory and architecture ("" when it has
    none) for a distribution id (``ubuntu``), major version and machine (``x86_64``)."""
    return [REPO_DISTROS.get((str(ident).lower(), str(major)), ""),
            REPO_ARCHES.get(str(arch or ""), "")]


def repo_location(distribution: Mapping[str, Any] | None, arch: str | None) -> list[str]:
    """:func:`repo_dirs` for pyinfra's LinuxDistribution and Arch facts."""
    meta = (distribution or {}).get("release_meta") or {}
    return repo_dirs(str(meta.get("ID", "")), (distribution or {}).get("major") or "", arch or "")


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


# Taking the component off a host
# ---------------------------------------------------------------------------

#: What a deploy takes off a host the inventory no longer gives the NVIDIA stack
#: (aicluster.common.absence): its daemons stopped and disabled (persistence, Fabric
#: Manager, DCGM), the apt pin, the unattended-upgrades exclusion, the driver tool and
#: nvidia-peermem's boot load removed. The driver stays installed and held (from branch
#: 590 on with NVIDIA's pinning package, a package too; the services keep their names).
REMOVAL = {
    "nvidia": {"services": ["nvidia-dcgm", "nvidia-fabricmanager", "nvidia-persistenced"],
               "files": [APT_PIN, UNATTENDED, DRIVER_SCRIPT, PEERMEM_CONF,
                         PERSISTENCED_DROPIN]},
}
#: Why the inventory's remove_packages may not name nvidia.
KEEP_PACKAGES = ("the NVIDIA driver's packages are held and its kernel modules in use, so "
                 "the deploy never uninstalls them: remove them by hand, then reboot "
                 "(docs/components/nvidia.md)")
