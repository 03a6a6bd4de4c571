"""The monitoring component's settings, derived values and configuration files, without a
deploy (it is not built yet): what inventories/lab.py's Prometheus scrapes and probes,
the Alertmanager pair two monitoring hosts make, the receivers and routes, the textfile
of what the inventory declares, and every refusal, each with its message.

tests/fixtures/golden/monitoring/<case>/<file> holds prometheus.yml, alertmanager.yml and
blackbox.yml as the lab's monitoring host (head) gets them, and as each host of a pair
(head and storage1) does. After an intended change, regenerate them and read the diff:

    AICLUSTER_UPDATE_GOLDEN=1 pytest tests/unit/test_monitoring_config.py

The rendered files are checked by the real tools where they are at hand: Prometheus'
``promtool check config`` (scripts/setup.sh puts promtool beside the venv).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from aicluster import PROJECT_ROOT
from aicluster.common.settings import template_vars
from aicluster.components.monitoring import derive
from aicluster.inventory import Cluster, InventoryError, load_hosts, validate
from aicluster.render import render
from tests.golden import GOLDEN_DIR, assert_golden

LAB = PROJECT_ROOT / "inventories" / "lab.py"
GOLDEN = GOLDEN_DIR / "monitoring"
CONFIGS = ("prometheus.yml", "alertmanager.yml", "blackbox.yml")
GPUS = ("gpu1", "gpu2", "gpu3", "gpu4")

Hosts = dict[str, tuple[tuple[str, ...], dict[str, Any]]]


@cache
def _lab_hosts() -> Hosts:
    return load_hosts(LAB)


def _hosts() -> Hosts:
    return copy.deepcopy(_lab_hosts())


def _set(hosts: Hosts, name: str, **data: Any) -> None:
    groups, old = hosts[name]
    hosts[name] = (groups, {**old, **data})


def _drop(hosts: Hosts, name: str, key: str) -> None:
    groups, old = hosts[name]
    hosts[name] = (groups, {k: v for k, v in old.items() if k != key})


def _join(hosts: Hosts, name: str, group: str) -> None:
    groups, data = hosts[name]
    hosts[name] = ((*groups, group), data)


def _lab(edit: Callable[[Hosts], None] | None = None) -> Cluster:
    hosts = _hosts()
    if edit is not None:
        edit(hosts)
    return validate(hosts, extra_groups=["lab"])


def _refusals(edit: Callable[[Hosts], None]) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        _lab(edit)
    return caught.value.errors


def _pair(hosts: Hosts) -> None:
    """storage1 a second monitoring host (with the disk it gives Prometheus)."""
    _join(hosts, "storage1", "monitoring")
    _set(hosts, "storage1", monitoring_storage_gb=800)


@pytest.fixture(scope="module")
def lab() -> Cluster:
    return _lab()


@pytest.fixture(scope="module")
def pair() -> Cluster:
    return _lab(_pair)


def _render(cluster: Cluster, host: str, template: str, family: str = "Debian",
            **data: Any) -> str:
    v = template_vars("monitoring", cluster, host, {**cluster.hosts[host].data, **data}, family)
    return render("monitoring", f"{template}.j2", v)


def _job(cluster: Cluster, name: str, prober: str | None = None) -> dict[str, Any]:
    jobs = {j["job_name"]: j for j in derive.scrape_configs(cluster, prober)}
    return jobs[name]


def _groups(cluster: Cluster, job: str, prober: str | None = None) -> list[dict[str, Any]]:
    """A job's target groups, each ``{"targets": [...], **labels}``."""
    return [{"targets": g["targets"], **dict(g["labels"])}
            for g in _job(cluster, job, prober)["static_configs"]]


# ---------------------------------------------------------------------------
# The configuration files, against golden files and the tools that read them
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("template", CONFIGS)
def test_the_lab_monitoring_host_configs_match_golden_files(lab, template):
    text = _render(lab, "head", template)
    assert text == _render(lab, "head", template, "RedHat")  # the same on every family
    assert_golden(GOLDEN / "lab-head" / template, text)


@pytest.mark.parametrize("host", ["head", "storage1"])
@pytest.mark.parametrize("template", CONFIGS)
def test_a_pair_of_monitoring_hosts_configs_match_golden_files(pair, host, template):
    assert_golden(GOLDEN / f"pair-{host}" / template, _render(pair, host, template))


def test_a_gpu_nodes_inventory_textfile_matches_its_golden_file(lab):
    assert_golden(GOLDEN / "lab-gpu1" / derive.INVENTORY_TEXTFILE,
                  derive.inventory_gauges(lab, "gpu1"))


def _promtool() -> str:
    found = shutil.which("promtool") or str(
        PROJECT_ROOT / ".venv" / "opt" / "prometheus" / "usr" / "bin" / "promtool")
    if not Path(found).exists():
        pytest.fail("promtool is not installed (scripts/setup.sh puts it in "
                    ".venv/opt/prometheus)")
    return found


@pytest.mark.parametrize("case, host", [("lab", "head"), ("pair", "head"),
                                        ("pair", "storage1")])
