"""Every bad inventory input is refused before any host is touched, with its own
message naming the host and the field.

Each case changes one thing in a valid two-host inventory (see conftest.py), writes it
to a temporary directory, loads it with ``aicluster.inventory.load_cluster`` and
expects exactly one problem: its host, its field and its wording.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from aicluster.inventory import InventoryError, load_cluster

PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAA\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
PUBLIC_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFk3v4S3h3oV0bC9rj8w2nJ2dCq3lHf0i0q8R9mQxYz1 ops@test"
)


#: A site's mirror of Ceph's repository (a Ceph host from ceph_repo needs one).
CEPH_MIRROR = "https://mirror.example.org/ceph"


def _gpu(count: int, model: str = "H100-SXM5-80GB") -> dict[str, Any]:
    return {"model": model, "count": count, "memory_gb": 80}


#: (id, changes, host, field, wording). A change is (path, value): see
#: InventorySpec.set (None removes the key); ("+name", n) adds a host made like the
#: others with addresses .n; ("twice.group", name) names a host in a group with its
#: data again.
# fmt: off
CASES: list[tuple[str, list[tuple[str, Any]], str, str, str]] = [
    # -- hosts given twice, addresses used twice --------------------------------
    (
        "host-with-data-twice",
        [("twice.monitoring", "n1")],
        "n1", "defined twice",
        "(with data in groups all, monitoring); give its data once",
    ),
    (
        "group-names-unknown-host",
        [("groups.monitoring", ["n9"])],
        "n9", "groups",
        "named in monitoring but not given in 'all'",
    ),
    (
        "duplicate-management-address",
        [("n2.ssh_hostname", "192.0.2.1")],
        "n2", "ssh_hostname",
        "address 192.0.2.1 is also used by host 'n1' (ssh_hostname)",
    ),
    (
        "duplicate-nic-address",
        [("n2.hardware.nics[0].address", "198.51.100.1")],
        "n2", "hardware.nics[0].address",
        "address 198.51.100.1 is also used by host 'n1' (hardware.nics[0].address)",
    ),
    (
        "duplicate-mac",
        [("n2.hardware.nics[0].mac", "02:00:00:00:00:01")],
        "n2", "hardware.nics[0].mac",
        "02:00:00:00:00:01 is also used by host 'n1'",
    ),
    (
        "duplicate-mac-any-case",
        [("n2.hardware.nics[0].mac", "02:00:00:00:00:01".upper())],
        "n2", "hardware.nics[0].mac",
        "02:00:00:00:00:01 is also used by host 'n1'",
    ),
    # -- addresses and networks ------------------------------------------------
    (
        "ssh-hostname-outside-management",
        [("n1.ssh_hostname", "10.9.9.9")],
        "n1", "ssh_hostname",
        "10.9.9.9 is outside the management network 192.0.2.0/24",
    ),
    (
        "nic-address-outside-fabric",
        [("n1.hardware.nics[0].address", "198.51.101.1")],
        "n1", "hardware.nics[0].address",
        "198.51.101.1 is outside the fabric network 198.51.100.0/24",
    ),
    (
        "ipoib-address-outside-ib",
        [("n1.hardware.ib_ports", [{"device": "mlx5_0", "network": "ib", "address": "10.4.0.1"}])],
        "n1", "hardware.ib_ports[0].address",
        "10.4.0.1 is outside the ib network 203.0.113.0/24",
    ),
    (
        "ssh-hostname-not-an-ip",
        [("n1.ssh_hostname", "n1.example.org")],
        "n1", "ssh_hostname",
        "'n1.example.org' is not an IP address",
    ),
    (
        "nic-address-not-an-ip",
        [("n1.hardware.nics[0].address", "198.51.100.300")],
        "n1", "hardware.nics[0].address",
        "'198.51.100.300' is not an IP address",
    ),
    (
        "unknown-network-on-nic",
        [("n1.hardware.nics[0].network", "storage")],
        "n1", "hardware.nics[0].network",
        "unknown network 'storage'; declared: management, fabric, ib",
    ),
    (
        "unknown-network-on-ib-port",
        [("n1.hardware.ib_ports", [{"device": "mlx5_0", "network": "infiniband"}])],
        "n1", "hardware.ib_ports[0].network",
        "unknown network 'infiniband'",
    ),
    (
        "ipoib-address-without-network",
        [("n1.hardware.ib_ports", [{"device": "mlx5_0", "address": "203.0.113.1"}])],
        "n1", "hardware.ib_ports[0]",
        "an IPoIB address needs a network",
    ),
    (
        "unknown-network-name",
        [("all.networks.public", {"subnet": "172.16.0.0/24"})],
        "n1", "networks",
        "unknown network(s) public; known: management, fabric, storage, ib",
    ),
    (
        "missing-management-network",
        [("all.networks", {"fabric": {"subnet": "198.51.100.0/24"}})],
        "n1", "networks",
        "the management network is required",
    ),
    (
        "no-networks-at-all",
        [("all.networks", None)],
        "n1", "networks",
        "Field required",
    ),
    (
        "subnet-with-host-bits",
        [("all.networks.management.subnet", "192.0.2.1/24")],
        "n1", "networks.management.subnet",
        "'192.0.2.1/24' is not a network in CIDR form (192.0.2.1/24 has host bits set)",
    ),
    (
        "network-mtu-out-of-range",
        [("all.networks.fabric.mtu", 9600)],
        "n1", "networks",
        "fabric.mtu: MTU 9600 is out of range for the fabric network (1280-9216)",
    ),
    (
        "networks-differ-between-hosts",
        [("n2.networks", {"management": {"subnet": "192.0.2.0/24"},
                          "fabric": {"subnet": "198.51.100.0/24"},
                          "ib": {"subnet": "203.0.113.0/24"}})],
        "n2", "networks",
        "not the same as on host 'n1'; cluster-wide settings must be the same",
    ),
    (
        "package-proxy-differs-between-hosts",
        [("n2.package_proxy", "http://192.0.2.254:3142")],
        "n2", "package_proxy",
        "not the same as on host 'n1'",
    ),
    # -- groups ----------------------------------------------------------------
    (
        "unknown-group",
        [("groups.slurm_worker", ["n1"])],
        "n1", "groups",
        "unknown group 'slurm_worker'; known groups: ceph_clients, ceph_mds",
    ),
    (
        "slurm-workers-without-controller",
        [("groups.slurm_workers", ["n1", "n2"])],
        "n1", "groups",
        "is in slurm_workers, which needs one slurm_controller (two with a backup); "
        "the inventory has 0",
    ),
    (
        "three-slurm-controllers",
        [("+n3", 3), ("groups.slurm_controller", ["n1", "n2", "n3"])],
        "n3", "groups",
        "slurm_controller allows at most 2 host(s); the inventory has 3",
    ),
    (
        "ray-workers-without-head",
        [("groups.ray_workers", ["n2"])],
        "n2", "groups",
        "is in ray_workers, which needs exactly one ray_head; the inventory has 0",
    ),
    (
        "two-ray-heads",
        [("groups.ray_head", ["n1", "n2"])],
        "n2", "groups",
        "ray_head allows at most 1 host(s); the inventory has 2",
    ),
    # -- ray (aicluster.components.ray.deploy.validate) ------------------------------------
    (
        "ray-version-missing",
        [("groups.ray_head", ["n1"]), ("groups.ray_workers", ["n2"])],
        "n1", "ray_version",
        "not set; pin the Ray version every node runs (ray_version in group_data/all.py)",
    ),
    (
        "ray-version-differs-on-a-host",
        [("groups.ray_head", ["n1"]), ("groups.ray_workers", ["n2"]),
         ("all.ray_version", "2.60.0"), ("n2.ray_version", "2.59.0")],
        "n2", "ray_version",
        "'2.59.0' differs from '2.60.0' on host 'n1'; every Ray node runs one version",
    ),
    (
        "ray-network-without-address",
        [("groups.ray_head", ["n1"]), ("groups.ray_workers", ["n2"]),
         ("all.ray_version", "2.60.0"), ("all.ray_network", "ib")],
        "n1", "ray_network",
        "the host has no address on the ib network",
    ),
    (
        "ray-resource-reserved-name",
        [("groups.ray_head", ["n1"]), ("groups.ray_workers", ["n2"]),
         ("all.ray_version", "2.60.0"), ("n2.ray_resources", {"GPU": 2})],
        "n2", "ray_resources.GPU",
        "Ray sets GPU itself from the inventory's hardware",
    ),
    (
        "ray-memory-fractions-too-large",
        [("groups.ray_head", ["n1"]), ("groups.ray_workers", ["n2"]),
         ("all.ray_version", "2.60.0"), ("all.ray_memory_fraction", 0.8)],
        "n1", "ray_memory_fraction",
        "gives Ray 1.10 of the node's memory",
    ),
    (
        "ray-dashboard-host-not-an-address",
        [("groups.ray_head", ["n1"]), ("all.ray_version", "2.60.0"),
         ("n1.ray_dashboard_host", "head.example")],
        "n1", "ray_dashboard_host",
        "'head.example' is not an IP address",
    ),
    # -- ray_* values (aicluster.components.ray.model) -------------------------------
    (
        "ray-unknown-key",
        [("all.ray_verison", "2.60.0")],
        "n1", "ray_verison",
        "not a ray setting; did you mean ray_version?",
    ),
    (
        "ray-port-quoted",
        [("all.ray_port", "6379")],
        "n1", "ray_port",
        "Input should be a valid integer (got '6379')",
    ),
    (
        "ray-fraction-out-of-range",
        [("all.ray_object_store_fraction", 1.5)],
        "n1", "ray_object_store_fraction",
        "Input should be less than 1 (got 1.5)",
    ),
    (
        "ray-fraction-quoted",
        [("all.ray_memory_fraction", "0.5")],
        "n1", "ray_memory_fraction",
        "Input should be a valid number (got '0.5')",
    ),
    (
        "ray-resource-negative",
        [("n2.ray_resources", {"nvswitch": -1})],
        "n2", "ray_resources.nvswitch",
        "Input should be greater than or equal to 0 (got -1)",
    ),
    (
        "ray-resource-bad-name",
        [("n2.ray_resources", {"has space": 1})],
        "n2", "ray_resources.has space",
        "String should match pattern",
    ),
    (
        "ray-temp-dir-relative",
        [("all.ray_temp_dir", "tmp/ray")],
        "n1", "ray_temp_dir",
        "String should match pattern '^/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$' (got 'tmp/ray')",
    ),
    (
        "ray-network-unknown-name",
        [("all.ray_network", "wan")],
        "n1", "ray_network",
        "Input should be '', 'management', 'fabric', 'storage' or 'ib' (got 'wan')",
    ),
    (
        "ray-pip-extras-not-a-list",
        [("all.ray_pip_extras", "default")],
        "n1", "ray_pip_extras",
        "Input should be a valid list (got 'default')",
    ),
    (
        "ray-version-not-a-version",
        [("all.ray_version", "latest")],
        "n1", "ray_version",
        "'latest' is not a version (like '23.11.4' or '535')",
    ),
    (
        "k3s-agents-without-servers",
        [("groups.k3s_agents", ["n2"])],
        "n2", "groups",
        "is in k3s_agents, which needs at least one k3s_servers host; the inventory has 0",
    ),
    (
        "ceph-osds-without-mons",
        [("groups.ceph_osds", ["n2"])],
        "n2", "groups",
        "is in ceph_osds, which needs at least one ceph_mons host; the inventory has 0",
    ),
    (
        "nfs-clients-without-server",
        [("groups.nfs_clients", ["n2"])],
        "n2", "groups",
        "is in nfs_clients, which needs exactly one nfs_server; the inventory has 0",
    ),
    (
        "gpu-node-without-gpus",
        [("groups.gpu_nodes", ["n1"])],
        "n1", "hardware.gpus.count",
        "is in gpu_nodes but declares no GPUs",
    ),
    # -- MTUs ------------------------------------------------------------------
    (
        "ethernet-mtu-9500",
        [("n1.hardware.nics[0].mtu", 9500)],
        "n1", "hardware.nics[0].mtu",
        "MTU 9500 is out of range for Ethernet (1280-9216)",
    ),
    (
        "ethernet-mtu-500",
        [("n1.hardware.nics[0].mtu", 500)],
        "n1", "hardware.nics[0].mtu",
        "MTU 500 is out of range for Ethernet (1280-9216)",
    ),
    (
        "ipoib-datagram-mtu-4096",
        [("n1.hardware.ib_ports", [{"device": "mlx5_0", "mtu": 4096}])],
        "n1", "hardware.ib_ports[0].mtu",
        "MTU 4096 is out of range for IPoIB datagram mode (1280-4092)",
    ),
    (
        "ipoib-connected-mtu-65521",
        [("n1.hardware.ib_ports", [{"device": "mlx5_0", "mode": "connected", "mtu": 65521}])],
        "n1", "hardware.ib_ports[0].mtu",
        "MTU 65521 is out of range for IPoIB connected mode (1280-65520)",
    ),
    # -- devices ---------------------------------------------------------------
    *[
        (
            f"device-{label}",
            [("n1.hardware.nvme", [{"device": device}])],
            "n1", "hardware.nvme[0].device",
            f"{device!r} is not a block device path (use /dev/disk/by-id/... or /dev/nvmeXnY)",
        )
        for label, device in [
            ("bare-name", "nvme0n1"),
            ("dev-dir", "/dev/"),
            ("outside-dev", "/tmp/disk"),
            ("dotdot", "/dev/../etc/passwd"),
            ("trailing-dotdot", "/dev/disk/by-id/.."),
            ("dot", "/dev/./nvme0n1"),
        ]
    ],
    (
        "device-listed-twice",
        [("n1.hardware.nvme", [{"device": "/dev/nvme0n1"}, {"device": "/dev/nvme0n1"}])],
        "n1", "hardware.nvme[1].device",
        "/dev/nvme0n1 is listed twice",
    ),
    (
        "nic-listed-twice",
        [("n1.hardware.nics", [{"name": "eth1", "network": "fabric"},
                               {"name": "eth1", "network": "fabric"}])],
        "n1", "hardware.nics[1].name",
        "eth1 is listed twice",
    ),
    # -- storage settings (the nvme_cache, nfs and ceph settings models) ---------
    (
        "nfs-setting-unknown-key",
        [("n1.nfs_mount_option", ["ro"])],
        "n1", "nfs_mount_option",
        "not a nfs setting; did you mean nfs_mount_options?",
    ),
    (
        "nfs-setting-quoted-number",
        [("all.nfs_nconnect", "8")],
        "n1", "nfs_nconnect",
        "Input should be a valid integer (got '8')",
    ),
    (
        "nfs-export-unknown-key",
        [("n1.nfs_exports", [{"path": "/srv/x", "size": 3}])],
        "n1", "nfs_exports[0].size",
        "Extra inputs are not permitted",
    ),
    (
        "nvme-cache-setting-tuple-for-list",
        [("n1.nvme_cache_mount_options", ("noatime",))],
        "n1", "nvme_cache_mount_options",
        "Input should be a valid list (got ('noatime',))",
    ),
    # -- counts ----------------------------------------------------------------
    (
        "gpu-count-negative",
        [("n1.hardware.gpus", _gpu(-1))],
        "n1", "hardware.gpus.count",
        "Input should be greater than or equal to 0 (got -1)",
    ),
    (
        "gpu-count-64",
        [("n1.hardware.gpus", _gpu(64))],
        "n1", "hardware.gpus.count",
        "Input should be less than or equal to 16 (got 64)",
    ),
    (
        "cpus-zero",
        [("n1.hardware.cpus", 0)],
        "n1", "hardware.cpus",
        "Input should be greater than or equal to 1 (got 0)",
    ),
    (
        "memory-absurd",
        [("n1.hardware.memory_gb", 10**7)],
        "n1", "hardware.memory_gb",
        "Input should be less than or equal to 65536 (got 10000000)",
    ),
    (
        "nic-speed-zero",
        [("n1.hardware.nics[0].speed_gbps", 0)],
        "n1", "hardware.nics[0].speed_gbps",
        "Input should be greater than or equal to 1 (got 0)",
    ),
    (
        "cpu-layout-partial",
        [("n1.hardware.sockets", 2)],
        "n1", "hardware",
        "sockets, cores_per_socket and threads_per_core go together: give all three or none",
    ),
    (
        "cpu-layout-not-cpus",
        [("n1.hardware.cpus", 64), ("n1.hardware.sockets", 2),
         ("n1.hardware.cores_per_socket", 16), ("n1.hardware.threads_per_core", 1)],
        "n1", "hardware",
        "sockets x cores_per_socket x threads_per_core is 2 x 16 x 1 = 32, but cpus is 64",
    ),
    (
        "gpus-without-model",
        [("n1.hardware.gpus", {"count": 8})],
        "n1", "hardware.gpus",
        "a GPU model is required when count > 0",
    ),
    (
        "nvswitch-without-gpus",
        [("n1.hardware.gpus", {"nvswitch": True})],
        "n1", "hardware.gpus",
        "nvswitch is set but the node has no GPUs",
    ),
    (
        "nic-without-name-or-mac",
        [("n1.hardware.nics", [{"network": "fabric", "address": "198.51.100.1"}])],
        "n1", "hardware.nics[0]",
        "a NIC needs a name or a mac",
    ),
    (
        "nic-bad-mac",
        [("n1.hardware.nics[0].mac", "02:00:00:00:01")],
        "n1", "hardware.nics[0].mac",
        "'02:00:00:00:01' is not a MAC address (aa:bb:cc:dd:ee:ff)",
    ),
    (
        "unknown-hardware-field",
        [("n1.hardware.gpu", 8)],
        "n1", "hardware.gpu",
        "Extra inputs are not permitted",
    ),
    # -- secrets ---------------------------------------------------------------
    (
        "secret-inline-under-secrets",
        [("all.secrets", {"munge_key": "abc"})],
        "n1", "secrets",
        "secret 'munge_key' is written inline; give {'file': PATH} or {'env': VARIABLE}",
    ),
    (
        "secret-inline-password-key",
        [("all.minio_root_password", "x")],
        "n1", "minio_root_password",
        "a secret is written inline; put it in a file or an environment variable",
    ),
    (
        "secret-inline-key-key",
        [("all.munge_key", "abc")],
        "n1", "munge_key",
        "a secret is written inline",
    ),
    (
        "secret-inline-nested-in-list",
        [("all.base_admin_users", [{"name": "ops", "ssh_keys": [], "password": "hunter2"}])],
        "n1", "base_admin_users[0].password",
        "a secret is written inline",
    ),
    (
        "secret-ref-file-and-env",
        [("all.secrets", {"munge_key": {"file": "/etc/munge.key", "env": "MUNGE_KEY"}})],
        "n1", "secrets.munge_key",
        "gives both 'file' and 'env'; give exactly one of them",
    ),
    (
        "secret-ref-neither",
        [("all.secrets", {"munge_key": {}})],
        "n1", "secrets.munge_key",
        "gives neither 'file' nor 'env'; give exactly one of them",
    ),
    (
        "secret-ref-bad-env-name",
        [("all.secrets", {"k3s_token": {"env": "K3S TOKEN"}})],
        "n1", "secrets.k3s_token",
        "'K3S TOKEN' is not an environment variable name",
    ),
    # -- versions and cluster settings -----------------------------------------
    (
        "version-latest",
        [("all.slurm_version", "latest")],
        "n1", "slurm_version",
        "'latest' is not a version (like '23.11.4' or '535')",
    ),
    (
        "version-wildcard",
        [("all.slurm_version", "23.11.x")],
        "n1", "slurm_version",
        "'23.11.x' is not a version (like '23.11.4' or '535')",
    ),
    (
        "version-not-a-string",
        [("all.nvidia_driver_version", 535)],
        "n1", "nvidia_driver_version",
        "Input should be a valid string (got 535)",
    ),
    (
        "cluster-name-bad",
        [("all.cluster_name", "My Cluster")],
        "n1", "cluster_name",
        "String should match pattern '^[a-z][a-z0-9_-]{0,39}$' (got 'My Cluster')",
    ),
    (
        "package-cache-unknown-host",
        [("all.package_cache", "cache1")],
        "n1", "package_cache",
        "'cache1' is not a host of this inventory",
    ),
    (
        "package-proxy-not-a-url",
        [("all.package_proxy", "proxy.example:3142")],
        "n1", "package_proxy",
        "String should match pattern",
    ),
    # -- base_* (aicluster.components.base.model, .derive.validate) ----------------------
    (
        "chrony-server-unknown-host",
        [("all.base_chrony_server_host", "ntp1")],
        "n1", "base_chrony_server_host",
        "'ntp1' is not a host of this inventory",
    ),
    (
        "admin-user-private-key",
        [("all.base_admin_users", [{"name": "ops", "ssh_keys": [PRIVATE_KEY]}])],
        "n1", "base_admin_users[0].ssh_keys[0]",
        "not an SSH public key (a private key must never be in the inventory)",
    ),
    (
        "admin-user-garbage-key",
        [("all.base_admin_users", [{"name": "ops", "ssh_keys": ["hello world"]}])],
        "n1", "base_admin_users[0].ssh_keys[0]",
        "not an SSH public key",
    ),
    (
        "admin-user-keys-not-a-list",
        [("all.base_admin_users", [{"name": "ops", "ssh_keys": PUBLIC_KEY}])],
        "n1", "base_admin_users[0].ssh_keys",
        "must be a list of public keys",
    ),
    (
        "admin-user-bad-name",
        [("all.base_admin_users", [{"name": "Ops Team", "ssh_keys": [PUBLIC_KEY]}])],
        "n1", "base_admin_users[0].name",
        "String should match pattern '^[a-z_][a-z0-9_-]{0,31}$' (got 'Ops Team')",
    ),
    (
        "admin-user-unknown-field",
        [("all.base_admin_users", [{"name": "ops", "ssh_keys": [], "groups": ["wheel"]}])],
        "n1", "base_admin_users[0].groups",
        "Extra inputs are not permitted",
    ),
    (
        "admin-user-without-keys",
        [("all.base_admin_users", [{"name": "ops"}])],
        "n1", "base_admin_users[0].ssh_keys",
        "Field required",
    ),
    (
        "admin-user-sudo-null",
        [("all.base_admin_users", [{"name": "ops", "ssh_keys": [], "sudo": None}])],
        "n1", "base_admin_users[0].sudo",
        "Input should be a valid boolean (got None)",
    ),
    (
        "admin-users-not-a-list",
        [("all.base_admin_users", {"name": "ops"})],
        "n1", "base_admin_users",
        "Input should be a valid list (got {'name': 'ops'})",
    ),
    (
        "sysctl-bad-name",
        [("all.base_sysctl", {"net core rmem": 1})],
        "n1", "base_sysctl",
        "'net core rmem' is not a sysctl name",
    ),
    (
        "sysctl-bad-value",
        [("all.base_sysctl", {"net.core.rmem_max": "1; reboot"})],
        "n1", "base_sysctl.net.core.rmem_max",
        "'1; reboot' is not a sysctl value",
    ),
    (
        "sysctl-not-a-mapping",
        [("all.base_sysctl", ["net.core.rmem_max=1"])],
        "n1", "base_sysctl",
        "Input should be a valid dictionary (got ['net.core.rmem_max=1'])",
    ),
    (
        "memlock-not-a-limit",
        [("all.base_memlock_limit", "lots")],
        "n1", "base_memlock_limit",
        "'lots' is not a memlock limit ('unlimited' or a number of KiB)",
    ),
    (
        "firewall-ssh-source-host-bits",
        [("all.base_firewall_ssh_sources", ["10.0.0.1/8"])],
        "n1", "base_firewall_ssh_sources[0]",
        "'10.0.0.1/8' is not a network in CIDR notation",
    ),
    (
        "firewall-public-port-proto",
        [("all.base_firewall_public_ports", [{"port": 443, "proto": "sctp"}])],
        "n1", "base_firewall_public_ports[0].proto",
        "Input should be 'tcp' or 'udp' (got 'sctp')",
    ),
    # -- connection fields -----------------------------------------------------
    (
        "host-name-uppercase",
        [("+Node3", 3)],
        "Node3", "name",
        "not a valid host name (a-z, 0-9, '-'; max 63)",
    ),
    (
        "host-name-underscore",
        [("+node_3", 3)],
        "node_3", "name",
        "not a valid host name",
    ),
    (
        "ssh-port-zero",
        [("n1.ssh_port", 0)],
        "n1", "ssh_port",
        "Input should be greater than or equal to 1 (got 0)",
    ),
    (
        "ssh-port-too-big",
        [("n1.ssh_port", 70000)],
        "n1", "ssh_port",
        "Input should be less than or equal to 65535 (got 70000)",
    ),
    (
        "ssh-port-not-a-number",
        [("n1.ssh_port", "ssh")],
        "n1", "ssh_port",
        "Input should be a valid integer",
    ),
    (
        "ssh-user-bad",
        [("n1.ssh_user", "Admin")],
        "n1", "ssh_user",
        "(got 'Admin')",
    ),
    # -- network: bonds, VLANs, the management interface ----------------------
    (
        "network-bond-unknown-member",
        [("n1.network_bonds", [{"name": "bond0", "members": ["eth9"]}])],
        "n1", "network_bonds[0].members[0]",
        "'eth9' is not a NIC of this host (hardware.nics, by name or MAC)",
    ),
    (
        "network-bond-member-with-address",
        [("n1.network_bonds", [{"name": "bond0", "members": ["eth1"]}])],
        "n1", "hardware.nics[0].address",
        "198.51.100.1 is on a member of bond bond0; give the address to the bond",
    ),
    (
        "network-bond-mode",
        [("n1.hardware.nics[0].address", None),
         ("n1.network_bonds", [{"name": "bond0", "members": ["eth1"], "mode": "lacp"}])],
        "n1", "network_bonds[0].mode",
        "Input should be 'balance-rr', 'active-backup', 'balance-xor', 'broadcast', '802.3ad', "
        "'balance-tlb' or 'balance-alb' (got 'lacp')",
    ),
    (
        "network-bond-hash",
        [("n1.hardware.nics[0].address", None),
         ("n1.network_bonds", [{"name": "bond0", "members": ["eth1"], "hash": "layer4"}])],
        "n1", "network_bonds[0].hash",
        "Input should be 'layer2', 'layer2+3', 'layer3+4', 'encap2+3', 'encap3+4' or "
        "'vlan+srcmac' (got 'layer4')",
    ),
    (
        "network-bond-unknown-key",
        [("n1.hardware.nics[0].address", None),
         ("n1.network_bonds", [{"name": "bond0", "members": ["eth1"], "modes": "802.3ad"}])],
        "n1", "network_bonds[0].modes",
        "Extra inputs are not permitted",
    ),
    (
        "network-bond-miimon-null",
        [("n1.hardware.nics[0].address", None),
         ("n1.network_bonds", [{"name": "bond0", "members": ["eth1"], "miimon": None}])],
        "n1", "network_bonds[0].miimon",
        "Input should be a valid integer (got None)",
    ),
    (
        "network-bond-address-without-network",
        [("n1.hardware.nics[0].address", None),
         ("n1.network_bonds", [{"name": "bond0", "members": ["eth1"],
                                "address": "198.51.100.1"}])],
        "n1", "network_bonds[0].address",
        "an address needs a network",
    ),
    (
        "network-bond-address-outside",
        [("n1.hardware.nics[0].address", None),
         ("n1.network_bonds", [{"name": "bond0", "members": ["02:00:00:00:00:01"],
                                "network": "fabric", "address": "10.1.1.1"}])],
        "n1", "network_bonds[0].address",
        "10.1.1.1 is outside the fabric network 198.51.100.0/24",
    ),
    (
        "network-vlan-id",
        [("n1.network_vlans", [{"id": 5000, "link": "eth1"}])],
        "n1", "network_vlans[0].id",
        "Input should be less than or equal to 4094 (got 5000)",
    ),
    (
        "network-vlan-unknown-link",
        [("n1.network_vlans", [{"id": 20, "link": "bond7"}])],
        "n1", "network_vlans[0].link",
        "'bond7' is not a NIC (name or MAC) or bond of this host",
    ),
    (
        "network-vlan-address-taken",
        [("n1.network_vlans", [{"id": 20, "link": "eth1", "network": "fabric",
                                "address": "198.51.100.2"}])],
        "n1", "network_vlans[0].address",
        "address 198.51.100.2 is also used by host 'n2' (hardware.nics)",
    ),
    (
        "network-vlan-mtu-above-link",
        [("n1.network_vlans", [{"id": 20, "link": "eth1", "mtu": 9000}]),
         ("n1.hardware.nics[0].mtu", 1500)],
        "n1", "network_vlans[0].mtu",
        "9000 is above the MTU of its link eth1 (1500)",
    ),
    (
        "network-nic-on-management",
        [("n1.hardware.nics[0].network", "management"),
         ("n1.hardware.nics[0].address", None)],
        "n1", "hardware.nics[0].network",
        "the management network carries the deploy's own connection",
    ),
    (
        "network-renderer",
        [("n1.network_renderer", "ifupdown")],
        "n1", "network_renderer",
        "Input should be '', 'netplan', 'networkd' or 'networkmanager' (got 'ifupdown')",
    ),
    (
        "network-quoted-number",
        [("n1.network_rollback_seconds", "120")],
        "n1", "network_rollback_seconds",
        "Input should be a valid integer (got '120')",
    ),
    (
        "network-unknown-setting",
        [("n1.network_vlan", [{"id": 20, "link": "eth1"}])],
        "n1", "network_vlan",
        "not a network setting; did you mean network_vlans?",
    ),
    # -- infiniband: the subnet manager, locked memory ---------------------------
    (
        "infiniband-no-subnet-manager",
        [("n1.hardware.ib_ports", [{"device": "mlx5_0"}]), ("groups.ib_nodes", ["n1"])],
        "n1", "infiniband_opensm_priority",
        "the fabric has no subnet manager",
    ),
    (
        "infiniband-opensm-priority-range",
        [("groups.ib_nodes", ["n1"]), ("n1.infiniband_opensm_priority", 16)],
        "n1", "infiniband_opensm_priority",
        "Input should be less than or equal to 15 (got 16)",
    ),
    (
        "infiniband-opensm-config-sm-priority",
        [("all.infiniband_opensm_config", {"sm_priority": 15})],
        "n1", "infiniband_opensm_config",
        "sm_priority: set it with infiniband_opensm_priority",
    ),
    (
        "infiniband-opensm-and-switch",
        [("groups.ib_nodes", ["n1"]), ("n1.infiniband_opensm_priority", 15),
         ("n1.infiniband_subnet_manager", "switch")],
        "n1", "infiniband_opensm_priority",
        "set while infiniband_subnet_manager is 'switch'",
    ),
    (
        "infiniband-standby-same-priority",
        [("groups.ib_nodes", ["n1", "n2"]), ("n1.infiniband_opensm_priority", 15),
         ("n2.infiniband_opensm_priority", 15)],
        "n2", "infiniband_opensm_priority",
        "15 is also 'n1''s; give the standby a lower priority than the primary",
    ),
    (
        "infiniband-memlock",
        [("groups.ib_nodes", ["n1"]), ("n1.base_memlock_limit", 65536)],
        "n1", "base_memlock_limit",
        "RDMA registers pinned memory, so ib_nodes need 'unlimited'",
    ),
    # -- nvidia ---------------------------------------------------------------------
    (
        "nvidia-version-outside-branch",
        [("n1.hardware.gpus", _gpu(8)), ("groups.gpu_nodes", ["n1"]),
         ("all.nvidia_driver_version", "575.51.03"),
         ("all.nvidia_cuda_repo_url", "https://mirror.example.org/nvidia/cuda/repos")],
        "n1", "nvidia_driver_version",
        "575.51.03 is not of nvidia_driver_branch 570",
    ),
    (
        "nvidia-auto-bool",
        [("all.nvidia_peermem", "yes")],
        "n1", "nvidia_peermem",
        "'yes' is not 'auto', true or false",
    ),
    (
        "nvidia-quoted-number",
        [("all.nvidia_upgrade_batch_size", "2")],
        "n1", "nvidia_upgrade_batch_size",
        "Input should be a valid integer (got '2')",
    ),
    (
        "nvidia-unknown-setting",
        [("all.nvidia_driver_brunch", "570")],
        "n1", "nvidia_driver_brunch",
        "not a nvidia setting; did you mean nvidia_driver_branch?",
    ),
    (
        "nvidia-cuda-repo-url-not-a-url",
        [("all.nvidia_cuda_repo_url", "mirror.example.org/cuda")],
        "n1", "nvidia_cuda_repo_url",
        "String should match pattern",
    ),
    (
        "nvidia-cuda-repo-url-missing",
        [("n1.hardware.gpus", _gpu(8)), ("groups.gpu_nodes", ["n1"])],
        "n1", "nvidia_cuda_repo_url",
        "not set; with nvidia_source 'cuda_repo' give the URL",
    ),
    (
        "nvidia-batch-size-differs",
        [("n1.hardware.gpus", _gpu(8)), ("n2.hardware.gpus", _gpu(8)),
         ("groups.gpu_nodes", ["n1", "n2"]),
         ("all.nvidia_cuda_repo_url", "https://mirror.example.org/nvidia/cuda/repos"),
         ("n2.nvidia_upgrade_batch_size", 2)],
        "n2", "nvidia_upgrade_batch_size",
        "2 differs from 1 on host 'n1'",
    ),
    (
        "gpu-vendor-unknown",
        [("n1.hardware.gpus", {**_gpu(8), "vendor": "amd"})],
        "n1", "hardware.gpus.vendor",
        "Input should be 'nvidia' or 'standin' (got 'amd')",
    ),
    (
        "ssh-hostname-missing",
        [("n1.ssh_hostname", None)],
        "n1", "ssh_hostname",
        "Field required",
    ),
    # -- a field's name nearly right: the field would keep its default ------------
    (
        "host-field-misspelt",
        [("n1.hardwre", {"cpus": 4})],
        "n1", "hardwre",
        "not a host or cluster field; did you mean hardware?",
    ),
    (
        "cluster-field-misspelt",
        [("all.network", {"management": {"subnet": "192.0.2.0/24"}})],
        "n1", "network",
        "not a host or cluster field; did you mean networks?",
    ),
    # -- networks against each other, addresses against their network ------------
    (
        "networks-overlap",
        [("all.networks.fabric.subnet", "192.0.2.0/25")],
        "n1", "networks",
        "fabric.subnet: 192.0.2.0/25 overlaps the management network 192.0.2.0/24; each "
        "network needs a subnet of its own",
    ),
    (
        "networks-overlap-ib-inside-fabric",
        [("all.networks.ib.subnet", "198.51.100.128/25")],
        "n1", "networks",
        "ib.subnet: 198.51.100.128/25 overlaps the fabric network 198.51.100.0/24",
    ),
    (
        "nic-address-is-the-network-address",
        [("n1.hardware.nics[0].address", "198.51.100.0")],
        "n1", "hardware.nics[0].address",
        "198.51.100.0 is the network address of the fabric network 198.51.100.0/24, not a "
        "host's",
    ),
    (
        "ssh-hostname-is-the-broadcast-address",
        [("n2.ssh_hostname", "192.0.2.255")],
        "n2", "ssh_hostname",
        "192.0.2.255 is the broadcast address of the management network 192.0.2.0/24",
    ),
    (
        "ib-port-listed-twice",
        [("n1.hardware.ib_ports", [{"device": "mlx5_0"}, {"device": "mlx5_0", "port": 1}])],
        "n1", "hardware.ib_ports[1]",
        "mlx5_0 port 1 is listed twice",
    ),
    (
        "ib-port-pci-listed-twice",
        [("n1.hardware.ib_ports", [{"pci": "41:00.0"},
                                   {"device": "mlx5_1", "pci": "0000:41:00.0"}])],
        "n1", "hardware.ib_ports[1]",
        "0000:41:00.0 port 1 is listed twice",
    ),
    (
        "ib-port-without-device-pci-or-guid",
        [("n1.hardware.ib_ports", [{"port": 1, "rate_gbps": 400}])],
        "n1", "hardware.ib_ports[0]",
        "an InfiniBand port needs a device, pci or guid to be found on the node",
    ),
    (
        "ib-port-pci-not-an-address",
        [("n1.hardware.ib_ports", [{"pci": "41:00"}])],
        "n1", "hardware.ib_ports[0].pci",
        "'41:00' is not a PCI address such as 0000:41:00.0",
    ),
    (
        "ib-port-guid-not-a-guid",
        [("n1.hardware.ib_ports", [{"guid": "0xb8cef603"}])],
        "n1", "hardware.ib_ports[0].guid",
        "'0xb8cef603' is not a GUID such as 0xb8cef60300a12b3c",
    ),
    (
        "ib-port-device-not-an-hca-name",
        [("n1.hardware.ib_ports", [{"device": "mlx5-0"}])],
        "n1", "hardware.ib_ports[0].device",
        "'mlx5-0' is not an HCA name such as mlx5_0 or ibp65s0f0",
    ),
    # -- a rule several hosts share: the odd host is reported, naming one that agrees --
    (
        "cluster-setting-odd-on-the-first-host",
        [("+n3", 3), ("n1.package_proxy", "http://192.0.2.254:3142")],
        "n1", "package_proxy",
        "not the same as on host 'n2'",
    ),
    (
        "ray-setting-odd-on-the-first-host",
        [("+n3", 3), ("groups.ray_head", ["n1"]), ("groups.ray_workers", ["n2", "n3"]),
         ("all.ray_version", "2.60.0"), ("n1.ray_port", 6380)],
        "n1", "ray_port",
        "6380 differs from 6379 on host 'n2'",
    ),
    # -- secrets: a name the inventory does not declare is not made up ------------------
    (
        "secret-name-not-declared",
        [("all.secrets", {"munge_key": {"file": "/etc/aicluster/munge.key"}}),
         ("all.slurm_munge_key_name", "munge")],
        "n1", "slurm_munge_key_name",
        "names the secret 'munge', which `secrets` does not declare (declared: munge_key)",
    ),
    # -- storage layouts the servers refuse at start --------------------------------
    (
        "minio-parity-above-half-the-set",
        [("groups.minio", ["n1"]),
         ("n1.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 5)]),
         ("all.minio_config", {"MINIO_STORAGE_CLASS_STANDARD": "EC:3"})],
        "n1", "minio_config.MINIO_STORAGE_CLASS_STANDARD",
        "EC:3 is more parity than server pool 1 (n1) allows: its erasure sets have 4 drives, "
        "so at most EC:2; MinIO refuses to start",
    ),
    (
        "minio-storage-class-form",
        [("groups.minio", ["n1"]),
         ("n1.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 5)]),
         ("all.minio_config", {"MINIO_STORAGE_CLASS_RRS": "2"})],
        "n1", "minio_config.MINIO_STORAGE_CLASS_RRS",
        "'2' is not a storage class MinIO reads; write EC:<parity drives>",
    ),
    (
        "minio-standard-parity-below-rrs",
        [("groups.minio", ["n1"]),
         ("n1.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 5)]),
         ("all.minio_config", {"MINIO_STORAGE_CLASS_STANDARD": "EC:1",
                               "MINIO_STORAGE_CLASS_RRS": "EC:2"})],
        "n1", "minio_config.MINIO_STORAGE_CLASS_STANDARD",
        "EC:1 is less parity than MINIO_STORAGE_CLASS_RRS EC:2",
    ),
    (
        "minio-servers-with-unequal-drives",
        [("groups.minio", ["n1", "n2"]),
         ("n1.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 5)]),
         ("n2.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 3)])],
        "n2", "minio_drives",
        "has 2 drive(s), host 'n1' of the same server pool 1 has 4",
    ),
    (
        "minio-odd-drive-count-on-the-first-host",
        [("+n3", 3), ("groups.minio", ["n1", "n2", "n3"]),
         ("n1.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 2)]),
         ("n2.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 3)]),
         ("n3.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 3)])],
        "n1", "minio_drives",
        "has 1 drive(s), host 'n2' of the same server pool 1 has 2",
    ),
    (
        "minio-drive-count-no-erasure-set-divides",
        [("groups.minio", ["n1"]),
         ("n1.minio_drives", [{"path": f"/srv/minio{i}"} for i in range(1, 18)])],
        "n1", "minio_drives",
        "17 drives: no erasure set size of 2 to 16 divides it; MinIO refuses that layout",
    ),
    (
        "ceph-unknown-release",
        [("groups.ceph_mons", ["n1"]), ("groups.ceph_osds", ["n1"]),
         ("n1.ceph_osd_devices", [{"device": "/dev/nvme0n1"}]),
         ("all.ceph_repo_url", CEPH_MIRROR), ("all.ceph_release", "nautilus")],
        "n1", "ceph_release",
        "Input should be 'pacific', 'quincy', 'reef', 'squid', 'tentacle' or 'umbrella' "
        "(got 'nautilus')",
    ),
    (
        "ceph-repo-without-url",
        [("groups.ceph_mons", ["n1"]), ("groups.ceph_osds", ["n1"]),
         ("n1.ceph_osd_devices", [{"device": "/dev/nvme0n1"}])],
        "n1", "ceph_repo_url",
        "not set; with ceph_source 'ceph_repo' give the URL of Ceph's repository or of your "
        "site's mirror of it",
    ),
    (
        "ceph-min-size-above-the-default-size",
        [("groups.ceph_mons", ["n1"]), ("groups.ceph_osds", ["n1"]),
         ("n1.ceph_osd_devices", [{"device": "/dev/nvme0n1"}]),
         ("all.ceph_repo_url", CEPH_MIRROR),
         ("all.ceph_pools", [{"name": "models", "min_size": 2}])],
        "n1", "ceph_pools[0].min_size",
        "2 is more than the pool's size 1",
    ),
    (
        "ceph-pool-size-above-the-osd-hosts",
        [("groups.ceph_mons", ["n1"]), ("groups.ceph_osds", ["n1", "n2"]),
         ("n1.ceph_osd_devices", [{"device": "/dev/nvme0n1"}, {"device": "/dev/nvme1n1"}]),
         ("n2.ceph_osd_devices", [{"device": "/dev/nvme0n1"}]),
         ("all.ceph_repo_url", CEPH_MIRROR),
         ("all.ceph_pool_default_size", 2), ("all.ceph_pools", [{"name": "models", "size": 3}])],
        "n1", "ceph_pools[0].size",
        "3 replicas on different hosts (failure domain host) need 3 OSD hosts; ceph_osds has 2",
    ),
    (
        "ceph-placement-groups-above-the-limit",
        [("groups.ceph_mons", ["n1"]), ("groups.ceph_osds", ["n1"]),
         ("n1.ceph_osd_devices", [{"device": "/dev/nvme0n1"}]),
         ("all.ceph_repo_url", CEPH_MIRROR),
         ("all.ceph_pools", [{"name": "models", "pg_num": 512}])],
        "n1", "ceph_pools",
        "pool models (pg_num 512, size 1) brings the cluster to 512 placement group "
        "replicas, more than mon_max_pg_per_osd 250 x 1 OSDs = 250; Ceph refuses",
    ),
    # -- k3s's pod and service networks: networks of their own ---------------------
    (
        "k3s-pod-network-overlaps-the-fabric",
        [("groups.k3s_servers", ["n1"]),
         ("all.k3s_config", {"cluster-cidr": "198.51.100.0/23"})],
        "n1", "k3s_config.cluster-cidr",
        "198.51.100.0/23 overlaps the fabric network 198.51.100.0/24; pods, services and "
        "nodes need networks of their own",
    ),
    (
        "k3s-service-network-not-a-network",
        [("groups.k3s_servers", ["n1"]),
         ("all.k3s_config", {"service-cidr": "10.43.0.1/16"})],
        "n1", "k3s_config.service-cidr",
        "'10.43.0.1/16' is not a network in CIDR form",
    ),
    # -- remove_packages names components whose removal uninstalls something --------
    (
        "remove-packages-typo",
        [("all.remove_packages", ["slrum"])],
        "n1", "remove_packages",
        "'slrum' is not a component; did you mean slurm?",
    ),
    (
        "remove-packages-nvidia",
        [("all.remove_packages", ["nvidia"])],
        "n1", "remove_packages",
        "'nvidia': the NVIDIA driver's packages are held and its kernel modules in use",
    ),
    (
        "remove-packages-base",
        [("all.remove_packages", ["base"])],
        "n1", "remove_packages",
        "'base': its removal uninstalls nothing",
    ),
]
# fmt: on


def _apply(spec, changes):
    for path, value in changes:
        if path.startswith("+"):
            spec.hosts[path[1:]] = spec.node(value)
        elif path.startswith("twice."):
            spec.groups[path.removeprefix("twice.")] = [(value, spec.hosts[value])]
        else:
            spec.set(path, value)


@pytest.mark.parametrize(
    "changes, host, field, wording",
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_bad_input_is_refused_naming_host_and_field(spec, changes, host, field, wording):
    _apply(spec, changes)
    with pytest.raises(InventoryError) as caught:
        load_cluster(spec.write())
    errors = caught.value.errors
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"host {host!r}: {field}"), errors[0]
    assert wording in errors[0], errors[0]
    # The report names the file and counts the problems.
    assert str(caught.value).startswith(f"{spec.directory / 'cluster.py'}: invalid inventory")


def test_case_ids_are_unique():
    ids = [case[0] for case in CASES]
    assert len(ids) == len(set(ids))


def test_each_case_has_its_own_message():
    """No two cases share the same (host, field, wording) expectation, except where
    the point is that two spellings of one value are one value."""
    same_on_purpose = {"duplicate-mac-any-case"}
    keys = [(case[2], case[3], case[4]) for case in CASES if case[0] not in same_on_purpose]
    duplicates = {k for k in keys if keys.count(k) > 1}
    assert not duplicates, duplicates


def test_a_private_key_is_never_echoed(spec):
    spec.set("all.base_admin_users", [{"name": "ops", "ssh_keys": [PRIVATE_KEY]}])
    with pytest.raises(InventoryError) as caught:
        load_cluster(spec.write())
    assert "PRIVATE KEY" not in str(caught.value)
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in str(caught.value)


def test_an_inline_secret_value_is_never_echoed(spec):
    spec.set("all.secrets", {"munge_key": "s3cr3t-v4lue"})
    spec.set("all.minio_root_password", "an0ther-s3cret")
    with pytest.raises(InventoryError) as caught:
        load_cluster(spec.write())
    assert "s3cr3t-v4lue" not in str(caught.value)
    assert "an0ther-s3cret" not in str(caught.value)


def test_every_problem_is_reported_at_once(spec):
    spec.set("n1.ssh_port", 0)
    spec.set("n2.hardware.nics[0].mtu", 9500)
    spec.set("groups.slurm_worker", ["n1"])
    with pytest.raises(InventoryError) as caught:
        load_cluster(spec.write())
    errors = caught.value.errors
    assert len(errors) == 3, errors
    assert "invalid inventory (3 problem(s))" in str(caught.value)
    assert any(e.startswith("host 'n1': ssh_port:") for e in errors)
    assert any(e.startswith("host 'n2': hardware.nics[0].mtu:") for e in errors)
    assert any(e.startswith("host 'n1': groups: unknown group 'slurm_worker'") for e in errors)


def test_a_cluster_wide_problem_is_reported_once_naming_the_other_hosts(spec):
    spec.hosts["n3"] = spec.node(3)
    spec.set("all.slurm_version", "latest")
    with pytest.raises(InventoryError) as caught:
        load_cluster(spec.write())
    assert caught.value.errors == [
        "host 'n1': slurm_version: 'latest' is not a version (like '23.11.4' or '535') "
        "(and on 2 more host(s): 'n2', 'n3')"
    ]


def test_a_python_error_in_the_inventory_is_an_inventory_error(spec):
    path = spec.write()
    path.write_text(path.read_text().replace("all = ", "all = undefined_name + "))
    line = path.read_text().splitlines().index(
        next(x for x in path.read_text().splitlines() if x.startswith("all = "))) + 1
    with pytest.raises(InventoryError) as caught:
        load_cluster(path)
    assert caught.value.errors == [
        f"{path}:{line}: NameError: name 'undefined_name' is not defined"
    ]


def test_a_missing_inventory_file_is_an_inventory_error(tmp_path):
    with pytest.raises(InventoryError, match="no such inventory file"):
        load_cluster(tmp_path / "nope.py")


def test_an_empty_inventory_is_refused(spec):
    spec.hosts.clear()
    with pytest.raises(InventoryError, match="the inventory has no hosts"):
        load_cluster(spec.write())


def test_an_edited_inventory_is_read_again(spec):
    """pyinfra caches compiled inventory files by name; an edit must still be seen."""
    path = spec.write()
    assert len(load_cluster(path).hosts) == 2
    spec.set("n2.ssh_hostname", "192.0.2.1")
    spec.write()
    with pytest.raises(InventoryError, match="address 192.0.2.1 is also used"):
        load_cluster(path)


# ---------------------------------------------------------------------------
# What is fine stays fine (the bounds of the rules above)
# ---------------------------------------------------------------------------

# fmt: off
GOOD: list[tuple[str, list[tuple[str, Any]]]] = [
    ("ipoib-connected-mtu-65520",
     [("n1.hardware.ib_ports", [{"device": "mlx5_0", "mode": "connected", "mtu": 65520}])]),
    ("ipoib-datagram-mtu-4092", [("n1.hardware.ib_ports", [{"device": "mlx5_0", "mtu": 4092}])]),
    ("ib-port-by-pci", [("n1.hardware.ib_ports", [{"pci": "0000:41:00.0"}, {"pci": "42:00.0"}])]),
    ("ib-port-by-guid", [("n1.hardware.ib_ports", [{"guid": "0xb8cef60300a12b3c"},
                                                   {"guid": "b8ce:f603:00a1:2b3d"}])]),
    ("ib-port-persistent-names", [("n1.hardware.ib_ports", [{"device": "ibp65s0f0"},
                                                            {"device": "ibP1p2s0f1"},
                                                            {"device": "rocex525400c0fe1234ab"}])]),
    ("ethernet-mtu-9216", [("n1.hardware.nics[0].mtu", 9216)]),
    ("ethernet-mtu-1280", [("n1.hardware.nics[0].mtu", 1280)]),
    ("ib-network-mtu-65520", [("all.networks.ib.mtu", 65520)]),
    ("device-by-id", [("n1.hardware.nvme", [{"device": "/dev/disk/by-id/nvme-X_Y-1.0:2"}])]),
    ("same-device-on-two-hosts", [("n1.hardware.nvme", [{"device": "/dev/nvme0n1"}]),
                                  ("n2.hardware.nvme", [{"device": "/dev/nvme0n1"}])]),
    ("gpus-16", [("n1.hardware.gpus", _gpu(16))]),
    ("secret-refs", [("all.secrets", {"munge_key": {"file": "/etc/aicluster/munge.key"},
                                      "k3s_token": {"env": "AICLUSTER_K3S_TOKEN"}})]),
    ("secret-path-keys", [("all.munge_key_file", "/etc/aicluster/munge.key"),
                          ("n1.ssh_key", "~/.ssh/id_ed25519"),
                          ("all.ansible_ssh_private_key_file", "~/.ssh/id_ed25519")]),
    ("version-forms", [("all.slurm_version", "23.11.4"),
                       ("all.nvidia_driver_version", "570.133"),
                       ("all.k3s_version", "1.30.2+k3s1"), ("all.ray_version", "2.9.0-1")]),
    ("ipv6-management", [("all.networks.management.subnet", "2001:db8::/64"),
                         ("n1.ssh_hostname", "2001:db8::1"), ("n2.ssh_hostname", "2001:db8::2")]),
    ("nic-by-mac-only", [("n1.hardware.nics[0].name", None)]),
    ("slurm-backup-controller", [("groups.slurm_controller", ["n1", "n2"]),
                                 ("groups.slurm_workers", ["n2"])]),
    ("admin-user-public-key", [("all.base_admin_users", [{"name": "ops", "ssh_keys": [PUBLIC_KEY],
                                                          "sudo": True, "shell": "/bin/zsh"}])]),
    ("sysctl-null-drops-default", [("all.base_sysctl", {"net.core.somaxconn": None})]),
    ("chrony-server-in-inventory", [("all.base_chrony_server_host", "n1")]),
    ("package-cache-in-inventory", [("all.package_cache", "n1")]),
    ("remove-packages", [("all.remove_packages", ["slurm", "ray", "ceph", "nfs"])]),
    ("package-proxy-url", [("all.package_proxy", "http://192.0.2.254:3142")]),
    ("network-bond-and-vlan", [("n1.hardware.nics[0].address", None),
                               ("n1.network_bonds", [{"name": "bond0", "members": ["eth1"],
                                                      "network": "fabric",
                                                      "address": "198.51.100.1"}]),
                               ("n1.network_vlans", [{"id": 20, "link": "bond0"}])]),
    ("ib-node-without-ports", [("groups.ib_nodes", ["n1", "n2"]),
                               ("n1.infiniband_opensm_priority", 15)]),
    ("ib-switch-subnet-manager", [("groups.ib_nodes", ["n1"]),
                                  ("n1.hardware.ib_ports", [{"device": "mlx5_0"}]),
                                  ("all.infiniband_subnet_manager", "switch")]),
    ("base-firewall", [("all.base_firewall_ssh_sources", ["10.0.0.0/8", "2001:db8::/32",
                                                          "192.0.2.7"]),
                       ("all.base_firewall_public_ports", [{"port": 443},
                                                           {"port": 53, "proto": "udp"}]),
                       ("all.base_memlock_limit", 65536)]),
    ("network-bond-options", [("n1.hardware.nics[0].address", None),
                              ("n1.network_bonds", [{"name": "bond0", "members": ["eth1"],
                                                     "mode": "active-backup", "miimon": 200,
                                                     "lacp_rate": "slow"}]),
                              ("n1.network_bond_defaults", {"mode": "balance-xor"}),
                              ("n1.network_vlans", [{"id": 20, "link": "bond0", "name": None,
                                                     "mtu": None}])]),
    ("opensm-config", [("all.infiniband_opensm_config", {"log_max_size": None,
                                                         "sweep_interval": 5})]),
    ("nvidia-auto-or-bool", [("all.nvidia_peermem", False),
                             ("all.nvidia_open_kernel_modules", True),
                             ("all.nvidia_fabric_manager", "auto"),
                             ("all.nvidia_cuda_version", "12.8")]),
    ("secret-default-name-undeclared", [("all.slurm_munge_key_name", "munge_key")]),
    ("secret-other-name-declared", [("all.secrets", {"munge": {"env": "MUNGE_KEY"}}),
                                    ("all.slurm_munge_key_name", "munge")]),
    ("networks-adjacent", [("all.networks.ib.subnet", "198.51.101.0/24")]),
    ("point-to-point-31", [("all.networks.ib.subnet", "203.0.113.0/31"),
                           ("n1.hardware.ib_ports", [{"device": "mlx5_0", "network": "ib",
                                                      "address": "203.0.113.0"}])]),
    ("minio-parity-half-the-set", [("groups.minio", ["n1"]),
                                   ("n1.minio_drives", [{"path": f"/srv/minio{i}"}
                                                        for i in range(1, 5)]),
                                   ("all.minio_config", {"MINIO_STORAGE_CLASS_STANDARD": "EC:2",
                                                         "MINIO_STORAGE_CLASS_RRS": "EC:1"})]),
    ("component-settings-pass-through",
     [("all.slurm_config", {"SchedulerType": "sched/backfill"})]),
]
# fmt: on


@pytest.mark.parametrize("changes", [pytest.param(c, id=i) for i, c in GOOD])
def test_valid_input_is_accepted(spec, changes):
    _apply(spec, changes)
    cluster = load_cluster(spec.write())
    assert set(cluster.hosts) == {"n1", "n2"}


def test_the_error_examples_in_the_docs_are_real(spec, tmp_path_factory):
    """docs/inventory.md quotes messages: each must be one these cases produce, and
    its full example report must be the broken fixture's."""
    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "inventory.md").read_text()
    produced = set()
    for case in CASES:
        case_spec = type(spec)(directory=tmp_path_factory.mktemp("case") / "inventory")
        _apply(case_spec, case[1])
        with pytest.raises(InventoryError) as caught:
            load_cluster(case_spec.write())
        produced |= {
            re.sub(r" \(and on \d+ more host\(s\): .*\)$", "", e) for e in caught.value.errors
        }
    examples = doc.split("More examples")[1].split("```")[1].strip().splitlines()
    assert len(examples) >= 20
    assert [e for e in examples if e not in produced] == []
    report = repo / "tests" / "fixtures" / "inventories" / "broken" / "expected-errors.txt"
    assert report.read_text() in doc
