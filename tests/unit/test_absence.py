"""Desired absence, engine-free (aicluster.common.absence) and its Ansible side: the
record's text, what a host loses when the inventory no longer gives it a component or
a role, the removals refused because they would break the cluster (the last Slurm
controller, the only k3s server, a Ceph monitor quorum), and the filters and tasks the
playbook runs them through."""

from __future__ import annotations

import base64
import runpy
from pathlib import Path

import pytest
import yaml

from aicluster.common.absence import (
    host_mounts,
    parse_record,
    parse_record_mounts,
    parse_slurped,
    plan,
    record_text,
    refusals,
    removals,
)
from aicluster.components.slurm import derive as slurm_derive

ROOT = Path(__file__).resolve().parents[2]
FILTERS = runpy.run_path(str(ROOT / "roles/base/filter_plugins/aicluster_absence.py"))[
    "FilterModule"]().filters()

CTL = {"base": [], "slurm": ["slurm_controller", "slurm_workers"]}
WORKER = {"base": [], "slurm": ["slurm_workers"]}


# --- the record -----------------------------------------------------------------------

def test_the_record_reads_back_what_was_written():
    text = record_text({"slurm": ["slurm_workers", "slurm_controller"], "base": []})
    assert parse_record(text) == {"base": [], "slurm": ["slurm_controller", "slurm_workers"]}
    assert text.endswith("\n")


@pytest.mark.parametrize("text", ["", None, "not json", "[]", '{"components": 3}'])
def test_no_record_or_an_unreadable_one_removes_nothing(text):
    assert parse_record(text) == {}
    assert removals(parse_record(text), {"base": []}) == {}


def test_a_slurped_record_is_the_record():
    text = record_text(WORKER)
    slurped = {"content": base64.b64encode(text.encode()).decode(), "encoding": "base64"}
    assert parse_slurped(slurped) == parse_record(text)
    assert parse_slurped({"failed": True, "msg": "file not found"}) == {}


# --- what is taken away -----------------------------------------------------------------

def test_a_worker_out_of_slurm_loses_slurmd_munge_and_the_configuration():
    todo = plan(WORKER, {"base": []})
    assert todo["components"] == {"slurm": {"roles": ["slurm_workers"], "whole": True}}
    assert todo["services"] == ["slurmd", "slurmctld", "munge"]
    assert slurm_derive.SLURM_CONF in todo["files"] and slurm_derive.MUNGE_KEY in todo["files"]
    # Never data, never a package.
    assert not [f for f in todo["files"] if f.startswith(("/var/lib", "/var/spool", "/var/log"))]


def test_a_controller_that_stays_a_worker_loses_slurmctld_only():
    todo = plan(CTL, WORKER)
    assert todo["components"] == {"slurm": {"roles": ["slurm_controller"], "whole": False}}
    assert todo["services"] == ["slurmctld"] and todo["files"] == []


def test_stacks_go_before_what_they_stand_on():
    recorded = {"base": [], "nfs": ["nfs_server"], "ray": ["ray_workers"]}
    assert list(removals(recorded, {"base": []})) == ["ray", "nfs"]


def test_a_component_without_a_removal_is_named_not_guessed():
    # base and network are on every host; a record could still lack them now.
    todo = plan({"base": [], "network": []}, {"base": []})
    assert todo["unbuilt"] == ["network"] and todo["services"] == []


def test_a_role_whose_removal_is_not_built_is_named_with_its_component(monkeypatch):
    from aicluster.components.ceph import derive as ceph_derive

    monkeypatch.setattr(ceph_derive, "REMOVAL", {**ceph_derive.REMOVAL,
                                                 "ceph_osds": {"unbuilt": True}})
    todo = plan({"base": [], "ceph": ["ceph_clients", "ceph_osds"]}, {"base": []},
                {"ceph": ["/mnt/cephfs"]}, settings_of=lambda c: {"ceph_client_name": "x"})
    assert todo["unbuilt"] == ["ceph (ceph_osds)"] and todo["services"] == []
    # ... and what is built is done: the client's mount goes.
    assert todo["unmount"] == ["/mnt/cephfs"]


# --- every component's removal --------------------------------------------------------

def _settings(component):
    from aicluster.common.settings import layered

    return layered(component, {})


