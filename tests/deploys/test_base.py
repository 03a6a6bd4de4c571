"""The base deploy planned on fake hosts of every supported distribution.

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
"""

from __future__ import annotations

import logging

from aicluster.components.base import deploy as base
from aicluster.components.base import derive as base_derive
from tests.deploys.conftest import CLUSTER, DISTRIBUTIONS, HOSTS
from tests.deploys.harness import NodeFile, file_facts, plan


def _plan(distro, extra=None, facts=None):
    host_facts = {
        name: {"LinuxDistribution": DISTRIBUTIONS[distro], **(facts or {}).get(name, {})}
        for name, _ in HOSTS
    }
    return plan(HOSTS, {"gpu_nodes": ["gpu1"]}, {**CLUSTER, **(extra or {})}, host_facts,
                base.deploy)


def test_bare_host_gets_every_base_piece(distro):
    p = _plan(distro)
    for host in ("head", "gpu1"):
        names = p.names(host)
        for wanted in (
            "Install base packages",
            f"Set the hostname to {host}",
            "Write /etc/hosts (cluster nodes)",
            "Write chrony.conf",
            "chrony running and enabled",
            "Write network sysctls",
            "Memlock limit for logins",
            "Memlock limit for services",
            "Admin user ops",
            "ops's authorized_keys",
            "sudo for admin users",
            "Write the firewall rules",
            "Firewall enabled",
        ):
            assert wanted in names, (host, wanted)
        assert "chrony" in p.op(host, "Install base packages").text
        assert "nftables" in p.op(host, "Install base packages").text
        hosts_file = p.upload(host, "/etc/hosts")
        assert "10.10.0.10\thead\n" in hosts_file
        assert "10.20.0.21\tgpu1-fabric\n" in hosts_file
        assert "ops@x" in p.upload(host, "/home/ops/.ssh/authorized_keys")
        assert "ops ALL=(ALL:ALL) NOPASSWD: ALL" in p.upload(host, base_derive.SUDOERS_FILE)


RESTART_CHRONY = "Restart chrony (configuration changed)"
RELOAD_UNITS = "Reload systemd units"
APPLY_SYSCTLS = "Apply network sysctls"
REEXEC = "Reload systemd's manager limits"
FIREWALL = "Firewall loaded and enabled"
GUARDED = (RESTART_CHRONY, RELOAD_UNITS, APPLY_SYSCTLS, REEXEC, FIREWALL)
DROPIN = "/etc/systemd/system/chrony.service.d/aicluster-container.conf"
RUNNING = {f"{u}.service": True for u in ("chrony", "chronyd", "nftables", "apt-cacher-ng")}


def _rerun(changed=None, container=False, extra_files=None):
    """debian12 planned again on nodes holding what the first plan wrote, with the
    services running; ``changed`` replaces a file on gpu1 first (path -> text),
    ``extra_files`` adds files there that the first plan did not write."""
    virt = {"ContainerVirt": "systemd-nspawn"} if container else {}
    first = _plan("debian12", facts={h: virt for h, _ in HOSTS})
    facts = {}
    for h, _ in HOSTS:
        files = first.files(h)
        if h == "gpu1":
            for path, text in (changed or {}).items():
                files[path].content = text.encode()
            files.update({path: NodeFile(text.encode())
                          for path, text in (extra_files or {}).items()})
        facts[h] = {**file_facts(files), "SystemdStatus": RUNNING, "SystemdEnabled": RUNNING,
                    **virt}
    return _plan("debian12", facts=facts)


def _running(p, host="gpu1"):
    """The guarded (``_if``) operations that run on ``host``; the others must be skipped."""
    ran = {name for name in GUARDED if p.op(host, name).runs}
    for name in set(GUARDED) - ran:
        assert p.op(host, name).skipped, (host, name)
    return ran


def test_a_first_install_applies_and_starts_everything(distro):
    p = _plan(distro)
    assert _running(p) == set(GUARDED) - {RELOAD_UNITS}  # no container drop-in to remove


def test_a_second_run_restarts_and_reloads_nothing():
    for container in (False, True):
        p = _rerun(container=container)
        for host in ("head", "gpu1"):
            assert _running(p, host) == set(), (container, host)


