"""The monitoring layer of `aicluster check` (src/aicluster/checks/monitoring.py).

Its client runs here for real (python3, against a local HTTP server) on what Debian 12's
Prometheus 2.42 and Alertmanager 0.25 answered on the lab in miniature
(tests/fixtures/check/monitoring/, captured 2026-12-03 with curl on node1 after a
deploy of every component). Variants of those answers (a target down, a rule missing,
an alert firing, a newer Prometheus' labels, a clustered pair) are made from the capture
in the tests, and said so. Grafana's /api/health is Grafana's documented answer (HTTP
API, "Health API"): no Grafana runs here.
"""

from __future__ import annotations

import copy
import dataclasses
import http.server
import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from aicluster.checks import drain, monitoring
from aicluster.checks.context import Context
from aicluster.checks.plan import LAYERS
from aicluster.checks.result import Action, Result, Status
from aicluster.checks.runner import Completed, Probe, local_transport, run_probes
from aicluster.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "check" / "monitoring"


def fixture(name: str) -> dict | list:
    return json.loads((FIXTURES / name).read_text())


# ---------------------------------------------------------------------------
# What is planned where
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab():
    return load_cluster(ROOT / "inventories" / "lab.py")


def test_the_layer_is_planned_after_the_stacks():
    assert LAYERS[-1] == "monitoring"


def test_the_lab_plans_every_check_on_its_monitoring_host(lab):
    probes = monitoring.probes(Context(lab))
    assert sorted(p.check for p in probes) == [
        "monitoring.alertmanager", "monitoring.alerts", "monitoring.grafana",
        "monitoring.rules", "monitoring.targets"]
    assert {p.node for p in probes} == {"head"}
    for p in probes:
        subprocess.run(["sh", "-n", "-c", p.command], check=True)
        # Within the quick tier: two intervals (15 s) and a little, then the requests.
        assert p.timeout <= 70


def test_a_limited_run_asks_the_monitoring_host_about_the_nodes_checked_only(lab):
    probes = monitoring.probes(Context(lab, "quick", ("gpu1",)))
    [targets] = probes
    assert targets.check == "monitoring.targets" and targets.node == "head"
    assert targets.read.args[2] == ["gpu1"]


def test_nothing_is_planned_without_a_monitoring_host(lab):
    bare = dataclasses.replace(
        lab, groups={g: m for g, m in lab.groups.items() if g != "monitoring"})
    assert monitoring.probes(Context(bare)) == []


def test_each_node_of_the_lab_has_its_exporters_and_probes_as_targets(lab):
    expected = monitoring.expected_targets(lab, "head")
    by_node: dict[str, set] = {}
    for t in expected:
        by_node.setdefault(t["node"], set()).add(t["job"])
    assert set(by_node) == set(lab.hosts)
    assert {"node", "dcgm", "ray", "blackbox_icmp"} <= by_node["gpu1"]
    assert {"node", "prometheus", "alertmanager", "blackbox_tcp"} <= by_node["head"]
    assert all(t["what"] for t in expected)
    # One key per target: the job, the address, the probe's module.
    keys = [(t["job"], t["address"], t["module"]) for t in expected]
    assert len(keys) == len(set(keys))


def test_the_monitoring_layer_never_drains_a_node():
    results = [Result("monitoring.targets", Status.FAIL, node="node2", layer="monitoring"),
               Result("stacks.slurmd", Status.FAIL, node="node1", layer="stacks")]
    assert drain.failures(results) == {"node1": ["stacks.slurmd"]}


# ---------------------------------------------------------------------------
# The client, against a local server answering with the captured bodies
# ---------------------------------------------------------------------------


