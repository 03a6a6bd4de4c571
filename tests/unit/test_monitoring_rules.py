"""The monitoring component's alert pack (roles/monitoring/files/rules) run by Prometheus'
own tool: every rule file passes ``promtool check rules``, every unit test in
tests/fixtures/monitoring/rules passes ``promtool test rules`` (synthetic series, the
alerts that fire at each time with their exact labels and annotations), every alert has
a test where it fires and one where it does not, and carries what an operator needs
(``for:``, a severity, a summary, a description and one of ``aicluster check``'s
actions). The Xid classes of the GPU alerts are aicluster check's own.

promtool is the distribution's (Debian 12: prometheus 2.42), unpacked beside the venv by
scripts/setup.sh (.venv/opt/prometheus/usr/bin/promtool); ``AICLUSTER_TEST_PROMTOOL`` or
a promtool on PATH serve too. Without one these tests fail, saying so: they are not
skipped.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from aicluster import PROJECT_ROOT
from aicluster.checks import gpu
from aicluster.checks.result import Action

RULES = PROJECT_ROOT / "roles" / "monitoring" / "files" / "rules"
TESTS = PROJECT_ROOT / "tests" / "fixtures" / "monitoring" / "rules"
RULE_FILES = sorted(RULES.glob("*.yml"))
TEST_FILES = sorted(TESTS.glob("*.test.yml"))
#: scripts/setup.sh unpacks the distribution's prometheus package here (promtool only).
UNPACKED = PROJECT_ROOT / ".venv" / "opt" / "prometheus" / "usr" / "bin" / "promtool"

SEVERITIES = {"critical", "warning", "info"}
ACTIONS = {a.value for a in Action} - {Action.NONE.value}
ANNOTATIONS = ("summary", "description", "action")
#: Fires always, by design: its test where it does not fire is the pipeline's failure.
ALWAYS_FIRING = {"Watchdog"}


def _promtool() -> str:
    named = os.environ.get("AICLUSTER_TEST_PROMTOOL")
    if named:
        if not Path(named).is_file():
            pytest.fail(f"AICLUSTER_TEST_PROMTOOL={named}: no such file")
        return named
    found = str(UNPACKED) if UNPACKED.is_file() else shutil.which("promtool")
    if not found:
        pytest.fail("promtool is missing: run scripts/setup.sh (as root), which unpacks "
                    "the distribution's prometheus package into .venv/opt/prometheus, or "
                    "set AICLUSTER_TEST_PROMTOOL to a promtool binary")
    return found


def _run(*args: str, cwd: Path) -> None:
    proc = subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (
        f"promtool {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")


@functools.cache
def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _rules() -> list[tuple[str, dict]]:
    """(file name, rule) for every rule of the pack."""
    return [(path.name, rule)
            for path in RULE_FILES
            for group in _load(path)["groups"]
            for rule in group["rules"]]


def _alerts() -> dict[str, tuple[str, dict]]:
    out: dict[str, tuple[str, dict]] = {}
    for name, rule in _rules():
        if "alert" in rule:
            assert rule["alert"] not in out, f"{rule['alert']} is defined twice"
            out[rule["alert"]] = (name, rule)
    return out


@functools.cache
def _alert_tests() -> list[tuple[str, dict]]:
    """(test file name, alert_rule_test entry) for every test of every file."""
    return [(path.name, entry)
            for path in TEST_FILES
            for group in _load(path)["tests"]
            for entry in group.get("alert_rule_test") or []]


ALERTS = _alerts()


def test_the_pack_is_there():
    assert {p.name for p in RULE_FILES} >= {
        "node.yml", "gpu.yml", "infiniband.yml", "slurm.yml", "storage.yml",
        "inference.yml", "check.yml", "meta.yml", "records.yml"}
    assert TEST_FILES, f"no *.test.yml in {TESTS}"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path):
    _run("check", "rules", str(path), cwd=PROJECT_ROOT)


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(path):
    _run("test", "rules", path.name, cwd=path.parent)


def test_every_rule_file_is_under_test():
    tested = {(TESTS / f).resolve()
              for path in TEST_FILES
              for f in _load(path).get("rule_files", [])}
    assert {p.resolve() for p in RULE_FILES} <= tested, (
        f"rule files no test file loads: {sorted({p.resolve() for p in RULE_FILES} - tested)}")


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alert_says_what_to_do(alert):
    file, rule = ALERTS[alert]
    assert "for" in rule, f"{file}: {alert} has no for:"
    assert rule.get("labels", {}).get("severity") in SEVERITIES, (
        f"{file}: {alert}: severity must be one of {sorted(SEVERITIES)}")
    annotations = rule.get("annotations", {})
    for key in ANNOTATIONS:
        assert str(annotations.get(key, "")).strip(), f"{file}: {alert} has no {key}"
    action = annotations["action"]
    # A literal action, or a template that picks one (AiclusterCheckFailed reads the
    # check's own): the tests below check what the template gives.
    assert action in ACTIONS or "{{" in action, (
        f"{file}: {alert}: action {action!r} is not one of aicluster check's {sorted(ACTIONS)}")


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_alert_has_a_test_where_it_fires(alert):
    file, rule = ALERTS[alert]
    firing = [(test_file, entry) for test_file, entry in _alert_tests()
              if entry["alertname"] == alert and entry.get("exp_alerts")]
    assert firing, f"{file}: {alert} has no promtool test where it fires"
    for test_file, entry in firing:
        for expected in entry["exp_alerts"]:
            where = f"{test_file}: {alert} at {entry['eval_time']}"
            labels = expected.get("exp_labels") or {}
            annotations = expected.get("exp_annotations") or {}
            assert labels.get("severity") == rule["labels"]["severity"], where
            for key in ANNOTATIONS:
                assert annotations.get(key), f"{where}: exp_annotations has no {key}"
            assert annotations["action"] in ACTIONS, f"{where}: {annotations['action']!r}"


@pytest.mark.parametrize("alert", sorted(set(ALERTS) - ALWAYS_FIRING))
def test_every_alert_has_a_test_where_it_does_not_fire(alert):
    quiet = [entry for _, entry in _alert_tests()
             if entry["alertname"] == alert and not entry.get("exp_alerts")]
    assert quiet, (f"{ALERTS[alert][0]}: {alert} has no promtool test where it does not "
                   "fire (exp_alerts: [] below its threshold, before its for:, resolved)")


def _xids(expr: str, limit: int = 1000) -> set[int]:
    """The Xid numbers an expression's xid matchers let through."""
    keep = re.findall(r'xid=~"([^"]*)"', expr)
    drop = re.findall(r'xid!~"([^"]*)"', expr)
    return {n for n in range(limit)
            if all(re.fullmatch(p, str(n)) for p in keep)
            and not any(re.fullmatch(p, str(n)) for p in drop)}


