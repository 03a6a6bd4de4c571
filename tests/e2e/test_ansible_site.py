"""Ansible end to end: playbooks/site.yml with the testbed inventory over the Ansible lab
(tests/e2e/conftest.py ``ansible_lab``: every component, with the lab's STAND-IN drives
and release files), which tests/e2e/test_ansible_molecule.py converged role by role
(alone, this module deploys it from scratch). The site run over it changes nothing,
restarts nothing and leaves every service working, a Slurm setting changed
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


def test_playbook_over_the_converged_roles_changes_nothing(ansible_lab: Lab):
    """site.yml over the lab every role's molecule scenario converged
    (tests/e2e/test_ansible_molecule.py) is each role's second converge, the whole stack
    at once: it changes nothing and restarts nothing (the idempotence step of each
    scenario's ``molecule test``), and every service works. The ``record`` play (the
    components record, which no scenario writes) runs next, alone. Without molecule's
    converge (this module run alone), site.yml deploys the lab from scratch and its
    second run must change and restart nothing."""
    from tests.e2e.test_ansible_molecule import ROLES

    bed = ansible_lab.testbed
    make_standin_gpus(bed)
    converged = set(ROLES) <= ansible_lab.converged
    if not converged:
        print("no molecule converge on this lab: site.yml deploys it from scratch first")
        ansible_lab.playbook("--skip-tags", "record")
    # (0 for a unit not there, as on a lab nothing converged)
    started_before = ray_start_times(bed), slurm_start_times(bed)
    site = ansible_lab.playbook("--skip-tags", "record")
    changed = ansible_changed(site.stdout)
    assert set(changed) >= {"node1", "node2"}, changed
    print(f"site.yml (all but the record play) over the converged lab: changed {changed}")
    assert not any(changed.values()), (
        f"site.yml over the converged roles changed something: {changed} (a role is not "
        "idempotent; its tasks that changed are in the output above)")
    assert_base(bed)
    assert_network(bed, site.stdout)
    assert_nvidia_skipped(bed, site.stdout)
    assert_nfs(bed, site.stdout)
    assert_ceph_healthy(bed)
    assert_ray(bed, RAY_VERSION)
    assert_slurm(bed)
    # Nothing restarted: the Ray units became active when they did before the run ...
    assert ray_start_times(bed) == started_before[0]
    # ... nor did munge, slurmctld or slurmd.
    assert slurm_start_times(bed) == started_before[1]
    record = ansible_changed(ansible_lab.playbook("--tags", "record").stdout)
    print(f"the record play alone: changed {record}")
    assert recorded_components(bed, bed.nodes[1]["name"])["slurm"] == ["slurm_workers"]


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
    is the file pyinfra writes); the next run changes nothing."""
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
    # The last test on the Ansible lab (the lab in miniature replaces it next): node2 is
    # not put back here; tests/e2e/test_lab_absence.py puts a node back with pyinfra.
