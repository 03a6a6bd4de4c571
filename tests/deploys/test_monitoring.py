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
import yaml
from pyinfra.api.exceptions import PyinfraError

from aicluster import artifacts
from aicluster.common.minio_credentials import prometheus_token
from aicluster.components.monitoring import deploy as monitoring
from aicluster.components.monitoring.dashboards import DASHBOARDS_SOURCE, dashboard_files
from aicluster.components.monitoring.derive import (
    DCGM_COUNTERS,
    DCGM_COUNTERS_SOURCE,
    MINIO_TOKEN,
    RULES_SOURCE,
    rule_files,
)
from aicluster.render import defaults
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import Plan, plan
from tests.e2e.standins.minio_standin import verify_metrics_token
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
#: Grafana: a STAND-IN release archive (not Grafana's), pinned under the version below
#: by its own sha256 and found in the test's download cache; nothing is downloaded.
GRAFANA_VERSIONS = {"12.0.2": b"STAND-IN grafana 12.0.2 release archive\n",
                    "12.0.3": b"STAND-IN grafana 12.0.3 release archive\n"}
GRAFANA_SUMS = {v: hashlib.sha256(b).hexdigest() for v, b in GRAFANA_VERSIONS.items()}
GRAFANA_PASSWORD = "test-fixture-grafana-admin-password"
GRAFANA_INI = "/etc/grafana/grafana.ini"
GRAFANA_SECRET = "/etc/grafana/admin-password"
GRAFANA_UNIT = "/etc/systemd/system/aicluster-grafana.service"
GRAFANA_DATASOURCES = "/etc/grafana/provisioning/datasources/aicluster.yaml"
GRAFANA_PROVIDER = "/etc/grafana/provisioning/dashboards/aicluster.yaml"
GRAFANA_BOARDS = [f"/etc/grafana/dashboards/aicluster/{n}" for n in dashboard_files()]
RESTART_GRAFANA = ("Restart Grafana (its release, configuration, data sources or dashboards "
                   "changed)")
#: Owner, group and mode of Grafana's directories once deployed.
GRAFANA_DIRS = {
    **{d: (750, "root", "grafana") for d in (
        "/etc/grafana", "/etc/grafana/provisioning", "/etc/grafana/provisioning/datasources",
        "/etc/grafana/provisioning/dashboards", "/etc/grafana/provisioning/plugins",
        "/etc/grafana/provisioning/alerting", "/etc/grafana/dashboards",
        "/etc/grafana/dashboards/aicluster")},
    "/var/lib/grafana": (750, "grafana", "grafana"),
    "/var/log/grafana": (750, "grafana", "grafana"),
}


def _grafana_archive(version: str) -> str:
    return f"/opt/grafana/{version}/grafana-{version}.linux-amd64.tar.gz"

CHECK_PROM = "Check Prometheus' configuration and rules (promtool check config, check rules)"
RELOAD_PROM = "Reload Prometheus (its configuration changed)"
RESTART_PROM = ("Restart Prometheus (its command line changed, or a run stopped before it "
                "took its files up)")
CHECK_AM = "Check Alertmanager's configuration (amtool check-config)"
RELOAD_AM = "Reload Alertmanager (its configuration changed)"
RESTART_AM = ("Restart Alertmanager (its command line changed, or a run stopped before it "
              "took its files up)")
CHECK_BB = "Check the blackbox exporter's modules (--config.check)"
RELOAD_BB = "Reload the blackbox exporter (its configuration changed)"
RESTART_BB = ("Restart the blackbox exporter (its command line changed, or a run stopped "
              "before it took its files up)")
RECORD_PROM = "Record the files Prometheus runs with (/var/lib/aicluster/monitoring/prometheus)"
RECORD_AM = ("Record the files Alertmanager runs with "
             "(/var/lib/aicluster/monitoring/alertmanager)")
RECORD_BB = ("Record the files the blackbox exporter runs with "
             "(/var/lib/aicluster/monitoring/blackbox)")
RESTART_NODE = "Restart the node exporter (its command line or version changed)"
RESTART_IPMI = "Restart the IPMI exporter (its command line changed)"
GUARDED = (CHECK_PROM, RELOAD_PROM, RESTART_PROM, CHECK_AM, RELOAD_AM, RESTART_AM,
           CHECK_BB, RELOAD_BB, RESTART_BB, RESTART_NODE, RECORD_PROM, RECORD_AM, RECORD_BB)

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
#: dcgm-exporter at the role's default pin (a fixture: no CUDA repository is read here).
DCGM_EXPORTER = "4.8.2-1"
DCGM_PIN = "/etc/apt/preferences.d/aicluster-dcgm-exporter.pref"
DCGM_DROPIN = "/etc/systemd/system/nvidia-dcgm-exporter.service.d/aicluster.conf"
RESTART_DCGM = "Restart dcgm-exporter (its command line, counters or version changed)"
#: The textfile collectors' packages at Debian 12's versions (fixtures).
COLLECTOR_PACKAGES = {
    "prometheus-node-exporter-collectors": ["0.0~git20230203.6f710f8-1+deb12u2"],
    "python3-prometheus-client": ["0.16.0-0.1"], "nvme-cli": ["2.4+really2.3-3"],
    "jq": ["1.6-2.1+deb12u3"], "moreutils": ["0.67-1"]}
