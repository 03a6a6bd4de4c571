#!/usr/bin/env aicluster-inventory
"""The local testbed's nodes, read from the state ``aicluster testbed up`` wrote.

    aicluster testbed up --nodes 2
    pyinfra inventories/testbed.py deploy.py
    ansible-playbook -i inventories/testbed.py playbooks/site.yml

Every node gets every component the testbed can run, so one testbed rehearses the
whole stack. Nodes reach packages only through the host's proxies on the management
bridge; time is served by node1 from its own clock, so nothing leaves the bridges.
"""

import json as _json
import os as _os
from pathlib import Path

from aicluster.inventory import finish
from aicluster.testbed.state import fabric_address, load_state, node_number, state_dir

_state = load_state()
if not _state or not _state.get("nodes"):
    raise SystemExit("aicluster: no testbed is running: run `aicluster testbed up` first")


with open(_state["ssh_key"] + ".pub") as _f:
    _public_key = _f.read().strip()


def _node(node: dict) -> tuple[str, dict]:
    return (
        node["name"],
        {
            "ssh_hostname": node["address"],
            "ssh_key": _state["ssh_key"],
            # Testbed nodes make new host keys each time they are built.
            "ssh_known_hosts_file": "/dev/null",
            "ssh_strict_host_key_checking": "no",
            "ansible_ssh_common_args": (
                "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no"
            ),
            # ansible.cfg keeps Ansible's host key check on; off for these nodes only.
            "ansible_host_key_checking": False,
            # Slurm's stand-in GPU (the testbed has none): gres.conf names a device node
            # the e2e tests create (a copy of /dev/null); production deploys create none.
            "slurm_gpu_device_pattern": "/dev/aicluster-standin-gpu{index}",
            "hardware": {
                "cpus": 1,
                "memory_gb": 2,
                # A stand-in, not an NVIDIA GPU: the nvidia component installs nothing
                # here and says so; Slurm offers it as GRES.
                "gpus": {"model": "standin", "count": 1, "vendor": "standin"},
                "nics": [
                    {
                        "name": node["fabric_nic"],
                        "network": "fabric",
                        "speed_gbps": 10,
                        "address": fabric_address(node_number(node["name"])),
                        "mtu": 9000,
                    }
                ],
            },
        },
    )


all = (
    [_node(n) for n in _state["nodes"]],
    {
        "cluster_name": "testbed",
        "networks": {
            "management": {"subnet": _state["management"]["subnet"]},
            "fabric": {"subnet": _state["fabric"]["subnet"], "mtu": 9000},
        },
        "package_proxy": _state["package_proxy"],
        "base_chrony_server_host": _state["nodes"][0]["name"],
        "base_chrony_upstream": [],
        # Generated once per testbed on this machine (mode 0600), never shown.
        "secrets": {"munge_key": {"file": str(state_dir() / "secrets" / "munge.key")}},
        # An admin user who logs in with the testbed's own key, to prove admin users work.
        "base_admin_users": [
            {"name": "aiops", "ssh_keys": [_public_key], "sudo": True},
        ],
        "ray_network": "management",
    },
)

# Disks (`aicluster testbed up --disks K`, `aicluster testbed disk add NODE NAME`): loop
# devices under stable /dev/disk/by-id names. A node with disks declares them as its
# NVMe drives and makes its NVMe cache of them (nvme_cache); nodes without get none.
for _name, _data in all[0]:
    _disks = [d["by_id"] for d in _state.get("disks") or []
              if d["node"] == _name and not d["name"].startswith(("ceph", "minio"))]
    if _disks:
        _data["hardware"]["nvme"] = [{"device": d} for d in _disks]
        _data["nvme_cache_devices"] = _disks

# InfiniBand: the nodes have no HCA. They are ib_nodes all the same, so the infiniband
# component runs: it installs the RDMA packages and says why it starts no opensm
# (node1 is named the subnet manager, as a real cluster would name one).
ib_nodes = [n["name"] for n in _state["nodes"]]
all[0][0][1]["infiniband_opensm_priority"] = 15

# NVIDIA: the nodes are gpu_nodes (their stand-in GPU), so the nvidia component runs
# and reports that it skipped them (no NVIDIA GPU on the PCI bus), changing nothing.
gpu_nodes = [n["name"] for n in _state["nodes"]]

# Slurm: node1 runs slurmctld and slurmd, node2 slurmd.
slurm_controller = [_state["nodes"][0]["name"]]
slurm_workers = [n["name"] for n in _state["nodes"]]

# Ray: node1 runs the head, the other nodes join it. On the management network, so the
# Ray role's molecule scenario (base and Ray alone, no network component to address
# the fabric NICs) deploys the same cluster.
ray_head = [_state["nodes"][0]["name"]]
ray_workers = [n["name"] for n in _state["nodes"][1:]]