def test_promtool_accepts_the_prometheus_config(lab, pair, tmp_path, case, host):
    path = tmp_path / "prometheus.yml"
    path.write_text(_render({"lab": lab, "pair": pair}[case], host, "prometheus.yml"))
    # --syntax-only: the token and CA files the deploy writes are not here.
    proc = subprocess.run([_promtool(), "check", "config", "--syntax-only", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_accepts_the_inventory_textfile(lab):
    text = derive.inventory_gauges(lab, "gpu1", {"pci 0000:1a:00.0 port 1": "ibp26s0"})
    proc = subprocess.run([_promtool(), "check", "metrics"], input=text,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------
# What is scraped and probed
# ---------------------------------------------------------------------------


def test_every_node_exporter_is_scraped_at_its_monitoring_address(lab):
    groups = _groups(lab, "node")
    assert [(g["targets"], g["instance"], g["node"]) for g in groups] == [
        ([f"{h.address}:9100"], name, name) for name, h in lab.hosts.items()]


def test_dcgm_exporter_on_the_nvidia_gpu_nodes_only(lab):
    assert [g["node"] for g in _groups(lab, "dcgm")] == list(GPUS)
    assert _groups(lab, "dcgm")[0]["targets"] == ["10.10.0.21:9400"]


def test_a_gpu_node_may_opt_out_of_dcgm_exporter():
    cluster = _lab(lambda h: _set(h, "gpu2", monitoring_dcgm_exporter=False))
    assert [g["node"] for g in _groups(cluster, "dcgm")] == ["gpu1", "gpu3", "gpu4"]


def test_a_stand_in_gpu_node_gets_dcgm_exporter_only_when_it_asks():
    def standin(hosts: Hosts, ask: bool | None) -> None:
        groups, data = hosts["gpu1"]
        gpus = {**data["hardware"]["gpus"], "vendor": "standin"}
        _set(hosts, "gpu1", hardware={**data["hardware"], "gpus": gpus})
        if ask is not None:
            _set(hosts, "gpu1", monitoring_dcgm_exporter=ask)

    assert "gpu1" not in derive.dcgm_hosts(_lab(lambda h: standin(h, None)))
    assert "gpu1" in derive.dcgm_hosts(_lab(lambda h: standin(h, True)))


def test_the_ipmi_exporter_where_a_host_says_it_has_a_bmc(lab):
    assert "ipmi" not in derive.targets_by_job(lab)
    cluster = _lab(lambda h: _set(h, "storage1", monitoring_ipmi=True))
    assert [(g["targets"], g["node"]) for g in _groups(cluster, "ipmi")] == [
        (["10.10.0.40:9290"], "storage1")]


def test_the_metrics_endpoints_of_ray_minio_and_ceph(lab):
    ray = _groups(lab, "ray")
    assert [(g["node"], g["role"], g["targets"]) for g in ray] == [
        ("head", "head", ["10.20.0.10:8080"]),
        *((n, "worker", [f"10.20.0.{20 + i}:8080"]) for i, n in enumerate(GPUS, 1))]
    minio = _job(lab, "minio")
    assert (minio["metrics_path"], minio["bearer_file"], minio["scheme"]) == (
        "/minio/v2/metrics/cluster", derive.MINIO_TOKEN, "http")
    assert [g["targets"] for g in _groups(lab, "minio")] == [["10.30.0.40:9000"]]
    ceph = _job(lab, "ceph")
    assert ceph["honor_labels"] is True
    assert [(g["node"], g["targets"]) for g in _groups(lab, "ceph")] == [
        ("head", ["10.30.0.10:9283"]), ("gpu1", ["10.30.0.21:9283"]),
        ("storage1", ["10.30.0.40:9283"])]


def test_the_ceph_managers_are_scraped_where_the_ceph_component_binds_them():
    """ceph's own settings (the first monitor's, as ceph reads them): the port its
    managers' prometheus module listens on, and none when the module is left alone."""
    def ceph(**data):
        def edit(hosts):
            for name in ("head", "gpu1", "storage1"):
                _set(hosts, name, **data)
        return _lab(edit)

    assert [g["targets"] for g in _groups(ceph(ceph_mgr_prometheus_port=9383), "ceph")] == [
        ["10.30.0.10:9383"], ["10.30.0.21:9383"], ["10.30.0.40:9383"]]
    assert "ceph" not in derive.targets_by_job(ceph(ceph_mgr_prometheus=False))


def test_minio_metrics_without_a_token_when_minio_makes_them_public():
    cluster = _lab(lambda h: _set(h, "storage1",
                                  minio_config={"MINIO_PROMETHEUS_AUTH_TYPE": "public"}))
    assert _job(cluster, "minio")["bearer_file"] == ""


def test_minio_over_tls_is_scraped_and_probed_by_name_with_its_ca(tmp_path):
    cert, key, ca = (tmp_path / n for n in ("cert.pem", "key.pem", "ca.pem"))
    for f in (cert, key, ca):
        f.write_text("stand-in PEM (test fixture)\n")
    cluster = _lab(lambda h: _set(h, "storage1", minio_tls_cert_file=str(cert),
                                  minio_tls_key_file=str(key), minio_tls_ca_file=str(ca)))
    job = _job(cluster, "minio")
    assert (job["scheme"], job["ca_file"]) == ("https", derive.MINIO_CA)
    assert _groups(cluster, "minio")[0]["targets"] == ["storage1-storage:9000"]
    live = [g for g in _groups(cluster, "blackbox_http") if g["service"] == "minio"]
    assert live[0]["__param_module"] == "minio_tls"
    assert live[0]["targets"] == ["https://storage1-storage:9000/minio/health/live"]
    module = {m["name"]: m for m in derive.blackbox_modules(cluster)}["minio_tls"]
    assert (module["prober"], module["ca_file"]) == ("http", derive.MINIO_CA)


def test_the_services_without_metrics_are_probed(lab):
    probes = {(g["service"], g["node"]): (g["__param_module"], g["targets"][0])
              for job in ("blackbox_http", "blackbox_tcp") for g in _groups(lab, job)}
    assert probes == {
        ("slurmctld", "head"): ("tcp_connect", "10.10.0.10:6817"),
        ("ray_gcs", "head"): ("tcp_connect", "10.20.0.10:6379"),
        ("ray_dashboard", "head"): ("http_2xx", "http://10.20.0.10:8265/api/version"),
        ("k3s_api", "head"): ("k3s_api", "https://10.20.0.10:6443/readyz"),
        ("k3s_api", "storage1"): ("k3s_api", "https://10.20.0.40:6443/readyz"),
        ("k3s_api", "gpu1"): ("k3s_api", "https://10.20.0.21:6443/readyz"),
        ("ollama", "gpu3"): ("http_2xx", "http://10.20.0.23:11434/api/tags"),
        ("ollama", "gpu4"): ("http_2xx", "http://10.20.0.24:11434/api/tags"),
        ("ollama_gateway", "head"): ("http_2xx", "http://10.20.0.10:11434/api/tags"),
        ("minio", "storage1"): ("http_2xx", "http://10.30.0.40:9000/minio/health/live"),
        ("nfs", "storage1"): ("tcp_connect", "10.30.0.40:2049"),
    }


def test_a_slurmdbd_host_and_a_moved_slurmctld_port_are_probed():
    cluster = _lab(lambda h: (_join(h, "head", "slurm_dbd"),
                              _set(h, "head", slurm_config={"SlurmctldPort": "6820-6821"})))
    probes = {g["service"]: g["targets"] for g in _groups(cluster, "blackbox_tcp")}
    assert probes["slurmctld"] == ["10.10.0.10:6820"]
    assert probes["slurmdbd"] == ["10.10.0.10:6819"]


def test_the_k3s_api_answers_an_anonymous_probe_with_401(lab):
    module = {m["name"]: m for m in derive.blackbox_modules(lab)}["k3s_api"]
    assert (module["valid_status_codes"], module["insecure"]) == ([200, 401], True)


def test_each_cluster_network_gets_an_icmp_and_a_dont_fragment_probe(lab):
    groups = _groups(lab, "blackbox_icmp")
    df = {(g["network"], g["node"]): g for g in groups if g["probe"] == "icmp_df"}
    plain = {(g["network"], g["node"]) for g in groups if g["probe"] == "icmp"}
    # fabric and storage (MTU 9000); not ib, where head, the prober, has no address.
    expected = {(n, h) for n in ("fabric", "storage") for h in lab.hosts}
    assert set(df) == plain == expected
    assert df[("fabric", "gpu2")]["targets"] == ["10.20.0.22"]
    assert df[("fabric", "gpu2")]["__param_module"] == "icmp_df_fabric"
    modules = {m["name"]: m for m in derive.blackbox_modules(lab)}
    fabric = modules["icmp_df_fabric"]
    # 9000 bytes: 20 of IPv4 header, 8 of ICMP header, the rest payload.
    assert (fabric["dont_fragment"], fabric["payload_size"], fabric["ip_protocol"]) == (
        True, 8972, "ip4")
    assert "icmp_df_ib" not in modules


def test_no_dont_fragment_probe_without_a_declared_mtu():
    def no_mtu(hosts: Hosts) -> None:
        for name in hosts:
            networks = copy.deepcopy(hosts[name][1]["networks"])
            networks["fabric"].pop("mtu")
            _set(hosts, name, networks=networks)

    cluster = _lab(no_mtu)
    assert derive.df_payload(cluster, "fabric") == 0
    groups = _groups(cluster, "blackbox_icmp")
    assert {g["probe"] for g in groups if g["network"] == "fabric"} == {"icmp"}


def test_every_prometheus_probes_through_its_own_blackbox_exporter(pair):
    assert _job(pair, "blackbox_icmp", "head")["blackbox"] == "10.10.0.10:9115"
    assert _job(pair, "blackbox_icmp", "storage1")["blackbox"] == "10.10.0.40:9115"
    # ... and storage1 pings from the networks it is on (fabric on its VLAN, storage).
    assert {g["network"] for g in _groups(pair, "blackbox_icmp", "storage1")} == {
        "fabric", "storage"}


def test_extra_probes_of_each_module():
    probes = [{"name": "license", "module": "tcp_connect", "target": "10.10.0.5:27000"},
              {"name": "portal", "module": "http_2xx", "target": "https://portal.lab/"},
              {"name": "gateway", "module": "icmp", "target": "10.10.0.1"}]
    cluster = _lab(lambda h: _set(h, "head", monitoring_blackbox_targets=probes))
    found = {g["service"]: (job, g["targets"], g["component"])
             for job in ("blackbox_tcp", "blackbox_http", "blackbox_icmp")
             for g in _groups(cluster, job) if g.get("component") == "extra"}
    assert found == {"license": ("blackbox_tcp", ["10.10.0.5:27000"], "extra"),
                     "portal": ("blackbox_http", ["https://portal.lab/"], "extra"),
                     "gateway": ("blackbox_icmp", ["10.10.0.1"], "extra")}


#: How the lab's components are watched: a job, or a probe (its ``service``), or the
#: node exporter's collectors and the inventory textfile on the component's hosts.
COVERAGE: dict[str, Callable[[Cluster], bool]] = {
    "base": lambda c: "node" in derive.targets_by_job(c),
    "network": lambda c: any(g["probe"] == "icmp_df"
                             for g in _groups(c, "blackbox_icmp")),
    "infiniband": lambda c: "--collector.infiniband" in derive.node_exporter_args(c, "gpu1")
    and "aicluster_inventory_ib_port_rate_bytes_per_second"
    in derive.inventory_gauges(c, "gpu1"),
    "nvidia": lambda c: "dcgm" in derive.targets_by_job(c)
    and "aicluster_inventory_gpus" in derive.inventory_gauges(c, "gpu1"),
    "nvme_cache": lambda c: 'kind="nvme_cache"' in derive.inventory_gauges(c, "gpu1"),
    "nfs": lambda c: any(g["service"] == "nfs" for g in _groups(c, "blackbox_tcp"))
    and "--collector.mountstats" in derive.node_exporter_args(c, "head"),
    "ceph": lambda c: "ceph" in derive.targets_by_job(c),
    "minio": lambda c: "minio" in derive.targets_by_job(c),
    "slurm": lambda c: any(g["service"] == "slurmctld" for g in _groups(c, "blackbox_tcp")),
    "ray": lambda c: "ray" in derive.targets_by_job(c),
    "k3s": lambda c: any(g["service"] == "k3s_api" for g in _groups(c, "blackbox_http")),
    "ollama": lambda c: {"ollama", "ollama_gateway"}
    <= {g["service"] for g in _groups(c, "blackbox_http")},
    "monitoring": lambda c: {"prometheus", "alertmanager"} <= set(derive.targets_by_job(c)),
}


def test_every_component_the_lab_has_is_scraped_or_probed(lab):
    components = {c for h in lab.hosts.values() for c in h.components()}
    assert components <= set(COVERAGE), components - set(COVERAGE)
    assert [c for c in sorted(components) if not COVERAGE[c](lab)] == []


def test_each_endpoint_is_where_its_component_serves_it(lab):
    """Each component's own derive module, which monitoring may not import, agrees."""
    from aicluster.components.ceph import derive as ceph
    from aicluster.components.infiniband import derive as infiniband
    from aicluster.components.k3s import derive as k3s
    from aicluster.components.minio import derive as minio
    from aicluster.components.nfs import derive as nfs
    from aicluster.components.ollama import derive as ollama
    from aicluster.components.ray import derive as ray

    ours = derive.ray_endpoints(lab)
    assert [n["address"] for n in ours["nodes"]] == [
        ray.node_ip(lab, n) for n in ray.ray_hosts(lab)]
    head = ray.derived_vars(lab, "head", lab.hosts["head"].data)
    assert ours["gcs"] == head["ray_head_address"]
    assert ours["dashboard"].startswith(f"http://{head['ray_dashboard_bind']}:")
    assert derive.minio_endpoints(lab)["network"] == minio.minio_network(lab, {})
    assert derive.ceph_endpoints(lab)["network"] == ceph.ceph_network(lab, {})
    for server in derive.k3s_endpoints(lab)["servers"]:
        v = k3s.derived_vars(lab, server["node"], lab.hosts[server["node"]].data)
        assert server["url"].startswith(f"https://{v['k3s_node_config']['bind-address']}:")
    gateway = ollama.derived_vars(lab, "head", lab.hosts["head"].data)
    assert derive.ollama_endpoints(lab)["gateways"][0]["url"] == (
        f"http://{gateway['ollama_gateway_listen_address']}/api/tags")
    assert [f"http://{u}/api/tags" for u in gateway["ollama_gateway_upstreams"]] == [
        s["url"] for s in derive.ollama_endpoints(lab)["servers"]]
    assert derive.nfs_endpoint(lab)["endpoint"] == f"{nfs.server_address(lab)}:2049"
    for port in lab.hosts["gpu1"].spec.hardware.ib_ports:
        p = port.model_dump()
        assert derive.ib_port_label(p) == infiniband.port_label(p)


# ---------------------------------------------------------------------------
# Prometheus replicas, the Alertmanager pair, receivers and routes
# ---------------------------------------------------------------------------


def test_one_monitoring_host_runs_alertmanager_alone(lab):
    assert derive.alertmanager_peers(lab) == ["10.10.0.10:9094"]
    args = derive.alertmanager_args(lab, "head")
    assert "--cluster.listen-address=" in args
    assert not [a for a in args if a.startswith("--cluster.peer")]


def test_two_monitoring_hosts_make_a_clustered_alertmanager_pair(pair):
    assert derive.alertmanager_peers(pair) == ["10.10.0.10:9094", "10.10.0.40:9094"]
    assert derive.alertmanager_args(pair, "storage1")[-2:] == [
        "--cluster.listen-address=10.10.0.40:9094", "--cluster.peer=10.10.0.10:9094"]
    # Each Prometheus sends to both Alertmanagers, its replica label dropped from alerts.
    config = yaml.safe_load(_render(pair, "storage1", "prometheus.yml"))
    assert config["global"]["external_labels"] == {"cluster": "lab", "replica": "storage1"}
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "10.10.0.10:9093", "10.10.0.40:9093"]
    assert config["alerting"]["alert_relabel_configs"] == [
        {"action": "labeldrop", "regex": "replica"}]


def test_retention_and_listen_address_on_prometheus_command_line(lab):
    assert derive.prometheus_args(lab, "head") == [
        "--config.file=/etc/prometheus/prometheus.yml",
        "--storage.tsdb.path=/var/lib/prometheus/metrics2",
        "--storage.tsdb.retention.time=30d",
        "--web.listen-address=10.10.0.10:9090",
    ]
    capped = _lab(lambda h: _set(h, "head", monitoring_retention_days=90,
                                 monitoring_retention_size_gb=300))
    assert derive.prometheus_args(capped, "head")[2:4] == [
        "--storage.tsdb.retention.time=90d", "--storage.tsdb.retention.size=300GB"]


def test_every_alert_goes_nowhere_until_the_inventory_routes_it(lab):
    config = yaml.safe_load(_render(lab, "head", "alertmanager.yml"))
    assert config["route"]["receiver"] == "none"
    assert "routes" not in config["route"]
    assert config["receivers"] == [{"name": "none"}]


RECEIVERS = [
    {"name": "ops", "type": "webhook", "url": "http://10.10.0.5:8080/alerts"},
    {"name": "chat", "type": "webhook", "url_key_name": "chat_webhook"},
    {"name": "mail", "type": "email", "to": "ops@lab.example", "from": "alerts@lab.example",
     "smarthost": "smtp.lab.example:587", "auth_username": "alerts",
     "auth_key_name": "smtp_password"},
]
SECRETS = {"chat_webhook": {"env": "LAB_CHAT_WEBHOOK"},
           "smtp_password": {"file": "/etc/aicluster/secrets/smtp"}}


def _receivers(hosts: Hosts, route: dict[str, str] | None = None) -> None:
    for name in hosts:
        secrets = {**hosts[name][1].get("secrets", {}), **SECRETS}
        _set(hosts, name, secrets=secrets)
    _set(hosts, "head", monitoring_receivers=RECEIVERS,
         monitoring_route=route or {"critical": "mail", "warning": "chat", "default": "ops"})


def test_routes_send_each_severity_to_its_receiver():
    cluster = _lab(_receivers)
    config = yaml.safe_load(_render(cluster, "head", "alertmanager.yml"))
    assert config["route"]["receiver"] == "ops"
    assert config["route"]["group_by"] == ["alertname", "node"]
    assert [(r["matchers"], r["receiver"]) for r in config["route"]["routes"]] == [
        (['severity="critical"'], "mail"), (['severity="warning"'], "chat")]
    receivers = {r["name"]: r for r in config["receivers"]}
    assert list(receivers) == ["none", "ops", "chat", "mail"]
    assert receivers["ops"]["webhook_configs"] == [
        {"url": "http://10.10.0.5:8080/alerts", "send_resolved": True}]


def test_receiver_secrets_are_files_never_values():
    cluster = _lab(_receivers)
    config = yaml.safe_load(_render(cluster, "head", "alertmanager.yml"))
    receivers = {r["name"]: r for r in config["receivers"]}
    assert receivers["chat"]["webhook_configs"][0]["url_file"] == (
        "/etc/prometheus/secrets/chat_webhook")
    mail = receivers["mail"]["email_configs"][0]
    assert (mail["auth_username"], mail["auth_password_file"], mail["require_tls"]) == (
        "alerts", "/etc/prometheus/secrets/smtp_password", True)
    assert [(s["path"], s["ref"]) for s in derive.secret_files(cluster)
            if s["kind"] == "secret"] == [
        ("/etc/prometheus/secrets/chat_webhook", {"env": "LAB_CHAT_WEBHOOK"}),
        ("/etc/prometheus/secrets/smtp_password", {"file": "/etc/aicluster/secrets/smtp"})]


def test_minios_metrics_token_is_minted_from_the_secret_minio_reads(lab):
    """The file Prometheus' job "minio" reads its bearer token from is one of the
    monitoring host's secret files, made from MinIO's root user and the very secret the
    minio component reads its root password from (the same reference)."""
    from aicluster.components.minio import derive as minio_derive

    (token,) = [s for s in derive.secret_files(lab) if s["kind"] == "minio_token"]
    storage1 = lab.hosts["storage1"].data
    assert token == {
        "path": derive.MINIO_TOKEN, "kind": "minio_token", "secret": "minio_root_password",
        "ref": minio_derive.secret_ref(lab, storage1), "bytes": 64,
        "user": "aicluster-admin"}
    assert token["path"] == _job(lab, "minio")["bearer_file"]


def test_both_engines_mint_the_same_minio_token(lab, monkeypatch):
    """The pyinfra deploy writes derive.secret_text(entry); the role writes its filter's
    aicluster_monitoring_minio_token(entry): the same token, the one mc would make."""
    import runpy

    from aicluster import ROLES_DIR
    from aicluster.common.minio_credentials import prometheus_token

    monkeypatch.setenv("AICLUSTER_MINIO_ROOT_PASSWORD", "test-fixture-root-pw")
    (entry,) = [s for s in derive.secret_files(lab) if s["kind"] == "minio_token"]
    assert entry["ref"] == {"env": "AICLUSTER_MINIO_ROOT_PASSWORD"}
    plugin = runpy.run_path(
        str(ROLES_DIR / "monitoring" / "filter_plugins" / "aicluster_monitoring.py"))
    mint = plugin["FilterModule"]().filters()["aicluster_monitoring_minio_token"]
    expected = prometheus_token("aicluster-admin", "test-fixture-root-pw")
    assert derive.secret_text(entry) == mint(entry) == mint(entry, True) == expected


def test_no_minio_token_where_minio_metrics_are_public_or_there_is_no_minio():
    public = _lab(lambda h: _set(h, "storage1",
                                 minio_config={"MINIO_PROMETHEUS_AUTH_TYPE": "public"}))
    assert [s for s in derive.secret_files(public) if s["kind"] == "minio_token"] == []

    def no_minio(hosts: Hosts) -> None:
        groups, data = hosts["storage1"]
        hosts["storage1"] = (tuple(g for g in groups if g != "minio"),
                             {k: v for k, v in data.items() if not k.startswith("minio_")})

    assert derive.minio_token_file(_lab(no_minio)) is None


def test_a_node_down_mutes_its_other_alerts(lab):
    config = yaml.safe_load(_render(lab, "head", "alertmanager.yml"))
    assert config["inhibit_rules"] == [{"source_matchers": ['alertname="NodeDown"'],
                                        "target_matchers": ['alertname!="NodeDown"'],
                                        "equal": ["node"]}]
    # ... which works because every exporter's target names its node.
    for job in derive.scrape_configs(lab):
        for group in job["static_configs"]:
            assert "node" in dict(group["labels"]), (job["job_name"], group)


def test_grafanas_admin_password_is_a_generated_secret_unless_named(lab):
    assert derive.grafana_admin_ref(lab) == {
        "file": "~/.local/share/aicluster/lab/grafana-admin.secret"}
    named = _lab(lambda h: [_set(h, n, secrets={**h[n][1]["secrets"],
                                                "grafana_admin_password": {"env": "GF"}})
                            for n in h])
    assert derive.grafana_admin_ref(named) == {"env": "GF"}


# ---------------------------------------------------------------------------
# What each node's textfile says the inventory declares
# ---------------------------------------------------------------------------


def test_the_textfile_takes_the_hca_names_the_deploy_read(lab):
    text = derive.inventory_gauges(lab, "gpu1", {"pci 0000:3c:00.0 port 1": "ibp60s0"})
    assert ('aicluster_inventory_ib_port_rate_bytes_per_second{device="ibp60s0",port="1",'
            'subject="pci 0000:3c:00.0 port 1"} 50000000000') in text.splitlines()
    # A port not read on the node keeps an empty device: it matches no port (missing).
    assert ('aicluster_inventory_ib_port_rate_bytes_per_second{device="",port="1",'
            'subject="pci 0000:1a:00.0 port 1"} 50000000000') in text.splitlines()


def test_no_gpu_gauge_where_no_dcgm_exporter_runs(lab):
    head = derive.inventory_gauges(lab, "head")
    assert "aicluster_inventory_gpus" not in head
    assert 'aicluster_inventory_mount{kind="cephfs",mountpoint="/mnt/cephfs"} 1' in head
    assert derive.inventory_gauges(lab, "storage1") == ""


def test_the_node_exporter_collectors_and_textfile_directory(lab):
    assert derive.node_exporter_args(lab, "gpu1") == [
        "--web.listen-address=10.10.0.21:9100",
        "--collector.textfile.directory=/var/lib/prometheus/node-exporter",
        # Debian's package leaves out /mnt, where the declared mounts are.
        "--collector.filesystem.mount-points-exclude="
        "^/(dev|proc|run|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)",
        "--collector.infiniband", "--collector.mountstats", "--collector.hwmon",
        "--collector.netdev"]


# ---------------------------------------------------------------------------
# Retention against the disk
# ---------------------------------------------------------------------------


def test_the_storage_estimate_follows_prometheus_capacity_formula(lab):
    series = derive.estimated_series(lab)
    assert 20_000 < series < 40_000
    # series x samples per series (30 days every 15 s) x 2 bytes.
    assert derive.estimated_gb(lab, 30, 15) == pytest.approx(series * 172_800 * 2 / 1e9)
    assert derive.estimated_gb(lab, 30, 30) == pytest.approx(derive.estimated_gb(lab, 15, 15))


# ---------------------------------------------------------------------------
# Refusals, each naming the host and the field
# ---------------------------------------------------------------------------


def test_a_monitoring_host_without_stated_storage_is_refused():
    errors = _refusals(lambda h: _drop(h, "head", "monitoring_storage_gb"))
    assert errors == [
        "host 'head': monitoring_storage_gb: not stated, and the host is in the monitoring "
        "group: Prometheus keeps 30 days of samples in /var/lib/prometheus; state the "
        "space (GB) of the filesystem there (docs/components/monitoring.md, \"Retention "
        "and disk\")"]


def test_storage_in_a_memory_filesystem_is_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_storage_path="/run/prometheus"))
    assert errors == [
        "host 'head': monitoring_storage_path: /run/prometheus is on /run, a memory "
        "filesystem emptied at every boot; Prometheus' samples need a disk (e.g. "
        "/var/lib/prometheus)"]


