"""The network deploy planned on fake hosts: one inventory (named NICs, NICs matched by
MAC, an LACP bond with a VLAN on it) rendered for netplan (Ubuntu), systemd-networkd
(Debian) and NetworkManager keyfiles (Rocky) against golden files; a re-run changes
nothing; a change to the management interface is refused, or applied under a
rollback timer when allowed; NICs the node lacks stop the deploy.

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError

from aicluster.components.network import deploy as network
from aicluster.components.network import derive as network_derive
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan
from tests.golden import GOLDEN_DIR, assert_golden

CLUSTER = {
    "cluster_name": "demo",
    "networks": {
        "management": {"subnet": "10.10.0.0/24"},
        "fabric": {"subnet": "10.20.0.0/24"},
        "storage": {"subnet": "10.30.0.0/24", "mtu": 9000},
    },
}
HOSTS = [
    (
        "head",
        {
            "ssh_hostname": "10.10.0.10",
            "hardware": {
                "nics": [
                    # No MTU given: the fabric's default, 9000 (network_default_mtu).
                    {"name": "ens1f0", "network": "fabric", "address": "10.20.0.10"},
                    {"name": "ens1f1", "network": "storage", "address": "10.30.0.10"},
                ]
            },
        },
    ),
    (
        "gpu1",
        {
            "ssh_hostname": "10.10.0.21",
            "hardware": {
                "nics": [
                    {"mac": "b8:3f:d2:00:01:01", "speed_gbps": 100, "network": "fabric",
                     "address": "10.20.0.21", "mtu": 9000},
                ]
            },
        },
    ),
    (
        "storage1",
        {
            "ssh_hostname": "10.10.0.40",
            "network_bonds": [
                {"name": "bond0", "members": ["ens2f0", "b8:3f:d2:00:40:02"],
                 "network": "storage", "address": "10.30.0.40"},
            ],
            "network_vlans": [
                {"id": 20, "link": "bond0", "network": "fabric", "address": "10.20.0.40"},
            ],
            "network_nic_tuning": True,
            "hardware": {
                "nics": [
                    {"name": "ens2f0", "speed_gbps": 100, "network": "storage"},
                    {"mac": "b8:3f:d2:00:40:02", "speed_gbps": 100, "network": "storage"},
                ]
            },
        },
    ),
]
#: What each node has (the NetworkInterfaces fact): its management NIC eno1 and the
#: cluster NICs the inventory declares.
NODE_NICS = {
    "head": [("eno1", "3c:ec:ef:00:00:10"), ("ens1f0", "3c:ec:ef:10:00:01"),
             ("ens1f1", "3c:ec:ef:10:00:02")],
    "gpu1": [("eno1", "3c:ec:ef:00:00:21"), ("enp12s0np0", "b8:3f:d2:00:01:01")],
    "storage1": [("eno1", "3c:ec:ef:00:00:40"), ("ens2f0", "3c:ec:ef:40:00:01"),
                 ("ens2f1", "b8:3f:d2:00:40:02")],
}
APT_STAMP = "/var/lib/apt/periodic/update-success-stamp"
NOW = datetime(2026, 1, 1, 12, 0)
DIRS = {"/etc/systemd/network", "/etc/netplan", "/etc/NetworkManager/system-connections",
        "/usr/local/sbin", "/etc/systemd/system"}
RENDERER_OF = {"debian12": "networkd", "ubuntu2404": "netplan", "rocky9": "networkmanager"}
GLOBS = {
    "networkd": "/etc/systemd/network/60-aicluster-*",
    "netplan": "/etc/netplan/60-aicluster.yaml",
    "networkmanager": "/etc/NetworkManager/system-connections/60-aicluster-*.nmconnection",
}


def _nics(name):
    return [
        {"name": n, "mac": m, "mtu": 1500, "state": "up", "speed_mbps": 100000,
         "type": "ether", "kind": None}
        for n, m in NODE_NICS[name]
    ]


def _applied_nics(name, mtu=9000):
    """The node's NICs after a deploy applied the configuration: the cluster NICs at
    the inventory's MTU (9000 on the fabric and storage networks)."""
    return [{**nic, "mtu": mtu if nic["name"] != "eno1" else 1500} for nic in _nics(name)]


def _mode(path):
    """The mode the deploy gives a file (NetworkManager and netplan want 0600)."""
    if path.endswith((".nmconnection", ".yaml")):
        return 600
    return 755 if path == network_derive.TUNING_SCRIPT else 644


