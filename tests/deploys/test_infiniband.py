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
        "ibp65s0f0 1 ACTIVE 400 InfiniBand ibp65s0f0 0000:41:00.0 b8ce:f603:00a1:2b3c "
        "b8ce:f603:00a1:2b3c",
        "mlx5_2 1 DOWN 100 Ethernet ens3f0np0 0000:C1:00.1 - -",
        "mlx5_3 2 INIT - InfiniBand - - 0000:0000:0000:0000 -",
        "mlx5_4 1 ACTIVE 200 InfiniBand ib0",  # an older command's line
        "not a port line",
    ])
    assert ports == [
        {"device": "ibp65s0f0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
         "link_layer": "InfiniBand", "netdev": "ibp65s0f0", "pci": "0000:41:00.0",
         "node_guid": "b8ce:f603:00a1:2b3c", "port_guid": "b8ce:f603:00a1:2b3c"},
        {"device": "mlx5_2", "port": 1, "state": "DOWN", "rate_gbps": 100.0,
         "link_layer": "Ethernet", "netdev": "ens3f0np0", "pci": "0000:c1:00.1",
         "node_guid": None, "port_guid": None},
        {"device": "mlx5_3", "port": 2, "state": "INIT", "rate_gbps": None,
         "link_layer": "InfiniBand", "netdev": None, "pci": None, "node_guid": None,
         "port_guid": None},
        {"device": "mlx5_4", "port": 1, "state": "ACTIVE", "rate_gbps": 200.0,
         "link_layer": "InfiniBand", "netdev": "ib0", "pci": None, "node_guid": None,
         "port_guid": None},
    ]
    # No HCA: nothing, not an error.
    assert parse([]) == []


