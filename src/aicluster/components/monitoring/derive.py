"""The monitoring component's values computed from the inventory and its checks of the
inventory: engine-free (no pyinfra), for the pyinfra deploy and the Ansible role.

What is scraped comes from the inventory alone: every node's node exporter,
dcgm-exporter on NVIDIA GPU nodes, the IPMI exporter where a host says
``monitoring_ipmi: true``, the components' own metrics endpoints (Ray, MinIO, the Ceph
manager's prometheus module), Prometheus and Alertmanager themselves, and blackbox
probes of the services that have no metrics of their own (slurmctld, slurmdbd, the Ray
GCS and dashboard, the k3s API, Ollama and its gateway, MinIO's liveness, the NFS
server) plus an ICMP probe and a don't-fragment probe at the network's MTU on each
cluster network. Every target carries a ``node`` label, the inventory's name of the host
it is on, so that rules join series of one node across exporters (and an alert of a
node that is down is muted by its ``NodeDown``).

Where another component decides an address (the network Ray or MinIO runs on, where
the Ollama gateway listens), this module reads that component's settings (its role's
defaults under the host's data) and makes the same choice its derive module makes:
components never import one another. tests/unit/test_monitoring_config.py checks each
choice against the component's own.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from typing import Any

from aicluster import ROLES_DIR, artifacts
from aicluster.common.absence import host_mounts
from aicluster.common.minio_credentials import metrics_token as minio_metrics_token
from aicluster.common.minio_credentials import root_keys_ref as minio_root_keys_ref
from aicluster.common.networks import host_address, network_errors, pick_network
from aicluster.common.settings import differs_from_first, layered, merge_config, setting
from aicluster.common.stamps import applied_command, stamp_command
from aicluster.components.monitoring.dashboards import DATASOURCE_UID, dashboard_files
from aicluster.inventory import Cluster
from aicluster.secrets import password_from_secret, read_secret
from aicluster.secrets import secret_ref as _secret_ref

CONFIG_DIR = "/etc/prometheus"
PROMETHEUS_CONFIG = f"{CONFIG_DIR}/prometheus.yml"
ALERTMANAGER_CONFIG = f"{CONFIG_DIR}/alertmanager.yml"
BLACKBOX_CONFIG = f"{CONFIG_DIR}/blackbox.yml"
#: The alert pack and recording rules (roles/monitoring/files/rules/*.yml) on the node.
RULES_DIR = f"{CONFIG_DIR}/rules/aicluster"
#: Secrets Prometheus and Alertmanager read from files (mode 0640, group prometheus):
#: a receiver's webhook URL or SMTP password, MinIO's metrics token.
SECRETS_DIR = f"{CONFIG_DIR}/secrets"
#: Where a monitoring host records the digest of the files each of its daemons last
#: took up (deploy._take_up; Ansible's server.yml the same), one file each.
#: Bookkeeping, not data, and kept when monitoring is taken off (a host given it again
#: rewrites its files, which takes them up and records them again).
STAMP_DIR = "/var/lib/aicluster/monitoring"
MINIO_TOKEN = f"{SECRETS_DIR}/minio-prometheus.token"
#: The CA MinIO's certificates are signed by, where MinIO serves TLS.
MINIO_CA = f"{CONFIG_DIR}/minio-ca.crt"
#: The daemons' command lines: /etc/default/<package> (ARGS=...), as Debian's units read
#: them; their services.
PROMETHEUS_DEFAULTS = "/etc/default/prometheus"
ALERTMANAGER_DEFAULTS = "/etc/default/prometheus-alertmanager"
BLACKBOX_DEFAULTS = "/etc/default/prometheus-blackbox-exporter"
NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
IPMI_EXPORTER_DEFAULTS = "/etc/default/prometheus-ipmi-exporter"
PROMETHEUS_SERVICE = "prometheus"
ALERTMANAGER_SERVICE = "prometheus-alertmanager"
BLACKBOX_SERVICE = "prometheus-blackbox-exporter"
#: The blackbox exporter's drop-in giving it CAP_NET_RAW (its ICMP probes).
BLACKBOX_DROPIN_DIR = f"/etc/systemd/system/{BLACKBOX_SERVICE}.service.d"
BLACKBOX_DROPIN = f"{BLACKBOX_DROPIN_DIR}/aicluster-icmp.conf"
#: The blackbox exporter's binary. Debian's package gives it cap_net_raw as a file
#: capability where its postinst's setcap can; where that leaves an empty capability
#: set instead ("=", as in a systemd-nspawn container), the set voids the unit's
#: ambient CAP_NET_RAW (a file with capabilities clears the ambient set at exec), so
#: the deploy removes it (BLACKBOX_CAPS_REPAIR) and the drop-in's capability applies.
BLACKBOX_BIN = "/usr/bin/prometheus-blackbox-exporter"
BLACKBOX_CAPS_REPAIR = (f'caps=$(getcap {BLACKBOX_BIN} 2>/dev/null); [ -z "$caps" ] || '
                        f'echo "$caps" | grep -q cap_net_raw || setcap -r {BLACKBOX_BIN}')
NODE_EXPORTER_SERVICE = "prometheus-node-exporter"
IPMI_EXPORTER_SERVICE = "prometheus-ipmi-exporter"
#: The node exporter's version pin (monitoring_node_exporter_version), for apt.
NODE_EXPORTER_PIN = "/etc/apt/preferences.d/aicluster-monitoring.pref"
#: dcgm-exporter on NVIDIA GPU nodes: NVIDIA's package from its CUDA repository (the one
#: the nvidia component configures), its version pin (monitoring_dcgm_exporter_version),
#: the counters file we ship (roles/monitoring/files/dcgm-counters.csv) and a drop-in
#: replacing the packaged unit's command line. The unit's name and its ExecStart (fixed
#: flags, no environment file) are NVIDIA/dcgm-exporter's
#: packaging/config-files/systemd/nvidia-dcgm-exporter.service, which packaging/README.md
#: says the packages install as /lib/systemd/system/nvidia-dcgm-exporter.service.
DCGM_EXPORTER_PACKAGE = "datacenter-gpu-manager-exporter"
DCGM_EXPORTER_SERVICE = "nvidia-dcgm-exporter"
DCGM_EXPORTER_PIN = "/etc/apt/preferences.d/aicluster-dcgm-exporter.pref"
DCGM_EXPORTER_BINARY = "/usr/bin/dcgm-exporter"
DCGM_EXPORTER_CONFIG_DIR = "/etc/dcgm-exporter"
DCGM_COUNTERS = f"{DCGM_EXPORTER_CONFIG_DIR}/aicluster-counters.csv"
DCGM_COUNTERS_SOURCE = ROLES_DIR / "monitoring" / "files" / "dcgm-counters.csv"
DCGM_EXPORTER_DROPIN_DIR = f"/etc/systemd/system/{DCGM_EXPORTER_SERVICE}.service.d"
DCGM_EXPORTER_DROPIN = f"{DCGM_EXPORTER_DROPIN_DIR}/aicluster.conf"
#: Where the nvidia component's nv-hostengine (nvidia-dcgm.service, run with NVIDIA's
#: defaults) listens: "with no options, it ... opens a TCP listener on 127.0.0.1:5555"
#: (DCGM's nv-hostengine command reference). dcgm-exporter connects there where the
#: nvidia component runs it (nvidia_dcgm), and runs an embedded host engine elsewhere.
NV_HOSTENGINE = "127.0.0.1:5555"
#: The Slurm textfile collector on the Slurm controllers: a script, run every minute by
#: a timer, writing :data:`SLURM_TEXTFILE` in the textfile directory atomically.
SLURM_TEXTFILE = "aicluster_slurm.prom"
SLURM_SCRIPT = "/usr/local/sbin/aicluster-slurm-textfile"
SLURM_UNIT = "/etc/systemd/system/aicluster-slurm-textfile.service"
SLURM_TIMER = "/etc/systemd/system/aicluster-slurm-textfile.timer"
SLURM_TIMER_UNIT = "aicluster-slurm-textfile.timer"
#: Grafana (the vendor's standalone release, on the monitoring hosts).
GRAFANA_SERVICE = "aicluster-grafana"
GRAFANA_UNIT = f"/etc/systemd/system/{GRAFANA_SERVICE}.service"
GRAFANA_USER = "grafana"
GRAFANA_CONFIG_DIR = "/etc/grafana"
GRAFANA_CONFIG = f"{GRAFANA_CONFIG_DIR}/grafana.ini"
GRAFANA_PASSWORD_FILE = f"{GRAFANA_CONFIG_DIR}/admin-password"
GRAFANA_PROVISIONING = f"{GRAFANA_CONFIG_DIR}/provisioning"
#: Grafana reads each of these provisioning directories at start (empty where unused).
GRAFANA_PROVISIONING_DIRS = tuple(f"{GRAFANA_PROVISIONING}/{d}" for d in (
    "datasources", "dashboards", "plugins", "alerting"))
GRAFANA_DATASOURCES = f"{GRAFANA_PROVISIONING}/datasources/aicluster.yaml"
GRAFANA_DASHBOARD_PROVIDER = f"{GRAFANA_PROVISIONING}/dashboards/aicluster.yaml"
GRAFANA_DASHBOARDS_DIR = f"{GRAFANA_CONFIG_DIR}/dashboards/aicluster"
GRAFANA_LOG_DIR = "/var/log/grafana"
#: In a release directory: the sha256 of the archive unpacked there, once complete.
GRAFANA_MARKER = ".aicluster-unpacked"
#: Derives the admin password from a secret of random bytes (a generated file).
GRAFANA_PASSWORD_CONTEXT = b"aicluster monitoring grafana admin password"
#: The chrony textfile collector on every node (base installs chrony on every node): the
#: packaged chrony.py (prometheus-node-exporter-collectors), run every minute by our own
#: timer (the package has none for it), writing :data:`CHRONY_TEXTFILE` atomically.
CHRONY_TEXTFILE = "chrony.prom"
CHRONY_SCRIPT = "/usr/share/prometheus-node-exporter-collectors/chrony.py"
CHRONY_UNIT = "/etc/systemd/system/aicluster-chrony-textfile.service"
CHRONY_TIMER = "/etc/systemd/system/aicluster-chrony-textfile.timer"
CHRONY_TIMER_UNIT = "aicluster-chrony-textfile.timer"
#: The package's own NVMe SMART/wear collector (nvme_metrics.sh writing nvme.prom every
#: 15 minutes), enabled on the nodes that declare NVMe drives (hardware.nvme).
NVME_TIMER_UNIT = "prometheus-node-exporter-nvme.timer"
#: The results of `aicluster check --publish`, written on the monitoring hosts.
CHECK_TEXTFILE = "aicluster_check.prom"
#: The Prometheus rule files the role ships (roles/monitoring/files/rules/*.yml).
RULES_SOURCE = ROLES_DIR / "monitoring" / "files" / "rules"


def rule_files() -> list[str]:
    """The rule files the monitoring hosts get (the alert pack and recording rules)."""
    return sorted(p.name for p in RULES_SOURCE.glob("*.yml"))


#: What taking monitoring off a host runs (aicluster.common.absence): the server side
#: when the host leaves the ``monitoring`` group (its role), the agents as well when
#: the cluster has no monitoring host any more (``monitoring:all``: the component
#: itself). Packages go only when ``remove_packages`` names monitoring; the samples
#: (monitoring_storage_path) and the textfile directory stay.
REMOVAL = {
    "monitoring": {
        "services": [PROMETHEUS_SERVICE, ALERTMANAGER_SERVICE, BLACKBOX_SERVICE],
        "files": [PROMETHEUS_CONFIG, ALERTMANAGER_CONFIG, BLACKBOX_CONFIG,
                  *(f"{RULES_DIR}/{name}" for name in rule_files())],
        "packages": ["monitoring_server_packages"],
    },
    "monitoring:all": {
        "commands": [f"systemctl disable --now {SLURM_TIMER_UNIT} 2>/dev/null || true",
                     f"systemctl disable --now {CHRONY_TIMER_UNIT} 2>/dev/null || true"],
        "services": [NODE_EXPORTER_SERVICE, IPMI_EXPORTER_SERVICE, DCGM_EXPORTER_SERVICE],
        "files": [SLURM_TIMER, SLURM_UNIT, SLURM_SCRIPT, CHRONY_TIMER, CHRONY_UNIT,
                  NODE_EXPORTER_PIN,
                  DCGM_EXPORTER_PIN, DCGM_EXPORTER_DROPIN, DCGM_COUNTERS],
        "packages": ["monitoring_node_packages", "monitoring_ipmi_packages",
                     "monitoring_dcgm_packages"],
    },
}

#: The textfile each node gets with what the inventory declares of it (the alert pack
#: compares it with what the node reports: roles/monitoring/files/rules/README.md).
INVENTORY_TEXTFILE = "aicluster_inventory.prom"
#: The kind of each component's mounts in that file.
MOUNT_KINDS = {"nfs": "nfs", "ceph": "cephfs", "nvme_cache": "nvme_cache"}
#: InfiniBand rates: node_exporter reports bytes per second.
BYTES_PER_GBIT = 125_000_000

#: The alert a node that is down raises; it mutes the node's other alerts (inhibition).
NODE_DOWN_ALERT = "NodeDown"
#: The receiver that notifies nobody (alerts stay visible in Alertmanager and Grafana).
NONE_RECEIVER = "none"
#: The route key for every severity the route does not name.
DEFAULT_ROUTE = "default"
#: What Alertmanager groups notifications by.
GROUP_BY = ["alertname", "node"]

#: NFS over TCP (the server's nfsd or nfs-ganesha).
NFS_PORT = 2049
MINIO_CLUSTER_METRICS = "/minio/v2/metrics/cluster"
MINIO_LIVE = "/minio/health/live"
OLLAMA_PROBE_PATH = "/api/tags"
RAY_DASHBOARD_PROBE_PATH = "/api/version"
K3S_PROBE_PATH = "/readyz"

#: Prometheus' own rule of thumb: "on average, Prometheus uses only around 1-2 bytes per
#: sample" (docs, Storage: operational aspects); the high end, to be safe.
BYTES_PER_SAMPLE = 2
#: The share of the disk the samples may fill: Prometheus' docs advise a size limit of at
#: most 80-85% of the disk (the write-ahead log and compaction need the rest).
DISK_SHARE = 0.85
#: Series each target adds, estimated from what each exporter exposes (a node exporter
#: grows with the CPU count: per-CPU time in eight modes, frequency, scheduler and
#: softnet statistics). An estimate for sizing, not a measurement: bench/ records one.
SERIES = {
    "node": 1000,
    "node_per_cpu": 20,
    "dcgm_per_gpu": 60,
    "ipmi": 100,
    "ray": 1000,
    "minio": 1500,
    "ceph": 1500,
    "probe": 20,
    "prometheus": 1500,
    "alertmanager": 300,
}
#: Where a Prometheus' data may not be: filesystems that are memory, gone at reboot.
VOLATILE_PATHS = ("/run", "/dev/shm", "/tmp")

#: Settings every monitoring host shares (one configuration, two replicas).
SHARED_KEYS = (
    "monitoring_prometheus_port",
    "monitoring_alertmanager_port",
    "monitoring_alertmanager_cluster_port",
    "monitoring_scrape_interval",
    "monitoring_evaluation_interval",
    "monitoring_receivers",
    "monitoring_route",
    "monitoring_alert_group_wait",
    "monitoring_alert_group_interval",
    "monitoring_alert_repeat_interval",
    "monitoring_blackbox_targets",
    "monitoring_grafana_admin_keys_name",
)


# ---------------------------------------------------------------------------
# Hosts, addresses, and the settings every monitoring host shares
# ---------------------------------------------------------------------------


def monitoring_hosts(cluster: Cluster) -> list[str]:
    return list(cluster.group("monitoring"))


def cluster_data(cluster: Cluster, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings the monitoring hosts share (validate() refuses a monitoring host whose
    differ): ``data``'s, a monitoring host's own data, where given; else the first
    monitoring host's."""
    if data is None:
        hosts = monitoring_hosts(cluster)
        data = cluster.hosts[hosts[0]].data if hosts else {}
    return layered("monitoring", data)


