"""nvidia: the NVIDIA driver at a pinned branch or version, held there, with
nvidia-persistenced, Fabric Manager, nvidia-peermem, DCGM, the container toolkit and
optionally the CUDA toolkit, on the gpu_nodes hosts.

Defaults: roles/nvidia/defaults/main.yml. Templates: roles/nvidia/templates/.
What to do on a node is decided once, here, by :func:`decide` from the inventory and
what the node shows (:mod:`aicluster.components.nvidia.facts`); the Ansible role calls the same
function through its filter plugin, so both engines decide alike.

A driver change on a node that runs one (a version bump, another flavour of kernel
modules) goes node by node, ``nvidia_upgrade_batch_size`` at a time: drain (Slurm,
k3s), install, reboot, wait for the node, verify the driver version and the GPU
count, resume. A node that fails verification stays drained, the run says so, and
no later batch starts.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.rpm import RpmPackages
from pyinfra.facts.server import Arch, LinuxDistribution
from pyinfra.operations import apt, files, server, systemd

from aicluster.common.ops import (
    Rollout,
    current_cluster,
    install_packages,
    put_template,
    run_on_other_host,
)
from aicluster.common.settings import (
    NETWORK_ARGS,
    NETWORK_TIMEOUT,
    os_family,
    template_vars,
)
from aicluster.components.nvidia.derive import (
    APT_PIN,
    DRIVER_SCRIPT,
    PEERMEM_CONF,
    PERSISTENCED_DROPIN,
    PERSISTENCED_DROPIN_DIR,
    UNATTENDED,
    decide,
    repo_location,
)
from aicluster.components.nvidia.facts import NvidiaNode
from aicluster.render import defaults


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


#: Which nodes began their driver change in this run, and which ended it well.
_ROLLOUT = Rollout("nvidia")


@operation(is_idempotent=False)
def driver_change(
    install_args: str,
    drain: bool,
    k3s_server: str = "",
    k3s_cordon: str = "",
    k3s_uncordon: str = "",
    reboot_timeout: int = 900,
    batch_size: int = 0,
    verify_args: str = "",
):
    """Drain (when ``drain``), install, reboot, wait, verify, resume, as one operation:
    run with ``_parallel=batch_size`` it goes one batch of nodes at a time, and a batch
    does not start after a node of an earlier one failed."""

    def _earlier(state, host):
        # pyinfra's batches: the active hosts, in order, batch_size at a time (the same
        # list for the whole operation: failed hosts drop out only after it).
        hosts = [h.name for h in state.inventory.get_active_hosts()]
        mine = hosts.index(host.name) if host.name in hosts else 0
        return set(hosts[: mine - mine % batch_size]) if batch_size else set()

    yield _ROLLOUT.begin(_earlier, "not changing the driver here: {failed} failed in an "
                         "earlier batch (see above); nothing was drained here")
    if drain:
        yield StringCommand(DRIVER_SCRIPT, "drain")
        if k3s_server:
            yield FunctionCommand(run_on_other_host, (k3s_server, k3s_cordon), {})
    yield StringCommand(DRIVER_SCRIPT, "install", install_args)
    yield from server.reboot._inner(delay=10, interval=5, reboot_timeout=reboot_timeout)
    yield StringCommand(DRIVER_SCRIPT, "verify", *([verify_args] if verify_args else []))
    if drain:
        yield StringCommand(DRIVER_SCRIPT, "resume")
        if k3s_server:
            yield FunctionCommand(run_on_other_host, (k3s_server, k3s_uncordon), {})
    yield _ROLLOUT.end()


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
            verify_args=plan["verify_args"],
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
            verify_args=plan["verify_args"],
            drain=True,
            k3s_server=k3s,
            k3s_cordon=v["nvidia_k3s_cordon_command"] if k3s else "",
            k3s_uncordon=v["nvidia_k3s_uncordon_command"] if k3s else "",
            reboot_timeout=int(v["nvidia_reboot_timeout"]),
            batch_size=int(v["nvidia_upgrade_batch_size"]),
            _parallel=int(v["nvidia_upgrade_batch_size"]),
            _timeout=timeout,
        )
    else:
        report(name=plan["message"], message=plan["message"])
        if plan["pinning_missing"]:
            # Branch 590 on: every install puts NVIDIA's pinning package in first; here the
            # driver is the one wanted and the package was removed (or is another one).
            server.shell(
                name=f"Install NVIDIA's pinning package for {plan['wanted']} (the first of "
                f"{', '.join(plan['pinning'])} the repository has)",
                commands=[f"{DRIVER_SCRIPT} pin {' '.join(plan['pinning'])}"],
                _timeout=NETWORK_TIMEOUT,
            )
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
    if "nvidia-persistenced" in plan["services"]:
        files.directory(name="The nvidia-persistenced drop-in directory",
                        path=PERSISTENCED_DROPIN_DIR)
        dropin = put_template("nvidia", "aicluster-nvidia-persistenced.conf.j2",
                              PERSISTENCED_DROPIN, v,
                              name="Run nvidia-persistenced with persistence mode on (drop-in)")
        systemd.daemon_reload(name="Reload systemd units (nvidia-persistenced drop-in)",
                              _if=dropin.did_change)
        systemd.service(name="Restart nvidia-persistenced (persistence mode changed)",
                        service="nvidia-persistenced", restarted=True, _if=dropin.did_change)
    else:
        files.file(name="No nvidia-persistenced drop-in (nvidia_persistenced: false)",
                   path=PERSISTENCED_DROPIN, present=False)
    for service in plan["services"]:
        systemd.service(name=f"{service} running and enabled", service=service,
                        running=True, enabled=True)
    if plan["peermem"]:
        put_template("nvidia", "aicluster-nvidia-peermem.conf.j2", PEERMEM_CONF, v,
                     name=f"Load nvidia-peermem at boot: {plan['peermem_reason']}")
        if plan["peermem_loaded"]:
            host.noop("nvidia-peermem loaded")
        elif plan["action"] != "none":
            report(name="nvidia-peermem loads at the reboot",
                   message="nvidia-peermem loads at the reboot")
        else:
            server.modprobe(name="Load nvidia-peermem", module="nvidia-peermem")
    else:
        files.file(name=f"No nvidia-peermem: {plan['peermem_reason']}", path=PEERMEM_CONF,
                   present=False)
    for runtime in plan["runtimes"]:
        server.shell(
            name=f"Configure {runtime} for NVIDIA GPUs (nvidia-container-toolkit)",
            commands=[f"nvidia-ctk runtime configure --runtime={runtime}",
                      f"systemctl restart {runtime}"],
        )
