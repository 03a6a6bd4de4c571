"""The k3s deploy planned on fake hosts: one server, three servers (cluster-init on the
first, the others joining it), GPU and non-GPU agents, Debian/Ubuntu/Rocky, a re-run
that changes nothing, the order of a version bump, the token never shown; every bad
input refused by validate, naming host and field; config.yaml of inventories/lab.py
kept as golden files.

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
The release pins here are test fixtures for files this test makes (stand-ins for the
k3s binary and its air-gap images), not a real release's checksums; their URLs are
on 127.0.0.1, where nothing is ever downloaded from here.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
from pathlib import Path

import pytest
import yaml
from pyinfra.api.exceptions import PyinfraError

from aicluster import PROJECT_ROOT, artifacts
from aicluster.common.settings import template_vars
from aicluster.components.k3s import deploy as k3s
from aicluster.components.k3s import derive as k3s_derive
from aicluster.components.k3s import facts as k3s_fact
from aicluster.components.k3s import probe as k3s_probe
from aicluster.inventory import InventoryError, load_cluster, validate
from aicluster.render import render
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan
from tests.golden import GOLDEN_DIR, assert_golden

NEW, OLD = "1.36.0+k3s1", "1.35.1+k3s1"
#: Stand-ins for the release files (bytes this test makes), per version.
BINARY = {NEW: b"#!/bin/sh\necho stand-in k3s 1.36\n" * 40,
          OLD: b"#!/bin/sh\necho stand-in k3s 1.35\n" * 40}
IMAGES = {NEW: b"stand-in air-gap images 1.36\n" * 40, OLD: b"stand-in air-gap images 1.35\n" * 40}
TOKEN = "K10stand-in-cluster-token-for-tests::server:0123456789abcdef"
CONFIG = "/etc/rancher/k3s/config.yaml"
SERVER_UNIT = "/etc/systemd/system/k3s.service"
AGENT_UNIT = "/etc/systemd/system/k3s-agent.service"
GOLDEN = GOLDEN_DIR / "k3s"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _host(name: str, n: int, *, by_mac: bool = False, gpus: int = 0) -> tuple[str, dict]:
    nic = {"network": "fabric", "address": f"10.20.0.{n}", "mtu": 9000}
    nic.update({"mac": f"b8:3f:d2:00:00:{n:02x}"} if by_mac else {"name": "ens1"})
    hardware: dict = {"nics": [nic]}
    if gpus:
        hardware["gpus"] = {"model": "H100-SXM5-80GB", "count": gpus, "memory_gb": 80,
                            "nvswitch": True}
    return name, {"ssh_hostname": f"10.10.0.{n}", "hardware": hardware}


S1, S2, S3 = _host("s1", 11), _host("s2", 12), _host("s3", 13)
GPU1 = _host("gpu1", 21, by_mac=True, gpus=8)
CPU1 = _host("cpu1", 31)
THREE = ([S1, S2, S3, GPU1, CPU1],
         {"k3s_servers": ["s1", "s2", "s3"], "k3s_agents": ["gpu1", "cpu1"],
          "gpu_nodes": ["gpu1"]})
ONE = ([S1, CPU1], {"k3s_servers": ["s1"], "k3s_agents": ["cpu1"]})


@pytest.fixture
def store(tmp_path: Path, monkeypatch) -> dict:
    """A download cache holding the stand-in files, and the token in the environment."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for data in (*BINARY.values(), *IMAGES.values()):
        (cache / _sha(data)).write_bytes(data)
    monkeypatch.setattr(artifacts, "_RESOLVED", {})  # undone after the test
    monkeypatch.setenv("TEST_K3S_TOKEN", TOKEN)
    return {
        "networks": {"management": {"subnet": "10.10.0.0/24"},
                     "fabric": {"subnet": "10.20.0.0/24", "mtu": 9000}},
        "nvidia_cuda_repo_url": "https://mirror.example.org/nvidia/cuda/repos",
        "secrets": {"k3s_token": {"env": "TEST_K3S_TOKEN"}},
        "artifacts_cache_dir": str(cache),
        "k3s_version": NEW,
        "k3s_nvidia_device_plugin_image": "registry.example.org/nvidia/k8s-device-plugin:v0.17.1",
        "k3s_artifacts": {
            "k3s": {"url": "http://127.0.0.1:9/k3s/{version}/k3s",
                    "sha256": {v: {"amd64": _sha(b)} for v, b in BINARY.items()}},
            "images": {"url": "http://127.0.0.1:9/k3s/{version}/k3s-airgap-images-{arch}.tar.zst",
                       "sha256": {v: {"amd64": _sha(b)} for v, b in IMAGES.items()}},
        },
    }