def test_a_size_limit_larger_than_the_disk_allows_is_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_retention_size_gb=350))
    assert errors == [
        "host 'head': monitoring_retention_size_gb: 350 GB does not fit in "
        "monitoring_storage_gb (400 GB): Prometheus' samples may fill at most 85% of the "
        "disk (340 GB; the write-ahead log and compaction need the rest)"]
    assert _lab(lambda h: _set(h, "head", monitoring_retention_size_gb=340))


def test_a_retention_that_does_not_fit_the_stated_disk_is_refused(lab):
    series = derive.estimated_series(lab)
    errors = _refusals(lambda h: _set(h, "head", monitoring_storage_gb=10))
    assert errors == [
        f"host 'head': monitoring_retention_days: 30 days of about {series} series scraped "
        "every 15 s take about 11 GB, more than 85% of monitoring_storage_gb (10 GB); keep "
        "fewer days, cap them with monitoring_retention_size_gb, or state a larger disk"]
    # Fewer days, or a size limit, fit.
    assert _lab(lambda h: _set(h, "head", monitoring_storage_gb=10,
                               monitoring_retention_days=20))
    assert _lab(lambda h: _set(h, "head", monitoring_storage_gb=10,
                               monitoring_retention_size_gb=8))


def test_the_second_monitoring_host_needs_its_own_storage_stated():
    errors = _refusals(lambda h: (_pair(h), _drop(h, "storage1", "monitoring_storage_gb")))
    assert [e.split(":")[0:2] for e in errors] == [["host 'storage1'", " monitoring_storage_gb"]]