def _sysfs(root, name, pci, guid, netdev):
    """A STAND-IN sysfs HCA laid out as the kernel's (/sys/class/infiniband/<name> a link
    into /sys/devices, ``device`` a link to its PCI function, one port with GID 0)."""
    import os

    function = root / "devices" / "pci0000:40" / pci
    hca = function / "infiniband" / name
    port = hca / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "gids" / "0").write_text(f"fe80:0000:0000:0000:{guid}\n")
    (hca / "node_guid").write_text(f"{guid}\n")
    os.symlink(function, hca / "device")
    (function / "net" / netdev).mkdir(parents=True)
    (function / "net" / netdev / "dev_port").write_text("0\n")
    (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    os.symlink(hca, root / "class" / "infiniband" / name)


def test_the_port_fact_reads_pci_address_and_guids_of_a_renamed_hca(tmp_path):
    """The fact's own shell, run here on a STAND-IN sysfs tree: an HCA rdma-core renamed
    (ibp65s0f0) is read with its PCI function and its node and port GUIDs."""
    import subprocess

    from aicluster.components.infiniband.probe import PORTS_COMMAND, parse

    _sysfs(tmp_path, "ibp65s0f0", "0000:41:00.0", "b8ce:f603:00a1:2b3c", "ibp65s0f0")
    _sysfs(tmp_path, "mlx5_1", "0000:42:00.0", "b8ce:f603:00a1:2b3d", "ibp66s0")
    command = PORTS_COMMAND.replace("/sys/class/infiniband", str(tmp_path / "class/infiniband"))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    ports = parse(out.stdout.splitlines())
    assert [(p["device"], p["pci"], p["node_guid"], p["port_guid"], p["netdev"], p["state"])
            for p in ports] == [
        ("ibp65s0f0", "0000:41:00.0", "b8ce:f603:00a1:2b3c", "b8ce:f603:00a1:2b3c",
         "ibp65s0f0", "ACTIVE"),
        ("mlx5_1", "0000:42:00.0", "b8ce:f603:00a1:2b3d", "b8ce:f603:00a1:2b3d", "ibp66s0",
         "ACTIVE"),
    ]


# --- ports named so that rdma-core's renaming (mlx5_0 -> ibp65s0f0) does not lose them ---


def _renamed():
    """The node's ports once rdma-core's 60-rdma-persistent-naming.rules renamed its HCAs
    (NAME_FALLBACK: by PCI location) and it rebooted."""
    return [
        {"device": "ibp65s0f0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
         "link_layer": "InfiniBand", "netdev": "ibp65s0f0", "pci": "0000:41:00.0",
         "node_guid": "b8ce:f603:00a1:2b3c", "port_guid": "b8ce:f603:00a1:2b3c"},
        {"device": "ibp66s0f0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
         "link_layer": "InfiniBand", "netdev": "ibp66s0f0", "pci": "0000:42:00.0",
         "node_guid": "b8ce:f603:00a1:2b3d", "port_guid": "b8ce:f603:00a1:2b3d"},
    ]


def _named(first: dict, second: dict):
    """gpu1 with its two ports identified as given (the first carries IPoIB)."""
    return [("gpu1", {"ssh_hostname": "10.10.0.21", "infiniband_opensm_priority": 15,
                      "hardware": {"ib_ports": [
                          {**first, "port": 1, "network": "ib", "address": "10.40.0.21"},
                          {**second, "port": 1}]}})]


def _plan_named(hosts, found):
    return plan(hosts, {"ib_nodes": ["gpu1"]}, CLUSTER,
                _facts("debian12", hosts, ports={"gpu1": found}), infiniband.deploy)


@pytest.mark.parametrize("first,second", [
    ({"pci": "0000:41:00.0"}, {"pci": "42:00.0"}),
    ({"guid": "0xB8CEF60300A12B3C"}, {"guid": "b8ce:f603:00a1:2b3d"}),
    # device then only labels the port: the kernel's name the node no longer has
    ({"device": "mlx5_0", "pci": "0000:41:00.0"}, {"device": "mlx5_1", "guid": "b8cef60300a12b3d"}),
    # the persistent name, as the node shows it
    ({"device": "ibp65s0f0"}, {"device": "ibp66s0f0"}),
], ids=["pci", "guid", "kernel-name-and-pci-or-guid", "persistent-name"])
def test_ports_named_by_pci_guid_or_persistent_name_survive_renaming(first, second):
    p = _plan_named(_named(first, second), _renamed())
    text = p.upload("gpu1", "/etc/systemd/network/61-aicluster-ipoib-ibp65s0f0.network")
    assert "Name=ibp65s0f0" in text and "Address=10.40.0.21/24" in text
    # the same inventory before the rename (the kernel's names) finds the same ports
    # where it names them by pci or guid
    if "pci" in first or "guid" in first:
        before = [{**f, "device": f"mlx5_{i}"} for i, f in enumerate(_renamed())]
        p = _plan_named(_named(first, second), before)
        assert p.upload("gpu1", "/etc/systemd/network/61-aicluster-ipoib-ibp65s0f0.network")


def test_kernel_names_the_node_no_longer_has_stop_the_deploy_saying_how_to_name_them():
    hosts = _named({"device": "mlx5_0"}, {"device": "mlx5_1"})
    # still working where the node keeps the kernel's names
    before = [{**f, "device": f"mlx5_{i}"} for i, f in enumerate(_renamed())]
    assert _plan_named(hosts, before).upload(
        "gpu1", "/etc/systemd/network/61-aicluster-ipoib-ibp65s0f0.network")
    with pytest.raises(DeployError) as caught:
        _plan_named(hosts, _renamed())
    message = str(caught.value)
    assert "not found: mlx5_0 port 1, mlx5_1 port 1" in message
    assert "ibp65s0f0 port 1 (pci 0000:41:00.0, guid b8ce:f603:00a1:2b3c)" in message
    assert "name the port by its pci or guid" in message


def test_a_pci_or_guid_the_node_lacks_stops_the_deploy():
    hosts = _named({"pci": "0000:41:00.0"}, {"pci": "0000:43:00.0", "guid": "b8ce:f603:00a1:2b3d"})
    with pytest.raises(DeployError) as caught:
        _plan_named(hosts, _renamed())
    assert "not found: guid b8ce:f603:00a1:2b3d pci 0000:43:00.0 port 1" in str(caught.value)
    assert "name the port by" not in str(caught.value)


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