def test_every_component_but_base_and_network_has_a_removal():
    from aicluster.common.absence import removal_spec
    from aicluster.components import component_module, derive_module
    from aicluster.inventory import COMPONENT_GROUPS, COMPONENT_ORDER

    for component in COMPONENT_ORDER:
        spec = removal_spec(component)
        # A component not built yet (settings and templates, no deploy): a removal
        # would take away what no deploy of ours made.
        if derive_module(component) is None or component_module(component) is None:
            continue
        if component in ("base", "network"):
            assert spec is None
            continue
        assert spec is not None, component
        # Each key is a role of the component or the component itself (``<c>:all``
        # where a role has the component's name: absence.whole_key).
        assert set(spec) <= {component, f"{component}:all", *COMPONENT_GROUPS[component]}, \
            component
        assert not any(e.get("unbuilt") for e in spec.values()), component


def test_no_removal_takes_data_or_a_shared_package():
    from aicluster.common.absence import package_names, removal_spec
    from aicluster.inventory import COMPONENT_ORDER

    shared = {"udev", "lvm2", "rpcbind", "xfsprogs", "curl", "tar", "gzip", "zstd", "mdadm",
              "container-selinux", "systemd", "python3", "mariadb-server", "nfs-utils"}
    for component in COMPONENT_ORDER:
        for key, entry in (removal_spec(component) or {}).items():
            for path in entry.get("files", []):
                assert not path.startswith(("/var/lib/ceph/osd", "/srv", "/mnt", "/data")), path
                assert not path.startswith("/var/lib") or path.endswith("keyring"), path
            for family in ("Debian", "RedHat"):
                names = package_names(component, entry.get("packages", []), family)
                # RedHat's NFS client package is the server's too (removed with nfs only).
                if (component, key) == ("nfs", "nfs"):
                    names = [n for n in names if n != "nfs-utils"]
                assert not set(names) & shared, (component, key, family, names)


def test_a_package_variable_a_removal_names_exists_on_every_family():
    from aicluster.common.absence import removal_spec
    from aicluster.inventory import COMPONENT_ORDER
    from aicluster.render import os_vars

    for component in COMPONENT_ORDER:
        for entry in (removal_spec(component) or {}).values():
            for name in entry.get("packages", []):
                if "_" in name:
                    for family in ("Debian", "RedHat"):
                        assert name in os_vars(component, family), (component, name, family)


def test_packages_go_only_for_the_components_remove_packages_names():
    kept = plan(WORKER, {"base": []}, family="Debian")
    assert kept["packages"] == [] and kept["software"] == [] and not kept["packages_wanted"]
    gone = plan(WORKER, {"base": []}, remove_packages=["slurm"], family="Debian")
    assert gone["packages"] == ["slurmd", "slurmctld", "slurmdbd", "slurm-client", "munge"]
    rocky = plan(WORKER, {"base": []}, remove_packages=["slurm"], family="RedHat")
    assert "munge" in rocky["packages"] and "slurmd" not in rocky["packages"]
    # Before the family is known: only whether any package is to go.
    unknown = plan(WORKER, {"base": []}, remove_packages=["slurm"])
    assert unknown["packages"] == [] and unknown["packages_wanted"]
    # A worker that stays a controller: slurmd only.
    assert plan(CTL, {"slurm": ["slurm_controller"]}, remove_packages=["slurm"],
                family="Debian")["packages"] == ["slurmd"]


def test_software_paths_follow_the_hosts_settings():
    ray = plan({"ray": ["ray_workers"]}, {}, remove_packages=["ray"],
               settings_of=lambda c: {"ray_install_dir": "/srv/ray"})
    assert ray["software"] == ["/srv/ray"]
    minio = plan({"minio": ["minio"]}, {}, remove_packages=["minio"], settings_of=_settings)
    assert minio["software"] == ["/usr/local/bin/minio", "/usr/local/bin/mc"]
    assert plan({"minio": ["minio"]}, {}, remove_packages=["minio"]) == minio