def _node(binary=None, version=None, active="inactive", token=None, iface=None):
    return {"binary": binary, "version": version, "active": active, "token": token,
            "iface": iface, "nvidia": False}


def _files(existing: dict[str, bytes]):
    def file_fact(path, **kw):
        if path not in existing:
            return None
        mode = 644
        if path in (k3s_derive.STAGED_BINARY, k3s_derive.TOOL):
            mode = 755
        elif path in (k3s.TOKEN_FILE, CONFIG) or path.startswith(k3s_derive.MANIFESTS_DIR):
            mode = 600
        return {"mode": mode, "user": "root", "group": "root"}

    def sha1(path, **kw):
        return hashlib.sha1(existing[path]).hexdigest() if path in existing else None

    dirs = {"/etc/rancher/k3s": 755, "/usr/local/lib/aicluster/k3s": 755,
            k3s_derive.IMAGES_DIR: 755, k3s_derive.MANIFESTS_DIR: 700, "/usr/local/bin": 755,
            "/usr/local/sbin": 755,
            "/etc/systemd/system": 755}

    def directory(path, **kw):
        if path not in dirs:
            return None
        return {"mode": dirs[path], "user": "root", "group": "root"}

    return {"File": file_fact, "Sha1File": sha1, "Directory": directory}


def _plan(cluster, inventory=THREE, distro="debian12", facts=None, extra=None):
    hosts, groups = inventory
    host_facts = {}
    for name, _ in hosts:
        host_facts[name] = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "Arch": "x86_64",
            "K3sNode": _node(iface="eno1" if name == "gpu1" else None),
            **_files({}),
            **(facts or {}).get(name, {}),
        }
    return plan(hosts, groups, {**cluster, **(extra or {})}, host_facts, k3s.deploy)


def _deployed(cluster, version=NEW, inventory=THREE, configs=None):
    """Facts of nodes that run ``version`` with the files this deploy writes now."""
    fresh = _plan(cluster, inventory, extra={"k3s_version": version})
    facts = {}
    for name, _ in inventory[0]:
        server = name in inventory[1]["k3s_servers"]
        unit = SERVER_UNIT if server else AGENT_UNIT
        have = {path: fresh.upload(name, path).encode()
                for path in (CONFIG, unit, k3s_derive.TOOL)}
        if configs and name in configs:
            have[CONFIG] = configs[name].encode()
        have[k3s.TOKEN_FILE] = (TOKEN + "\n").encode()
        have[k3s_derive.STAGED_BINARY] = BINARY[version]
        have[f"{k3s_derive.IMAGES_DIR}/k3s-airgap-images-amd64.tar.zst"] = IMAGES[version]
        if server:
            for dest in k3s_derive.MANIFESTS:
                path = f"{k3s_derive.MANIFESTS_DIR}/{dest}"
                have[path] = fresh.upload(name, path).encode()
        unit_name = "k3s.service" if server else "k3s-agent.service"
        facts[name] = {
            "K3sNode": _node(_sha(BINARY[version]), version, "active",
                             k3s_derive.token_digest(TOKEN), "eno1" if name == "gpu1" else "ens1"),
            "SystemdStatus": {unit_name: True},
            "SystemdEnabled": {unit_name: True},
            **_files(have),
        }
    return facts


# --- servers, agents, config.yaml -----------------------------------------------------


def _config(p, name) -> dict:
    return yaml.safe_load(p.upload(name, CONFIG))


