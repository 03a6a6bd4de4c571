"""The check runner's core (src/aicluster/checks): results and the exit code, pair
rounds, probes run in parallel with hard limits (real processes on this machine), and
the output formats (the JSON against its schema, JUnit XML, the Prometheus textfile)."""

from __future__ import annotations

import itertools
import json
import time
import xml.etree.ElementTree as ET

import jsonschema
import pytest

from aicluster.checks import report
from aicluster.checks.result import Action, Result, Status, exit_code, worst_first
from aicluster.checks.runner import Completed, Probe, local_transport, run_probes
from aicluster.checks.schedule import retest_pairs, rounds, suspects_after_retest


def test_a_result_names_one_node_or_one_pair():
    with pytest.raises(ValueError):
        Result("x", Status.PASS)
    with pytest.raises(ValueError):
        Result("x", Status.PASS, node="a", pair=("a", "b"))
    assert Result("x", "PASS", pair=("a", "b")).where == "a<->b"


@pytest.mark.parametrize("statuses,code", [
    ([], 0),
    (["PASS", "WARN", "SKIP"], 0),
    (["PASS", "ERROR"], 3),
    (["ERROR", "FAIL"], 1),
    (["PASS", "TIMEOUT"], 1),
])
def test_the_exit_code(statuses, code):
    assert exit_code([Result("c", s, node="n") for s in statuses]) == code


def test_worst_first():
    results = [Result("c", s, node="n") for s in ("PASS", "SKIP", "WARN", "FAIL", "TIMEOUT")]
    assert [r.status.value for r in worst_first(results)] == [
        "FAIL", "TIMEOUT", "WARN", "SKIP", "PASS"]


@pytest.mark.parametrize("n", range(2, 12))
def test_rounds_cover_every_pair_once_with_no_node_twice_in_a_round(n):
    nodes = [f"node{i}" for i in range(n)]
    plan = rounds(nodes)
    assert len(plan) == (n - 1 if n % 2 == 0 else n)  # linear in n
    seen = [frozenset(p) for r in plan for p in r]
    assert sorted(map(sorted, seen)) == sorted(
        map(sorted, itertools.combinations(nodes, 2)))
    for r in plan:
        members = [x for p in r for x in p]
        assert len(members) == len(set(members))
    assert rounds(["only"]) == []


def test_a_failed_pair_is_retested_against_known_good_nodes():
    failed = [("n1", "n2")]
    passed = [("n3", "n4")]
    assert retest_pairs(failed, passed) == [("n1", "n3"), ("n2", "n4")]
    assert retest_pairs(failed, []) == []
    # n1 fails against a good node too, n2 passes: n1 is the one to blame.
    assert suspects_after_retest([(("n1", "n3"), False), (("n2", "n4"), True)]) == ["n1"]


def _probe(command, read=None, timeout=5.0, node="n1", check="c"):
    def default(done: Completed):
        return Result(check, Status.PASS if done.rc == 0 else Status.FAIL, node=node,
                      value=done.stdout.strip())

    return Probe(check, "test", command, read or default, timeout=timeout, node=node)


def test_a_hung_probe_ends_as_timeout_without_stalling_the_others():
    probes = [_probe("sleep 60", timeout=1, check="hangs")] + [
        _probe(f"echo {i}", check=f"quick{i}") for i in range(6)]
    start = time.monotonic()
    results = run_probes(probes, local_transport, workers=4)
    took = time.monotonic() - start
    assert took < 15, took  # the 60 s sleep was stopped at its 1 s limit (+ kill margin)
    by = {r.check: r for r in results}
    assert by["hangs"].status is Status.TIMEOUT
    assert "ran past 1 s" in by["hangs"].message and by["hangs"].action is Action.INVESTIGATE
    assert [by[f"quick{i}"].value for i in range(6)] == [str(i) for i in range(6)]
    assert all(by[f"quick{i}"].status is Status.PASS for i in range(6))


def test_a_probe_whose_output_cannot_be_read_is_an_error_not_a_traceback():
    def read(done):
        return Result("c", Status.PASS, node="n1", value=json.loads(done.stdout)["x"])

    [result] = run_probes([_probe("echo not-json", read=read)], local_transport)
    assert result.status is Status.ERROR
    assert "could not read the probe's output (JSONDecodeError" in result.message
    [failed] = run_probes([_probe("exit 3")], local_transport)
    assert failed.status is Status.FAIL


def _sample() -> list[Result]:
    return [
        Result("mtu", Status.FAIL, node="node2", layer="network", value=1500,
               threshold=9000, unit="bytes", message="fabric0: MTU 1500, declared 9000",
               action=Action.REDEPLOY),
        Result("iperf3", Status.PASS, pair=("node1", "node2"), layer="network",
               value=23.4, threshold=20.0, unit="Gbit/s", duration=10.2),
        Result("slurmd", Status.TIMEOUT, node="node1", layer="stacks", threshold=10.0,
               unit="s", message="node1: the probe ran past 10 s"),
        Result("gpu", Status.SKIP, node="node1", layer="gpus", message="no GPU declared"),
        Result("ceph", Status.ERROR, node="node1", layer="storage", message='odd "output"'),
    ]


def test_json_output_validates_against_the_schema():
    doc = json.loads(report.to_json(_sample()))
    jsonschema.validate(doc, json.loads(report.SCHEMA.read_text()))
    assert doc["counts"] == {"PASS": 1, "WARN": 0, "FAIL": 1, "TIMEOUT": 1, "SKIP": 1,
                             "ERROR": 1}
    assert doc["results"][0]["check"] == "mtu"  # worst first
    bad = dict(doc["results"][0], status="MAYBE")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"results": [bad], "counts": doc["counts"]},
                            json.loads(report.SCHEMA.read_text()))


def test_the_table_puts_the_worst_first_with_value_beside_threshold():
    lines = report.table(_sample()).splitlines()
    assert lines[0].split()[:5] == ["STATUS", "WHERE", "CHECK", "VALUE", "THRESHOLD"]
    assert lines[1].startswith("FAIL") and "1500 bytes" in lines[1] and "9000 bytes" in lines[1]
    assert lines[-1].startswith("PASS") and "node1<->node2" in lines[-1]


def test_junit_counts_failures_errors_and_skips():
    suite = ET.fromstring(report.junit(_sample()))
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"),
            suite.get("skipped")) == ("5", "2", "1", "1")
    names = [c.get("name") for c in suite.iter("testcase")]
    assert "iperf3 @ node1<->node2" in names


def test_the_prometheus_textfile():
    text = report.prometheus(_sample())
    assert ('aicluster_check_status{check="mtu",layer="network",where="node2",'
            'status="FAIL",action="redeploy"} 0') in text
    assert ('aicluster_check_value{check="iperf3",layer="network",where="node1<->node2",'
            'unit="Gbit/s"} 23.4') in text
    assert 'where="node1",status="SKIP"} 1' in text
    assert text.endswith("\n") and "# TYPE aicluster_check_status gauge" in text


def test_one_series_per_nic_or_port_in_the_textfile_and_junit():
    results = [Result("network.nic", "PASS", node="n1", details={"subject": "fabric0"}),
               Result("network.nic", "FAIL", node="n1", details={"subject": "storage0"})]
    series = [line.rsplit(" ", 1)[0] for line in report.prometheus(results).splitlines()
              if line.startswith("aicluster_check_duration_seconds")]
    assert len(series) == len(set(series)) == 2
    names = [c.get("name") for c in ET.fromstring(report.junit(results))]
    assert names == ["network.nic @ n1 (fabric0)", "network.nic @ n1 (storage0)"]