def test_each_change_runs_only_what_it_needs():
    cases = [
        ("/etc/chrony/chrony.conf", {RESTART_CHRONY}),
        (base_derive.SYSCTL_FILE, {APPLY_SYSCTLS}),
        (base_derive.SYSTEMD_LIMITS_FILE, {REEXEC}),
        # A firewall change is reloaded into nftables, not restarted.
        ("/etc/nftables.conf", {FIREWALL}),
        # Files with no follow-up.
        (base_derive.LIMITS_FILE, set()),
        ("/etc/hosts", set()),
    ]
    for path, wanted in cases:
        p = _rerun(changed={path: "# an older file\n"})
        assert _running(p) == wanted, path
        assert _running(p, "head") == set(), path
    fw = _rerun(changed={"/etc/nftables.conf": "# older rules\n"}).op("gpu1", FIREWALL)
    assert fw.commands == ["systemctl reload nftables.service"], fw.commands


def test_chrony_restarts_after_its_container_drop_in_changed_or_went():
    p = _rerun(container=True, changed={DROPIN: "# older\n"})
    assert _running(p) == {RELOAD_UNITS, RESTART_CHRONY}
    assert p.op("gpu1", RELOAD_UNITS).index < p.op("gpu1", RESTART_CHRONY).index
    # No longer in a container: the drop-in is removed, and chrony restarts without it.
    p = _rerun(extra_files={DROPIN: "# from a container run\n"})
    assert _running(p) == {RELOAD_UNITS, RESTART_CHRONY}


def test_debian_family_uses_apt_through_the_package_cache():
    for distro in ("debian12", "ubuntu2204", "ubuntu2404"):
        p = _plan(distro)
        install = p.op("gpu1", "Install base packages").text
        assert "apt-get update" in install
        assert "apt-get -y" in install and "install chrony nftables sudo" in install
        proxy = p.upload("gpu1", base_derive.APT_PROXY_FILE)
        assert 'Acquire::http::Proxy "http://10.10.0.10:3142";' in proxy
        assert 'Acquire::Retries "3";' in p.upload("gpu1", base_derive.APT_NETWORK_FILE)
        # Only the package cache node runs apt-cacher-ng.
        assert "apt-cacher-ng" in p.op("head", "Install the cluster package cache "
                                       "(apt-cacher-ng)").text
        assert "Install the cluster package cache (apt-cacher-ng)" not in p.names("gpu1")
        assert p.upload("head", "/etc/nftables.conf")


def test_rocky_uses_dnf_and_its_own_paths():
    p = _plan("rocky9")
    install = p.op("gpu1", "Install base packages").text
    assert "dnf" in install and "chrony" in install
    assert "apt" not in p.commands("gpu1").replace("aicluster", "")
    assert "server 10.10.0.10 iburst" in p.upload("gpu1", "/etc/chrony.conf")
    assert "table inet aicluster" in p.upload("gpu1", "/etc/sysconfig/nftables.conf")
    assert "systemctl start chronyd.service" in p.op("gpu1", "chrony running and enabled").text


# --- RedHat family: no dnf proxy (the package cache is apt's) --------------------------

NO_DNF_PROXY = "No dnf proxy (the package cache serves apt only)"


def _dnf_conf(*lines):
    """A FindInFile fact for a /etc/dnf/dnf.conf holding ``lines``: the lines the
    pattern matches (grep -E; the pattern is one Python reads alike)."""
    import re

    def find(path, pattern, **kw):
        if path != base_derive.DNF_CONF:
            return []
        return [line for line in lines if re.search(pattern, line)]

    return {"FindInFile": find}


def test_rocky_with_a_package_cache_gets_no_dnf_proxy_and_says_why(caplog):
    caplog.set_level(logging.WARNING)
    p = _plan("rocky9")
    for host in ("head", "gpu1"):
        assert "proxy=" not in p.commands(host)
        assert not p.op(host, NO_DNF_PROXY).runs  # no dnf.conf line to remove
        assert "Install the cluster package cache (apt-cacher-ng)" not in p.names(host)
    said = [r.getMessage() for r in caplog.records if "no dnf proxy" in r.getMessage()]
    # Once per host, naming why.
    assert sorted(m.split("]", 1)[0] for m in said) == ["[gpu1", "[head"], said
    assert all("the package cache serves apt only" in m for m in said)


