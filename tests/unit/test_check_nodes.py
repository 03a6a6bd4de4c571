"""The nodes layer of `aicluster check` (reach, time, deployed as the inventory says),
the thresholds an inventory overrides, the run (reach first, pair tests in rounds), the
Slurm drain decisions, the fleet baseline and the command itself, with a fake
transport."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from aicluster.checks import baseline, drain, nodes, report
from aicluster.checks.context import Context, ThresholdError, check_thresholds, thresholds_for
from aicluster.checks.result import Result, Status
from aicluster.checks.runner import Completed, PairCheck, Probe
from aicluster.checks.session import run
from aicluster.common.absence import record_text
from aicluster.inventory import load_cluster, validate

FIXTURES = Path(__file__).parents[1] / "fixtures" / "check" / "nodes"
LAB = "inventories/lab.py"


def done(stdout: str = "", rc: int = 0, stderr: str = "") -> Completed:
    return Completed(rc, stdout, stderr, 0.01)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture(scope="module")
def lab():
    return load_cluster(LAB)


def two_nodes(**data):
    hosts = {
        f"n{i}": (["slurm_workers", *(["slurm_controller"] if i == 1 else [])],
                  {"ssh_hostname": f"10.0.0.{i}", "slurm_version": "22.05.8", **data})
        for i in (1, 2)
    }
    return _validated(hosts)


def _validated(hosts):
    return validate({n: (g, {**d, "networks": {"management": {"subnet": "10.0.0.0/24"}}})
                     for n, (g, d) in hosts.items()})


def probe_of(probes: list[Probe], check: str, node: str) -> Probe:
    return next(p for p in probes if p.check == check and p.node == node)


# -- time ----------------------------------------------------------------------------


def test_time_in_step_passes_and_a_late_clock_fails(lab):
    ctx = Context(lab)
    probe = probe_of(nodes.probes(ctx), "nodes.time", "gpu1")
    good = probe.read(done(fixture("chronyc-tracking-synced.txt")))
    assert good.status is Status.PASS and good.value == pytest.approx(0.012, abs=1e-3)
    bad = probe.read(done(fixture("chronyc-tracking-offset.txt")))
    assert bad.status is Status.FAIL and bad.value == pytest.approx(250.123, abs=1e-3)
    assert bad.threshold == 100
    unsynced = probe.read(done(fixture("chronyc-tracking-unsynced.txt")))
    assert unsynced.status is Status.FAIL and "not synchronised" in unsynced.message
    assert probe.read(done(rc=1, stderr="506 Cannot talk to daemon")).status is Status.FAIL
    assert probe.read(done(rc=127, stderr="chronyc: not found")).status is Status.ERROR


def test_the_time_threshold_is_the_inventorys(lab):
    cluster = _validated({"n1": ([], {"ssh_hostname": "10.0.0.1", "check_thresholds": {
        "nodes": {"time_offset_fail_ms": 500}}})})
    probe = probe_of(nodes.probes(Context(cluster)), "nodes.time", "n1")
    result = probe.read(done(fixture("chronyc-tracking-offset.txt")))
    assert result.status is Status.WARN and result.threshold == 10


# -- thresholds ----------------------------------------------------------------------


def test_thresholds_are_laid_over_the_defaults_key_by_key():
    cluster = _validated({"n1": ([], {"ssh_hostname": "10.0.0.1", "check_thresholds": {
        "network": {"iperf3_min_fraction": 0.5},
        "infiniband": {"ib_write_bw_min_gbps": {400: 350}},
        "gpu": {"profiles": {"B200": {"nccl_busbw_gbps": 700}}}}})})
    t = thresholds_for(cluster.hosts["n1"])
    assert t["network"]["iperf3_min_fraction"] == 0.5
    assert t["network"]["iperf3_seconds"] == 5
    assert t["infiniband"]["ib_write_bw_min_gbps"][400] == 350
    assert t["infiniband"]["ib_write_bw_min_gbps"][200] == 180
    assert t["gpu"]["profiles"]["B200"]["nccl_busbw_gbps"] == 700
    assert t["gpu"]["profiles"]["B200"]["pcie_width"] == 0  # the default row's
    assert check_thresholds(cluster) == []


@pytest.mark.parametrize("override,words", [
    ({"network": {"iperf3_min_fraktion": 0.5}}, "did you mean iperf3_min_fraction"),
    ({"network": {"iperf3_min_fraction": "most"}}, "expected a number"),
    ({"nodes": 3}, "expected a mapping"),
    ({"stroage": {}}, "did you mean storage"),
])
def test_a_threshold_that_does_not_exist_or_is_no_number_is_refused(override, words):
    cluster = _validated({"n1": ([], {"ssh_hostname": "10.0.0.1",
                                      "check_thresholds": override})})
    errors = check_thresholds(cluster)
    assert len(errors) == 1 and errors[0].startswith("n1: check_thresholds.") and \
        words in errors[0], errors
    with pytest.raises(ThresholdError):
        Context(cluster).thresholds("n1")


def test_the_gpu_profile_follows_the_declared_model(lab):
    ctx = Context(lab)
    assert ctx.gpu_profile("gpu1")[0] == "H100"
    assert ctx.gpu_profile("head")[0] == "default"
    assert ctx.ib_floor("gpu1", 400) == 380 and ctx.ib_floor("gpu1", 123) is None


# -- deployed as the inventory says ---------------------------------------------------


def test_deployed_passes_on_the_record_of_this_inventory_and_fails_on_another(lab):
    ctx = Context(lab)
    probe = probe_of(nodes.probes(ctx), "nodes.deployed", "gpu1")
    roles = lab.hosts["gpu1"].roles()
    assert probe.read(done(record_text(roles))).status is Status.PASS
    fewer = {c: r for c, r in roles.items() if c != "slurm"}
    bad = probe.read(done(record_text(fewer)))
    assert bad.status is Status.FAIL and "slurm not deployed" in bad.message
    moved = {**roles, "k3s": ["k3s_agents"]}
    assert "k3s roles" in probe.read(done(record_text(moved))).message
    never = probe.read(done("", rc=1, stderr="No such file"))
    assert never.status is Status.FAIL and "never deployed" in never.message


def test_versions_pass_as_pinned_and_fail_on_another(lab):
    ctx = Context(lab)
    probe = probe_of(nodes.probes(ctx), "nodes.versions", "gpu1")
    assert "slurmd -V" in probe.command and "/2.60.0/venv/bin/ray --version" in probe.command
    good = ("slurm=slurm-wlm 22.05.8\nray=ray, version 2.60.0\n"
            "ceph=ceph version 20.2.0 (0123abcd) tentacle (stable)\n")
    assert {r.status for r in probe.read(done(good))} == {Status.PASS}
    bad = probe.read(done(good.replace("22.05.8", "23.02.1").replace("2.60.0", "")))
    by = {r.check: r for r in bad}
    assert by["nodes.version_slurm"].status is Status.FAIL
    assert "23.02.1" in by["nodes.version_slurm"].message
    assert by["nodes.version_ray"].status is Status.FAIL
    assert by["nodes.version_ceph"].status is Status.PASS


# -- the run -------------------------------------------------------------------------


class FakeNodes:
    """A transport answering from a table: node -> (command part -> output)."""

    def __init__(self, answers, down=()):
        self.answers, self.down, self.calls = answers, set(down), []

    def __call__(self, node, command, limit):
        self.calls.append((node, command))
        if node in self.down:
            return Completed(255, "", "ssh: connect to host: No route to host", 0.01)
        for part, out in self.answers.items():
            if part in command:
                return Completed(0, out(node) if callable(out) else out, "", 0.01)
        return Completed(0, "", "", 0.01)


def test_an_unreachable_node_fails_once_and_is_checked_no_further(lab):
    cluster = two_nodes()
    fake = FakeNodes({"aicluster-check-reached": "aicluster-check-reached\n6.1.0\n",
                      "chronyc": fixture("chronyc-tracking-synced.txt"),
                      "/etc/aicluster/components":
                          lambda n: record_text(cluster.hosts[n].roles())},
                     down={"n2"})
    results = run(Context(cluster), fake, layers=("nodes",))
    by = {(r.check, r.where): r for r in results}
    assert by[("nodes.ssh", "n2")].status is Status.FAIL
    assert "No route to host" in by[("nodes.ssh", "n2")].message
    assert by[("nodes.checked", "n2")].status is Status.SKIP
    assert not [c for c in fake.calls if c[0] == "n2" and "chronyc" in c[1]]
    assert by[("nodes.time", "n1")].status is Status.PASS


def test_pair_checks_run_in_rounds_and_a_suspect_is_retested(monkeypatch):
    cluster = _validated({f"n{i}": ([], {"ssh_hostname": f"10.0.0.{i}"})
                          for i in range(1, 5)})

    def make(a, b):
        def read(c):
            return Result("t.pair", "FAIL" if "n3" in (a, b) else "PASS", pair=(a, b))
        return Probe("t.pair", "t", f"pair {a} {b}", read, pair=(a, b), server="srv")

    from aicluster.checks import plan as plan_module
    monkeypatch.setattr(plan_module, "plan", lambda ctx, layers: (
        [], [PairCheck("t.pair", "t", ctx.nodes(), make)]))
    monkeypatch.setattr("aicluster.checks.session.plan", plan_module.plan)
    fake = FakeNodes({"aicluster-check-reached": "aicluster-check-reached\n"})
    results = run(Context(cluster), fake, layers=())
    pairs = [r for r in results if r.check == "t.pair"]
    assert len([r for r in pairs if not r.details.get("retest")]) == 6  # every pair once
    # servers are started on the pair's second node, detached
    servers = [c for c in fake.calls if "setsid" in c[1]]
    assert len(servers) == len(pairs) and all("srv" in c[1] for c in servers)
    # n3 failed with everyone and passed with nobody: re-tested, and blamed
    retests = [r for r in pairs if r.details.get("retest")]
    assert {r.details.get("blamed") for r in retests} == {"n3"}
    assert drain.failures(results)["n3"] == ["t.pair"]


# -- drain ---------------------------------------------------------------------------


#: stacks.SINFO_COMMAND's output: node|state|user|time|reason.
SINFO = """n1|idle|Unknown|Unknown|none
n2|drained|root|2026-12-03T15:47:36|aicluster: stacks.slurmd
n3|drained*|ops|2026-12-01T09:00:00|replace DIMM (ticket 42)
n4|idle|Unknown|Unknown|none
n4|idle|Unknown|Unknown|none
"""


def test_drain_takes_out_failed_nodes_and_resumes_only_its_own():
    states = drain.parse_states(SINFO)
    assert states["n3"] == ("drained", "replace DIMM (ticket 42)")
    failed = {"n1": ["network.path_mtu"], "n3": ["gpu.count"]}
    to_drain, to_resume = drain.decide(states, failed, ["n1", "n2", "n3", "n4"])
    assert to_drain == {"n1": "aicluster: network.path_mtu"}  # n3: someone else's drain
    assert to_resume == ["n2"]  # ours, and it passes now; n3 not ours: untouched
    # still failing: stays drained, its reason brought up to date
    to_drain, to_resume = drain.decide(states, {"n2": ["stacks.slurmd"]}, ["n2"])
    assert to_drain == {} and to_resume == []
    to_drain, _ = drain.decide(states, {"n2": ["storage.nvme_usage"]}, ["n2"])
    assert to_drain == {"n2": "aicluster: storage.nvme_usage"}
    # a node not checked this run is never resumed
    assert drain.decide(states, {}, ["n1"]) == ({}, [])


# -- baseline ------------------------------------------------------------------------


def test_the_baseline_records_then_flags_a_node_below_the_fleet_median(tmp_path):
    path = tmp_path / "fleet.json"
    first = [Result("network.iperf3", "PASS", pair=(a, b), value=v, unit="Gb/s")
             for (a, b), v in ((("a", "b"), 95.0), (("c", "d"), 94.0), (("e", "f"), 96.0))]
    assert baseline.record(path, first) == 3
    later = [Result("network.iperf3", "PASS", pair=("a", "b"), value=94.5, unit="Gb/s"),
             Result("network.iperf3", "PASS", pair=("c", "d"), value=85.0, unit="Gb/s"),
             Result("storage.nvme_fio", "PASS", node="a", value=1.0, unit="ms")]
    flagged = baseline.compare(path, later)
    assert [(r.check, r.where, r.status.value) for r in flagged] == [
        ("baseline.network.iperf3", "c<->d", "WARN")]


# -- the command ---------------------------------------------------------------------


def test_check_refuses_bad_thresholds_before_touching_any_host(tmp_path, monkeypatch):
    from aicluster import cli

    inventory = tmp_path / "inv.py"
    inventory.write_text(
        "all = ([('n1', {'ssh_hostname': '10.0.0.1', "
        "'check_thresholds': {'network': {'iperf3_min_fraction': -1}}})], "
        "{'networks': {'management': {'subnet': '10.0.0.0/24'}}})\n")
    monkeypatch.setattr("aicluster.checks.session.transport_for",
                        lambda cluster: pytest.fail("a host was contacted"))
    result = CliRunner().invoke(cli.main, ["check", str(inventory)])
    assert result.exit_code == 2, result.output
    assert "n1: check_thresholds.network.iperf3_min_fraction" in result.output


def test_check_prints_the_table_writes_json_and_exits_by_the_worst(tmp_path, monkeypatch):
    from aicluster import cli

    cluster = load_cluster(LAB)
    fake = FakeNodes({"aicluster-check-reached": "aicluster-check-reached\n6.1.0\n",
                      "chronyc": fixture("chronyc-tracking-synced.txt"),
                      "/etc/aicluster/components":
                          lambda n: record_text(cluster.hosts[n].roles())})
    monkeypatch.setattr("aicluster.checks.session.transport_for", lambda c: fake)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli.main, ["check", LAB, "--quick", "--layer", "nodes",
                                           "--json", str(out), "--limit", "gpu1,head"])
    assert "nodes.time" in result.output and "PASS" in result.output
    document = json.loads(out.read_text())
    jsonschema.validate(document, json.loads(report.SCHEMA.read_text()))
    assert {r["node"] for r in document["results"]} == {"gpu1", "head"}
    # the versions answer nothing: pinned software missing is a FAIL, exit 1
    assert result.exit_code == 1
    assert any(r["check"] == "nodes.version_slurm" and r["status"] == "FAIL"
               for r in document["results"])


def test_local_checks_one_node_on_this_machine_without_ssh_or_pair_tests(monkeypatch,
                                                                          tmp_path):
    """--local NODE (Slurm's HealthCheckProgram on the node): NODE's own probes through
    the local transport, no SSH, no test with another node."""
    from aicluster import cli

    cluster = load_cluster(LAB)
    fake = FakeNodes({"aicluster-check-reached": "aicluster-check-reached\n6.1.0\n",
                      "chronyc": fixture("chronyc-tracking-synced.txt"),
                      "/etc/aicluster/components":
                          lambda n: record_text(cluster.hosts[n].roles())})
    monkeypatch.setattr("aicluster.checks.runner.local_transport", fake)
    monkeypatch.setattr("aicluster.checks.session.transport_for",
                        lambda c: pytest.fail("SSH was used"))
    out = tmp_path / "r.json"
    CliRunner().invoke(cli.main, ["check", LAB, "--quick", "--local", "gpu1",
                                  "--json", str(out)])
    document = json.loads(out.read_text())
    assert {r["node"] for r in document["results"]} == {"gpu1"}
    assert not [r for r in document["results"] if r["pair"]]
    assert {node for node, _ in fake.calls} == {"gpu1"}