def test_three_servers_first_inits_etcd_others_join_it(store, distro):
    p = _plan(store, distro=distro)
    first = _config(p, "s1")
    assert first["cluster-init"] is True and "server" not in first
    assert first["node-ip"] == "10.20.0.11" and first["flannel-iface"] == "ens1"
    assert first["node-name"] == "s1" and first["write-kubeconfig-mode"] == "0600"
    assert first["token-file"] == "/etc/rancher/k3s/aicluster-token" and "token" not in first
    for name in ("s2", "s3"):
        cfg = _config(p, name)
        assert cfg["server"] == "https://10.20.0.11:6443" and "cluster-init" not in cfg
        assert "ExecStart=/usr/local/bin/k3s server\n" in p.upload(name, SERVER_UNIT)
    for name in ("gpu1", "cpu1"):
        cfg = _config(p, name)
        assert cfg["server"] == "https://10.20.0.11:6443"
        assert "write-kubeconfig-mode" not in cfg and "cluster-init" not in cfg
        assert "ExecStart=/usr/local/bin/k3s agent\n" in p.upload(name, AGENT_UNIT)
        assert SERVER_UNIT not in p.commands(name)
    # Servers one at a time (s1 first), then the agents.
    start = {n: p.op(n, "k3s servers: start one node at a time (Ready before the next)")
             for n in ("s1", "s2", "s3")}
    agents = {n: p.op(n, "k3s agents: start (Ready)") for n in ("gpu1", "cpu1")}
    assert len({op.index for op in start.values()}) == 1
    assert all(op.serial for op in start.values())
    assert not any(op.serial for op in agents.values())
    assert start["s1"].index < agents["gpu1"].index == agents["cpu1"].index
    assert f"{k3s_derive.TOOL} start" in start["s1"].text


def test_one_server_keeps_sqlite_and_agents_join_it(store):
    p = _plan(store, ONE)
    cfg = _config(p, "s1")
    assert "cluster-init" not in cfg and "server" not in cfg
    assert _config(p, "cpu1")["server"] == "https://10.20.0.11:6443"


def test_registration_address_in_front_of_the_servers(store):
    p = _plan(store, extra={"k3s_registration_address": "k3s.example.org",
                            "k3s_network": "management"})
    first = _config(p, "s1")
    assert first["tls-san"] == ["k3s.example.org"] and first["node-ip"] == "10.10.0.11"
    assert "server" not in first and "flannel-iface" not in first
    assert _config(p, "cpu1")["server"] == "https://k3s.example.org:6443"
    assert _config(p, "s2")["server"] == "https://k3s.example.org:6443"


def test_user_config_merges_over_the_defaults(store):
    p = _plan(store, extra={"k3s_config": {"disable": ["traefik"], "write-kubeconfig-mode": None,
                                           "kubelet-arg": ["max-pods=250"]},
                            "k3s_node_labels": ["topology.kubernetes.io/zone=rack1"]})
    cfg = _config(p, "s1")
    assert cfg["disable"] == ["traefik"] and cfg["kubelet-arg"] == ["max-pods=250"]
    assert "write-kubeconfig-mode" not in cfg
    assert cfg["node-label"] == ["topology.kubernetes.io/zone=rack1"]


def test_every_node_listens_on_its_cluster_address_and_servers_on_the_api_port(store):
    p = _plan(store, ONE, extra={"k3s_api_port": 7443})
    server, agent = _config(p, "s1"), _config(p, "cpu1")
    # k3s's default is every address; the API, the kubelet and the admin kubeconfig k3s
    # writes use bind-address.
    assert server["bind-address"] == server["node-ip"] == "10.20.0.11"
    assert agent["bind-address"] == agent["node-ip"] == "10.20.0.31"
    # k3s_api_port is where the servers listen, not only where agents join.
    assert server["https-listen-port"] == 7443
    assert agent["server"] == "https://10.20.0.11:7443" and "https-listen-port" not in agent


def test_bind_address_from_the_inventory_wins_and_null_means_every_address(store):
    p = _plan(store, ONE, extra={"k3s_config": {"bind-address": "0.0.0.0"}})
    assert _config(p, "s1")["bind-address"] == "0.0.0.0"
    p = _plan(store, ONE, extra={"k3s_config": {"bind-address": None}})
    assert "bind-address" not in _config(p, "s1") and "bind-address" not in _config(p, "cpu1")


