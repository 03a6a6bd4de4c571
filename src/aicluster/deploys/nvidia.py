"""nvidia: the NVIDIA driver at a pinned branch or version, held there, with
nvidia-persistenced, Fabric Manager, nvidia-peermem, DCGM, the container toolkit and
optionally the CUDA toolkit, on the gpu_nodes hosts.

Defaults: roles/nvidia/defaults/main.yml. Templates: roles/nvidia/templates/.
What to do on a node is decided once, here, by :func:`decide` from the inventory and
what the node shows (:mod:`aicluster.facts.nvidia`); the Ansible role calls the same
function through its filter plugin, so both engines decide alike.

A driver change on a node that runs one (a version bump, another flavour of kernel
modules) goes node by node, ``nvidia_upgrade_batch_size`` at a time: drain (Slurm,
k3s), install, reboot, wait for the node, verify the driver version and the GPU
count, resume. A node that fails verification stays drained, the run says so, and
no later batch starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.rpm import RpmPackages
from pyinfra.facts.server import Arch, LinuxDistribution
from pyinfra.operations import apt, files, server, systemd

from aicluster.deploys import (
    NETWORK_ARGS,
    NETWORK_TIMEOUT,
    current_cluster,
    install_packages,
    layered,
    os_family,
    put_template,
    run_on_other_host,
    template_vars,
)
from aicluster.facts.nvidia import FACT_COMMAND, NvidiaNode, turing_or_newer
from aicluster.inventory import Cluster
from aicluster.render import defaults

DRIVER_SCRIPT = "/usr/local/sbin/aicluster-nvidia-driver"
APT_PIN = "/etc/apt/preferences.d/aicluster-nvidia"
UNATTENDED = "/etc/apt/apt.conf.d/51aicluster-nvidia"
PEERMEM_CONF = "/etc/modules-load.d/aicluster-nvidia-peermem.conf"

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

AUTO_BOOL = ("auto", True, False)
#: The variables :func:`decide` reads (defaults, OS vars, derived values).
DECIDE_KEYS = (
    "nvidia_source", "nvidia_driver_branch", "nvidia_driver_version",
    "nvidia_open_kernel_modules", "nvidia_cuda_version", "nvidia_fabric_manager",
    "nvidia_peermem", "nvidia_persistenced", "nvidia_dcgm", "nvidia_container_toolkit",
    "nvidia_driver_packages", "nvidia_fabric_manager_packages", "nvidia_module_streams",
    "nvidia_dcgm_packages", "nvidia_container_toolkit_packages", "nvidia_cuda_package",
    "nvidia_lock_packages", "nvidia_package_version_suffix", "nvidia_expected_gpus",
    "nvidia_gpu_model", "nvidia_gpu_vendor", "nvidia_nvswitch_declared", "nvidia_ib_declared",
)


# ---------------------------------------------------------------------------
# Inventory checks and derived values (both engines)
# ---------------------------------------------------------------------------


def wanted(v: Mapping[str, Any]) -> str:
    """The driver version wanted: the exact version, else the branch."""
    return str(v["nvidia_driver_version"] or v["nvidia_driver_branch"])


def version_matches(installed: str, want: str) -> bool:
    """Whether a driver version (570.133.20) is the one wanted (exact, or of a branch)."""
    return bool(installed) and (installed == want or installed.startswith(f"{want}."))


def validate(cluster: Cluster) -> list[str]:
    """nvidia's own checks of the inventory (host and field named)."""
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
        if v["nvidia_source"] not in ("cuda_repo", "distribution"):
            errors.append(
                f"{where}: nvidia_source: {v['nvidia_source']!r} is not 'cuda_repo' or "
                "'distribution'"
            )
        url = v["nvidia_cuda_repo_url"]
        gpus = cluster.hosts[name].spec.hardware.gpus
        if gpus.vendor == "nvidia" and gpus.count and v["nvidia_source"] == "cuda_repo" and not (
            isinstance(url, str) and re.match(r"^(https?|file)://[^\s]+$", url)
        ):
            errors.append(
                f"{where}: nvidia_cuda_repo_url: {'not set' if not url else repr(url)}; with "
                "nvidia_source 'cuda_repo' give the URL of NVIDIA's CUDA repository or of "
                "your site's mirror of it (the directory holding ubuntu2204/, rhel9/ ...)"
            )
        branch = v["nvidia_driver_branch"]
        if not isinstance(branch, str) or not re.match(r"^[0-9]{3,4}$", branch):
            errors.append(
                f"{where}: nvidia_driver_branch: {branch!r} is not a driver branch "
                "(a string such as '570')"
            )
        version = v["nvidia_driver_version"]
        if version:
            if not isinstance(version, str) or not re.match(r"^[0-9]+(\.[0-9]+){1,2}$", version):
                errors.append(
                    f"{where}: nvidia_driver_version: {version!r} is not a driver version "
                    "(such as '570.133.20')"
                )
            elif isinstance(branch, str) and not version.startswith(f"{branch}."):
                errors.append(
                    f"{where}: nvidia_driver_version: {version} is not of "
                    f"nvidia_driver_branch {branch}"
                )
        cuda = v["nvidia_cuda_version"]
        if cuda and (not isinstance(cuda, str) or not re.match(r"^[0-9]+\.[0-9]+$", cuda)):
            errors.append(
                f"{where}: nvidia_cuda_version: {cuda!r} is not a CUDA version such as '12.8'"
            )
        for var in ("nvidia_open_kernel_modules", "nvidia_fabric_manager", "nvidia_peermem"):
            if v[var] not in AUTO_BOOL or v[var] in (0, 1) and not isinstance(v[var], bool):
                errors.append(f"{where}: {var}: {v[var]!r} is not 'auto', true or false")
        for var in ("nvidia_persistenced", "nvidia_dcgm", "nvidia_container_toolkit"):
            if not isinstance(v[var], bool):
                errors.append(f"{where}: {var}: {v[var]!r} is not true or false")
        for var, low in (
            ("nvidia_upgrade_batch_size", 1),
            ("nvidia_drain_timeout", 0),
            ("nvidia_reboot_timeout", 60),
        ):
            value = v[var]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                errors.append(f"{where}: {var}: {value!r} is not an integer >= {low}")
    return errors


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
        "nvidia_k3s_cordon_command": k3s_cordon_command(host_name, v),
        "nvidia_k3s_uncordon_command": k3s_uncordon_command(host_name),
        # What the Ansible role runs to read the node (the pyinfra fact's command), and
        # the variables it hands to decide() (through its filter plugin).
        "nvidia_fact_command": FACT_COMMAND,
        "nvidia_decide_keys": list(DECIDE_KEYS),
    }