def _facts(distro, hosts=HOSTS, files=None, mgmt=None, nics=None, listing=None):
    out = {}
    for name, _ in hosts:
        present = (files or {}).get(name, {})
        out[name] = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "NetworkInterfaces": (nics or {}).get(name, _nics(name)),
            "ManagementInterface": (mgmt or {}).get(
                name, {"name": "eno1", "mac": dict(NODE_NICS[name])["eno1"]}
            ),
            "Sha1File": lambda path, present=present, **kw: (
                hashlib.sha1(present[path].encode()).hexdigest() if path in present else None
            ),
            "File": lambda path, present=present, **kw: (
                {"mode": _mode(path), "user": "root", "group": "root", "mtime": NOW}
                if path in present or path == APT_STAMP else None
            ),
            "Directory": lambda path, **kw: (
                {"mode": 755, "user": "root", "group": "root"} if path in DIRS else None
            ),
            # apt's index was refreshed a minute ago.
            "Date": NOW + timedelta(minutes=1),
            "GlobPaths": lambda pattern, name=name, **kw: (
                sorted((listing or {}).get(name, []))
                if pattern == GLOBS[RENDERER_OF[distro]] else []
            ),
            "DebPackages": {"iproute2": ["6.1"], "ethtool": ["6.1"], "iperf3": ["3.12"],
                            "netplan.io": ["1.0"]},
            "RpmPackages": {"iproute": ["6.2"], "ethtool": ["6.2"], "iperf3": ["3.9"],
                            "NetworkManager": ["1.46"]},
            "SystemdStatus": {"systemd-networkd.service": True, "NetworkManager.service": True,
                              "aicluster-nic-tuning.service": True},
            "SystemdEnabled": {"systemd-networkd.service": True, "NetworkManager.service": True,
                               "aicluster-nic-tuning.service": True},
        }
    return out


def _plan(distro="debian12", hosts=HOSTS, **facts):
    return plan(hosts, {}, CLUSTER, _facts(distro, hosts, **facts), network.deploy)


def _written(p, name):
    """dest -> text of every file the plan writes on ``name``."""
    out = {}
    for op in p.ops[name]:
        for command in op.commands:
            if command.startswith("upload "):
                dest, text = command.removeprefix("upload ").split("\n", 1)
                out[dest] = text
    return out


@pytest.mark.parametrize("distro", sorted(RENDERER_OF))
def test_one_inventory_three_renderers_golden(distro):
    renderer = RENDERER_OF[distro]
    p = _plan(distro)
    for name, _ in HOSTS:
        written = _written(p, name)
        config = {d: t for d, t in written.items() if "aicluster-nic-tuning" not in d}
        assert config, f"{name}: nothing written for {renderer}"
        for dest, text in sorted(config.items()):
            assert_golden(GOLDEN_DIR / "network" / renderer / name / Path(dest).name, text)
        have = {p.name for p in (GOLDEN_DIR / "network" / renderer / name).iterdir()}
        assert have == {Path(d).name for d in config}, "stale golden files"


def test_networkd_files_carry_address_mtu_bond_and_vlan():
    p = _plan("debian12")
    head = _written(p, "head")["/etc/systemd/network/60-aicluster-ens1f0.network"]
    assert "[Match]\nName=ens1f0\n" in head
    assert "MTUBytes=9000" in head and "Address=10.20.0.10/24" in head
    gpu = _written(p, "gpu1")["/etc/systemd/network/60-aicluster-nic000101.network"]
    assert "MACAddress=b8:3f:d2:00:01:01" in gpu
    st = _written(p, "storage1")
    bond = st["/etc/systemd/network/60-aicluster-bond0.netdev"]
    assert "Kind=bond" in bond and "Mode=802.3ad" in bond
    assert "TransmitHashPolicy=layer3+4" in bond and "MIIMonitorSec=100ms" in bond
    member = st["/etc/systemd/network/60-aicluster-nic004002.network"]
    assert "MACAddress=b8:3f:d2:00:40:02" in member and "Bond=bond0" in member
    assert "\nAddress=" not in member
    assert "VLAN=bond0.20" in st["/etc/systemd/network/60-aicluster-bond0.network"]
    vlan = st["/etc/systemd/network/60-aicluster-bond0.20.netdev"]
    assert "Kind=vlan" in vlan and "Id=20" in vlan
    assert "Address=10.20.0.40/24" in st["/etc/systemd/network/60-aicluster-bond0.20.network"]


