#!/usr/bin/env aicluster-inventory
"""An example cluster: a head node, four 8x H100 SXM GPU workers and a storage node.

    aicluster validate inventories/lab.py
    pyinfra inventories/lab.py deploy.py
    ansible-playbook -i inventories/lab.py playbooks/site.yml

Each host is given once with its data; groups name it again to give it a role.
Cluster-wide settings are in group_data/all.py and group_data/lab.py.
"""

from aicluster.inventory import finish


def _gpu_worker(n: int) -> tuple[str, dict]:
    return (
        f"gpu{n}",
        {
            "ssh_hostname": f"10.10.0.{20 + n}",
            # gpu1 runs the fabric's opensm, gpu3 the standby (the highest priority is
            # the master; docs/components/infiniband.md): in different batches of a
            # driver change (nvidia_upgrade_batch_size 2), never rebooted together.
            **({"infiniband_opensm_priority": 16 - n} if n in (1, 3) else {}),
            # A custom Ray resource: tasks asking for it land on NVSwitch nodes.
            "ray_resources": {"nvswitch": 1},
            "hardware": {
                "cpus": 112,  # two 56-core sockets, hyper-threading off in the BIOS
                "sockets": 2,
                "cores_per_socket": 56,
                "threads_per_core": 1,
                "memory_gb": 2048,
                "gpus": {"model": "H100-SXM5-80GB", "count": 8, "memory_gb": 80, "nvswitch": True},
                "nics": [
                    {
                        "mac": f"b8:3f:d2:00:{n:02x}:01",
                        "speed_gbps": 100,
                        "network": "fabric",
                        "address": f"10.20.0.{20 + n}",
                        "mtu": 9000,
                    },
                    {
                        "mac": f"b8:3f:d2:00:{n:02x}:02",
                        "speed_gbps": 100,
                        "network": "storage",
                        "address": f"10.30.0.{20 + n}",
                        "mtu": 9000,
                    },
                ],
                # Each HCA by its PCI address: rdma-core renames mlx5_N to a persistent
                # name (ibp26s0, ...) at the first reboot, the slot stays
                # (docs/components/infiniband.md, "Naming the ports").
                "ib_ports": [
                    {
                        "pci": f"0000:{bus}:00.0",
                        "port": 1,
                        "rate_gbps": 400,
                        **({"network": "ib", "address": f"10.40.0.{20 + n}"} if i == 0 else {}),
                    }
                    for i, bus in enumerate(("1a", "3c", "4d", "5e"))
                ],
                "nvme": [
                    {"device": f"/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S6GW{n}0001"},
                    {"device": f"/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S6GW{n}0002"},
                ],
            },
        },
    )


_head = (
    "head",
    {
        "ssh_hostname": "10.10.0.10",
        # The monitoring host: the space its system disk gives Prometheus' samples under
        # /var/lib/prometheus (30 days of the lab's ~30,000 series take ~10 GB;
        # docs/components/monitoring.md).
        "monitoring_storage_gb": 400,
        "hardware": {
            "cpus": 32,
            "memory_gb": 256,
            "nics": [
                {
                    "name": "ens1f0",
                    "speed_gbps": 25,
                    "network": "fabric",
                    "address": "10.20.0.10",
                    "mtu": 9000,
                },
                {
                    "name": "ens1f1",
                    "speed_gbps": 25,
                    "network": "storage",
                    "address": "10.30.0.10",
                    "mtu": 9000,
                },
            ],
        },
    },
)

