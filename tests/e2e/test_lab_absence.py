"""Desired absence end to end (pyinfra): node2 taken out of ``slurm_workers`` loses
slurmd and Slurm's node list keeps only node1, its data directory stays, the next run
changes nothing; node2 put back converges, leaving the testbed as it was found.

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
    sinfo_nodes,
)

RECORD = COMPONENTS_RECORD


@pytest.fixture
def lab(lab):
    """The lab in miniature (tests/e2e/conftest.py), deployed."""
    return lab.deployed()


def test_a_node_taken_out_of_slurm_stops_slurmd_and_leaves_the_node_list(lab):
    head, node2 = lab.nodes[0]["name"], lab.nodes[1]["name"]
    assert recorded_components(lab, node2)["slurm"] == ["slurm_workers"]
    assert recorded_components(lab, head)["slurm"] == ["slurm_controller", "slurm_workers"]
    with lab.overridden(groups={"slurm_workers": [head]}):
        removed = lab.read_deploy().succeeded().results
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
        assert "slurm" not in recorded_components(lab, node2)
        nodes = sinfo_nodes(lab, head, [head])
        print(f"sinfo on {head} after the removal: {nodes}")
        assert nodes == [head], nodes
        again = lab.read_deploy().succeeded().results
        assert again["changed"] == 0 and again["errors"] == 0, again
    # node2 back in slurm_workers: the deploy converges and both nodes run jobs again.
    back = lab.read_deploy().succeeded().results
    assert back["errors"] == 0, back
    assert recorded_components(lab, node2)["slurm"] == ["slurm_workers"]
    assert_slurm(lab)
