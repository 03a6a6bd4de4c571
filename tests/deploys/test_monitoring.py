"""The monitoring deploy planned on fake hosts: the exporters on every node of a cluster
with a monitoring host (and on none without one), Prometheus, Alertmanager and the
blackbox exporter on the monitoring host, on Debian 12 and Ubuntu; Rocky 9 refused; a
re-run that changes nothing; a changed prometheus.yml that reloads Prometheus alone; a
node exporter version bump that restarts the node exporter alone.

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
The package versions are Debian 12's (prometheus-node-exporter 1.5.0-1+b6), fixtures,
not read from an archive here.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from pyinfra.api.exceptions import PyinfraError

from aicluster.components.monitoring import deploy as monitoring
from aicluster.components.monitoring.derive import RULES_SOURCE, rule_files
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import Plan, plan
from tests.golden import GOLDEN_DIR, assert_golden

GOLDEN = GOLDEN_DIR / "monitoring" / "deploy"
NOW = datetime(2026, 1, 1, 12, 0)
APT_STAMP = "/var/lib/apt/periodic/update-success-stamp"
NODE_DEFAULTS = "/etc/default/prometheus-node-exporter"
PROM_DEFAULTS = "/etc/default/prometheus"
PROM_CONFIG = "/etc/prometheus/prometheus.yml"
AM_CONFIG = "/etc/prometheus/alertmanager.yml"
BB_CONFIG = "/etc/prometheus/blackbox.yml"
IPMI_DEFAULTS = "/etc/default/prometheus-ipmi-exporter"
TEXTFILE = "/var/lib/prometheus/node-exporter/aicluster_inventory.prom"
SLURM_SCRIPT = "/usr/local/sbin/aicluster-slurm-textfile"
SECRET = "/etc/prometheus/secrets/chat_webhook"
WEBHOOK = "https://chat.example.org/hooks/test-fixture-not-a-real-secret"
RULES = [f"/etc/prometheus/rules/aicluster/{n}" for n in rule_files()]

CHECK_PROM = "Check Prometheus' configuration and rules (promtool check config, check rules)"
RELOAD_PROM = "Reload Prometheus (its configuration changed)"
RESTART_PROM = "Restart Prometheus (its command line changed)"
CHECK_AM = "Check Alertmanager's configuration (amtool check-config)"
RELOAD_AM = "Reload Alertmanager (its configuration changed)"
RESTART_AM = "Restart Alertmanager (its command line changed)"
CHECK_BB = "Check the blackbox exporter's modules (--config.check)"
RELOAD_BB = "Reload the blackbox exporter (its configuration changed)"
RESTART_BB = "Restart the blackbox exporter (its command line changed)"
RESTART_NODE = "Restart the node exporter (its command line or version changed)"
RESTART_IPMI = "Restart the IPMI exporter (its command line changed)"
GUARDED = (CHECK_PROM, RELOAD_PROM, RESTART_PROM, CHECK_AM, RELOAD_AM, RESTART_AM,
           CHECK_BB, RELOAD_BB, RESTART_BB, RESTART_NODE)

_H100 = {"model": "H100-SXM5-80GB", "count": 8, "memory_gb": 80, "nvswitch": True}
HOSTS = [
    ("head", {"ssh_hostname": "10.10.0.10", "monitoring_storage_gb": 200,
              "hardware": {"cpus": 32, "memory_gb": 256}}),
    ("gpu1", {"ssh_hostname": "10.10.0.21", "monitoring_ipmi": True,
              "hardware": {"cpus": 64, "memory_gb": 1024, "gpus": _H100}}),
]
GROUPS = {"monitoring": ["head"], "gpu_nodes": ["gpu1"], "slurm_controller": ["head"],
          "slurm_workers": ["gpu1"]}
NODE_EXPORTER = "1.5.0-1+b6"


def _cluster(secrets_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "cluster_name": "demo",
        "networks": {"management": {"subnet": "10.10.0.0/24"}},
        "nvidia_cuda_repo_url": "https://mirror.example.org/nvidia/cuda/repos",
        "secrets": {"munge_key": {"file": str(secrets_dir / "munge.key")},
                    "chat_webhook": {"file": str(secrets_dir / "chat")}},
        "monitoring_receivers": [{"name": "chat", "type": "webhook",
                                  "url_key_name": "chat_webhook"}],
        "monitoring_route": {"default": "chat"},
        **extra,
    }


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    (tmp_path / "munge.key").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "chat").write_text(WEBHOOK + "\n")
    return tmp_path


def _facts(distro: str, hosts=HOSTS, more: dict | None = None) -> dict:
    return {name: {"LinuxDistribution": DISTRIBUTIONS[distro], "Os": "Linux",
                   "Arch": "x86_64", **(more or {}).get(name, {})} for name, _ in hosts}


def _plan(secrets_dir, distro="debian12", extra=None, facts=None, hosts=HOSTS,
          groups=GROUPS) -> Plan:
    return plan(hosts, groups, _cluster(secrets_dir, **(extra or {})),
                facts or _facts(distro, hosts), monitoring.deploy)


def _deployed(first: Plan, node_exporter: str = NODE_EXPORTER,
              changed: dict | None = None) -> dict:
    """Each node as ``first`` (a plan on bare nodes) leaves it: its files (the rules as
    the role ships them), packages installed, services running; ``changed`` then
    replaces a node's files (host -> path -> bytes)."""
    out = {}
    for name, _ in HOSTS:
        held = {dest: f.content for dest, f in first.files(name).items()}
        if name == "head":
            held.update({path: (RULES_SOURCE / path.rsplit("/", 1)[1]).read_bytes()
                         for path in RULES})
        held.update((changed or {}).get(name, {}))
        modes = {dest: (f.mode, f.user, f.group) for dest, f in first.files(name).items()}
        dirs = {"/var/lib/prometheus/node-exporter", "/etc/prometheus/rules/aicluster",
                "/etc/prometheus/secrets", "/var/lib/prometheus/metrics2",
                "/var/lib/prometheus/alertmanager"}
        dirs |= {str(parent) for path in held for parent in PurePosixPath(path).parents}

        def file_fact(path, held=held, modes=modes, **kw):
            if path == APT_STAMP:
                return {"mode": 644, "user": "root", "group": "root", "mtime": NOW}
            if path not in held:
                return None
            mode, user, group = modes.get(path, (644, "root", "root"))
            return {"mode": mode, "user": user, "group": group}

        def directory(path, dirs=dirs, **kw):
            if path not in dirs:
                return None
            owner = "prometheus" if path.endswith(("metrics2", "alertmanager")) else "root"
            group = "prometheus" if owner == "prometheus" or path.endswith("secrets") else "root"
            mode = 750 if path.endswith("secrets") else 755
            return {"mode": mode, "user": owner, "group": group}

        units = {f"{s}.service": True for s in (
            "prometheus", "prometheus-alertmanager", "prometheus-blackbox-exporter",
            "prometheus-node-exporter", "prometheus-ipmi-exporter")}
        units["aicluster-slurm-textfile.timer"] = True
        out[name] = {
            "File": file_fact,
            "Sha1File": lambda path, held=held, **kw: (
                hashlib.sha1(held[path]).hexdigest() if path in held else None),
            "Directory": directory,
            "GlobPaths": lambda pattern, held=held, **kw: sorted(
                p for p in held if p.startswith(pattern.rsplit("/", 1)[0] + "/")),
            "DebPackages": {"prometheus-node-exporter": [node_exporter],
                            "prometheus-ipmi-exporter": ["1.6.1-1"],
                            "prometheus": ["2.42.0+ds-5"],
                            "prometheus-alertmanager": ["0.25.0-1"],
                            "prometheus-blackbox-exporter": ["0.23.0-1"]},
            "SystemdStatus": units,
            "SystemdEnabled": units,
            "Date": NOW + timedelta(minutes=1),
        }
    return out


