"""The Grafana dashboards the monitoring role ships (roles/monitoring/files/dashboards/,
one JSON file per dashboard, provisioned from a directory on each monitoring host) and
the PromQL of their panels: engine-free, for the deploys, the unit tests and the
end-to-end test that runs every panel's query against a deployed Prometheus.

Every dashboard has the uid ``aicluster-<file stem>``, reads the one data source the
role provisions under :data:`DATASOURCE_UID` (on each monitoring host its own local
Prometheus) and uses only panel types built into Grafana.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from aicluster import ROLES_DIR

DASHBOARDS_SOURCE = ROLES_DIR / "monitoring" / "files" / "dashboards"
#: The uid of the data source each Grafana has as its default (its host's Prometheus).
DATASOURCE_UID = "aicluster-prometheus"
#: Grafana's own variables a query may hold, and what stands for them outside Grafana.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__interval_ms": "60000",
}
#: What a template variable of a dashboard stands for in :func:`dashboard_queries`:
#: every value (the regex the variables' "All" option has).
ALL = ".+"


def dashboard_files() -> list[str]:
    """The dashboards' file names, sorted."""
    return sorted(p.name for p in DASHBOARDS_SOURCE.glob("*.json"))


def load(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS_SOURCE / name).read_text())


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard, the panels inside (collapsed) rows included."""
    for panel in dashboard.get("panels") or []:
        yield panel
        yield from panels(panel)


def variables(dashboard: Mapping[str, Any]) -> list[str]:
    return [str(v["name"]) for v in (dashboard.get("templating") or {}).get("list") or []]


def substitute(expr: str, names: list[str]) -> str:
    """``expr`` with Grafana's variables replaced: the built-in intervals by fixed
    durations (:data:`BUILTINS`), the dashboard's own variables (``$node``, ``${node}``,
    ``[[node]]``) by :data:`ALL`."""
    values = {**BUILTINS, **{n: ALL for n in names}}
    # Longest names first: $__range_s before $__range.
    for name in sorted(values, key=len, reverse=True):
        value = values[name]
        expr = expr.replace("${" + name + "}", value).replace("[[" + name + "]]", value)
        expr = re.sub(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])", lambda _m, v=value: v,
                      expr)
    return expr


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) for every target of every panel of every
    shipped dashboard, variables substituted (:func:`substitute`), so that each can be
    run against a Prometheus as it is."""
    out = []
    for name in dashboard_files():
        board = load(name)
        names = variables(board)
        for panel in panels(board):
            for target in panel.get("targets") or []:
                if target.get("expr"):
                    out.append((str(board["uid"]), str(panel.get("title", "")),
                                substitute(str(target["expr"]), names)))
    return out


def source(name: str) -> Path:
    return DASHBOARDS_SOURCE / name
