"""Monitoring: the monitoring component watches the cluster, each monitoring host's
Prometheus, Alertmanager and Grafana asked over their own HTTP APIs (quick).

- ``monitoring.targets``: every target the inventory derives for a monitoring host's
  Prometheus (``derive.scrape_configs``: each node's exporters, the services' probes,
  the ICMP probes of every cluster network) is scraped there and up, one result per
  node the targets are about, judged on scrapes made since the probe began (the probe
  waits for each target's next scrape, within two intervals): an exporter answers, a
  service's probe or a ping succeeds (``probe_success``: a probe's target is up
  whenever the blackbox exporter answers). A target Prometheus does not have means its
  configuration is not the deploy's (the example configuration of the package, a run
  that stopped); a target down names its last scrape error.
- ``monitoring.rules``: every alert and recording rule of the alert pack
  (roles/monitoring/files/rules) is loaded and evaluates without an error.
- ``monitoring.alertmanager``: the host's Alertmanager answers, its Prometheus sends to
  every monitoring host's Alertmanager, and the Watchdog alert (it always fires) has
  reached it: alerts are delivered. Two monitoring hosts: the pair is one gossip
  cluster (each Alertmanager sees both peers), or every notification goes out twice.
- ``monitoring.alerts``: the alerts firing now, but Watchdog: a WARN that names them
  (each is the monitoring component's finding, and the other layers prove or refute
  it); a PASS when none fires.
- ``monitoring.grafana``: where the host runs Grafana, its health endpoint answers with
  its database ok at the pinned version.

Every request is made on the monitoring host (its servers listen on its monitoring
address only) by the node's python3, standard library only, without any proxy. Nothing
here drains a node (``--drain``): a node that is not watched still runs jobs.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from functools import cache, partial

import yaml

from aicluster.checks.context import Context
from aicluster.checks.result import Action, Result, Status
from aicluster.checks.runner import Completed, Probe
from aicluster.checks.stacks import cannot_run, need
from aicluster.components.monitoring import derive

LAYER = "monitoring"

MARK = "aicluster-monitoring"
#: The longest a probe waits for Prometheus to scrape a target again or to send an
#: alert (seconds): its scrape and evaluation intervals decide, up to this.
MAX_WAIT = 45
#: Seconds each HTTP request may take.
REQUEST_LIMIT = 10

#: The client, run with the node's python3: argv is one JSON object, ``what`` (targets,
#: rules, alertmanager, alerts, grafana), the servers' ``host:port`` (``prometheus``,
#: ``alertmanager``, ``grafana``), ``wait`` (seconds). It prints one JSON line after
#: :data:`MARK`: what it read, trimmed to what the judges use, or ``error``.
CLIENT = """\
import http.client, json, sys, time
spec = json.loads(sys.argv[1])
what, wait, limit = spec["what"], float(spec["wait"]), float(spec["limit"])
deadline = time.monotonic() + wait

class Failed(Exception):
    pass