def test_a_ceph_monitor_leaves_the_monitor_map_after_it_stops():
    todo = plan({"ceph": ["ceph_mons", "ceph_osds"]}, {"ceph": ["ceph_osds"]}, host="m2",
                settings_of=_settings)
    assert todo["services"] == ["ceph-mon@m2", "ceph-mgr@m2"]
    assert todo["after"] and "mon remove m2" in todo["after"][0]
    assert "{host}" not in todo["after"][0] and todo["commands"] == []
    assert "/etc/ceph/ceph.client.admin.keyring" in todo["files"]
    assert "/var/lib/ceph/mgr/ceph-m2/keyring" in todo["files"]


def test_a_ceph_osd_host_is_checked_before_anything_is_taken_away():
    todo = plan({"ceph": ["ceph_osds"]}, {"base": []}, host="o1", settings_of=_settings)
    assert len(todo["commands"]) == 1 and "osd ls-tree o1" in todo["commands"][0]
    assert todo["services"] == ["aicluster-ceph-osds"]
    assert "/etc/ceph/ceph.conf" in todo["files"]


def test_the_osd_check_refuses_while_the_cluster_maps_an_osd_there(tmp_path):
    """The check's shell, run with a stand-in ``ceph`` on PATH (not Ceph): OSDs still
    mapped there fail it, saying what to do; none (or no host bucket) pass it."""
    import os
    import subprocess

    from aicluster.components.ceph import derive as ceph_derive

    keyring = tmp_path / "bootstrap.keyring"
    keyring.write_text("x\n")
    script = ceph_derive.OSD_REMOVAL_CHECK.replace("{host}", "o1").replace(
        ceph_derive.BOOTSTRAP_OSD_KEYRING, str(keyring))
    script = script.replace("systemctl stop", "echo stopping")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def run(answer, rc):
        # Like ceph: the answer on stdout, an error on stderr, and a warning on stderr
        # every time (a keyring it looked for elsewhere first).
        ceph = bin_dir / "ceph"
        stream = "" if rc == 0 else " >&2"
        ceph.write_text(f"#!/bin/sh\necho 'auth: unable to find a keyring on /etc/ceph/"
                        f"ceph.keyring' >&2\necho '{answer}'{stream}\nexit {rc}\n")
        ceph.chmod(0o755)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        return subprocess.run(["sh", "-c", script], env=env, capture_output=True,
                              text=True, timeout=30)

    mapped = run("3\n7", 0)
    assert mapped.returncode == 1 and "still has its OSDs (3 7), and" in mapped.stderr
    assert "ceph osd safe-to-destroy 3 7" in mapped.stderr and "stopping" not in mapped.stdout
    assert run("", 0).returncode == 0
    gone = run("Error ENOENT: node 'o1' does not exist", 2)
    assert gone.returncode == 0 and "stopping" in gone.stdout
    unreachable = run("error connecting to the cluster", 1)
    assert unreachable.returncode == 1 and "cannot read the OSDs of o1" in unreachable.stderr


def test_nvme_cache_nvidia_and_infiniband_have_their_removals():
    cache = plan({"nvme_cache": []}, {"base": []}, {"nvme_cache": ["/mnt/nvme-cache"]})
    assert cache["unmount"] == ["/mnt/nvme-cache"] and cache["services"] == ["cachefilesd"]
    gpu = plan({"nvidia": []}, {"base": []})
    assert "nvidia-persistenced" in gpu["services"] and gpu["unbuilt"] == []
    ib = plan({"infiniband": []}, {"base": []})
    assert ib["services"] == ["opensm"] and "networkctl reload" in ib["after"][0]


# --- network mounts ---------------------------------------------------------------------

MOUNTS = {"ceph": ["/mnt/cephfs"], "nfs": ["/srv/datasets", "/srv/models"]}
CLIENT = {"base": [], "ceph": ["ceph_clients"], "nfs": ["nfs_clients"]}


def test_the_record_holds_the_mounts_and_only_when_there_are_some():
    text = record_text(CLIENT, MOUNTS)
    assert parse_record(text) == CLIENT and parse_record_mounts(text) == MOUNTS
    # A host without network mounts: the record as before mounts were recorded.
    assert record_text(WORKER, {"nfs": []}) == record_text(WORKER)
    assert parse_record_mounts(record_text(WORKER)) == {}


@pytest.mark.parametrize("mounts", [{"nfs": "/srv"}, {"nfs": ["relative", "/"]}, []])
def test_recorded_mounts_that_are_not_absolute_paths_are_never_unmounted(mounts):
    import json

    text = json.dumps({"components": CLIENT, "mounts": mounts})
    assert all(not paths for paths in parse_record_mounts(text).values())


