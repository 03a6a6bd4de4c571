"""The k3s component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Any

from aicluster import artifacts
from aicluster.common.absence import keep_one
from aicluster.common.netconf import interfaces
from aicluster.common.networks import host_address, network_errors, pick_network
from aicluster.common.rollout import drain_command, uncordon_command
from aicluster.common.settings import differs_from_first, layered, merge_config
from aicluster.components.k3s.model import BIND_KEY
from aicluster.components.k3s.probe import BINARY, TOKEN_FILE, command_text
from aicluster.inventory import Cluster
from aicluster.secrets import read_secret
from aicluster.secrets import secret_ref as _secret_ref

CONFIG_DIR = "/etc/rancher/k3s"
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
UNIT_DIR = "/etc/systemd/system"
#: The release binary as shipped, beside the one in use until the rollout swaps it.
STAGED_BINARY = "/usr/local/lib/aicluster/k3s/k3s"
#: The node's rollout helper (install the staged binary, restart, wait until Ready).
TOOL = "/usr/local/sbin/aicluster-k3s"
IMAGES_DIR = "/var/lib/rancher/k3s/agent/images"
MANIFESTS_DIR = "/var/lib/rancher/k3s/server/manifests"
#: The auto-deploy manifests of GPU clusters (written on every server). The
#: RuntimeClass ``nvidia`` is k3s's own (its packaged ``runtimes`` manifest).
MANIFESTS = {
    "aicluster-nvidia-device-plugin.yaml": "nvidia-device-plugin.yaml.j2",
}
#: Manifests earlier versions wrote, removed from every server: the RuntimeClass
#: ``nvidia`` k3s itself ships (two manifests owning one object fight over it).
RETIRED_MANIFESTS = ("aicluster-nvidia-runtimeclass.yaml",)
#: The label GPU nodes register with; the device plugin DaemonSet selects it.
GPU_LABEL = "nvidia.com/gpu.present=true"
#: Annotation that marks a cordon as the k3s rollout's (never an admin's cordon).
ANNOTATION = "aicluster.io/k3s-rollout"
#: The secret's name in the inventory's ``secrets``.
TOKEN_SECRET = "k3s_token"
TOKEN_CONTEXT = b"aicluster k3s cluster token v1"
#: Settings every k3s node must share.
CLUSTER_KEYS = ("k3s_version", "k3s_network", "k3s_registration_address", "k3s_api_port",
                "k3s_nvidia_device_plugin_image")


# ---------------------------------------------------------------------------
# Values computed from the whole inventory (both engines use these)
# ---------------------------------------------------------------------------


def servers(cluster: Cluster) -> list[str]:
    return list(cluster.group("k3s_servers"))


def agents(cluster: Cluster) -> list[str]:
    return [h for h in cluster.group("k3s_agents") if h not in cluster.group("k3s_servers")]


def k3s_hosts(cluster: Cluster) -> list[str]:
    """Every k3s node in rollout order: servers (the first first), then agents."""
    return [*servers(cluster), *agents(cluster)]


def k3s_network(cluster: Cluster, data: Mapping[str, Any]) -> str:
    """The network k3s runs on: the inventory's ``k3s_network``, or fabric when every
    k3s node has an address there, else management."""
    return pick_network(cluster, layered("k3s", data)["k3s_network"], k3s_hosts(cluster))


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def token_ref(cluster: Cluster) -> dict[str, str]:
    """Where the cluster token is: the inventory's ``secrets.k3s_token``, else a file on
    the deploying machine, ``~/.local/share/aicluster/<cluster_name>/k3s-token``."""
    return _secret_ref(cluster, TOKEN_SECRET, "k3s-token")


def has_gpus(cluster: Cluster, name: str) -> bool:
    """Whether the host has NVIDIA GPUs for k3s to offer (a stand-in GPU, vendor
    "standin", is none: no NVIDIA runtime, label or device plugin for it)."""
    gpus = cluster.hosts[name].spec.hardware.gpus
    return gpus.count > 0 and gpus.vendor == "nvidia"


def node_config(v: Mapping[str, Any], *, role: str, host_name: str, node_ip: str,
                iface: str, cluster_init: bool, server_url: str, gpu: bool,
                tls_san: list[str], api_port: int = 6443) -> dict[str, Any]:
    """config.yaml as a dict: the defaults, the inventory's ``k3s_config`` over them (a
    null value drops a key), then what aicluster computes. ``bind-address`` is the node
    address unless the settings name one (or drop it with null: k3s's own default,
    every address)."""
    out: dict[str, Any] = dict(v["k3s_default_config"] or {})
    if role == "server":
        out.update(v["k3s_server_default_config"] or {})
    out = merge_config(out, v["k3s_config"])
    dropped = {key for key, value in (v["k3s_config"] or {}).items() if value is None}
    if BIND_KEY not in out and BIND_KEY not in dropped:
        out[BIND_KEY] = node_ip
    out["node-name"] = host_name
    out["node-ip"] = node_ip
    if role == "server":
        out["https-listen-port"] = int(api_port)
    out["token-file"] = TOKEN_FILE
    if iface:
        out["flannel-iface"] = iface
    if cluster_init:
        out["cluster-init"] = True
    if server_url:
        out["server"] = server_url
    if role == "server" and tls_san:
        out["tls-san"] = [*[s for s in out.get("tls-san") or [] if s not in tls_san], *tls_san]
    labels = [*(v["k3s_node_labels"] or []), *([GPU_LABEL] if gpu else [])]
    if labels:
        out["node-label"] = list(dict.fromkeys(labels))
    return out


#: k3s's own defaults for the pod and service networks (``cluster-cidr``,
#: ``service-cidr``; a dual-stack cluster gives two, comma-separated).
POD_NETWORKS = {"cluster-cidr": "10.42.0.0/16", "service-cidr": "10.43.0.0/16"}


def pod_networks(cluster: Cluster) -> dict[str, list[str]]:
    """The cluster's pod and service networks (``cluster-cidr``, ``service-cidr``), as
    the first server's configuration gives them (they are server settings, the same on
    every server), else k3s's defaults."""
    srv = servers(cluster)
    config: dict[str, Any] = {}
    if srv:
        v = layered("k3s", cluster.hosts[srv[0]].data)
        config = merge_config({**(v["k3s_default_config"] or {}),
                               **(v["k3s_server_default_config"] or {})}, v["k3s_config"])
    return {key: [part.strip() for part in str(config.get(key) or default).split(",")
                  if part.strip()]
            for key, default in POD_NETWORKS.items()}


