"""The infiniband deploy planned on fake hosts: a node with HCAs (opensm primary and
standby, IPoIB through the network renderers), a node without an HCA (the packages,
no opensm, and the output says why), a fabric run by a managed switch, and ports the
inventory declares that the node lacks.

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
"""

from __future__ import annotations

import hashlib
import logging

import pytest
from pyinfra.api.exceptions import DeployError

from aicluster.components.infiniband import deploy as infiniband
from aicluster.components.infiniband import derive as infiniband_derive
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import file_facts, plan

CLUSTER = {
    "cluster_name": "demo",
    "networks": {
        "management": {"subnet": "10.10.0.0/24"},
        "ib": {"subnet": "10.40.0.0/24"},
    },
}


def _gpu(n: int, **data) -> tuple[str, dict]:
    return (
        f"gpu{n}",
        {
            "ssh_hostname": f"10.10.0.{20 + n}",
            "hardware": {
                "ib_ports": [
                    {"device": "mlx5_0", "port": 1, "network": "ib",
                     "address": f"10.40.0.{20 + n}"},
                    {"device": "mlx5_1", "port": 1},
                ]
            },
            **data,
        },
    )


HOSTS = [
    _gpu(1, infiniband_opensm_priority=15),
    _gpu(2, infiniband_opensm_priority=14),
    _gpu(3),
    # In ib_nodes with no HCA at all (a CPU node that runs RDMA tools against others).
    ("cpu1", {"ssh_hostname": "10.10.0.31", "infiniband_opensm_priority": 13}),
]
GROUPS = {"ib_nodes": [name for name, _ in HOSTS]}
RESTART_SM = "Restart opensm (its configuration changed)"


def _ports(netdev="ibp12s0"):
    return [
        {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
         "link_layer": "InfiniBand", "netdev": netdev},
        {"device": "mlx5_1", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
         "link_layer": "InfiniBand", "netdev": "ibp13s0"},
    ]


def _facts(distro, hosts, ports=None, files=None):
    out = {}
    for name, _ in hosts:
        present = (files or {}).get(name, {})
        out[name] = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "InfinibandPorts": (ports or {}).get(name, [] if name == "cpu1" else _ports()),
            "Sha1File": lambda path, present=present, **kw: (
                hashlib.sha1(present[path].encode()).hexdigest() if path in present else None
            ),
        }
    return out


def _plan(distro="debian12", hosts=HOSTS, extra=None, **facts):
    return plan(hosts, GROUPS, {**CLUSTER, **(extra or {})}, _facts(distro, hosts, **facts),
                infiniband.deploy)


def test_every_ib_node_gets_the_rdma_packages(distro):
    p = _plan(distro)
    for name, _ in HOSTS:
        text = p.op(name, "Install the RDMA stack (rdma-core, verbs, diagnostics, perftest)").text
        for package in ("rdma-core", "infiniband-diags", "perftest"):
            assert package in text
        assert ("libibverbs-utils" if distro == "rocky9" else "ibverbs-utils") in text


def test_opensm_primary_and_standby_with_their_priorities(distro):
    p = _plan(distro)
    conf = "/etc/rdma/opensm.conf" if distro == "rocky9" else "/etc/opensm/opensm.conf"
    primary = p.upload("gpu1", conf)
    assert "sm_priority 15\n" in primary and "the fabric's primary subnet manager" in primary
    standby = p.upload("gpu2", conf)
    assert "sm_priority 14\n" in standby and "standby" in standby
    assert "sweep_interval 10\n" in standby
    for name in ("gpu1", "gpu2"):
        assert "opensm running and enabled" in p.names(name)
        # A first install: opensm.conf is new, so opensm (re)starts with it.
        assert p.op(name, RESTART_SM).runs
    assert "opensm running and enabled" not in p.names("gpu3")