def test_a_host_out_of_the_clients_unmounts_what_it_recorded():
    nfs_gone = plan(CLIENT, {"base": [], "ceph": ["ceph_clients"]}, MOUNTS)
    assert nfs_gone["unmount"] == ["/srv/datasets", "/srv/models"]
    assert nfs_gone["services"] == [] and nfs_gone["unbuilt"] == []
    ceph_gone = plan(CLIENT, {"base": [], "nfs": ["nfs_clients"]}, MOUNTS)
    assert ceph_gone["unmount"] == ["/mnt/cephfs"]
    # The NFS server that stays a server but stops being a client of itself.
    server = {"nfs": ["nfs_clients", "nfs_server"]}
    kept = plan(server, {"nfs": ["nfs_server"]}, MOUNTS)
    assert kept["unmount"] == MOUNTS["nfs"] and kept["services"] == []
    # Still a client: nothing is unmounted, whatever the record holds.
    assert plan(CLIENT, CLIENT, MOUNTS)["unmount"] == []


def test_a_server_leaving_keeps_its_exported_data_and_mounts_nothing_away():
    todo = plan({"nfs": ["nfs_server"]}, {}, MOUNTS)
    assert todo["unmount"] == [] and "nfs-ganesha" in todo["services"]


def test_the_mounts_recorded_are_those_the_components_make(spec):
    from aicluster.inventory import ansible_inventory, load_cluster

    spec.set("groups.nfs_server", ["n1"]).set("groups.nfs_clients", ["n1", "n2"])
    spec.set("n1.nfs_exports", [{"path": "/srv/models"}])
    path = spec.write()
    cluster = load_cluster(path)
    hostvars = ansible_inventory(path)["_meta"]["hostvars"]
    for name in ("n1", "n2"):
        assert host_mounts(cluster, name) == {"nfs": ["/srv/models"]}
        # Ansible records the same (aicluster_mounts into the record filter).
        assert hostvars[name]["aicluster_mounts"] == host_mounts(cluster, name)
        assert FILTERS["aicluster_absence_record"](
            hostvars[name]["aicluster_components"], hostvars[name]["aicluster_mounts"]
        ) == record_text(cluster.hosts[name].roles(), host_mounts(cluster, name))


def test_the_ollama_gateway_reloads_nginx_and_keeps_it_running():
    todo = plan({"ollama": ["ollama", "ollama_gateway"]}, {"ollama": ["ollama"]})
    assert todo["services"] == [] and todo["reload"] == ["nginx"]


# --- refused ------------------------------------------------------------------------------

def test_the_last_slurm_controller_is_refused():
    problems = refusals({"a": CTL, "b": WORKER}, {"a": {"base": []}, "b": CTL})
    assert len(problems) == 1
    assert "refusing to remove the Slurm controller from a" in problems[0]
    assert "slurm_controller" in problems[0]


def test_a_controller_moved_while_another_stays_is_allowed():
    recorded = {"a": CTL, "b": CTL, "c": WORKER}
    assert refusals(recorded, {"a": WORKER, "b": CTL, "c": WORKER}) == []


def test_slurm_taken_off_every_host_is_allowed():
    assert refusals({"a": CTL, "b": WORKER}, {"a": {"base": []}, "b": {"base": []}}) == []


def test_the_only_k3s_server_is_refused():
    recorded = {"a": {"k3s": ["k3s_servers"]}, "b": {"k3s": ["k3s_agents"]}}
    wanted = {"a": {"k3s": ["k3s_agents"]}, "b": {"k3s": ["k3s_servers"]}}
    problems = refusals(recorded, wanted)
    assert len(problems) == 1 and "the k3s server from a" in problems[0]


@pytest.mark.parametrize(("mons", "kept", "refused"), [
    (3, 2, False), (3, 1, True), (1, 0, True), (5, 3, False), (5, 2, True), (2, 1, True),
])
def test_a_ceph_monitor_quorum_is_kept(mons, kept, refused):
    names = [f"m{i}" for i in range(mons)]
    recorded = {n: {"ceph": ["ceph_mons", "ceph_osds"]} for n in names}
    wanted = {n: {"ceph": ["ceph_mons", "ceph_osds"] if i < kept else ["ceph_osds"]}
              for i, n in enumerate(names)}
    problems = refusals(recorded, wanted)
    assert bool(problems) == refused, problems
    if refused:
        assert "fewer than a majority" in problems[0] and f"{kept} of the {mons}" in problems[0]


