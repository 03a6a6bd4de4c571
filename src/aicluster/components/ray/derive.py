"""The ray component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from aicluster.common.disks import cache_environment
from aicluster.common.networks import host_address, network_errors, pick_network
from aicluster.common.settings import differs_from_first, layered, setting
from aicluster.components.ray.probe import command_text
from aicluster.inventory import Cluster, majority_first

UNIT_DIR = "/etc/systemd/system"
GIB = 1024**3
#: Ray's own floor for the object store (75 MiB).
MIN_OBJECT_STORE = 75 * 1024**2


# ---------------------------------------------------------------------------
# Values computed from the whole inventory (both engines use these)
# ---------------------------------------------------------------------------


def ray_hosts(cluster: Cluster) -> list[str]:
    """The Ray nodes, head first."""
    return [*cluster.group("ray_head"), *(
        h for h in cluster.group("ray_workers") if h not in cluster.group("ray_head")
    )]


def ray_network(cluster: Cluster, data: Mapping[str, Any]) -> str:
    """The network Ray runs on: the inventory's ``ray_network``, or fabric when every
    Ray node has an address there, else management."""
    return pick_network(cluster, setting("ray", data, "ray_network"), ray_hosts(cluster))


def _bind_address(cluster: Cluster, name: str, network: str) -> str:
    return host_address(cluster, name, network) or cluster.hosts[name].address


def node_ip(cluster: Cluster, host_name: str) -> str:
    """The address Ray binds to on *host_name*: its address on the head's
    ``ray_network`` (:func:`ray_network`), else its management address."""
    head = cluster.group("ray_head")[0] if cluster.group("ray_head") else host_name
    return _bind_address(cluster, host_name, ray_network(cluster, cluster.hosts[head].data))


def venv_path(v: Mapping[str, Any]) -> str:
    """The Ray virtual environment of the host whose variables are *v*."""
    return f"{v['ray_install_dir']}/{v['ray_version']}/venv"


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("ray", data)
    head = cluster.group("ray_head")[0] if cluster.group("ray_head") else host_name
    head_v = layered("ray", cluster.hosts[head].data)
    network = ray_network(cluster, cluster.hosts[head].data)
    node_ip = _bind_address(cluster, host_name, network)
    head_ip = _bind_address(cluster, head, network)
    hw = cluster.hosts[host_name].spec.hardware
    memory = hw.memory_gb * GIB
    store = min(
        int(memory * float(v["ray_object_store_fraction"])),
        int(v["ray_object_store_max_gb"]) * GIB,
    )
    resources = dict(v["ray_resources"] or {})
    venv = venv_path(v)
    head_address = f"{_url_host(head_ip)}:{head_v['ray_port']}"
    return {
        "ray_cluster_name": cluster.spec.cluster_name,
        "ray_node_role": "head" if host_name == head else "worker",
        "ray_head_host": head,
        "ray_network_name": network,
        "ray_node_ip": node_ip,
        "ray_head_address": head_address,
        "ray_dashboard_bind": v["ray_dashboard_host"] or node_ip,
        "ray_venv": venv,
        "ray_num_cpus": hw.cpus,
        "ray_num_gpus": hw.gpus.count,
        "ray_memory_bytes": int(memory * float(v["ray_memory_fraction"])),
        "ray_object_store_memory_bytes": max(store, MIN_OBJECT_STORE),
        "ray_resources_json": (
            json.dumps(resources, sort_keys=True, separators=(",", ":")) if resources else ""
        ),
        "ray_temp_path": temp_path(cluster, head_v),
        # Whether the Ray component makes that directory: not when it is Ray's default
        # (Ray makes it) nor one of the host's NVMe cache directories (the nvme_cache
        # component makes those: one owner per path).
        "ray_temp_dir_make": temp_dir_make(cluster, host_name, head_v),
        "ray_pip_requirement": _requirement(v),
        "ray_pip_install_command": pip_install_command(venv, v),
        "ray_head_wait_command": head_wait_command(venv, head_address),
        "ray_fact_command": command_text(venv, v["ray_install_dir"]),
    }


#: Ray's own temporary directory when it is given none.
RAY_DEFAULT_TEMP = "/tmp/ray"


def temp_path(cluster: Cluster, head_v: Mapping[str, Any]) -> str:
    """Ray's temporary directory, one path for the whole cluster: a worker node takes
    the head's and fails to start where it cannot create it (a head whose temporary
    directory is on its NVMe cache, workers without one). The inventory's
    ``ray_temp_dir`` (on the head), else the cache's ray directory when every Ray node
    has the NVMe cache, else Ray's default."""
    if head_v.get("ray_temp_dir"):
        return str(head_v["ray_temp_dir"]).rstrip("/") or "/"
    cached = set()
    for name in cluster.group("ray_head") + cluster.group("ray_workers"):
        environment = cache_environment(cluster, name, cluster.hosts[name].data)
        if not environment:
            return RAY_DEFAULT_TEMP
        if "RAY_TMPDIR" in environment:
            cached.add(environment["RAY_TMPDIR"])
    return cached.pop() if len(cached) == 1 else RAY_DEFAULT_TEMP


