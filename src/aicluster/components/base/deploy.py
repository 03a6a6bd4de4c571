"""base: hostname, /etc/hosts, chrony, sysctls, memlock, apt cache, admin users, nftables
(firewalld, where installed, stopped, disabled and masked before it).

Defaults: roles/base/defaults/main.yml. Templates: roles/base/templates/.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from aicluster.common.drift import sysctl_apply_command
from aicluster.common.facts import ContainerVirt, NftTable, UnitLoaded
from aicluster.common.ops import (
    current_cluster,
    install_packages,
    nft_rules_loaded,
    put_template,
    say,
    sysctls_applied,
    system_user,
    systemd_manager_conf,
)
from aicluster.common.settings import os_family, template_vars
from aicluster.components.base.derive import (
    APT_NETWORK_FILE,
    APT_PROXY_FILE,
    DNF_CONF,
    FIREWALLD_OFF_COMMANDS,
    FIREWALLD_UNIT,
    LIMITS_FILE,
    SUDOERS_FILE,
    SYSCTL_FILE,
    SYSTEMD_LIMITS_FILE,
)
from aicluster.render import defaults

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
        # Applied, and the values the kernel refuses recorded (see sysctls_applied).
        commands=[sysctl_apply_command(SYSCTL_FILE, v["base_sysctl_settings"])],
        _if=sysctl_file.did_change,
    )
    # The live values, whatever set them since (sysctl -w, another tool): applied again
    # where one differs, restarting nothing.
    sysctls_applied(
        name="Network sysctls in effect (repaired where they drifted)",
        path=SYSCTL_FILE,
        settings=v["base_sysctl_settings"],
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
        # The package cache is apt's (apt-cacher-ng): dnf goes to its mirrors directly,
        # and a proxy line an earlier deploy wrote is removed.
        if v["base_dnf_cache_note"]:
            say(v["base_dnf_cache_note"])
        files.line(
            name="No dnf proxy (the package cache serves apt only)",
            path=DNF_CONF,
            line=v["base_dnf_proxy_regexp"],
            present=False,
            extended_regex=True,
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
        _if=any_changed(conf, dropin),
    )
    systemd.service(name="chrony running and enabled", service=service, running=True, enabled=True)


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
    _firewalld_off()
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
    # The live table, whatever changed it since (nft flush ruleset, a hand-added rule):
    # loaded again from the rules file when missing or different, restarting nothing.
    nft_rules_loaded(
        name="Firewall table as written (reloaded where it drifted)", rules_file=conf_path
    )


def _firewalld_off() -> None:
    """firewalld (on by default on Rocky and RHEL) would drop, by its own zones, the
    traffic between the nodes that base's table accepts, and its unit conflicts with
    nftables': where it is installed and not masked, it is stopped, disabled and masked
    before base's table loads (as k3s's and HPC deploy tools' documentation asks when
    another tool owns the rules). A masked one is left so: a second run does nothing,
    and a node without firewalld gets nothing."""
    if host.get_fact(UnitLoaded, unit=FIREWALLD_UNIT):
        server.shell(
            name="Stop, disable and mask firewalld (the table inet aicluster is this "
            "host's firewall)",
            commands=list(FIREWALLD_OFF_COMMANDS),
        )