def test_apply_follows_the_renderer_and_only_a_change():
    for distro, expect in (
        ("debian12", ["networkctl reload", "networkctl reconfigure"]),
        # Never `netplan apply`: it reconfigures every interface, the management one
        # included (outside the rollback timer); only the changed links are.
        ("ubuntu2404", ["netplan generate", "networkctl reload", "networkctl reconfigure"]),
        ("rocky9", ["nmcli connection reload", "nmcli connection up uuid"]),
    ):
        p = _plan(distro)
        apply = [op for op in p.ops["head"] if "apply the changed configuration" in op.name]
        assert apply, p.names("head")
        for word in expect:
            assert word in apply[0].text, (distro, apply[0].text)
        # The management NIC is never named in a command.
        assert "eno1" not in p.commands("head")
        assert "netplan apply" not in p.commands("head")


@pytest.mark.parametrize("distro", sorted(RENDERER_OF))
def test_second_run_changes_nothing(distro):
    first = _plan(distro)
    files = {name: _written(first, name) for name, _ in HOSTS}
    listing = {name: sorted(d for d in files[name] if "nic-tuning" not in d)
               for name, _ in HOSTS}
    applied = {name: _applied_nics(name) for name, _ in HOSTS}
    again = _plan(distro, files=files, listing=listing, nics=applied)
    for name, _ in HOSTS:
        assert again.changing(name) == [], (name, again.changing(name))
        assert not any("apply" in n for n in again.names(name))


def test_an_mtu_set_by_hand_is_applied_again_with_the_files_unchanged():
    first = _plan("debian12")
    files = {name: _written(first, name) for name, _ in HOSTS}
    listing = {name: sorted(d for d in files[name] if "nic-tuning" not in d)
               for name, _ in HOSTS}
    nics = {name: _applied_nics(name) for name, _ in HOSTS}
    # `ip link set dev ens1f1 mtu 1500` on head: its file still says 9000.
    nics["head"] = [{**n, "mtu": 1500} if n["name"] == "ens1f1" else n for n in nics["head"]]
    p = _plan("debian12", files=files, listing=listing, nics=nics)
    assert p.changing("head") == [
        "Cluster network: apply the changed configuration (networkd): the live state "
        "drifted (ens1f1: MTU 1500 live, configured 9000)"]
    assert "networkctl reconfigure" in p.commands("head")
    assert p.changing("gpu1") == []


def test_a_file_the_inventory_no_longer_has_is_removed_and_applied():
    first = _plan("debian12")
    files = {name: _written(first, name) for name, _ in HOSTS}
    old = "/etc/systemd/network/60-aicluster-ens9.network"
    listing = {name: sorted(d for d in files[name] if "nic-tuning" not in d)
               for name, _ in HOSTS}
    listing["head"].append(old)
    files["head"][old] = "[Match]\nName=ens9\n"
    p = _plan("debian12", files=files, listing=listing)
    assert p.changing("head") == [
        f"Cluster network: remove {old} (no longer in the inventory)",
        "Cluster network: apply the changed configuration (networkd)",
    ]


def test_a_change_to_the_management_interface_is_refused():
    # The inventory names the NIC the deploy connects through as a fabric NIC.
    mgmt = {"head": {"name": "ens1f0", "mac": "3c:ec:ef:10:00:01"}}
    with pytest.raises(DeployError) as caught:
        _plan("debian12", mgmt=mgmt)
    message = str(caught.value)
    assert "host 'head'" in message and "management interface ens1f0" in message
    assert "network_allow_management_change: true" in message
    # By MAC too, and through a bond it is a member of.
    mgmt = {"storage1": {"name": "ens2f1", "mac": "b8:3f:d2:00:40:02"}}
    with pytest.raises(DeployError, match=r"would change bond0, bond0\.20, nic004002"):
        _plan("debian12", mgmt=mgmt)


def test_an_allowed_management_change_is_applied_under_a_rollback_timer():
    hosts = [(HOSTS[0][0], {**HOSTS[0][1], "network_allow_management_change": True})]
    mgmt = {"head": {"name": "ens1f0", "mac": "3c:ec:ef:10:00:01"}}
    p = _plan("debian12", hosts=hosts, mgmt=mgmt)
    names = p.names("head")
    arm = next(i for i, n in enumerate(names) if n.startswith("Arm the network rollback"))
    write = names.index(
        "Cluster network: write /etc/systemd/network/60-aicluster-ens1f0.network"
    )
    apply = names.index("Cluster network: apply the changed configuration (networkd)")
    confirm = names.index(
        "The node answers after the change: confirm it (disarm the rollback)"
    )
    assert arm < write < apply < confirm
    text = p.ops["head"][arm].text
    assert "systemd-run --unit=aicluster-network-rollback --on-active=120s" in text
    assert "tar -cf /var/lib/aicluster/network-rollback/saved.tar" in text
    assert "networkctl reload" in text  # the restore applies the saved files again
    assert "systemctl stop aicluster-network-rollback.timer" in p.ops["head"][confirm].text