def test_the_last_osds_and_the_last_mds_of_a_ceph_that_stays_are_refused():
    recorded = {"a": {"ceph": ["ceph_mons", "ceph_osds", "ceph_mds", "ceph_clients"]},
                "b": {"ceph": ["ceph_clients"]}}
    wanted = {"a": {"ceph": ["ceph_mons", "ceph_clients"]}, "b": {"ceph": ["ceph_clients"]}}
    problems = refusals(recorded, wanted)
    assert len(problems) == 2
    assert "the OSDs from a" in problems[0] and "the CephFS metadata server" in problems[1]
    # Another host takes them: allowed; no client left: the MDS may go.
    moved = {"a": {"ceph": ["ceph_mons"]}, "b": {"ceph": ["ceph_osds", "ceph_mds"]}}
    assert refusals(recorded, moved) == []
    no_clients = {"a": {"ceph": ["ceph_mons", "ceph_osds"]}, "b": {}}
    assert refusals(recorded, no_clients) == []


def test_hosts_without_a_record_had_nothing():
    assert refusals({"a": {}, "b": {}}, {"a": {"base": []}, "b": CTL}) == []


# --- the Ansible side -------------------------------------------------------------------

def _slurped(record, mounts=None):
    return {"content": base64.b64encode(record_text(record, mounts).encode()).decode()}


def test_the_filters_decide_as_the_pyinfra_deploy():
    assert FILTERS["aicluster_absence_record"](WORKER) == record_text(WORKER)
    assert FILTERS["aicluster_absence_plan"](_slurped(WORKER), {"base": []}) == plan(
        WORKER, {"base": []})
    assert FILTERS["aicluster_absence_plan"](_slurped(CLIENT, MOUNTS), {"base": []}) == plan(
        CLIENT, {"base": []}, MOUNTS)
    assert FILTERS["aicluster_fstab_regexp"]("/mnt/ceph.fs") == r"^[^#\s]+\s+/mnt/ceph\.fs\s"
    hostvars = {"a": {"base_absence_recorded": _slurped(CTL), "aicluster_components": {}},
                "b": {"base_absence_recorded": {"failed": True}, "aicluster_components": CTL}}
    refused = FILTERS["aicluster_absence_refusals"](["a", "b"], hostvars, ["a", "b"])
    # b has no record: a was the only controller and slurm stays on b.
    assert len(refused) == 1 and "from a" in refused[0]


def _plays():
    return yaml.safe_load((ROOT / "playbooks/site.yml").read_text())


def _tasks(name):
    return yaml.safe_load((ROOT / "roles/base/tasks" / name).read_text())


def test_the_playbook_removes_before_any_component_and_records_last():
    plays = _plays()
    names = [p["name"] for p in plays]
    absence = next(i for i, n in enumerate(names) if n.startswith("Absence"))
    assert names[absence - 1] == "Check the inventory"
    assert names[absence + 1].startswith("Base")
    assert plays[absence]["any_errors_fatal"] is True and plays[absence]["hosts"] == "all"
    assert plays[-1]["name"].startswith("Record") and plays[-1]["hosts"] == "all"
    included = [(t["ansible.builtin.include_role"]["tasks_from"]) for p in (plays[absence],
                                                                             plays[-1])
                for t in p["tasks"]]
    assert included == ["absence.yml", "record.yml"]


def test_the_role_tasks_use_the_filters_and_keep_packages():
    tasks = _tasks("absence.yml")
    text = (ROOT / "roles/base/tasks/absence.yml").read_text()
    for used in ("aicluster_absence_refusals", "aicluster_absence_plan"):
        assert used in text and used in FILTERS
    refuse = next(t for t in tasks if t["name"].startswith("Refuse"))
    assert refuse["run_once"] is True
    modules = {k for t in tasks for k in t if k.startswith("ansible.")}
    assert not modules & {"ansible.builtin.apt", "ansible.builtin.dnf"}
    # Packages go only as the plan says (remove_packages).
    remove = next(t for t in tasks if "ansible.builtin.package" in t)
    assert remove["ansible.builtin.package"]["state"] == "absent"
    assert remove["when"] == "base_absence.packages | length > 0"
    stop = next(t for t in tasks if t["name"].startswith("Stop and disable"))
    assert stop["ansible.builtin.systemd_service"] == {
        "name": "{{ item }}", "state": "stopped", "enabled": False}
    record = _tasks("record.yml")[-1]["ansible.builtin.copy"]
    assert record["dest"] == "/etc/aicluster/components"
    assert "aicluster_absence_record" in record["content"]