CHRONY_UNIT = "/etc/systemd/system/aicluster-chrony-textfile.service"
CHRONY_TIMER = "/etc/systemd/system/aicluster-chrony-textfile.timer"
CHRONY_TIMER_UNIT = "aicluster-chrony-textfile.timer"
NVME_TIMER_UNIT = "prometheus-node-exporter-nvme.timer"
INSTALL_COLLECTORS = ("Install the textfile collectors (prometheus-node-exporter-collectors, "
                      "python3-prometheus-client, nvme-cli, jq, moreutils)")
RELOAD_CHRONY = "Reload systemd units (the chrony textfile collector changed)"
CHRONY_TIMER_ON = "The chrony textfile collector's timer running and enabled"
NVME_ENABLED = (f"The NVMe textfile collector's timer enabled ({NVME_TIMER_UNIT}, every 15 "
                "minutes)")
NVME_START = "Start the NVMe textfile collector's timer (it was not enabled)"


def _cluster(secrets_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "cluster_name": "demo",
        "networks": {"management": {"subnet": "10.10.0.0/24"}},
        "nvidia_cuda_repo_url": "https://mirror.example.org/nvidia/cuda/repos",
        "secrets": {"munge_key": {"file": str(secrets_dir / "munge.key")},
                    "chat_webhook": {"file": str(secrets_dir / "chat")},
                    "grafana_admin_password": {"file": str(secrets_dir / "grafana")}},
        "monitoring_receivers": [{"name": "chat", "type": "webhook",
                                  "url_key_name": "chat_webhook"}],
        "monitoring_route": {"default": "chat"},
        "artifacts_cache_dir": str(secrets_dir / "cache"),
        "monitoring_artifacts": {"grafana": {
            "url": "{base_url}/grafana-{version}.linux-{arch}.tar.gz",
            "version_setting": "monitoring_grafana_version",
            "base_url_setting": "monitoring_grafana_release_base_url",
            "enabled_by": "monitoring_grafana",
            "sha256": {v: {"amd64": s} for v, s in GRAFANA_SUMS.items()},
            "groups": ["monitoring"]}},
        **extra,
    }


@pytest.fixture
def secrets_dir(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "munge.key").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "chat").write_text(WEBHOOK + "\n")
    (tmp_path / "grafana").write_text(GRAFANA_PASSWORD + "\n")
    # The download cache holds the STAND-IN Grafana archives (named by their sha256).
    (tmp_path / "cache").mkdir()
    for version, data in GRAFANA_VERSIONS.items():
        (tmp_path / "cache" / GRAFANA_SUMS[version]).write_bytes(data)
    monkeypatch.setattr(artifacts, "_RESOLVED", {})  # undone after the test
    return tmp_path


def _facts(distro: str, hosts=HOSTS, more: dict | None = None) -> dict:
    return {name: {"LinuxDistribution": DISTRIBUTIONS[distro], "Os": "Linux",
                   "Arch": "x86_64", "Which": lambda command, **kw: f"/usr/sbin/{command}",
                   **(more or {}).get(name, {})} for name, _ in hosts}


def _plan(secrets_dir, distro="debian12", extra=None, facts=None, hosts=HOSTS,
          groups=GROUPS) -> Plan:
    return plan(hosts, groups, _cluster(secrets_dir, **(extra or {})),
                facts or _facts(distro, hosts), monitoring.deploy)


