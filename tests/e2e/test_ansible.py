"""Ansible end to end: the same inventory file, the same result, changed=0 the second time."""

from __future__ import annotations

from tests.e2e.checks import (
    RAY_VERSION,
    add_nfs_disk,
    assert_base,
    assert_network,
    assert_nfs,
    assert_nvidia_skipped,
    assert_ray,
    assert_slurm,
    assert_slurm_reconfigures_keeping_jobs,
    make_standin_gpus,
    ray_start_times,
    slurm_start_times,
)
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, ansible_changed, run


def _playbook():
    return run(
        [BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, "playbooks/site.yml"], timeout=1500
    )


def test_playbook_then_rerun_changes_nothing(testbed):
    make_standin_gpus(testbed)
    add_nfs_disk(testbed)
    first = _playbook()
    changed = ansible_changed(first.stdout)
    assert set(changed) >= {"node1", "node2"}
    assert sum(changed.values()) > 0
    assert_base(testbed)
    assert_network(testbed, first.stdout)
    assert_nvidia_skipped(testbed, first.stdout)
    assert_nfs(testbed, first.stdout)
    assert_ray(testbed, RAY_VERSION)
    ray_started = ray_start_times(testbed)
    assert_slurm(testbed)
    slurm_started = slurm_start_times(testbed)
    second = ansible_changed(_playbook().stdout)
    assert second and all(v == 0 for v in second.values()), second
    # Nothing restarted: the Ray units became active when they did before.
    assert ray_start_times(testbed) == ray_started
    # ... nor did munge, slurmctld or slurmd.
    assert slurm_start_times(testbed) == slurm_started


def test_slurm_config_change_reconfigures_keeping_a_running_job(testbed):
    def deploy():
        changed = ansible_changed(_playbook().stdout)
        assert sum(changed.values()) > 0, changed

    assert_slurm_reconfigures_keeping_jobs(testbed, deploy)
