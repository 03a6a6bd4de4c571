"""Desired absence planned on fake hosts: what a node recorded and the inventory no
longer gives it is stopped, disabled and its configuration removed; packages and data
stay; the record is written at the end of each host's deploy; a removal that would
break the cluster stops the run before any operation is planned.

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
This plans what deploy.py does around the components (aicluster.common.ops:
refuse_breaking_removals, remove_absent, record_components).
"""

from __future__ import annotations

import json
from unittest import mock

import pytest
from pyinfra import host

import aicluster.common.ops as common_ops
from aicluster.common.absence import RECORD
from aicluster.common.ops import (
    current_cluster,
    record_components,
    refuse_breaking_removals,
    remove_absent,
)
from aicluster.components.slurm import derive as slurm_derive
from tests.deploys.conftest import CLUSTER, DISTRIBUTIONS
from tests.deploys.harness import NodeFile, file_facts, plan

HOSTS = [
    ("head", {"ssh_hostname": "10.10.0.10", "hardware": {"cpus": 32, "memory_gb": 256}}),
    ("gpu1", {"ssh_hostname": "10.10.0.21", "hardware": {"cpus": 32, "memory_gb": 256}}),
    ("gpu2", {"ssh_hostname": "10.10.0.22", "hardware": {"cpus": 32, "memory_gb": 256}}),
]
GROUPS = {"slurm_controller": ["head"], "slurm_workers": ["head", "gpu1", "gpu2"]}
RUNNING = {"SystemdStatus": {f"{u}.service": True for u in ("slurmd", "slurmctld", "munge")},
           "SystemdEnabled": {f"{u}.service": True for u in ("slurmd", "slurmctld", "munge")},
           "UnitLoaded": lambda unit: unit in ("slurmd.service", "slurmctld.service",
                                               "munge.service")}
WORKER = {"base": [], "network": [], "slurm": ["slurm_workers"]}
HEAD = {"base": [], "network": [], "slurm": ["slurm_controller", "slurm_workers"]}
#: The cluster's data for one host alone (without what names the head host).
ALONE = {k: v for k, v in CLUSTER.items() if v != "head"}
DATA_DIRS = ("/var/lib/slurm", "/var/spool/slurm", "/var/log/slurm", "/var/lib/ceph")


def _absence():
    """deploy.py's own steps around the components."""
    cluster = current_cluster()
    refuse_breaking_removals(cluster)
    wanted = cluster.hosts[host.name].roles()
    remove_absent(wanted, cluster)
    record_components(wanted)


#: What a Slurm node holds after a deploy: configuration, and data the deploy made.
NODE_FILES = {path: NodeFile(b"x") for path in (
    slurm_derive.SLURM_CONF, slurm_derive.GRES_CONF, slurm_derive.CGROUP_CONF,
    slurm_derive.MUNGE_KEY, slurm_derive.INSTALLER, "/var/lib/slurm/slurmd/node_state",
    "/var/spool/slurm/d/cred_state")}


def _plan(groups, recorded):
    facts = {name: {"LinuxDistribution": DISTRIBUTIONS["debian12"], **RUNNING,
                    **file_facts(NODE_FILES), "RecordedComponents": recorded.get(name, {})}
             for name, _ in HOSTS}
    with mock.patch.object(common_ops, "_CHECKED", set()):
        return plan(HOSTS, groups, {**CLUSTER, "slurm_version": "22.05.8"}, facts, _absence)


def _all_commands(p, name):
    return "\n".join(c for op in p.ops[name] for c in op.commands)


def test_a_worker_taken_out_of_slurm_stops_slurmd_and_loses_its_configuration():
    recorded = {"head": HEAD, "gpu1": WORKER, "gpu2": WORKER}
    p = _plan({"slurm_controller": ["head"], "slurm_workers": ["head", "gpu1"]}, recorded)
    changing = p.changing("gpu2")
    text = _all_commands(p, "gpu2")
    print(changing, text, sep="\n")
    for unit in ("slurmd", "munge"):
        assert f"Stop and disable {unit} (no longer given here)" in changing
        assert f"systemctl stop {unit}.service" in text
        assert f"systemctl disable {unit}.service" in text
    for path in (slurm_derive.SLURM_CONF, slurm_derive.GRES_CONF, slurm_derive.MUNGE_KEY):
        assert f"Remove {path} (no longer given here)" in changing
        assert f"rm -f {path}" in text
    # Packages and data stay.
    assert "apt" not in text and "dnf" not in text and "dpkg" not in text
    for path in DATA_DIRS:
        assert path not in text
    # The nodes that keep Slurm change nothing here (their slurm.conf is the component's).
    assert not any("no longer given" in n for n in p.changing("gpu1") + p.changing("head"))


