"""The ollama deploy planned on fake hosts: GPU and CPU Ollama nodes on Debian, Ubuntu
and Rocky, the nginx gateway in front of them, a version bump, models pulled only
where missing (or unpacked from an offline archive), a re-run that changes nothing;
and every bad input refused by validation, naming host and field.

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
The release pins here are test fixtures for stand-in archives this test makes (their
URL is on 127.0.0.1, where nothing is ever downloaded from), not Ollama's checksums.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.exceptions import DeployError

from aicluster import artifacts
from aicluster.components.ollama import deploy as ollama
from aicluster.components.ollama import derive as ollama_derive
from aicluster.components.ollama.probe import command_text, parse
from aicluster.inventory import InventoryError, validate
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan
from tests.golden import GOLDEN_DIR, assert_golden

VERSION = "0.13.3"
OLD = "0.13.0"
#: Stand-in release archives (test fixtures, not Ollama's files).
STAND_INS = {v: f"stand-in ollama release {v} archive (test fixture)\n".encode() * 64
             for v in (VERSION, OLD)}
SUMS = {v: hashlib.sha256(data).hexdigest() for v, data in STAND_INS.items()}
UNIT = "/etc/systemd/system/ollama.service"
DROPIN = "/etc/systemd/system/ollama.service.d/aicluster.conf"
GATEWAY = "/etc/nginx/conf.d/ollama-gateway.conf"
APT_STAMP = "/var/lib/apt/periodic/update-success-stamp"
NOW = datetime(2026, 1, 1, 12, 0)
ARCHIVE = "ollama-linux-amd64.tgz"
GOLDEN = GOLDEN_DIR / "ollama"
RESTART = "Restart Ollama (its release, unit or settings changed)"
RELOAD = "Reload systemd units"
UNPACK_AGAIN = f"Unpack Ollama {VERSION} (its archive changed)"
SERVER_GUARDED = (UNPACK_AGAIN, RELOAD, RESTART)
CHECK_NGINX = "Check nginx's configuration"
RELOAD_NGINX = "Reload nginx (the gateway changed)"
GATEWAY_GUARDED = (CHECK_NGINX, RELOAD_NGINX)
DEFAULT_SITE = "/etc/nginx/sites-enabled/default"


def _host(name: str, n: int, **hardware: Any) -> tuple[str, dict]:
    return (
        name,
        {
            "ssh_hostname": f"10.10.0.{n}",
            "hardware": {
                "cpus": 32,
                "memory_gb": 256,
                "nics": [
                    {"name": "ens1", "network": "fabric", "address": f"10.20.0.{n}", "mtu": 9000}
                ],
                **hardware,
            },
        },
    )


_H100 = {"model": "H100-SXM5-80GB", "count": 8, "memory_gb": 80, "nvswitch": True}
HOSTS = [
    _host("head", 10),
    _host("gpu1", 21, gpus=_H100, nvme=[{"device": "/dev/disk/by-id/nvme-A_1"}]),
    _host("gpu2", 22, gpus=_H100, nvme=[{"device": "/dev/disk/by-id/nvme-B_1"}]),
    _host("cpu1", 31),
]
SERVERS = ("gpu1", "gpu2", "cpu1")
GROUPS = {"ollama": list(SERVERS), "ollama_gateway": ["head"], "gpu_nodes": ["gpu1", "gpu2"]}


def _cluster(cache: Path, **extra: Any) -> dict[str, Any]:
    return {
        "cluster_name": "demo",
        "networks": {
            "management": {"subnet": "10.10.0.0/24"},
            "fabric": {"subnet": "10.20.0.0/24", "mtu": 9000},
        },
        "nvidia_cuda_repo_url": "https://mirror.example.org/nvidia/cuda/repos",
        "artifacts_cache_dir": str(cache),
        "ollama_version": VERSION,
        "ollama_artifacts": {
            "ollama": {
                "url": "http://127.0.0.1:9/v{version}/ollama-linux-{arch}.tgz",
                "sha256": {v: {"amd64": s} for v, s in SUMS.items()},
                "groups": ["ollama"],
            }
        },
        **extra,
    }


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    """A download cache that holds both stand-in archives (named by their sha256)."""
    d = tmp_path / "cache"
    d.mkdir()
    for v, data in STAND_INS.items():
        (d / SUMS[v]).write_bytes(data)
    monkeypatch.setattr(artifacts, "_RESOLVED", {})  # undone after the test
    return d


def _node(versions=(), installed=None, models=(), linked=None, addresses=None, **more):
    return {**parse([]), "versions": list(versions), "installed": dict(installed or {}),
            "models": list(models), "linked": linked, "addresses": addresses, **more}


def _plan(cache, distro="debian12", extra=None, facts=None, hosts=HOSTS, groups=GROUPS):
    host_facts = {}
    for name, _ in hosts:
        host_facts[name] = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "Os": "Linux",
            "Arch": "x86_64",
            "Which": lambda command, **kw: f"/usr/sbin/{command}",
            "OllamaNode": _node(),
            **(facts or {}).get(name, {}),
        }
    return plan(hosts, groups, _cluster(cache, **(extra or {})), host_facts, ollama.deploy)


def _existing(files: dict[str, bytes], links: dict[str, str]):
    """File, Sha1File, Directory and Link facts of a node holding ``files``."""
    def file_fact(path, **kw):
        if path in files:
            return {"mode": 600 if "models-archive" in path else 644, "user": "root",
                    "group": "root"}
        if path == APT_STAMP:  # apt's index was refreshed a minute ago
            return {"mode": 644, "user": "root", "group": "root", "mtime": NOW}
        return None

    def sha1_fact(path, **kw):
        return hashlib.sha1(files[path]).hexdigest() if path in files else None

    def directory_fact(path, **kw):
        owner = "ollama" if path.startswith("/usr/share/ollama") or "ollama/models" in path \
            else "root"
        return {"mode": 755, "user": owner, "group": owner}

    def link_fact(path, **kw):
        if path in links:
            return {"link_target": links[path], "user": "root", "group": "root"}
        return None

    return {"File": file_fact, "Sha1File": sha1_fact, "Directory": directory_fact,
            "Link": link_fact}


def _running(*units):
    return lambda **kw: {u: True for u in units}


def _deployed(cache, version=VERSION, models=(), extra=None, changed=None, relinked=None):
    """Every node as the deploy leaves it with ``version`` (and ``models``); ``changed``
    then replaces a node's files (host -> path -> bytes), ``relinked`` its links (host ->
    path -> target)."""
    fresh = _plan(cache, extra={"ollama_version": version, **(extra or {})})
    facts = {}
    for name, _ in HOSTS:
        files: dict[str, bytes] = {}
        links: dict[str, str] = {}
        data = dict(HOSTS)[name]
        addresses = [data["ssh_hostname"], data["hardware"]["nics"][0]["address"]]
        node = _node(addresses=addresses)
        if name in SERVERS:
            files[UNIT] = fresh.upload(name, UNIT).encode()
            files[DROPIN] = fresh.upload(name, DROPIN).encode()
            files[f"/opt/ollama/{version}/{ARCHIVE}"] = STAND_INS[version]
            links["/usr/local/bin/ollama"] = f"/opt/ollama/{version}/bin/ollama"
            node = _node(versions=[version], installed={version: SUMS[version]},
                         models=list(models), linked=f"/opt/ollama/{version}/bin/ollama",
                         addresses=addresses)
        else:
            files[GATEWAY] = fresh.upload(name, GATEWAY).encode()
        files.update((changed or {}).get(name, {}))
        links.update((relinked or {}).get(name, {}))
        facts[name] = {
            "OllamaNode": node,
            "SystemdStatus": _running("ollama.service", "nginx.service"),
            "SystemdEnabled": _running("ollama.service", "nginx.service"),
            "Groups": ["root", "ollama", "render", "video"],
            "Users": {"ollama": {"home": "/usr/share/ollama", "shell": "/usr/sbin/nologin",
                                 "group": "ollama", "groups": ["render", "video"],
                                 "comment": None}},
            "DebPackages": {p: ["1.0"] for p in ("tar", "gzip", "zstd", "nginx")},
            "Date": NOW + timedelta(minutes=1),
            **_existing(files, links),
        }
    return facts


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------


def test_servers_get_the_release_the_unit_and_the_dropin(cache, distro):
    p = _plan(cache, distro)
    for name, ip in (("gpu1", "10.20.0.21"), ("gpu2", "10.20.0.22"), ("cpu1", "10.20.0.31")):
        put = p.op(name, f"Ollama {VERSION} release archive").text
        assert f"FileUploadCommand({cache / SUMS[VERSION]}, /opt/ollama/{VERSION}/{ARCHIVE})" \
            in put
        unpack = p.op(name, f"Unpack Ollama {VERSION}").text
        assert (f"tar --gzip -xf /opt/ollama/{VERSION}/{ARCHIVE} -C /opt/ollama/{VERSION}"
                in unpack)
        assert f"echo {SUMS[VERSION]} > /opt/ollama/{VERSION}/.aicluster-installed" in unpack
        link = p.op(name, f"/usr/local/bin/ollama runs Ollama {VERSION}").text
        assert f"ln -s /opt/ollama/{VERSION}/bin/ollama /usr/local/bin/ollama" in link
        unit = p.upload(name, UNIT)
        assert "ExecStart=/usr/local/bin/ollama serve\n" in unit
        assert "User=ollama\n" in unit and "OLLAMA_" not in unit
        dropin = p.upload(name, DROPIN)
        # The cluster network, never every interface unless the inventory says so.
        assert f'Environment="OLLAMA_HOST={ip}:11434"\n' in dropin
        assert "0.0.0.0" not in dropin
        assert 'Environment="OLLAMA_KEEP_ALIVE=5m"\n' in dropin
        assert 'Environment="OLLAMA_NUM_PARALLEL=4"\n' in dropin
        # A first install: the restart (a start here) runs after the new unit.
        assert p.op(name, RESTART).runs
        assert "Ollama running and enabled" in p.names(name)
        # Not a gateway.
        assert "Write the Ollama gateway (nginx)" not in p.names(name)
    # The gateway host is no Ollama node: no release, no unit.
    assert not any("Ollama" in n and "gateway" not in n for n in p.names("head")), \
        p.names("head")


def _pin(url: str) -> dict[str, Any]:
    return {"ollama_artifacts": {"ollama": {
        "url": url, "sha256": {v: {"amd64": s} for v, s in SUMS.items()},
        "groups": ["ollama"]}}}


ZST_URL = "http://127.0.0.1:9/v{version}/ollama-linux-{arch}.tar.zst"


@pytest.mark.parametrize("url, filename, option", [
    ("http://127.0.0.1:9/v{version}/ollama-linux-{arch}.tgz", ARCHIVE, "--gzip"),
    (ZST_URL, "ollama-linux-amd64.tar.zst", "--zstd"),
], ids=["tgz", "tar.zst"])
def test_the_release_format_follows_the_pinned_file_name(cache, url, filename, option):
    """Ollama up to 0.13.x: .tgz; from 0.14.0 on: .tar.zst. The archive keeps its pinned
    name on the node and tar reads it with the matching decompressor."""
    p = _plan(cache, extra=_pin(url))
    put = p.op("gpu1", f"Ollama {VERSION} release archive").text
    assert f"/opt/ollama/{VERSION}/{filename})" in put
    unpack = p.op("gpu1", f"Unpack Ollama {VERSION}").text
    assert (f"tar {option} -xf /opt/ollama/{VERSION}/{filename} -C /opt/ollama/{VERSION} "
            "--no-same-owner") in unpack
    assert f"echo {SUMS[VERSION]} > /opt/ollama/{VERSION}/.aicluster-installed" in unpack


def test_both_engines_run_the_same_unpack_command(cache):
    """The Ansible role runs the command the derive module computes, which is the one the
    pyinfra deploy runs (a .tar.zst pin here)."""
    import yaml

    from aicluster.inventory import derived_vars

    tasks = yaml.safe_load((Path(__file__).parents[2] / "roles/ollama/tasks/server.yml")
                           .read_text())
    unpack = next(t for t in tasks if t.get("name") == "Unpack the Ollama release")
    assert unpack["ansible.builtin.shell"] == "{{ ollama_unpack_command }}"
    cluster = _validate(_pin(ZST_URL))
    command = derived_vars(cluster, "gpu1")["ollama_unpack_command"]
    assert command.startswith(f"tar --zstd -xf /opt/ollama/{VERSION}/ollama-linux-amd64.tar.zst ")
    assert command in _plan(cache, extra=_pin(ZST_URL)).op("gpu1", f"Unpack Ollama {VERSION}").text
    assert derived_vars(cluster, "head")["ollama_unpack_command"] == ""  # gateway only


@pytest.mark.parametrize("filename, compress", [
    ("ollama-linux-amd64.tgz", ["gzip", "-n"]),
    ("ollama-linux-amd64.tar.zst", ["zstd", "-q"]),
], ids=["tgz", "tar.zst"])
def test_the_unpack_command_unpacks_that_format(tmp_path, filename, compress):
    """The command itself, run here with GNU tar on a STAND-IN archive in Ollama's
    layout (bin/ollama, lib/ollama/), compressed as Ollama publishes it."""
    import shutil
    import subprocess

    if not shutil.which(compress[0]):
        pytest.skip(f"no {compress[0]} on this machine")
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "lib/ollama").mkdir(parents=True)
    (tree / "bin/ollama").write_text("#!/bin/sh\necho stand-in ollama\n")
    (tree / "lib/ollama/libggml-base.so").write_bytes(b"stand-in library")
    release = tmp_path / "opt/ollama/0.14.0"
    release.mkdir(parents=True)
    raw = subprocess.run(["tar", "-C", str(tree), "-cf", "-", "."], check=True,
                         capture_output=True).stdout
    packed = subprocess.run([*compress, "-c"], input=raw, check=True,
                            capture_output=True).stdout
    (release / filename).write_bytes(packed)
    command = ollama_derive.unpack_command(str(release), filename, "f" * 64)
    subprocess.run(["sh", "-c", command], check=True)
    assert (release / "bin/ollama").read_text().startswith("#!/bin/sh")
    assert (release / "lib/ollama/libggml-base.so").read_bytes() == b"stand-in library"
    assert (release / ".aicluster-installed").read_text() == "f" * 64 + "\n"


def test_the_ollama_user_is_in_the_render_and_video_groups(cache):
    p = _plan(cache)
    user = p.op("gpu1", "Ollama user ollama").text
    assert "useradd -d /usr/share/ollama -s /usr/sbin/nologin -g ollama -G render,video -r" \
        in user
    assert "groupadd" in p.op("gpu1", "Group render").text


def test_models_live_on_the_nvme_cache_of_gpu_nodes_and_in_home_on_cpu_nodes(cache):
    p = _plan(cache)
    gpu = p.upload("gpu1", DROPIN)
    assert 'Environment="OLLAMA_MODELS=/mnt/nvme-cache/ollama"\n' in gpu
    assert "RequiresMountsFor=/mnt/nvme-cache/ollama\n" in p.upload("gpu1", UNIT)
    # 3 models per GPU (Ollama's own rule), made explicit from the inventory's hardware.
    assert 'Environment="OLLAMA_MAX_LOADED_MODELS=24"\n' in gpu
    # The cache's directory is nvme_cache's to make; a CPU node's is made here.
    assert not any(n.startswith("Models directory") for n in p.names("gpu1"))
    cpu = p.upload("cpu1", DROPIN)
    assert 'Environment="OLLAMA_MODELS=/usr/share/ollama/.ollama/models"\n' in cpu
    assert 'Environment="OLLAMA_MAX_LOADED_MODELS=3"\n' in cpu
    made = p.op("cpu1", "Models directory /usr/share/ollama/.ollama/models").text
    assert "mkdir -p /usr/share/ollama/.ollama/models" in made and "chown ollama:ollama" in made


def test_debian_and_ubuntu_use_apt_rocky_dnf(cache):
    for distro in ("debian12", "ubuntu2204", "ubuntu2404"):
        text = _plan(cache, distro).op(
            "gpu1", "Install tar, gzip and zstd (to unpack the Ollama release)").text
        assert "apt-get" in text and "zstd" in text
    p = _plan(cache, "rocky9")
    assert "dnf" in p.op("gpu1", "Install tar, gzip and zstd (to unpack the Ollama release)").text
    assert "dnf" in p.op("head", "Install nginx (the Ollama gateway)").text
    assert "apt-get" not in p.commands("gpu1")


def test_inventory_settings_reach_the_dropin(cache):
    hosts = [HOSTS[0], (HOSTS[1][0], {**HOSTS[1][1], "ollama_host": "0.0.0.0"}), *HOSTS[2:]]
    extra = {"ollama_keep_alive": "-1", "ollama_num_parallel": 8, "ollama_max_loaded_models": 2,
             "ollama_config": {"OLLAMA_FLASH_ATTENTION": True, "OLLAMA_CONTEXT_LENGTH": 8192}}
    p = _plan(cache, extra=extra, hosts=hosts)
    dropin = p.upload("gpu1", DROPIN)
    # Every interface, because the inventory says so for this host.
    assert 'Environment="OLLAMA_HOST=0.0.0.0:11434"\n' in dropin
    for line in ("OLLAMA_KEEP_ALIVE=-1", "OLLAMA_NUM_PARALLEL=8", "OLLAMA_MAX_LOADED_MODELS=2",
                 "OLLAMA_FLASH_ATTENTION=1", "OLLAMA_CONTEXT_LENGTH=8192"):
        assert f'Environment="{line}"\n' in dropin
    assert 'Environment="OLLAMA_HOST=10.20.0.22:11434"\n' in p.upload("gpu2", DROPIN)
    # The gateway still reaches that node on its cluster address.
    assert "server 10.20.0.21:11434 " in p.upload("head", GATEWAY)


def test_a_node_without_the_listen_address_is_refused(cache):
    facts = {"gpu2": {"OllamaNode": _node(addresses=["10.10.0.22"])}}
    with pytest.raises(DeployError) as caught:
        _plan(cache, facts=facts)
    assert ("host 'gpu2' does not have the address ollama listens on, 10.20.0.22; it has "
            "10.10.0.22") in str(caught.value)


# ---------------------------------------------------------------------------
# Gateway
# ---------------------------------------------------------------------------


def test_the_gateway_balances_across_every_ollama_node(cache, distro):
    p = _plan(cache, distro)
    conf = p.upload("head", GATEWAY)
    assert "least_conn;" in conf
    for ip in ("10.20.0.21", "10.20.0.22", "10.20.0.31"):
        assert f"    server {ip}:11434 max_fails=3 fail_timeout=30s;\n" in conf
    assert conf.count("    server 10.20.0.") == 3
    assert "listen 10.20.0.10:11434;" in conf and "0.0.0.0" not in conf
    for directive in ("proxy_buffering off;", "proxy_request_buffering on;",
                      "proxy_read_timeout 900s;", "proxy_send_timeout 900s;",
                      "proxy_http_version 1.1;"):
        assert directive in conf
    assert "nginx" in p.op("head", "Install nginx (the Ollama gateway)").text
    check = p.op("head", "Check nginx's configuration")
    reload_ = p.op("head", "Reload nginx (the gateway changed)")
    assert check.runs and "nginx -t" in check.text
    assert reload_.runs and "systemctl reload-or-restart nginx.service" in reload_.text
    assert p.op("head", "Write the Ollama gateway (nginx)").index < check.index < reload_.index


def test_a_busy_node_is_retried_elsewhere_not_counted_as_failed(cache):
    """Ollama answers 503 when its queue is full (OLLAMA_MAX_QUEUE), before running the
    request. What proxy_next_upstream lists counts toward max_fails (nginx), so 503 is not
    listed: it is intercepted and the request sent once more through the upstream, from a
    request body nginx has read whole. Connection errors and timeouts still count (nginx
    counts them whether listed or not). tests/unit/test_ollama_gateway_nginx.py runs it."""
    conf = _plan(cache).upload("head", GATEWAY)
    lines = [line.strip() for line in conf.splitlines()]
    nexts = [line for line in lines if line.startswith("proxy_next_upstream")]
    assert nexts == ["proxy_next_upstream error timeout http_502 http_504;"]
    assert "non_idempotent" not in conf  # a timed-out generation is never run twice
    assert "proxy_request_buffering on;" in lines
    main = conf[conf.index("location / {"):conf.index("location @ollama_busy {")]
    assert "proxy_intercept_errors on;" in main and "error_page 503 = @ollama_busy;" in main
    busy = conf[conf.index("location @ollama_busy {"):]
    assert "proxy_pass http://ollama_nodes;" in busy
    assert "proxy_intercept_errors" not in busy and "error_page" not in busy  # one retry


def test_golden_gateway_dropin_and_unit(cache):
    p = _plan(cache)
    assert_golden(GOLDEN / "ollama-gateway.conf", p.upload("head", GATEWAY))
    assert_golden(GOLDEN / "aicluster.conf", p.upload("gpu1", DROPIN))
    assert_golden(GOLDEN / "ollama.service", p.upload("gpu1", UNIT))


def test_selinux_lets_nginx_proxy_on_rocky(cache):
    facts = {"head": {"OllamaNode": _node(selinux="Enforcing", selinux_connect="off",
                                          selinux_port=False)}}
    p = _plan(cache, "rocky9", facts=facts)
    assert "setsebool -P httpd_can_network_connect 1" in p.op(
        "head", "SELinux: let nginx connect to the Ollama nodes").text
    assert "semanage port -a -t http_port_t -p tcp 11434" in p.op(
        "head", "SELinux: let nginx listen on port 11434").text
    done = {"head": {"OllamaNode": _node(selinux="Enforcing", selinux_connect="on",
                                         selinux_port=True)}}
    assert not any(n.startswith("SELinux") for n in _plan(cache, "rocky9", facts=done)
                   .names("head"))
    # No SELinux on Debian.
    assert not any(n.startswith("SELinux") for n in _plan(cache, facts=facts).names("head"))


def test_the_fact_reads_releases_models_and_selinux():
    text = command_text("/opt/ollama", "/usr/local/bin/ollama", "/mnt/nvme-cache/ollama", 11434)
    assert "cd /mnt/nvme-cache/ollama/manifests" in text and "semanage port -l" in text
    assert "semanage" not in command_text("/opt/ollama", "/usr/local/bin/ollama", "/m")
    got = parse([
        "linked=/opt/ollama/0.13.3/bin/ollama", "version=0.13.0", "version=0.13.3",
        f"installed=0.13.3 {SUMS[VERSION]}", "model=registry.ollama.ai/library/llama3.2/3b",
        "addresses=10.10.0.21 10.20.0.21", "selinux=Enforcing", "selinux_connect=on",
        "selinux_port=no",
    ])
    assert got == {
        "linked": "/opt/ollama/0.13.3/bin/ollama", "versions": ["0.13.0", "0.13.3"],
        "installed": {"0.13.3": SUMS[VERSION]},
        "models": ["registry.ollama.ai/library/llama3.2/3b"],
        "addresses": ["10.10.0.21", "10.20.0.21"], "selinux": "Enforcing",
        "selinux_connect": "on", "selinux_port": False,
    }


# ---------------------------------------------------------------------------
# Re-runs, upgrades, models
# ---------------------------------------------------------------------------


def test_nothing_changes_and_nothing_restarts_when_nothing_changed(cache):
    p = _plan(cache, facts=_deployed(cache))
    for name in SERVERS:
        assert not p.op(name, f"Ollama {VERSION} release archive").commands
        assert not p.op(name, "Write the Ollama unit").commands
        assert not p.op(name, "Write Ollama's settings (drop-in aicluster.conf)").commands
        assert f"Unpack Ollama {VERSION}" not in p.names(name)
        assert not any(n.startswith("Remove Ollama") for n in p.names(name))
        for op in SERVER_GUARDED:
            assert p.op(name, op).skipped, (name, op)
        assert not p.changing(name), p.changing(name)
    for op in GATEWAY_GUARDED:
        assert p.op("head", op).skipped, op
    assert not p.op("head", "Write the Ollama gateway (nginx)").commands
    assert not p.changing("head"), p.changing("head")


def test_a_version_bump_replaces_the_binary_and_restarts(cache):
    p = _plan(cache, facts=_deployed(cache, version=OLD))
    for name in SERVERS:
        put = p.op(name, f"Ollama {VERSION} release archive")
        assert f"/opt/ollama/{VERSION}/{ARCHIVE}" in put.text
        unpack = p.op(name, f"Unpack Ollama {VERSION}")
        link = p.op(name, f"/usr/local/bin/ollama runs Ollama {VERSION}")
        assert "rm -f /usr/local/bin/ollama" in link.text
        assert f"ln -s /opt/ollama/{VERSION}/bin/ollama /usr/local/bin/ollama" in link.text
        # The unit and the settings are the same: only the release changed.
        assert not p.op(name, "Write the Ollama unit").commands
        assert not p.op(name, "Write Ollama's settings (drop-in aicluster.conf)").commands
        restart = p.op(name, "Restart Ollama (its release, unit or settings changed)")
        assert restart.runs and "systemctl restart ollama.service" in restart.text
        assert p.op(name, RELOAD).skipped, "the unit and the drop-in are unchanged"
        remove = p.op(name, f"Remove Ollama {OLD} (the node runs {VERSION})")
        assert f"rm -rf /opt/ollama/{OLD}" in remove.text
        assert put.index < unpack.index < link.index < restart.index < remove.index


def _ran(p, name, ops):
    """Which of the guarded ``ops`` run on ``name``; the others must be skipped."""
    ran = {op for op in ops if p.op(name, op).runs}
    for op in set(ops) - ran:
        assert p.op(name, op).skipped, (name, op)
    return ran


def test_each_server_restarts_only_after_its_own_change(cache):
    changed = {"gpu1": {UNIT: b"[Service]\n"}, "gpu2": {DROPIN: b"[Service]\n"},
               # The release unpacked, but the archive on the node is another one.
               "cpu1": {f"/opt/ollama/{VERSION}/{ARCHIVE}": b"another archive"}}
    p = _plan(cache, facts=_deployed(cache, changed=changed))
    assert _ran(p, "gpu1", SERVER_GUARDED) == {RELOAD, RESTART}
    assert _ran(p, "gpu2", SERVER_GUARDED) == {RELOAD, RESTART}
    # A new archive is unpacked again and restarts Ollama; no unit changed.
    assert _ran(p, "cpu1", SERVER_GUARDED) == {UNPACK_AGAIN, RESTART}
    for name in SERVERS:
        restart = p.op(name, RESTART)
        assert restart.commands == ["systemctl restart ollama.service"]
        assert restart.index > p.op(name, RELOAD).index
    # The gateway did not change: nginx is left alone.
    assert _ran(p, "head", GATEWAY_GUARDED) == set()


def test_a_link_to_another_release_restarts_ollama(cache):
    links = {"gpu2": {"/usr/local/bin/ollama": f"/opt/ollama/{OLD}/bin/ollama"}}
    p = _plan(cache, facts=_deployed(cache, relinked=links))
    assert _ran(p, "gpu2", SERVER_GUARDED) == {RESTART}
    for name in ("gpu1", "cpu1"):
        assert _ran(p, name, SERVER_GUARDED) == set(), name


def test_a_gateway_change_is_checked_and_reloaded_and_restarts_no_server(cache):
    for changed, links in (({"head": {GATEWAY: b"# older\n"}}, None),
                           # Debian's default site came back (a package upgrade).
                           (None, {"head": {DEFAULT_SITE: "/etc/nginx/sites-available/default"}})):
        p = _plan(cache, facts=_deployed(cache, changed=changed, relinked=links))
        assert _ran(p, "head", GATEWAY_GUARDED) == {CHECK_NGINX, RELOAD_NGINX}
        assert p.op("head", CHECK_NGINX).index < p.op("head", RELOAD_NGINX).index
        assert p.op("head", RELOAD_NGINX).commands == [
            "systemctl reload-or-restart nginx.service"]
        for name in SERVERS:
            assert _ran(p, name, SERVER_GUARDED) == set(), name


def test_models_are_pulled_only_where_missing(cache):
    extra = {"ollama_models": ["llama3.2:3b", "nomic-embed-text"]}
    facts = _deployed(cache, extra=extra)
    llama = "registry.ollama.ai/library/llama3.2/3b"
    embed = "registry.ollama.ai/library/nomic-embed-text/latest"
    facts["gpu1"]["OllamaNode"]["models"] = [llama, embed]
    facts["gpu2"]["OllamaNode"]["models"] = [llama]
    p = _plan(cache, extra=extra, facts=facts)
    assert not any(n.startswith(("Pull", "Wait")) for n in p.names("gpu1"))
    assert not p.changing("gpu1")
    assert [n for n in p.names("gpu2") if n.startswith("Pull")] == [
        "Pull the model nomic-embed-text"]
    pull = p.op("gpu2", "Pull the model nomic-embed-text").text
    assert ("OLLAMA_HOST=10.20.0.22:11434 timeout 3600 /usr/local/bin/ollama pull "
            "nomic-embed-text") in pull
    cpu = p.names("cpu1")
    assert cpu.index("Wait until Ollama answers") < cpu.index("Pull the model llama3.2:3b") \
        < cpu.index("Pull the model nomic-embed-text")
    assert cpu.index("Ollama running and enabled") < cpu.index("Wait until Ollama answers")


def _models_archive(path: Path, names: list[str]) -> str:
    """A tar of an OLLAMA_MODELS tree holding manifests for ``names`` (stand-in blobs)."""
    with tarfile.open(path, "w") as tar:
        for name in names:
            data = f'{{"stand-in manifest": "{name}"}}'.encode()
            info = tarfile.TarInfo(f"manifests/{ollama_derive.manifest_path(name)}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        blob = tarfile.TarInfo("blobs/sha256-0000")
        blob.size = 4
        tar.addfile(blob, io.BytesIO(b"blob"))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_offline_models_come_from_the_pinned_archive(cache, tmp_path):
    offline = tmp_path / "artifacts"
    (offline / "ollama" / "models").mkdir(parents=True)
    archive = offline / "ollama" / "models" / "models.tar"
    digest = _models_archive(archive, ["llama3.2:3b", "nomic-embed-text"])
    extra = {"artifacts_dir": str(offline), "ollama_models": ["llama3.2:3b"],
             "ollama_models_archive": "ollama/models/models.tar",
             "ollama_models_archive_sha256": digest}
    p = _plan(cache, extra=extra)
    put = p.op("gpu1", "Copy the models archive ollama/models/models.tar").text
    assert f"FileUploadCommand({archive}, /mnt/nvme-cache/ollama/.aicluster-models-archive)" \
        in put
    unpack = p.op("gpu1", "Unpack llama3.2:3b from the models archive").text
    assert ("tar -xf /mnt/nvme-cache/ollama/.aicluster-models-archive -C /mnt/nvme-cache/ollama "
            "--no-same-owner manifests blobs") in unpack
    assert "rm -f /mnt/nvme-cache/ollama/.aicluster-models-archive" in unpack
    assert not any(n.startswith(("Pull", "Wait")) for n in p.names("gpu1"))


def test_a_wrong_or_incomplete_models_archive_stops_the_deploy(cache, tmp_path):
    offline = tmp_path / "artifacts"
    offline.mkdir()
    digest = _models_archive(offline / "models.tar", ["llama3.2:3b"])
    extra = {"artifacts_dir": str(offline), "ollama_models": ["llama3.2:3b", "qwen3:8b"],
             "ollama_models_archive": "models.tar", "ollama_models_archive_sha256": digest}
    with pytest.raises(DeployError, match=r"host 'gpu1': ollama_models_archive: .* holds no "
                                          r"qwen3:8b"):
        _plan(cache, extra=extra)
    extra["ollama_models_archive_sha256"] = "0" * 64
    with pytest.raises(DeployError, match=r"host 'gpu1': ollama_models_archive: .* has sha256 "
                                          rf"{digest}, not the pinned 0{{64}}"):
        _plan(cache, extra=extra)


# ---------------------------------------------------------------------------
# Validation: every bad input refused, naming host and field
# ---------------------------------------------------------------------------


def _validate(extra=None, hosts=HOSTS, groups=GROUPS, host_extra=None):
    cluster = _cluster(Path("/nonexistent-cache"), **(extra or {}))
    spec = {}
    for name, data in hosts:
        mine = [g for g, members in groups.items() if name in members]
        spec[name] = (mine, {**cluster, **data, **(host_extra or {}).get(name, {})})
    return validate(spec)


BAD = [
    ("network-missing", {"ollama_network": "storage"}, None,
     "host 'gpu1': ollama_network: 'storage' is not a network of this inventory"),
    ("network-no-address", {"networks": {"management": {"subnet": "10.10.0.0/24"},
                                         "fabric": {"subnet": "10.20.0.0/24"},
                                         "storage": {"subnet": "10.30.0.0/24"}},
                            "ollama_network": "storage"}, None,
     "host 'gpu1': ollama_network: the host has no address on the storage network"),
    ("keep-alive", {"ollama_keep_alive": "5 minutes"}, None,
     "host 'head': ollama_keep_alive: '5 minutes' is not a duration"),
    ("keep-alive-bool", {"ollama_keep_alive": True}, None,
     "host 'head': ollama_keep_alive: True is not a duration"),
    ("num-parallel", {"ollama_num_parallel": 0}, None,
     "host 'head': ollama_num_parallel: Input should be greater than or equal to 1 (got 0)"),
    ("max-loaded", {"ollama_max_loaded_models": -1}, None,
     "host 'head': ollama_max_loaded_models: Input should be greater than or equal to 0 "
     "(got -1)"),
    ("port", {"ollama_port": 70000}, None,
     "host 'head': ollama_port: Input should be less than or equal to 65535 (got 70000)"),
    ("port-quoted", {"ollama_port": "11434"}, None,
     "host 'head': ollama_port: Input should be a valid integer (got '11434')"),
    ("unknown-key", {"ollama_model": ["llama3.2:3b"]}, None,
     "host 'head': ollama_model: not a ollama setting; did you mean ollama_models?"),
    ("host", None, {"gpu1": {"ollama_host": "all-interfaces"}},
     "host 'gpu1': ollama_host: 'all-interfaces' is not an IP address"),
    ("gateway-listen", None, {"head": {"ollama_gateway_listen": "10.20.0"}},
     "host 'head': ollama_gateway_listen: '10.20.0' is not an IP address"),
    ("model-name", {"ollama_models": ["llama3.2:3b", "Bad Model!"]}, None,
     "host 'head': ollama_models[1]: 'Bad Model!' is not an Ollama model name"),
    ("models-not-list", {"ollama_models": "llama3.2"}, None,
     "host 'head': ollama_models: Input should be a valid list (got 'llama3.2')"),
    ("config-own-field", {"ollama_config": {"OLLAMA_HOST": "0.0.0.0"}}, None,
     "host 'head': ollama_config.OLLAMA_HOST: set by ollama_host / ollama_network / "
     "ollama_port; use that"),
    ("config-quote", {"ollama_config": {"OLLAMA_ORIGINS": 'a"b'}}, None,
     "host 'head': ollama_config.OLLAMA_ORIGINS: 'a\"b' may hold no quote"),
    ("config-name", {"ollama_config": {"9LIVES": "1"}}, None,
     "host 'head': ollama_config.9LIVES: String should match pattern '^[A-Za-z_][A-Za-z0-9_]*$' "
     "(got '9LIVES')"),
    ("archive-needs-dir", {"ollama_models_archive": "models.tar",
                           "ollama_models_archive_sha256": "a" * 64}, None,
     "host 'gpu1': ollama_models_archive: needs artifacts_dir"),
    ("archive-sha", {"artifacts_dir": "/srv/artifacts", "ollama_models_archive": "models.tar",
                     "ollama_models_archive_sha256": "abc"}, None,
     "host 'head': ollama_models_archive_sha256: String should match pattern '^[0-9a-f]{64}$' "
     "(got 'abc')"),
    ("archive-sha-missing", {"artifacts_dir": "/srv/artifacts",
                             "ollama_models_archive": "models.tar"}, None,
     "host 'gpu1': ollama_models_archive_sha256: not set, but ollama_models_archive is"),
    ("archive-path", {"artifacts_dir": "/srv/artifacts", "ollama_models_archive": "../x.tar",
                      "ollama_models_archive_sha256": "a" * 64}, None,
     "host 'head': ollama_models_archive: '../x.tar' has a '.' or '..' component"),
    ("install-dir", {"ollama_install_dir": "opt/ollama"}, None,
     "host 'head': ollama_install_dir: String should match pattern '^/[A-Za-z0-9_.-]+"
     "(/[A-Za-z0-9_.-]+)*$' (got 'opt/ollama')"),
    ("body-size", {"ollama_gateway_client_max_body_size": "lots"}, None,
     "host 'head': ollama_gateway_client_max_body_size: 'lots' is not an nginx size"),
    ("fail-timeout", {"ollama_gateway_fail_timeout": 0}, None,
     "host 'head': ollama_gateway_fail_timeout: Input should be greater than or equal to 1 "
     "(got 0)"),
    ("version-differs", None, {"cpu1": {"ollama_version": OLD}},
     "host 'cpu1': ollama_version: '0.13.0' differs from '0.13.3' on host 'gpu1'"),
    ("version-unpinned", {"ollama_version": "0.99.0"}, None,
     "ollama_artifacts.ollama.sha256: no checksum pinned for version '0.99.0'"),
    ("release-format", {"ollama_artifacts": {"ollama": {
        "url": "http://127.0.0.1:9/v{version}/ollama-linux-{arch}.zip",
        "sha256": {v: {"amd64": s} for v, s in SUMS.items()}, "groups": ["ollama"]}}}, None,
     "host 'gpu1': ollama_artifacts.ollama: the release file 'ollama-linux-amd64.zip' is not "
     "an archive the deploy unpacks; pin the release's .tgz or .tar.gz or .tar.zst or .tzst"),
]


@pytest.mark.parametrize("extra, host_extra, message", [c[1:] for c in BAD],
                         ids=[c[0] for c in BAD])
def test_bad_input_is_refused_naming_host_and_field(extra, host_extra, message):
    with pytest.raises(InventoryError) as caught:
        _validate(extra, host_extra=host_extra)
    assert any(message in e for e in caught.value.errors), caught.value.errors


def test_a_gateway_without_ollama_nodes_is_refused():
    with pytest.raises(InventoryError) as caught:
        _validate(groups={"ollama_gateway": ["head"], "gpu_nodes": ["gpu1", "gpu2"]})
    assert ("host 'head': groups: is in ollama_gateway, which balances across the hosts of "
            "the ollama group; the inventory has none") in caught.value.errors


def test_a_gateway_on_an_ollama_node_needs_another_port():
    groups = {**GROUPS, "ollama_gateway": ["cpu1"]}
    with pytest.raises(InventoryError) as caught:
        _validate(groups=groups)
    assert any("host 'cpu1': ollama_gateway_port: the host runs Ollama and the gateway, both "
               "on 10.20.0.31:11434" in e for e in caught.value.errors), caught.value.errors
    cluster = _validate(groups=groups, extra={"ollama_gateway_port": 11435})
    assert cluster.group("ollama_gateway") == ("cpu1",)


def test_several_ollama_nodes_without_a_gateway_warn():
    groups = {g: m for g, m in GROUPS.items() if g != "ollama_gateway"}
    assert any("ollama runs on several nodes without an ollama_gateway" in w
               for w in _validate(groups=groups).warnings)
    # (this small cluster has no monitoring host, which monitoring warns of)
    assert not [w for w in _validate().warnings if "groups: monitoring" not in w]


def test_model_names_map_to_their_manifests():
    assert ollama_derive.manifest_path("llama3.2") == "registry.ollama.ai/library/llama3.2/latest"
    assert ollama_derive.manifest_path("llama3.2:3b") == "registry.ollama.ai/library/llama3.2/3b"
    assert ollama_derive.manifest_path("jmorgan/tiny:q4") == "registry.ollama.ai/jmorgan/tiny/q4"
    assert ollama_derive.manifest_path("hub.lab:5000/ml/coder:7b") == "hub.lab:5000/ml/coder/7b"
    for bad in ("", "a/b/c/d", "x:", " llama", "llama@sha256:00"):
        assert ollama_derive.parse_model(bad) is None, bad


def test_the_gateway_removes_the_distributions_default_site(cache, distro):
    """Debian's and Ubuntu's default nginx site listens on port 80 of every address: the
    gateway removes it (and reloads nginx), unless the inventory keeps it; Rocky's
    default server is in nginx.conf itself, so there is nothing to remove."""
    site = "/etc/nginx/sites-enabled/default"
    links = {site: "/etc/nginx/sites-available/default"}
    present = {"head": {"Link": _existing({}, links)["Link"]}}
    p = _plan(cache, distro, facts=present)
    name = "Remove the distribution's default nginx site"
    if DISTRIBUTIONS[distro]["name"] in ("Debian", "Ubuntu"):
        assert f"rm -f {site}" in p.op("head", name).text
    else:
        assert name not in p.names("head")
    kept = _plan(cache, distro, facts=present,
                 extra={"ollama_gateway_keep_default_site": True})
    assert name not in kept.names("head")
    assert not any(site in op.text for op in kept.ops["head"])
