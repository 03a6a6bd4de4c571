"""What `base` must have done on every testbed node, checked on the nodes themselves
(shared by the pyinfra and the Ansible end-to-end tests)."""

from __future__ import annotations

import subprocess

from tests.e2e.conftest import Testbed

#: Whether this host may raise the locked-memory limit at all (a sandboxed host
#: without CAP_SYS_RESOURCE cannot, and its nspawn nodes inherit that).
HOST_CAN_RAISE_MEMLOCK = (
    subprocess.run(
        ["prlimit", "--memlock=unlimited:unlimited", "true"], capture_output=True
    ).returncode
    == 0
)


def assert_base(tb: Testbed) -> None:
    names = [n["name"] for n in tb.nodes]
    for node in tb.nodes:
        name = node["name"]
        assert tb.ssh(name, "hostname").strip() == name
        hosts = tb.ssh(name, "cat /etc/hosts")
        for other in tb.nodes:
            assert f"{other['address']}\t{other['name']}\n" in hosts, (name, other["name"])
        for n in names:
            assert f"\t{n}-fabric\n" in hosts
        assert tb.ssh(name, "systemctl is-active chrony").strip() == "active"
        rules = tb.ssh(name, "nft list table inet aicluster")
        assert "policy drop" in rules and "10.213.0.0/24" in rules
        assert tb.ssh(name, "sysctl -n net.ipv4.tcp_mtu_probing").strip() == "1"
        assert tb.ssh(name, "sysctl -n net.ipv4.tcp_rmem").split() == [
            "4096", "87380", "134217728"
        ]
        proxy = tb.ssh(name, "cat /etc/apt/apt.conf.d/01aicluster-proxy")
        assert f'Acquire::http::Proxy "{tb.state["package_proxy"]}";' in proxy
        manager = tb.ssh(name, "systemctl show -p DefaultLimitMEMLOCK")
        assert "DefaultLimitMEMLOCK=infinity" in manager
        assert "LimitMEMLOCK=infinity" in tb.ssh(name, "systemctl show chrony -p LimitMEMLOCK")
        assert "*\thard\tmemlock\tunlimited" in tb.ssh(
            name, "cat /etc/security/limits.d/90-aicluster-memlock.conf"
        )
        if HOST_CAN_RAISE_MEMLOCK:
            assert tb.ssh(name, "bash -lc 'ulimit -l'").strip() == "unlimited"
        else:
            print(f"{name}: memlock configured; the effective limit is not checked: this host "
                  "cannot raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE), so neither can its nodes")
        # The admin user logs in with its key and has passwordless sudo.
        assert tb.ssh(name, "su - aiops -c 'sudo -n true' && echo sudo-ok").strip() == "sudo-ok"
    # node2 takes its time from node1, the cluster's time server.
    server = tb.nodes[0]["address"]
    sources = tb.ssh(tb.nodes[1]["name"], "chronyc -n sources")
    assert server in sources, sources