def get(server, path):
    host, _, port = server.rpartition(":")
    try:
        conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=limit)
        conn.request("GET", path, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        raise Failed(f"{server}: {type(exc).__name__}: {exc}")
    if resp.status != 200:
        raise Failed(f"{server}{path.split('?')[0]}: HTTP {resp.status} {body.strip()[:200]}")
    try:
        return json.loads(body)
    except ValueError:
        raise Failed(f"{server}{path.split('?')[0]}: not JSON: {body.strip()[:200]}")

def again():
    if time.monotonic() >= deadline:
        return False
    time.sleep(2)
    return True

def found(target, label):
    # A probe's target: its discovered __address__ (Prometheus 2.43 on), or the
    # __param_target its relabelling set (the relabelled labels, up to 2.42).
    return target.get("discoveredLabels", {}).get(label, "")

def targets():
    first = None
    while True:
        got = get(spec["prometheus"], "/api/v1/targets?state=active")["data"]["activeTargets"]
        out = [{"job": t.get("scrapePool") or t.get("labels", {}).get("job", ""),
                "address": found(t, "__param_target") or found(t, "__address__"),
                "module": found(t, "__param_module"),
                "health": t.get("health", ""), "error": t.get("lastError", ""),
                "last": t.get("lastScrape", "")} for t in got]
        key = lambda t: (t["job"], t["address"], t["module"])
        # Judged on scrapes made since the probe began: each target's last scrape then
        # is waited past (Prometheus' health is its last scrape's, up to an interval old).
        if first is None:
            first = {key(t): t["last"] for t in out}
        waiting = [t for t in out if t["health"] not in ("up", "down")
                   or first.get(key(t)) == t["last"]]
        if not waiting or not again():
            # Not scraped again within the wait (a Prometheus that has stopped scraping):
            # judged on that last scrape, and named.
            for t in out:
                t["stale"] = wait > 0 and first.get(key(t)) == t["last"]
            # A probe's target is up when the blackbox exporter answered: whether the
            # probe itself succeeded is its probe_success, from that same scrape.
            got = get(spec["prometheus"], "/api/v1/query?query=probe_success")["data"]
            probes = [{"job": r["metric"].get("job", ""),
                       "instance": r["metric"].get("instance", ""),
                       "probe": r["metric"].get("probe", ""), "value": r["value"][1]}
                      for r in got["result"]]
            return {"targets": out, "probes": probes}

def rules():
    while True:
        groups = get(spec["prometheus"], "/api/v1/rules")["data"]["groups"]
        out = [{"name": r.get("name", ""), "type": r.get("type", ""),
                "health": r.get("health", ""), "error": r.get("lastError", ""),
                "group": g.get("name", "")} for g in groups for r in g.get("rules", [])]
        if all(r["health"] in ("ok", "err") for r in out) or not again():
            return {"rules": out}

def alertmanager():
    status = get(spec["alertmanager"], "/api/v2/status")
    cluster = status.get("cluster") or {}
    out = {"cluster": {"status": cluster.get("status", ""),
                       "peers": sorted(p.get("address", "") for p in cluster.get("peers") or [])},
           "version": (status.get("versionInfo") or {}).get("version", "")}
    managers = get(spec["prometheus"], "/api/v1/alertmanagers")["data"]
    out["sends_to"] = sorted(a.get("url", "") for a in managers.get("activeAlertmanagers", []))
    path = "/api/v2/alerts?filter=" + "alertname%3D%22Watchdog%22"
    while True:
        out["watchdog"] = len(get(spec["alertmanager"], path))
        if out["watchdog"] or not again():
            return out

def alerts():
    got = get(spec["prometheus"], "/api/v1/alerts")["data"]["alerts"]
    return {"alerts": [{"alertname": a.get("labels", {}).get("alertname", ""),
                        "severity": a.get("labels", {}).get("severity", ""),
                        "node": a.get("labels", {}).get("node", ""),
                        "instance": a.get("labels", {}).get("instance", ""),
                        "state": a.get("state", ""), "since": a.get("activeAt", "")}
                       for a in got]}

def grafana():
    got = get(spec["grafana"], "/api/health")
    return {"database": got.get("database", ""), "version": got.get("version", "")}

try:
    result = {"targets": targets, "rules": rules, "alertmanager": alertmanager,
              "alerts": alerts, "grafana": grafana}[what]()
except Failed as exc:
    result = {"error": str(exc)}
except (KeyError, TypeError, AttributeError) as exc:
    result = {"error": f"an answer not shaped as expected: {type(exc).__name__}: {exc}"}
print("aicluster-monitoring " + json.dumps(result))
"""


def client_command(what: str, servers: Mapping[str, str], wait: float) -> str:
    """The shell that runs :data:`CLIENT` on a monitoring host for ``what``."""
    spec = {"what": what, "wait": wait, "limit": REQUEST_LIMIT, **servers}
    return (need("python3") + "exec python3 -c " + shlex.quote(CLIENT) + " "
            + shlex.quote(json.dumps(spec, sort_keys=True)))


def _read(check: str, host: str, what: str, done: Completed) -> dict | Result:
    """The client's answer, or the result for a probe that could not run or for a
    server (``what``) that did not answer (the client's ``error``)."""
    failed = cannot_run(check, host, done, "a monitoring host")
    if failed:
        return failed
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK + " ")]
    if not lines:
        raise ValueError(f"no {MARK} line (exit {done.rc}): {done.stderr.strip()[-300:]}")
    got = json.loads(lines[-1][len(MARK) + 1:])
    if "error" in got:
        return Result(check, Status.FAIL, node=host, action=Action.RESTART_SERVICE,
                      message=f"{host}: {what} does not answer: {got['error']}",
                      details={"error": got["error"]})
    return got


