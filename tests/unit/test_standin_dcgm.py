"""The STAND-IN dcgm-exporter (tests/e2e/standins/dcgm.py) run locally on 127.0.0.1: it
serves the captured exposition of the state its state file names, read at each scrape,
with this host's name as Hostname and only the families our counters file lists; the
faulty state makes the alert pack's GPU alerts fire (promtool test rules on the scraped
samples). Its package carries the version the role pins and does not depend on DCGM.

STAND-IN: these tests prove the stand-in and our plumbing, never dcgm-exporter."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml

from aicluster.components.monitoring.derive import DCGM_COUNTERS_SOURCE, RULES_SOURCE
from aicluster.render import default_value
from tests.e2e.standins import dcgm

SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition (what this stand-in writes)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.groups()
        out.append((name, dict(LABEL.findall(labels or "")), float(value)))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standin(tmp_path):
    """The stand-in's server on 127.0.0.1 (a random port), its state file in tmp_path."""
    print(dcgm.banner())
    exe = tmp_path / "dcgm-exporter"
    exe.write_text(dcgm.script())
    state = tmp_path / "state"
    port = _free_port()
    env = {"AICLUSTER_STANDIN_DCGM_STATE_FILE": str(state),
           "AICLUSTER_STANDIN_DCGM_FIXTURES": str(dcgm.FIXTURES), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, str(exe), "-f", str(DCGM_COUNTERS_SOURCE),
                             "-a", f"127.0.0.1:{port}", "-r", "127.0.0.1:5555"], env=env)
    url = f"http://127.0.0.1:{port}/metrics"
    for _ in range(200):  # until it answers (a bounded wait, not a timing assertion)
        try:
            urllib.request.urlopen(url, timeout=5).read()
            break
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None, "the stand-in exited"
            time.sleep(0.05)

    def scrape(which: str | None = None) -> list[tuple[str, dict[str, str], float]]:
        if which is not None:
            state.write_text(which + "\n")
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.headers["X-Stand-In"] == "STAND-IN dcgm-exporter (not NVIDIA's)"
            return parse(answer.read().decode())

    yield scrape
    proc.terminate()
    proc.wait(timeout=30)


def _rules_read() -> set[str]:
    names = set()
    for path in RULES_SOURCE.glob("*.yml"):
        names |= set(re.findall(r"\b(DCGM_(?:FI|EXP)_[A-Z0-9_]*[A-Z0-9])\{job=",
                                path.read_text()))
    return names


def _value(samples, name: str, **labels: str) -> float | None:
    found = [v for n, lab, v in samples
             if n == name and all(lab.get(k) == want for k, want in labels.items())]
    return found[0] if found else None


def test_healthy_serves_what_the_rules_read_with_this_hosts_name(standin):
    samples = standin()  # no state file: healthy
    names = {n for n, _, _ in samples}
    # What the alert pack reads (the windowed Xid count only once an Xid happened).
    assert _rules_read() - {"DCGM_EXP_XID_ERRORS_COUNT"} <= names
    for _, labels, _ in samples:
        assert {"gpu", "UUID", "device", "modelName", "Hostname"} <= set(labels)
        assert labels["Hostname"] == socket.gethostname()
    assert _value(samples, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0
    assert _value(samples, "DCGM_FI_DEV_XID_ERRORS") == 0
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in names
    assert standin("healthy") == samples


def test_the_faulty_state_is_read_at_the_next_scrape(standin):
    assert _value(standin(), "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0
    faulty = standin("ecc-dbe-xid79")
    assert _value(faulty, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") > 0
    assert _value(faulty, "DCGM_FI_DEV_XID_ERRORS") == 79
    assert _value(faulty, "DCGM_EXP_XID_ERRORS_COUNT", xid="79") >= 1
    assert _rules_read() <= {n for n, _, _ in faulty}
    # And back.
    assert _value(standin("healthy"), "DCGM_FI_DEV_XID_ERRORS") == 0


def test_only_the_families_the_counters_file_lists_are_served(tmp_path):
    few = tmp_path / "few.csv"
    few.write_text("# two fields\nDCGM_FI_DEV_GPU_TEMP, gauge, t.\n"
                   "DCGM_FI_DRIVER_VERSION, label, v\n")
    text = dcgm.SCRIPT.read_text()
    namespace: dict = {"__name__": "standin"}
    exec(compile(text, str(dcgm.SCRIPT), "exec"), namespace)  # noqa: S102 (our own script)
    served = namespace["exposition"](str(tmp_path / "none"), str(dcgm.FIXTURES),
                                     namespace["counters"](str(few)), "node9")
    assert {n for n, _, _ in parse(served)} == {"DCGM_FI_DEV_GPU_TEMP"}
    assert 'Hostname="node9"' in served


def _promtool() -> str:
    from tests.unit.test_monitoring_rules import _promtool as find

    return find()


def test_the_faulty_state_fires_the_gpu_alerts(standin, tmp_path):
    """The faulty exposition, as Prometheus would store it (job dcgm, the target's
    instance and node labels), held for 10 minutes: promtool test rules expects the
    double-bit ECC and Xid 79 alerts; the healthy one fires neither."""
    series = []
    for state in ("ecc-dbe-xid79", "healthy"):
        for name, labels, value in standin(state):
            if not name.startswith("DCGM_") or value > 1e15:
                continue
            node = "gpu1" if state != "healthy" else "gpu2"
            labels = {**labels, "job": "dcgm", "instance": f"{node}:9400", "node": node}
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            series.append({"series": f"{name}{{{text}}}", "values": f"{value:g}x10"})
    shutil.copy(RULES_SOURCE / "gpu.yml", tmp_path / "gpu.yml")
    # What fires, by node (ALERTS, the series Prometheus keeps of its alerts): gpu1's
    # uncorrected ECC errors and Xid 79, nothing on the healthy gpu2.
    tests = {"rule_files": ["gpu.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{
            "eval_time": "5m",
            "expr": 'count by (alertname, node, xid) (ALERTS{alertstate="firing"})',
            "exp_samples": [
                {"labels": '{alertname="GpuDoubleBitEccError",node="gpu1"}', "value": 1},
                {"labels": '{alertname="GpuXidReboot",node="gpu1",xid="79"}', "value": 1}],
        }]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run([_promtool(), "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_package_carries_the_pinned_version_and_no_dcgm_dependency(tmp_path):
    if not shutil.which("dpkg-deb"):
        pytest.skip("dpkg-deb is not installed here")
    repo = dcgm.build(tmp_path / "repo")
    deb = next(repo.glob("*.deb"))
    fields = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True,
                            check=True).stdout
    assert "Package: datacenter-gpu-manager-exporter\n" in fields
    assert f"Version: {default_value('monitoring', 'monitoring_dcgm_exporter_version')}\n" \
        in fields
    assert "datacenter-gpu-manager-4" not in fields
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    assert "./usr/bin/dcgm-exporter" in listing
    assert "./lib/systemd/system/nvidia-dcgm-exporter.service" in listing
    packages = (repo / "Packages").read_text()
    assert f"Filename: ./{deb.name}\n" in packages
    assert f"SHA256: {hashlib.sha256(deb.read_bytes()).hexdigest()}\n" in packages
    commands = dcgm.node_commands(repo)
    source = next(c for c in commands if "sources.list.d" in c)
    assert "deb [trusted=yes] file:/opt/aicluster-standin-dcgm ./" in base64.b64decode(
        source.split("echo ", 1)[1].split(" |")[0]).decode()