def test_a_standin_gpu_is_no_nvidia_gpu_for_k3s(store):
    standin = ("cpu1", {**CPU1[1], "hardware": {**CPU1[1]["hardware"], "gpus": {
        "model": "standin", "count": 1, "vendor": "standin"}}})
    inventory = ([S1, standin], {**ONE[1], "gpu_nodes": ["cpu1"]})
    p = _plan(store, inventory, extra={"k3s_nvidia_device_plugin_image": ""})
    assert "node-label" not in _config(p, "cpu1")
    for dest in k3s_derive.MANIFESTS:
        p.op("s1", f"No GPU manifest {dest} (no k3s node has GPUs)")


def test_gpu_agent_gets_label_images_and_servers_the_manifests(store):
    p = _plan(store)
    gpu = _config(p, "gpu1")
    assert gpu["node-label"] == ["nvidia.com/gpu.present=true"]
    # Given by MAC only: flannel's interface is the one the node has the address on.
    assert gpu["flannel-iface"] == "eno1"
    assert "node-label" not in _config(p, "cpu1")
    for name in ("gpu1", "cpu1", "s1"):
        op = p.op(name, f"k3s {NEW} air-gap images")
        cache = Path(store["artifacts_cache_dir"])
        assert (f"FileUploadCommand({cache / _sha(IMAGES[NEW])}, "
                f"{k3s_derive.IMAGES_DIR}/k3s-airgap-images-amd64.tar.zst)") in op.text
    for name in ("s1", "s2", "s3"):
        # The RuntimeClass nvidia is k3s's own (its runtimes manifest): ours, written by
        # earlier versions, is removed.
        assert ("No aicluster-nvidia-runtimeclass.yaml (k3s ships the RuntimeClass nvidia "
                "itself)") in p.names(name)
        assert not any("runtimeclass" in path for path in p.files(name))
        ds = yaml.safe_load(
            p.upload(name, f"{k3s_derive.MANIFESTS_DIR}/aicluster-nvidia-device-plugin.yaml"))
        spec = ds["spec"]["template"]["spec"]
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert spec["containers"][0]["image"] == store["k3s_nvidia_device_plugin_image"]
    assert k3s_derive.MANIFESTS_DIR not in p.commands("gpu1")


def test_no_gpu_node_no_gpu_manifests(store):
    p = _plan(store, ONE)
    for dest in k3s_derive.MANIFESTS:
        op = p.op("s1", f"No GPU manifest {dest} (no k3s node has GPUs)")
        assert f"{k3s_derive.MANIFESTS_DIR}/{dest}" not in p.commands("s1").replace(op.text, "")


def test_binary_staged_from_the_cache_and_token_file_0600(store, distro):
    p = _plan(store, distro=distro)
    cache = Path(store["artifacts_cache_dir"])
    for name in ("s1", "gpu1", "cpu1"):
        staged = p.op(name, f"Stage the k3s {NEW} binary")
        assert f"FileUploadCommand({cache / _sha(BINARY[NEW])}, {k3s_derive.STAGED_BINARY})" \
            in staged.text
        token = p.op(name, "k3s cluster token (mode 0600, never shown)")
        assert f"chmod 600 {k3s.TOKEN_FILE}" in token.text
        assert p.upload(name, k3s.TOKEN_FILE) == TOKEN + "\n"
        assert f"chmod 600 {CONFIG}" in p.op(name, f"k3s {'server' if name == 's1' else 'agent'}"
                                                   " config.yaml").text


def test_packages_per_distribution(store, distro):
    p = _plan(store, ONE, distro=distro)
    if distro == "rocky9":
        op = p.op("s1", "Packages k3s needs")
        assert "dnf" in op.text and "container-selinux" in op.text
    else:
        assert "Packages k3s needs" not in p.names("s1")
        assert "apt" not in p.commands("s1")


# --- re-runs, restarts, upgrades --------------------------------------------------------