# ---------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------

#: What each job scrapes, for the messages.
JOB_WHAT = {
    "node": "the node exporter",
    "dcgm": "dcgm-exporter",
    "ipmi": "the IPMI exporter",
    "prometheus": "Prometheus",
    "alertmanager": "Alertmanager",
    "ray": "Ray's metrics",
    "minio": "MinIO's cluster metrics",
    "ceph": "the Ceph manager's metrics",
}
#: The jobs whose target is a daemon on the node (its restart is the action); the
#: others are blackbox probes of a service or an address.
EXPORTERS = frozenset(JOB_WHAT)


def expected_targets(cluster, prober: str) -> list[dict[str, str]]:
    """Every target the Prometheus on ``prober`` scrapes (the deploy's scrape_configs):
    ``job``, ``address`` (what Prometheus discovers, before relabelling), ``module``
    (a probe's blackbox module), ``probe`` (its ``probe`` label: icmp or icmp_df, which
    tell two pings of one address apart in probe_success), ``node`` (the node it is
    about: the prober for a probe of an address outside the cluster) and ``what``, for
    the messages."""
    out = []
    for job in derive.scrape_configs(cluster, prober):
        for group in job["static_configs"]:
            labels = dict(group["labels"])
            module = labels.get("__param_module", "")
            for address in group["targets"]:
                if job["job_name"] in EXPORTERS:
                    what = JOB_WHAT[job["job_name"]]
                elif labels.get("probe") in ("icmp", "icmp_df"):
                    df = "full-MTU, do-not-fragment " if labels["probe"] == "icmp_df" else ""
                    what = f"the {df}ping of {address} on network {labels.get('network', '')}"
                else:
                    what = f"the {labels.get('service') or module} probe of {address}"
                out.append({"job": job["job_name"], "address": address, "module": module,
                            "probe": labels.get("probe", ""),
                            "node": labels.get("node") or prober, "what": what})
    return out