def _deployed(first: Plan, node_exporter: str = NODE_EXPORTER,
              changed: dict | None = None, hosts=HOSTS,
              nvme_units: dict | None = None, dcgm_exporter: str = DCGM_EXPORTER,
              grafana: str = "12.0.2", applied: bool = True,
              blackbox_caps: str | None = "cap_net_raw=ep") -> dict:
    """Each node as ``first`` (a plan on bare nodes) leaves it: its files (the rules as
    the role ships them), packages installed, services running; ``changed`` then
    replaces a node's files (host -> path -> bytes)."""
    out = {}
    for name, _ in hosts:
        held = {dest: f.content for dest, f in first.files(name).items()}
        if name == "head":
            held.update({path: (RULES_SOURCE / path.rsplit("/", 1)[1]).read_bytes()
                         for path in RULES})
        if name == "gpu1":
            held[DCGM_COUNTERS] = DCGM_COUNTERS_SOURCE.read_bytes()
        if name == "head":
            held[_grafana_archive(grafana)] = GRAFANA_VERSIONS[grafana]
            held.update({path: (DASHBOARDS_SOURCE / path.rsplit("/", 1)[1]).read_bytes()
                         for path in GRAFANA_BOARDS})
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

        def directory(path, dirs=dirs, name=name, **kw):
            if name == "head" and path in GRAFANA_DIRS:
                mode, owner, group = GRAFANA_DIRS[path]
                return {"mode": mode, "user": owner, "group": group}
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
        units["aicluster-grafana.service"] = True
        units[CHRONY_TIMER_UNIT] = True
        units["nvidia-dcgm-exporter.service"] = True
        units.update({unit: True for unit in (nvme_units or {}).get(name, ())})
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
                            "prometheus-blackbox-exporter": ["0.23.0-1"],
                            "libcap2-bin": ["1:2.66-4"],
                            **COLLECTOR_PACKAGES,
                            **({"datacenter-gpu-manager-exporter": [dcgm_exporter]}
                               if name == "gpu1" else {})},
            "SystemdStatus": units,
            "SystemdEnabled": units,
            # Each daemon took its files up (its stamp is their digest) unless a run that
            # wrote them stopped before (``applied`` False).
            "FilesApplied": lambda paths, stamp, **kw: applied,
            "FileCapabilities": lambda path, **kw: blackbox_caps,
            "Date": NOW + timedelta(minutes=1),
            # Grafana's release unpacked (its marker holds the archive's sha256), linked,
            # its account made.
            "FindInFile": lambda path, pattern, **kw: (
                [pattern] if path == f"/opt/grafana/{grafana}/.aicluster-unpacked"
                and pattern == GRAFANA_SUMS[grafana] else None),
            "Link": lambda path, **kw: (
                {"link_target": f"/opt/grafana/{grafana}", "user": "root", "group": "root"}
                if path == "/opt/grafana/current" else None),
            "Groups": ["root", "prometheus", "grafana"],
            "UserAccount": lambda user, **kw: (
                {"home": "/var/lib/grafana", "shell": "/usr/sbin/nologin", "group": "grafana",
                 "groups": [], "comment": None, "uid": 990, "gid": 990}
                if user == "grafana" else None),
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
        # Only on the node's monitoring address, the textfile directory, the mounts
        # under /mnt watched, the collectors.
        assert (f'ARGS="--web.listen-address={address}:9100 '
                "--collector.textfile.directory=/var/lib/prometheus/node-exporter "
                "--collector.filesystem.mount-points-exclude="
                "^/(dev|proc|run|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/) "
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


#: A cluster whose gpu1 is also a MinIO server, its root password a secret file.
MINIO_GROUPS = {**GROUPS, "minio": ["gpu1"]}
MINIO_PASSWORD = "test-fixture-minio-root-pw"


#: MinIO's release files: STAND-INs (not MinIO's), pinned at the role's default version
#: by their own sha256 and found in the test's download cache (the deploy resolves the
#: cluster's release files first); nothing is downloaded.
MINIO_FILES = {"minio": b"STAND-IN minio release file\n", "mc": b"STAND-IN mc release file\n"}


def _minio(secrets_dir: Path, password: str = MINIO_PASSWORD, **extra: Any) -> dict[str, Any]:
    """The extra cluster settings of a cluster with MinIO (its secret written, its
    STAND-IN release files in the download cache)."""
    (secrets_dir / "minio").write_text(password + "\n")
    secrets = {**_cluster(secrets_dir)["secrets"],
               "minio_root_password": {"file": str(secrets_dir / "minio")}}
    version = defaults("minio")["minio_version"]
    pins = {}
    for name, data in MINIO_FILES.items():
        sha = hashlib.sha256(data).hexdigest()
        (secrets_dir / "cache" / sha).write_bytes(data)
        pins[name] = {"url": f"{{base_url}}/{name}-{{version}}-{{arch}}",
                      "filename": f"{name}.RELEASE.{{version}}",
                      "sha256": {version: {"amd64": sha}}, "groups": ["minio"]}
    return {"secrets": secrets, "minio_artifacts": pins, **extra}


def test_a_cluster_with_minio_gets_its_metrics_token_0600_and_never_shown(secrets_dir):
    p = _plan(secrets_dir, extra=_minio(secrets_dir), groups=MINIO_GROUPS)
    token = p.files("head")[MINIO_TOKEN]
    minted = prometheus_token("aicluster-admin", MINIO_PASSWORD)
    assert token.content.decode() == minted
    assert (token.mode, token.user, token.group) == (600, "prometheus", "prometheus")
    # The STAND-IN MinIO's own check of a token takes it.
    assert verify_metrics_token(minted, "aicluster-admin", MINIO_PASSWORD, NOW.timestamp()) == ""
    jobs = {j["job_name"]: j for j in yaml.safe_load(p.upload("head", PROM_CONFIG))[
        "scrape_configs"]}
    assert jobs["minio"]["authorization"] == {"type": "Bearer", "credentials_file": MINIO_TOKEN}
    assert MINIO_TOKEN not in p.files("gpu1")
    # Only in the token's own upload: in no other file, no command, no name; and
    # pyinfra's diff of it shows a notice, not the token.
    others = "\n".join(op.text + op.name for n in ("head", "gpu1") for op in p.ops[n]
                       if MINIO_TOKEN not in op.uploads)
    assert minted not in others and minted.split(".")[2] not in others
    assert monitoring._Secret(minted).readlines() == ["(holds a secret: not shown)\n"]
    assert p.op("head", CHECK_PROM).runs


def test_a_changed_minio_password_reloads_prometheus_alone(secrets_dir):
    first = _plan(secrets_dir, extra=_minio(secrets_dir), groups=MINIO_GROUPS)
    facts = _facts("debian12", more=_deployed(first))
    same = _plan(secrets_dir, extra=_minio(secrets_dir), groups=MINIO_GROUPS, facts=facts)
    assert not same.changing("head"), same.changing("head")
    p = _plan(secrets_dir, extra=_minio(secrets_dir, "another-minio-root-pw"),
              groups=MINIO_GROUPS, facts=facts)
    assert p.files("head")[MINIO_TOKEN].content.decode() == prometheus_token(
        "aicluster-admin", "another-minio-root-pw")
    assert p.op("head", CHECK_PROM).runs and p.op("head", RELOAD_PROM).runs
    for op in (CHECK_AM, RELOAD_AM, RESTART_AM, RESTART_PROM):
        assert p.op("head", op).skipped, op


def test_no_minio_token_where_minio_makes_its_metrics_public(secrets_dir):
    extra = _minio(secrets_dir, minio_config={"MINIO_PROMETHEUS_AUTH_TYPE": "public"})
    p = _plan(secrets_dir, extra=extra, groups=MINIO_GROUPS)
    assert MINIO_TOKEN not in p.files("head")
    jobs = {j["job_name"]: j for j in yaml.safe_load(p.upload("head", PROM_CONFIG))[
        "scrape_configs"]}
    assert "authorization" not in jobs["minio"]


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
# The textfile collectors (chrony, NVMe)
# ---------------------------------------------------------------------------

#: gpu1 with two NVMe drives declared (hardware.nvme): the package's NVMe timer is enabled.
NVME_HOSTS = [HOSTS[0], ("gpu1", {**HOSTS[1][1], "hardware": {
    **HOSTS[1][1]["hardware"],
    "nvme": [{"device": "/dev/disk/by-id/nvme-SAMSUNG_MZWLR7T6HALA-00007_S6CKNE0T100001"},
             {"device": "/dev/disk/by-id/nvme-SAMSUNG_MZWLR7T6HALA-00007_S6CKNE0T100002"}]}})]


@pytest.mark.parametrize("distro", ["debian12", "ubuntu2204", "ubuntu2404"])
def test_every_node_gets_the_textfile_collectors_and_the_chrony_timer(secrets_dir, distro):
    p = _plan(secrets_dir, distro)
    for name, _ in HOSTS:
        install = p.op(name, INSTALL_COLLECTORS).text
        for package in COLLECTOR_PACKAGES:
            assert package in install, (name, package)
        unit = p.upload(name, CHRONY_UNIT)
        # chrony.py into a file the collector ignores, then renamed over chrony.prom.
        prom = "/var/lib/prometheus/node-exporter/chrony.prom"
        assert ("ExecStart=/bin/sh -c '/usr/bin/python3 /usr/share/prometheus-node-exporter-"
                f"collectors/chrony.py > {prom}.tmp'") in unit
        assert f"ExecStart=/bin/mv -f {prom}.tmp {prom}\n" in unit
        assert "OnUnitActiveSec=1min" in p.upload(name, CHRONY_TIMER)
        assert p.op(name, RELOAD_CHRONY).runs
        assert p.op(name, RELOAD_CHRONY).index < p.op(name, CHRONY_TIMER_ON).index
        assert "systemctl start aicluster-chrony-textfile.timer" in p.op(
            name, CHRONY_TIMER_ON).text
        assert "systemctl enable aicluster-chrony-textfile.timer" in p.op(
            name, CHRONY_TIMER_ON).text
        # No NVMe declared (HOSTS): the package's NVMe timer is left as the package set it.
        assert NVME_ENABLED not in p.names(name)


def test_the_nvme_timer_is_enabled_where_nvme_drives_are_declared(secrets_dir):
    p = _plan(secrets_dir, hosts=NVME_HOSTS)
    assert p.op("gpu1", NVME_ENABLED).commands == [f"systemctl enable {NVME_TIMER_UNIT}"]
    assert p.op("gpu1", NVME_START).commands == [f"systemctl start {NVME_TIMER_UNIT}"]
    assert NVME_ENABLED not in p.names("head")  # head declares none
    # Enabled already (the package's postinst does it): nothing, not even a start (a
    # timer whose Condition, /dev/nvme*, fails never reads as running).
    deployed = _deployed(_plan(secrets_dir, hosts=NVME_HOSTS), hosts=NVME_HOSTS,
                         nvme_units={"gpu1": [NVME_TIMER_UNIT]})
    again = _plan(secrets_dir, hosts=NVME_HOSTS,
                  facts=_facts("debian12", NVME_HOSTS, more=deployed))
    assert not again.changing("gpu1"), again.changing("gpu1")
    assert again.op("gpu1", NVME_START).skipped


def test_a_changed_chrony_unit_reloads_systemd_and_an_unchanged_one_does_not(secrets_dir):
    first = _plan(secrets_dir)
    same = _plan(secrets_dir, facts=_facts("debian12", more=_deployed(first)))
    for name, _ in HOSTS:
        assert same.op(name, RELOAD_CHRONY).skipped
    edited = _plan(secrets_dir, facts=_facts("debian12", more=_deployed(first, changed={
        "gpu1": {CHRONY_UNIT: b"# edited by hand\n"}})))
    # What the edit changes beyond an unedited re-run: the unit put back, one reload.
    baseline = same.changing("gpu1")
    assert [n for n in edited.changing("gpu1") if n not in baseline] == [
        "The chrony textfile collector's unit (chrony.py to chrony.prom)", RELOAD_CHRONY]
    assert edited.op("gpu1", RELOAD_CHRONY).commands == ["systemctl daemon-reload"]
    assert edited.op("head", RELOAD_CHRONY).skipped


# ---------------------------------------------------------------------------
# dcgm-exporter (NVIDIA GPU nodes)
# ---------------------------------------------------------------------------


def test_a_gpu_node_gets_dcgm_exporter_pinned_with_our_counters_and_command_line(secrets_dir):
    p = _plan(secrets_dir)
    assert "Pin: version /^([0-9]+:)?4\\.8\\.2-1([-+~.]|$)/" in p.upload("gpu1", DCGM_PIN)
    assert "Package: datacenter-gpu-manager-exporter\n" in p.upload("gpu1", DCGM_PIN)
    install = p.op("gpu1", "Install datacenter-gpu-manager-exporter")
    assert "apt-get" in install.text and "datacenter-gpu-manager-exporter" in install.text
    assert p.op("gpu1", "Pin dcgm-exporter at 4.8.2-1").index < install.index
    counters = p.op("gpu1", f"dcgm-exporter's counters ({DCGM_COUNTERS})")
    assert f"FileUploadCommand({DCGM_COUNTERS_SOURCE}, {DCGM_COUNTERS})" in counters.text
    # NVIDIA's unit with our command line: our counters, the node's management address
    # only, the nvidia component's nv-hostengine (nvidia_dcgm is on by default).
    dropin = p.upload("gpu1", DCGM_DROPIN)
    assert ("ExecStart=\nExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/aicluster-"
            "counters.csv -a 10.10.0.21:9400 -r 127.0.0.1:5555\n") in dropin
    assert p.op("gpu1", "Reload systemd units (dcgm-exporter's drop-in changed)").runs
    # (Not running yet on a bare node: pyinfra starts it.)
    assert p.op("gpu1", RESTART_DCGM).commands == [
        "systemctl start nvidia-dcgm-exporter.service"]
    assert "systemctl enable nvidia-dcgm-exporter.service" in p.op(
        "gpu1", "dcgm-exporter running and enabled").text
    # A node that is not a GPU node gets none of it.
    assert not any("dcgm" in n.lower() for n in p.names("head"))
    assert DCGM_PIN not in p.files("head") and DCGM_DROPIN not in p.files("head")


def test_dcgm_exporter_runs_its_own_host_engine_where_the_nvidia_component_runs_none(
        secrets_dir):
    p = _plan(secrets_dir, extra={"nvidia_dcgm": False})
    assert ("ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/aicluster-counters.csv "
            "-a 10.10.0.21:9400\n") in p.upload("gpu1", DCGM_DROPIN)


def test_a_gpu_node_that_opts_out_gets_no_dcgm_exporter(secrets_dir):
    hosts = [HOSTS[0], ("gpu1", {**HOSTS[1][1], "monitoring_dcgm_exporter": False})]
    p = _plan(secrets_dir, hosts=hosts)
    assert not any("dcgm" in n.lower() for n in p.names("gpu1"))


def test_a_dcgm_exporter_version_bump_restarts_only_dcgm_exporter(secrets_dir):
    first = _plan(secrets_dir)
    facts = _facts("debian12", more=_deployed(first, dcgm_exporter="4.5.0-1"))
    p = _plan(secrets_dir, facts=facts)
    move = "Move dcgm-exporter 4.5.0-1 to 4.8.2-1 (monitoring_dcgm_exporter_version)"
    assert p.changing("gpu1") == [move, RESTART_DCGM], p.changing("gpu1")
    assert "--allow-downgrades" in p.op("gpu1", move).text
    assert "datacenter-gpu-manager-exporter" in p.op("gpu1", move).text
    assert p.op("gpu1", RESTART_NODE).skipped
    assert not p.changing("head")
    # At the pin (with an epoch, as apt may show it): nothing.
    again = _plan(secrets_dir, facts=_facts("debian12", more=_deployed(
        first, dcgm_exporter="1:4.8.2-1")))
    assert not again.changing("gpu1"), again.changing("gpu1")
    assert again.op("gpu1", RESTART_DCGM).skipped


def test_a_changed_counters_file_restarts_dcgm_exporter_without_a_daemon_reload(secrets_dir):
    first = _plan(secrets_dir)
    p = _plan(secrets_dir, facts=_facts("debian12", more=_deployed(first, changed={
        "gpu1": {DCGM_COUNTERS: b"DCGM_FI_DEV_GPU_TEMP, gauge, edited by hand\n"}})))
    assert p.changing("gpu1") == [f"dcgm-exporter's counters ({DCGM_COUNTERS})", RESTART_DCGM]


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
    assert p.op("gpu1", RESTART_DCGM).skipped


def test_files_a_stopped_run_left_are_checked_and_taken_up(secrets_dir):
    """A run that wrote the daemons' files and stopped before they took them up (a
    failed check, a lost connection) left their stamps behind: the next run, though it
    writes nothing, checks each daemon's files, restarts it and records them; the
    stamp is the digest of the very files the daemon runs with."""
    p = _plan(secrets_dir, facts=_facts("debian12", more=_deployed(_plan(secrets_dir),
                                                                   applied=False)))
    assert p.changing("head") == [CHECK_PROM, RESTART_PROM, RECORD_PROM, CHECK_AM, RESTART_AM,
                                  RECORD_AM, CHECK_BB, RESTART_BB, RECORD_BB], p.changing("head")
    record = p.op("head", RECORD_PROM).text
    assert "/etc/default/prometheus" in record and "/etc/prometheus/prometheus.yml" in record
    assert all(rule in record for rule in RULES)
    assert record.endswith("| sha256sum > /var/lib/aicluster/monitoring/prometheus"), record


REPAIR_CAPS = ("No empty file capability on /usr/bin/prometheus-blackbox-exporter (it would "
               "void the drop-in's CAP_NET_RAW)")


def test_an_empty_file_capability_is_removed_and_restarts_the_blackbox_exporter(secrets_dir):
    """Where the package's setcap left an empty capability set on the binary (as in a
    container), the deploy removes it and restarts the blackbox exporter alone, so its
    unit's ambient CAP_NET_RAW applies; cap_net_raw there, or no capability, is left."""
    first = _plan(secrets_dir)
    assert REPAIR_CAPS in first.changing("head")  # checked after every (re)install
    assert "setcap -r /usr/bin/prometheus-blackbox-exporter" in first.op("head", REPAIR_CAPS).text
    p = _plan(secrets_dir, facts=_facts("debian12", more=_deployed(first, blackbox_caps="=")))
    assert p.changing("head") == [REPAIR_CAPS, RESTART_BB, RECORD_BB]
    for caps in ("cap_net_raw=ep", None):
        p = _plan(secrets_dir, facts=_facts("debian12", more=_deployed(first,
                                                                       blackbox_caps=caps)))
        assert not p.changing("head"), (caps, p.changing("head"))


def test_a_changed_prometheus_yml_reloads_prometheus_only(secrets_dir):
    first = _plan(secrets_dir)
    facts = _facts("debian12", more=_deployed(first, changed={
        "head": {PROM_CONFIG: b"# edited by hand\n"}}))
    p = _plan(secrets_dir, facts=facts)
    assert p.changing("head") == [f"Prometheus' configuration ({PROM_CONFIG})", CHECK_PROM,
                                  RELOAD_PROM, RECORD_PROM]
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
                                  "in the alert pack)", CHECK_PROM, RELOAD_PROM, RECORD_PROM]


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
                       ("head", "/etc/systemd/system/aicluster-slurm-textfile.timer"),
                       ("gpu1", CHRONY_UNIT), ("gpu1", CHRONY_TIMER),
                       ("gpu1", DCGM_PIN), ("gpu1", DCGM_DROPIN)):
        assert_golden(GOLDEN / f"{name}{dest.replace('/', '_')}", p.upload(name, dest))
    # The operations of both hosts in order, as a person reads the plan.
    text = "\n".join(f"== {name}\n" + "\n".join(p.names(name)) for name, _ in HOSTS) + "\n"
    assert_golden(GOLDEN / "plan.txt", text)