def test_a_node_without_an_hca_gets_packages_but_no_opensm_and_says_why(caplog):
    caplog.set_level(logging.WARNING, logger="pyinfra")
    p = _plan()
    assert "Install the RDMA stack (rdma-core, verbs, diagnostics, perftest)" in p.names("cpu1")
    assert not any("opensm" in n.lower() for n in p.names("cpu1"))
    assert "opensm" not in p.commands("cpu1")
    said = [r.getMessage() for r in caplog.records if "[cpu1]" in r.getMessage()]
    assert any("no InfiniBand/RoCE HCA on this node" in m for m in said), said
    assert any(
        "opensm skipped: this node has no InfiniBand HCA (/sys/class/infiniband is empty)" in m
        for m in said
    ), said


def test_ipoib_goes_through_the_network_renderers():
    expected = {
        "debian12": ("/etc/systemd/network/61-aicluster-ipoib-ibp12s0.network",
                     ["Name=ibp12s0", "MTUBytes=2044", "Address=10.40.0.21/24",
                      "[IPoIB]\nMode=datagram"]),
        "ubuntu2404": ("/etc/netplan/61-aicluster-ipoib.yaml",
                       ["name: ibp12s0", "mtu: 2044", "infiniband-mode: datagram",
                        "- 10.40.0.21/24"]),
        "rocky9": ("/etc/NetworkManager/system-connections/61-aicluster-ipoib-ibp12s0"
                   ".nmconnection",
                   ["type=infiniband", "interface-name=ibp12s0", "transport-mode=datagram",
                    "mtu=2044", "address1=10.40.0.21/24"]),
    }
    for distro, (dest, words) in expected.items():
        p = _plan(distro)
        text = p.upload("gpu1", dest)
        for word in words:
            assert word in text, (distro, word, text)
        assert "ib_ipoib" in p.upload("gpu1", infiniband_derive.IPOIB_MODULES_FILE)
        apply = [n for n in p.names("gpu1") if n.startswith("IPoIB: apply")]
        assert apply, p.names("gpu1")
        # mlx5_1 carries no address: no IPoIB interface for it.
        assert "ibp13s0" not in p.commands("gpu1")


def test_a_second_run_changes_nothing():
    first = _plan()
    files = {}
    for name, _ in HOSTS:
        files[name] = {}
        for op in first.ops[name]:
            for command in op.commands:
                if command.startswith("upload "):
                    dest, text = command.removeprefix("upload ").split("\n", 1)
                    files[name][dest] = text
    again = _plan(files=files)
    for name, _ in HOSTS:
        assert not any(n.startswith("IPoIB: apply") for n in again.names(name)), name


def _rerun(changed=None, distro="debian12"):
    """A plan made again on nodes holding what the first plan wrote (with its owner and
    mode) and opensm running; ``changed`` replaces a node's file first (host -> path ->
    text)."""
    first = _plan(distro)
    facts = _facts(distro, HOSTS)
    for name, _ in HOSTS:
        files = first.files(name)
        for path, text in (changed or {}).get(name, {}).items():
            files[path].content = text.encode()
        facts[name].update(file_facts(files))
        facts[name]["SystemdStatus"] = {"opensm.service": True}
        facts[name]["SystemdEnabled"] = {"opensm.service": True}
    return plan(HOSTS, GROUPS, CLUSTER, facts, infiniband.deploy)


def test_opensm_restarts_only_where_its_configuration_changed():
    conf = "/etc/opensm/opensm.conf"
    again = _rerun()
    for name in ("gpu1", "gpu2"):
        assert not any(n.startswith("Write opensm.conf") for n in again.changing(name))
        assert again.op(name, RESTART_SM).skipped, f"{name}: opensm.conf is unchanged"
    p = _rerun(changed={"gpu2": {conf: "sm_priority 1\n"}})
    restart = p.op("gpu2", RESTART_SM)
    assert restart.runs, "gpu2's opensm.conf changed: opensm restarts"
    assert restart.commands == ["systemctl restart opensm.service"]
    assert p.op("gpu1", RESTART_SM).skipped, "gpu1's opensm.conf is unchanged"


