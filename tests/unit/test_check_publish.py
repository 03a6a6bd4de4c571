"""`aicluster check --publish` and `--prometheus`: the run's Prometheus textfile written
on every monitoring host over the check's own transport (a fake one here, recording what
it was asked to run and fed), refused before any probe without a monitoring host; the
command that writes it run for real on this machine (whole, 0644, nothing left behind);
the local file readable by the node exporter whatever the umask."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from aicluster import cli
from aicluster.checks import publish
from aicluster.checks.runner import Completed, local_transport
from aicluster.common.absence import record_text
from aicluster.inventory import load_cluster
from tests.unit.test_check_nodes import LAB, FakeNodes, fixture

TEXTFILE = "/var/lib/prometheus/node-exporter/aicluster_check.prom"


class FakeTransport(FakeNodes):
    """FakeNodes, also taking the text fed to a command (``stdin``)."""

    def __init__(self, *args, fail=(), **kw):
        super().__init__(*args, **kw)
        self.fed: dict[str, tuple[str, str]] = {}
        self.fail = set(fail)

    def __call__(self, node, command, limit, stdin=None):
        if stdin is not None:
            self.fed[node] = (command, stdin)
            if node in self.fail:
                return Completed(1, "", "mktemp: failed to create file: No such file", 0.01)
        return super().__call__(node, command, limit)


def _fake(cluster, **kw) -> FakeTransport:
    return FakeTransport({"aicluster-check-reached": "aicluster-check-reached\n6.1.0\n",
                          "chronyc": fixture("chronyc-tracking-synced.txt"),
                          "/etc/aicluster/components":
                              lambda n: record_text(cluster.hosts[n].roles())}, **kw)


def _no_monitoring(tmp_path):
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        "all = ([('n1', {'ssh_hostname': '10.0.0.1'})], "
        "{'networks': {'management': {'subnet': '10.0.0.0/24'}}})\n")
    return inventory


def test_publish_writes_what_prometheus_writes_on_every_monitoring_host(tmp_path,
                                                                        monkeypatch):
    cluster = load_cluster(LAB)
    assert cluster.group("monitoring") == ("head",)
    fake = _fake(cluster)
    monkeypatch.setattr("aicluster.checks.session.transport_for", lambda c: fake)
    local = tmp_path / "aicluster_check.prom"
    result = CliRunner().invoke(cli.main, ["check", LAB, "--quick", "--layer", "nodes",
                                           "--limit", "gpu1,head", "--prometheus",
                                           str(local), "--publish"])
    assert result.exit_code == 1, result.output  # the checks' own status (a FAIL)
    assert set(fake.fed) == {"head"}
    command, fed = fake.fed["head"]
    # The file the alert pack reads, renamed whole into place from a name it ignores.
    assert command.endswith(f'mv -f "$t" {TEXTFILE}')
    assert "mktemp /var/lib/prometheus/node-exporter/.aicluster_check.prom.XXXXXX" in command
    assert fed == local.read_text()
    assert 'aicluster_check_status{check="nodes.time",layer="nodes",where="gpu1",' \
           'status="PASS"} 1' in fed


def test_publish_without_a_monitoring_host_is_refused_before_any_probe(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr("aicluster.checks.session.transport_for",
                        lambda cluster: pytest.fail("a host was contacted"))
    monkeypatch.setattr("aicluster.checks.session.run",
                        lambda *a, **kw: pytest.fail("a probe ran"))
    result = CliRunner().invoke(cli.main, ["check", str(_no_monitoring(tmp_path)),
                                           "--publish"])
    assert result.exit_code == 2, result.output
    assert "--publish: the inventory has no monitoring host" in result.output


def test_publish_and_local_are_refused_together(monkeypatch):
    monkeypatch.setattr("aicluster.checks.session.run",
                        lambda *a, **kw: pytest.fail("a probe ran"))
    result = CliRunner().invoke(cli.main, ["check", LAB, "--local", "gpu1", "--publish"])
    assert result.exit_code == 2, result.output
    assert "--publish and --local" in result.output


def test_a_monitoring_host_that_did_not_take_the_file_is_named_and_exits_3(monkeypatch):
    cluster = load_cluster(LAB)
    fake = _fake(cluster, fail={"head"})
    where = publish.targets(cluster)
    assert publish.publish(where, "x 1\n", fake) == [
        f"--publish: head: {TEXTFILE} not written: mktemp: failed to create file: No such "
        "file"]
    # In the command: the checks passed, the results did not reach Prometheus.
    monkeypatch.setattr("aicluster.checks.session.transport_for", lambda c: fake)
    monkeypatch.setattr("aicluster.checks.session.run", lambda *a, **kw: [])
    result = CliRunner().invoke(cli.main, ["check", LAB, "--quick", "--publish"])
    assert result.exit_code == 3, result.output
    assert "--publish: head:" in result.output


def test_the_write_command_replaces_the_file_whole_0644_and_leaves_nothing(tmp_path):
    target = tmp_path / "aicluster_check.prom"
    target.write_text("old 1\n")
    done = local_transport("head", publish.write_command(str(target)), 10,
                           stdin="aicluster_check_status 1\n")
    assert done.rc == 0, done.stderr
    assert target.read_text() == "aicluster_check_status 1\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aicluster_check.prom"]
    # A directory that is not there: an error, and no file.
    missing = tmp_path / "absent" / "aicluster_check.prom"
    done = local_transport("head", publish.write_command(str(missing)), 10, stdin="x 1\n")
    assert done.rc != 0 and not missing.exists()


def test_the_local_textfile_is_written_0644_whatever_the_umask(tmp_path):
    """--local NODE --prometheus FILE as Slurm's HealthCheckProgram (root, any umask):
    the node exporter (user prometheus) must read it."""
    target = tmp_path / "aicluster_check.prom"
    old = os.umask(0o077)
    try:
        publish.write_local(str(target), "aicluster_check_status 1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["aicluster_check.prom"]


def test_a_prometheus_file_in_a_missing_directory_is_refused_before_any_probe(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr("aicluster.checks.session.run",
                        lambda *a, **kw: pytest.fail("a probe ran"))
    result = CliRunner().invoke(cli.main, ["check", LAB, "--local", "gpu1", "--prometheus",
                                           str(tmp_path / "absent" / "x.prom")])
    assert result.exit_code == 2, result.output
    assert "does not exist" in result.output
