"""Drift the deploy repairs, end to end: runtime state changed by hand on a deployed
testbed (the live firewall table, applied sysctls) is put back by the next deploy,
restarting nothing, and the deploy after reports 0 changes (Ansible: test_ansible_site.py).

On the lab in miniature (every component together, shared with the other
``test_lab*.py`` modules); each test leaves the nodes converged (repaired) at its end."""

from __future__ import annotations

import pytest

from tests.e2e.checks import ray_start_times, slurm_start_times

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
