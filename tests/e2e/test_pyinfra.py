"""pyinfra end to end: deploy the testbed, check the nodes, deploy again: no change."""

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
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, pyinfra_results, run


def _deploy():
    return run([BIN / "pyinfra", "-y", TESTBED_INVENTORY, "deploy.py"], timeout=1500)


def _output(proc):
    # pyinfra writes its progress and results table to stderr.
    return proc.stdout + proc.stderr


def test_deploy_then_redeploy_changes_nothing(testbed):
    make_standin_gpus(testbed)
    add_nfs_disk(testbed)
    first_proc = _deploy()
    first = pyinfra_results(_output(first_proc))
    assert first["changed"] > 0 and first["errors"] == 0, first
    assert_base(testbed)
    assert_network(testbed, _output(first_proc))
    assert_nvidia_skipped(testbed, _output(first_proc))
    assert_nfs(testbed, _output(first_proc))
    assert_ray(testbed, RAY_VERSION)
    ray_started = ray_start_times(testbed)
    assert_slurm(testbed)
    slurm_started = slurm_start_times(testbed)
    second = pyinfra_results(_output(_deploy()))
    assert second["changed"] == 0 and second["errors"] == 0, second
    assert second["no_change"] > 0, second
    # Nothing restarted: the Ray units became active when they did before.
    assert ray_start_times(testbed) == ray_started
    # ... nor did munge, slurmctld or slurmd.
    assert slurm_start_times(testbed) == slurm_started


def test_slurm_config_change_reconfigures_keeping_a_running_job(testbed):
    def deploy():
        result = pyinfra_results(_output(_deploy()))
        assert result["errors"] == 0 and result["changed"] > 0, result

    assert_slurm_reconfigures_keeping_jobs(testbed, deploy)