def test_rocky_removes_the_dnf_proxy_an_earlier_deploy_wrote_and_no_other():
    ours = "proxy=http://10.10.0.10:3142"
    site = "proxy=http://proxy.site.example:3128"
    p = _plan("rocky9", facts={"gpu1": _dnf_conf("[main]", ours, "gpgcheck=1"),
                               "head": _dnf_conf("[main]", site)})
    op = p.op("gpu1", NO_DNF_PROXY)
    assert op.runs and op.text.startswith("sed -E ") and "/d' /etc/dnf/dnf.conf" in op.text
    # A proxy the site wrote itself (not the package cache's) stays.
    assert not p.op("head", NO_DNF_PROXY).runs
    # Without package_cache now, the line an earlier deploy wrote still goes (and
    # nothing is said: there is no cache to explain).
    p = _plan("rocky9", extra={"package_cache": None},
              facts={"gpu1": _dnf_conf(ours), "head": _dnf_conf(site)})
    assert p.op("gpu1", NO_DNF_PROXY).runs and not p.op("head", NO_DNF_PROXY).runs
    # package_proxy: its own line goes too (the same value, written before).
    proxied = {"package_proxy": "http://proxy.site.example:3128/"}
    p = _plan("rocky9", extra=proxied, facts={"head": _dnf_conf(site)})
    assert p.op("head", NO_DNF_PROXY).runs
    assert ">> /etc/dnf/dnf.conf" not in p.commands("head")  # no proxy line written


def test_the_dnf_proxy_pattern_matches_only_the_lines_a_deploy_wrote():
    import re

    from aicluster.inventory import validate

    data = {"ssh_hostname": "10.0.0.1", "cluster_name": "demo",
            "networks": {"management": {"subnet": "10.0.0.0/24"}}}
    pattern = base_derive.dnf_proxy_regexp(validate({"n1": ((), data)}), {})
    assert re.search(pattern, "proxy=http://10.0.0.1:3142")
    assert re.search(pattern, "proxy=http://[fd00::1]:3142/")
    assert not re.search(pattern, "proxy=http://proxy.site.example:3128")
    assert not re.search(pattern, "#proxy=http://10.0.0.1:3142")
    assert not re.search(pattern, "proxy_username=x:3142")
    # The inventory's package_proxy, its dots literal.
    proxied = {**data, "package_proxy": "http://proxy.site.example:3128/"}
    pattern = base_derive.dnf_proxy_regexp(validate({"n1": ((), proxied)}), {})
    assert re.search(pattern, "proxy=http://proxy.site.example:3128")
    assert not re.search(pattern, "proxy=http://proxyXsite.example:3128")


def test_debian_keeps_apt_through_the_cache_and_no_dnf_step():
    p = _plan("debian12")
    assert NO_DNF_PROXY not in p.names("gpu1")
    assert "dnf" not in p.commands("gpu1")


# --- firewalld: off where installed, before base's table loads -------------------------

FIREWALLD_OFF = ("Stop, disable and mask firewalld (the table inet aicluster is this host's "
                 "firewall)")


def _firewalld(installed=True):
    """UnitLoaded as systemctl reads it: firewalld.service ``loaded`` (installed, not
    masked) or not (absent, or masked by an earlier run)."""
    return {"UnitLoaded": lambda unit, **kw: installed and unit == "firewalld.service"}


def test_rocky_with_firewalld_stops_disables_and_masks_it_before_the_table():
    p = _plan("rocky9", facts={"gpu1": _firewalld()})
    names = p.names("gpu1")
    op = p.op("gpu1", FIREWALLD_OFF)
    assert op.commands == ["systemctl disable --now firewalld.service",
                           "systemctl mask firewalld.service"]
    assert names.index(FIREWALLD_OFF) < names.index("Write the firewall rules")
    assert names.index(FIREWALLD_OFF) < names.index("Firewall loaded and enabled")
    # A node without firewalld gets nothing.
    assert FIREWALLD_OFF not in p.names("head")


def test_a_masked_firewalld_is_left_alone_on_the_next_run():
    # After the first run the unit reads "masked", not "loaded".
    p = _plan("rocky9", facts={h: _firewalld(installed=False) for h, _ in HOSTS})
    for host in ("head", "gpu1"):
        assert not any("firewalld" in n for n in p.names(host)), host
        assert "firewalld" not in p.commands(host)


def test_firewalld_is_left_to_the_site_when_base_has_no_firewall():
    p = _plan("rocky9", extra={"base_firewall_enabled": False},
              facts={"gpu1": _firewalld()})
    assert FIREWALLD_OFF not in p.names("gpu1")


def test_debian_without_firewalld_is_unaffected():
    p = _plan("debian12")
    for host in ("head", "gpu1"):
        assert not any("firewalld" in n for n in p.names(host))


