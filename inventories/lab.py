#!/usr/bin/env python3
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
            # A custom Ray resource: tasks asking for it land on NVSwitch nodes.
            "ray_resources": {"nvswitch": 1},
            "hardware": {
                "cpus": 112,
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
                "ib_ports": [
                    {
                        "device": f"mlx5_{i}",
                        "port": 1,
                        "rate_gbps": 400,
                        **({"network": "ib", "address": f"10.40.0.{20 + n}"} if i == 0 else {}),
                    }
                    for i in range(4)
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
        "hardware": {
            "cpus": 64,
            "memory_gb": 512,
            "nics": [
                {
                    "name": "ens2f0",
                    "speed_gbps": 100,
                    "network": "storage",
                    "address": "10.30.0.40",
                    "mtu": 9000,
                },
            ],
            "nvme": [
                {"device": f"/dev/disk/by-id/nvme-KIOXIA_KCM7DRUG7T68_X2N0A00{i}"}
                for i in range(1, 5)
            ],
        },
    },
)

# Every host, given once with its data; the groups below name them again.
all = [_head, *[_gpu_worker(n) for n in range(1, 5)], _storage1]

_gpus = [f"gpu{n}" for n in range(1, 5)]

gpu_nodes = list(_gpus)
ib_nodes = list(_gpus)
slurm_controller = ["head"]
slurm_workers = list(_gpus)
ray_head = ["head"]
ray_workers = list(_gpus)
nfs_server = ["storage1"]
nfs_clients = ["head", *_gpus]
monitoring = ["head"]

finish(globals())
