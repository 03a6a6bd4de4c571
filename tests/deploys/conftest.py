"""Fixtures for planning deploys against fake hosts (no host is contacted)."""

from __future__ import annotations

import pytest

#: pyinfra's LinuxDistribution fact as read on each supported system.
DISTRIBUTIONS = {
    "debian12": {
        "name": "Debian",
        "major": 12,
        "minor": None,
        "release_meta": {"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm"},
    },
    "ubuntu2204": {
        "name": "Ubuntu",
        "major": 22,
        "minor": 4,
        "release_meta": {"ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "22.04"},
    },
    "ubuntu2404": {
        "name": "Ubuntu",
        "major": 24,
        "minor": 4,
        "release_meta": {"ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "24.04"},
    },
    "rocky9": {
        "name": "Rocky Linux",
        "major": 9,
        "minor": 4,
        "release_meta": {"ID": "rocky", "ID_LIKE": "rhel centos fedora", "VERSION_ID": "9.4"},
    },
}

CLUSTER = {
    "cluster_name": "demo",
    "networks": {
        "management": {"subnet": "10.10.0.0/24"},
        "fabric": {"subnet": "10.20.0.0/24", "mtu": 9000},
    },
    "package_cache": "head",
    # A site's mirror of NVIDIA's CUDA repository (aicluster names no package host).
    "nvidia_cuda_repo_url": "https://mirror.example.org/nvidia/cuda/repos",
    "base_chrony_server_host": "head",
    "base_admin_users": [
        {
            "name": "ops",
            "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFk3v4S3h3oV0bC9rj8w2nJ2dCq3 ops@x"],
            "sudo": True,
        }
    ],
}

HOSTS = [
    ("head", {"ssh_hostname": "10.10.0.10"}),
    (
        "gpu1",
        {
            "ssh_hostname": "10.10.0.21",
            "hardware": {
                "gpus": {"model": "H100-SXM5-80GB", "count": 8, "memory_gb": 80, "nvswitch": True},
                "nics": [
                    {"name": "ens1", "network": "fabric", "address": "10.20.0.21", "mtu": 9000}
                ],
            },
        },
    ),
]


@pytest.fixture(params=sorted(DISTRIBUTIONS))
def distro(request):
    return request.param
