"""The example inventory validates, and the values derived from an inventory (hosts
file entries, component lists, warnings, the Ansible inventory) are what they should be.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from aicluster.inventory import (
    COMPONENT_ORDER,
    KNOWN_GROUPS,
    _shared_gpus,
    _subnet_managers_in_one_batch,
    ansible_inventory,
    load_cluster,
)

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab.py"
GPUS = ("gpu1", "gpu2", "gpu3", "gpu4")


@pytest.fixture(scope="module")
def lab():
    return load_cluster(LAB)


def test_lab_validates_with_six_hosts(lab):
    assert list(lab.hosts) == ["head", *GPUS, "storage1"]


def test_lab_groups(lab):
    assert {g: set(m) for g, m in lab.groups.items()} == {
        "lab": {"head", *GPUS, "storage1"},
        "gpu_nodes": set(GPUS),
        "ib_nodes": set(GPUS),
        "slurm_controller": {"head"},
        "slurm_workers": set(GPUS),
        "ray_head": {"head"},
        "ray_workers": set(GPUS),
        "nfs_server": {"storage1"},
        "nfs_clients": {"head", *GPUS},
        "ceph_mons": {"head", "gpu1", "storage1"},
        "ceph_osds": {"storage1"},
        "ceph_mds": {"storage1"},
        "ceph_clients": {"head", *GPUS},
        "minio": {"storage1"},
        "monitoring": {"head"},
        "k3s_servers": {"head", "gpu1", "storage1"},
        "k3s_agents": {"gpu2", "gpu3", "gpu4"},
        "ollama": {"gpu3", "gpu4"},
        "ollama_gateway": {"head"},
    }


def test_lab_hardware_is_parsed(lab):
    gpu1 = lab.hosts["gpu1"].spec.hardware
    assert (gpu1.gpus.model, gpu1.gpus.count, gpu1.gpus.nvswitch) == ("H100-SXM5-80GB", 8, True)
    assert [p.pci for p in gpu1.ib_ports] == ["0000:1a:00.0", "0000:3c:00.0", "0000:4d:00.0",
                                              "0000:5e:00.0"]
    assert gpu1.ib_ports[0].mtu == 2044 and gpu1.ib_ports[0].mode == "datagram"
    assert [n.mac for n in gpu1.nics] == ["b8:3f:d2:00:01:01", "b8:3f:d2:00:01:02"]
    assert len(lab.hosts["storage1"].spec.hardware.nvme) == 4
    assert lab.hosts["head"].spec.ssh_user == "root" and lab.hosts["head"].spec.ssh_port == 22


def test_lab_cluster_settings(lab):
    assert lab.spec.cluster_name == "lab"
    assert lab.spec.package_cache == "head"
    assert set(lab.spec.secrets) == {"munge_key", "k3s_token", "minio_root_password"}
    assert lab.network_subnets() == ["10.10.0.0/24", "10.20.0.0/24", "10.30.0.0/24", "10.40.0.0/24"]


def _shared(name: str, count: int, given: str) -> str:
    return (f"host {name!r}: groups: its {count} GPUs are handed out by {given} at once, "
            "each as its own: a job given all of them by one finds the others' processes "
            "on them (memory, compute); give each GPU node one of them, or keep the others "
            "off its GPUs")


def test_lab_warns_of_a_single_slurm_controller(lab):
    three = "Slurm (GRES), Ray (--num-gpus), k3s (nvidia.com/gpu)"
    assert lab.warnings == [
        "slurm_controller has one host: it is a single point of failure "
        "(name a second host for a backup controller)",
        _shared("gpu1", 8, three), _shared("gpu2", 8, three),
        _shared("gpu3", 8, f"{three}, Ollama"), _shared("gpu4", 8, f"{three}, Ollama"),
        "host 'storage1': groups: minio: MinIO's community edition is archived upstream "
        "and gets no more releases or security fixes; the pinned release still installs "
        "(from its GitHub release assets, minio_release_base_url); plan a move to a "
        "maintained S3 store (docs/components/minio.md)",
        "host 'head': groups: monitoring has one host: its Prometheus and Alertmanager are "
        "a single point of failure (name a second host for a second replica and an "
        "Alertmanager pair)",
    ]


def test_lab_etc_hosts(lab):
    expected = [
        ("head", "10.10.0.10"),
        ("head-fabric", "10.20.0.10"),
        ("head-storage", "10.30.0.10"),
    ]
    for n in range(1, 5):
        expected += [
            (f"gpu{n}", f"10.10.0.{20 + n}"),
            (f"gpu{n}-fabric", f"10.20.0.{20 + n}"),
            (f"gpu{n}-storage", f"10.30.0.{20 + n}"),
            (f"gpu{n}-ib", f"10.40.0.{20 + n}"),
        ]
    # storage1: the fabric on VLAN 20 of its bond, the storage network on the bond.
    expected += [("storage1", "10.10.0.40"), ("storage1-fabric", "10.20.0.40"),
                 ("storage1-storage", "10.30.0.40")]
    assert lab.etc_hosts() == [{"address": a, "names": [name]} for name, a in expected]


def test_lab_network_addresses(lab):
    gpu1 = lab.hosts["gpu1"]
    assert gpu1.address == "10.10.0.21"
    assert gpu1.network_address("fabric") == "10.20.0.21"
    assert gpu1.network_address("ib") == "10.40.0.21"  # IPoIB, from the first IB port
    # Bonds and VLANs (network_bonds, network_vlans) hold addresses too.
    assert lab.hosts["storage1"].network_address("fabric") == "10.20.0.40"
    assert lab.hosts["storage1"].network_address("storage") == "10.30.0.40"
    assert lab.hosts["head"].network_address("ib") is None


def test_components_in_deploy_order(lab):
    assert lab.hosts["head"].components() == [
        "base",
        "network",
        "nfs",
        "ceph",
        "slurm",
        "ray",
        "k3s",
        "ollama",
        "monitoring",
    ]
    assert lab.hosts["gpu1"].components() == [
        "base",
        "network",
        "infiniband",
        "nvidia",
        "nvme_cache",
        "nfs",
        "ceph",
        "slurm",
        "ray",
        "k3s",
        # Every node of a cluster with a monitoring host runs the monitoring agents.
        "monitoring",
    ]
    assert lab.hosts["storage1"].components() == ["base", "network", "nfs", "ceph", "minio",
                                                   "k3s", "monitoring"]
    assert lab.hosts["head"].roles()["monitoring"] == ["monitoring"]
    assert lab.hosts["gpu1"].roles()["monitoring"] == []


def test_no_monitoring_host_no_monitoring_anywhere(spec):
    spec.hosts = {"n1": spec.node(1), "n2": spec.node(2)}
    cluster = load_cluster(spec.write())
    assert all("monitoring" not in h.components() for h in cluster.hosts.values())
    spec.set("groups.monitoring", ["n1"])
    spec.set("n1.monitoring_storage_gb", 100)
    cluster = load_cluster(spec.write())
    assert cluster.hosts["n1"].roles()["monitoring"] == ["monitoring"]
    assert cluster.hosts["n2"].roles()["monitoring"] == []


def test_a_host_in_every_group_gets_every_component_in_order(spec):
    spec.hosts = {"n1": spec.node(1)}
    spec.set("n1.hardware.gpus", {"model": "L40S", "count": 4})
    spec.set("n1.hardware.ib_ports", [{"device": "mlx5_0"}])
    for group in KNOWN_GROUPS - {"k3s_agents"}:  # a k3s server is never an agent too
        spec.set(f"groups.{group}", ["n1"])
    # k3s on a GPU node runs NVIDIA's device plugin from an image the inventory names.
    spec.set("all.k3s_nvidia_device_plugin_image", "registry.example.org/k8s-device-plugin:v1")
    spec.set("all.ray_version", "2.60.0")  # a Ray node needs its pinned version
    # NVIDIA GPUs from NVIDIA's CUDA repository need its URL (or a mirror's).
    spec.set("all.nvidia_cuda_repo_url", "https://mirror.example.org/nvidia/cuda/repos")
    spec.set("n1.infiniband_opensm_priority", 15)  # an IB fabric needs a subnet manager
    spec.set("n1.nfs_exports", [{"path": "/srv/shared"}])  # an NFS server exports something
    spec.set("n1.ceph_osd_devices", ["/dev/disk/by-id/nvme-osd"])  # an OSD host names a device
    # Ceph from Ceph's own repository needs its URL (or a mirror's).
    spec.set("all.ceph_repo_url", "https://mirror.example.org/ceph")
    spec.set("n1.ollama_gateway_port", 11435)  # Ollama itself listens on 11434 there
    spec.set("n1.monitoring_storage_gb", 100)  # a monitoring host states its disk
    cluster = load_cluster(spec.write())
    assert cluster.hosts["n1"].components() == list(COMPONENT_ORDER)
    assert COMPONENT_ORDER[0] == "base"


def _besides_monitoring(warnings: list[str]) -> list[str]:
    """The warnings other than monitoring's (these small clusters have no monitoring
    host, which monitoring warns of: tests/unit/test_monitoring_config.py)."""
    return [w for w in warnings if not w.startswith("groups: monitoring: no host")]


def test_no_warnings_with_a_backup_controller(spec):
    spec.set("groups.slurm_controller", ["n1", "n2"])
    spec.set("groups.slurm_workers", ["n2"])
    assert _besides_monitoring(load_cluster(spec.write()).warnings) == []


def test_a_cluster_without_a_monitoring_host_is_warned(spec):
    warnings = load_cluster(spec.write()).warnings
    assert [w for w in warnings if "monitoring" in w] == [
        "groups: monitoring: no host is in the monitoring group: a cluster monitored only "
        "later has paid for its first dead GPU, flapping link or full disk by the time it "
        "is; name a monitoring host now (two for a replica and an Alertmanager pair)"]


def test_warning_for_several_ollama_nodes_without_a_gateway(spec):
    spec.set("groups.ollama", ["n1", "n2"])
    assert _besides_monitoring(load_cluster(spec.write()).warnings) == [
        "ollama runs on several nodes without an ollama_gateway: each Ollama serves alone; "
        "add a gateway node to balance requests across them"
    ]


def test_no_warning_for_several_ollama_nodes_with_a_gateway(spec):
    spec.set("groups.ollama", ["n1", "n2"])
    spec.set("groups.ollama_gateway", ["n1"])
    spec.set("n1.ollama_gateway_port", 11435)  # Ollama itself listens on 11434 there
    assert _besides_monitoring(load_cluster(spec.write()).warnings) == []


def test_the_file_name_is_a_group_too(spec):
    spec.name = "rack7"
    cluster = load_cluster(spec.write())
    assert cluster.group("rack7") == ("n1", "n2")


# ---------------------------------------------------------------------------
# The Ansible inventory
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab_ansible(lab):
    return ansible_inventory(LAB, lab)


def test_ansible_groups_and_children(lab, lab_ansible):
    children = lab_ansible["all"]["children"]
    assert children[0] == "ungrouped"
    assert set(children[1:]) == set(lab.groups)
    for group, members in lab.groups.items():
        assert lab_ansible[group] == {"hosts": list(members)}


def test_ansible_hostvars_connection(lab_ansible):
    hostvars = lab_ansible["_meta"]["hostvars"]
    assert list(hostvars) == ["head", *GPUS, "storage1"]
    gpu1 = hostvars["gpu1"]
    assert (gpu1["ansible_host"], gpu1["ansible_user"], gpu1["ansible_port"]) == (
        "10.10.0.21",
        "root",
        22,
    )
    assert "ansible_ssh_private_key_file" not in gpu1


def test_ansible_hostvars_hold_the_inventory_data(lab_ansible):
    gpu1 = lab_ansible["_meta"]["hostvars"]["gpu1"]
    assert gpu1["cluster_name"] == "lab"
    assert gpu1["hardware"]["gpus"]["count"] == 8
    assert gpu1["networks"]["fabric"] == {"subnet": "10.20.0.0/24", "mtu": 9000}
    assert gpu1["secrets"]["k3s_token"] == {"env": "AICLUSTER_K3S_TOKEN"}


def test_ansible_hostvars_hold_the_derived_base_vars(lab, lab_ansible):
    hostvars = lab_ansible["_meta"]["hostvars"]
    for name in lab.hosts:
        for var in (
            "base_etc_hosts",
            "base_trusted_networks",
            "base_firewall_ssh_port",
            "base_apt_proxy_url",
            "base_package_cache_here",
            "base_chrony_sources",
            "base_chrony_allow",
            "base_chrony_local",
            "base_sysctl_settings",
        ):
            assert var in hostvars[name], (name, var)
    assert hostvars["gpu1"]["base_etc_hosts"] == lab.etc_hosts()
    assert hostvars["gpu1"]["base_apt_proxy_url"] == "http://10.10.0.10:3142"
    assert hostvars["gpu1"]["base_chrony_sources"] == ["server 10.10.0.10 iburst"]
    assert hostvars["head"]["base_package_cache_here"] is True
    assert hostvars["head"]["base_chrony_allow"] == lab.network_subnets()
    assert hostvars["gpu1"]["base_chrony_allow"] == []


def test_ansible_ssh_key_and_port(spec):
    spec.set("n1.ssh_key", "/home/ops/.ssh/id_ed25519")
    spec.set("n1.ssh_port", 2222)
    spec.set("n1.ssh_user", "ops")
    inventory = ansible_inventory(spec.write())
    n1 = inventory["_meta"]["hostvars"]["n1"]
    assert n1["ansible_ssh_private_key_file"] == "/home/ops/.ssh/id_ed25519"
    assert (n1["ansible_port"], n1["ansible_user"]) == (2222, "ops")
    assert inventory["_meta"]["hostvars"]["n2"]["base_firewall_ssh_port"] == 22
    assert n1["base_firewall_ssh_port"] == 2222



def test_a_gpu_node_of_one_scheduler_is_not_warned(lab):
    alone = dataclasses.replace(lab, groups={
        **lab.groups, "ray_workers": (), "k3s_servers": ("head", "storage1"),
        "k3s_agents": (), "ollama": ()})
    assert _shared_gpus(alone, list(GPUS)) == []
    assert _shared_gpus(lab, list(GPUS))[0].startswith("host 'gpu1': groups: its 8 GPUs")


def test_every_subnet_manager_in_one_driver_batch_is_warned(lab):
    # The lab puts its two opensm hosts (gpu1, gpu3) in different batches of 2.
    assert _subnet_managers_in_one_batch(lab, list(GPUS)) == []
    hosts = dict(lab.hosts)
    gpu3 = {k: v for k, v in hosts["gpu3"].data.items() if k != "infiniband_opensm_priority"}
    hosts["gpu3"] = dataclasses.replace(hosts["gpu3"], data=gpu3)
    hosts["gpu2"] = dataclasses.replace(
        hosts["gpu2"], data={**hosts["gpu2"].data, "infiniband_opensm_priority": 14})
    together = dataclasses.replace(lab, hosts=hosts)
    assert _subnet_managers_in_one_batch(together, list(GPUS)) == [
        "host 'gpu2': infiniband_opensm_priority: every subnet manager (gpu1, gpu2) is in "
        "one batch of nvidia_upgrade_batch_size 2: a driver change on every GPU node "
        "reboots them together, and the fabric has no subnet manager meanwhile (a link "
        "that flaps stays down); put them apart in the inventory's order, or lower the "
        "batch size"]