def test_a_second_deploy_changes_nothing(store):
    p = _plan(store, facts=_deployed(store))
    for name in ("s1", "s2", "s3", "gpu1", "cpu1"):
        assert not p.changing(name), (name, p.changing(name))
        role = "servers" if name.startswith("s") else "agents"
        restart = p.op(name, f"k3s {role}: restart one node at a time (its config, unit or "
                             "token changed)")
        assert restart.conditional and restart.serial and restart.skipped
        turns = [op for op in p.ops[name] if op.name.startswith("k3s ") and "turn" in op.name
                 or "start (" in op.name or "upgrade" in op.name]
        assert turns and not any(op.commands for op in turns), turns


def test_changed_config_restarts_that_node_only(store):
    old = _plan(store).upload("cpu1", CONFIG).replace("ens1", "ens9")
    p = _plan(store, facts=_deployed(store, configs={"cpu1": old}))
    restart = p.op("cpu1", "k3s agents: restart one node at a time (its config, unit or token "
                           "changed)")
    assert p.changing("cpu1") == ["k3s agent config.yaml", restart.name]
    assert restart.conditional and f"{k3s_derive.TOOL} restart" in restart.text
    assert p.op("gpu1", restart.name).skipped
    assert "drain" not in restart.text
    assert not p.changing("s1")


def test_version_bump_servers_one_at_a_time_then_agents_each_drained(store):
    p = _plan(store, facts=_deployed(store, version=OLD))
    name = ("upgrade one node at a time (drain, new binary, restart, Ready, uncordon)")
    servers = {n: p.op(n, f"k3s servers: {name}") for n in ("s1", "s2", "s3")}
    agents = {n: p.op(n, f"k3s agents: {name}") for n in ("gpu1", "cpu1")}
    assert all(op.serial and not op.conditional for op in (*servers.values(), *agents.values()))
    assert len({op.index for op in servers.values()}) == 1
    assert len({op.index for op in agents.values()}) == 1
    assert servers["s1"].index < agents["gpu1"].index
    for node, op in {**servers, **agents}.items():
        admin = "s2" if node == "s1" else "s1"
        drain, step, uncordon = op.commands[1], op.commands[2], op.commands[3]
        assert f"'{admin}'" in drain and "run_on_other_host" in drain
        assert f"k3s kubectl drain {node} --ignore-daemonsets --delete-emptydir-data" in drain
        assert step == f"{k3s_derive.TOOL} upgrade"
        assert f"k3s kubectl uncordon {node}" in uncordon
    # The new binary is staged beside the running one first, on every node at once.
    stage = p.op("s1", f"Stage the k3s {NEW} binary")
    assert stage.commands and stage.index < servers["s1"].index
    # Nothing else restarts: the upgrade's restart picks up any new config.
    assert not any("restart one node" in n for n in p.names("s1"))


def _helper(tmp_path, kubelet_says: str, timeout: int) -> int:
    """Run the rendered rollout helper's ``wait`` against a fake k3s whose kubectl
    answers ``kubelet_says`` for the node's Ready status and kubelet version."""
    fake = tmp_path / "k3s"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo 'k3s version v{NEW} (x)' "
                    f"&& exit 0\nprintf '%s' '{kubelet_says}'\n")
    fake.chmod(0o755)
    v = {"k3s_unit": "k3s-agent", "inventory_hostname": "cpu1", "k3s_binary": str(fake),
         "k3s_staged_binary": str(tmp_path / "staged"), "k3s_ready_timeout": timeout,
         "k3s_version": NEW}
    helper = tmp_path / "aicluster-k3s"
    helper.write_text(render("k3s", "aicluster-k3s.j2", v))
    return subprocess.run(["sh", str(helper), "wait"], capture_output=True).returncode


def test_after_a_restart_only_the_pinned_kubelet_being_ready_counts(tmp_path):
    # Right after a restart the Node still shows the old kubelet's Ready status: the
    # helper waits for the new release (here it gives up at once, timeout 0).
    assert _helper(tmp_path, f"True v{OLD}", timeout=0) == 1
    assert _helper(tmp_path, f"Unknown v{NEW}", timeout=0) == 1
    assert _helper(tmp_path, f"True v{NEW}", timeout=0) == 0


