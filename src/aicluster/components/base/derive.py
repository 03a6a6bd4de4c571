"""The base component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from aicluster.common.settings import layered
from aicluster.inventory import Cluster

USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
PUBKEY_RE = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+) [A-Za-z0-9+/=]+( .*)?$")

APT_PROXY_FILE = "/etc/apt/apt.conf.d/01aicluster-proxy"
APT_NETWORK_FILE = "/etc/apt/apt.conf.d/80aicluster-network"
SYSCTL_FILE = "/etc/sysctl.d/90-aicluster-network.conf"
LIMITS_FILE = "/etc/security/limits.d/90-aicluster-memlock.conf"
SYSTEMD_LIMITS_FILE = "/etc/systemd/system.conf.d/90-aicluster-limits.conf"
SUDOERS_FILE = "/etc/sudoers.d/90-aicluster-admins"


# ---------------------------------------------------------------------------
# Values computed from the whole inventory (both engines use these)
# ---------------------------------------------------------------------------


def apt_proxy_url(cluster: Cluster, data: Mapping[str, Any]) -> str:
    """The package cache URL every node's apt goes through, or "" for none."""
    if cluster.spec.package_proxy:
        return cluster.spec.package_proxy.rstrip("/")
    if cluster.spec.package_cache:
        cache = cluster.hosts[cluster.spec.package_cache]
        port = layered("base", data)["base_package_cache_port"]
        return f"http://{cache.address}:{port}"
    return ""


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("base", data)
    me = cluster.hosts[host_name]
    server_host = v["base_chrony_server_host"]
    upstream = list(v["base_chrony_upstream"] or [])
    is_time_server = server_host == host_name
    if server_host and not is_time_server:
        sources = [f"server {cluster.hosts[server_host].address} iburst"]
    else:
        sources = upstream
    sysctl = {**(v["base_default_sysctl"] or {}), **(v["base_sysctl"] or {})}
    return {
        "base_etc_hosts": cluster.etc_hosts(),
        "base_trusted_networks": cluster.network_subnets(),
        "base_firewall_ssh_port": me.spec.ssh_port,
        "base_apt_proxy_url": apt_proxy_url(cluster, data),
        "base_package_cache_here": cluster.spec.package_cache == host_name,
        "base_chrony_sources": sources,
        "base_chrony_allow": cluster.network_subnets() if is_time_server else [],
        "base_chrony_local": is_time_server and not upstream,
        "base_sysctl_settings": {k: sysctl[k] for k in sorted(sysctl) if sysctl[k] is not None},
    }


def validate(cluster: Cluster) -> list[str]:
    """base's own checks of the inventory (host and field named)."""
    errors = []
    for name, h in cluster.hosts.items():
        v = layered("base", h.data)
        where = f"host {name!r}"
        server_host = v["base_chrony_server_host"]
        if server_host and (not isinstance(server_host, str) or server_host not in cluster.hosts):
            errors.append(
                f"{where}: base_chrony_server_host: {server_host!r} is not a host of this inventory"
            )
        users = v["base_admin_users"] or []
        if not isinstance(users, list):
            errors.append(f"{where}: base_admin_users: must be a list of users")
            users = []
        for i, user in enumerate(users):
            field = f"base_admin_users[{i}]"
            if not isinstance(user, Mapping) or not USER_RE.match(str(user.get("name", ""))):
                errors.append(f"{where}: {field}.name: not a valid user name")
                continue
            unknown = set(user) - {"name", "ssh_keys", "sudo", "shell"}
            if unknown:
                errors.append(f"{where}: {field}: unknown field(s) {', '.join(sorted(unknown))}")
            keys = user.get("ssh_keys") or []
            if not isinstance(keys, list):
                errors.append(f"{where}: {field}.ssh_keys: must be a list of public keys")
                keys = []
            for j, key in enumerate(keys):
                if not isinstance(key, str) or not PUBKEY_RE.match(key):
                    errors.append(
                        f"{where}: {field}.ssh_keys[{j}]: not an SSH public key "
                        "(a private key must never be in the inventory)"
                    )
        sysctls: dict[Any, Any] = {}
        for var in ("base_default_sysctl", "base_sysctl"):
            if not isinstance(v[var] or {}, Mapping):
                errors.append(f"{where}: {var}: must be a mapping of sysctl name to value")
            else:
                sysctls.update(v[var] or {})
        for key, value in sysctls.items():
            if not re.match(r"^[a-z0-9_]+(\.[A-Za-z0-9_-]+)+$", str(key)):
                errors.append(f"{where}: base_sysctl: {key!r} is not a sysctl name")
            elif value is not None and not re.match(r"^[A-Za-z0-9 ._:-]+$", str(value)):
                errors.append(f"{where}: base_sysctl.{key}: {value!r} is not a sysctl value")
    return errors


def _any(*ops):
    return lambda: any(op.did_change() for op in ops)

