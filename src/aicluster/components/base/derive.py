"""The base component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aicluster.common.settings import layered, setting
from aicluster.inventory import Cluster

APT_PROXY_FILE = "/etc/apt/apt.conf.d/01aicluster-proxy"
APT_NETWORK_FILE = "/etc/apt/apt.conf.d/80aicluster-network"
SYSCTL_FILE = "/etc/sysctl.d/90-aicluster-network.conf"
LIMITS_FILE = "/etc/security/limits.d/90-aicluster-memlock.conf"
SYSTEMD_LIMITS_FILE = "/etc/systemd/system.conf.d/90-aicluster-limits.conf"
SUDOERS_FILE = "/etc/sudoers.d/90-aicluster-admins"
DNF_CONF = "/etc/dnf/dnf.conf"
#: Rocky's and RHEL's default firewall: where it is installed, base's own table is the
#: host firewall and firewalld is stopped, disabled and masked before it loads.
FIREWALLD_UNIT = "firewalld.service"
FIREWALLD_OFF_COMMANDS = [
    f"systemctl disable --now {FIREWALLD_UNIT}",
    f"systemctl mask {FIREWALLD_UNIT}",
]

#: Why a RedHat-family node installs without the cluster's package cache (said once per
#: host, by both engines, where package_cache or package_proxy is set).
DNF_NO_CACHE_NOTE = (
    "no dnf proxy: the package cache serves apt only (apt-cacher-ng does not relay the "
    "HTTPS that dnf's mirrors use); dnf on this host reaches its mirrors directly"
)

#: Characters a regular expression reads as its own, escaped alike in POSIX extended
#: regular expressions (grep -E, sed -E: pyinfra) and Python's (Ansible's lineinfile).
_REGEX_SPECIAL = frozenset("\\.^$*+?()[]{}|")


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


def _regex_literal(text: str) -> str:
    return "".join(f"\\{c}" if c in _REGEX_SPECIAL else c for c in text)


def dnf_proxy_regexp(cluster: Cluster, data: Mapping[str, Any]) -> str:
    """The ``proxy=`` lines of /etc/dnf/dnf.conf an earlier deploy wrote, which this one
    removes (dnf goes without the package cache): a proxy at apt-cacher-ng's port
    (``base_package_cache_port``) on any host, or the inventory's ``package_proxy``. A
    proxy the site wrote there itself, elsewhere, is left alone. A POSIX extended
    regular expression that Python reads alike."""
    port = int(layered("base", data)["base_package_cache_port"])
    urls = [f"https?://[^/ ]+:{port}"]
    if cluster.spec.package_proxy:
        urls.append(_regex_literal(cluster.spec.package_proxy.rstrip("/")))
    return f"^proxy=({'|'.join(urls)})/?$"


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
        "base_trusted_networks": cluster.trusted_sources(host_name),
        "base_firewall_ssh_port": me.spec.ssh_port,
        "base_apt_proxy_url": apt_proxy_url(cluster, data),
        "base_package_cache_here": cluster.spec.package_cache == host_name,
        # RedHat-family nodes: no dnf proxy (the cache serves apt only), what an earlier
        # deploy wrote removed, and why said once.
        "base_dnf_proxy_regexp": dnf_proxy_regexp(cluster, data),
        "base_dnf_cache_note": DNF_NO_CACHE_NOTE if apt_proxy_url(cluster, data) else "",
        "base_chrony_sources": sources,
        "base_chrony_allow": cluster.network_subnets() if is_time_server else [],
        "base_chrony_local": is_time_server and not upstream,
        "base_sysctl_settings": {k: sysctl[k] for k in sorted(sysctl) if sysctl[k] is not None},
    }


def validate(cluster: Cluster) -> list[str]:
    """base's checks that need the whole inventory (host and field named); the type and
    shape of each setting is base's settings model's (aicluster.components.base.model)."""
    errors = []
    for name, h in cluster.hosts.items():
        server_host = setting("base", h.data, "base_chrony_server_host")
        if server_host and server_host not in cluster.hosts:
            errors.append(
                f"host {name!r}: base_chrony_server_host: {server_host!r} is not a host of "
                "this inventory"
            )
    return errors