def temp_dir_make(cluster: Cluster, host_name: str, head_v: Mapping[str, Any]) -> bool:
    """Whether this host's Ray deploy makes Ray's temporary directory (see
    :func:`temp_path`): only a directory the inventory names (``ray_temp_dir``) that is
    not one of the host's NVMe cache directories."""
    path = temp_path(cluster, head_v)
    if path == RAY_DEFAULT_TEMP:
        return False
    data = cluster.hosts[host_name].data
    return path not in cache_environment(cluster, host_name, data).values()


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _requirement(v: Mapping[str, Any]) -> str:
    extras = list(v["ray_pip_extras"] or [])
    return f"ray[{','.join(extras)}]=={v['ray_version']}" if extras else f"ray=={v['ray_version']}"


def validate(cluster: Cluster) -> list[str]:
    """ray's checks of the inventory that need more than one value (the settings model,
    aicluster.components.ray.model, has checked each value): host and field named."""
    errors: list[str] = []
    nodes = ray_hosts(cluster)
    if not nodes:
        return errors
    # The version most nodes run is the reference: the odd node is the one reported.
    first = majority_first(nodes, lambda n: layered("ray", cluster.hosts[n].data)["ray_version"])
    first_v = layered("ray", cluster.hosts[first].data)
    errors += differs_from_first("ray", cluster, nodes,
                                 ("ray_network", "ray_port", "ray_install_dir", "ray_python"),
                                 "Ray node")
    for name in nodes:
        v = layered("ray", cluster.hosts[name].data)
        where = f"host {name!r}"
        version = v["ray_version"]
        if not version:
            errors.append(
                f"{where}: ray_version: not set; pin the Ray version every node runs "
                "(ray_version in group_data/all.py)"
            )
        elif name != first and version != first_v["ray_version"]:
            errors.append(
                f"{where}: ray_version: {version!r} differs from {first_v['ray_version']!r} "
                f"on host {first!r}; every Ray node runs one version (set it in group_data)"
            )
        if v["ray_network"]:
            errors += network_errors(cluster, name, "ray_network", v["ray_network"], "")
        share = v["ray_memory_fraction"] + v["ray_object_store_fraction"]
        if share > 0.95:
            errors.append(
                f"{where}: ray_memory_fraction: with ray_object_store_fraction it gives Ray "
                f"{share:.2f} of the node's memory; leave at least 0.05 to the system"
            )
    return errors


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


def _python(v: Mapping[str, Any]) -> str:
    return v["ray_python"] or v["ray_os_python"]


def check_nodes(
    nodes: Mapping[str, Mapping[str, Any]], node_ips: Mapping[str, str] | None = None
) -> str | None:
    """Why the Ray nodes cannot form one cluster (different Pythons, or a node without
    the address Ray is to bind to), or None."""
    for name, ip in sorted((node_ips or {}).items()):
        have = (nodes.get(name) or {}).get("addresses")
        if have is not None and ip not in have:
            return (
                f"host {name!r} does not have the address Ray binds to, {ip} (ray_network); "
                f"it has {', '.join(have)}. Configure that network on the node first, or "
                "set ray_network to a network the nodes have addresses on."
            )
    pythons = {n: f["python"] for n, f in nodes.items() if f.get("python")}
    if len(set(pythons.values())) > 1:
        seen = ", ".join(f"{n} {p}" for n, p in sorted(pythons.items()))
        return (
            "Ray nodes run different Python versions, and Ray joins only nodes of one "
            f"Python: {seen}. Give every Ray node the same Python (ray_python) first."
        )
    return None


def upgrading(cluster: Cluster, nodes: Mapping[str, Mapping[str, Any]], version: str) -> bool:
    """Whether the head runs another Ray version than the wanted one (an upgrade)."""
    head = cluster.group("ray_head")
    deployed = nodes.get(head[0], {}).get("deployed") if head else None
    return bool(deployed) and deployed != version


def pip_install_command(venv: str, v: Mapping[str, Any]) -> str:
    """The one pip command both engines run (timeout and bounded retries of its own)."""
    return (
        f"{venv}/bin/pip install --no-input --disable-pip-version-check "
        f"--timeout {int(v['ray_pip_timeout'])} --retries {int(v['ray_pip_retries'])} "
        f"{shlex.quote(_requirement(v))}"
    )


def head_wait_command(venv: str, head_address: str) -> str:
    """Wait (bounded) until the head's GCS answers, so workers join a running head."""
    return (
        f"for i in $(seq 40); do timeout 10 {venv}/bin/ray health-check "
        f"--address {head_address} >/dev/null 2>&1 && exit 0; sleep 3; done; "
        f"echo 'the Ray head did not answer at {head_address} within 2 to 9 minutes' >&2; "
        "exit 1"
    )


#: What a deploy takes off a host the inventory no longer gives a Ray role (by role, and
#: the component's own key when the host loses it altogether): services stopped and
#: disabled, configuration files the deploy wrote removed, services reloaded afterwards
#: (aicluster.common.absence). Data stays (Ray's temporary directory); Ray's venvs too,
#: unless the inventory's remove_packages names ray.
REMOVAL = {
    "ray_head": {"services": ["ray-head"], "files": [f"{UNIT_DIR}/ray-head.service"]},
    "ray_workers": {"services": ["ray-worker"], "files": [f"{UNIT_DIR}/ray-worker.service"]},
    "ray": {"services": ["ray-head", "ray-worker"],
            "files": [f"{UNIT_DIR}/ray-head.service", f"{UNIT_DIR}/ray-worker.service"],
            "software": ["{ray_install_dir}"]},
}
