"""Desired absence end to end (pyinfra): node2 taken out of ``slurm_workers`` loses
slurmd and Slurm's node list keeps only node1, its data directory stays; taken out of
``ceph_clients`` at the same time, its CephFS is unmounted and its fstab line removed;
the next run changes nothing; node2 put back converges (mounted again), leaving the
testbed as it was found. node2 taken out of ``ceph_osds`` while the cluster still maps
its OSD is refused, with nothing taken away.

Group changes are rehearsed through the testbed's overrides (``"groups"`` in
<testbed state dir>/overrides.json, inventories/testbed.py). On the lab in miniature
(every component together, shared with the other ``test_lab*.py`` modules); the same
removal by Ansible is in test_ansible_site.py.
"""

from __future__ import annotations

import pytest

from tests.e2e.checks import (
    COMPONENTS_RECORD,
    assert_slurm,
    recorded_components,
    recorded_mounts,
    sinfo_nodes,
)

RECORD = COMPONENTS_RECORD
CEPHFS = "/mnt/cephfs"


@pytest.fixture
def lab(lab):
    """The lab in miniature (tests/e2e/conftest.py), deployed."""
    return lab.deployed()


def test_a_node_taken_out_of_slurm_stops_slurmd_and_leaves_the_node_list(lab):
    head, node2 = lab.nodes[0]["name"], lab.nodes[1]["name"]
    assert recorded_components(lab, node2)["slurm"] == ["slurm_workers"]
    assert recorded_components(lab, head)["slurm"] == ["slurm_controller", "slurm_workers"]
    assert lab.ssh(node2, f"findmnt -n -o FSTYPE --mountpoint {CEPHFS}").strip() == (
        "fuse.ceph-fuse")
    assert recorded_mounts(lab, node2)["ceph"] == [CEPHFS]
    lab.ssh(node2, f"echo kept > {CEPHFS}/absence-node2")
    with lab.overridden(groups={"slurm_workers": [head], "ceph_clients": [head]}):
        removed = lab.read_deploy().succeeded().results
        assert removed["changed"] > 0 and removed["errors"] == 0, removed
        # Out of ceph_clients (still an OSD): its CephFS mount and fstab line are gone,
        # the mount point stays, and the files stay on the cluster (node1 reads one).
        assert lab.ssh(node2, f"findmnt -n --mountpoint {CEPHFS} || echo none").strip() \
            == "none", "node2's CephFS is still mounted"
        assert lab.ssh(head, f"cat {CEPHFS}/absence-node2") == "kept\n"
        assert f" {CEPHFS} " not in lab.ssh(node2, "cat /etc/fstab")
        lab.ssh(node2, f"test -d {CEPHFS}")
        assert "ceph" not in recorded_mounts(lab, node2)
        assert recorded_components(lab, node2)["ceph"] == ["ceph_osds"]
        assert lab.ssh(node2, "systemctl is-active slurmd", check=False).strip() in (
            "inactive", "unknown"), "slurmd still runs on the node taken out of Slurm"
        assert lab.ssh(node2, "systemctl is-enabled slurmd", check=False).strip() in (
            "disabled", "not-found"), "slurmd still enabled on the node taken out of Slurm"
        assert lab.ssh(node2, "test -e /etc/slurm/slurm.conf || echo gone").strip() == "gone"
        assert lab.ssh(node2, "test -e /etc/munge/munge.key || echo gone").strip() == "gone"
        # Data and packages stay.
        lab.ssh(node2, "test -d /var/lib/slurm/slurmd && test -d /var/log/slurm")
        lab.ssh(node2, "dpkg -s slurmd >/dev/null")
        assert "slurm" not in recorded_components(lab, node2)
        nodes = sinfo_nodes(lab, head, [head])
        print(f"sinfo on {head} after the removal: {nodes}")
        assert nodes == [head], nodes
        again = lab.read_deploy().succeeded().results
        assert again["changed"] == 0 and again["errors"] == 0, again
    # node2 back in slurm_workers and ceph_clients: the deploy converges, both nodes run
    # jobs again and node2 mounts CephFS again.
    back = lab.read_deploy().succeeded().results
    assert back["errors"] == 0, back
    assert recorded_components(lab, node2)["slurm"] == ["slurm_workers"]
    assert lab.ssh(node2, f"findmnt -n -o FSTYPE --mountpoint {CEPHFS}").strip() == (
        "fuse.ceph-fuse")
    assert recorded_mounts(lab, node2)["ceph"] == [CEPHFS]
    lab.ssh(node2, f"rm {CEPHFS}/absence-node2")
    assert_slurm(lab)


def test_a_node_taken_out_of_ceph_osds_keeps_its_osd_until_it_is_drained(lab):
    """node2 out of ``ceph_osds`` while the cluster still maps its OSD: the deploy reads
    that with the bootstrap-osd key (real Ceph), fails node2 saying how to drain the
    OSD, and takes nothing away (the OSD stays up and in, its unit active, its files
    there, the record unchanged)."""
    head, node2 = lab.nodes[0]["name"], lab.nodes[1]["name"]
    osds = lab.ssh(head, f"ceph osd ls-tree {node2}").split()
    assert osds, f"no OSD of {node2} in the cluster"
    with lab.overridden(groups={"ceph_osds": [head]},
                        hosts={node2: {"ceph_osd_devices": None}}):
        refused = lab.read_deploy("--limit", node2)
        assert refused.rc != 0, refused.output[-3000:]
        words = " ".join(refused.output.split())
        assert f"{node2} leaves ceph_osds, but the cluster still has its OSDs" in words, (
            refused.output[-3000:])
        assert f"ceph osd safe-to-destroy {' '.join(osds)}" in words
        print(f"node2 out of ceph_osds, refused: OSDs {osds} still mapped there")
    # Nothing was taken away: the OSD runs, up and in; node2 still records its role.
    for osd in osds:
        assert lab.ssh(head, f"ceph osd dump | grep '^osd.{osd} '").split()[1:3] == [
            "up", "in"]
    assert lab.ssh(node2, "systemctl is-active aicluster-ceph-osds").strip() == "active"
    assert "ceph_osds" in recorded_components(lab, node2)["ceph"]
    for path in ("/usr/local/sbin/aicluster-ceph-osd", "/etc/ceph/aicluster-osd-devices",
                 "/var/lib/ceph/bootstrap-osd/ceph.keyring"):
        lab.ssh(node2, f"test -e {path}")