def test_a_controller_that_stays_a_worker_keeps_slurmd():
    recorded = {"head": HEAD, "gpu1": {"slurm": ["slurm_controller", "slurm_workers"]},
                "gpu2": WORKER}
    p = _plan({"slurm_controller": ["head"], "slurm_workers": ["head", "gpu1", "gpu2"]},
              recorded)
    changing = p.changing("gpu1")
    assert "Stop and disable slurmctld (no longer given here)" in changing
    assert not any(n.startswith(("Stop and disable slurmd", "Stop and disable munge",
                                 "Remove")) for n in changing), changing


def test_nothing_removed_when_the_record_matches():
    recorded = {"head": HEAD, "gpu1": WORKER, "gpu2": WORKER}
    p = _plan(GROUPS, recorded)
    for name, _ in HOSTS:
        assert not any("no longer given" in n for n in p.changing(name)), name


def test_a_fresh_node_removes_nothing_and_records_what_it_runs():
    p = _plan(GROUPS, {})
    for name, _ in HOSTS:
        assert not any("no longer given" in n for n in p.changing(name)), name
        body = json.loads(p.upload(name, RECORD))
        assert body["components"]["slurm"] == (
            ["slurm_controller", "slurm_workers"] if name == "head" else ["slurm_workers"])
        assert body["components"]["base"] == []
        # The record is the host's last operation.
        assert p.names(name)[-1] == f"Record the components this host runs ({RECORD})"


def test_the_last_slurm_controller_is_not_removed():
    recorded = {"head": HEAD, "gpu1": WORKER, "gpu2": WORKER}
    with pytest.raises(SystemExit, match="refusing to remove the Slurm controller from head"):
        _plan({"slurm_controller": ["gpu1"], "slurm_workers": ["gpu1", "gpu2"]}, recorded)


def _remove_only(recorded, files, loaded, cluster=None, extra=None):
    """remove_absent alone on one host that is now given only base."""
    facts = {"gpu1": {"LinuxDistribution": DISTRIBUTIONS["debian12"], **(extra or {}),
                      "SystemdStatus": {f"{u}.service": True for u in loaded},
                      "SystemdEnabled": {f"{u}.service": True for u in loaded},
                      "UnitLoaded": lambda unit: unit.removesuffix(".service") in loaded,
                      **file_facts({p: NodeFile(b"x") for p in files}),
                      "RecordedComponents": recorded}}
    return plan([HOSTS[1]], {}, cluster or ALONE, facts,
                lambda: remove_absent({"base": []}, current_cluster()))


def test_packages_stay_unless_the_inventory_names_the_component():
    installed = {"DebPackages": {p: ["22.05.8-4"] for p in ("slurmd", "slurm-client", "munge")},
                 "Link": lambda path, **kw: None}
    kept = _remove_only({"slurm": ["slurm_workers"]}, [], ["slurmd", "munge"], extra=installed)
    assert "apt" not in _all_commands(kept, "gpu1")
    gone = _remove_only({"slurm": ["slurm_workers"]}, [], ["slurmd", "munge"],
                        cluster={**ALONE, "remove_packages": ["slurm"]}, extra=installed)
    names = gone.names("gpu1")
    removing = [n for n in names if n.startswith("Remove slurmd")]
    assert removing and names.index(removing[0]) > names.index(
        "Stop and disable slurmd (no longer given here)")
    text = _all_commands(gone, "gpu1")
    assert "apt-get" in text and "remove" in text
    for package in ("slurmd", "slurm-client", "munge"):
        assert package in text
    # What is not installed is not named to apt.
    assert "slurmdbd" not in text.split("remove", 1)[1]


def test_software_beside_the_package_manager_goes_with_remove_packages():
    venvs = "/opt/aicluster/ray"
    p = _remove_only({"ray": ["ray_workers"]}, [f"{venvs}/2.60.0/venv/bin/ray"], [],
                     cluster={**ALONE, "remove_packages": ["ray"]},
                     extra={"Link": lambda path, **kw: None})
    assert f"Remove {venvs} (remove_packages)" in p.changing("gpu1")
    assert f"rm -rf {venvs}" in _all_commands(p, "gpu1")


def test_a_ceph_osd_host_is_checked_before_its_units_stop():
    from aicluster.components.ceph import derive as ceph_derive

    unit = f"/etc/systemd/system/{ceph_derive.OSD_UNIT}"
    p = _remove_only({"ceph": ["ceph_osds"]}, [unit, ceph_derive.OSD_TOOL],
                     ["aicluster-ceph-osds"])
    names = p.names("gpu1")
    check = next(i for i, n in enumerate(names) if n.startswith("Before taking away"))
    assert check < names.index("Stop and disable aicluster-ceph-osds (no longer given here)")
    assert "osd ls-tree gpu1" in "\n".join(p.ops["gpu1"][check].commands)
    assert f"Remove {unit} (no longer given here)" in p.changing("gpu1")