def monitoring_network(cluster: Cluster) -> str:
    """The network every exporter and server listens on (the same on every node)."""
    return str(cluster_data(cluster)["monitoring_network"])


def node_address(cluster: Cluster, name: str) -> str:
    """The host's address on the monitoring network (its SSH address when it has none
    there: validate() refuses that)."""
    return host_address(cluster, name, monitoring_network(cluster)) or cluster.hosts[name].address


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def endpoint(address: str, port: int) -> str:
    return f"{url_host(address)}:{int(port)}"


def _labels(**labels: str) -> list[list[str]]:
    """A target group's labels as ``[name, value]`` pairs, in name order (plain data that
    reaches Ansible unchanged)."""
    return [[k, str(v)] for k, v in sorted(labels.items()) if v != ""]


def _group(targets: list[str], **labels: str) -> dict[str, Any]:
    return {"targets": targets, "labels": _labels(**labels)}


def _on(target: str, node: str, **labels: str) -> dict[str, Any]:
    """An exporter on a node: its ``instance`` is the node's inventory name (not the
    address and port), as its ``node`` label is."""
    return _group([target], instance=node, node=node, **labels)


def _job(name: str, groups: list[dict[str, Any]], *, path: str = "/metrics",
         scheme: str = "http", honor_labels: bool = False, bearer_file: str = "",
         ca_file: str = "", blackbox: str = "") -> dict[str, Any]:
    """One scrape job as plain data for prometheus.yml.j2: ``blackbox`` is the address of
    the exporter a probe job asks (the target becomes its ``target`` parameter)."""
    return {
        "job_name": name,
        "metrics_path": "/probe" if blackbox else path,
        "scheme": scheme,
        "honor_labels": honor_labels,
        "bearer_file": bearer_file,
        "ca_file": ca_file,
        "blackbox": blackbox,
        "static_configs": groups,
    }