def test_xid_classes_are_aicluster_checks():
    known = (gpu.XID_ISOLATE | gpu.XID_REBOOT | gpu.XID_RESET_GPU | gpu.XID_RESTART_APP
             | gpu.XID_IGNORE)
    classes = {
        "GpuXidIsolate": gpu.XID_ISOLATE,
        "GpuXidReboot": gpu.XID_REBOOT,
        "GpuXidResetGpu": gpu.XID_RESET_GPU,
        "GpuXidApplication": gpu.XID_RESTART_APP,
        "GpuXidUnexpected": set(range(1000)) - known,
    }
    for alert, wanted in classes.items():
        got = _xids(ALERTS[alert][1]["expr"])
        assert got == set(wanted), (
            f"{alert}: Xids {sorted(got - set(wanted))} too many, "
            f"{sorted(set(wanted) - got)} missing (src/aicluster/checks/gpu.py)")
    assert not any(_xids(rule["expr"]) & gpu.XID_IGNORE
                   for alert, (_, rule) in ALERTS.items() if alert.startswith("GpuXid")), (
        "an Xid the catalog ignores is alerted on")


def test_every_recording_rule_is_under_test():
    records = {rule["record"] for _, rule in _rules() if "record" in rule}
    queried = " ".join(
        entry["expr"]
        for path in TEST_FILES
        for group in _load(path)["tests"]
        for entry in group.get("promql_expr_test") or [])
    untested = sorted(r for r in records if not re.search(re.escape(r) + r"\b", queried))
    assert not untested, f"recording rules no promql_expr_test queries: {untested}"
