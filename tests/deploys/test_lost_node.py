"""A node lost while ``deploy.py`` is being planned: the connector raises ``HostLost``
for that node's own commands (aicluster.connectors.openssh, unit-tested in
tests/unit/test_openssh_connector.py); ``deploy.py`` then stops planning for it and
fails it, so pyinfra runs nothing on it, goes on with the others and exits non-zero.

Fake hosts: no host is contacted (tests/deploys/harness.py); the loss is a fact read
of w1's that raises what the connector raises.
"""

from __future__ import annotations

import runpy

from pyinfra.context import ctx_host, ctx_state

from aicluster import DEPLOY_FILE
from aicluster.connectors.openssh import HostLost
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan

HOSTS = [("s1", {"ssh_hostname": "10.10.0.11"}), ("w1", {"ssh_hostname": "10.10.0.21"})]
CLUSTER = {"networks": {"management": {"subnet": "10.10.0.0/24"}}}


def test_a_node_lost_while_planned_is_failed_and_the_others_planned_in_full(monkeypatch):
    monkeypatch.setenv("AICLUSTER_ACCEL", "0")  # the fake hosts answer facts; stock pyinfra
    seen = {}
    reads = []

    def lost_distribution():
        host = ctx_host.get()
        seen["state"] = ctx_state.get()
        reads.append(host.name)
        raise HostLost(host, "Could not connect (ssh: connect to host 10.10.0.21 port 22: "
                             "No route to host)")

    facts = {"s1": {"LinuxDistribution": DISTRIBUTIONS["debian12"]},
             "w1": {"LinuxDistribution": lost_distribution}}
    full = plan(HOSTS, {}, CLUSTER, {n: {"LinuxDistribution": DISTRIBUTIONS["debian12"]}
                                     for n, _ in HOSTS}, lambda: runpy.run_path(str(DEPLOY_FILE)))
    p = plan(HOSTS, {}, CLUSTER, facts, lambda: runpy.run_path(str(DEPLOY_FILE)))
    state = seen["state"]
    assert {h.name for h in state.failed_hosts} == {"w1"}
    assert {h.name for h in state.active_hosts} == {"s1"}
    assert reads == ["w1"]  # planning for w1 stopped at its first lost read
    assert p.names("s1") == full.names("s1") and len(p.names("s1")) > 10
    assert len(p.names("w1")) < len(full.names("w1"))