def test_time_server_serves_the_cluster_and_clients_use_it(distro):
    p = _plan(distro)
    conf = "/etc/chrony.conf" if distro == "rocky9" else "/etc/chrony/chrony.conf"
    head = p.upload("head", conf)
    assert "pool pool.ntp.org iburst maxsources 4" in head
    assert "allow 10.10.0.0/24\nallow 10.20.0.0/24\n" in head
    gpu = p.upload("gpu1", conf)
    assert gpu.startswith("# Managed by aicluster (base).\nserver 10.10.0.10 iburst\n")
    assert "allow" not in gpu and "pool" not in gpu


def test_no_upstream_time_server_serves_its_own_clock():
    p = _plan("debian12", extra={"base_chrony_upstream": []})
    assert "local stratum 10" in p.upload("head", "/etc/chrony/chrony.conf")


def test_container_chrony_never_sets_the_clock():
    p = _plan("debian12", facts={"gpu1": {"ContainerVirt": "systemd-nspawn"}})
    dropin = p.upload("gpu1", "/etc/systemd/system/chrony.service.d/aicluster-container.conf")
    assert "ExecStart=!/usr/sbin/chronyd $DAEMON_OPTS -x" in dropin
    assert "ConditionCapability=\n" in dropin
    assert "No container drop-in for chrony" in p.names("head")


def test_firewall_allows_ssh_and_cluster_networks_and_drops_the_rest(distro):
    p = _plan(distro)
    path = "/etc/sysconfig/nftables.conf" if distro == "rocky9" else "/etc/nftables.conf"
    rules = p.upload("gpu1", path)
    assert "policy drop;" in rules
    assert "\t\ttcp dport 22 accept\n" in rules
    assert "ip saddr 10.10.0.0/24 accept" in rules and "ip saddr 10.20.0.0/24 accept" in rules
    # Only our own table is replaced: never a "flush ruleset".
    assert "flush ruleset" not in rules


def test_a_k3s_node_trusts_the_pod_and_service_networks_and_only_it():
    """k3s's pods reach the node's API server and kubelet from the pod network
    (CoreDNS, metrics-server): a k3s node's firewall accepts it; a node without k3s does
    not; the networks follow k3s_config."""
    groups = {"gpu_nodes": ["gpu1"], "k3s_servers": ["head"]}
    facts = {name: {"LinuxDistribution": DISTRIBUTIONS["debian12"]} for name, _ in HOSTS}
    p = plan(HOSTS, groups, CLUSTER, facts, base.deploy)
    rules = p.upload("head", "/etc/nftables.conf")
    assert "ip saddr 10.42.0.0/16 accept" in rules and "ip saddr 10.43.0.0/16 accept" in rules
    assert "10.42.0.0" not in p.upload("gpu1", "/etc/nftables.conf")
    dual = {**CLUSTER, "k3s_config": {"cluster-cidr": "10.52.0.0/16,fd00:52::/56",
                                      "service-cidr": "10.53.0.0/16"}}
    rules = plan(HOSTS, groups, dual, facts, base.deploy).upload("head", "/etc/nftables.conf")
    assert "ip saddr 10.52.0.0/16 accept" in rules and "ip6 saddr fd00:52::/56 accept" in rules
    assert "ip saddr 10.53.0.0/16 accept" in rules and "10.42.0.0" not in rules


def test_firewall_restricted_ssh_sources_and_public_ports():
    p = _plan(
        "debian12",
        extra={
            "base_firewall_ssh_sources": ["192.0.2.0/24", "2001:db8::/32"],
            "base_firewall_public_ports": [{"port": 443, "proto": "tcp"}],
        },
    )
    rules = p.upload("gpu1", "/etc/nftables.conf")
    assert "ip saddr 192.0.2.0/24 tcp dport 22 accept" in rules
    assert "ip6 saddr 2001:db8::/32 tcp dport 22 accept" in rules
    assert "\t\ttcp dport 22 accept\n" not in rules
    assert "tcp dport 443 accept" in rules


def test_firewall_disabled_removes_only_our_table():
    p = _plan(
        "debian12",
        extra={"base_firewall_enabled": False},
        facts={"gpu1": {"NftTable": True}, "head": {"NftTable": False}},
    )
    assert "nft delete table inet aicluster" in p.commands("gpu1")
    assert "nft delete" not in p.commands("head")
    assert "Write the firewall rules" not in p.names("gpu1")


