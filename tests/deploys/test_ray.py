"""The ray deploy planned on fake hosts: head and workers, GPUs, Debian/Ubuntu/Rocky,
the upgrade order of a version bump, and restarts only after a change.

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

import pytest
from pyinfra.api.exceptions import DeployError

from aicluster.components.ray import deploy as ray
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan

VERSION = "2.60.0"
OLD = "2.59.0"
HEAD_UNIT = "/etc/systemd/system/ray-head.service"
WORKER_UNIT = "/etc/systemd/system/ray-worker.service"
APT_STAMP = "/var/lib/apt/periodic/update-success-stamp"
NOW = datetime(2026, 1, 1, 12, 0)
RESTART = "Restart the Ray {role} (its unit changed)"
RELOAD = "Reload systemd units"
WAIT = "Wait until the Ray head answers"

CLUSTER = {
    "cluster_name": "demo",
    "networks": {
        "management": {"subnet": "10.10.0.0/24"},
        "fabric": {"subnet": "10.20.0.0/24", "mtu": 9000},
    },
    "nvidia_cuda_repo_url": "https://mirror.example.org/nvidia/cuda/repos",
    "ray_version": VERSION,
}


def _host(name: str, n: int, **hardware) -> tuple[str, dict]:
    return (
        name,
        {
            "ssh_hostname": f"10.10.0.{n}",
            "hardware": {
                "cpus": 16,
                "memory_gb": 64,
                "nics": [
                    {"name": "ens1", "network": "fabric", "address": f"10.20.0.{n}", "mtu": 9000}
                ],
                **hardware,
            },
        },
    )


HOSTS = [
    _host("head", 10),
    _host(
        "gpu1",
        21,
        cpus=112,
        memory_gb=2048,
        gpus={"model": "H100-SXM5-80GB", "count": 8, "memory_gb": 80, "nvswitch": True},
    ),
    _host("cpu1", 31),
]
GROUPS = {"ray_head": ["head"], "ray_workers": ["gpu1", "cpu1"], "gpu_nodes": ["gpu1"]}


def _node(python="3.11.2", ray_version=None, deployed=None, versions=()):
    return {"python": python, "ray": ray_version, "deployed": deployed, "versions": list(versions)}


def _running(*units):
    return lambda **kw: {u: True for u in units}


def _existing(files: dict[str, str]):
    """File and Sha1File facts for files already on the host (path -> text)."""
    def file_fact(path, **kw):
        if path in files:
            return {"mode": 644, "user": "root", "group": "root"}
        if path == APT_STAMP:  # apt's index was refreshed a minute ago
            return {"mode": 644, "user": "root", "group": "root", "mtime": NOW}
        return None

    def sha1_fact(path, **kw):
        return hashlib.sha1(files[path].encode()).hexdigest() if path in files else None

    def directory_fact(path, **kw):
        owner = "ray" if path == "/var/lib/ray" else "root"
        return {"mode": 755, "user": owner, "group": owner}

    return {"File": file_fact, "Sha1File": sha1_fact, "Directory": directory_fact}


def _plan(distro="debian12", extra=None, facts=None, hosts=HOSTS):
    host_facts = {}
    for name, _ in hosts:
        host_facts[name] = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "Os": "Linux",
            "Which": lambda command, **kw: f"/usr/sbin/{command}",
            "RayNode": _node(),
            **(facts or {}).get(name, {}),
        }
    return plan(hosts, GROUPS, {**CLUSTER, **(extra or {})}, host_facts, ray.deploy)


def _deployed_facts(version=VERSION, units=None, head_address="10.20.0.10:6379"):
    """Every node runs ``version`` with the units the deploy writes now."""
    fresh = _plan(extra={"ray_version": version})
    facts = {}
    for name, _ in HOSTS:
        unit = HEAD_UNIT if name == "head" else WORKER_UNIT
        text = fresh.upload(name, unit)
        if units and name in units:
            text = units[name]
        facts[name] = {
            "RayNode": _node(ray_version=version, deployed=version, versions=[version]),
            "SystemdStatus": _running("ray-head.service", "ray-worker.service"),
            "SystemdEnabled": _running("ray-head.service", "ray-worker.service"),
            "Groups": ["root", "ray"],
            "DebPackages": {"python3": ["3.11.2-1+b1"], "python3-venv": ["3.11.2-1+b1"]},
            "Date": NOW + timedelta(minutes=1),
            "Users": {"ray": {"home": "/var/lib/ray", "shell": "/usr/sbin/nologin",
                              "group": "ray", "groups": [], "comment": None}},
            **_existing({unit: text, f"/opt/aicluster/ray/{version}/venv/bin/activate": ""}),
        }
    return facts


def test_head_and_workers_get_their_own_units(distro):
    p = _plan(distro)
    head = p.upload("head", HEAD_UNIT)
    assert "ray start --head --block" in head
    assert "--node-ip-address=10.20.0.10 --port=6379" in head
    # The dashboard listens on the head's cluster address only.
    assert "--dashboard-host=10.20.0.10 --dashboard-port=8265" in head
    assert "0.0.0.0" not in head
    assert "Ray head running and enabled" in p.names("head")
    assert "Write the Ray worker unit" not in p.names("head")
    for worker, ip in (("gpu1", "10.20.0.21"), ("cpu1", "10.20.0.31")):
        unit = p.upload(worker, WORKER_UNIT)
        assert "--head" not in unit
        assert f"--address=10.20.0.10:6379 --node-ip-address={ip}" in unit
        assert "Restart=always" in unit
        assert "Write the Ray head unit" not in p.names(worker)
    for name, _ in HOSTS:
        unit = p.upload(name, HEAD_UNIT if name == "head" else WORKER_UNIT)
        assert f"ExecStart=/opt/aicluster/ray/{VERSION}/venv/bin/ray start" in unit
        assert "TimeoutStopSec=120\n" in unit
        assert f"ExecStop=/opt/aicluster/ray/{VERSION}/venv/bin/ray stop\n" in unit
        assert "User=ray\n" in unit


def test_resources_come_from_the_inventory_hardware():
    p = _plan()
    gpu = p.upload("gpu1", WORKER_UNIT)
    assert "--num-cpus=112 --num-gpus=8" in gpu
    # 0.6 and 0.3 of 2048 GiB, the object store capped at 200 GiB.
    assert f"--memory={int(2048 * 1024**3 * 0.6)}" in gpu
    assert f"--object-store-memory={200 * 1024**3}" in gpu
    cpu = p.upload("cpu1", WORKER_UNIT)
    assert "--num-cpus=16 --num-gpus=0" in cpu
    assert f"--memory={int(64 * 1024**3 * 0.6)} --object-store-memory={int(64 * 1024**3 * 0.3)}" \
        in cpu
    assert "--resources" not in cpu


def test_custom_resources_and_dashboard_settings():
    hosts = [HOSTS[0], (HOSTS[1][0], {**HOSTS[1][1], "ray_resources": {"nvswitch": 1}}), HOSTS[2]]
    p = _plan(hosts=hosts, extra={"ray_dashboard_host": "0.0.0.0"})
    assert "--resources='{\"nvswitch\":1}'" in p.upload("gpu1", WORKER_UNIT)
    assert "--resources" not in p.upload("cpu1", WORKER_UNIT)
    assert "--dashboard-host=0.0.0.0" in p.upload("head", HEAD_UNIT)
    p = _plan(extra={"ray_dashboard": False, "ray_network": "management"})
    head = p.upload("head", HEAD_UNIT)
    assert "--include-dashboard=false" in head and "--dashboard-host" not in head
    assert "--node-ip-address=10.10.0.10" in head
    assert "--address=10.10.0.10:6379" in p.upload("gpu1", WORKER_UNIT)


def test_ray_is_installed_in_a_venv_per_version_with_pip_timeouts(distro):
    p = _plan(distro)
    for name, _ in HOSTS:
        venv = p.op(name, f"Virtual environment for Ray {VERSION}").text
        python = "python3.11" if distro == "rocky9" else "python3"
        assert f"{python} -m venv /opt/aicluster/ray/{VERSION}/venv" in venv
        install = p.op(name, f"Install Ray {VERSION}").text
        assert f"/opt/aicluster/ray/{VERSION}/venv/bin/pip install" in install
        assert "--timeout 60 --retries 5" in install
        assert f"'ray[default]=={VERSION}'" in install
        assert "useradd" in p.op(name, "Ray user ray").text


def test_debian_family_installs_python3_venv_with_apt():
    for distro in ("debian12", "ubuntu2204", "ubuntu2404"):
        text = _plan(distro).op("gpu1", "Install Python and venv for Ray").text
        assert "apt-get" in text and "python3-venv" in text


def test_rocky_installs_python311_with_dnf():
    p = _plan("rocky9")
    text = p.op("gpu1", "Install Python and venv for Ray").text
    assert "dnf" in text and "python3.11" in text
    assert "apt" not in p.commands("gpu1")


def test_nodes_are_installed_together_then_head_before_workers():
    p = _plan()
    install = {n: p.op(n, f"Install Ray {VERSION}").index for n, _ in HOSTS}
    # One operation: every node installs at once.
    assert len(set(install.values())) == 1
    head_restart = p.op("head", "Restart the Ray head (its unit changed)").index
    head_wait = p.op("head", "Wait until the Ray head answers").index
    for worker in ("gpu1", "cpu1"):
        unit = p.op(worker, "Write the Ray worker unit").index
        start = p.op(worker, "Restart the Ray worker (its unit changed)").index
        assert install["head"] < head_restart < head_wait < unit < start


def test_version_bump_stops_workers_upgrades_head_then_workers_rejoin():
    facts = _deployed_facts(version=OLD)
    p = _plan(facts=facts)
    install = p.op("head", f"Install Ray {VERSION}").index
    stop = {w: p.op(w, f"Stop the Ray worker while the head upgrades to {VERSION}")
            for w in ("gpu1", "cpu1")}
    for op in stop.values():
        assert "systemctl stop ray-worker.service" in op.text
    head_unit = p.op("head", "Write the Ray head unit")
    assert f"/opt/aicluster/ray/{VERSION}/venv/bin/ray start --head" in head_unit.text
    head_restart = p.op("head", "Restart the Ray head (its unit changed)").index
    head_wait = p.op("head", "Wait until the Ray head answers").index
    for worker in ("gpu1", "cpu1"):
        unit = p.op(worker, "Write the Ray worker unit")
        assert f"/opt/aicluster/ray/{VERSION}/venv/bin/ray start --block" in unit.text
        restart = p.op(worker, "Restart the Ray worker (its unit changed)").index
        remove = p.op(worker, f"Remove Ray {OLD} (the nodes run {VERSION})")
        assert f"/opt/aicluster/ray/{OLD}" in remove.text
        # The new version is installed beside the old one while the cluster runs on;
        # then workers stop, the head switches and answers, and workers rejoin.
        assert install < stop[worker].index < head_unit.index < head_restart < head_wait
        assert head_wait < unit.index < restart < remove.index
    assert "Stop the Ray worker" not in " ".join(p.names("head"))


def test_nothing_changes_and_nothing_restarts_when_nothing_changed():
    p = _plan(facts=_deployed_facts())
    for name, _ in HOSTS:
        role = "head" if name == "head" else "worker"
        assert not p.op(name, f"Write the Ray {role} unit").commands
        assert f"Install Ray {VERSION}" not in p.names(name)
        assert not any(n.startswith("Stop the Ray worker") for n in p.names(name))
        assert not any(n.startswith("Remove Ray") for n in p.names(name))
        assert not p.op(name, f"Ray {role} running and enabled").commands
        # Restarts hang off the unit's change only: none of them runs.
        for op in (RESTART.format(role=role), RELOAD, WAIT):
            assert p.op(name, op).skipped, (name, op)
        assert not p.changing(name), p.changing(name)


def test_head_address_change_rewrites_worker_units_and_restarts_them():
    # The workers' units name the head's old address; the head's unit is current.
    old = _plan().upload("gpu1", WORKER_UNIT).replace("10.20.0.10:6379", "10.20.0.99:6379")
    facts = _deployed_facts(units={"gpu1": old, "cpu1": old})
    p = _plan(facts=facts)
    assert not p.op("head", "Write the Ray head unit").commands
    for worker in ("gpu1", "cpu1"):
        unit = p.op(worker, "Write the Ray worker unit")
        assert unit.commands and "--address=10.20.0.10:6379" in unit.text
        restart = p.op(worker, "Restart the Ray worker (its unit changed)")
        assert restart.runs and "systemctl restart ray-worker.service" in restart.text
        assert p.op(worker, RELOAD).runs, "a changed unit is read again before the restart"
        assert restart.index > unit.index
        # Not an upgrade: workers are not stopped first.
        assert not any(n.startswith("Stop the Ray worker") for n in p.names(worker))


def test_only_the_node_whose_unit_changed_restarts():
    # gpu1's unit names the head's old address; cpu1's and the head's are current.
    old = _plan().upload("gpu1", WORKER_UNIT).replace("10.20.0.10:6379", "10.20.0.99:6379")
    p = _plan(facts=_deployed_facts(units={"gpu1": old}))
    assert p.op("gpu1", RESTART.format(role="worker")).runs
    assert p.op("gpu1", RELOAD).runs
    for name, role in (("cpu1", "worker"), ("head", "head")):
        assert p.op(name, RESTART.format(role=role)).skipped, f"{name}: its unit is unchanged"
        assert p.op(name, RELOAD).skipped, f"{name}: its unit is unchanged"
    # The head did not restart and no upgrade runs: nobody waits for it.
    for name, _ in HOSTS:
        assert p.op(name, WAIT).skipped, name


def test_a_changed_head_unit_restarts_the_head_and_waits_for_it_only():
    old = _plan().upload("head", HEAD_UNIT).replace("--dashboard-port=8265", "--dashboard-port=1")
    p = _plan(facts=_deployed_facts(units={"head": old}))
    restart = p.op("head", RESTART.format(role="head"))
    assert restart.runs and "systemctl restart ray-head.service" in restart.text
    assert p.op("head", RELOAD).runs
    wait = p.op("head", WAIT)
    assert wait.runs, "the head is waited for after its restart"
    assert wait.index > restart.index
    for worker in ("gpu1", "cpu1"):
        assert p.op(worker, RESTART.format(role="worker")).skipped, worker
        assert p.op(worker, RELOAD).skipped, worker
        # Not an upgrade: the workers keep running and do not wait.
        assert p.op(worker, WAIT).skipped, worker


def test_workers_wait_for_the_head_during_an_upgrade_only():
    p = _plan(facts=_deployed_facts(version=OLD))
    for name, _ in HOSTS:
        assert p.op(name, WAIT).runs, name
    p = _plan(facts=_deployed_facts())
    for name, _ in HOSTS:
        assert p.op(name, WAIT).skipped, name


def test_nodes_with_different_pythons_are_refused_before_anything_runs():
    facts = {"cpu1": {"RayNode": _node(python="3.10.12")}}
    with pytest.raises(DeployError) as caught:
        _plan(facts=facts)
    message = str(caught.value)
    assert "different Python versions" in message
    assert "cpu1 3.10.12" in message and "head 3.11.2" in message


def test_a_node_without_python_yet_is_not_a_mismatch():
    p = _plan(facts={"cpu1": {"RayNode": _node(python=None)}})
    assert "Install Python and venv for Ray" in p.names("cpu1")


def test_a_node_without_the_ray_address_is_refused():
    facts = {"gpu1": {"RayNode": {**_node(), "addresses": ["10.10.0.21"]}},
             "head": {"RayNode": {**_node(), "addresses": ["10.10.0.10", "10.20.0.10"]}}}
    with pytest.raises(DeployError) as caught:
        _plan(facts=facts)
    message = str(caught.value)
    assert "host 'gpu1' does not have the address Ray binds to, 10.20.0.21" in message