def test_nics_the_node_lacks_stop_the_deploy_naming_host_device_and_counts():
    nics = {"storage1": [n for n in _nics("storage1") if n["name"] != "ens2f1"]}
    with pytest.raises(DeployError) as caught:
        _plan("debian12", nics=nics)
    message = str(caught.value)
    assert "host 'storage1'" in message
    assert "declares 2 NIC(s) (hardware.nics), the node has 1 of them" in message
    assert "not found: b8:3f:d2:00:40:02" in message


def test_nic_tuning_raises_ring_buffers_of_fast_nics_only():
    p = _plan("debian12")
    script = _written(p, "storage1")["/usr/local/sbin/aicluster-nic-tuning"]
    assert "rx=8192" in script and "tx=8192" in script
    assert "'ens2f0 '*) ring" in script and "*' b8:3f:d2:00:40:02') ring" in script
    assert "ExecStart=/usr/local/sbin/aicluster-nic-tuning" in _written(p, "storage1")[
        network_derive.TUNING_UNIT
    ]
    assert "No NIC tuning unit" in p.names("head")


def _rerun(distro="debian12", changed=None):
    """A plan made again on nodes holding what the first plan wrote; ``changed``
    replaces a node's file first (host -> path -> text)."""
    first = _plan(distro)
    files = {name: _written(first, name) for name, _ in HOSTS}
    for name, paths in (changed or {}).items():
        files[name].update(paths)
    listing = {name: sorted(d for d in files[name] if "nic-tuning" not in d)
               for name, _ in HOSTS}
    return _plan(distro, files=files, listing=listing)


APPLY_TUNING = "Apply the NIC tuning now (it changed)"
RELOAD = "Reload systemd units"


def test_nic_tuning_is_applied_only_after_its_script_or_unit_changed():
    again = _rerun()
    assert again.op("storage1", APPLY_TUNING).skipped
    assert again.op("storage1", RELOAD).skipped
    # A changed script: applied again; the unit is the same, so no daemon-reload.
    p = _rerun(changed={"storage1": {network_derive.TUNING_SCRIPT: "#!/bin/sh\n"}})
    apply = p.op("storage1", APPLY_TUNING)
    assert apply.runs, "the tuning script changed: the tuning is applied now"
    assert apply.commands == ["systemctl restart aicluster-nic-tuning.service"]
    assert p.op("storage1", RELOAD).skipped, "the unit did not change"
    # A changed unit: reloaded, then applied.
    p = _rerun(changed={"storage1": {network_derive.TUNING_UNIT: "[Unit]\n"}})
    reload_, apply = p.op("storage1", RELOAD), p.op("storage1", APPLY_TUNING)
    assert reload_.runs and apply.runs, "the tuning unit changed"
    assert reload_.index < apply.index


def test_a_host_without_cluster_nics_is_left_alone():
    hosts = [("bare", {"ssh_hostname": "10.10.0.50"})]
    NODE_NICS["bare"] = [("eno1", "3c:ec:ef:00:00:50")]
    try:
        p = _plan("debian12", hosts=hosts)
    finally:
        del NODE_NICS["bare"]
    assert not any(n.startswith("Cluster network: write") for n in p.names("bare"))
    assert not any("apply" in n for n in p.names("bare"))


def test_the_interface_facts_parse_what_the_node_prints():
    from aicluster.components.network.probe import parse_interfaces, parse_management

    lines = [
        "eno1 3C:EC:EF:00:00:10 1500 up 25000 1 -",
        "bond0 3c:ec:ef:40:00:01 9000 up 200000 1 bond",
        "fabric0 02:ac:13:01:00:01 1500 up -1 1 virtual",
        "ib0 00:00:10:87:fe:80 2044 up 400000 32 -",
        "garbage",
    ]
    found = parse_interfaces(lines)
    assert [f["name"] for f in found] == ["eno1", "bond0", "fabric0", "ib0"]
    assert found[0]["mac"] == "3c:ec:ef:00:00:10" and found[0]["speed_mbps"] == 25000
    assert found[1]["kind"] == "bond" and found[2]["speed_mbps"] is None
    assert found[3]["type"] == "infiniband"
    assert parse_management(["host0 02:00:00:00:00:0a"]) == {"name": "host0",
                                                            "mac": "02:00:00:00:00:0a"}
    # No ip(8), or no interface holds the address: unknown, not an error.
    assert parse_management([]) is None