def test_the_binary_is_labelled_a_container_runtime_where_selinux_is_on(tmp_path):
    """On Rocky with SELinux enforcing, k3s's containerd runs only from a binary labelled
    container_runtime_exec_t (container-selinux's type, as k3s's installer sets it): the
    helper labels the binary it puts in place, when SELinux is enabled."""
    v = {"k3s_unit": "k3s", "inventory_hostname": "s1", "k3s_binary": "/usr/local/bin/k3s",
         "k3s_staged_binary": "/usr/local/lib/aicluster/k3s/k3s", "k3s_ready_timeout": 5,
         "k3s_version": NEW}
    text = render("k3s", "aicluster-k3s.j2", v)
    install = text.split("install_binary() {", 1)[1].split("\n}\n", 1)[0]
    assert "selinuxenabled && selinuxenabled" not in install  # guarded, not required
    assert ("if command -v selinuxenabled >/dev/null 2>&1 && selinuxenabled; then\n"
            '        chcon -u system_u -r object_r -t container_runtime_exec_t "$BIN"') in install
    assert subprocess.run(["sh", "-n", "-c", text]).returncode == 0


def test_a_bump_that_skips_a_minor_version_is_refused(store, caplog):
    facts = _deployed(store, version=OLD)
    facts["s2"]["K3sNode"] = {**facts["s2"]["K3sNode"], "version": "1.34.2+k3s1"}
    p = _plan(store, facts=facts)
    assert p.ops["s2"] == [] and p.ops["s1"]
    text = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert f"host 's2': k3s_version: {NEW} skips a minor version after the 1.34.2+k3s1" in text


def test_another_token_on_a_running_node_is_refused_without_showing_it(store, caplog):
    facts = _deployed(store)
    facts["s2"]["K3sNode"] = {**facts["s2"]["K3sNode"], "token": "0" * 64}
    p = _plan(store, facts=facts)
    assert p.ops["s2"] == [] and p.ops["s1"]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "host 's2': secrets.k3s_token: the node runs k3s with another cluster token" in text
    assert TOKEN not in text


def test_the_token_is_never_in_an_operation_name_or_command(store, caplog):
    caplog.set_level(logging.DEBUG)
    p = _plan(store)
    for name, ops in p.ops.items():
        for op in ops:
            assert TOKEN not in op.name
            if op.name != "k3s cluster token (mode 0600, never shown)":
                assert TOKEN not in op.text, (name, op.name)
    assert TOKEN not in caplog.text


def test_a_generated_token_is_made_once_and_is_text(tmp_path, store):
    path = tmp_path / "secrets" / "k3s-token"
    cluster = {**store, "secrets": {"k3s_token": {"file": str(path)}}}
    p = _plan(cluster, ONE)
    token = p.upload("s1", k3s.TOKEN_FILE)
    assert path.stat().st_mode & 0o777 == 0o600
    assert len(token.strip()) == 64 and int(token, 16) >= 0
    assert token == p.upload("cpu1", k3s.TOKEN_FILE)
    assert _plan(cluster, ONE).upload("s1", k3s.TOKEN_FILE) == token


def test_a_missing_token_env_stops_the_host(store, caplog, monkeypatch):
    monkeypatch.delenv("TEST_K3S_TOKEN")
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        _plan(store, ONE)
    assert "secrets.k3s_token: the environment variable TEST_K3S_TOKEN is not set" in caplog.text


def test_fact_parses_and_never_prints_the_token():
    text = k3s_probe.command_text("k3s", "10.20.0.11")
    assert "sha256sum /etc/rancher/k3s/aicluster-token" in text
    assert "cat " not in text
    parsed = k3s_probe.parse(["binary=ab", "version=1.36.0+k3s1", "active=active", "iface=ens1",
                             "nvidia=yes"])
    assert parsed == {"binary": "ab", "version": "1.36.0+k3s1", "active": "active",
                      "token": None, "iface": "ens1", "nvidia": True}
    assert k3s_probe.parse([]) == k3s_fact.K3sNode().default()


# --- validation ----------------------------------------------------------------------


def _validate(store, hosts, groups, **extra):
    data = {**store, **extra}
    inv = {name: (tuple(g for g, m in groups.items() if name in m), {**data, **hd})
           for name, hd in hosts}
    with pytest.raises(InventoryError) as caught:
        validate(inv)
    return str(caught.value)