def test_both_engines_record_the_same_roles(spec):
    """pyinfra records Host.roles(); Ansible gets the same as aicluster_components."""
    from aicluster.inventory import ansible_inventory, load_cluster

    spec.set("groups.slurm_controller", ["n1"]).set("groups.slurm_workers", ["n1", "n2"])
    path = spec.write()
    cluster = load_cluster(path)
    hostvars = ansible_inventory(path)["_meta"]["hostvars"]
    assert cluster.hosts["n1"].roles()["slurm"] == ["slurm_controller", "slurm_workers"]
    assert cluster.hosts["n2"].roles()["slurm"] == ["slurm_workers"]
    for name in ("n1", "n2"):
        assert hostvars[name]["aicluster_components"] == cluster.hosts[name].roles()
        assert "base" in hostvars[name]["aicluster_components"]


# --- the role's tasks, run by ansible-playbook in check mode ------------------------------

PLAY = """
- name: Absence, as site.yml runs it
  hosts: all
  gather_facts: false
  any_errors_fatal: true
  tasks:
    - name: Take away what each host no longer runs
      ansible.builtin.include_role:
        name: base
        tasks_from: absence.yml
    - name: Keep the plan for the test
      ansible.builtin.copy:
        content: "{{ base_absence | to_json }}"
        dest: "{{ plans_dir }}/{{ inventory_hostname }}.json"
        mode: "0644"
      check_mode: false
"""


def _check_mode_run(tmp_path, recorded, wanted, mounts=None):
    """ansible-playbook --check of roles/base/tasks/absence.yml on two local hosts (no
    change is made: check mode), every host's slurped record given as *recorded* (extra
    vars win over the slurp's register)."""
    import json
    import subprocess
    import sys

    python = str(Path(sys.executable))
    inventory = {"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": python,
               "aicluster_components": comps}
        for name, comps in wanted.items()}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "plans").mkdir()
    (tmp_path / "vars.json").write_text(json.dumps({"base_absence_recorded": _slurped(recorded,
                                                                              mounts),
                                                    "plans_dir": str(tmp_path / "plans")}))
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "--check", "-i",
         str(tmp_path / "inventory.json"), str(tmp_path / "play.yml"),
         "-e", f"@{tmp_path / 'vars.json'}"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    plans = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "plans").glob("*.json")}
    return proc, plans


def test_the_role_tasks_plan_the_removal(tmp_path):
    proc, plans = _check_mode_run(tmp_path, WORKER, {"a": {"base": []}, "b": WORKER})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert plans["a"] == plan(WORKER, {"base": []}) and plans["a"]["services"]
    assert plans["b"]["components"] == {}


def test_the_role_tasks_refuse_before_changing_anything(tmp_path):
    proc, plans = _check_mode_run(tmp_path, CTL, {"a": {"base": []}, "b": WORKER})
    assert proc.returncode != 0
    assert "refusing to remove the Slurm controller from a, b" in proc.stdout
    # The run stopped at the refusal: no host got as far as its plan.
    assert plans == {}


def test_the_role_tasks_plan_the_unmounts(tmp_path):
    """Nothing is mounted at the recorded paths here: read, and nothing unmounted."""
    mounts = {"ceph": [str(tmp_path / "cephfs")]}
    proc, plans = _check_mode_run(tmp_path, CLIENT, {"a": {"base": []}}, mounts)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert plans["a"]["unmount"] == mounts["ceph"]
    # Read with findmnt (also in check mode), found not mounted: nothing unmounted; the
    # one change is the test's own copy of the plan.
    assert "TASK [base : Read which of the recorded mounts" in proc.stdout
    assert "changed=1 " in proc.stdout, proc.stdout
