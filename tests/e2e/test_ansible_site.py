"""Ansible end to end: playbooks/site.yml with the testbed inventory over the Ansible lab
(tests/e2e/conftest.py ``ansible_lab``: every component, with the lab's STAND-IN drives
and release files), which tests/e2e/test_ansible_molecule.py converged role by role
(alone, this module deploys it from scratch). The site run leaves every service
working, a second run changes nothing and restarts nothing, a Slurm setting changed
under a running job reconfigures it, drift is repaired and a node taken out of Slurm
loses it."""

from __future__ import annotations

from tests.e2e.checks import (
    COMPONENTS_RECORD,
    RAY_VERSION,
    assert_base,
    assert_ceph_healthy,
    assert_network,
    assert_nfs,
    assert_nvidia_skipped,
    assert_ray,
    assert_slurm,
    assert_slurm_reconfigures_keeping_jobs,
    make_standin_gpus,
    ray_start_times,
    recorded_components,
    recorded_mounts,
    sinfo_nodes,
    slurm_start_times,
)
from tests.e2e.conftest import Lab, ansible_changed


def test_playbook_then_rerun_changes_nothing(ansible_lab: Lab):
    """site.yml, then (if that changed anything) site.yml again: the second run changes
    nothing and restarts nothing. Over the lab molecule's scenarios converged, the
    first run is already that re-run (each role's own second converge changed
    nothing; here the whole playbook must too)."""
    bed = ansible_lab.testbed
    make_standin_gpus(bed)
    # (0 for a unit not there yet, as on a lab no scenario converged)
    started_before = ray_start_times(bed), slurm_start_times(bed)
    first = ansible_lab.playbook()
    changed = ansible_changed(first.stdout)
    assert set(changed) >= {"node1", "node2"}, changed
    print(f"site.yml over the Ansible lab: changed {changed}")
    assert_base(bed)
    assert_network(bed, first.stdout)
    assert_nvidia_skipped(bed, first.stdout)
    assert_nfs(bed, first.stdout)
    assert_ceph_healthy(bed)
    assert_ray(bed, RAY_VERSION)
    ray_started = ray_start_times(bed)
    assert_slurm(bed)
    slurm_started = slurm_start_times(bed)
    if any(changed.values()):
        second = ansible_changed(ansible_lab.playbook().stdout)
        assert second and all(v == 0 for v in second.values()), second
    else:
        print("site.yml over the roles molecule converged changed nothing: that run is "
              "the re-run")
        ray_started, slurm_started = started_before
    # Nothing restarted by the re-run: the Ray units became active when they did
    # before it ...
    assert ray_start_times(bed) == ray_started
    # ... nor did munge, slurmctld or slurmd.
    assert slurm_start_times(bed) == slurm_started


def test_slurm_config_change_reconfigures_keeping_a_running_job(ansible_lab: Lab):
    def deploy():
        # The Slurm play alone (`--tags slurm`): the whole stack's re-run is above.
        changed = ansible_changed(ansible_lab.playbook("--tags", "slurm").stdout)
        assert sum(changed.values()) > 0, changed

    assert_slurm_reconfigures_keeping_jobs(ansible_lab, deploy)


# --- drift repaired, and desired absence (docs/rerunning.md) ---

TABLE = "nft list table inet aicluster"
CEPHFS = "/mnt/cephfs"
RECORD = COMPONENTS_RECORD
#: The plays the drift and removal below concern (site.yml's tags: the firewall and
#: sysctls are base's, the CephFS mount ceph's, the node list slurm's), with the
#: absence and record plays; the whole stack's re-run is tested above.
PLAYS = ("--tags", "absence,base,ceph,slurm,record")


def test_drift_is_repaired_and_a_node_taken_out_of_slurm_loses_it(ansible_lab: Lab):
    """One run repairs runtime drift and takes away what a host no longer runs
    (docs/rerunning.md): the live firewall table (flushed on node1, a rule added by hand
    on node2), an applied sysctl and node2's CephFS mount (unmounted) are put back,
    and node2, out of ``slurm_workers`` with ``remove_packages = ["slurm"]``, loses
    slurmd and Slurm's packages and leaves Slurm's node list (its data stays, the record
    is the file pyinfra writes); the next run changes nothing; node2 put back converges
    (its packages installed again)."""
    from aicluster.common.absence import record_text

    testbed = ansible_lab.testbed
    head, node2 = testbed.nodes[0]["name"], testbed.nodes[1]["name"]
    written = {n: testbed.ssh(n, TABLE) for n in (head, node2)}
    testbed.ssh(head, "nft flush ruleset")
    testbed.ssh(node2, "nft add rule inet aicluster input tcp dport 9999 accept")
    testbed.ssh(node2, "sysctl -w net.ipv4.tcp_mtu_probing=0")
    testbed.ssh(node2, f"umount {CEPHFS}")
    with ansible_lab.overridden(groups={"slurm_workers": [head]}, remove_packages=["slurm"]):
        ansible_lab.playbook(*PLAYS)
        for node in (head, node2):
            assert testbed.ssh(node, TABLE) == written[node], node
        assert testbed.ssh(node2, "sysctl -n net.ipv4.tcp_mtu_probing").strip() == "1"
        assert testbed.ssh(node2, f"findmnt -n -o FSTYPE --mountpoint {CEPHFS}").strip() == (
            "fuse.ceph-fuse"), "node2's CephFS mount was not put back"
        assert testbed.ssh(node2, "systemctl is-active slurmd", check=False).strip() in (
            "inactive", "unknown"), "slurmd still runs on the node taken out of Slurm"
        assert testbed.ssh(node2, "systemctl is-enabled slurmd", check=False).strip() in (
            "disabled", "not-found")
        assert testbed.ssh(node2, "test -e /etc/slurm/slurm.conf || echo gone").strip() == "gone"
        # Its data stays; its Slurm and munge packages go (remove_packages names slurm).
        testbed.ssh(node2, "test -d /var/lib/slurm/slurmd")
        for package in ("slurmd", "slurm-client", "munge"):
            assert testbed.ssh(node2, f"dpkg-query -W -f '${{Status}}' {package} 2>&1",
                               check=False).split()[-1] != "installed", package
        recorded = recorded_components(testbed, node2)
        assert "slurm" not in recorded
        # Byte for byte what the pyinfra deploy writes.
        assert testbed.ssh(node2, f"cat {RECORD}") == record_text(
            recorded, recorded_mounts(testbed, node2))
        assert recorded_mounts(testbed, node2)["ceph"] == [CEPHFS]
        nodes = sinfo_nodes(testbed, head, [head])
        print(f"sinfo on {head} after the Ansible removal: {nodes}")
        assert nodes == [head], nodes
        again = ansible_lab.playbook(*PLAYS)
        changed = ansible_changed(again.stdout)
        assert changed and not any(changed.values()), changed
    ansible_lab.playbook(*PLAYS)
    assert recorded_components(testbed, node2)["slurm"] == ["slurm_workers"]
    assert_slurm(testbed)