def test_a_route_to_an_undeclared_receiver_is_refused():
    errors = _refusals(lambda h: _receivers(h, {"critical": "pager"}))
    assert errors == [
        "host 'head': monitoring_route.critical: 'pager' is not a receiver; declared: none, "
        "ops, chat, mail (add it to monitoring_receivers or correct the name)"]


def test_a_receiver_of_an_unknown_type_is_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_receivers=[
        {"name": "chat", "type": "slack", "url": "https://hooks.example.org/x"}]))
    assert errors == ["host 'head': monitoring_receivers[0].type: 'slack' is not a receiver "
                      "type (webhook, email or none)"]


def test_a_webhook_without_a_url_is_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_receivers=[
        {"name": "ops", "type": "webhook"}]))
    assert errors == ["host 'head': monitoring_receivers[0]: a webhook receiver needs exactly "
                      "one of url (the URL) and url_key_name (the secret holding it)"]


def test_an_email_receiver_without_its_smarthost_is_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_receivers=[
        {"name": "mail", "type": "email", "to": "ops@lab.example",
         "from": "alerts@lab.example"}]))
    assert errors == ["host 'head': monitoring_receivers[0]: an email receiver needs "
                      "smarthost"]


def test_fields_of_another_receiver_type_are_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_receivers=[
        {"name": "ops", "type": "webhook", "url": "http://10.10.0.5/", "to": "a@b.example"}]))
    assert errors == ["host 'head': monitoring_receivers[0]: a webhook receiver takes no to"]