# ---------------------------------------------------------------------------
# Grafana on the monitoring hosts (a STAND-IN release archive: see GRAFANA_VERSIONS)
# ---------------------------------------------------------------------------


def _grafana_ops(p: Plan, name: str) -> list[str]:
    return [n for n in p.names(name) if "Grafana" in n or "Dashboard" in n
            or "dashboard" in n or "grafana" in n]


def test_grafana_is_unpacked_linked_configured_and_started_on_the_monitoring_host(secrets_dir):
    p = _plan(secrets_dir)
    archive = _grafana_archive("12.0.2")
    assert f"{archive})" in p.op("head", "Grafana 12.0.2 release archive").text
    assert p.op("head", "Unpack Grafana 12.0.2").commands == [
        f"tar -xzf {archive} -C /opt/grafana/12.0.2 --strip-components=1 --no-same-owner "
        f"&& echo {GRAFANA_SUMS['12.0.2']} > /opt/grafana/12.0.2/.aicluster-unpacked"]
    assert "ln -s /opt/grafana/12.0.2 /opt/grafana/current" in p.op(
        "head", "/opt/grafana/current is Grafana 12.0.2").text
    assert "useradd" in p.op("head", "Grafana user grafana").text
    ini = p.upload("head", GRAFANA_INI)
    for line in ("http_addr = 10.10.0.10", "http_port = 3000", "admin_user = admin",
                 "admin_password = $__file{/etc/grafana/admin-password}",
                 "reporting_enabled = false", "check_for_updates = false",
                 "[auth.anonymous]\nenabled = false", "data = /var/lib/grafana"):
        assert line in ini, line
    assert "0.0.0.0" not in ini
    unit = p.upload("head", GRAFANA_UNIT)
    assert ("ExecStart=/opt/grafana/current/bin/grafana server --homepath=/opt/grafana/current "
            "--config=/etc/grafana/grafana.ini") in unit
    assert "User=grafana" in unit
    sources = p.upload("head", GRAFANA_DATASOURCES)
    assert ('uid: "aicluster-prometheus"\n    type: prometheus\n    access: proxy\n'
            '    url: "http://10.10.0.10:9090"\n    isDefault: true') in sources
    assert 'path: "/etc/grafana/dashboards/aicluster"' in p.upload("head", GRAFANA_PROVIDER)
    for path in GRAFANA_BOARDS:
        assert (f"FileUploadCommand({DASHBOARDS_SOURCE / path.rsplit('/', 1)[1]}, {path})"
                in p.op("head", f"Dashboard {path}").text)
    # A first start (pyinfra starts a unit not yet running), after the unit is loaded
    # and every file is in place.
    restart = p.op("head", RESTART_GRAFANA)
    assert restart.commands == ["systemctl start aicluster-grafana.service"]
    assert p.op("head", "Reload systemd units (Grafana's unit changed)").index < restart.index
    assert p.op("head", f"Dashboard {GRAFANA_BOARDS[-1]}").index < restart.index
    assert "Grafana running and enabled" in p.names("head")
    # Not on a node that is not a monitoring host.
    assert _grafana_ops(p, "gpu1") == []


