"""The network layer of ``aicluster check`` (src/aicluster/checks/network.py): each
check's probe, planned from a real inventory (inventories/lab.py, or a small testbed-like
one), read through its own ``read`` on outputs kept under
tests/fixtures/check/network/ (their sources in the README there)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from aicluster import PROJECT_ROOT
from aicluster.checks import network
from aicluster.checks.context import Context
from aicluster.checks.result import Action, Status
from aicluster.checks.runner import Completed, PairCheck, Probe
from aicluster.inventory import load_cluster, validate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "check" / "network"
LAB = load_cluster(PROJECT_ROOT / "inventories" / "lab.py")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def done(stdout: str, rc: int = 0) -> Completed:
    return Completed(rc, stdout, "", 0.1)


def like_testbed(*, node2_mtu: int = 9000, bare: bool = False, over: dict | None = None):
    """Like inventories/testbed.py: nodes with a veth ``fabric0`` on the fabric bridge,
    declared 10 Gb/s at MTU 9000 (and, with ``bare``, a third node with no cluster NIC)."""
    cluster = {"cluster_name": "testbed",
               "networks": {"management": {"subnet": "10.213.0.0/24"},
                            "fabric": {"subnet": "10.213.1.0/24", "mtu": 9000}}}
    hosts = {}
    for n in (1, 2, 3) if bare else (1, 2):
        nics = [] if n == 3 else [{"name": "fabric0", "network": "fabric", "speed_gbps": 10,
                                   "address": f"10.213.1.{10 + n}",
                                   "mtu": node2_mtu if n == 2 else 9000}]
        data = {**cluster, "ssh_hostname": f"10.213.0.{10 + n}",
                "hardware": {"cpus": 1, "memory_gb": 2, "nics": nics},
                **((over or {}) if n == 1 else {})}
        hosts[f"node{n}"] = ((), data)
    return validate(hosts)


def node_probe(ctx: Context, check: str, node: str) -> Probe:
    [probe] = [p for p in network.probes(ctx) if p.check == check and p.node == node]
    return probe


def pair_check(ctx: Context, check: str, network_name: str | None = None) -> PairCheck:
    """The pair check of ``check`` (for path_mtu: the one of ``network_name``, told by the
    address its probes ping)."""
    found = [pc for pc in network.pair_checks(ctx) if pc.check == check]
    if network_name is None:
        [one] = found
        return one
    for pc in found:
        a, b = pc.nodes[0], pc.nodes[-1]
        if str(ctx.address(b, network_name)) in pc.make(a, b).command:
            return pc
    raise AssertionError(f"no {check} pair check on {network_name}")


# ---------------------------------------------------------------------------
# network.nic
# ---------------------------------------------------------------------------


def test_nic_passes_when_every_declared_nic_is_up_at_its_speed_and_mtu():
    results = node_probe(Context(LAB), "network.nic", "gpu1").read(
        done(fixture("interfaces-gpu1.txt")))
    assert [(r.status, r.value, r.threshold, r.unit) for r in results] == [
        (Status.PASS, 100.0, 100, "Gb/s")] * 2
    # The lab declares the GPU nodes' NICs by MAC: found whatever the kernel named them.
    assert [r.details["subject"] for r in results] == ["b8:3f:d2:00:01:01",
                                                       "b8:3f:d2:00:01:02"]
    assert [r.details["interface"] for r in results] == ["ens1f0np0", "ens1f1np1"]


def test_a_nic_that_trained_below_its_declared_speed_fails_naming_it():
    fabric, storage = node_probe(Context(LAB), "network.nic", "gpu1").read(
        done(fixture("interfaces-gpu1-downtrained.txt")))
    assert fabric.status is Status.FAIL and fabric.action is Action.INVESTIGATE
    assert (fabric.value, fabric.threshold) == (25.0, 100)
    assert "gpu1: fabric NIC b8:3f:d2:00:01:01 (ens1f0np0)" in fabric.message
    assert "link at 25 Gb/s, declared 100 Gb/s" in fabric.message
    assert storage.status is Status.PASS


def test_a_nic_down_with_the_wrong_mtu_fails_with_both_causes():
    _, storage = node_probe(Context(LAB), "network.nic", "gpu1").read(
        done(fixture("interfaces-gpu1-storage-down.txt")))
    assert storage.status is Status.FAIL
    assert "link down" in storage.message
    assert "MTU 1500, the inventory says 9000" in storage.message
    assert storage.details["mtu"] == 1500


def test_a_declared_nic_the_node_lacks_fails_naming_what_it_has():
    _, storage = node_probe(Context(LAB), "network.nic", "gpu1").read(
        done(fixture("interfaces-gpu1-storage-missing.txt")))
    assert storage.status is Status.FAIL and storage.action is Action.INVESTIGATE
    assert "storage NIC b8:3f:d2:00:01:02 not found" in storage.message
    assert "ens1f0np0 b8:3f:d2:00:01:01" in storage.message


def test_bond_members_bond_and_vlan_pass_at_the_members_speed_together():
    results = node_probe(Context(LAB), "network.nic", "storage1").read(
        done(fixture("interfaces-storage1.txt")))
    by = {r.details["subject"]: r for r in results}
    assert set(by) == {"ens2f0", "ens2f1", "bond0", "bond0.20"}
    assert all(r.status is Status.PASS for r in results), [r.message for r in results]
    assert (by["bond0"].value, by["bond0"].threshold) == (200.0, 200)
    assert by["bond0.20"].threshold is None  # a VLAN reports its link's speed


def test_a_bond_with_a_member_down_fails_at_half_its_speed():
    results = node_probe(Context(LAB), "network.nic", "storage1").read(
        done(fixture("interfaces-storage1-member-down.txt")))
    by = {r.details["subject"]: r for r in results}
    assert by["ens2f1"].status is Status.FAIL and "link down" in by["ens2f1"].message
    assert "NIC ens2f1 of bond0" in by["ens2f1"].message
    assert by["bond0"].status is Status.FAIL and by["bond0"].value == 100.0
    assert "a member down or out of the aggregate" in by["bond0"].message
    assert by["ens2f0"].status is Status.PASS


def test_the_testbed_veth_passes_at_the_10_gbits_it_reports():
    [result] = node_probe(Context(like_testbed()), "network.nic", "node1").read(
        done(fixture("interfaces-testbed-node1.txt")))
    assert result.status is Status.PASS and result.value == 10.0


def test_a_nic_reporting_no_speed_is_a_warn_not_a_pass():
    [result] = node_probe(Context(like_testbed()), "network.nic", "node1").read(
        done(fixture("interfaces-testbed-node1-nospeed.txt")))
    assert result.status is Status.WARN and result.action is Action.MONITOR
    assert "speed not reported" in result.message and result.value is None


def test_a_testbed_nic_at_mtu_1500_fails_and_says_deploy_again():
    [result] = node_probe(Context(like_testbed()), "network.nic", "node1").read(
        done(fixture("interfaces-testbed-node1-mtu1500.txt")))
    assert result.status is Status.FAIL and result.action is Action.REDEPLOY
    assert "MTU 1500, the inventory says 9000: deploy again" in result.message


def test_nothing_is_planned_for_a_node_without_cluster_nics():
    ctx = Context(like_testbed(bare=True), tier="standard")
    assert [p.node for p in network.probes(ctx)] == ["node1", "node2"]
    for pc in network.pair_checks(ctx):
        assert pc.nodes == ["node1", "node2"], pc.check


# ---------------------------------------------------------------------------
# network.path_mtu
# ---------------------------------------------------------------------------


def test_path_mtu_is_planned_per_cluster_network_at_its_mtu():
    ctx = Context(LAB, tier="quick")
    fabric = pair_check(ctx, "network.path_mtu", "fabric")
    storage = pair_check(ctx, "network.path_mtu", "storage")
    ib = pair_check(ctx, "network.path_mtu", "ib")
    assert fabric.nodes == storage.nodes == ["head", "gpu1", "gpu2", "gpu3", "gpu4",
                                             "storage1"]
    assert ib.nodes == ["gpu1", "gpu2", "gpu3", "gpu4"]
    probe = fabric.make("gpu1", "storage1")
    assert probe.pair == ("gpu1", "storage1") and probe.server is None
    assert "ping -n -M do -s 8972 -c 3 -i 0.2 -W 1 10.20.0.40" in probe.command
    # IPoIB in datagram mode: the port's MTU (2044), not Ethernet's.
    assert "-M do -s 2016 " in ib.make("gpu1", "gpu2").command
    assert not [pc for pc in network.pair_checks(ctx) if pc.check == "network.iperf3"]


def test_path_mtu_tests_the_smaller_mtu_of_the_two_ends():
    ctx = Context(like_testbed(node2_mtu=1500), tier="quick")
    probe = pair_check(ctx, "network.path_mtu", "fabric").make("node1", "node2")
    assert "-M do -s 1472 " in probe.command


def _path_probe():
    return pair_check(Context(LAB), "network.path_mtu", "fabric").make("gpu1", "gpu2")


def test_path_mtu_passes_when_every_full_size_packet_comes_back():
    result = _path_probe().read(done(fixture("ping-df-9000-ok.txt")))
    assert result.status is Status.PASS
    assert (result.value, result.threshold, result.unit) == (9000, 9000, "bytes")
    assert result.pair == ("gpu1", "gpu2") and result.details["subject"] == "fabric"


def test_path_mtu_fails_when_the_senders_own_interface_is_too_small():
    result = _path_probe().read(done(fixture("ping-df-local-error.txt")))
    assert result.status is Status.FAIL and result.action is Action.REDEPLOY
    assert result.value == 1400
    assert "gpu1 -> gpu2's fabric address 10.20.0.22: fragmentation needed" in result.message
    assert "gpu1's own interface has MTU 1400, the fabric network 9000" in result.message


def test_path_mtu_fails_naming_the_hop_that_needs_fragmentation():
    result = _path_probe().read(done(fixture("ping-df-frag-needed.txt")))
    assert result.status is Status.FAIL and result.value == 1500
    assert "a hop on the path has MTU 1500" in result.message


def test_path_mtu_tells_a_smaller_mtu_on_the_path_from_a_peer_that_is_gone():
    lost = fixture("ping-df-no-reply.txt") + network.SMALL_MARK + "\n"
    mtu = _path_probe().read(done(lost + fixture("ping-small-ok.txt")))
    assert mtu.status is Status.FAIL and mtu.action is Action.INVESTIGATE
    assert "small ones pass" in mtu.message and "smaller MTU than 9000" in mtu.message
    gone = _path_probe().read(done(lost + fixture("ping-small-no-reply.txt")))
    assert gone.status is Status.FAIL
    assert "no answer at all" in gone.message and "gpu2 is down on the fabric" in gone.message


def test_path_mtu_with_some_loss_is_a_warn():
    result = _path_probe().read(done(fixture("ping-df-partial.txt")))
    assert result.status is Status.WARN and "1 of 3" in result.message


def test_path_mtu_without_ping_is_an_error_naming_it():
    result = _path_probe().read(done("#notool\n"))
    assert result.status is Status.ERROR and "ping is not installed" in result.message


def _fake_tool(tmp_path: Path, name: str, script: str) -> dict:
    """``name`` on a PATH of its own: a shell script (a STAND-IN for the real tool)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_small_ping_runs_only_after_the_full_size_ones_failed(tmp_path):
    """The probe's own shell, with a STAND-IN ping that fails at full size."""
    env = _fake_tool(tmp_path, "ping", 'case "$*" in *"-M do"*) cat "$BIG"; exit 1;; '
                                       '*) cat "$SMALL";; esac\n')
    env.update(BIG=str(FIXTURES / "ping-df-no-reply.txt"),
               SMALL=str(FIXTURES / "ping-small-ok.txt"))
    probe = _path_probe()
    out = subprocess.run(["sh", "-c", probe.command], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert probe.read(done(out)).message.endswith("smaller MTU than 9000")
    env["BIG"] = str(FIXTURES / "ping-df-9000-ok.txt")
    env_ok = _fake_tool(tmp_path, "ping", 'case "$*" in *"-M do"*) cat "$BIG";; '
                                          '*) echo small-ping-ran;; esac\n')
    env_ok.update(BIG=env["BIG"])
    out = subprocess.run(["sh", "-c", probe.command], capture_output=True, text=True,
                         env=env_ok, check=True).stdout
    assert "small-ping-ran" not in out and probe.read(done(out)).status is Status.PASS


# ---------------------------------------------------------------------------
# network.iperf3
# ---------------------------------------------------------------------------


def test_iperf3_is_planned_on_the_fabric_in_the_standard_tier():
    pc = pair_check(Context(LAB, tier="standard"), "network.iperf3")
    assert pc.nodes == ["head", "gpu1", "gpu2", "gpu3", "gpu4", "storage1"]
    probe = pc.make("gpu1", "gpu2")
    assert probe.server == "iperf3 -s -1 -B 10.20.0.22 -p 5201"
    assert "iperf3 -c 10.20.0.22 -B 10.20.0.21 -p 5201 -J -t 5 -P 4" in probe.command
    assert probe.timeout > 5 + network.CLIENT_TRIES


def test_iperf3_fails_below_the_fraction_of_the_declared_link():
    """The 28.8 Gb/s captured over loopback is far below 80 % of the lab's 100 GbE."""
    probe = pair_check(Context(LAB), "network.iperf3").make("gpu1", "gpu2")
    result = probe.read(done(fixture("iperf3-loopback-4streams.json")))
    assert result.status is Status.FAIL and result.action is Action.INVESTIGATE
    assert (result.value, result.threshold, result.unit) == (28.79, 80.0, "Gb/s")
    assert "below 0.8 of the 100 Gb/s link" in result.message


def test_iperf3_floor_is_the_slower_link_of_the_pair():
    """head's 25 GbE against storage1's fabric VLAN on a 2 x 100 GbE bond."""
    probe = pair_check(Context(LAB), "network.iperf3").make("head", "storage1")
    result = probe.read(done(fixture("iperf3-loopback-4streams.json")))
    assert result.status is Status.PASS and result.threshold == 20.0
    assert result.details["link_gbps"] == 25.0


def test_iperf3_passes_on_the_testbed_and_with_a_lowered_threshold():
    probe = pair_check(Context(like_testbed()), "network.iperf3").make("node1", "node2")
    result = probe.read(done(fixture("iperf3-loopback-4streams.json")))
    assert result.status is Status.PASS and result.threshold == 8.0
    over = {"check_thresholds": {"network": {"iperf3_min_fraction": 0.2}}}
    probe = pair_check(Context(like_testbed(over=over)), "network.iperf3").make("node1", "node2")
    assert probe.read(done(fixture("iperf3-loopback-4streams.json"))).threshold == 2.0


def test_iperf3_without_a_server_fails_with_iperf3s_error():
    probe = pair_check(Context(LAB), "network.iperf3").make("gpu1", "gpu2")
    result = probe.read(done(fixture("iperf3-refused.json")))
    assert result.status is Status.FAIL
    assert "unable to connect to server: Connection refused" in result.message
    assert result.value is None


def test_iperf3_missing_is_an_error_naming_it():
    probe = pair_check(Context(LAB), "network.iperf3").make("gpu1", "gpu2")
    result = probe.read(done("#notool\n"))
    assert result.status is Status.ERROR and result.action is Action.REDEPLOY
    assert "iperf3 is not installed" in result.message


def test_the_iperf3_client_tries_again_while_the_server_comes_up(tmp_path):
    """The probe's own shell, with a STAND-IN iperf3 refused twice, then answering."""
    env = _fake_tool(tmp_path, "iperf3",
                     'n=$(cat "$COUNT" 2>/dev/null || echo 0); echo $((n + 1)) > "$COUNT"; '
                     'if [ "$n" -lt 2 ]; then cat "$REFUSED"; else cat "$OK"; fi\n')
    env.update(COUNT=str(tmp_path / "count"), REFUSED=str(FIXTURES / "iperf3-refused.json"),
               OK=str(FIXTURES / "iperf3-loopback-4streams.json"))
    probe = pair_check(Context(like_testbed()), "network.iperf3").make("node1", "node2")
    out = subprocess.run(["sh", "-c", probe.command], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert (tmp_path / "count").read_text().strip() == "3"
    assert probe.read(done(out)).status is Status.PASS


@pytest.mark.parametrize("check", ["network.nic", "network.path_mtu", "network.iperf3"])
def test_every_check_name_is_the_layers(check):
    ctx = Context(LAB, tier="standard")
    names = {p.check for p in network.probes(ctx)} | {
        pc.check for pc in network.pair_checks(ctx)}
    assert check in names and all(n.startswith("network.") for n in names)


def test_a_nic_declared_by_mac_is_the_physical_one_not_a_bond_sharing_its_mac():
    """A bond and its VLAN carry their first member's MAC: the NIC is the member."""
    cluster = {"cluster_name": "small",
               "networks": {"management": {"subnet": "10.213.0.0/24"},
                            "storage": {"subnet": "10.213.2.0/24", "mtu": 9000}}}
    data = {**cluster, "ssh_hostname": "10.213.0.11",
            "network_bonds": [{"name": "bond0", "members": ["0c:42:a1:5e:77:10"],
                               "network": "storage", "address": "10.213.2.11"}],
            "hardware": {"cpus": 1, "memory_gb": 2, "nics": [
                {"mac": "0c:42:a1:5e:77:10", "network": "storage", "speed_gbps": 100}]}}
    ctx = Context(validate({"node1": ((), data)}))
    results = node_probe(ctx, "network.nic", "node1").read(
        done(fixture("interfaces-storage1.txt")))
    nic = next(r for r in results if r.details["subject"] == "0c:42:a1:5e:77:10")
    assert nic.details["interface"] == "ens2f0" and nic.status is Status.PASS