# ---------------------------------------------------------------------------
# What to do on a node (both engines)
# ---------------------------------------------------------------------------


def _subst(text: str, v: Mapping[str, Any]) -> str:
    return str(text).replace("{branch}", str(v["nvidia_driver_branch"]))


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
    ``node``: :func:`aicluster.facts.nvidia.parse` of what the node shows;
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
    if blackwell and not use_open:
        out["action"] = "stop"
        out["message"] = (
            f"{where}: nvidia_open_kernel_modules: the node's GPUs ({devices}) are Blackwell, "
            "which runs only with the open kernel modules; set it to 'auto' or true"
        )
        return out
    flavour = "open" if use_open else "proprietary"
    source = "cuda_repo" if v["nvidia_source"] == "cuda_repo" else distro_id
    table = v["nvidia_driver_packages"] or {}
    if source not in table:
        out["action"] = "stop"
        out["message"] = (
            f"{where}: nvidia_source: {distro_id or 'this distribution'} ships no NVIDIA "
            "driver packages aicluster knows; use nvidia_source 'cuda_repo'"
        )
        return out
    packages = [_subst(p, v) for p in table[source][flavour]]
    suffix = str(v["nvidia_package_version_suffix"])
    if v["nvidia_driver_version"] and suffix:
        packages = [p + suffix.replace("{version}", str(v["nvidia_driver_version"]))
                    for p in packages]
    fm_wanted = _auto(v["nvidia_fabric_manager"],
                      bool(node.get("nvswitches")) or bool(v["nvidia_nvswitch_declared"]))
    fm_package = ""
    if fm_wanted:
        fm_package = _subst((v["nvidia_fabric_manager_packages"] or {}).get(source, ""), v)
        if not fm_package:
            out["action"] = "stop"
            out["message"] = (
                f"{where}: nvidia_fabric_manager: the node has NVSwitches, and "
                f"{distro_id}'s own packages have no Fabric Manager; use nvidia_source "
                "'cuda_repo'"
            )
            return out
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
    extra: list[str] = list(v["nvidia_lock_packages"] or [])
    if v["nvidia_dcgm"]:
        extra += v["nvidia_dcgm_packages"]
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
    runtimes = list(node.get("runtimes") or []) if v["nvidia_container_toolkit"] else []
    configured = set(node.get("runtimes_configured") or [])
    install_args = ([f"--module {stream}"] if stream else []) + (
        [f"--fabric-manager {fm_package}"] if fm_package else []
    ) + [f"'{p}'" for p in packages]
    out.update(
        {
            "action": action,
            "open": use_open,
            "flavour": flavour,
            "source": source,
            "packages": packages,
            "module_stream": stream,
            "fabric_manager": fm_package,
            "fabric_manager_missing": bool(fm_package) and fm_package not in have,
            "install_args": " ".join(install_args),
            "installed": installed,
            "loaded": loaded,
            "unheld": list(node.get("unheld") or []),
            "peermem": _auto(v["nvidia_peermem"],
                             bool(node.get("rdma")) or bool(v["nvidia_ib_declared"])),
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


def k3s_cordon_command(node: str, v: Mapping[str, Any]) -> str:
    """Run on a k3s server: cordon and drain ``node`` unless an administrator cordoned
    it; the annotation marks the cordon as this deploy's."""
    k = "k3s kubectl"
    return (
        f"if [ \"$({k} get node {node} -o jsonpath='{{.spec.unschedulable}}')\" = true ] && "
        f"[ -z \"$({k} get node {node} -o jsonpath='{{.metadata.annotations.aicluster\\.io/"
        f"nvidia-drain}}')\" ]; then echo '{node}: cordoned by an administrator; it stays "
        f"cordoned'; else {k} annotate --overwrite node {node} {K3S_ANNOTATION}=driver && "
        f"{k} cordon {node} && {k} drain {node} --ignore-daemonsets --delete-emptydir-data "
        f"--timeout={int(v['nvidia_drain_timeout'])}s; fi"
    )


def k3s_uncordon_command(node: str) -> str:
    k = "k3s kubectl"
    return (
        f"if [ -n \"$({k} get node {node} -o jsonpath='{{.metadata.annotations.aicluster\\.io/"
        f"nvidia-drain}}')\" ]; then {k} uncordon {node} && {k} annotate node {node} "
        f"{K3S_ANNOTATION}-; else echo '{node}: not cordoned here; left as it is'; fi"
    )


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------

#: Per pyinfra state: hosts whose driver change began, and those where it ended well.
_STARTED: dict[int, set[str]] = {}
_DONE: dict[int, set[str]] = {}


@operation()
def report(message: str):
    """Say what this node gets or why it gets nothing; changes nothing (the operation's
    name, the message, is what pyinfra shows)."""
    host.noop(message)
    yield from ()


@operation(is_idempotent=False)
def stop(message: str):
    """Fail this host with ``message`` (other hosts go on)."""

    def _stop(state, host, message):
        host.log_styled(message, fg="red", log_func=logger.error)
        return False

    yield FunctionCommand(_stop, (message,), {})


@operation(is_idempotent=False)
def driver_change(
    install_args: str,
    drain: bool,
    k3s_server: str = "",
    k3s_cordon: str = "",
    k3s_uncordon: str = "",
    reboot_timeout: int = 900,
    batch_size: int = 0,
):
    """Drain (when ``drain``), install, reboot, wait, verify, resume, as one operation:
    run with ``_parallel=batch_size`` it goes one batch of nodes at a time, and a batch
    does not start after a node of an earlier one failed."""

    def _guard(state, host):
        # pyinfra's batches: the active hosts, in order, batch_size at a time (the same
        # list for the whole operation: failed hosts drop out only after it).
        hosts = [h.name for h in state.inventory.get_active_hosts()]
        mine = hosts.index(host.name) if host.name in hosts else 0
        earlier = set(hosts[: mine - mine % batch_size]) if batch_size else set()
        started = _STARTED.get(id(state), set()) & earlier
        failed = sorted(started - _DONE.get(id(state), set()))
        if failed:
            host.log_styled(
                f"nvidia: not changing the driver here: {', '.join(failed)} failed in an "
                "earlier batch (see above); nothing was drained here",
                fg="red",
                log_func=logger.error,
            )
            return False
        _STARTED.setdefault(id(state), set()).add(host.name)
        return True

    def _finished(state, host):
        _DONE.setdefault(id(state), set()).add(host.name)
        return True

    yield FunctionCommand(_guard, (), {})
    if drain:
        yield StringCommand(DRIVER_SCRIPT, "drain")
        if k3s_server:
            yield FunctionCommand(run_on_other_host, (k3s_server, k3s_cordon), {})
    yield StringCommand(DRIVER_SCRIPT, "install", install_args)
    yield from server.reboot._inner(delay=10, interval=5, reboot_timeout=reboot_timeout)
    yield StringCommand(DRIVER_SCRIPT, "verify")
    if drain:
        yield StringCommand(DRIVER_SCRIPT, "resume")
        if k3s_server:
            yield FunctionCommand(run_on_other_host, (k3s_server, k3s_uncordon), {})
    yield FunctionCommand(_finished, (), {})


@deploy("nvidia", data_defaults=defaults("nvidia"))
def deploy() -> None:
    cluster = current_cluster()
    distribution = host.get_fact(LinuxDistribution)
    family = os_family(distribution)
    v = template_vars("nvidia", cluster, host.name, host.data.dict(), family)
    node = host.get_fact(NvidiaNode)
    packages = host.get_fact(DebPackages if family == "Debian" else RpmPackages) or {}
    distro_id = str(((distribution or {}).get("release_meta") or {}).get("ID", "")).lower()
    plan = decide(v, node, host.name, distro_id, list(packages))
    if plan["action"] == "skip":
        report(name=plan["message"], message=plan["message"])
        return
    if plan["action"] == "stop":
        stop(name=f"Stop: {plan['message']}", message=plan["message"])
        return

    repo = None
    if v["nvidia_source"] == "cuda_repo":
        distro, arch = repo_location(distribution, host.get_fact(Arch))
        v["nvidia_cuda_repo_distro"] = v["nvidia_cuda_repo_distro"] or distro
        v["nvidia_cuda_repo_arch"] = v["nvidia_cuda_repo_arch"] or arch
        if not v["nvidia_cuda_repo_distro"] or not v["nvidia_cuda_repo_arch"]:
            message = (
                f"nvidia: host {host.name!r}: nvidia_cuda_repo_distro: NVIDIA's CUDA "
                "repository has no directory for this system; set nvidia_cuda_repo_distro "
                "and nvidia_cuda_repo_arch, or use nvidia_source 'distribution'"
            )
            stop(name=f"Stop: {message}", message=message)
            return
        repo = _repository(v, family)
    if family == "Debian":
        put_template("nvidia", "aicluster-nvidia.pref.j2", APT_PIN, v,
                     name=f"Pin the NVIDIA driver's packages at {plan['wanted']}")
        put_template("nvidia", "aicluster-nvidia-unattended.conf.j2", UNATTENDED, v,
                     name="Keep the NVIDIA driver out of unattended-upgrades")
    if family == "Debian" and repo is not None:
        apt.update(name="Read the CUDA repository's index (it was just added or changed)",
                   _if=repo.did_change, **NETWORK_ARGS)
    locks = [p for p in v["nvidia_lock_packages"] if p in plan["extra_missing"]]
    if locks:
        # The driver installer holds the driver's packages with these.
        install_packages(f"Install {', '.join(locks)}", locks, family)
    put_template("nvidia", "aicluster-nvidia-driver.j2", DRIVER_SCRIPT, v,
                 name="NVIDIA driver installer (install, hold, drain, verify, resume)",
                 mode="755")
    _driver(v, plan)
    others = [p for p in plan["extra_missing"] if p not in locks]
    if others:
        install_packages(f"Install {', '.join(others)}", others, family)
    else:
        host.noop(f"{', '.join(plan['extra_packages']) or 'no extra packages'} installed")
    _services(v, plan)


def _repository(v: dict[str, Any], family: str):
    base = "/".join(
        str(v[k]) for k in ("nvidia_cuda_repo_url", "nvidia_cuda_repo_distro",
                            "nvidia_cuda_repo_arch")
    )
    if family == "Debian":
        files.directory(name="apt keyrings directory", path="/etc/apt/keyrings", mode="755")
        files.download(
            name="NVIDIA CUDA repository key",
            src=f"{base}/{v['nvidia_cuda_repo_key']}",
            dest=v["nvidia_cuda_repo_keyring"],
            mode="644",
            **NETWORK_ARGS,
        )
    return put_template("nvidia", v["nvidia_cuda_repo_template"], v["nvidia_cuda_repo_file"],
                        v, name=f"NVIDIA CUDA repository ({v['nvidia_cuda_repo_distro']})")


def _driver(v: dict[str, Any], plan: dict[str, Any]) -> None:
    action = plan["action"]
    args = plan["install_args"]
    timeout = int(v["nvidia_reboot_timeout"]) + int(v["nvidia_drain_timeout"]) + NETWORK_TIMEOUT
    if action == "install":
        driver_change(
            name=f"Install NVIDIA driver {plan['wanted']} ({plan['flavour']} modules), "
            "reboot, verify",
            install_args=args,
            drain=False,
            reboot_timeout=int(v["nvidia_reboot_timeout"]),
            _timeout=timeout,
        )
    elif action == "change":
        k3s = v["nvidia_k3s_server"]
        driver_change(
            name=f"Change NVIDIA driver {plan['installed'] or plan['loaded']} to "
            f"{plan['wanted']} (drain, install, reboot, verify, resume; "
            f"{v['nvidia_upgrade_batch_size']} node(s) at a time)",
            install_args=args,
            drain=True,
            k3s_server=k3s,
            k3s_cordon=k3s_cordon_command(host.name, v) if k3s else "",
            k3s_uncordon=k3s_uncordon_command(host.name) if k3s else "",
            reboot_timeout=int(v["nvidia_reboot_timeout"]),
            batch_size=int(v["nvidia_upgrade_batch_size"]),
            _parallel=int(v["nvidia_upgrade_batch_size"]),
            _timeout=timeout,
        )
    else:
        report(name=plan["message"], message=plan["message"])
        if plan["fabric_manager_missing"]:
            server.shell(
                name=f"Install Fabric Manager at driver {plan['loaded']}",
                commands=[f"{DRIVER_SCRIPT} fabric-manager {plan['fabric_manager']}",
                          f"{DRIVER_SCRIPT} hold"],
                _timeout=NETWORK_TIMEOUT,
            )
        elif plan["unheld"]:
            server.shell(
                name=f"Hold the NVIDIA driver's packages at {plan['loaded']} "
                f"({', '.join(plan['unheld'])})",
                commands=[f"{DRIVER_SCRIPT} hold"],
            )
        else:
            host.noop(f"NVIDIA driver {plan['loaded']} packages held")


def _services(v: dict[str, Any], plan: dict[str, Any]) -> None:
    for service in plan["services"]:
        systemd.service(name=f"{service} running and enabled", service=service,
                        running=True, enabled=True)
    if plan["peermem"]:
        put_template("nvidia", "aicluster-nvidia-peermem.conf.j2", PEERMEM_CONF, v,
                     name="Load nvidia-peermem at boot (RDMA devices here)")
        if plan["peermem_loaded"]:
            host.noop("nvidia-peermem loaded")
        elif plan["action"] != "none":
            report(name="nvidia-peermem loads at the reboot",
                   message="nvidia-peermem loads at the reboot")
        else:
            server.modprobe(name="Load nvidia-peermem", module="nvidia-peermem")
    else:
        files.file(name="No nvidia-peermem (no RDMA device here)", path=PEERMEM_CONF,
                   present=False)
    for runtime in plan["runtimes"]:
        server.shell(
            name=f"Configure {runtime} for NVIDIA GPUs (nvidia-container-toolkit)",
            commands=[f"nvidia-ctk runtime configure --runtime={runtime}",
                      f"systemctl restart {runtime}"],
        )