def judge_targets(expected: list[dict[str, str]], prober: str, nodes: list[str],
                  wait: float, done: Completed) -> list[Result]:
    """Per node of ``nodes`` with a target: every one of its targets scraped (within
    ``wait`` seconds) and up in the Prometheus on ``prober``."""
    check = "monitoring.targets"
    got = _read(check, prober, "Prometheus", done)
    if isinstance(got, Result):
        return [got]
    active = {(t["job"], t["address"], t["module"]): t for t in got["targets"]}
    probed = {(p["job"], p["instance"], p["probe"]): p["value"] for p in got["probes"]}
    subject = f"prometheus on {prober}"
    results = []
    for node in nodes:
        mine = [t for t in expected if t["node"] == node]
        if not mine:
            continue
        absent, down, unscraped = [], [], []
        for t in mine:
            seen = active.get((t["job"], t["address"], t["module"]))
            if seen is None:
                absent.append(t)
            elif seen["health"] == "down":
                down.append({**t, "error": seen["error"]})
            elif t["module"] and probed.get((t["job"], t["address"], t["probe"])) != "1":
                value = probed.get((t["job"], t["address"], t["probe"]))
                down.append({**t, "error": "the probe failed (probe_success 0)" if value
                             else "no probe_success from its scrape"})
            elif seen["health"] != "up" or seen.get("stale"):
                unscraped.append({**t, "last": seen.get("last") or "never"})
        up = len(mine) - len(absent) - len(down) - len(unscraped)
        details = {"subject": subject, "monitoring_host": prober,
                   "absent": [f"{t['job']} {t['address']}" for t in absent],
                   "down": [{"job": t["job"], "target": t["address"], "error": t["error"]}
                            for t in down],
                   "unscraped": [f"{t['job']} {t['address']}" for t in unscraped]}
        common = {"node": node, "value": up, "threshold": len(mine), "unit": "targets up",
                  "details": details}
        if absent:
            results.append(Result(
                check, Status.FAIL, action=Action.REDEPLOY, **common,
                message=f"{node}: the Prometheus on {prober} does not scrape "
                        + "; ".join(f"{t['what']} ({t['job']} {t['address']})" for t in absent)
                        + ": its configuration is not the deploy's: deploy again"))
        elif down:
            exporter = any(t["job"] in EXPORTERS for t in down)
            results.append(Result(
                check, Status.FAIL,
                action=Action.RESTART_SERVICE if exporter else Action.INVESTIGATE, **common,
                message=f"{node}: down in the Prometheus on {prober}: "
                        + "; ".join(f"{t['what']} ({t['address']}): "
                                    f"{t['error'] or 'no error given'}" for t in down)))
        elif unscraped:
            results.append(Result(
                check, Status.WARN, action=Action.INVESTIGATE, **common,
                message=f"{node}: the Prometheus on {prober} has not scraped "
                        + "; ".join(f"{t['what']} (last: {t['last']})" for t in unscraped)
                        + f" during the check's {wait} s (just started, or it has stopped "
                          "scraping: its log)"))
        else:
            results.append(Result(check, Status.PASS, **common,
                                  message=f"every target up in the Prometheus on {prober}"))
    return results


# ---------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------


@cache
def pack() -> tuple[frozenset[str], frozenset[str]]:
    """The alert pack's alert names and recording rule names."""
    alerts, records = set(), set()
    for name in derive.rule_files():
        for group in (yaml.safe_load((derive.RULES_SOURCE / name).read_text()) or {}).get(
                "groups", []):
            for rule in group.get("rules", []):
                if "alert" in rule:
                    alerts.add(rule["alert"])
                elif "record" in rule:
                    records.add(rule["record"])
    return frozenset(alerts), frozenset(records)


def judge_rules(host: str, done: Completed) -> Result:
    check = "monitoring.rules"
    got = _read(check, host, "Prometheus", done)
    if isinstance(got, Result):
        return got
    alerts, records = pack()
    loaded = {(r["type"], r["name"]) for r in got["rules"]}
    missing = sorted({n for n in alerts if ("alerting", n) not in loaded}
                     | {n for n in records if ("recording", n) not in loaded})
    broken = [r for r in got["rules"] if r["health"] == "err"]
    wanted = len(alerts) + len(records)
    details = {"missing": missing,
               "errors": [{"rule": r["name"], "group": r["group"], "error": r["error"]}
                          for r in broken]}
    value = wanted - len(missing)
    if missing:
        return Result(check, Status.FAIL, node=host, value=value, threshold=wanted,
                      unit="rules", action=Action.REDEPLOY, details=details,
                      message=f"{host}: Prometheus has not loaded {len(missing)} rules of the "
                              f"alert pack ({', '.join(missing[:8])}"
                              f"{', ...' if len(missing) > 8 else ''}): deploy again")
    if broken:
        return Result(check, Status.FAIL, node=host, value=value, threshold=wanted,
                      unit="rules", action=Action.INVESTIGATE, details=details,
                      message=f"{host}: rules that fail to evaluate: " + "; ".join(
                          f"{r['name']}: {r['error']}" for r in broken[:5]))
    return Result(check, Status.PASS, node=host, value=value, threshold=wanted,
                  unit="rules", details=details,
                  message=f"{len(alerts)} alerts and {len(records)} recording rules loaded, "
                          "none failing")