def test_sysctls_merge_user_values_over_defaults():
    p = _plan("debian12", extra={"base_sysctl": {"net.core.somaxconn": 8192,
                                                 "net.ipv4.tcp_mtu_probing": None}})
    text = p.upload("gpu1", "/etc/sysctl.d/90-aicluster-network.conf")
    assert "net.core.somaxconn = 8192\n" in text
    assert "tcp_mtu_probing" not in text
    assert "net.core.rmem_max = 268435456\n" in text


def test_no_package_cache_means_no_apt_proxy():
    extra = {"package_cache": None}
    p = _plan("debian12", extra=extra)
    assert "No apt proxy" in p.names("gpu1")
    assert "Install the cluster package cache (apt-cacher-ng)" not in p.names("head")


# --- drift the deploy repairs: the live firewall table, applied sysctls --------------

FIREWALL_REPAIR = "Firewall table as written (reloaded where it drifted)"
SYSCTL_REPAIR = "Network sysctls in effect (repaired where they drifted)"


def _drift_rerun(nft="same", sysctls=None, missing=(), refused=None):
    """A re-run on nodes holding what a first plan wrote, with the live table state
    and sysctl values given (the defaults as the kernel prints them, tab-separated,
    overridden by *sysctls*; the keys in *missing* absent from the kernel)."""
    from aicluster.render import defaults

    first = _plan("debian12")
    live = {k: "\t".join(str(v).split())
            for k, v in defaults("base")["base_default_sysctl"].items() if k not in missing}
    facts = {
        host: {**file_facts(first.files(host)), "NftTableDrift": nft,
               "SysctlValues": {"live": {**live, **(sysctls or {})},
                                "refused": refused or {}}}
        for host, _ in HOSTS
    }
    return _plan("debian12", facts=facts)


def test_a_flushed_firewall_is_loaded_again_and_nothing_restarted():
    p = _drift_rerun(nft="absent")
    op = p.op("gpu1", FIREWALL_REPAIR)
    assert op.runs and op.text == "nft -f /etc/nftables.conf"
    assert not p.op("gpu1", "Firewall loaded and enabled").runs
    assert "Write the firewall rules" not in p.changing("gpu1")


def test_a_changed_firewall_table_is_loaded_again():
    op = _drift_rerun(nft="different").op("gpu1", FIREWALL_REPAIR)
    assert op.text == "nft -f /etc/nftables.conf"


def test_a_firewall_table_as_written_is_left_alone():
    for state in ("same", "unknown", "no-nft"):
        assert not _drift_rerun(nft=state).op("gpu1", FIREWALL_REPAIR).runs, state


def test_a_drifted_sysctl_is_applied_again_naming_the_key():
    p = _drift_rerun(sysctls={"net.ipv4.tcp_mtu_probing": "0"})
    op = p.op("gpu1", SYSCTL_REPAIR)
    assert op.runs
    assert op.text.startswith("sysctl -e -q -p /etc/sysctl.d/90-aicluster-network.conf;")
    # The values the kernel did not take are recorded, so the next run reports them.
    assert "/run/aicluster/sysctl-refused" in op.text
    assert op.text.endswith("# differs: net.ipv4.tcp_mtu_probing")
    # Only the repair: the drop-in is unchanged, so its own apply does not run.
    assert not p.op("gpu1", "Apply network sysctls").runs


def test_sysctls_in_effect_or_absent_from_the_kernel_are_left_alone():
    assert not _drift_rerun().op("gpu1", SYSCTL_REPAIR).runs
    # A namespace without net.core.rmem_max (a container): nothing to apply there.
    p = _drift_rerun(missing=("net.core.rmem_max", "net.core.wmem_max"))
    assert not p.op("gpu1", SYSCTL_REPAIR).runs


def test_a_value_the_kernel_refused_is_reported_not_applied_on_every_run(caplog):
    # A container's network namespace refuses buffer sizes above its host's (seen on
    # the testbed: EINVAL for net.core.rmem_max = 268435456).
    caplog.set_level(logging.DEBUG, logger="pyinfra")
    p = _drift_rerun(sysctls={"net.core.rmem_max": "4194304"},
               refused={"net.core.rmem_max": "268435456"})
    assert not p.op("gpu1", SYSCTL_REPAIR).runs
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "the kernel refuses net.core.rmem_max = 268435456 (kept at 4194304) here" in said
    # A new wanted value is tried again.
    p = _drift_rerun(sysctls={"net.core.rmem_max": "4194304"},
               refused={"net.core.rmem_max": "134217728"})
    assert p.op("gpu1", SYSCTL_REPAIR).runs