def test_a_receiver_named_twice_is_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_receivers=[
        {"name": "ops", "type": "none"}, {"name": "ops", "type": "none"}]))
    assert errors == ["host 'head': monitoring_receivers: [1]: ops is listed twice (also [0])"]


def test_a_receiver_secret_the_inventory_does_not_declare_is_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_receivers=[
        {"name": "chat", "type": "webhook", "url_key_name": "chat_webhook"}]))
    assert errors == [
        "host 'head': monitoring_receivers[0].url_key_name: names the secret "
        "'chat_webhook', which `secrets` does not declare (declared: k3s_token, "
        "minio_root_password, munge_key); add it to `secrets` as {'file': PATH} or "
        "{'env': VARIABLE}"]


def test_dcgm_exporter_on_a_host_that_is_not_a_gpu_node_is_refused():
    errors = _refusals(lambda h: _set(h, "storage1", monitoring_dcgm_exporter=True))
    assert errors == [
        "host 'storage1': monitoring_dcgm_exporter: true, but the host is not a GPU node "
        "(not in gpu_nodes with hardware.gpus.count above 0); dcgm-exporter reads NVIDIA "
        "GPUs: remove the setting or declare the GPUs"]


def test_a_monitoring_network_a_node_has_no_address_on_is_refused():
    errors = _refusals(lambda h: [_set(h, n, monitoring_network="ib") for n in h])
    # (the same problem on two hosts is one line, naming the other)
    assert errors == [
        "host 'head': monitoring_network: the host has no address on the ib network "
        "(hardware.nics, network_bonds or network_vlans) (and on 1 more host(s): "
        "'storage1')"]


