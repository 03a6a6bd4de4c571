"""pyinfra deploys, one module per component, and what they share.

Each component module has

* ``deploy()``: the pyinfra ``@deploy`` that brings a host to the wanted state;
* ``derived_vars(cluster, host_name, data)``: the values computed from the whole
  inventory (peer addresses, merged config dicts) that its templates need. The
  Ansible inventory hands Ansible the very same values (``aicluster.inventory``);
* optionally ``validate(cluster)``: component-specific checks, returning error lines
  that name the host and the field.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from io import StringIO
from types import ModuleType
from typing import Any

from aicluster.inventory import COMPONENT_ORDER, Cluster
from aicluster.render import default_value, defaults, os_vars, render

#: How long one operation that waits on the network may take on a host, and how often
#: it is retried, so one hung mirror fails that host by name instead of stalling all.
NETWORK_TIMEOUT = 900
NETWORK_RETRIES = 2
#: The pyinfra arguments that bound such an operation.
NETWORK_ARGS = {"_timeout": NETWORK_TIMEOUT, "_retries": NETWORK_RETRIES}


_MODULES: dict[str, ModuleType | None] = {}


def component_module(component: str) -> ModuleType | None:
    """The deploy module of a component, or None when it is not built yet (looked up
    once: each host's deploy asks for every component)."""
    if component not in COMPONENT_ORDER:
        raise ValueError(f"unknown component {component!r}")
    if component not in _MODULES:
        try:
            _MODULES[component] = importlib.import_module(f"aicluster.deploys.{component}")
        except ModuleNotFoundError as exc:
            if exc.name != f"aicluster.deploys.{component}":
                raise
            _MODULES[component] = None
    return _MODULES[component]


def unknown_keys(at: str, entry: Mapping[str, Any], known: Iterable[str]) -> list[str]:
    """The error line for keys of an inventory entry the component does not know
    (empty when there are none), naming the keys it does know."""
    known = sorted(known)
    unknown = sorted(map(str, set(entry) - set(known)))
    if not unknown:
        return []
    return [f"{at}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}"]


def layered(component: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The component's variables for one host: its defaults under the host's data."""
    out = defaults(component)
    for key in out:
        if key in data:
            out[key] = data[key]
    return out


def setting(component: str, data: Mapping[str, Any], key: str) -> Any:
    """``layered(component, data)[key]`` without working out (and copying) the
    component's other variables: for values read for every node by every node's deploy."""
    value = default_value(component, key)  # KeyError for a key layered() would not have
    return data[key] if key in data else value


def os_family(distribution: Mapping[str, Any] | None) -> str:
    """Ansible's ``ansible_os_family`` for pyinfra's LinuxDistribution fact."""
    if not distribution:
        raise ValueError("cannot tell the Linux distribution of this host")
    meta = distribution.get("release_meta") or {}
    ids = {str(meta.get("ID", "")).lower(), *str(meta.get("ID_LIKE", "")).lower().split()}
    name = str(distribution.get("name") or "").lower()
    if ids & {"debian", "ubuntu"} or name in ("debian", "ubuntu"):
        return "Debian"
    if ids & {"rhel", "fedora", "centos", "rocky", "almalinux"} or "rocky" in name:
        return "RedHat"
    raise ValueError(f"unsupported distribution {distribution.get('name')!r}")


def template_vars(
    component: str,
    cluster: Cluster,
    host_name: str,
    data: Mapping[str, Any],
    family: str,
    **facts: Any,
) -> dict[str, Any]:
    """Everything a component's templates may use: defaults under host data, the OS
    vars, the derived values, values read from the host, and ``inventory_hostname``."""
    module = component_module(component)
    out = layered(component, data)
    out.update(os_vars(component, family))
    if module is not None and hasattr(module, "derived_vars"):
        out.update(module.derived_vars(cluster, host_name, data))
    out.update(facts)
    out["inventory_hostname"] = host_name
    return out


def put_template(
    component: str,
    template: str,
    dest: str,
    variables: Mapping[str, Any],
    *,
    name: str | None = None,
    mode: str = "644",
    user: str = "root",
    group: str = "root",
):
    """Render ``roles/<component>/templates/<template>`` and upload it (a pyinfra op)."""
    from pyinfra.operations import files

    text = render(component, template, variables)
    return files.put(
        name=name or f"Write {dest}",
        src=StringIO(text),
        dest=dest,
        mode=mode,
        user=user,
        group=group,
    )


def systemd_manager_conf(
    component: str, template: str, dest: str, variables: Mapping[str, Any], *,
    name: str, reload_name: str,
):
    """A drop-in for systemd's own manager (``/etc/systemd/system.conf.d``), rendered
    from the component's template; the manager re-executes only when it changed."""
    from pyinfra.operations import files, server

    files.directory(name="systemd manager drop-in directory", path="/etc/systemd/system.conf.d")
    conf = put_template(component, template, dest, variables, name=name)
    server.shell(name=reload_name, commands=["systemctl daemon-reexec"], _if=conf.did_change)
    return conf


def system_user(
    name: str,
    user: str,
    *,
    group: str | None = None,
    groups: list[str] | None = None,
    append: bool = False,
    home: str | None = None,
    shell: str | None = None,
    system: bool = False,
    create_home: bool = False,
):
    """pyinfra's ``server.user`` (a pyinfra op), without reading every account of the
    node when this one is already as wanted: ``server.user`` reads the ``Users`` fact,
    five commands per account, on every run. When the account exists with this home,
    shell and groups, only its home directory's ownership is ensured (what
    ``server.user`` itself then does); otherwise ``server.user`` makes or mends it."""
    from pyinfra import host
    from pyinfra.operations import files, server

    from aicluster.facts.system import UserAccount

    have = host.get_fact(UserAccount, user=user)
    wanted_groups = list(groups or [])
    as_wanted = have is not None and (
        (home is None or have["home"] == home)
        and (shell is None or have["shell"] == shell)
        and (group is None or have["group"] == group)
        and (not wanted_groups or (
            set(wanted_groups) <= set(have["groups"]) if append
            else set(wanted_groups) == set(have["groups"])))
    )
    if as_wanted:
        return files.directory(
            name=f"{name}: home directory",
            path=home or have["home"] or f"/home/{user}",
            user=user,
            group=group or user,
            _no_fail_on_link=True,
        )
    return server.user(
        name=name, user=user, group=group, groups=groups, append=append, home=home,
        shell=shell, system=system, create_home=create_home,
    )


def run_on_other_host(state, host, other_name: str, command: str) -> bool:
    """A pyinfra FunctionCommand callback: run ``command`` on the inventory host
    ``other_name`` (e.g. cordon a node on a k3s server during this host's turn),
    connecting to it first if needed; True when it succeeded."""
    from pyinfra.api import StringCommand

    other = state.inventory.get_host(other_name)
    if not other.connected:
        other.connect()
    ok, _output = other.run_shell_command(StringCommand(command), print_output=True)
    return bool(ok)


def install_packages(name: str, packages: list[str], family: str):
    """Install distribution packages (a pyinfra op), bounded in time and retries; on
    Debian and Ubuntu the apt index is refreshed when it is over an hour old."""
    from pyinfra.operations import apt, dnf

    if family == "Debian":
        return apt.packages(
            name=name, packages=packages, update=True, cache_time=3600, **NETWORK_ARGS
        )
    return dnf.packages(name=name, packages=packages, **NETWORK_ARGS)


_CLUSTERS: dict[int, Cluster] = {}


def current_cluster() -> Cluster:
    """The validated cluster of the inventory pyinfra is running (validated once)."""
    from pyinfra.context import ctx_inventory

    from aicluster.inventory import cluster_from_pyinfra

    inventory = ctx_inventory.get()
    if id(inventory) not in _CLUSTERS:
        _CLUSTERS[id(inventory)] = cluster_from_pyinfra(inventory)
    return _CLUSTERS[id(inventory)]
