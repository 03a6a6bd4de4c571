"""The Grafana dashboards the monitoring role ships (roles/monitoring/files/dashboards/)
and what the deploy derives for Grafana: every dashboard is valid JSON with the uid
``aicluster-<name>``, unique panel ids, only the provisioned data source and only
Grafana's built-in panel types; every panel query, its variables substituted, is valid
PromQL (``promtool check rules`` on a rule file made of them: promtool has no check for
a bare expression); the data sources of one and of two monitoring hosts; the admin
password from a text or a random secret; the Grafana release pin.

promtool is the distribution's (Debian 12: prometheus 2.42), as in
test_monitoring_rules.py (scripts/setup.sh unpacks it beside the venv).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from aicluster import artifacts
from aicluster.components.monitoring import dashboards, derive
from aicluster.components.monitoring.dashboards import (
    DATASOURCE_UID,
    dashboard_files,
    dashboard_queries,
)
from aicluster.secrets import SecretError
from tests.unit.test_monitoring_config import _lab, _pair, _refusals, _set
from tests.unit.test_monitoring_rules import _promtool

#: One per dashboard the issue asks for.
EXPECTED = {"cluster-fitness", "gpu-fleet", "node", "infiniband", "storage", "slurm",
            "inference"}
#: Panel types built into Grafana (no plugin to install).
BUILTIN_PANELS = {"row", "stat", "timeseries", "table", "gauge", "bargauge", "text",
                  "state-timeline", "status-history", "heatmap"}


def _boards() -> dict[str, dict]:
    return {name: json.loads((dashboards.DASHBOARDS_SOURCE / name).read_text())
            for name in dashboard_files()}


def _datasource_uids(node) -> list[str]:
    """Every data source uid named anywhere in a dashboard."""
    found = []
    if isinstance(node, dict):
        ds = node.get("datasource")
        if isinstance(ds, dict):
            found.append(ds.get("uid"))
        elif ds is not None:
            found.append(ds)  # a name or a variable: not allowed
        for value in node.values():
            found += _datasource_uids(value)
    elif isinstance(node, list):
        for value in node:
            found += _datasource_uids(value)
    return found


def test_every_dashboard_parses_with_its_uid_unique_panel_ids_and_builtin_panels():
    boards = _boards()
    assert {Path(n).stem for n in boards} == EXPECTED
    for name, board in boards.items():
        assert board["uid"] == f"aicluster-{Path(name).stem}", name
        assert len(board["uid"]) <= 40
        ids = [p["id"] for p in dashboards.panels(board)]
        assert len(ids) == len(set(ids)), (name, ids)
        assert {p["type"] for p in dashboards.panels(board)} <= BUILTIN_PANELS, name
        assert "__requires" not in board and "__inputs" not in board, name
        for panel in dashboards.panels(board):
            if panel["type"] != "row":
                assert panel.get("targets"), (name, panel["title"])


def test_every_dashboard_reads_only_the_provisioned_datasource():
    for name, board in _boards().items():
        uids = _datasource_uids(board)
        assert uids and set(uids) == {DATASOURCE_UID}, (name, set(uids))


def test_dashboard_queries_cover_every_target_with_variables_substituted():
    queries = dashboard_queries()
    targets = sum(len(p.get("targets") or []) for b in _boards().values()
                  for p in dashboards.panels(b))
    assert len(queries) == targets
    assert {uid for uid, _, _ in queries} == {f"aicluster-{n}" for n in EXPECTED}
    for uid, title, expr in queries:
        assert "$" not in expr and "[[" not in expr, (uid, title, expr)
    assert dashboards.substitute('rate(x{node=~"$node"}[$__rate_interval]) + ${node}',
                                 ["node"]) == 'rate(x{node=~".+"}[1m]) + .+'
    assert dashboards.substitute("$__range_s $__range $nodes", ["node"]) == "3600 1h $nodes"


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool check rules validates each query as a recording rule's expression."""
    rules = [{"record": f"aicluster:dashboard_query_{i}", "expr": expr}
             for i, (_, _, expr) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        lines = {f"aicluster:dashboard_query_{i}": f"{uid} / {title}: {expr}"
                 for i, (uid, title, expr) in enumerate(dashboard_queries())}
        pytest.fail(f"promtool check rules failed:\n{proc.stdout}\n{proc.stderr}\n"
                    + "\n".join(lines.values()))
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


def test_a_broken_query_fails_the_promql_check(tmp_path):
    """The check above can fail: a query promtool cannot parse."""
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"record": "aicluster:broken", "expr": 'sum by (node (up{job="node"})'}]}]}))
    proc = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0