def gpu_node(cluster: Cluster, name: str) -> bool:
    """A gpu_nodes host that declares GPUs (real or stand-in)."""
    return name in cluster.group("gpu_nodes") and cluster.hosts[name].spec.hardware.gpus.count > 0


def dcgm_hosts(cluster: Cluster) -> list[str]:
    """The hosts that run dcgm-exporter: every NVIDIA GPU node unless its
    ``monitoring_dcgm_exporter`` is false, and a stand-in GPU node that asks for it
    (the testbed's stand-in serves captured DCGM metrics there)."""
    out = []
    for name, host in cluster.hosts.items():
        asked = setting("monitoring", host.data, "monitoring_dcgm_exporter")
        nvidia = gpu_node(cluster, name) and host.spec.hardware.gpus.vendor == "nvidia"
        if (asked is True and gpu_node(cluster, name)) or (asked is None and nvidia):
            out.append(name)
    return out


def dcgm_hostengine(cluster: Cluster, name: str) -> str:
    """The nv-hostengine dcgm-exporter connects to on host ``name``: the nvidia
    component's (nvidia-dcgm.service, :data:`NV_HOSTENGINE`) where that component runs
    one (an NVIDIA GPU node with ``nvidia_dcgm`` on: its role's defaults under the host's
    data, as aicluster.components.nvidia decides), else "" (dcgm-exporter runs an
    embedded host engine in its own process, as it does by default)."""
    host = cluster.hosts[name]
    nvidia = gpu_node(cluster, name) and host.spec.hardware.gpus.vendor == "nvidia"
    return NV_HOSTENGINE if nvidia and setting("nvidia", host.data, "nvidia_dcgm") else ""


def ipmi_hosts(cluster: Cluster) -> list[str]:
    return [n for n, h in cluster.hosts.items()
            if setting("monitoring", h.data, "monitoring_ipmi") is True]


# ---------------------------------------------------------------------------
# Where the other components serve (each as that component decides it)
# ---------------------------------------------------------------------------


def _bound(cluster: Cluster, name: str, network: str, bind: str = "") -> str:
    """Where a client reaches a service bound to ``bind`` on host ``name``: that address,
    or the host's address on ``network`` (also for a service on every address)."""
    if bind and bind not in ("0.0.0.0", "::"):
        return bind
    return host_address(cluster, name, network) or cluster.hosts[name].address


def ray_endpoints(cluster: Cluster) -> dict[str, Any]:
    """Ray's nodes (head first) at their address on Ray's network, the head's GCS and
    dashboard (as aicluster.components.ray.derive makes them)."""
    head = cluster.group("ray_head")
    nodes = [*head, *(h for h in cluster.group("ray_workers") if h not in head)]
    if not head:
        return {"network": "", "nodes": [], "gcs": "", "dashboard": ""}
    head_v = layered("ray", cluster.hosts[head[0]].data)
    network = pick_network(cluster, head_v["ray_network"], nodes)
    out_nodes = []
    for name in nodes:
        port = layered("ray", cluster.hosts[name].data)["ray_metrics_export_port"]
        out_nodes.append({"node": name, "role": "head" if name == head[0] else "worker",
                          "address": _bound(cluster, name, network), "metrics_port": port})
    head_ip = out_nodes[0]["address"]
    dashboard = ""
    if head_v["ray_dashboard"]:
        bind = _bound(cluster, head[0], network, str(head_v["ray_dashboard_host"] or ""))
        dashboard = f"http://{endpoint(bind, head_v['ray_dashboard_port'])}" \
                    f"{RAY_DASHBOARD_PROBE_PATH}"
    return {"network": network, "nodes": out_nodes,
            "gcs": endpoint(head_ip, head_v["ray_port"]), "dashboard": dashboard}


def minio_endpoints(cluster: Cluster) -> dict[str, Any]:
    """MinIO's servers (as aicluster.components.minio.derive serves them: storage, else
    fabric, else management), their scheme, and how Prometheus authenticates: "public"
    when the MinIO settings say MINIO_PROMETHEUS_AUTH_TYPE=public, else "jwt" (MinIO's
    default: a bearer token made from the root credentials, which the deploy writes to
    :data:`MINIO_TOKEN`)."""
    hosts = list(cluster.group("minio"))
    if not hosts:
        return {"network": "", "scheme": "http", "auth": "jwt", "servers": []}
    v = layered("minio", cluster.hosts[hosts[0]].data)
    network = pick_network(cluster, v["minio_network"], hosts, ("storage", "fabric"))
    env = merge_config(v["minio_default_config"], v["minio_config"])
    auth = "public" if str(env.get("MINIO_PROMETHEUS_AUTH_TYPE", "")).lower() == "public" \
        else "jwt"
    tls = bool(v["minio_tls_cert_file"])
    servers = []
    for name in hosts:
        # With TLS, by the name its certificate is made for (base's /etc/hosts).
        where = (name if network == "management" else f"{name}-{network}") if tls \
            else _bound(cluster, name, network)
        port = setting("minio", cluster.hosts[name].data, "minio_port")
        servers.append({"node": name, "endpoint": endpoint(where, port)})
    return {"network": network, "scheme": "https" if tls else "http", "auth": auth,
            "servers": servers}


def ceph_endpoints(cluster: Cluster) -> dict[str, Any]:
    """The Ceph managers (one on each monitor host) at their address on Ceph's public
    network (as aicluster.components.ceph.derive picks it), where the ceph component
    binds each one's prometheus module: port ``ceph_mgr_prometheus_port``; none when
    ``ceph_mgr_prometheus`` is off (the first monitor's settings, as ceph reads them)."""
    mons = list(cluster.group("ceph_mons"))
    if not mons:
        return {"network": "", "managers": []}
    ceph_hosts = [n for n, h in cluster.hosts.items() if "ceph" in h.components()]
    v = layered("ceph", cluster.hosts[mons[0]].data)
    if not v["ceph_mgr_prometheus"]:
        return {"network": "", "managers": []}
    network = pick_network(cluster, v["ceph_network"], ceph_hosts, ("storage", "fabric"))
    port = int(v["ceph_mgr_prometheus_port"])
    return {"network": network, "managers": [
        {"node": n, "endpoint": endpoint(_bound(cluster, n, network), port)}
        for n in mons]}


def slurm_endpoints(cluster: Cluster) -> list[dict[str, str]]:
    """slurmctld on each controller (SlurmctldHost names its SSH address) and slurmdbd."""
    out = []
    controllers = list(cluster.group("slurm_controller"))
    if controllers:
        v = layered("slurm", cluster.hosts[controllers[0]].data)
        conf = merge_config(v["slurm_default_config"], v["slurm_config"])
        # SlurmctldPort may be a range (6817-6818): slurmctld listens on its first port.
        port = int(str(conf.get("SlurmctldPort", 6817)).split("-")[0])
        out += [{"node": n, "probe": "slurmctld",
                 "endpoint": endpoint(cluster.hosts[n].address, port)} for n in controllers]
    for name in cluster.group("slurm_dbd"):
        port = setting("slurm", cluster.hosts[name].data, "slurm_dbd_port")
        out.append({"node": name, "probe": "slurmdbd",
                    "endpoint": endpoint(cluster.hosts[name].address, port)})
    return out


def k3s_endpoints(cluster: Cluster) -> dict[str, Any]:
    """The k3s servers' API at their bind address (the node's address on k3s's network,
    as aicluster.components.k3s.derive makes it, unless k3s_config names one)."""
    servers = list(cluster.group("k3s_servers"))
    if not servers:
        return {"network": "", "servers": []}
    agents = [h for h in cluster.group("k3s_agents") if h not in servers]
    first = layered("k3s", cluster.hosts[servers[0]].data)
    network = pick_network(cluster, first["k3s_network"], [*servers, *agents])
    out = []
    for name in servers:
        v = layered("k3s", cluster.hosts[name].data)
        config = merge_config(merge_config(v["k3s_default_config"],
                                           v["k3s_server_default_config"]), v["k3s_config"])
        where = _bound(cluster, name, network, str(config.get("bind-address") or ""))
        out.append({"node": name,
                     "url": f"https://{endpoint(where, first['k3s_api_port'])}{K3S_PROBE_PATH}"})
    return {"network": network, "servers": out}