# ---------------------------------------------------------------------------
# Alertmanager
# ---------------------------------------------------------------------------


def judge_alertmanager(host: str, alertmanagers: list[str], peers: list[str],
                       done: Completed) -> Result:
    """``alertmanagers``: every monitoring host's Alertmanager (``host:port``), where each
    Prometheus sends; ``peers``: their gossip addresses (one host: none)."""
    check = "monitoring.alertmanager"
    got = _read(check, host, "Prometheus or Alertmanager", done)
    if isinstance(got, Result):
        return got
    sends = {u.split("://", 1)[-1].split("/", 1)[0] for u in got["sends_to"]}
    missing = [a for a in alertmanagers if a not in sends]
    details = {k: got[k] for k in ("cluster", "sends_to", "watchdog", "version")}
    if missing:
        return Result(check, Status.FAIL, node=host, action=Action.REDEPLOY, details=details,
                      message=f"{host}: Prometheus does not send its alerts to the "
                              f"Alertmanager at {', '.join(missing)}: deploy again")
    if len(peers) > 1:
        seen = got["cluster"]["peers"]
        if got["cluster"]["status"] != "ready" or len(seen) < len(peers):
            return Result(check, Status.FAIL, node=host, value=len(seen),
                          threshold=len(peers), unit="peers",
                          action=Action.RESTART_SERVICE, details=details,
                          message=f"{host}: the Alertmanager pair is not one cluster "
                                  f"(gossip {got['cluster']['status'] or 'off'}, "
                                  f"{len(seen)} of {len(peers)} peers: "
                                  f"{', '.join(seen) or 'none'}): each Alertmanager sends "
                                  "every notification itself")
    if not got["watchdog"]:
        return Result(check, Status.FAIL, node=host, action=Action.INVESTIGATE,
                      details=details,
                      message=f"{host}: the Watchdog alert, which always fires, has not "
                              "reached Alertmanager: alerts are not delivered (Prometheus' "
                              "log, prometheus_notifications_errors_total)")
    pair = f", one cluster with {len(peers)} peers" if len(peers) > 1 else ""
    return Result(check, Status.PASS, node=host, details=details,
                  message=f"Alertmanager answers and receives the alerts{pair}")


# ---------------------------------------------------------------------------
# Firing alerts
# ---------------------------------------------------------------------------


def judge_alerts(host: str, done: Completed) -> Result:
    check = "monitoring.alerts"
    got = _read(check, host, "Prometheus", done)
    if isinstance(got, Result):
        return got
    firing = [a for a in got["alerts"]
              if a["state"] == "firing" and a["alertname"] != "Watchdog"]
    if not firing:
        return Result(check, Status.PASS, node=host, value=0, unit="alerts firing",
                      message="no alert firing (but Watchdog)")
    order = {"critical": 0, "warning": 1}
    firing.sort(key=lambda a: (order.get(a["severity"], 2), a["alertname"], a["node"]))
    named = [f"{a['alertname']} ({a['severity'] or 'no severity'}"
             f"{', ' + (a['node'] or a['instance']) if a['node'] or a['instance'] else ''})"
             for a in firing]
    return Result(check, Status.WARN, node=host, value=len(firing), unit="alerts firing",
                  action=Action.INVESTIGATE, details={"firing": firing},
                  message=f"{host}: {len(firing)} alerts firing: {'; '.join(named[:10])}"
                          f"{'; ...' if len(named) > 10 else ''} (Alertmanager on "
                          f"{host}, docs/components/monitoring.md#alerts)")


