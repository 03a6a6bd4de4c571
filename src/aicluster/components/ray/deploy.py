"""ray: a Ray cluster (head and workers) as systemd units, Ray in a venv per version.

Defaults: roles/ray/defaults/main.yml. Templates: roles/ray/templates/.

The order of the operations is the upgrade order, and pyinfra runs each operation on
every host before the next one: every node installs the wanted version into its own
venv beside the running one (nothing stops), then the workers stop (only when the head
runs another version), the head switches to the new version and restarts, and only
then the workers switch and (re)join. Old venvs are removed last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, pip, server, systemd

from aicluster.common.ops import (
    install_packages,
    inventory_hosts,
    owned_directory,
    put_template,
    system_user,
    this_host,
)
from aicluster.common.settings import NETWORK_ARGS, layered, os_family
from aicluster.components.ray.derive import (
    UNIT_DIR,
    _python,
    check_nodes,
    node_ip,
    ray_hosts,
    upgrading,
    venv_path,
)
from aicluster.components.ray.facts import RayNode
from aicluster.inventory import Cluster
from aicluster.render import defaults, os_vars


def read_nodes(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The RayNode fact of every Ray node of the inventory pyinfra runs."""
    out = {}
    for name, other in inventory_hosts(ray_hosts(cluster)):
        family = os_family(other.get_fact(LinuxDistribution))
        # What the node's own deploy reads (its template_vars), without working out
        # all of its derived values for every other node's deploy.
        ov = {**layered("ray", other.data.dict()), **os_vars("ray", family)}
        out[name] = other.get_fact(
            RayNode, python=_python(ov), venv=venv_path(ov), install_dir=ov["ray_install_dir"]
        )
    return out


@deploy("ray", data_defaults=defaults("ray"))
def deploy() -> None:
    cluster, family, v = this_host("ray")
    nodes = read_nodes(cluster)
    node_ips = {name: node_ip(cluster, name) for name in nodes}
    problem = check_nodes(nodes, node_ips)
    if problem:
        raise DeployError(f"ray: {problem}")
    me = nodes[host.name]
    is_head = v["ray_node_role"] == "head"

    _install(v, family, me)
    if v["ray_temp_dir_make"]:
        # The same path on every Ray node: workers use the head's. World-writable, as
        # Ray makes it when it starts (so a re-run finds nothing to change).
        owned_directory(f"Ray's temporary directory {v['ray_temp_path']}", v["ray_temp_path"],
                        v["ray_user"], mode="777")

    # The upgrade order: workers stop, the head switches and restarts, workers rejoin.
    # pyinfra orders operations as a graph of each host's own sequence; the wait below
    # is one operation on every node (the same call), so the workers' units come after
    # everything the head does before it.
    upgrade = upgrading(cluster, nodes, v["ray_version"])
    if not is_head and upgrade:
        systemd.service(
            name=f"Stop the Ray worker while the head upgrades to {v['ray_version']}",
            service="ray-worker",
            running=False,
        )
    head_restart = _unit(v, "head") if is_head else None
    server.shell(
        name="Wait until the Ray head answers",
        commands=[v["ray_head_wait_command"]],
        # The head after a restart; a worker before it joins an upgraded head.
        _if=head_restart.did_change if head_restart else (lambda: upgrade),
    )
    if not is_head:
        _unit(v, "worker")

    for version in me["versions"]:
        if version != v["ray_version"]:
            files.directory(
                name=f"Remove Ray {version} (the nodes run {v['ray_version']})",
                path=f"{v['ray_install_dir']}/{version}",
                present=False,
            )


def _install(v: dict[str, Any], family: str, me: Mapping[str, Any]) -> None:
    install_packages("Install Python and venv for Ray", v["ray_packages"], family)
    server.group(name=f"Ray group {v['ray_user']}", group=v["ray_user"], system=True)
    system_user(
        name=f"Ray user {v['ray_user']}",
        user=v["ray_user"],
        group=v["ray_user"],
        system=True,
        home=f"/var/lib/{v['ray_user']}",
        create_home=True,
        shell="/usr/sbin/nologin",
    )
    files.directory(
        name=f"Ray {v['ray_version']} directory",
        path=f"{v['ray_install_dir']}/{v['ray_version']}",
    )
    pip.virtualenv(
        name=f"Virtual environment for Ray {v['ray_version']}",
        path=v["ray_venv"],
        python=_python(v),
        venv=True,
    )
    if me.get("ray") == v["ray_version"]:
        host.noop(f"Ray {v['ray_version']} is installed in {v['ray_venv']}")
    else:
        server.shell(
            name=f"Install Ray {v['ray_version']}",
            commands=[v["ray_pip_install_command"]],
            **NETWORK_ARGS,
        )


def _unit(v: dict[str, Any], role: str):
    service = f"ray-{role}"
    unit = put_template(
        "ray",
        f"{service}.service.j2",
        f"{UNIT_DIR}/{service}.service",
        v,
        name=f"Write the Ray {role} unit",
    )
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    restart = systemd.service(
        name=f"Restart the Ray {role} (its unit changed)",
        service=service,
        restarted=True,
        _if=unit.did_change,
    )
    systemd.service(
        name=f"Ray {role} running and enabled", service=service, running=True, enabled=True
    )
    return restart
