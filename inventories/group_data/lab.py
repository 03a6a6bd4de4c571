"""Cluster-wide settings of the lab cluster (every host of ``inventories/lab.py``)."""

cluster_name = "lab"

# The cluster's own networks. The firewall trusts them; everything else may only SSH.
networks = {
    "management": {"subnet": "10.10.0.0/24"},
    "fabric": {"subnet": "10.20.0.0/24", "mtu": 9000},
    "storage": {"subnet": "10.30.0.0/24", "mtu": 9000},
    "ib": {"subnet": "10.40.0.0/24"},
}

# Only the head reaches the internet: it runs apt-cacher-ng and every node installs
# packages through it.
package_cache = "head"

# Secrets are named by reference, never written here.
secrets = {
    "munge_key": {"file": "/etc/aicluster/secrets/munge.key"},
    "k3s_token": {"env": "AICLUSTER_K3S_TOKEN"},
    "minio_root_password": {"env": "AICLUSTER_MINIO_ROOT_PASSWORD"},
}

# k3s's GPU nodes run NVIDIA's device plugin from the lab's registry mirror.
k3s_nvidia_device_plugin_image = "registry.lab.internal/nvidia/k8s-device-plugin:v0.17.1"

# Ceph (tentacle, the role's default release) from the lab's mirror of Ceph's
# repository (debian-tentacle/, rpm-tentacle/el9/, keys/release.asc;
# docs/components/ceph.md).
ceph_repo_url = "http://mirror.lab.internal/ceph"

# MinIO's buckets: the models readable without credentials (from the cluster networks
# only: the firewall admits nothing else), the checkpoints private and versioned.
minio_buckets = [
    {"name": "models", "policy": "download"},
    {"name": "checkpoints", "versioning": True},
]

# Time: the head syncs from the internet and serves the cluster.
base_chrony_server_host = "head"

base_admin_users = [
    {
        "name": "ops",
        "ssh_keys": [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFk3v4S3h3oV0bC9rj8w2nJ2dCq3lHf0i0q8R9mQxYz1 "
            "ops@lab"
        ],
        "sudo": True,
    },
]