def test_grafanas_admin_password_is_written_0600_and_shown_nowhere_else(secrets_dir):
    p = _plan(secrets_dir)
    secret = p.files("head")[GRAFANA_SECRET]
    assert secret.content.decode() == GRAFANA_PASSWORD  # the secret's one line
    assert (secret.mode, secret.user, secret.group) == (600, "grafana", "grafana")
    others = "\n".join(op.text + op.name for n in ("head", "gpu1") for op in p.ops[n]
                       if GRAFANA_SECRET not in op.uploads)
    assert GRAFANA_PASSWORD not in others
    # The secret's own upload hides its lines from pyinfra's diff.
    assert monitoring._Secret(GRAFANA_PASSWORD).readlines() == [
        "(holds a secret: not shown)\n"]


def test_a_secret_of_random_bytes_gives_a_derived_password(secrets_dir):
    (secrets_dir / "grafana").write_bytes(bytes(range(256)))
    p = _plan(secrets_dir)
    password = p.files("head")[GRAFANA_SECRET].content.decode()
    assert len(password) == 32 and password.isprintable()
    assert password == _plan(secrets_dir).files("head")[GRAFANA_SECRET].content.decode()


def test_no_grafana_and_no_release_file_needed_where_monitoring_grafana_is_false(secrets_dir):
    for cached in (secrets_dir / "cache").iterdir():
        cached.unlink()  # nothing to upload: the deploy must not ask for it
    p = _plan(secrets_dir, extra={"monitoring_grafana": False})
    assert _grafana_ops(p, "head") == [] and _grafana_ops(p, "gpu1") == []
    assert "Prometheus running and enabled" in p.names("head")