def test_a_host_in_both_groups_is_refused(store):
    msg = _validate(store, [S1, CPU1], {"k3s_servers": ["s1"], "k3s_agents": ["s1", "cpu1"]})
    assert "host 's1': groups: is in both k3s_servers and k3s_agents" in msg


def test_agents_without_a_server_are_refused(store):
    msg = _validate(store, [S1, CPU1], {"k3s_agents": ["s1", "cpu1"]})
    assert "host 's1': groups: is in k3s_agents, which needs at least one k3s_servers host" \
        in msg


def test_two_servers_are_refused(store):
    msg = _validate(store, [S1, S2], {"k3s_servers": ["s1", "s2"]})
    assert "host 's2': groups: k3s_servers has 2 hosts" in msg


def test_a_node_without_an_address_on_the_k3s_network_is_refused(store):
    bare = ("cpu2", {"ssh_hostname": "10.10.0.32"})
    msg = _validate(store, [S1, bare], {"k3s_servers": ["s1"], "k3s_agents": ["cpu2"]},
                    k3s_network="fabric")
    assert "host 'cpu2': k3s_network: the host has no address on the fabric network" in msg
    msg = _validate(store, [S1], {"k3s_servers": ["s1"]}, k3s_network="storage")
    assert "host 's1': k3s_network: 'storage' is not a network of this inventory" in msg


BAD_SETTINGS = [
    ({"k3s_config": {"server": "https://x:6443"}},
     "host 's1': k3s_config.server: aicluster sets server itself"),
    ({"k3s_config": {"Bad Key": 1}},
     "host 's1': k3s_config.Bad Key: 'Bad Key' is not a k3s setting name"),
    ({"k3s_config": {"disable": {"a": 1}}},
     "host 's1': k3s_config.disable: {'a': 1} is not a string"),
    ({"k3s_config": {"bind-address": "node1.lab"}},
     "host 's1': k3s_config: bind-address: 'node1.lab' is not an IP address"),
    ({"k3s_config": {"https-listen-port": 7443}},
     "host 's1': k3s_config.https-listen-port: aicluster sets https-listen-port itself "
     "(from k3s_api_port)"),
    ({"k3s_node_labels": ["no-equals-sign"]},
     "host 's1': k3s_node_labels[0]: 'no-equals-sign' is not a 'key=value' node label"),
    ({"k3s_registration_address": "bad name!"},
     "host 's1': k3s_registration_address: 'bad name!' is not an IP address or a DNS name"),
    ({"k3s_ready_timeout": 0},
     "host 's1': k3s_ready_timeout: Input should be greater than or equal to 1 (got 0)"),
    ({"k3s_token_bytes": 8},
     "host 's1': k3s_token_bytes: Input should be greater than or equal to 16 (got 8)"),
    ({"k3s_api_port": 70000},
     "host 's1': k3s_api_port: Input should be less than or equal to 65535 (got 70000)"),
    ({"k3s_api_port": "6443"},
     "host 's1': k3s_api_port: Input should be a valid integer (got '6443')"),
    ({"k3s_version": ""}, "host 's1': k3s_version: not set; pin the k3s release"),
    ({"k3s_version": "v1.36.4+k3s1"}, "host 's1': k3s_version: 'v1.36.4+k3s1' is not a version"),
    ({"k3s_network": "wan"}, "host 's1': k3s_network: Input should be '', 'management', "
     "'fabric', 'storage' or 'ib' (got 'wan')"),
    ({"k3s_artifacts": {"k3s": {"url": "https://x/k3s", "sha256": {}, "mirror": "y"}}},
     "host 's1': k3s_artifacts.k3s.mirror: Extra inputs are not permitted"),
    ({"k3s_servers_config": {}},
     "host 's1': k3s_servers_config: not a k3s setting; did you mean k3s_server_default_config?"),
]


@pytest.mark.parametrize("extra, needle", BAD_SETTINGS,
                         ids=[n.split(": ")[1] + f"-{i}" for i, (_, n) in enumerate(BAD_SETTINGS)])
def test_bad_settings_are_refused_naming_host_and_field(store, extra, needle):
    msg = _validate(store, [S1], {"k3s_servers": ["s1"]}, **extra)
    assert needle in msg, msg