def ollama_endpoints(cluster: Cluster) -> dict[str, Any]:
    """Ollama's servers and gateways where their clients reach them (as
    aicluster.components.ollama.derive binds them)."""
    servers, gateways = list(cluster.group("ollama")), list(cluster.group("ollama_gateway"))
    hosts = list(dict.fromkeys([*servers, *gateways]))
    if not hosts:
        return {"network": "", "servers": [], "gateways": []}
    network = pick_network(cluster, setting("ollama", cluster.hosts[hosts[0]].data,
                                            "ollama_network"), hosts)

    def url(name: str, bind_key: str, port_key: str) -> dict[str, str]:
        v = layered("ollama", cluster.hosts[name].data)
        where = _bound(cluster, name, network, str(v[bind_key] or ""))
        return {"node": name, "url": f"http://{endpoint(where, v[port_key])}{OLLAMA_PROBE_PATH}"}

    return {"network": network,
            "servers": [url(n, "ollama_host", "ollama_port") for n in servers],
            "gateways": [url(n, "ollama_gateway_listen", "ollama_gateway_port")
                         for n in gateways]}


def nfs_endpoint(cluster: Cluster) -> dict[str, str]:
    """The NFS server where its clients mount from (as aicluster.components.nfs.derive
    picks it: storage, else fabric, else management)."""
    servers = cluster.group("nfs_server")
    if not servers:
        return {}
    name = servers[0]
    network = pick_network(cluster, setting("nfs", cluster.hosts[name].data, "nfs_network"),
                           [name], ("storage", "fabric"))
    return {"node": name, "network": network,
            "endpoint": endpoint(_bound(cluster, name, network), NFS_PORT)}


# ---------------------------------------------------------------------------
# Probes on the cluster networks
# ---------------------------------------------------------------------------


def _ip_version(cluster: Cluster, network: str) -> int:
    return cluster.spec.networks[network].subnet.version


def df_payload(cluster: Cluster, network: str) -> int:
    """The ICMP payload that fills a packet of the network's MTU exactly (IPv4: 20 bytes
    of IP header, 8 of ICMP): sent with don't-fragment set, it crosses only a path
    whose every link carries the MTU. 0: no such probe (no MTU declared, or IPv6, where
    the blackbox exporter cannot set don't-fragment)."""
    net = cluster.spec.networks[network]
    if net.mtu is None or _ip_version(cluster, network) != 4:
        return 0
    return int(net.mtu) - 28


def probe_networks(cluster: Cluster, prober: str) -> list[str]:
    """The cluster networks (all but management, where the node exporter's own ``up``
    says a node is gone) the prober has an address on: the ICMP probes run there."""
    return [n for n in cluster.spec.networks
            if n != "management" and cluster.hosts[prober].network_address(n)]


def _module(name: str, prober: str, **settings: Any) -> dict[str, Any]:
    """One blackbox module as plain data for blackbox.yml.j2 (every key always there)."""
    return {"name": name, "prober": prober, "timeout": "5s", "valid_status_codes": [],
            "insecure": False, "ca_file": "", "ip_protocol": "", "dont_fragment": False,
            "payload_size": 0, **settings}


def blackbox_modules(cluster: Cluster, prober: str | None = None) -> list[dict[str, Any]]:
    """The blackbox exporter's modules (blackbox.yml) as plain data: the generic ones,
    the k3s API's (its answer to an anonymous client, 401, proves it serves: k3s turns
    anonymous access off; its certificate is signed by k3s' own CA), MinIO's over TLS,
    and one don't-fragment ICMP module per network with a declared MTU."""
    modules = [_module("http_2xx", "http"), _module("tcp_connect", "tcp"),
               _module("icmp", "icmp")]
    if k3s_endpoints(cluster)["servers"]:
        modules.append(_module("k3s_api", "http", valid_status_codes=[200, 401],
                               insecure=True))
    if minio_endpoints(cluster)["scheme"] == "https":
        modules.append(_module("minio_tls", "http", ca_file=MINIO_CA))
    hosts = monitoring_hosts(cluster)
    prober = prober or (hosts[0] if hosts else None)
    for network in probe_networks(cluster, prober) if prober else []:
        size = df_payload(cluster, network)
        if size:
            modules.append(_module(f"icmp_df_{network}", "icmp", ip_protocol="ip4",
                                   dont_fragment=True, payload_size=size))
    return modules


# ---------------------------------------------------------------------------
# The scrape configuration
# ---------------------------------------------------------------------------