# ---------------------------------------------------------------------------
# Grafana
# ---------------------------------------------------------------------------


def judge_grafana(host: str, version: str, done: Completed) -> Result:
    check = "monitoring.grafana"
    got = _read(check, host, "Grafana", done)
    if isinstance(got, Result):
        return got
    if got["database"] != "ok":
        return Result(check, Status.FAIL, node=host, value=got["database"] or "none",
                      threshold="ok", action=Action.RESTART_SERVICE, details=got,
                      message=f"{host}: Grafana answers, its database does not "
                              f"({got['database'] or 'no state given'}): systemctl status "
                              f"{derive.GRAFANA_SERVICE}")
    if got["version"] != version:
        return Result(check, Status.FAIL, node=host, value=got["version"],
                      threshold=version, action=Action.REDEPLOY, details=got,
                      message=f"{host}: Grafana {got['version']} runs, the inventory pins "
                              f"{version}: deploy again")
    return Result(check, Status.PASS, node=host, value=got["version"], threshold=version,
                  details=got, message="Grafana answers, its database ok")


# ---------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------


def wait_for(ctx: Context, host: str) -> int:
    """Seconds a probe waits for a scrape or an alert: two of the host's scrape or
    evaluation intervals and a little, up to :data:`MAX_WAIT`."""
    interval = max(int(ctx.setting(host, "monitoring", "monitoring_scrape_interval")),
                   int(ctx.setting(host, "monitoring", "monitoring_evaluation_interval")))
    return min(2 * interval + 5, MAX_WAIT)


def probes(ctx: Context) -> list[Probe]:
    cluster = ctx.cluster
    hosts = derive.monitoring_hosts(cluster)
    if not hosts:
        return []
    alertmanagers = derive.alertmanager_targets(cluster)
    peers = derive.alertmanager_peers(cluster)
    grafana = set(derive.grafana_hosts(cluster))
    checked = ctx.nodes()
    out = []
    for host in hosts:
        address = derive.node_address(cluster, host)

        def server(key: str, host: str = host, address: str = address) -> str:
            return derive.endpoint(address, ctx.setting(host, "monitoring", key))

        servers = {"prometheus": server("monitoring_prometheus_port"),
                   "alertmanager": server("monitoring_alertmanager_port"),
                   "grafana": server("monitoring_grafana_port")}
        wait = wait_for(ctx, host)
        limit = wait + 2 * REQUEST_LIMIT + 5
        nodes = [n for n in cluster.hosts if n in checked]
        expected = expected_targets(cluster, host)
        if any(t["node"] in nodes for t in expected):
            out.append(Probe("monitoring.targets", LAYER,
                             client_command("targets", servers, wait),
                             partial(judge_targets, expected, host, nodes, wait),
                             timeout=limit, node=host))
        if host not in checked:
            continue
        out += [
            Probe("monitoring.rules", LAYER, client_command("rules", servers, wait),
                  partial(judge_rules, host), timeout=limit, node=host),
            Probe("monitoring.alertmanager", LAYER,
                  client_command("alertmanager", servers, wait),
                  partial(judge_alertmanager, host, alertmanagers, peers),
                  timeout=limit + REQUEST_LIMIT, node=host),
            Probe("monitoring.alerts", LAYER, client_command("alerts", servers, 0),
                  partial(judge_alerts, host), timeout=2 * REQUEST_LIMIT + 5, node=host),
        ]
        if host in grafana:
            version = str(ctx.setting(host, "monitoring", "monitoring_grafana_version"))
            out.append(Probe("monitoring.grafana", LAYER,
                             client_command("grafana", servers, 0),
                             partial(judge_grafana, host, version),
                             timeout=2 * REQUEST_LIMIT + 5, node=host))
    return out