def test_a_switch_run_fabric_has_no_opensm():
    hosts = [_gpu(1), _gpu(2)]
    p = plan(hosts, {"ib_nodes": ["gpu1", "gpu2"]},
             {**CLUSTER, "infiniband_subnet_manager": "switch"},
             _facts("debian12", hosts), infiniband.deploy)
    for name, _ in hosts:
        assert "opensm" not in p.commands(name)


def test_declared_ports_the_node_lacks_stop_the_deploy_naming_host_device_and_counts():
    with pytest.raises(DeployError) as caught:
        _plan(ports={"gpu3": _ports()[:1]})
    message = str(caught.value)
    assert "host 'gpu3'" in message
    assert "declares 2 InfiniBand port(s) (hardware.ib_ports), the node has 1 of them" in message
    assert "not found: mlx5_1 port 1" in message


def test_a_port_without_its_ipoib_interface_is_skipped_and_said(caplog):
    caplog.set_level(logging.WARNING, logger="pyinfra")
    p = _plan(ports={"gpu3": _ports(netdev=None)})
    assert not any(n.startswith("IPoIB: write") for n in p.names("gpu3"))
    assert any("[gpu3] IPoIB on mlx5_0 port 1 skipped" in r.getMessage()
               for r in caplog.records)


def test_the_port_fact_parses_what_the_node_prints():
    from aicluster.components.infiniband.probe import parse

    ports = parse([
        "mlx5_0 1 ACTIVE 400 InfiniBand ibp12s0",
        "mlx5_2 1 DOWN 100 Ethernet ens3f0np0",
        "mlx5_3 2 INIT - InfiniBand -",
        "not a port line",
    ])
    assert ports == [
        {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
         "link_layer": "InfiniBand", "netdev": "ibp12s0"},
        {"device": "mlx5_2", "port": 1, "state": "DOWN", "rate_gbps": 100.0,
         "link_layer": "Ethernet", "netdev": "ens3f0np0"},
        {"device": "mlx5_3", "port": 2, "state": "INIT", "rate_gbps": None,
         "link_layer": "InfiniBand", "netdev": None},
    ]
    # No HCA: nothing, not an error.
    assert parse([]) == []


def test_roce_ports_need_no_subnet_manager(caplog):
    caplog.set_level(logging.WARNING, logger="pyinfra")
    roce = [{**p, "link_layer": "Ethernet"} for p in _ports()]
    p = _plan(ports={"gpu1": roce})
    assert "opensm running and enabled" not in p.names("gpu1")
    assert any("[gpu1] opensm skipped: this node's RDMA ports are RoCE" in r.getMessage()
               for r in caplog.records)


# --- kernel modules: loaded now, and again whenever found unloaded ---------------------


def _module_plan(modules_state):
    facts = _facts("debian12", HOSTS)
    for name in facts:
        facts[name]["KernelModulesLoaded"] = modules_state
    return plan(HOSTS, GROUPS, CLUSTER, facts, infiniband.deploy)


def test_an_ipoib_module_found_unloaded_is_loaded_again():
    p = _module_plan({"loaded": [], "container": None})
    op = p.op("gpu1", "IPoIB modules loaded")
    assert op.runs and op.text == "modprobe ib_ipoib"


def test_loaded_ipoib_modules_are_left_alone():
    p = _module_plan({"loaded": ["ib_ipoib"], "container": None})
    assert not p.op("gpu1", "IPoIB modules loaded").runs


def test_a_container_reports_the_module_it_cannot_load_and_fails_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="pyinfra")
    p = _module_plan({"loaded": [], "container": "systemd-nspawn"})
    assert not p.op("gpu1", "IPoIB modules loaded").runs
    said = [r.getMessage() for r in caplog.records if "[gpu1]" in r.getMessage()]
    assert any("kernel modules not loaded: ib_ipoib; this node is a container "
               "(systemd-nspawn) and cannot load them" in m for m in said), said