class _Server:
    """Answers GET <path> with ``routes[path]`` (a body, or a callable taking the number
    of the request to that path and returning one); 404 elsewhere."""

    def __init__(self, routes: dict):
        self.routes, self.asked = routes, {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                route = outer.routes.get(self.path)
                n = outer.asked[self.path] = outer.asked.get(self.path, 0) + 1
                body = route(n) if callable(route) else route
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(404 if route is None else 200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    started = []

    def start(routes: dict) -> str:
        started.append(_Server(routes))
        return started[-1].address

    yield start
    for s in started:
        s.close()


pytestmark = pytest.mark.skipif(shutil.which("python3") is None, reason="python3")

TARGETS = "/api/v1/targets?state=active"
PROBES = "/api/v1/query?query=probe_success"
#: node2's fabric MTU set to 1500 on the lab: its full-MTU ping fails, the rest succeed.
PROBES_MTU = "prometheus-2.42-probe-success-node2-mtu1500.json"


def probes_ok() -> dict:
    """Captured on the lab after a deploy: every probe succeeding."""
    return fixture("prometheus-2.42-probe-success.json")


def prometheus_answering(serve, targets: dict | None = None, probes: dict | None = None,
                         **routes) -> str:
    return serve({TARGETS: targets or fixture("prometheus-2.42-targets.json"),
                  PROBES: probes or probes_ok(), **routes})
WATCHDOG = "/api/v2/alerts?filter=alertname%3D%22Watchdog%22"


def run(what: str, read, wait: float = 0, **servers: str) -> list[Result]:
    probe = Probe(f"monitoring.{what}", "monitoring",
                  monitoring.client_command(what, servers, wait), read, timeout=60,
                  node="node1")
    return run_probes([probe], local_transport)


def lab_targets(*keep: str) -> list[dict[str, str]]:
    """What the lab in miniature's inventory derives for node1's Prometheus, for the
    targets named (job:address[:module]) — as monitoring.expected_targets makes them."""
    out = []
    for name in keep:
        job, _, rest = name.partition(":")
        address, module, probe = rest, "", ""
        if job.startswith("blackbox"):
            address, _, module = rest.rpartition("|")
            probe = "icmp_df" if module.startswith("icmp_df") else (
                "icmp" if module == "icmp" else "")
        node = "node2" if "10.213.0.12" in address or "10.213.1.12" in address else "node1"
        out.append({"job": job, "address": address, "module": module, "probe": probe,
                    "node": node, "what": f"{job} {address} {probe}".strip()})
    return out


EXPECTED = lab_targets(
    "node:10.213.0.11:9100", "node:10.213.0.12:9100", "prometheus:10.213.0.11:9090",
    "dcgm:10.213.0.12:9400", "ceph:10.213.0.11:9283",
    "blackbox_icmp:10.213.1.12|icmp_df_fabric", "blackbox_icmp:10.213.1.12|icmp",
    "blackbox_http:https://10.213.0.11:6443/readyz|k3s_api",
    "blackbox_tcp:10.213.0.11:6817|tcp_connect")


def with_target(body: dict, address: str, **changes) -> dict:
    out = copy.deepcopy(body)
    for t in out["data"]["activeTargets"]:
        if address in (t["discoveredLabels"].get("__param_target"),
                       t["discoveredLabels"]["__address__"]):
            t.update(changes)
    return out


def test_every_target_of_the_capture_up_passes_per_node(serve):
    prometheus = prometheus_answering(serve)
    results = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1", "node2"], 0, done), prometheus=prometheus)
    assert [(r.node, r.status, r.value, r.threshold) for r in results] == [
        ("node1", Status.PASS, 5, 5), ("node2", Status.PASS, 4, 4)]
    assert results[0].details["subject"] == "prometheus on node1"


def test_a_newer_prometheus_discovered_labels_are_read_the_same(serve):
    # Variant of the capture: Prometheus 2.43 on shows a probe's discovered labels as
    # discovered (its __address__ the target, no __param_target).
    body = fixture("prometheus-2.42-targets.json")
    for t in body["data"]["activeTargets"]:
        target = t["discoveredLabels"].pop("__param_target", None)
        if target:
            t["discoveredLabels"]["__address__"] = target
    prometheus = prometheus_answering(serve, targets=body)
    results = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1", "node2"], 0, done), prometheus=prometheus)
    assert [r.status for r in results] == [Status.PASS, Status.PASS]


def test_an_exporter_down_fails_its_node_with_the_scrape_error(serve):
    # Captured on the lab with node2's node exporter stopped.
    body = fixture("prometheus-2.42-targets-node2-exporter-stopped.json")
    prometheus = prometheus_answering(serve, targets=body)
    results = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1", "node2"], 0, done), prometheus=prometheus)
    node1, node2 = results
    assert node1.status is Status.PASS
    assert node2.status is Status.FAIL and node2.action is Action.RESTART_SERVICE
    assert node2.value == 3 and node2.threshold == 4
    assert "node2: down in the Prometheus on node1: node 10.213.0.12:9100" in node2.message
    assert node2.details["down"] == [{
        "job": "node", "target": "10.213.0.12:9100",
        "error": 'Get "http://10.213.0.12:9100/metrics": dial tcp 10.213.0.12:9100: '
                 "connect: connection refused"}]


def test_a_failed_probe_is_down_though_the_blackbox_exporter_answered(serve):
    # Captured on the lab with node2's fabric MTU at 1500: every target up (the blackbox
    # exporter answers), the full-MTU ping's probe_success 0.
    prometheus = prometheus_answering(serve, probes=fixture(PROBES_MTU))
    [node1, node2] = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1", "node2"], 0, done), prometheus=prometheus)
    assert node1.status is Status.PASS
    assert node2.status is Status.FAIL and node2.action is Action.INVESTIGATE
    assert node2.details["down"] == [{"job": "blackbox_icmp", "target": "10.213.1.12",
                                      "error": "the probe failed (probe_success 0)"}]
    assert "blackbox_icmp 10.213.1.12 icmp_df (10.213.1.12): the probe failed" in node2.message


def test_a_probe_without_probe_success_is_down(serve):
    body = probes_ok()
    body["data"]["result"] = [r for r in body["data"]["result"]
                              if r["metric"].get("service") != "k3s_api"]
    prometheus = prometheus_answering(serve, probes=body)
    [node1, _] = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1", "node2"], 0, done), prometheus=prometheus)
    assert node1.status is Status.FAIL
    assert node1.details["down"][0]["error"] == "no probe_success from its scrape"


def test_a_target_prometheus_does_not_have_asks_for_a_deploy(serve):
    # What the deploy once reported a success over: Prometheus running the package's
    # example configuration (it scrapes itself and the local node exporter only).
    body = fixture("prometheus-2.42-targets.json")
    body["data"]["activeTargets"] = [
        t for t in body["data"]["activeTargets"] if t["scrapePool"] != "blackbox_icmp"]
    prometheus = prometheus_answering(serve, targets=body)
    [node1, node2] = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1", "node2"], 0, done), prometheus=prometheus)
    assert node1.status is Status.PASS
    assert node2.status is Status.FAIL and node2.action is Action.REDEPLOY
    assert "does not scrape" in node2.message and "deploy again" in node2.message
    assert node2.details["absent"] == ["blackbox_icmp 10.213.1.12"] * 2


def test_the_client_waits_for_the_next_scrape_and_judges_that(serve):
    # The deploy just restarted node2's exporter: down at the first read, scraped again
    # (a later lastScrape) and up at the second.
    first = with_target(fixture("prometheus-2.42-targets.json"), "10.213.0.12:9100",
                        health="down", lastError="connection refused")
    later = copy.deepcopy(fixture("prometheus-2.42-targets.json"))
    for t in later["data"]["activeTargets"]:
        t["lastScrape"] = "2026-12-03T22:13:00Z"
    prometheus = prometheus_answering(serve, **{TARGETS: lambda n: first if n == 1 else later})
    results = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1", "node2"], 20, done), wait=20, prometheus=prometheus)
    assert [r.status for r in results] == [Status.PASS, Status.PASS]


def test_a_target_not_scraped_again_within_the_wait_is_a_warning(serve):
    prometheus = prometheus_answering(serve)
    results = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1"], 1, done), wait=1, prometheus=prometheus)
    [node1] = results
    assert node1.status is Status.WARN and node1.action is Action.INVESTIGATE
    assert "has not scraped" in node1.message and "last: 2026-12-03T" in node1.message


def test_prometheus_not_answering_fails_on_the_monitoring_host():
    [result] = run("targets", lambda done: monitoring.judge_targets(
        EXPECTED, "node1", ["node1", "node2"], 0, done), prometheus="127.0.0.1:1")
    assert result.status is Status.FAIL and result.node == "node1"
    assert result.action is Action.RESTART_SERVICE
    assert result.message.startswith("node1: Prometheus does not answer: 127.0.0.1:1:")


def test_a_tool_missing_on_the_node_is_an_error_naming_it():
    done = Completed(127, "", "aicluster-missing: python3\n", 0.1)
    [result] = monitoring.judge_targets(EXPECTED, "node1", ["node1"], 0, done)
    assert result.status is Status.ERROR and "python3 is not installed" in result.message


# -- rules ------------------------------------------------------------------


def test_the_loaded_alert_pack_passes(serve):
    prometheus = serve({"/api/v1/rules": fixture("prometheus-2.42-rules.json")})
    [result] = run("rules", lambda done: monitoring.judge_rules("node1", done),
                   prometheus=prometheus)
    alerts, records = monitoring.pack()
    assert result.status is Status.PASS, result.message
    assert result.value == result.threshold == len(alerts) + len(records)
    assert "Watchdog" in alerts and "NodeDown" in alerts


def test_a_rule_missing_or_failing_is_named(serve):
    body = fixture("prometheus-2.42-rules.json")
    group = body["data"]["groups"][0]
    dropped = group["rules"].pop(0)["name"]
    prometheus = serve({"/api/v1/rules": body})
    [result] = run("rules", lambda done: monitoring.judge_rules("node1", done),
                   prometheus=prometheus)
    assert result.status is Status.FAIL and result.action is Action.REDEPLOY
    assert dropped in result.message and result.details["missing"] == [dropped]

    body = fixture("prometheus-2.42-rules.json")
    rule = body["data"]["groups"][0]["rules"][0]
    rule.update(health="err", lastError="many-to-many matching not allowed")
    prometheus = serve({"/api/v1/rules": body})
    [result] = run("rules", lambda done: monitoring.judge_rules("node1", done),
                   prometheus=prometheus)
    assert result.status is Status.FAIL and result.action is Action.INVESTIGATE
    assert f"{rule['name']}: many-to-many matching not allowed" in result.message


# -- Alertmanager -----------------------------------------------------------


def alerting(serve, status=None, managers=None, watchdog=None) -> dict[str, str]:
    am = serve({"/api/v2/status": status or fixture("alertmanager-0.25-status.json"),
                WATCHDOG: fixture("alertmanager-0.25-alerts-watchdog.json")
                if watchdog is None else watchdog})
    prometheus = serve({"/api/v1/alertmanagers": managers
                        or fixture("prometheus-2.42-alertmanagers.json")})
    return {"alertmanager": am, "prometheus": prometheus}


def test_alertmanager_receiving_the_watchdog_passes(serve):
    servers = alerting(serve)
    [result] = run("alertmanager", lambda done: monitoring.judge_alertmanager(
        "node1", ["10.213.0.11:9093"], ["10.213.0.11:9094"], done), **servers)
    assert result.status is Status.PASS, result.message
    assert result.details["watchdog"] == 1 and result.details["version"] == "0.25.0"


def test_no_watchdog_in_alertmanager_means_alerts_are_not_delivered(serve):
    servers = alerting(serve, watchdog=[])
    [result] = run("alertmanager", lambda done: monitoring.judge_alertmanager(
        "node1", ["10.213.0.11:9093"], ["10.213.0.11:9094"], done), **servers)
    assert result.status is Status.FAIL and result.action is Action.INVESTIGATE
    assert "Watchdog" in result.message and "not delivered" in result.message


def test_prometheus_not_sending_to_every_alertmanager_asks_for_a_deploy(serve):
    servers = alerting(serve)
    [result] = run("alertmanager", lambda done: monitoring.judge_alertmanager(
        "node1", ["10.213.0.11:9093", "10.213.0.12:9093"],
        ["10.213.0.11:9094", "10.213.0.12:9094"], done), **servers)
    assert result.status is Status.FAIL and result.action is Action.REDEPLOY
    assert "10.213.0.12:9093" in result.message


def test_a_pair_that_does_not_gossip_fails_and_one_that_does_passes(serve):
    # Variants of the capture: Prometheus sending to both, the status of a pair.
    managers = fixture("prometheus-2.42-alertmanagers.json")
    managers["data"]["activeAlertmanagers"].append(
        {"url": "http://10.213.0.12:9093/api/v2/alerts"})
    both = ["10.213.0.11:9093", "10.213.0.12:9093"]
    peers = ["10.213.0.11:9094", "10.213.0.12:9094"]
    servers = alerting(serve, managers=managers)  # the capture's: gossip disabled
    [result] = run("alertmanager", lambda done: monitoring.judge_alertmanager(
        "node1", both, peers, done), **servers)
    assert result.status is Status.FAIL and "not one cluster" in result.message
    assert "gossip disabled, 0 of 2 peers" in result.message

    status = fixture("alertmanager-0.25-status.json")
    status["cluster"] = {"status": "ready", "name": "01J", "peers": [
        {"name": "01J", "address": "10.213.0.11:9094"},
        {"name": "01K", "address": "10.213.0.12:9094"}]}
    servers = alerting(serve, status=status, managers=managers)
    [result] = run("alertmanager", lambda done: monitoring.judge_alertmanager(
        "node1", both, peers, done), **servers)
    assert result.status is Status.PASS and "2 peers" in result.message


# -- firing alerts ----------------------------------------------------------


def test_pending_alerts_are_not_firing(serve):
    body = fixture("prometheus-2.42-alerts.json")
    assert {a["state"] for a in body["data"]["alerts"]} == {"pending", "firing"}
    prometheus = serve({"/api/v1/alerts": body})
    [result] = run("alerts", lambda done: monitoring.judge_alerts("node1", done),
                   prometheus=prometheus)
    assert result.status is Status.PASS and result.value == 0


def test_firing_alerts_are_a_warning_naming_each(serve):
    # Variant of the capture: MountMissing (node2's NFS mount, which its kernel cannot
    # make on the testbed) past its 5 minutes.
    body = fixture("prometheus-2.42-alerts.json")
    for a in body["data"]["alerts"]:
        a["state"] = "firing"
    prometheus = serve({"/api/v1/alerts": body})
    [result] = run("alerts", lambda done: monitoring.judge_alerts("node1", done),
                   prometheus=prometheus)
    assert result.status is Status.WARN and result.value == 1
    assert "MountMissing (critical, node2)" in result.message
    assert "Watchdog" not in result.message


# -- Grafana ----------------------------------------------------------------

#: Grafana's documented answer to GET /api/health (HTTP API reference, "Health API").
GRAFANA_HEALTH = {"commit": "087143285", "database": "ok", "version": "12.0.2"}


@pytest.mark.parametrize("answer, status, action", [
    (GRAFANA_HEALTH, Status.PASS, Action.NONE),
    ({**GRAFANA_HEALTH, "database": "failing"}, Status.FAIL, Action.RESTART_SERVICE),
    ({**GRAFANA_HEALTH, "version": "11.6.1"}, Status.FAIL, Action.REDEPLOY),
])
def test_grafana_health(serve, answer, status, action):
    grafana = serve({"/api/health": answer})
    [result] = run("grafana", lambda done: monitoring.judge_grafana("node1", "12.0.2", done),
                   grafana=grafana)
    assert (result.status, result.action) == (status, action), result.message
