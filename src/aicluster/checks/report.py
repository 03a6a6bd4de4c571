"""The check run's results for people and machines: the summary table (worst first,
each value beside its threshold), ``--json`` (result.schema.json), JUnit XML for CI
and a Prometheus textfile (``aicluster_check_*``, for node_exporter's textfile
collector and the monitoring component)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from aicluster.checks.result import Result, Status, worst_first

#: The JSON schema ``--json`` output validates against.
SCHEMA = Path(__file__).with_name("result.schema.json")


def _number(value) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(results: Iterable[Result]) -> str:
    """One row per result, worst first: status, where, check, value, threshold, the
    message."""
    rows = [("STATUS", "WHERE", "CHECK", "VALUE", "THRESHOLD", "MESSAGE")]
    for r in worst_first(results):
        value = f"{_number(r.value)} {r.unit}".strip() if r.value is not None else ""
        threshold = (f"{_number(r.threshold)} {r.unit}".strip()
                     if r.threshold is not None else "")
        rows.append((r.status.value, r.where, r.check, value, threshold, r.message))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True))
             + ("  " + row[5] if row[5] else "") for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def counts(results: Iterable[Result]) -> dict[str, int]:
    out = {s.value: 0 for s in Status}
    for r in results:
        out[r.status.value] += 1
    return out


def to_json(results: Iterable[Result]) -> str:
    """The results as one JSON document: ``{"results": [...], "counts": {...}}``."""
    listed = list(results)
    return json.dumps({"results": [r.as_json() for r in worst_first(listed)],
                       "counts": counts(listed)}, indent=2, sort_keys=True)


def junit(results: Iterable[Result], name: str = "aicluster check") -> str:
    """JUnit XML: one test case per result (class: the layer, name: check @ where); a
    FAIL or TIMEOUT is a failure, an ERROR an error, a SKIP skipped."""
    listed = list(results)
    c = counts(listed)
    suite = ET.Element("testsuite", {
        "name": name, "tests": str(len(listed)),
        "failures": str(c["FAIL"] + c["TIMEOUT"]), "errors": str(c["ERROR"]),
        "skipped": str(c["SKIP"]),
        "time": f"{sum(r.duration for r in listed):.3f}",
    })
    for r in listed:
        case = ET.SubElement(suite, "testcase", {
            "classname": r.layer or "check", "name": f"{r.check} @ {r.where}" + (
                f" ({r.details['subject']})" if r.details.get("subject") else ""),
            "time": f"{r.duration:.3f}",
        })
        text = r.message or r.status.value
        if r.status in (Status.FAIL, Status.TIMEOUT):
            ET.SubElement(case, "failure", {"message": f"{r.status.value}: {text}"}).text = text
        elif r.status is Status.ERROR:
            ET.SubElement(case, "error", {"message": text}).text = text
        elif r.status is Status.SKIP:
            ET.SubElement(case, "skipped", {"message": text})
        elif r.status is Status.WARN:
            ET.SubElement(case, "system-out").text = f"WARN: {text}"
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


_LABEL = re.compile(r"[\\\"\n]")


def _label(value: str) -> str:
    return _LABEL.sub(lambda m: {"\\": "\\\\", '"': '\\"', "\n": "\\n"}[m.group()], value)


def prometheus(results: Iterable[Result]) -> str:
    """A textfile for node_exporter's textfile collector: per result
    ``aicluster_check_status`` (1 for PASS/WARN/SKIP, 0 otherwise, with the status and,
    where there is one, the action to take as labels), ``aicluster_check_value`` where
    the value is a number, and ``aicluster_check_duration_seconds``."""
    lines = [
        "# HELP aicluster_check_status 1 when the check passed (PASS, WARN or SKIP), 0 "
        "when it did not.",
        "# TYPE aicluster_check_status gauge",
    ]
    values, durations = [], []
    for r in worst_first(results):
        labels = (f'check="{_label(r.check)}",layer="{_label(r.layer)}",'
                  f'where="{_label(r.where)}"')
        # A check with a result per NIC, port or network on one node names which.
        if r.details.get("subject"):
            labels += f',subject="{_label(str(r.details["subject"]))}"'

        ok = 1 if r.status in (Status.PASS, Status.WARN, Status.SKIP) else 0
        # The action to take, where it is one (the monitoring component's alert names it).
        action = "" if r.action.value == "none" else f',action="{r.action.value}"'
        lines.append(f'aicluster_check_status{{{labels},status="{r.status.value}"{action}}} '
                     f"{ok}")
        if isinstance(r.value, int | float) and not isinstance(r.value, bool):
            values.append(f'aicluster_check_value{{{labels},unit="{_label(r.unit)}"}} '
                          f"{float(r.value):g}")
        durations.append(f"aicluster_check_duration_seconds{{{labels}}} {r.duration:.3f}")
    lines += ["# HELP aicluster_check_value The value the check measured (unit label).",
              "# TYPE aicluster_check_value gauge", *values,
              "# HELP aicluster_check_duration_seconds How long the check took.",
              "# TYPE aicluster_check_duration_seconds gauge", *durations]
    return "\n".join(lines) + "\n"