def test_a_ceph_monitor_is_removed_from_the_map_once_stopped_and_before_its_keys_go():
    from aicluster.components.ceph import derive as ceph_derive

    p = _remove_only({"ceph": ["ceph_mons"]}, [ceph_derive.ADMIN_KEYRING],
                     ["ceph-mon@gpu1", "ceph-mgr@gpu1"])
    names = p.names("gpu1")
    stop = names.index("Stop and disable ceph-mon@gpu1 (no longer given here)")
    after = next(i for i, n in enumerate(names) if n.startswith("Once stopped"))
    keys = names.index(f"Remove {ceph_derive.ADMIN_KEYRING} (no longer given here)")
    assert stop < after < keys
    assert "ceph --connect-timeout 30 mon remove gpu1" in "\n".join(p.ops["gpu1"][after].commands)


def test_removed_units_reload_systemd_once_and_only_when_removed():
    unit = "/etc/systemd/system/ray-worker.service"
    p = _remove_only({"base": [], "ray": ["ray_workers"]}, [unit], ["ray-worker"])
    assert "Stop and disable ray-worker (no longer given here)" in p.changing("gpu1")
    assert f"Remove {unit} (no longer given here)" in p.changing("gpu1")
    assert p.op("gpu1", "Reload systemd units (units removed)").runs
    # Already gone (a re-run with the old record): nothing to stop, remove or reload.
    p = _remove_only({"base": [], "ray": ["ray_workers"]}, [], [])
    assert p.changing("gpu1") == []


def test_the_ollama_gateway_removed_reloads_nginx_without_stopping_it():
    from aicluster.components.ollama.derive import GATEWAY_CONF

    p = _remove_only({"ollama": ["ollama", "ollama_gateway"]}, [GATEWAY_CONF],
                     ["ollama", "nginx"])
    changing = p.changing("gpu1")
    assert "Stop and disable ollama (no longer given here)" in changing
    assert not any("Stop and disable nginx" in n for n in changing)
    assert "Reload nginx (its configuration for this host removed)" in changing


def _unmount_only(mounted, in_fstab):
    """remove_absent alone on a host that recorded CephFS and NFS client mounts and is
    now given only base: *mounted* are mount points, *in_fstab* those with a line."""
    lines = {p: f"server:/x {p} nfs _netdev 0 0" for p in in_fstab}
    facts = {"gpu1": {"LinuxDistribution": DISTRIBUTIONS["debian12"],
                      "UnitLoaded": lambda unit: False,
                      "RecordedComponents": {"base": [], "ceph": ["ceph_clients"],
                                             "nfs": ["nfs_clients"]},
                      "RecordedMounts": {"ceph": ["/mnt/cephfs"], "nfs": ["/srv/models"]},
                      "Mounts": {p: {"device": "x", "type": "nfs", "options": []}
                                 for p in mounted},
                      "FindInFile": lambda path, pattern, **kw: [
                          line for p, line in lines.items() if path == "/etc/fstab"
                          and p in pattern.replace("[.]", ".")]}}
    return plan([HOSTS[1]], {}, ALONE, facts,
                lambda: remove_absent({"base": []}, current_cluster()))


def test_a_client_taken_out_unmounts_its_network_mounts_and_removes_their_lines():
    p = _unmount_only(mounted=["/mnt/cephfs"], in_fstab=["/mnt/cephfs", "/srv/models"])
    changing = p.changing("gpu1")
    text = _all_commands(p, "gpu1")
    print(changing, text, sep="\n")
    assert "Unmount /mnt/cephfs (no longer given here)" in changing
    assert "umount /mnt/cephfs" in text
    # Not mounted (the testbed's node without a kernel NFS client): not unmounted.
    assert "Unmount /srv/models (no longer given here)" not in changing
    for path in ("/mnt/cephfs", "/srv/models"):
        assert f"Remove {path} from fstab (no longer given here)" in changing
    # The files stay where they are (on the cluster, the server): nothing is deleted,
    # not even the mount points.
    assert "rmdir" not in text and "rm -r" not in text
    assert not any(f"rm -f {path}" in text for path in ("/mnt", "/srv"))


def test_mounts_already_gone_change_nothing():
    p = _unmount_only(mounted=[], in_fstab=[])
    assert p.changing("gpu1") == []
