"""base: hostname, /etc/hosts, chrony, sysctls, memlock, apt cache, admin users, nftables.

Defaults: roles/base/defaults/main.yml. Templates: roles/base/templates/.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, server, systemd

from aicluster.deploys import (
    current_cluster,
    install_packages,
    layered,
    os_family,
    put_template,
    system_user,
    systemd_manager_conf,
    template_vars,
)
from aicluster.facts.system import ContainerVirt, NftTable
from aicluster.inventory import Cluster
from aicluster.render import defaults

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


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


def _in_container() -> bool:
    return bool(host.get_fact(ContainerVirt))


@deploy("base", data_defaults=defaults("base"))
def deploy() -> None:
    cluster = current_cluster()
    family = os_family(host.get_fact(LinuxDistribution))
    in_container = _in_container()
    v = template_vars("base", cluster, host.name, host.data.dict(), family)

    _packages(v, family)

    if v["base_hostname_manage"]:
        server.hostname(name=f"Set the hostname to {host.name}", hostname=host.name)
    put_template("base", "hosts.j2", "/etc/hosts", v, name="Write /etc/hosts (cluster nodes)")

    _chrony(v, in_container)

    sysctl_file = put_template(
        "base", "90-aicluster-network.conf.j2", SYSCTL_FILE, v, name="Write network sysctls"
    )
    server.shell(
        name="Apply network sysctls",
        commands=[f"sysctl -e -q -p {SYSCTL_FILE}"],
        _if=sysctl_file.did_change,
    )

    put_template(
        "base", "90-aicluster-memlock.conf.j2", LIMITS_FILE, v, name="Memlock limit for logins"
    )
    systemd_manager_conf(
        "base", "90-aicluster-limits.conf.j2", SYSTEMD_LIMITS_FILE, v,
        name="Memlock limit for services", reload_name="Reload systemd's manager limits",
    )

    _admin_users(v)
    _firewall(v)


def _packages(v: dict[str, Any], family: str) -> None:
    if family == "Debian":
        put_template("base", "80aicluster-network.j2", APT_NETWORK_FILE, v, name="Apt timeouts")
        if v["base_package_cache_here"]:
            install_packages(
                "Install the cluster package cache (apt-cacher-ng)", ["apt-cacher-ng"], family
            )
            systemd.service(
                name="Start the package cache",
                service="apt-cacher-ng",
                running=True,
                enabled=True,
            )
        if v["base_apt_proxy_url"]:
            put_template(
                "base", "01aicluster-proxy.j2", APT_PROXY_FILE, v, name="Apt through the cache"
            )
        else:
            files.file(name="No apt proxy", path=APT_PROXY_FILE, present=False)
    else:
        proxy = v["base_apt_proxy_url"]
        files.line(
            name="dnf through the package cache" if proxy else "No dnf proxy",
            path="/etc/dnf/dnf.conf",
            line=r"^proxy=.*$",
            replace=f"proxy={proxy}" if proxy else "",
            present=bool(proxy),
        )
    install_packages("Install base packages", v["base_packages"], family)


def _chrony(v: dict[str, Any], in_container: bool) -> None:
    service = v["base_chrony_service"]
    conf = put_template(
        "base", "chrony.conf.j2", v["base_chrony_conf"], v, name="Write chrony.conf"
    )
    dropin_dir = f"/etc/systemd/system/{service}.service.d"
    dropin_path = f"{dropin_dir}/aicluster-container.conf"
    if in_container:
        files.directory(name="chrony drop-in directory", path=dropin_dir)
        dropin = put_template(
            "base",
            "aicluster-container.conf.j2",
            dropin_path,
            v,
            name="chrony in a container: keep time, leave the clock to the host",
        )
    else:
        dropin = files.file(name="No container drop-in for chrony", path=dropin_path, present=False)
    systemd.daemon_reload(name="Reload systemd units", _if=dropin.did_change)
    systemd.service(
        name="Restart chrony (configuration changed)",
        service=service,
        restarted=True,
        _if=_any(conf, dropin),
    )
    systemd.service(name="chrony running and enabled", service=service, running=True, enabled=True)


def _any(*ops):
    return lambda: any(op.did_change() for op in ops)


def _admin_users(v: dict[str, Any]) -> None:
    for user in v["base_admin_users"]:
        name = user["name"]
        system_user(
            name=f"Admin user {name}",
            user=name,
            shell=user.get("shell") or v["base_admin_shell"],
            create_home=True,
        )
        files.directory(
            name=f"{name}'s .ssh", path=f"/home/{name}/.ssh", mode="700", user=name, group=name
        )
        put_template(
            "base",
            "authorized_keys.j2",
            f"/home/{name}/.ssh/authorized_keys",
            {**v, "base_admin_user": user},
            name=f"{name}'s authorized_keys",
            mode="600",
            user=name,
            group=name,
        )
    put_template(
        "base", "90-aicluster-admins.j2", SUDOERS_FILE, v, name="sudo for admin users", mode="440"
    )


def _firewall(v: dict[str, Any]) -> None:
    conf_path = v["base_nftables_conf"]
    if not v["base_firewall_enabled"]:
        if host.get_fact(NftTable, family="inet", table="aicluster"):
            server.shell(
                name="Firewall disabled: remove the aicluster table",
                commands=["nft delete table inet aicluster"],
            )
        else:
            host.noop("firewall disabled and no aicluster table loaded")
        return
    conf = put_template(
        "base", "nftables.conf.j2", conf_path, v, name="Write the firewall rules", mode="755"
    )
    systemd.service(
        name="Firewall loaded and enabled",
        service="nftables",
        running=True,
        enabled=True,
        reloaded=True,
        _if=conf.did_change,
    )
    systemd.service(name="Firewall enabled", service="nftables", running=True, enabled=True)