def trusted_sources(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> list[str]:
    """What base's firewall must accept on a k3s node besides the cluster's networks:
    the pod and service networks, where CoreDNS, metrics-server and every pod reach the
    API server and the kubelet from (k3s's documentation asks a firewall to trust them)."""
    if host_name not in k3s_hosts(cluster):
        return []
    return [n for networks in pod_networks(cluster).values() for n in networks]


def admin_server(cluster: Cluster, host_name: str) -> str:
    """The server that cordons, drains and uncordons ``host_name``: the first server
    that is not the node itself (the node itself in a one-server cluster)."""
    others = [s for s in servers(cluster) if s != host_name]
    return others[0] if others else host_name


# ---------------------------------------------------------------------------
# Inventory checks
# ---------------------------------------------------------------------------


def validate(cluster: Cluster) -> list[str]:
    """k3s's checks of the inventory that need more than one value (the settings model,
    aicluster.components.k3s.model, has checked each value): host and field named."""
    errors: list[str] = artifacts.validate(cluster, "k3s")  # its release pins
    nodes = k3s_hosts(cluster)
    if not nodes:
        return errors
    agent_group = set(cluster.group("k3s_agents"))
    for name in servers(cluster):
        if name in agent_group:
            errors.append(
                f"host {name!r}: groups: is in both k3s_servers and k3s_agents; a server "
                "runs workloads too: name it in k3s_servers only"
            )
    srv = servers(cluster)
    if len(srv) == 2:
        errors.append(
            f"host {srv[1]!r}: groups: k3s_servers has 2 hosts; embedded etcd needs a "
            "majority, so two servers fail when either does: give 1 server (SQLite) or "
            "3 or more (embedded etcd)"
        )
    errors += differs_from_first("k3s", cluster, nodes, CLUSTER_KEYS, "k3s node")
    errors += _pod_network_errors(cluster)
    gpu_nodes = set(cluster.group("gpu_nodes"))
    for name in nodes:
        data = cluster.hosts[name].data
        v = layered("k3s", data)
        where = f"host {name!r}"
        if v["k3s_network"]:
            errors += network_errors(
                cluster, name, "k3s_network", v["k3s_network"],
                "(node-ip); give it one in hardware.nics, or choose another k3s_network")
        if has_gpus(cluster, name):
            if name not in gpu_nodes:
                errors.append(
                    f"{where}: hardware.gpus: the host has GPUs and runs k3s but is not in "
                    "gpu_nodes; add it there so the nvidia component installs the driver "
                    "and the container toolkit k3s's containerd uses"
                )
            elif data.get("nvidia_container_toolkit") is False:
                errors.append(
                    f"{where}: nvidia_container_toolkit: false, but the host runs k3s with "
                    "GPUs: k3s's containerd needs the NVIDIA container runtime"
                )
            if "runtimes" in _disabled(v):
                errors.append(
                    f"{where}: k3s_config.disable: runtimes is disabled, but the host runs "
                    "k3s with GPUs: the RuntimeClass nvidia the GPU pods and NVIDIA's "
                    "device plugin run with is k3s's runtimes manifest"
                )
            if not v["k3s_nvidia_device_plugin_image"]:
                errors.append(
                    f"{where}: k3s_nvidia_device_plugin_image: not set, and the host runs "
                    "k3s with GPUs; name NVIDIA's k8s-device-plugin image (or your "
                    "registry's copy) in group_data"
                )
    return errors


def _disabled(v: Mapping[str, Any]) -> list[str]:
    """The packaged components k3s_config's ``disable`` turns off (a list, or one
    comma-separated string)."""
    value = merge_config(v["k3s_default_config"], v["k3s_config"]).get("disable") or []
    items = value.split(",") if isinstance(value, str) else value
    return [str(i).strip() for i in items]


def _pod_network_errors(cluster: Cluster) -> list[str]:
    """The pod and service networks are networks: each a CIDR that overlaps neither the
    other nor a cluster network (a node would route its own subnet into the pods)."""
    import ipaddress

    srv = servers(cluster)
    where = f"host {srv[0]!r}" if srv else f"host {k3s_hosts(cluster)[0]!r}"
    seen: list[tuple[str, Any]] = [
        (f"the {name} network", n.subnet) for name, n in cluster.spec.networks.items()]
    errors = []
    for key, networks in pod_networks(cluster).items():
        for text in networks:
            try:
                net = ipaddress.ip_network(text)
            except ValueError:
                errors.append(f"{where}: k3s_config.{key}: {text!r} is not a network in "
                              "CIDR form (10.42.0.0/16)")
                continue
            for what, other in seen:
                if net.version == other.version and net.overlaps(other):
                    errors.append(f"{where}: k3s_config.{key}: {text} overlaps {what} "
                                  f"{other}; pods, services and nodes need networks of "
                                  "their own")
            seen.append((f"k3s's {key}", net))
    return errors


# ---------------------------------------------------------------------------
# The token (deploying machine only) and the decision (both engines)
# ---------------------------------------------------------------------------


def token_text(secret: bytes) -> str:
    """The cluster token from the secret: a secret of printable text (an existing
    cluster's token in an environment variable) as it is; random bytes (the file made
    on the first deploy) as a hex digest derived from them."""
    try:
        text = secret.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    if text and text.isprintable() and not any(c.isspace() for c in text):
        return text
    return hmac.new(secret, TOKEN_CONTEXT, hashlib.sha256).hexdigest()


def cluster_token(ref: Mapping[str, Any], size: int, dry: bool = False) -> str:
    """The cluster token (generated once when the inventory names a file that does not
    exist; not in a *dry* run). Raises SecretError naming the secret, never its value."""
    return token_text(read_secret({TOKEN_SECRET: dict(ref)}, TOKEN_SECRET,
                                  generate_bytes=int(size), dry=dry))


def token_file_text(token: str) -> str:
    return token + "\n"


def token_digest(token: str) -> str:
    """What the node's fact prints for the token file (never the token)."""
    return hashlib.sha256(token_file_text(token).encode()).hexdigest()


def _minor(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"^v?(\d+)\.(\d+)\.", str(version or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def decide(v: Mapping[str, Any], node: Mapping[str, Any], digest: str) -> dict[str, Any]:
    """What to do on one node, from the inventory's values, its K3sNode fact and the
    digest of the cluster token.

    ``action``: ``start`` (k3s does not run: put the binary in place, enable, start,
    wait until Ready), ``upgrade`` (it runs another binary: drain, swap, restart, wait,
    uncordon), ``restart`` (it runs the wanted binary: restarted, and waited for, only
    when its config, unit or token file changes); ``iface``: flannel's interface
    (the inventory's, else the node's); ``problems``: why nothing may be done here.
    """
    name = v["inventory_hostname"]
    problems = []
    files_ = v.get("k3s_artifact_files") or {}
    wanted = (files_.get("k3s") or {}).get("sha256", "")
    running = node.get("active") in ("active", "activating", "reloading")
    have = _minor(node.get("version"))
    want = _minor(v["k3s_version"])
    if running and node.get("binary") and node.get("binary") != wanted and have and want:
        if want < have:
            problems.append(
                f"host {name!r}: k3s_version: {v['k3s_version']} is older than the "
                f"{node.get('version')} the node runs; Kubernetes cannot be downgraded"
            )
        elif want[0] != have[0] or want[1] > have[1] + 1:
            problems.append(
                f"host {name!r}: k3s_version: {v['k3s_version']} skips a minor version "
                f"after the {node.get('version')} the node runs; Kubernetes upgrades one "
                "minor version at a time: pin each minor release in turn"
            )
    if running and node.get("token") and node.get("token") != digest:
        problems.append(
            f"host {name!r}: secrets.k3s_token: the node runs k3s with another cluster "
            f"token ({TOKEN_FILE}); a running cluster's token is changed with `k3s token "
            "rotate` on a server, then the secret updated to match, never by a deploy"
        )
    iface = v["k3s_flannel_iface"] or node.get("iface") or ""
    if running:
        action = "upgrade" if node.get("binary") != wanted else "restart"
    else:
        action = "start"
    return {"action": action, "iface": iface, "problems": problems}


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------




def interface_name(cluster: Cluster, host_name: str, network: str) -> str:
    """The kernel name of the interface holding the host's address on ``network``, when
    the inventory gives it (a NIC by name, a bond, a VLAN); "" when it gives a NIC by
    MAC only or the port is IPoIB (the deploy then reads it from the node)."""
    if network == "management":
        return ""
    for item in interfaces(cluster, host_name, cluster.hosts[host_name].data):
        if item.get("network") == network and item.get("addresses") and item.get("name"):
            return str(item["name"])
    return ""


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("k3s", data)
    srv = servers(cluster)
    role = "server" if host_name in srv else "agent"
    first = srv[0] if srv else host_name
    first_data = cluster.hosts[first].data
    first_v = layered("k3s", first_data)
    network = k3s_network(cluster, first_data)
    node_ip = host_address(cluster, host_name, network) or cluster.hosts[host_name].address
    first_ip = host_address(cluster, first, network) or cluster.hosts[first].address
    registration = str(first_v["k3s_registration_address"] or "")
    port = int(first_v["k3s_api_port"])
    cluster_init = host_name == first and len(srv) >= 3
    # The first server joins nobody (not even the address in front of the servers).
    server_url = "" if host_name == first else (
        f"https://{_url_host(registration or first_ip)}:{port}")
    iface = interface_name(cluster, host_name, network)
    gpu = has_gpus(cluster, host_name)
    config = node_config(
        v, role=role, host_name=host_name, node_ip=node_ip, iface=iface,
        cluster_init=cluster_init, server_url=server_url, gpu=gpu,
        tls_san=[registration] if registration else [], api_port=port,
    )
    unit = "k3s" if role == "server" else "k3s-agent"
    admin = admin_server(cluster, host_name)
    return {
        "k3s_cluster_name": cluster.spec.cluster_name,
        "k3s_role": role,
        "k3s_unit": unit,
        "k3s_first_server": first,
        "k3s_cluster_init": cluster_init,
        "k3s_server_url": server_url,
        "k3s_network_name": network,
        "k3s_node_ip": node_ip,
        "k3s_flannel_iface": iface,
        "k3s_node_config": config,
        "k3s_gpu": gpu,
        "k3s_gpu_cluster": any(has_gpus(cluster, h) for h in k3s_hosts(cluster)),
        "k3s_rollout_order": k3s_hosts(cluster),
        "k3s_admin_server": admin,
        "k3s_drain_command": drain_command(host_name, int(v["k3s_drain_timeout"]), ANNOTATION,
                                           "upgrade"),
        "k3s_uncordon_command": uncordon_command(host_name, ANNOTATION),
        "k3s_token_ref": token_ref(cluster),
        "k3s_token_file": TOKEN_FILE,
        "k3s_config_file": CONFIG_FILE,
        "k3s_binary": BINARY,
        "k3s_staged_binary": STAGED_BINARY,
        "k3s_tool": TOOL,
        "k3s_images_dir": IMAGES_DIR,
        "k3s_manifests_dir": MANIFESTS_DIR,
        "k3s_manifests": dict(MANIFESTS),
        "k3s_retired_manifests": list(RETIRED_MANIFESTS),
        # What the Ansible role runs to read the node (the pyinfra fact's command).
        "k3s_fact_command": command_text(unit, node_ip),
        **artifacts.derived_vars(cluster, host_name, "k3s", data),
    }


#: What a deploy takes off a host the inventory no longer gives a k3s role (by role, and
#: the component's own key when the host loses it altogether): services stopped and
#: disabled, configuration files the deploy wrote removed, services reloaded afterwards
#: (aicluster.common.absence). Data stays (/var/lib/rancher: the datastore, images,
#: volumes); the k3s binary too, unless the inventory's remove_packages names k3s.
REMOVAL = {
    "k3s_servers": {"services": ["k3s"], "files": [f"{UNIT_DIR}/k3s.service"]},
    "k3s_agents": {"services": ["k3s-agent"], "files": [f"{UNIT_DIR}/k3s-agent.service"]},
    "k3s": {"services": ["k3s", "k3s-agent"],
            "files": [f"{UNIT_DIR}/k3s.service", f"{UNIT_DIR}/k3s-agent.service", CONFIG_FILE,
                      TOKEN_FILE, TOOL],
            "software": [BINARY, STAGED_BINARY]},
}


def removal_refusals(recorded, wanted) -> list[str]:
    """The only k3s server is not taken away while agents stay: the cluster's datastore
    is on it."""
    return keep_one(recorded, wanted, "k3s", "k3s_servers", "the k3s server")