# NFS, when node1 has a disk (its NVMe cache): node1 serves a directory on that XFS
# with nfs-ganesha (the nodes' kernel has no nfsd; ganesha's VFS backend needs a real
# filesystem, not the overlay root), the other nodes are clients. Their kernel has no
# NFS client either: the deploy installs the tools and says why it mounts nothing; the
# e2e tests write and read through ganesha with libnfs (user space). On the management
# network, so the nfs role's molecule scenario (no network component to address the
# fabric NICs) serves the same cluster.
if all[0][0][1].get("nvme_cache_devices"):
    all[0][0][1]["nfs_server_impl"] = "ganesha"
    all[0][0][1]["nfs_network"] = "management"
    all[0][0][1]["nfs_exports"] = [{"path": "/mnt/nvme-cache/shared", "mode": "1777"}]
    nfs_server = [_state["nodes"][0]["name"]]
    nfs_clients = [n["name"] for n in _state["nodes"][1:]]

# Ceph, when nodes have disks named ceph* (`aicluster testbed disk add NODE ceph --size
# 10G`: large and sparse; a small OSD fills up and hangs): node1 runs the monitor, the
# manager and the MDS, every node with such a disk an OSD on it (ceph-volume raw mode:
# no device-mapper here), and every node a client mounting CephFS with ceph-fuse (so a
# file node1 writes is read on node2).
_ceph_disks = {n["name"]: [d["by_id"] for d in _state.get("disks") or []
                           if d["node"] == n["name"] and d["name"].startswith("ceph")]
               for n in _state["nodes"]}
if any(_ceph_disks.values()):
    ceph_mons = [_state["nodes"][0]["name"]]
    ceph_mds = [_state["nodes"][0]["name"]]
    ceph_osds = [n for n, d in _ceph_disks.items() if d]
    ceph_clients = [n["name"] for n in _state["nodes"]]
    for _name, _data in all[0]:
        if _ceph_disks[_name]:
            _data["ceph_osd_devices"] = [{"device": d} for d in _ceph_disks[_name]]
    all[1]["ceph_osd_mode"] = "raw"
    # The nodes are Debian 12 and reach only Debian's archive (through the host's
    # proxy), not Ceph's repository: Ceph 16 Pacific, Debian 12's own (16.2.x).
    all[1]["ceph_source"] = "distribution"
    all[1]["ceph_release"] = "pacific"
    # On the management network, so the role's molecule scenario and the Ceph e2e test
    # (no network component to address the fabric NICs) deploy the same cluster.
    all[1]["ceph_network"] = "management"
    # Small pools, and OSDs that keep to about 1 GiB each (nodes see the host's memory).
    all[1]["ceph_pools"] = [{"name": "testbed", "pg_num": 8, "application": "rados"}]
    all[1]["ceph_client_pools"] = ["testbed"]
    all[1]["ceph_cephfs_data_pg_num"] = 8
    all[1]["ceph_cephfs_metadata_pg_num"] = 8
    all[1]["ceph_config"] = {"osd": {"osd_memory_target": 1073741824},
                             "mon": {"mon_data_avail_warn": 5}}
    all[1]["secrets"]["ceph"] = {"file": str(state_dir() / "secrets" / "ceph.secret")}

# Monitoring: node1 runs Prometheus, Alertmanager and the blackbox exporter; every node
# the node exporter and its textfile collectors, so the whole stack above is scraped at
# once. Prometheus keeps its samples on node1's root filesystem: a week, at most 2 GB.
# Grafana is a release artifact (like k3s below): deployed only when the artifact
# directory the overrides name holds it. No receiver is set here (alerts stay visible
# in Alertmanager); the e2e tests add a webhook through the overrides.
monitoring = [_state["nodes"][0]["name"]]
all[0][0][1]["monitoring_storage_gb"] = 10
all[1]["monitoring_retention_days"] = 7
all[1]["monitoring_retention_size_gb"] = 2

# Rehearsals (a version bump, a config change) without editing this file: the JSON
# object in <testbed state dir>/overrides.json, then the one in the file
# $AICLUSTER_TESTBED_OVERRIDES names (how a molecule scenario passes its own), are laid
# over the cluster data above.
_overrides: dict = {}
for _file in (state_dir() / "overrides.json", _os.environ.get("AICLUSTER_TESTBED_OVERRIDES")):
    if _file and Path(_file).exists():
        _overrides.update(_json.loads(Path(_file).read_text()))