# ---------------------------------------------------------------------------
# What the deploy derives for Grafana
# ---------------------------------------------------------------------------


def test_one_monitoring_host_has_its_own_prometheus_as_default():
    lab = _lab()
    assert derive.grafana_datasources(lab, "head") == [{
        "name": "Prometheus", "uid": DATASOURCE_UID, "url": "http://10.10.0.10:9090",
        "is_default": True, "time_interval": "15s"}]


def test_two_monitoring_hosts_each_default_to_their_own_prometheus():
    pair = _lab(_pair)
    for own, other in (("head", "storage1"), ("storage1", "head")):
        sources = derive.grafana_datasources(pair, own)
        assert [s["is_default"] for s in sources] == [True, False]
        assert sources[0]["uid"] == DATASOURCE_UID
        assert sources[0]["url"].startswith(f"http://{derive.node_address(pair, own)}:")
        assert sources[1] == {**sources[1], "name": f"Prometheus on {other}",
                              "uid": f"{DATASOURCE_UID}-{other}",
                              "url": f"http://{derive.node_address(pair, other)}:9090"}


def test_the_admin_password_is_a_text_secret_as_it_is_or_derived_from_random_bytes(tmp_path):
    text, raw, short = tmp_path / "text", tmp_path / "raw", tmp_path / "short"
    text.write_text("correct horse battery\n")
    raw.write_bytes(bytes(range(256)))
    short.write_text("admin\n")
    assert derive.grafana_admin_password({"file": str(text)}, "g", 64) == \
        "correct horse battery"
    derived = derive.grafana_admin_password({"file": str(raw)}, "g", 64)
    assert len(derived) == 32 and derived.isprintable()
    with pytest.raises(SecretError, match="not a Grafana admin password") as caught:
        derive.grafana_admin_password({"file": str(short)}, "g", 64)
    assert "admin" not in str(caught.value).replace("Grafana admin password", "")
    # A missing file is generated once (random bytes), then read as it is.
    made = tmp_path / "made" / "grafana-admin.secret"
    first = derive.grafana_admin_password({"file": str(made)}, "g", 64)
    assert made.stat().st_mode & 0o777 == 0o600
    assert derive.grafana_admin_password({"file": str(made)}, "g", 64) == first


def test_grafana_is_pinned_for_the_monitoring_hosts_only_and_not_where_it_is_off():
    lab = _lab()
    arts = [a for a in artifacts.needed(lab) if a.component == "monitoring"]
    assert [(a.name, a.version, a.arch, a.hosts) for a in arts] == [
        ("grafana", "12.0.2", "amd64", ("head",))]
    assert arts[0].url == "https://dl.grafana.com/oss/release/grafana-12.0.2.linux-amd64.tar.gz"
    off = _lab(lambda h: _set(h, "head", monitoring_grafana=False))
    assert not [a for a in artifacts.needed(off) if a.component == "monitoring"]
    assert derive.derived_vars(off, "head", off.hosts["head"].data)[
        "monitoring_grafana_enabled"] is False
    mirror = _lab(lambda h: _set(h, "head", monitoring_grafana_release_base_url=(
        "https://mirror.example.org/grafana")))
    assert [a.url for a in artifacts.needed(mirror) if a.component == "monitoring"] == [
        "https://mirror.example.org/grafana/grafana-12.0.2.linux-amd64.tar.gz"]


def test_a_grafana_version_with_no_checksum_pinned_is_refused_naming_it():
    errors = _refusals(lambda h: _set(h, "head", monitoring_grafana_version="99.0.0"))
    assert any("host 'head': monitoring_artifacts.grafana.sha256: no checksum pinned for "
               "version '99.0.0'" in e for e in errors), errors