def _rerun(secrets_dir, extra=None, **deployed) -> tuple[Plan, set[str]]:
    """A plan on the nodes a first plan left (``deployed``: _deployed's options), and
    what a plain re-run of them changes (nothing, once every part is idempotent)."""
    first = _plan(secrets_dir)
    facts = _facts("debian12", more=_deployed(first, **deployed))
    baseline = set(_plan(secrets_dir, facts=_facts(
        "debian12", more=_deployed(first))).changing("head"))
    return _plan(secrets_dir, extra=extra, facts=facts), baseline


def test_a_second_run_changes_nothing_of_grafana(secrets_dir):
    p, _ = _rerun(secrets_dir)
    assert [n for n in p.changing("head") if n in _grafana_ops(p, "head")] == []
    assert p.op("head", RESTART_GRAFANA).skipped
    assert p.op("head", "Unpack Grafana 12.0.2 (its archive changed)").skipped


def test_a_grafana_version_bump_unpacks_moves_the_link_and_restarts_only_grafana(secrets_dir):
    p, baseline = _rerun(secrets_dir, extra={"monitoring_grafana_version": "12.0.3"})
    assert [n for n in p.changing("head") if n not in baseline] == [
        "Grafana 12.0.3 directory", "Grafana 12.0.3 release archive", "Unpack Grafana 12.0.3",
        "/opt/grafana/current is Grafana 12.0.3", RESTART_GRAFANA]
    assert "rm -f /opt/grafana/current" in p.op(
        "head", "/opt/grafana/current is Grafana 12.0.3").text
    assert p.op("head", RESTART_GRAFANA).commands == [
        "systemctl restart aicluster-grafana.service"]
    assert not p.changing("gpu1")