# ---------------------------------------------------------------------------
# A first deploy
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("distro", ["debian12", "ubuntu2204", "ubuntu2404"])
def test_first_run_installs_writes_checks_and_starts(secrets_dir, distro):
    p = _plan(secrets_dir, distro)
    for name, address in (("head", "10.10.0.10"), ("gpu1", "10.10.0.21")):
        install = p.op(name, "Install prometheus-node-exporter" + (
            ", prometheus-ipmi-exporter" if name == "gpu1" else "")).text
        assert "apt-get" in install and "prometheus-node-exporter" in install
        args = p.upload(name, NODE_DEFAULTS)
        # Only on the node's monitoring address, the textfile directory, the collectors.
        assert (f'ARGS="--web.listen-address={address}:9100 '
                "--collector.textfile.directory=/var/lib/prometheus/node-exporter "
                '--collector.infiniband --collector.mountstats --collector.hwmon '
                '--collector.netdev"\n') in args
        assert "0.0.0.0" not in args
        assert p.op(name, RESTART_NODE).runs
        assert "The node exporter running and enabled" in p.names(name)
    # The inventory's textfile: gpu1 declares 8 GPUs (dcgm-exporter's count to compare).
    assert 'aicluster_inventory_gpus{model="H100-SXM5-80GB"} 8' in p.upload("gpu1", TEXTFILE)
    # The IPMI exporter only where monitoring_ipmi is set.
    assert 'ARGS="--web.listen-address=10.10.0.21:9290"' in p.upload("gpu1", IPMI_DEFAULTS)
    assert not any("IPMI" in n for n in p.names("head"))
    # The Slurm textfile collector on the Slurm controller only.
    assert "sinfo -N -h -o '%N|%T|%E'" in p.upload("head", SLURM_SCRIPT)
    assert "The Slurm textfile collector's timer running and enabled" in p.names("head")
    assert not any("Slurm" in n for n in p.names("gpu1"))
    # No server side on a node that is not a monitoring host.
    assert not any("Prometheus" in n or "Alertmanager" in n for n in p.names("gpu1"))

    # The server: packages, files, checks, then the start (a restart: new command lines).
    assert "prometheus-alertmanager" in p.op(
        "head", "Install Prometheus, Alertmanager and the blackbox exporter").text
    prom = p.upload("head", PROM_DEFAULTS)
    assert ("--storage.tsdb.retention.time=30d --web.listen-address=10.10.0.10:9090"
            in prom)
    assert "job_name: \"node\"" in p.upload("head", PROM_CONFIG)
    for path in RULES:
        assert f"FileUploadCommand({RULES_SOURCE / path.rsplit('/', 1)[1]}, {path})" \
            in p.op("head", f"Rules {path}").text
    check = p.op("head", CHECK_PROM)
    assert check.commands[0] == f"promtool check config {PROM_CONFIG}"
    assert check.commands[1] == "promtool check rules " + " ".join(RULES)
    assert p.op("head", CHECK_AM).commands == [f"amtool check-config {AM_CONFIG}"]
    assert p.op("head", CHECK_BB).runs
    for restart, check_name in ((RESTART_PROM, CHECK_PROM), (RESTART_AM, CHECK_AM),
                                (RESTART_BB, CHECK_BB)):
        assert p.op("head", restart).runs
        assert p.op("head", check_name).index < p.op("head", restart).index
    # A restart, not a reload as well.
    for reload in (RELOAD_PROM, RELOAD_AM, RELOAD_BB):
        assert p.op("head", reload).skipped


