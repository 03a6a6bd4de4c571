"""Drift the deploy repairs, end to end: runtime state changed by hand on a deployed
testbed (the live firewall table, applied sysctls) is put back by the next deploy,
restarting nothing, and the deploy after reports 0 changes (Ansible: test_ansible_site.py).
A CephFS client the MDS evicted (as after a network cut past session_autoclose) keeps a
mount that answers nothing: `aicluster check` fails it, and pyinfra, then Ansible
(``--tags ceph``), unmount and mount it again.

On the lab in miniature (every component together, shared with the other
``test_lab*.py`` modules); each test leaves the nodes converged (repaired) at its end."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.checks import ray_start_times, slurm_start_times
from tests.e2e.test_lab_check import check, failed

TABLE = "nft list table inet aicluster"


@pytest.fixture
def lab(lab):
    """The lab in miniature (tests/e2e/conftest.py), deployed."""
    return lab.deployed()


def _names(lab) -> list[str]:
    return [n["name"] for n in lab.nodes]


def _started(lab) -> tuple[dict, dict]:
    return ray_start_times(lab), slurm_start_times(lab)


def test_a_flushed_or_altered_firewall_and_a_changed_sysctl_are_repaired(lab):
    node1, node2 = _names(lab)
    written = {n: lab.ssh(n, TABLE) for n in (node1, node2)}
    assert all("policy drop" in t for t in written.values()), written
    started = _started(lab)
    lab.ssh(node1, "nft flush ruleset")
    lab.ssh(node2, "nft add rule inet aicluster input tcp dport 9999 accept")
    lab.ssh(node1, "sysctl -w net.ipv4.tcp_mtu_probing=0")
    assert lab.ssh(node1, TABLE, check=False) == ""
    assert "tcp dport 9999 accept" in lab.ssh(node2, TABLE)
    repaired = lab.read_deploy().succeeded().results
    # node1: its table and its sysctls; node2: its table.
    assert repaired["errors"] == 0 and repaired["changed"] >= 3, repaired
    # Back to what the rules file makes, on both nodes, and the sysctl applied again.
    for node in (node1, node2):
        assert lab.ssh(node, TABLE) == written[node], node
    assert lab.ssh(node1, "sysctl -n net.ipv4.tcp_mtu_probing").strip() == "1"
    # Nothing else was restarted.
    assert _started(lab) == started
    again = lab.read_deploy().succeeded().results
    assert again["changed"] == 0 and again["errors"] == 0, again


CEPHFS = "/mnt/cephfs"
#: ``ceph tell`` to rank 0 of the lab's file system, on its first monitor (node1).
MDS = "timeout 60 ceph tell mds.cephfs:0"


def _evict_cephfs_client(lab, node: str) -> None:
    """The MDS evicts *node*'s CephFS client, as it does by itself to a client it has
    not heard from for session_autoclose (300 s: a long network cut): the client is
    blocklisted and its mount stays, answering nothing."""
    out = lab.ssh("node1", f"{MDS} client ls -f json 2>/dev/null")
    ids = [c["id"] for c in json.loads(out)
           if c.get("client_metadata", {}).get("hostname") == node]
    assert ids, out
    for client in ids:
        lab.ssh("node1", f"{MDS} client evict id={client} 2>/dev/null")
    stat = f"timeout 20 stat -c %i {CEPHFS}"
    assert lab.ssh(node, f"{stat} >/dev/null 2>&1 || echo dead").strip() == "dead"
    assert lab.ssh(node, f"findmnt -n -o FSTYPE --mountpoint {CEPHFS}").strip() == (
        "fuse.ceph-fuse")


def test_an_evicted_cephfs_client_is_mounted_again_by_either_engine(lab):
    node1, node2 = _names(lab)
    for engine in ("pyinfra", "ansible"):
        _evict_cephfs_client(lab, node2)
        print(f"{node2}'s CephFS client evicted: {CEPHFS} is mounted and answers nothing")
        if engine == "pyinfra":
            # aicluster check sees it (its stat of the mount point fails).
            _, document, _ = check("--quick", "--layer", "storage", expect=1)
            assert failed(document) == {("storage.cephfs_mount", node2)}, failed(document)
            deploy = lab.read_deploy().succeeded()
            assert f"Unmount the dead CephFS at {CEPHFS}" in deploy.output
        else:
            out = lab.playbook("--tags", "ceph", "--limit", node2).stdout
            assert "Unmount a dead CephFS" in out and "failed=0" in out, out[-3000:]
        token = f"{engine}-{time.time()}"
        lab.ssh(node1, f"echo {token} > {CEPHFS}/e2e-evicted.txt")
        assert lab.ssh(node2, f"cat {CEPHFS}/e2e-evicted.txt").strip() == token
        print(f"{engine}: unmounted and mounted again; {node2} reads what {node1} wrote")
    lab.ssh(node1, f"rm -f {CEPHFS}/e2e-evicted.txt")
    assert lab.read_deploy().succeeded().results["changed"] == 0