_storage1 = (
    "storage1",
    {
        "ssh_hostname": "10.10.0.40",
        # Both 100 GbE ports in one LACP bond on the storage network, and the fabric
        # network as VLAN 20 on the same bond (docs/components/network.md).
        "network_bonds": [
            {"name": "bond0", "members": ["ens2f0", "ens2f1"], "network": "storage",
             "address": "10.30.0.40"},
        ],
        "network_vlans": [
            {"id": 20, "link": "bond0", "network": "fabric", "address": "10.20.0.40"},
        ],
        # Ring buffers of the 100 GbE ports raised at boot.
        "network_nic_tuning": True,
        # The cluster's shared models and datasets over NFS, to the storage network only
        # (every client mounts both at the same path; docs/components/nfs.md).
        "nfs_exports": [
            {"path": "/srv/models", "networks": ["storage"], "mode": "0755"},
            {"path": "/srv/datasets", "networks": ["storage"], "mode": "1777"},
        ],
        # Ceph OSDs on all four NVMe drives (one storage host: replicas on different
        # OSDs; docs/components/ceph.md). Never formatted while they hold data.
        "ceph_osd_devices": [
            {"device": f"/dev/disk/by-id/nvme-KIOXIA_KCM7DRUG7T68_X2N0A00{i}"}
            for i in range(1, 5)
        ],
        # MinIO on the four SATA SSDs of the front bays (XFS, mounted by UUID at
        # /mnt/minio1..4; never formatted while they hold data; docs/components/minio.md).
        "minio_drives": [
            {"device": f"/dev/disk/by-id/ata-SAMSUNG_MZ7L37T6HBLA-00A07_S6EWNA0T10{i}"}
            for i in range(1, 5)
        ],
        "hardware": {
            "cpus": 64,
            "memory_gb": 512,
            "nics": [
                {"name": f"ens2f{i}", "speed_gbps": 100, "network": "storage", "mtu": 9000}
                for i in range(2)
            ],
            "nvme": [
                {"device": f"/dev/disk/by-id/nvme-KIOXIA_KCM7DRUG7T68_X2N0A00{i}"}
                for i in range(1, 5)
            ],
        },
    },
)

# Every host, given once with its data; the groups below name them again. `@openssh/`
# reaches a host with the OpenSSH client over a master connection kept open between
# runs (its name stays `gpu1`); leave it out for pyinfra's own SSH connector
# (docs/inventory.md).
all = [(f"@openssh/{name}", data)
       for name, data in [_head, *[_gpu_worker(n) for n in range(1, 5)], _storage1]]

_gpus = [f"gpu{n}" for n in range(1, 5)]

# The NVIDIA driver of every GPU node, pinned to an exact version of its branch, with
# the CUDA toolkit; a bump upgrades two nodes at a time (docs/components/nvidia.md).
gpu_nodes = (
    list(_gpus),
    {
        # The lab's mirror of NVIDIA's CUDA repository.
        "nvidia_cuda_repo_url": "http://mirror.lab.internal/nvidia/cuda/repos",
        "nvidia_driver_branch": "570",
        "nvidia_driver_version": "570.133.20",
        "nvidia_cuda_version": "12.8",
        "nvidia_upgrade_batch_size": 2,
    },
)
ib_nodes = list(_gpus)
slurm_controller = ["head"]
slurm_workers = list(_gpus)
ray_head = ["head"]
ray_workers = list(_gpus)
nfs_server = ["storage1"]
nfs_clients = ["head", *_gpus]
# Ceph: three monitors (with managers), OSDs on storage1, CephFS served by storage1's
# MDS and mounted by the head and the GPU nodes (ceph-fuse).
ceph_mons = ["head", "storage1", "gpu1"]
ceph_osds = ["storage1"]
ceph_mds = ["storage1"]
ceph_clients = ["head", *_gpus]
# MinIO: one server with four drives (erasure coded across them); the buckets are in
# group_data/lab.py.
minio = ["storage1"]
# k3s: three servers (embedded etcd, started by the head) and GPU agents, on the
# fabric network (docs/components/k3s.md).
k3s_servers = ["head", "storage1", "gpu1"]
k3s_agents = ["gpu2", "gpu3", "gpu4"]
monitoring = ["head"]
# Ollama on two GPU nodes (models on their NVMe cache), one endpoint for both through
# the gateway on the head (docs/components/ollama.md).
ollama = ["gpu3", "gpu4"]
ollama_gateway = ["head"]

finish(globals())