def test_the_receivers_secret_is_written_0600_and_never_shown(secrets_dir):
    p = _plan(secrets_dir)
    secret = p.files("head")[SECRET]
    assert secret.content.decode() == WEBHOOK + "\n"
    assert (secret.mode, secret.user, secret.group) == (600, "prometheus", "prometheus")
    assert f"url_file: \"{SECRET}\"" in p.upload("head", AM_CONFIG)
    # Only in the secret's own upload: in no other file, no command, no name.
    others = "\n".join(op.text + op.name for n in ("head", "gpu1") for op in p.ops[n]
                       if SECRET not in op.uploads)
    assert "chat.example.org" not in others


def test_a_missing_secret_refuses_the_monitoring_host(secrets_dir, caplog):
    (secrets_dir / "chat").unlink()
    p = _plan(secrets_dir)  # head is failed (pyinfra runs nothing there); gpu1 goes on
    assert p.op("gpu1", RESTART_NODE).runs
    errors = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert "host 'head': monitoring: secrets.chat_webhook: cannot read" in errors


def test_rocky_is_refused_naming_the_host(secrets_dir, caplog):
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        _plan(secrets_dir, "rocky9")
    errors = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    for name in ("head", "gpu1"):
        assert f"host '{name}': monitoring: Rocky, Alma and RHEL 9 are not supported" in errors


