"""A component's variables for one host, engine-free: its defaults under the host's
data, the distribution's vars, and the values derived from the whole inventory."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aicluster.common.limits import NETWORK_RETRIES, NETWORK_TIMEOUT
from aicluster.components import derive_module
from aicluster.inventory import Cluster, majority_first
from aicluster.render import default_value, defaults, os_vars

#: The pyinfra arguments that bound such an operation.
NETWORK_ARGS = {"_timeout": NETWORK_TIMEOUT, "_retries": NETWORK_RETRIES}


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


def derived(component: str, cluster: Cluster, host_name: str,
            data: Mapping[str, Any]) -> dict[str, Any]:
    """The component's values derived from the whole inventory for one host."""
    module = derive_module(component)
    if module is None or not hasattr(module, "derived_vars"):
        return {}
    return module.derived_vars(cluster, host_name, data)


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
    out = layered(component, data)
    out.update(os_vars(component, family))
    out.update(derived(component, cluster, host_name, data))
    out.update(facts)
    out["inventory_hostname"] = host_name
    return out


def merge_config(default: Mapping[str, Any] | None,
                 user: Mapping[str, Any] | None) -> dict[str, Any]:
    """A config dict (``<c>_default_config`` and the user's ``<c>_config``): the user's
    keys over the defaults, a key the user sets to None removed."""
    out = dict(default or {})
    for key, value in (user or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def config_text(value: Any, true: str = "yes", false: str = "no") -> str:
    """A config value as the file writes it (a boolean in the file's own words)."""
    if isinstance(value, bool):
        return true if value else false
    return str(value)


def differs_from_first(component: str, cluster: Cluster, names: list[str],
                       keys: Iterable[str], nodes: str) -> list[str]:
    """Settings every host of a component shares: one line for each later host and key
    whose value differs from the first host's (``nodes`` names the hosts, "Ray node")."""
    if not names:
        return []
    values = {n: layered(component, cluster.hosts[n].data) for n in names}
    out = []
    for key in keys:
        # The value most hosts have is the reference: the odd host is the one reported.
        first = majority_first(names, lambda n, k=key: values[n][k])
        out += [f"host {name!r}: {key}: {values[name][key]!r} differs from "
                f"{values[first][key]!r} on host {first!r}; it must be the same on every "
                f"{nodes} (set it in group_data)"
                for name in names if values[name][key] != values[first][key]]
    return out
