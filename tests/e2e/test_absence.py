"""Desired absence end to end (pyinfra): node2 taken out of ``slurm_workers`` loses
slurmd and Slurm's node list keeps only node1, its data directory stays, the next run
changes nothing; node2 put back converges, leaving the testbed as it was found.

Group changes are rehearsed through the testbed's overrides (``"groups"`` in
<testbed state dir>/overrides.json, inventories/testbed.py).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.checks import _wait, assert_slurm, make_standin_gpus
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, fresh_testbed, pyinfra_results, run

RECORD = "/etc/aicluster/components"


def _deploy():
    proc = run([BIN / "pyinfra", "-y", TESTBED_INVENTORY, "deploy.py"], timeout=1500)
    return pyinfra_results(proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def lab():
    """A fresh two-node testbed deployed with pyinfra (the whole stack it can run)."""
    with fresh_testbed() as (bed, _):
        make_standin_gpus(bed)
        first = _deploy()
        assert first["errors"] == 0, first
        yield bed


def _recorded(lab, node: str) -> dict:
    return json.loads(lab.ssh(node, f"cat {RECORD}"))["components"]


def _sinfo_nodes(lab, head: str, want: list[str]) -> list[str]:
    out = _wait(lab, head, "sinfo -h -N -o %N",
                lambda o: sorted(set(o.split())) == want)
    return sorted(set(out.split()))


def test_a_node_taken_out_of_slurm_stops_slurmd_and_leaves_the_node_list(lab):
    from aicluster.testbed.state import state_dir

    head, node2 = lab.nodes[0]["name"], lab.nodes[1]["name"]
    assert _recorded(lab, node2)["slurm"] == ["slurm_workers"]
    assert _recorded(lab, head)["slurm"] == ["slurm_controller", "slurm_workers"]
    overrides = state_dir() / "overrides.json"
    before = overrides.read_text() if overrides.exists() else None
    data = json.loads(before) if before else {}
    try:
        overrides.write_text(json.dumps({**data, "groups": {"slurm_workers": [head]}}))
        removed = _deploy()
        assert removed["changed"] > 0 and removed["errors"] == 0, removed
        assert lab.ssh(node2, "systemctl is-active slurmd", check=False).strip() in (
            "inactive", "unknown"), "slurmd still runs on the node taken out of Slurm"
        assert lab.ssh(node2, "systemctl is-enabled slurmd", check=False).strip() in (
            "disabled", "not-found"), "slurmd still enabled on the node taken out of Slurm"
        assert lab.ssh(node2, "test -e /etc/slurm/slurm.conf || echo gone").strip() == "gone"
        assert lab.ssh(node2, "test -e /etc/munge/munge.key || echo gone").strip() == "gone"
        # Data and packages stay.
        lab.ssh(node2, "test -d /var/lib/slurm/slurmd && test -d /var/log/slurm")
        lab.ssh(node2, "dpkg -s slurmd >/dev/null")
        assert "slurm" not in _recorded(lab, node2)
        nodes = _sinfo_nodes(lab, head, [head])
        print(f"sinfo on {head} after the removal: {nodes}")
        assert nodes == [head], nodes
        again = _deploy()
        assert again["changed"] == 0 and again["errors"] == 0, again
    finally:
        if before is None:
            overrides.unlink(missing_ok=True)
        else:
            overrides.write_text(before)
    # node2 back in slurm_workers: the deploy converges and both nodes run jobs again.
    back = _deploy()
    assert back["errors"] == 0, back
    assert _recorded(lab, node2)["slurm"] == ["slurm_workers"]
    assert_slurm(lab)


def test_ansible_takes_a_node_out_of_slurm_too(lab):
    """The same with ansible-playbook (on the cluster pyinfra deployed: the record both
    engines write is the same file)."""
    from aicluster.common.absence import record_text
    from aicluster.testbed.state import state_dir
    from tests.e2e.conftest import ansible_changed

    head, node2 = lab.nodes[0]["name"], lab.nodes[1]["name"]
    overrides = state_dir() / "overrides.json"
    before = overrides.read_text() if overrides.exists() else None
    data = json.loads(before) if before else {}
    playbook = [BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, "playbooks/site.yml"]
    try:
        overrides.write_text(json.dumps({**data, "groups": {"slurm_workers": [head]}}))
        run(playbook, timeout=1500)
        assert lab.ssh(node2, "systemctl is-active slurmd", check=False).strip() in (
            "inactive", "unknown"), "slurmd still runs on the node taken out of Slurm"
        assert lab.ssh(node2, "systemctl is-enabled slurmd", check=False).strip() in (
            "disabled", "not-found")
        assert lab.ssh(node2, "test -e /etc/slurm/slurm.conf || echo gone").strip() == "gone"
        lab.ssh(node2, "test -d /var/lib/slurm/slurmd && dpkg -s slurmd >/dev/null")
        recorded = _recorded(lab, node2)
        assert "slurm" not in recorded
        # Byte for byte what the pyinfra deploy writes.
        assert lab.ssh(node2, f"cat {RECORD}") == record_text(recorded)
        nodes = _sinfo_nodes(lab, head, [head])
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
    back = _deploy()
    assert back["errors"] == 0, back
    assert _recorded(lab, node2)["slurm"] == ["slurm_workers"]
    assert_slurm(lab)