def test_a_cluster_without_a_monitoring_host_gets_nothing(secrets_dir):
    groups = {k: v for k, v in GROUPS.items() if k != "monitoring"}
    p = _plan(secrets_dir, groups=groups)
    for name, _ in HOSTS:
        assert p.ops[name] == [], p.names(name)


# ---------------------------------------------------------------------------
# Re-runs
# ---------------------------------------------------------------------------


def test_a_second_run_changes_nothing(secrets_dir):
    p = _plan(secrets_dir, facts=_facts("debian12", more=_deployed(_plan(secrets_dir))))
    for name, _ in HOSTS:
        assert not p.changing(name), (name, p.changing(name))
    for op in GUARDED:
        assert p.op("head", op).skipped, op
    assert p.op("gpu1", RESTART_NODE).skipped and p.op("gpu1", RESTART_IPMI).skipped


def test_a_changed_prometheus_yml_reloads_prometheus_only(secrets_dir):
    first = _plan(secrets_dir)
    facts = _facts("debian12", more=_deployed(first, changed={
        "head": {PROM_CONFIG: b"# edited by hand\n"}}))
    p = _plan(secrets_dir, facts=facts)
    assert p.changing("head") == [f"Prometheus' configuration ({PROM_CONFIG})", CHECK_PROM,
                                  RELOAD_PROM]
    assert p.op("head", RELOAD_PROM).commands == ["systemctl reload prometheus.service"]
    assert p.op("head", CHECK_PROM).index < p.op("head", RELOAD_PROM).index
    assert not p.changing("gpu1")


def test_a_changed_rule_file_is_checked_and_reloads_prometheus(secrets_dir):
    first = _plan(secrets_dir)
    facts = _facts("debian12", more=_deployed(first, changed={
        "head": {RULES[0]: b"groups: []\n",
                 "/etc/prometheus/rules/aicluster/old.yml": b"groups: []\n"}}))
    p = _plan(secrets_dir, facts=facts)
    assert p.changing("head") == [f"Rules {RULES[0]}",
                                  "Remove /etc/prometheus/rules/aicluster/old.yml (no longer "
                                  "in the alert pack)", CHECK_PROM, RELOAD_PROM]


def test_a_node_exporter_version_bump_restarts_only_the_node_exporter(secrets_dir):
    extra = {"monitoring_node_exporter_version": "1.5.0"}
    first = _plan(secrets_dir, extra=extra)
    facts = _facts("debian12", more=_deployed(first, node_exporter="1.4.0-1"))
    p = _plan(secrets_dir, extra=extra, facts=facts)
    for name, _ in HOSTS:
        move = "Move the node exporter 1.4.0-1 to 1.5.0 (monitoring_node_exporter_version)"
        assert p.changing(name) == [move, RESTART_NODE], p.changing(name)
        assert "--allow-downgrades" in p.op(name, move).text
        assert p.op(name, RESTART_NODE).commands == [
            "systemctl restart prometheus-node-exporter.service"]
    assert "Pin: version 1.5.0*" in first.upload("head", "/etc/apt/preferences.d/"
                                                         "aicluster-monitoring.pref")
    # Pinned and at the pin: nothing.
    again = _plan(secrets_dir, extra=extra, facts=_facts("debian12", more=_deployed(first)))
    assert not again.changing("gpu1")


def test_golden_files(secrets_dir):
    p = _plan(secrets_dir)
    for name, dest in (("head", PROM_DEFAULTS), ("head", "/etc/default/prometheus-alertmanager"),
                       ("head", "/etc/default/prometheus-blackbox-exporter"),
                       ("head", NODE_DEFAULTS), ("gpu1", IPMI_DEFAULTS), ("gpu1", TEXTFILE),
                       ("head", SLURM_SCRIPT),
                       ("head", "/etc/systemd/system/aicluster-slurm-textfile.service"),
                       ("head", "/etc/systemd/system/aicluster-slurm-textfile.timer")):
        assert_golden(GOLDEN / f"{name}{dest.replace('/', '_')}", p.upload(name, dest))
    # The operations of both hosts in order, as a person reads the plan.
    text = "\n".join(f"== {name}\n" + "\n".join(p.names(name)) for name, _ in HOSTS) + "\n"
    assert_golden(GOLDEN / "plan.txt", text)