def test_a_port_that_differs_between_nodes_is_refused(store):
    hosts, groups = [S1, ("cpu1", {**CPU1[1], "k3s_api_port": 7443})], ONE[1]
    msg = _validate(store, hosts, groups)
    assert "host 'cpu1': k3s_api_port: 7443 differs from 6443 on host 's1'" in msg


def test_an_inline_token_in_k3s_config_is_refused_without_its_value(store):
    msg = _validate(store, [S1], {"k3s_servers": ["s1"]}, k3s_config={"token": "s3cr3t-value"})
    assert "host 's1': k3s_config.token: a secret is written inline" in msg
    assert "s3cr3t-value" not in msg


def test_gpu_hosts_need_gpu_nodes_and_the_device_plugin_image(store):
    hosts, groups = [S1, GPU1], {"k3s_servers": ["s1"], "k3s_agents": ["gpu1"]}
    msg = _validate(store, hosts, groups, k3s_nvidia_device_plugin_image="")
    assert "host 'gpu1': hardware.gpus: the host has GPUs and runs k3s but is not in " \
        "gpu_nodes" in msg
    assert "host 'gpu1': k3s_nvidia_device_plugin_image: not set" in msg
    msg = _validate(store, [S1, (GPU1[0], {**GPU1[1], "nvidia_container_toolkit": False})],
                    {**groups, "gpu_nodes": ["gpu1"]})
    assert "host 'gpu1': nvidia_container_toolkit: false, but the host runs k3s" in msg


def test_gpu_hosts_need_k3s_runtimes_manifest(store):
    """The RuntimeClass nvidia is k3s's packaged runtimes manifest: disabling it on a
    GPU cluster is refused (a list or k3s's comma-separated string)."""
    hosts, groups = [S1, GPU1], {"k3s_servers": ["s1"], "k3s_agents": ["gpu1"],
                                 "gpu_nodes": ["gpu1"]}
    for disable in (["traefik", "runtimes"], "traefik,runtimes"):
        msg = _validate(store, hosts, groups, k3s_config={"disable": disable})
        assert "host 'gpu1': k3s_config.disable: runtimes is disabled" in msg
    data = {**store, "k3s_config": {"disable": ["traefik"]}}
    validate({name: (tuple(g for g, m in groups.items() if name in m), {**data, **hd})
              for name, hd in hosts})  # accepted


def test_a_version_without_pinned_checksums_is_refused(store):
    msg = _validate(store, [S1], {"k3s_servers": ["s1"]}, k3s_version="1.37.0+k3s1")
    assert "host 's1': k3s_artifacts.k3s.sha256: no checksum pinned for version " \
        "'1.37.0+k3s1'" in msg


def test_the_real_pins_cover_the_default_version():
    from aicluster.render import defaults

    d = defaults("k3s")
    for name in ("k3s", "images"):
        art = artifacts.artifact_from_spec("k3s", name, d["k3s_artifacts"][name],
                                           d["k3s_version"], "amd64")
        assert art.url.startswith("https://") and "%2Bk3s1/" in art.url
    arm = artifacts.artifact_from_spec("k3s", "k3s", d["k3s_artifacts"]["k3s"], "1.34.2+k3s1",
                                       "arm64")
    assert arm.filename == "k3s-arm64"


# --- the lab inventory: golden config.yaml ---------------------------------------------


LAB = load_cluster(PROJECT_ROOT / "inventories" / "lab.py")


@pytest.mark.parametrize("name", k3s_derive.k3s_hosts(LAB))
def test_lab_config_yaml_matches_golden_files(name):
    v = template_vars("k3s", LAB, name, LAB.hosts[name].data, "Debian")
    text = render("k3s", "config.yaml.j2", v)
    assert text == render("k3s", "config.yaml.j2",
                          template_vars("k3s", LAB, name, LAB.hosts[name].data, "RedHat"))
    yaml.safe_load(text)
    assert_golden(GOLDEN / name / "config.yaml", text)


def test_every_golden_file_belongs_to_a_lab_k3s_node():
    on_disk = {p.parent.name for p in GOLDEN.glob("*/config.yaml")}
    assert on_disk == set(k3s_derive.k3s_hosts(LAB))
