"""Ansible end to end: the same inventory file, the same result, changed=0 the second time."""

from __future__ import annotations

import json

from tests.e2e.checks import (
    COMPONENTS_RECORD,
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
    recorded_components,
    sinfo_nodes,
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


# --- drift repaired, and desired absence (docs/rerunning.md) ---

TABLE = "nft list table inet aicluster"
RECORD = COMPONENTS_RECORD


def test_drift_is_repaired_and_a_node_taken_out_of_slurm_loses_it(testbed):
    """One run repairs runtime drift and takes away what a host no longer runs
    (docs/rerunning.md): the live firewall table (flushed on node1, a rule added by hand
    on node2) and an applied sysctl are put back, and node2, out of ``slurm_workers``,
    loses slurmd and leaves Slurm's node list (its data stays, the record is the file
    pyinfra writes); the next run changes nothing; node2 put back converges."""
    from aicluster.common.absence import record_text
    from aicluster.testbed.state import state_dir

    head, node2 = testbed.nodes[0]["name"], testbed.nodes[1]["name"]
    overrides = state_dir() / "overrides.json"
    before = overrides.read_text() if overrides.exists() else None
    data = json.loads(before) if before else {}
    playbook = [BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, "playbooks/site.yml"]
    written = {n: testbed.ssh(n, TABLE) for n in (head, node2)}
    testbed.ssh(head, "nft flush ruleset")
    testbed.ssh(node2, "nft add rule inet aicluster input tcp dport 9999 accept")
    testbed.ssh(node2, "sysctl -w net.ipv4.tcp_mtu_probing=0")
    try:
        overrides.write_text(json.dumps({**data, "groups": {"slurm_workers": [head]}}))
        run(playbook, timeout=1500)
        for node in (head, node2):
            assert testbed.ssh(node, TABLE) == written[node], node
        assert testbed.ssh(node2, "sysctl -n net.ipv4.tcp_mtu_probing").strip() == "1"
        assert testbed.ssh(node2, "systemctl is-active slurmd", check=False).strip() in (
            "inactive", "unknown"), "slurmd still runs on the node taken out of Slurm"
        assert testbed.ssh(node2, "systemctl is-enabled slurmd", check=False).strip() in (
            "disabled", "not-found")
        assert testbed.ssh(node2, "test -e /etc/slurm/slurm.conf || echo gone").strip() == "gone"
        testbed.ssh(node2, "test -d /var/lib/slurm/slurmd && dpkg -s slurmd >/dev/null")
        recorded = recorded_components(testbed, node2)
        assert "slurm" not in recorded
        # Byte for byte what the pyinfra deploy writes.
        assert testbed.ssh(node2, f"cat {RECORD}") == record_text(recorded)
        nodes = sinfo_nodes(testbed, head, [head])
        print(f"sinfo on {head} after the Ansible removal: {nodes}")
        assert nodes == [head], nodes
        again = run(playbook, timeout=1500)
        changed = ansible_changed(again.stdout)
        assert changed and not any(changed.values()), changed
    finally:
        if before is None:
            overrides.unlink(missing_ok=True)
        else:
            overrides.write_text(before)
    _playbook()
    assert recorded_components(testbed, node2)["slurm"] == ["slurm_workers"]
    assert_slurm(testbed)