def test_a_node_on_another_monitoring_network_is_refused():
    errors = _refusals(lambda h: _set(h, "gpu2", monitoring_network="fabric"))
    assert errors == [
        "host 'gpu2': monitoring_network: 'fabric' differs from 'management' on host "
        "'head'; it must be the same on every node (set it in group_data)"]


def test_monitoring_hosts_with_different_routes_are_refused():
    errors = _refusals(lambda h: (_pair(h), _set(h, "storage1", monitoring_route={
        "default": "none", "critical": "none"})))
    assert errors == [
        "host 'storage1': monitoring_route: {'default': 'none', 'critical': 'none'} differs "
        "from {} on host 'head'; it must be the same on every monitoring host (set it in "
        "group_data)"]


def test_two_servers_on_one_port_are_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_grafana_port=9090))
    assert errors == [
        "host 'head': monitoring_grafana_port: port 9090 is also "
        "monitoring_prometheus_port's; give each server and exporter its own port"]


def _small(monitor_nics: list[dict[str, Any]]) -> Hosts:
    """n1 (the monitoring host, with ``monitor_nics``) and n2, a MinIO server on the
    storage network."""
    shared = {"cluster_name": "t", "networks": {"management": {"subnet": "10.10.0.0/24"},
                                                "storage": {"subnet": "10.30.0.0/24"}}}
    n2_nics = [{"name": "eth1", "network": "storage", "address": "10.30.0.2"}]
    return {
        "n1": (("monitoring",), {**shared, "ssh_hostname": "10.10.0.1",
                                 "monitoring_storage_gb": 100,
                                 "hardware": {"nics": monitor_nics}}),
        "n2": (("minio",), {**shared, "ssh_hostname": "10.10.0.2",
                            "hardware": {"nics": n2_nics}}),
    }