def _releases(component: str) -> bool:
    """Whether the testbed runs a component installed from release artifacts (k3s,
    ollama, minio): only when the artifact directory the overrides name holds that
    component's files (``aicluster artifacts fetch``'s layout, or the e2e tests'
    STAND-INs). The vendor's files cannot be downloaded on every machine, so without
    them the testbed leaves the component out instead of failing the whole deploy."""
    directory = _overrides.get("artifacts_dir")
    return bool(directory) and (Path(directory) / component).is_dir()


# (release components: one block each, below)

# k3s, when the artifact directory holds its release (the e2e tests' STAND-IN, or the
# real files): node1 the server (SQLite), the other nodes agents. On the management
# network, so the role's molecule scenario (no network component) deploys the same.
# The cluster token is generated once per testbed on this machine (mode 0600).
if _releases("k3s"):
    k3s_servers = [_state["nodes"][0]["name"]]
    k3s_agents = [n["name"] for n in _state["nodes"][1:]]
    all[1]["k3s_network"] = "management"
    all[1]["secrets"]["k3s_token"] = {"file": str(state_dir() / "secrets" / "k3s-token")}

# Ollama, when the artifact directory holds its release (the e2e tests' STAND-IN, or
# the real files): every node serves Ollama on 11434, and node1 also runs the nginx
# gateway in front of them all, on 11435 (its own Ollama has 11434). On the management
# network, so the role's molecule scenario (no network component) deploys the same.
if _releases("ollama"):
    ollama = [n["name"] for n in _state["nodes"]]
    ollama_gateway = [_state["nodes"][0]["name"]]
    all[1]["ollama_network"] = "management"
    all[1]["ollama_gateway_port"] = 11435

# MinIO, when the artifact directory holds its release (the e2e tests' STAND-IN, or the
# real files): every node with a disk named minio* (`aicluster testbed disk add NODE
# minio --size 1G`) is a server with that drive (empty: made XFS, mounted at
# /mnt/minio1); without such disks, node1 alone with a directory. Two buckets, one
# versioned and one anonymous users may read. On the management network, so the
# role's molecule scenario (no network component) deploys the same. The root password
# is derived from a secret generated once per testbed on this machine (mode 0600).
if _releases("minio"):
    _minio_disks = {n["name"]: [d["by_id"] for d in _state.get("disks") or []
                                if d["node"] == n["name"] and d["name"].startswith("minio")]
                    for n in _state["nodes"]}
    minio = [n for n, d in _minio_disks.items() if d] or [_state["nodes"][0]["name"]]
    for _name, _data in all[0]:
        if _minio_disks[_name]:
            _data["minio_drives"] = [{"device": d} for d in _minio_disks[_name]]
    all[1]["minio_network"] = "management"
    all[1]["minio_buckets"] = [{"name": "testbed", "versioning": True},
                               {"name": "testbed-public", "policy": "download"}]
    all[1]["secrets"]["minio_root_password"] = {
        "file": str(state_dir() / "secrets" / "minio.secret")}

# Grafana, on the monitoring host, when the artifact directory holds its release (the
# real file: there is no stand-in, `tests/e2e/test_lab_monitoring.py` checks the
# dashboards' queries against Prometheus instead).
all[1]["monitoring_grafana"] = _releases("monitoring")

# Group changes rehearsed the same way: the overrides' "groups" key maps a group name to
# its new list of nodes, e.g. {"groups": {"slurm_workers": ["node1"]}} takes node2 out of
# Slurm (docs/rerunning.md, "Removing a component from a host"); an empty list removes
# the group. Not host data: taken out before the rest is laid over the cluster data.
for _group, _members in (_overrides.pop("groups", None) or {}).items():
    if _members:
        globals()[_group] = list(_members)
    else:
        globals().pop(_group, None)

# Host data changed the same way: the overrides' "hosts" key maps a node to the data
# laid over its own; a key given null is taken away, e.g.
# {"hosts": {"node2": {"ceph_osd_devices": null}}} with node2 out of ceph_osds.
for _name, _data in all[0]:
    for _key, _value in ((_overrides.get("hosts") or {}).get(_name) or {}).items():
        if _value is None:
            _data.pop(_key, None)
        else:
            _data[_key] = _value
_overrides.pop("hosts", None)

if _overrides:
    all[1].update(_overrides)
    # group_data/all.py (pinned versions) wins over the data above; host data wins
    # over both, so the overrides go on every host too (a ray_version bump).
    for _name, _data in all[0]:
        _data.update(_overrides)

# Every node reached with the OpenSSH client over a master connection kept open between
# runs (`@openssh/`, docs/inventory.md); its name stays `node1`.
all = ([(f"@openssh/{_name}", _data) for _name, _data in all[0]], all[1])

finish(globals())
