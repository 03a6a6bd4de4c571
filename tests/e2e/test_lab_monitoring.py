"""Monitoring on the lab in miniature (every component together on two nodes, node1
the monitoring host), so the whole stack is scraped at once (docs/components/
monitoring.md).

* Prometheus' targets API shows every target the inventory derives UP, and every
  blackbox probe succeeds; ``promtool check config`` and ``check rules`` pass on the
  files the deploy wrote; every rule group of the alert pack is loaded and healthy.
* Every dashboard panel's query returns data from this Prometheus, but for the panels
  whose data these machines cannot have (named, with the reason).
* The exporters, Prometheus and Alertmanager listen on the nodes' management
  addresses only, and base's firewall drops a request to them from an address outside
  the cluster networks while the same request from the cluster network is answered.
* Alerts reach a webhook (tests/e2e/alert_sink.py) and resolve: the watchdog; a node
  cut off (NodeDown); the dcgm-exporter STAND-IN flipped to a double-bit ECC error and
  an Xid 79 (GPU alerts); a node drained in Slurm (SlurmNodeDrained, with its reason);
  an OSD stopped (CephOsdDown). Clearing each resolves it. The faults overlap in time,
  so the wait is the longest ``for:`` of them (SlurmNodeDrained's 10 minutes) once, and
  node1 is drained by the module's first test, so the other tests run in that wait.

The GPUs, dcgm-exporter, k3s, MinIO and Ollama here are STAND-INs (tests/e2e/standins);
Prometheus, Alertmanager, the node and blackbox exporters are Debian's packages.
Shared with the other ``test_lab*.py`` modules; left converged.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from aicluster.common.settings import layered
from aicluster.components.monitoring import derive
from aicluster.components.monitoring.dashboards import dashboard_queries
from aicluster.inventory import load_cluster
from aicluster.testbed.state import host_veth_names
from tests.e2e.checks import slurm_nodes_back
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, alert_sink, run
from tests.e2e.standins import dcgm

#: The ports a node's exporters and the monitoring host's servers listen on.
PORTS = {9100: "node exporter", 9400: "dcgm-exporter (STAND-IN)", 9090: "Prometheus",
         9093: "Alertmanager", 9094: "Alertmanager's cluster port",
         9115: "blackbox exporter"}

#: Dashboard panels whose data these machines cannot have: (dashboard uid, panel title
#: pattern) -> why. Each is still run (it must parse and be answered).
NO_DATA_HERE = {
    ("aicluster-infiniband", ".*"): "no InfiniBand HCA in the testbed's nodes",
    ("aicluster-gpu-fleet", "(?i)xid.*"):
        "no Xid while the GPUs are healthy (the STAND-IN reports one when flipped)",
    ("aicluster-node", "(?i).*hwmon.*"): "no hardware sensors in the testbed's containers",
    ("aicluster-node", "Clock synchronised"):
        "the node exporter's timex collector fails in a systemd-nspawn container",
    ("aicluster-cluster-fitness", "Checks not passing"): "every check passes here",
    ("aicluster-node", "(?i).*(ipmi|power draw|inlet|fan).*"):
        "no BMC in the testbed's nodes (monitoring_ipmi is not set)",
    ("aicluster-storage", "(?i).*nfs.*"):
        "the nodes' kernel has no NFS client: nothing is mounted over NFS here",
    ("aicluster-storage", "(?i).*nvme.*(wear|spare|smart|temperature|critical).*"):
        "the testbed's NVMe drives are loop devices: no SMART log",
}


@pytest.fixture
def lab(lab):
    """The lab in miniature (tests/e2e/conftest.py), deployed."""
    return lab.deployed()


#: When node1 was drained in Slurm (the first test drains it, so that SlurmNodeDrained's
#: 10 minutes run while the other tests do; the alert test waits for it, then resumes).
_DRAINED: dict[str, float] = {}
DRAIN_REASON = "e2e: drained"


def _drain_node1(lab) -> float:
    if "at" not in _DRAINED:
        lab.ssh("node1", f"scontrol update nodename=node1 state=drain reason='{DRAIN_REASON}'")
        _DRAINED["at"] = time.time()
    return _DRAINED["at"]


@pytest.fixture(scope="module", autouse=True)
def _node1_resumed_at_the_end():
    yield
    if _DRAINED.pop("at", None) is not None:
        from aicluster import testbed as tb
        from tests.e2e.conftest import Testbed

        Testbed(tb.state.load_state()).ssh(
            "node1", "scontrol update nodename=node1 state=resume", check=False)


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(TESTBED_INVENTORY)


def _prometheus(cluster) -> str:
    node = derive.monitoring_hosts(cluster)[0]
    port = layered("monitoring", cluster.hosts[node].data)["monitoring_prometheus_port"]
    return f"http://{derive.node_address(cluster, node)}:{port}"


def _api(cluster, path: str, **params) -> dict:
    url = f"{_prometheus(cluster)}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=15) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def _query(cluster, expr: str) -> list[dict]:
    return _api(cluster, "query", query=expr)["result"]


def _wait(what: str, probe, timeout: float, every: float = 5):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        ok, last = probe()
        if ok:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s; last: {last}")


# ---------------------------------------------------------------------------
# Targets, files, rules
# ---------------------------------------------------------------------------


def test_every_target_is_up_and_every_probe_succeeds(lab, cluster):
    _drain_node1(lab)
    expected = {(job, url) for job, urls in derive.targets_by_job(cluster).items()
                for url in urls}

    def targets():
        active = _api(cluster, "targets", state="active")["activeTargets"]
        # Each target as the configuration names it (a probe: the address it probes).
        got = {(t["labels"]["job"], t["discoveredLabels"].get("__param_target")
                or t["discoveredLabels"]["__address__"]): t for t in active}
        down = {k: t.get("lastError") for k, t in got.items() if t["health"] != "up"}
        missing = sorted(expected - set(got))
        return not down and not missing and set(got) == expected, (down, missing)

    _wait("every target UP", targets, timeout=180)
    active = _api(cluster, "targets", state="active")["activeTargets"]
    probes_configured = sum(1 for t in active if t["labels"]["job"].startswith("blackbox"))
    print(f"Prometheus: {len(expected)} targets, every one UP: "
          + ", ".join(sorted({job for job, _ in expected})))

    def probes():
        failed = [r["metric"] for r in _query(cluster, "probe_success == 0")]
        return not failed, failed

    _wait("every blackbox probe succeeds", probes, timeout=120)
    count = len(_query(cluster, "probe_success"))
    assert count == probes_configured, (count, probes_configured)
    print(f"blackbox: {count} probes succeed (ICMP and don't-fragment ICMP per cluster "
          "network, TCP, HTTP, the k3s API over TLS)")


def test_the_deployed_files_check_and_every_rule_group_is_loaded(lab, cluster):
    node = derive.monitoring_hosts(cluster)[0]
    out = lab.ssh(node, "promtool check config /etc/prometheus/prometheus.yml && "
                        "promtool check rules /etc/prometheus/rules/aicluster/*.yml && "
                        "amtool check-config /etc/prometheus/alertmanager.yml")
    assert "FAILED" not in out, out
    groups = _api(cluster, "rules")["groups"]
    loaded = {g["name"] for g in groups}
    shipped = set()
    for name in derive.rule_files():
        text = (derive.RULES_SOURCE / name).read_text()
        shipped |= set(re.findall(r"^  - name: (\S+)", text, re.M))
    assert shipped <= loaded, sorted(shipped - loaded)
    bad = [(g["name"], r["name"], r.get("lastError")) for g in groups for r in g["rules"]
           if r.get("health") != "ok"]
    assert not bad, bad
    alerts = sum(1 for g in groups for r in g["rules"] if r["type"] == "alerting")
    print(f"rules: {len(loaded)} groups, {alerts} alerts, every rule healthy")


def _no_data_reason(uid: str, title: str) -> str | None:
    for (board, pattern), why in NO_DATA_HERE.items():
        if board == uid and re.fullmatch(pattern, title):
            return why
    return None


def test_the_check_results_reach_prometheus(lab, cluster):
    """``aicluster check --quick --publish`` writes its results into the monitoring
    host's textfile directory; the node exporter serves them and Prometheus has every
    result, none failed (what the cluster-fitness dashboard and AiclusterCheckFailed
    read)."""
    # Not the stacks layer: node1 is drained in Slurm meanwhile (the alert test's).
    proc = run([BIN / "aicluster", "check", TESTBED_INVENTORY, "--quick", "--layer", "nodes",
                "--layer", "network", "--layer", "storage", "--publish"],
               timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    def published():
        results = _query(cluster, "aicluster_check_status")
        return bool(results), results

    results = _wait("aicluster_check_status in Prometheus", published, timeout=90)
    failed = [r["metric"] for r in results if r["value"][1] == "0"]
    assert not failed, failed
    print(f"aicluster check --publish: {len(results)} results in Prometheus, none failed")


def test_every_dashboard_query_returns_data(lab, cluster):
    # Rates need two scrapes, recording rules an evaluation, after the check's results
    # came (the test above): a query without data is asked again for a minute.
    skipped = []
    queries = dashboard_queries()
    pending = []
    for uid, title, expr in queries:
        why = _no_data_reason(uid, title)
        if why:
            skipped.append(f"{uid} / {title}: {why}")
            _api(cluster, "query", query=expr)  # answered all the same
        else:
            pending.append((uid, title, expr))
    deadline = time.time() + 60
    while True:
        empty = [(u, t, e) for u, t, e in pending if not _query(cluster, e)]
        if not empty or time.time() > deadline:
            break
        pending = empty
        time.sleep(10)
    for line in skipped:
        print(f"SKIP (no data here) {line}")
    assert not empty, "\n".join(f"{u} / {t}: {e}" for u, t, e in empty)
    print(f"dashboards: {len(queries) - len(skipped)} of {len(queries)} panel queries "
          f"return data; {len(skipped)} cannot here (above)")


# ---------------------------------------------------------------------------
# Listening addresses and the firewall
# ---------------------------------------------------------------------------


def test_exporters_and_servers_listen_on_the_management_address_only(lab, cluster):
    for node in lab.nodes:
        name, address = node["name"], derive.node_address(cluster, node["name"])
        out = lab.ssh(name, "ss -ltnH")
        seen = {}
        for line in out.splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            host, _, port = fields[3].rpartition(":")
            if port.isdigit() and int(port) in PORTS:
                seen.setdefault(int(port), set()).add(host.strip("[]"))
        assert 9100 in seen and 9400 in seen, (name, seen)
        for port, hosts in seen.items():
            assert hosts == {address}, (name, PORTS[port], hosts)
        print(f"{name}: " + ", ".join(f"{PORTS[p]} on {address}:{p}" for p in sorted(seen)))


def test_the_firewall_drops_the_exporters_outside_the_cluster_networks(lab, cluster):
    """From node2, a request to node1's node exporter from the cluster network is
    answered; the same request from an address outside every cluster network (added
    to node2's management interface for the test) is dropped by base's nftables."""
    target = derive.node_address(cluster, "node1")
    outside = "192.0.2.12"  # TEST-NET-1: in no cluster network
    iface = lab.ssh("node2", f"ip -o route get {target} | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p'"
                    ).strip()
    url = f"http://{target}:9100/metrics"
    assert "node_exporter_build_info" in lab.ssh("node2", f"curl -sf --max-time 5 {url}")
    lab.ssh("node2", f"ip addr add {outside}/32 dev {iface}")
    try:
        rc = lab.ssh("node2", f"curl -s -o /dev/null --max-time 5 --interface {outside} {url}; "
                              "echo rc=$?", check=False)
    finally:
        lab.ssh("node2", f"ip addr del {outside}/32 dev {iface}", check=False)
    assert "rc=28" in rc, rc  # timed out: dropped, not refused
    print(f"firewall: node1's node exporter answers node2 from the cluster network and "
          f"drops it from {outside} (curl timed out)")


# ---------------------------------------------------------------------------
# Alerts, end to end
# ---------------------------------------------------------------------------

#: How long an alert may take beyond its ``for:``: the textfile's minute, a scrape and
#: an evaluation (15 s each), Alertmanager's group_wait (10 s here) and slack.
SLACK = 120


def _osd_on(lab, node: str) -> str:
    out = lab.ssh(node, "ls /var/lib/ceph/osd/")
    ids = re.findall(r"ceph-(\d+)", out)
    assert ids, out
    return ids[0]


def _link(name: str, up: bool) -> None:
    subprocess.run(["ip", "link", "set", name, "up" if up else "down"], check=True)


def test_alerts_reach_the_webhook_and_resolve(lab, cluster):
    sink = alert_sink()
    sink.wait("Watchdog", "firing", 0, timeout=90)
    print("webhook: the watchdog arrives (the pipeline works)")

    osd = _osd_on(lab, "node2")
    cut = host_veth_names("node2")[0]
    drained = _drain_node1(lab)
    try:
        _faults_raise_and_clear(lab, sink, drained, osd, cut)
    finally:  # the lab left as the other modules expect it, whatever happened
        _link(cut, up=True)
        dcgm.set_state(lab.testbed, "node1", "healthy")
        lab.ssh("node2", f"systemctl start ceph-osd@{osd}", check=False)
        slurm_nodes_back(lab.testbed, "node1")


def _faults_raise_and_clear(lab, sink, drained: float, osd: str, cut: str) -> None:
    faults = time.time()
    dcgm.set_state(lab.testbed, "node1", "ecc-dbe-xid79")
    lab.ssh("node2", f"systemctl stop ceph-osd@{osd}")
    _link(cut, up=False)
    try:
        down = sink.wait("NodeDown", "firing", faults, timeout=120 + SLACK, node="node2")
        print(f"NodeDown node2 after {down.at - faults:.0f} s (for: 2m)")
    finally:
        _link(cut, up=True)
    sink.wait("NodeDown", "resolved", faults, timeout=SLACK, node="node2")
    print("NodeDown node2 resolved once its link was back")

    for name in ("GpuDoubleBitEccError", "GpuXidReboot"):
        got = sink.wait(name, "firing", faults, timeout=60 + SLACK, node="node1")
        print(f"{name} node1 after {got.at - faults:.0f} s: {got.annotations.get('summary')}")
    dcgm.set_state(lab.testbed, "node1", "healthy")
    cleared = time.time()
    sink.wait("GpuDoubleBitEccError", "resolved", cleared, timeout=SLACK, node="node1")
    print("GPU alerts resolved once the stand-in reported healthy again")

    osd_down = sink.wait("CephOsdDown", "firing", faults, timeout=300 + SLACK,
                         ceph_daemon=f"osd.{osd}")
    print(f"CephOsdDown osd.{osd} after {osd_down.at - faults:.0f} s (for: 5m)")
    lab.ssh("node2", f"systemctl start ceph-osd@{osd}")
    sink.wait("CephOsdDown", "resolved", osd_down.at, timeout=SLACK, ceph_daemon=f"osd.{osd}")
    print(f"CephOsdDown osd.{osd} resolved once it was started again")

    alert = sink.wait("SlurmNodeDrained", "firing", drained,
                      timeout=max(0, drained + 600 + SLACK - time.time()), slurm_node="node1")
    assert alert.labels.get("reason") == DRAIN_REASON, alert.labels
    print(f"SlurmNodeDrained node1 {alert.at - drained:.0f} s after its drain (for: 10m), "
          f"reason {alert.labels['reason']!r}")
    lab.ssh("node1", "scontrol update nodename=node1 state=resume")
    _DRAINED.pop("at", None)
    sink.wait("SlurmNodeDrained", "resolved", alert.at, timeout=SLACK, slurm_node="node1")
    print("SlurmNodeDrained resolved once node1 was resumed")