@pytest.mark.parametrize("path, op", [
    (GRAFANA_BOARDS[0], f"Dashboard {GRAFANA_BOARDS[0]}"),
    (GRAFANA_DATASOURCES, f"Grafana's data sources ({GRAFANA_DATASOURCES})"),
    (GRAFANA_INI, f"Grafana's configuration ({GRAFANA_INI})"),
], ids=["dashboard", "datasources", "grafana.ini"])
def test_a_changed_grafana_file_restarts_only_grafana(secrets_dir, path, op):
    p, baseline = _rerun(secrets_dir, changed={"head": {path: b"edited by hand\n"}})
    assert [n for n in p.changing("head") if n not in baseline] == [op, RESTART_GRAFANA]
    assert not p.changing("gpu1")


def test_a_dashboard_no_longer_shipped_is_removed(secrets_dir):
    old = "/etc/grafana/dashboards/aicluster/old.json"
    p, baseline = _rerun(secrets_dir, changed={"head": {old: b"{}\n"}})
    assert [n for n in p.changing("head") if n not in baseline] == [
        f"Remove the dashboard {old} (no longer shipped)", RESTART_GRAFANA]


def test_with_two_monitoring_hosts_each_grafana_defaults_to_its_own_prometheus(secrets_dir):
    hosts = [HOSTS[0], ("gpu1", {**HOSTS[1][1], "monitoring_storage_gb": 200})]
    groups = {**GROUPS, "monitoring": ["head", "gpu1"]}
    p = _plan(secrets_dir, hosts=hosts, groups=groups)
    for name, own, other in (("head", "10.10.0.10", "10.10.0.21"),
                             ("gpu1", "10.10.0.21", "10.10.0.10")):
        sources = p.upload(name, GRAFANA_DATASOURCES)
        mine, theirs = sources.split("  - name: ")[1:]
        assert mine.startswith('"Prometheus"') and f'url: "http://{own}:9090"' in mine
        assert 'uid: "aicluster-prometheus"' in mine and "isDefault: true" in mine
        assert f'url: "http://{other}:9090"' in theirs and "isDefault: false" in theirs
        assert f"http_addr = {own}" in p.upload(name, GRAFANA_INI)


def test_grafana_golden_files(secrets_dir):
    p = _plan(secrets_dir)
    for dest in (GRAFANA_INI, GRAFANA_UNIT, GRAFANA_DATASOURCES, GRAFANA_PROVIDER):
        assert_golden(GOLDEN / f"head{dest.replace('/', '_')}", p.upload("head", dest))