def test_a_monitoring_host_off_a_network_it_must_scrape_is_refused():
    with pytest.raises(InventoryError) as caught:
        validate(_small([]))
    assert caught.value.errors == [
        "host 'n1': groups: monitoring: the host has no address on the storage network, "
        "where minio serve(s) the metrics and probes it scrapes; give it an address there "
        "(hardware.nics, network_bonds or network_vlans) or make another host the "
        "monitoring host"]
    assert validate(_small([{"name": "eth1", "network": "storage", "address": "10.30.0.1"}]))


def test_a_probe_whose_target_does_not_fit_its_module_is_refused():
    errors = _refusals(lambda h: _set(h, "head", monitoring_blackbox_targets=[
        {"name": "portal", "module": "http_2xx", "target": "portal.lab:443"}]))
    assert errors == ["host 'head': monitoring_blackbox_targets[0]: target: 'portal.lab:443': "
                      "an http_2xx probe's target is an http(s) URL"]


def test_a_monitoring_setting_with_a_typo_is_refused_with_the_name_meant():
    errors = _refusals(lambda h: _set(h, "head", monitoring_retention_day=7))
    assert errors == ["host 'head': monitoring_retention_day: not a monitoring setting; did "
                      "you mean monitoring_retention_days?"]


# ---------------------------------------------------------------------------
# Plan warnings (the inventory prints them: aicluster validate and every deploy)
# ---------------------------------------------------------------------------


def test_one_monitoring_host_is_a_single_point_of_failure(lab, pair):
    assert derive.warnings(lab) == [
        "host 'head': groups: monitoring has one host: its Prometheus and Alertmanager are "
        "a single point of failure (name a second host for a second replica and an "
        "Alertmanager pair)"]
    assert derive.warnings(pair) == []


def test_no_monitoring_host_says_monitoring_comes_too_late():
    def none(hosts: Hosts) -> None:
        groups, data = hosts["head"]
        hosts["head"] = (tuple(g for g in groups if g != "monitoring"), data)

    assert derive.warnings(_lab(none)) == [
        "groups: monitoring: no host is in the monitoring group: a cluster monitored only "
        "later has paid for its first dead GPU, flapping link or full disk by the time it "
        "is; name a monitoring host now (two for a replica and an Alertmanager pair)"]