def scrape_configs(cluster: Cluster, prober: str | None = None,
                   data: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Prometheus' scrape jobs, derived from the inventory, for the Prometheus on
    ``prober`` (a monitoring host, the first by default: its own blackbox exporter runs
    the probes; ``data``: its data, where not the inventory's). Plain data for
    roles/monitoring/templates/prometheus.yml.j2."""
    hosts = monitoring_hosts(cluster)
    prober = prober or (hosts[0] if hosts else next(iter(cluster.hosts)))
    mine = cluster.hosts[prober].data if data is None else data
    bb_port = setting("monitoring", mine, "monitoring_blackbox_port")
    blackbox = endpoint(node_address(cluster, prober), bb_port)
    shared = cluster_data(cluster, data)
    jobs: list[dict[str, Any]] = []

    def exporter(job: str, names: list[str], key: str) -> None:
        if names:
            jobs.append(_job(job, [
                _on(endpoint(node_address(cluster, n),
                             setting("monitoring", cluster.hosts[n].data, key)), n)
                for n in names]))

    exporter("node", list(cluster.hosts), "monitoring_node_exporter_port")
    exporter("dcgm", dcgm_hosts(cluster), "monitoring_dcgm_exporter_port")
    exporter("ipmi", ipmi_hosts(cluster), "monitoring_ipmi_exporter_port")
    if hosts:
        jobs.append(_job("prometheus", [
            _on(endpoint(node_address(cluster, n), shared["monitoring_prometheus_port"]), n)
            for n in hosts]))
        jobs.append(_job("alertmanager", [
            _on(endpoint(node_address(cluster, n), shared["monitoring_alertmanager_port"]), n)
            for n in hosts]))

    ray = ray_endpoints(cluster)
    if ray["nodes"]:
        jobs.append(_job("ray", [_on(endpoint(r["address"], r["metrics_port"]), r["node"],
                                     role=r["role"]) for r in ray["nodes"]]))
    minio = minio_endpoints(cluster)
    if minio["servers"]:
        auth = {"bearer_file": MINIO_TOKEN if minio["auth"] == "jwt" else "",
                "ca_file": MINIO_CA if minio["scheme"] == "https" else "",
                "scheme": minio["scheme"]}
        # Every server answers for the whole cluster, each server's drives included
        # (rules take the max over them, so one server down loses nothing).
        jobs.append(_job("minio", [_on(s["endpoint"], s["node"]) for s in minio["servers"]],
                         path=MINIO_CLUSTER_METRICS, **auth))
    ceph = ceph_endpoints(cluster)
    if ceph["managers"]:
        # The active manager serves the metrics, the standbys an empty page; Ceph's own
        # labels (ceph_daemon, instance of the daemon) are kept (Ceph's documentation).
        jobs.append(_job("ceph", [_on(m["endpoint"], m["node"]) for m in ceph["managers"]],
                         honor_labels=True))

    http: list[dict[str, Any]] = []
    tcp: list[dict[str, Any]] = []
    for s in slurm_endpoints(cluster):
        tcp.append(_probe("tcp_connect", s["endpoint"], s["node"], "slurm", s["probe"]))
    if ray["gcs"]:
        head = ray["nodes"][0]["node"]
        tcp.append(_probe("tcp_connect", ray["gcs"], head, "ray", "ray_gcs"))
        if ray["dashboard"]:
            http.append(_probe("http_2xx", ray["dashboard"], head, "ray", "ray_dashboard"))
    for s in k3s_endpoints(cluster)["servers"]:
        http.append(_probe("k3s_api", s["url"], s["node"], "k3s", "k3s_api"))
    ollama = ollama_endpoints(cluster)
    for s in ollama["servers"]:
        http.append(_probe("http_2xx", s["url"], s["node"], "ollama", "ollama"))
    for s in ollama["gateways"]:
        http.append(_probe("http_2xx", s["url"], s["node"], "ollama", "ollama_gateway"))
    for s in minio["servers"]:
        module = "minio_tls" if minio["scheme"] == "https" else "http_2xx"
        http.append(_probe(module, f"{minio['scheme']}://{s['endpoint']}{MINIO_LIVE}",
                           s["node"], "minio", "minio"))
    nfs = nfs_endpoint(cluster)
    if nfs:
        tcp.append(_probe("tcp_connect", nfs["endpoint"], nfs["node"], "nfs", "nfs"))
    icmp: list[dict[str, Any]] = []
    for network in probe_networks(cluster, prober):
        size = df_payload(cluster, network)
        for name, host in cluster.hosts.items():
            address = host.network_address(network)
            if not address:
                continue
            icmp.append(_group([address], __param_module="icmp", component="network",
                               network=network, node=name, probe="icmp"))
            if size:
                icmp.append(_group([address], __param_module=f"icmp_df_{network}",
                                   component="network", network=network, node=name,
                                   probe="icmp_df"))
    for extra in shared["monitoring_blackbox_targets"] or []:
        group = _probe(extra["module"], extra["target"], "", "extra", extra["name"])
        {"http_2xx": http, "tcp_connect": tcp, "icmp": icmp}[extra["module"]].append(group)
    for job, groups in (("blackbox_http", http), ("blackbox_tcp", tcp),
                        ("blackbox_icmp", icmp)):
        if groups:
            jobs.append(_job(job, groups, blackbox=blackbox))
    return jobs


def _probe(module: str, target: str, node: str, component: str,
           service: str) -> dict[str, Any]:
    """A service probe's target group: the module it runs (``__param_module``), the
    service it proves (``service``), the component and the node that serves it."""
    return _group([target], __param_module=module, component=component, node=node,
                  service=service)


def targets_by_job(cluster: Cluster, prober: str | None = None) -> dict[str, list[str]]:
    """Each job's targets (a summary for docs and tests)."""
    return {j["job_name"]: [t for g in j["static_configs"] for t in g["targets"]]
            for j in scrape_configs(cluster, prober)}


# ---------------------------------------------------------------------------
# Alertmanager: the pair, the receivers, the route
# ---------------------------------------------------------------------------


def alertmanager_peers(cluster: Cluster, data: Mapping[str, Any] | None = None) -> list[str]:
    """Every monitoring host's Alertmanager cluster address (``address:port``): two
    monitoring hosts make a clustered pair that shares silences and sends each
    notification once; one host runs alone (no peers)."""
    port = cluster_data(cluster, data)["monitoring_alertmanager_cluster_port"]
    return [endpoint(node_address(cluster, n), port) for n in monitoring_hosts(cluster)]


def alertmanager_targets(cluster: Cluster, data: Mapping[str, Any] | None = None) -> list[str]:
    """Where each Prometheus sends its alerts: every Alertmanager (they deduplicate)."""
    port = cluster_data(cluster, data)["monitoring_alertmanager_port"]
    return [endpoint(node_address(cluster, n), port) for n in monitoring_hosts(cluster)]


def receivers(cluster: Cluster, data: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The receivers as plain data for alertmanager.yml.j2: each with its type's fields
    (a secret as the file the deploy writes it to, never its value); "none" is always
    there."""
    out = []
    declared = cluster_data(cluster, data)["monitoring_receivers"] or []
    for r in declared:
        entry = {"name": r["name"], "type": r["type"],
                 "send_resolved": r.get("send_resolved") is not False,
                 "url": "", "url_file": "", "to": "", "from": "", "smarthost": "",
                 "auth_username": "", "auth_password_file": "",
                 "require_tls": r.get("require_tls") is not False}
        if r["type"] == "webhook":
            entry["url"] = r.get("url") or ""
            if r.get("url_key_name"):
                entry["url_file"] = f"{SECRETS_DIR}/{r['url_key_name']}"
        elif r["type"] == "email":
            entry.update({"to": r["to"], "from": r["from"], "smarthost": r["smarthost"],
                          "auth_username": r.get("auth_username") or ""})
            if r.get("auth_key_name"):
                entry["auth_password_file"] = f"{SECRETS_DIR}/{r['auth_key_name']}"
        out.append(entry)
    if NONE_RECEIVER not in {r["name"] for r in declared}:
        out.insert(0, {"name": NONE_RECEIVER, "type": "none", "send_resolved": False,
                       "url": "", "url_file": "", "to": "", "from": "", "smarthost": "",
                       "auth_username": "", "auth_password_file": "", "require_tls": True})
    return out


def route(cluster: Cluster, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The root route (to the ``default`` receiver, "none" when not named) and one route
    per severity the inventory names."""
    v = cluster_data(cluster, data)
    wanted = dict(v["monitoring_route"] or {})
    default = wanted.pop(DEFAULT_ROUTE, NONE_RECEIVER)
    return {
        "receiver": default,
        "group_by": list(GROUP_BY),
        "group_wait": v["monitoring_alert_group_wait"],
        "group_interval": v["monitoring_alert_group_interval"],
        "repeat_interval": v["monitoring_alert_repeat_interval"],
        "routes": [{"severity": s, "receiver": r} for s, r in sorted(wanted.items())],
    }


def inhibit_rules() -> list[dict[str, Any]]:
    """A node that is down mutes its other alerts (they share the ``node`` label)."""
    return [{"source": [f'alertname="{NODE_DOWN_ALERT}"'],
             "target": [f'alertname!="{NODE_DOWN_ALERT}"'], "equal": ["node"]}]


def stamps(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """For each daemon of a monitoring host, the files it runs with, in a fixed order,
    where their digest is recorded once it took them up (:data:`STAMP_DIR`), and the
    command that prints that digest (the same for both engines, so either may follow
    the other). A run that stopped after writing a file but before its daemon took it
    up leaves the digest unrecorded: the next run checks and restarts that daemon."""
    secrets = [entry["path"] for entry in secret_files(cluster)]
    daemons = {
        "prometheus": [PROMETHEUS_DEFAULTS, PROMETHEUS_CONFIG,
                       *(f"{RULES_DIR}/{name}" for name in rule_files()), *secrets],
        "alertmanager": [ALERTMANAGER_DEFAULTS, ALERTMANAGER_CONFIG, *secrets],
        "blackbox": [BLACKBOX_DEFAULTS, BLACKBOX_CONFIG, BLACKBOX_DROPIN],
    }
    return {name: {"files": paths, "path": f"{STAMP_DIR}/{name}",
                   "digest": stamp_command(paths),
                   "read": applied_command(paths, f"{STAMP_DIR}/{name}")}
            for name, paths in daemons.items()}


def secret_files(cluster: Cluster) -> list[dict[str, Any]]:
    """The secrets the monitoring hosts need as files under :data:`SECRETS_DIR`: each
    receiver's (``kind`` "secret": the secret itself, its reference under ``secrets``)
    and, where Prometheus reads MinIO's metrics with a token, MinIO's metrics token
    (``kind`` "minio_token": :func:`minio_token_file`)."""
    out = []
    for r in cluster_data(cluster)["monitoring_receivers"] or []:
        for key in ("url_key_name", "auth_key_name"):
            if r.get(key):
                out.append({"path": f"{SECRETS_DIR}/{r[key]}", "kind": "secret",
                            "secret": r[key], "ref": _secret_ref(cluster, r[key], r[key])})
    token = minio_token_file(cluster)
    if token:
        out.append(token)
    return out


def minio_token_file(cluster: Cluster) -> dict[str, Any] | None:
    """:data:`MINIO_TOKEN`, what Prometheus' job "minio" sends as its bearer token (None
    where there is no MinIO, or MinIO's metrics are public): minted on the deploying
    machine from MinIO's root user and root password (the secret the minio component
    reads, ``minio_root_keys_name``, at the same reference), as ``mc admin prometheus
    generate`` makes it (aicluster.common.minio_credentials: HS512, ``sub`` the root
    user, ``iss`` "prometheus", a fixed ``exp``: the same token on every deploy)."""
    minio = minio_endpoints(cluster)
    if not minio["servers"] or minio["auth"] != "jwt":
        return None
    v = layered("minio", cluster.hosts[minio["servers"][0]["node"]].data)
    name = str(v["minio_root_keys_name"])
    return {"path": MINIO_TOKEN, "kind": "minio_token", "secret": name,
            "ref": minio_root_keys_ref(cluster, name), "bytes": int(v["minio_root_keys_bytes"]),
            "user": str(v["minio_root_user"])}


def secret_text(entry: Mapping[str, Any], dry: bool = False) -> str:
    """What the file of a :func:`secret_files` entry holds, read (a receiver's secret) or
    minted (MinIO's metrics token) on the deploying machine; never printed. Raises
    SecretError (or UnicodeDecodeError, a receiver's secret that is not text)."""
    if entry["kind"] == "minio_token":
        return minio_metrics_token(entry["ref"], entry["secret"], entry["bytes"],
                                   entry["user"], dry=dry)
    return read_secret({entry["secret"]: entry["ref"]}, entry["secret"]).decode()


def grafana_admin_ref(cluster: Cluster) -> dict[str, str]:
    """Where Grafana's admin password is: the inventory's secret, else a file on the
    deploying machine (generated once)."""
    return _secret_ref(cluster, cluster_data(cluster)["monitoring_grafana_admin_keys_name"],
                       "grafana-admin.secret")


# ---------------------------------------------------------------------------
# Grafana: where it runs, its data sources, its release, its admin password
# ---------------------------------------------------------------------------


def grafana_hosts(cluster: Cluster) -> list[str]:
    """The monitoring hosts that run Grafana (``monitoring_grafana`` not false)."""
    return [n for n in monitoring_hosts(cluster)
            if setting("monitoring", cluster.hosts[n].data, "monitoring_grafana")]


def _uid_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:18] or "host"


def grafana_datasources(cluster: Cluster, host_name: str,
                        data: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The Prometheus data sources of the Grafana on ``host_name``: its own Prometheus
    first, the default, under :data:`DATASOURCE_UID` (the uid every shipped dashboard
    reads); then every other monitoring host's Prometheus (the other replica), by name.
    Plain data for grafana-datasources.yaml.j2."""
    shared = cluster_data(cluster, data)
    port = shared["monitoring_prometheus_port"]
    interval = f"{int(shared['monitoring_scrape_interval'])}s"
    out = []
    for name in [host_name, *(n for n in monitoring_hosts(cluster) if n != host_name)]:
        own = name == host_name
        out.append({
            "name": "Prometheus" if own else f"Prometheus on {name}",
            "uid": DATASOURCE_UID if own else f"{DATASOURCE_UID}-{_uid_part(name)}",
            "url": f"http://{endpoint(node_address(cluster, name), port)}",
            "is_default": own,
            "time_interval": interval,
        })
    return out


def grafana_unpack_command(release_dir: str, filename: str, sha256: str) -> str:
    """Unpack the release archive in ``release_dir`` (its top directory,
    ``grafana-v<version>``, stripped) and record the complete unpack: the one command
    both engines run."""
    archive = f"{release_dir}/{filename}"
    return (f"tar -xzf {shlex.quote(archive)} -C {shlex.quote(release_dir)} "
            "--strip-components=1 --no-same-owner && echo "
            f"{sha256} > {shlex.quote(release_dir + '/' + GRAFANA_MARKER)}")


def grafana_admin_password(ref: Mapping[str, Any], name: str, size: int,
                           dry: bool = False) -> str:
    """Grafana's admin password from its secret: the secret itself when it is one line
    of text (8 to 128 printable characters, no space at either end); derived from it
    when it is random bytes (the file generated on the first deploy; not generated in
    a *dry* run). Raises SecretError naming the secret, never its value."""
    return password_from_secret(
        ref, name, size, fits=lambda line: 8 <= len(line) <= 128 and line == line.strip(),
        what="a Grafana admin password (one line of 8 to 128 characters, no space at "
             "either end)", context=GRAFANA_PASSWORD_CONTEXT, length=32, dry=dry)


def grafana_vars(cluster: Cluster, host_name: str, v: Mapping[str, Any],
                 data: Mapping[str, Any] | None, art: Mapping[str, Any]) -> dict[str, Any]:
    """What the Grafana tasks and templates of a host that runs it use (``v``: its
    monitoring settings; ``art``: its Grafana release file, artifacts.derived_vars)."""
    base = str(v["monitoring_grafana_install_dir"]).rstrip("/")
    release = f"{base}/{v['monitoring_grafana_version']}"
    return {
        "monitoring_grafana_release_dir": release,
        "monitoring_grafana_current": f"{base}/current",
        "monitoring_grafana_marker": f"{release}/{GRAFANA_MARKER}",
        "monitoring_grafana_unpack_command": grafana_unpack_command(
            release, str(art["filename"]), str(art["sha256"])),
        "monitoring_grafana_config": GRAFANA_CONFIG,
        "monitoring_grafana_password_file": GRAFANA_PASSWORD_FILE,
        "monitoring_grafana_provisioning": GRAFANA_PROVISIONING,
        "monitoring_grafana_provisioning_dirs": list(GRAFANA_PROVISIONING_DIRS),
        "monitoring_grafana_dashboards_dir": GRAFANA_DASHBOARDS_DIR,
        "monitoring_grafana_log_dir": GRAFANA_LOG_DIR,
        "monitoring_grafana_plugins_dir":
            f"{str(v['monitoring_grafana_data_dir']).rstrip('/')}/plugins",
        "monitoring_grafana_datasources": grafana_datasources(cluster, host_name, data),
        "monitoring_grafana_dashboard_files": dashboard_files(),
        "monitoring_grafana_admin_ref": grafana_admin_ref(cluster),
    }


# ---------------------------------------------------------------------------
# What each node's textfile says the inventory declares
# ---------------------------------------------------------------------------


def ib_port_label(port: Mapping[str, Any]) -> str:
    """A declared InfiniBand port as ``aicluster check`` names it (``pci 0000:41:00.0
    port 1``, ``mlx5_0 port 1``): the same text as
    aicluster.components.infiniband.derive.port_label, so an alert can name the port the
    inventory declares."""
    ids = [f"guid {port['guid']}" if port.get("guid") else "",
           f"pci {port['pci']}" if port.get("pci") else "",
           "" if port.get("guid") or port.get("pci") else str(port.get("device") or "")]
    return f"{' '.join(i for i in ids if i)} port {port['port']}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _sample(metric: str, labels: list[tuple[str, str]], value: int) -> str:
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels)
    return f"{metric}{{{inner}}} {value}"


def inventory_gauges(cluster: Cluster, host: str,
                     devices: Mapping[str, str] | None = None) -> str:
    """The text of :data:`INVENTORY_TEXTFILE` on ``host`` (Prometheus' text format): what
    the inventory declares of the node, for the alert pack to compare with what the node
    reports (roles/monitoring/files/rules/README.md):

    * ``aicluster_inventory_gpus``: the GPUs dcgm-exporter should report (on the hosts
      it runs on: :func:`dcgm_hosts`);
    * ``aicluster_inventory_ib_port_rate_bytes_per_second{device,port,subject}``: each
      declared InfiniBand port's rate in node_exporter's unit, ``device`` the HCA's name
      as the kernel reports it now (``devices``: the port's label -> that name, as the
      deploy reads it on the node; a port declared by device name has it anyway; an
      empty one matches no port, and the port counts as missing), ``port`` its number,
      ``subject`` the port as the inventory names it;
    * ``aicluster_inventory_mount{mountpoint,kind}``: each network or cache mount the
      node is given (kind ``nfs``, ``cephfs``, ``nvme_cache``).
    """
    hw = cluster.hosts[host].spec.hardware
    lines: list[str] = []
    if host in dcgm_hosts(cluster):
        lines += [
            "# HELP aicluster_inventory_gpus GPUs the inventory declares on this node "
            "(hardware.gpus.count).",
            "# TYPE aicluster_inventory_gpus gauge",
            _sample("aicluster_inventory_gpus", [("model", hw.gpus.model)], hw.gpus.count),
        ]
    if hw.ib_ports:
        lines += [
            "# HELP aicluster_inventory_ib_port_rate_bytes_per_second The rate the inventory "
            "declares for an InfiniBand port (hardware.ib_ports rate_gbps), in bytes per "
            "second.",
            "# TYPE aicluster_inventory_ib_port_rate_bytes_per_second gauge",
        ]
        for port in hw.ib_ports:
            p = port.model_dump()
            label = ib_port_label(p)
            device = (devices or {}).get(label) or (
                "" if p.get("guid") or p.get("pci") else str(p.get("device") or ""))
            lines.append(_sample("aicluster_inventory_ib_port_rate_bytes_per_second",
                                 [("device", device), ("port", str(p["port"])),
                                  ("subject", label)],
                                 int(p["rate_gbps"]) * BYTES_PER_GBIT))
    mounts = [(path, MOUNT_KINDS.get(component, component))
              for component, paths in host_mounts(cluster, host).items() for path in paths]
    if mounts:
        lines += [
            "# HELP aicluster_inventory_mount A mount the inventory gives this node.",
            "# TYPE aicluster_inventory_mount gauge",
            *(_sample("aicluster_inventory_mount", [("kind", kind), ("mountpoint", path)], 1)
              for path, kind in sorted(mounts)),
        ]
    return "\n".join(lines) + "\n" if lines else ""


# ---------------------------------------------------------------------------
# The daemons' command lines
# ---------------------------------------------------------------------------


def _own(cluster: Cluster, host_name: str, data: Mapping[str, Any] | None) -> dict[str, Any]:
    return layered("monitoring", cluster.hosts[host_name].data if data is None else data)


def prometheus_args(cluster: Cluster, host_name: str,
                    data: Mapping[str, Any] | None = None) -> list[str]:
    v = _own(cluster, host_name, data)
    storage = str(v["monitoring_storage_path"]).rstrip("/")
    args = [
        f"--config.file={PROMETHEUS_CONFIG}",
        f"--storage.tsdb.path={storage}/metrics2",
        f"--storage.tsdb.retention.time={int(v['monitoring_retention_days'])}d",
    ]
    if v["monitoring_retention_size_gb"]:
        args.append(f"--storage.tsdb.retention.size={int(v['monitoring_retention_size_gb'])}GB")
    args.append("--web.listen-address="
                + endpoint(node_address(cluster, host_name), v["monitoring_prometheus_port"]))
    return args


def alertmanager_args(cluster: Cluster, host_name: str,
                      data: Mapping[str, Any] | None = None) -> list[str]:
    v = _own(cluster, host_name, data)
    address = node_address(cluster, host_name)
    args = [
        f"--config.file={ALERTMANAGER_CONFIG}",
        f"--storage.path={str(v['monitoring_storage_path']).rstrip('/')}/alertmanager",
        f"--web.listen-address={endpoint(address, v['monitoring_alertmanager_port'])}",
    ]
    peers = alertmanager_peers(cluster, data)
    own = endpoint(address, v["monitoring_alertmanager_cluster_port"])
    if len(peers) > 1:
        args.append(f"--cluster.listen-address={own}")
        args += [f"--cluster.peer={p}" for p in peers if p != own]
    else:
        args.append("--cluster.listen-address=")  # alone: no gossip port at all
    return args


#: The mount points the node exporter's filesystem collector leaves out. Debian's and
#: Ubuntu's package leaves out /mnt and /media as well (its default is
#: ``^/(dev|proc|run|sys|mnt|media|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)``,
#: as it logs at start), where the NVMe cache, CephFS, NFS and MinIO's drives are
#: mounted: without this, none of them would be watched and MountMissing would fire
#: for each (found on the testbed). Upstream's default, with /run whole.
FILESYSTEM_EXCLUDE = "^/(dev|proc|run|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)"


def node_exporter_args(cluster: Cluster, host_name: str,
                       data: Mapping[str, Any] | None = None) -> list[str]:
    v = _own(cluster, host_name, data)
    collectors = [c for c in v["monitoring_node_exporter_collectors"] or [] if c != "textfile"]
    return [
        "--web.listen-address="
        + endpoint(node_address(cluster, host_name), v["monitoring_node_exporter_port"]),
        f"--collector.textfile.directory={v['monitoring_textfile_dir']}",
        f"--collector.filesystem.mount-points-exclude={FILESYSTEM_EXCLUDE}",
        *[f"--collector.{c}" for c in collectors],
    ]


def dcgm_exporter_args(cluster: Cluster, host_name: str,
                       data: Mapping[str, Any] | None = None) -> list[str]:
    """dcgm-exporter's command line (the drop-in's ExecStart): our counters file, the
    node's address on the monitoring network only, the nvidia component's host engine
    where it runs one (:func:`dcgm_hostengine`)."""
    v = _own(cluster, host_name, data)
    args = ["-f", DCGM_COUNTERS,
            "-a", endpoint(node_address(cluster, host_name), v["monitoring_dcgm_exporter_port"])]
    engine = dcgm_hostengine(cluster, host_name)
    return args + (["-r", engine] if engine else [])


def blackbox_args(cluster: Cluster, host_name: str,
                  data: Mapping[str, Any] | None = None) -> list[str]:
    v = _own(cluster, host_name, data)
    return [f"--config.file={BLACKBOX_CONFIG}",
            "--web.listen-address="
            + endpoint(node_address(cluster, host_name), v["monitoring_blackbox_port"])]


# ---------------------------------------------------------------------------
# Retention against the disk
# ---------------------------------------------------------------------------


def estimated_series(cluster: Cluster) -> int:
    """Series one Prometheus holds for this inventory (:data:`SERIES`, an estimate)."""
    node = sum(SERIES["node"] + SERIES["node_per_cpu"] * h.spec.hardware.cpus
               for h in cluster.hosts.values())
    dcgm = sum(SERIES["dcgm_per_gpu"] * cluster.hosts[n].spec.hardware.gpus.count
               for n in dcgm_hosts(cluster))
    probes = sum(len(g["targets"]) for j in scrape_configs(cluster) if j["blackbox"]
                 for g in j["static_configs"])
    servers = len(monitoring_hosts(cluster))
    return (node + dcgm + SERIES["ipmi"] * len(ipmi_hosts(cluster))
            + SERIES["ray"] * len(ray_endpoints(cluster)["nodes"])
            + SERIES["minio"] * len(cluster.group("minio"))
            + SERIES["ceph"] * (1 if cluster.group("ceph_mons") else 0)
            + SERIES["probe"] * probes
            + (SERIES["prometheus"] + SERIES["alertmanager"]) * servers)


def estimated_gb(cluster: Cluster, days: int, interval: int) -> float:
    """The disk ``days`` of samples take: series x samples per series x bytes per
    sample (Prometheus' capacity formula)."""
    samples = days * 86400 / max(int(interval), 1)
    return estimated_series(cluster) * samples * BYTES_PER_SAMPLE / 1e9


# ---------------------------------------------------------------------------
# The values templates use
# ---------------------------------------------------------------------------


def textfile_path(v: Mapping[str, Any], name: str) -> str:
    """The path of the textfile ``name`` in the host's textfile directory (``v``: its
    monitoring settings)."""
    return f"{str(v['monitoring_textfile_dir']).rstrip('/')}/{name}"


def check_textfiles(cluster: Cluster) -> dict[str, str]:
    """Where `aicluster check --publish` writes its results: each monitoring host's
    :data:`CHECK_TEXTFILE` in its textfile directory (host -> path); empty without a
    monitoring host."""
    return {name: textfile_path(layered("monitoring", cluster.hosts[name].data),
                                CHECK_TEXTFILE)
            for name in monitoring_hosts(cluster)}


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("monitoring", data)
    server = host_name in monitoring_hosts(cluster)
    shared = cluster_data(cluster, data)
    out: dict[str, Any] = {
        "monitoring_is_server": server,
        "monitoring_network_name": monitoring_network(cluster),
        "monitoring_node_address": node_address(cluster, host_name),
        "monitoring_node_exporter_args": node_exporter_args(cluster, host_name, data),
        "monitoring_dcgm_exporter_enabled": host_name in dcgm_hosts(cluster),
        "monitoring_dcgm_exporter_address": endpoint(node_address(cluster, host_name),
                                                     v["monitoring_dcgm_exporter_port"]),
        "monitoring_dcgm_exporter_args": dcgm_exporter_args(cluster, host_name, data),
        "monitoring_dcgm_exporter_binary": DCGM_EXPORTER_BINARY,
        "monitoring_ipmi_exporter_enabled": host_name in ipmi_hosts(cluster),
        "monitoring_ipmi_exporter_address": endpoint(node_address(cluster, host_name),
                                                     v["monitoring_ipmi_exporter_port"]),
        "monitoring_inventory_textfile": f"{str(v['monitoring_textfile_dir']).rstrip('/')}/"
                                         f"{INVENTORY_TEXTFILE}",
        "monitoring_inventory_gauges": inventory_gauges(cluster, host_name),
        "monitoring_ipmi_exporter_args": [
            "--web.listen-address=" + endpoint(node_address(cluster, host_name),
                                               v["monitoring_ipmi_exporter_port"])],
        "monitoring_slurm_textfile": host_name in cluster.group("slurm_controller"),
        "monitoring_slurm_textfile_path": f"{str(v['monitoring_textfile_dir']).rstrip('/')}/"
                                          f"{SLURM_TEXTFILE}",
        "monitoring_chrony_textfile_path": textfile_path(v, CHRONY_TEXTFILE),
        "monitoring_chrony_script": CHRONY_SCRIPT,
        "monitoring_nvme_textfile": bool(cluster.hosts[host_name].spec.hardware.nvme),
        "monitoring_grafana_enabled": host_name in grafana_hosts(cluster),
    }
    out.update(artifacts.derived_vars(cluster, host_name, "monitoring", data))
    if server and out["monitoring_grafana_enabled"]:
        out.update(grafana_vars(cluster, host_name, v, data,
                                out["monitoring_artifact_files"]["grafana"]))
    if not server:
        return out
    out.update({
        "monitoring_cluster_name": cluster.spec.cluster_name,
        "monitoring_rules_dir": RULES_DIR,
        "monitoring_rule_files": rule_files(),
        "monitoring_secret_files": secret_files(cluster),
        "monitoring_stamps": stamps(cluster),
        "monitoring_scrape_configs": scrape_configs(cluster, host_name, data),
        "monitoring_alertmanagers": alertmanager_targets(cluster, data),
        "monitoring_alertmanager_peers": alertmanager_peers(cluster, data),
        "monitoring_receiver_list": receivers(cluster, data),
        "monitoring_alert_route": route(cluster, data),
        "monitoring_inhibit_rules": inhibit_rules(),
        "monitoring_blackbox_modules": blackbox_modules(cluster, host_name),
        "monitoring_prometheus_args": prometheus_args(cluster, host_name, data),
        "monitoring_alertmanager_args": alertmanager_args(cluster, host_name, data),
        "monitoring_blackbox_args": blackbox_args(cluster, host_name, data),
        "monitoring_scrape_interval_text": f"{int(shared['monitoring_scrape_interval'])}s",
        "monitoring_evaluation_interval_text":
            f"{int(shared['monitoring_evaluation_interval'])}s",
    })
    return out


# ---------------------------------------------------------------------------
# Validation (no I/O): each error names the host and the field
# ---------------------------------------------------------------------------


def validate(cluster: Cluster) -> list[str]:
    """monitoring's own checks of the inventory."""
    errors: list[str] = artifacts.validate(cluster, "monitoring")  # its release pins
    for name, host in cluster.hosts.items():
        v = layered("monitoring", host.data)
        if v["monitoring_dcgm_exporter"] is True and not gpu_node(cluster, name):
            errors.append(
                f"host {name!r}: monitoring_dcgm_exporter: true, but the host is not a GPU "
                "node (not in gpu_nodes with hardware.gpus.count above 0); dcgm-exporter "
                "reads NVIDIA GPUs: remove the setting or declare the GPUs")
    hosts = monitoring_hosts(cluster)
    if not hosts:
        return errors
    # Every node's exporters listen on the monitoring network: one network, every node on it.
    errors += differs_from_first("monitoring", cluster, list(cluster.hosts),
                                 ["monitoring_network"], "node")
    errors += differs_from_first("monitoring", cluster, hosts, SHARED_KEYS, "monitoring host")
    network = monitoring_network(cluster)
    for name in cluster.hosts:
        errors += network_errors(cluster, name, "monitoring_network", network)
    if errors:
        return errors
    errors += _check_receivers(cluster, hosts[0])
    for name in hosts:
        errors += _check_storage(cluster, name)
        errors += _check_reach(cluster, name)
        errors += _check_ports(cluster, name)
    return errors


def _check_receivers(cluster: Cluster, first: str) -> list[str]:
    v = cluster_data(cluster)
    where = f"host {first!r}"
    declared = {r["name"]: r for r in v["monitoring_receivers"] or []}
    known = [NONE_RECEIVER, *(n for n in declared if n != NONE_RECEIVER)]
    errors = []
    for severity, name in (v["monitoring_route"] or {}).items():
        if name not in known:
            errors.append(
                f"{where}: monitoring_route.{severity}: {name!r} is not a receiver; "
                f"declared: {', '.join(known)} (add it to monitoring_receivers or correct "
                "the name)")
    for i, r in enumerate(v["monitoring_receivers"] or []):
        for key in ("url_key_name", "auth_key_name"):
            secret = r.get(key)
            if secret and secret not in cluster.spec.secrets:
                declared_secrets = ", ".join(sorted(cluster.spec.secrets)) or "none"
                errors.append(
                    f"{where}: monitoring_receivers[{i}].{key}: names the secret {secret!r}, "
                    f"which `secrets` does not declare (declared: {declared_secrets}); add "
                    f"it to `secrets` as {{'file': PATH}} or {{'env': VARIABLE}}")
    return errors


def _check_storage(cluster: Cluster, name: str) -> list[str]:
    """The host's data directory is on a disk, and the retention fits on it."""
    v = layered("monitoring", cluster.hosts[name].data)
    where = f"host {name!r}"
    path = str(v["monitoring_storage_path"])
    volatile = [p for p in VOLATILE_PATHS if path == p or path.startswith(p + "/")]
    if volatile:
        return [f"{where}: monitoring_storage_path: {path} is on {volatile[0]}, a memory "
                "filesystem emptied at every boot; Prometheus' samples need a disk "
                "(e.g. /var/lib/prometheus)"]
    disk = int(v["monitoring_storage_gb"])
    days = int(v["monitoring_retention_days"])
    if not disk:
        return [f"{where}: monitoring_storage_gb: not stated, and the host is in the "
                f"monitoring group: Prometheus keeps {days} days of samples in {path}; state "
                "the space (GB) of the filesystem there (docs/components/monitoring.md, "
                "\"Retention and disk\")"]
    usable = disk * DISK_SHARE
    size = int(v["monitoring_retention_size_gb"])
    if size:
        if size > usable:
            return [f"{where}: monitoring_retention_size_gb: {size} GB does not fit in "
                    f"monitoring_storage_gb ({disk} GB): Prometheus' samples may fill at most "
                    f"{DISK_SHARE:.0%} of the disk ({math.floor(usable)} GB; the write-ahead "
                    "log and compaction need the rest)"]
        return []
    interval = int(cluster_data(cluster)["monitoring_scrape_interval"])
    need = estimated_gb(cluster, days, interval)
    if need > usable:
        return [f"{where}: monitoring_retention_days: {days} days of about "
                f"{estimated_series(cluster)} series scraped every {interval} s take about "
                f"{math.ceil(need)} GB, more than {DISK_SHARE:.0%} of monitoring_storage_gb "
                f"({disk} GB); keep fewer days, cap them with monitoring_retention_size_gb, or "
                "state a larger disk"]
    return []


def _check_reach(cluster: Cluster, name: str) -> list[str]:
    """A Prometheus scrapes and probes over the networks the targets are on: it needs an
    address on each (the cluster networks are not routed to one another)."""
    needs: dict[str, list[str]] = {}
    for component, network in (("ray", ray_endpoints(cluster)["network"]),
                               ("minio", minio_endpoints(cluster)["network"]),
                               ("ceph", ceph_endpoints(cluster)["network"]),
                               ("k3s", k3s_endpoints(cluster)["network"]),
                               ("ollama", ollama_endpoints(cluster)["network"]),
                               ("nfs", nfs_endpoint(cluster).get("network", ""))):
        if network and network != "management":
            needs.setdefault(network, []).append(component)
    return [f"host {name!r}: groups: monitoring: the host has no address on the {network} "
            f"network, where {', '.join(components)} serve(s) the metrics and probes it "
            "scrapes; give it an address there (hardware.nics, network_bonds or "
            "network_vlans) or make another host the monitoring host"
            for network, components in needs.items()
            if not cluster.hosts[name].network_address(network)]


def _check_ports(cluster: Cluster, name: str) -> list[str]:
    """The servers and exporters of a monitoring host listen on different ports."""
    v = layered("monitoring", cluster.hosts[name].data)
    keys = ["monitoring_prometheus_port", "monitoring_alertmanager_port",
            "monitoring_alertmanager_cluster_port", "monitoring_blackbox_port",
            "monitoring_grafana_port", "monitoring_node_exporter_port"]
    if name in dcgm_hosts(cluster):
        keys.append("monitoring_dcgm_exporter_port")
    if name in ipmi_hosts(cluster):
        keys.append("monitoring_ipmi_exporter_port")
    seen: dict[int, str] = {}
    errors = []
    for key in keys:
        port = int(v[key])
        if port in seen:
            errors.append(f"host {name!r}: {key}: port {port} is also {seen[port]}'s; give "
                          "each server and exporter its own port")
        else:
            seen[port] = key
    return errors


# ---------------------------------------------------------------------------
# Plan warnings
# ---------------------------------------------------------------------------


def warnings(cluster: Cluster) -> list[str]:
    """What the plan should say about monitoring without refusing it: no monitoring host
    at all (monitoring added later misses the failures of the first runs), or one (a
    single point of failure)."""
    hosts = monitoring_hosts(cluster)
    if not hosts:
        return ["groups: monitoring: no host is in the monitoring group: a cluster "
                "monitored only later has paid for its first dead GPU, flapping link or full "
                "disk by the time it is; name a monitoring host now (two for a replica "
                "and an Alertmanager pair)"]
    if len(hosts) == 1:
        return [f"host {hosts[0]!r}: groups: monitoring has one host: its Prometheus and "
                "Alertmanager are a single point of failure (name a second host for a "
                "second replica and an Alertmanager pair)"]
    return []
