"""The nfs deploy planned on fake hosts: the kernel NFS server and its clients on
Ubuntu 22.04/24.04, Debian 12 and Rocky 9 (the testbed's kernel has neither, so this
is where the production path is proven), an export change applied with exportfs -ra
and no restart, a second run that changes nothing, the nconnect and fsc choices,
nfs-ganesha, and a client whose kernel has no NFS client. Golden renders for the lab
inventory (tests/fixtures/golden/nfs/).

Fake hosts: no host is contacted; facts come from fixtures (tests/deploys/harness.py).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta

import pytest
from pyinfra.api.exceptions import PyinfraError

from aicluster import PROJECT_ROOT
from aicluster.common.settings import template_vars
from aicluster.components.nfs import deploy as nfs
from aicluster.components.nfs import derive as nfs_derive
from aicluster.components.nfs.probe import parse
from aicluster.inventory import InventoryError, load_cluster, validate
from aicluster.render import render
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan
from tests.golden import GOLDEN_DIR, assert_golden

GOLDEN = GOLDEN_DIR / "nfs"
LAB = PROJECT_ROOT / "inventories" / "lab.py"
APT_STAMP = "/var/lib/apt/periodic/update-success-stamp"
NOW = datetime(2026, 1, 1, 12, 0)
CLUSTER = {
    "cluster_name": "demo",
    "networks": {
        "management": {"subnet": "10.10.0.0/24"},
        "storage": {"subnet": "10.30.0.0/24", "mtu": 9000},
    },
}
EXPORTS = [
    {"path": "/srv/models", "networks": ["storage"]},
    {"path": "/srv/datasets", "networks": ["storage", "10.99.0.0/16"], "mode": "1777",
     "options": ["rw", "async", "no_subtree_check", "all_squash", "anonuid=2000"]},
]
#: /proc/filesystems and modprobe on a real host, and in a container (the testbed).
KERNEL_FULL = parse(["module=nfs", "module=nfsd", "module=sunrpc", "fs=rpc_pipefs"])
KERNEL_NONE = parse([])


def _host(name: str, n: int, speed: int | None = 100, **data) -> tuple[str, dict]:
    nics = [] if speed is None else [
        {"name": "ens2", "speed_gbps": speed, "network": "storage",
         "address": f"10.30.0.{n}", "mtu": 9000}
    ]
    return name, {"ssh_hostname": f"10.10.0.{n}", "hardware": {"nics": nics}, **data}


SERVER = _host("storage1", 40, nfs_exports=EXPORTS)
CLIENTS = [_host("head", 10, 25), _host("gpu1", 21, 100), _host("cpu1", 31, 10)]
GROUPS = {"nfs_server": ["storage1"], "nfs_clients": ["head", "gpu1", "cpu1"]}


def _plan(hosts=None, groups=None, distro="debian12", facts=None, kernel=KERNEL_FULL):
    hosts = hosts or [SERVER, *CLIENTS]
    host_facts = {}
    for name, _ in hosts:
        host_facts[name] = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "Os": "Linux",
            "NfsKernel": kernel,
            "Mounts": {"/": {"device": "/dev/sda1", "type": "ext4", "options": ["rw"]}},
            **(facts or {}).get(name, {}),
        }
    return plan(hosts, groups or GROUPS, CLUSTER, host_facts, nfs.deploy)


def _cluster(hosts=None, groups=None):
    hosts = hosts or [SERVER, *CLIENTS]
    groups = groups or GROUPS
    return validate({
        name: (tuple(g for g, members in groups.items() if name in members), {**CLUSTER, **d})
        for name, d in hosts
    })


# ---------------------------------------------------------------------------
# The kernel server and its clients, per OS
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("distro", sorted(DISTRIBUTIONS))
def test_kernel_server_plan(distro):
    p = _plan(distro=distro)
    rocky = distro == "rocky9"
    install = p.op("storage1", "Install the kernel NFS server").text
    assert ("nfs-utils" if rocky else "nfs-kernel-server") in install
    conf = p.upload("storage1", nfs_derive.NFS_CONF_FILE)
    # 3 clients: max(8, 4 x 3) = 12 nfsd threads; NFSv4.2 on.
    assert "[nfsd]\nthreads=12\nvers3=y\nvers4=y\nvers4.1=y\nvers4.2=y\n" in conf
    exports = p.upload("storage1", nfs_derive.EXPORTS_FILE)
    assert "/srv/models 10.30.0.0/24(rw,sync,no_subtree_check,root_squash)\n" in exports
    assert ("/srv/datasets 10.30.0.0/24(rw,async,no_subtree_check,all_squash,anonuid=2000) "
            "10.99.0.0/16(rw,async,no_subtree_check,all_squash,anonuid=2000)\n") in exports
    models = p.op("storage1", "Export directory /srv/models").text
    assert "mkdir -p /srv/models" in models and "chmod 755 /srv/models" in models
    assert "chmod 1777 /srv/datasets" in p.op("storage1", "Export directory /srv/datasets").text
    restart = p.op("storage1", "Restart the NFS server (its settings changed)")
    # (restart, or start when it is not running yet)
    assert restart.conditional and "nfs-server.service" in restart.text
    apply = p.op("storage1", "Apply the exports (exportfs -ra; clients keep their mounts)")
    assert apply.conditional and apply.text == "exportfs -ra"
    running = p.op("storage1", "NFS server running and enabled").text
    assert "systemctl start nfs-server.service" in running
    assert "systemctl enable nfs-server.service" in running
    names = p.names("storage1")
    assert names.index("Install the kernel NFS server") < names.index("Write the exports") \
        < names.index("Apply the exports (exportfs -ra; clients keep their mounts)")
    # Neither ganesha nor a client mount on the server; no rpc_pipefs masking.
    assert "ganesha" not in p.commands("storage1")
    assert "fstab" not in p.commands("storage1")
    assert not any(n.startswith("Mask ") for n in names)


@pytest.mark.parametrize("distro", sorted(DISTRIBUTIONS))
def test_client_plan(distro):
    p = _plan(distro=distro)
    rocky = distro == "rocky9"
    install = p.op("gpu1", "Install the NFS client tools").text
    assert ("nfs-utils" if rocky else "nfs-common") in install
    options = "_netdev,nofail,vers=4.2,nconnect=8"
    fstab = p.op("gpu1", f"Mount 10.30.0.40:/srv/models at /srv/models at boot (fstab, "
                         f"{options})")
    assert f"10.30.0.40:/srv/models /srv/models nfs {options} 0 0" in fstab.text
    assert "/etc/fstab" in fstab.text
    assert "mkdir -p /srv/datasets" in p.op("gpu1", "Mount point /srv/datasets").text
    mount = p.op("gpu1", "Mount /srv/models").text
    # Mounted, then proven mounted (aicluster.common.mounts).
    assert mount.startswith("out=$(mount /srv/models 2>&1)"), mount
    assert "--mountpoint /srv/models" in mount and "' nfs nfs4 '" in mount, mount
    assert "10.30.0.40:/srv/models is not mounted at /srv/models" in mount
    names = p.names("gpu1")
    assert names.index(f"Mount 10.30.0.40:/srv/models at /srv/models at boot (fstab, "
                       f"{options})") < names.index("Mount /srv/models")
    assert not any("exportfs" in c or "nfs-kernel-server" in c for c in p.commands("gpu1"))


def test_the_server_is_planned_before_the_clients_mount():
    p = _plan()
    apply = p.op("storage1", "Apply the exports (exportfs -ra; clients keep their mounts)")
    mount = p.op("gpu1", "Mount /srv/models")
    assert apply.index < mount.index


def test_nconnect_on_fast_nics_only_and_fsc_when_asked():
    p = _plan()
    fstab = {h: p.commands(h) for h in ("head", "gpu1", "cpu1")}
    assert "nconnect=8" in fstab["head"]  # 25 Gb/s: at the threshold
    assert "nconnect=8" in fstab["gpu1"]  # 100 Gb/s
    assert "nconnect" not in fstab["cpu1"]  # 10 Gb/s
    assert ",fsc" not in fstab["gpu1"]
    # FS-Cache on a GPU node with the NVMe cache's cachefilesd, nconnect 4, NFS 4.1.
    gpu = _host("gpu1", 21, 100, nfs_fscache=True, nfs_nconnect=4, nfs_version="4.1",
                nvme_cache_fscache=True, nvidia_source="distribution")
    gpu[1]["hardware"].update(gpus={"model": "H100-SXM5-80GB", "count": 8},
                              nvme=[{"device": "/dev/disk/by-id/nvme-A"}])
    groups = {**GROUPS, "gpu_nodes": ["gpu1"]}
    p = _plan([SERVER, CLIENTS[0], gpu, CLIENTS[2]], groups)
    line = "10.30.0.40:/srv/models /srv/models nfs _netdev,nofail,vers=4.1,nconnect=4,fsc 0 0"
    assert line in p.commands("gpu1")


def test_chosen_mounts_and_their_options():
    client = _host("gpu1", 21, 100, nfs_mounts=[
        {"export": "/srv/datasets", "path": "/data", "options": ["ro", "noatime"]}])
    p = _plan([SERVER, client], {"nfs_server": ["storage1"], "nfs_clients": ["gpu1"]})
    line = "10.30.0.40:/srv/datasets /data nfs _netdev,nofail,vers=4.2,nconnect=8,ro,noatime 0 0"
    assert line in p.commands("gpu1")
    assert "/srv/models" not in p.commands("gpu1")
    # One client: nfsd threads max(8, 4 x 1) = 8.
    assert "threads=8\n" in p.upload("storage1", nfs_derive.NFS_CONF_FILE)


def test_threads_and_server_settings_from_the_inventory():
    server = _host("storage1", 40, nfs_exports=EXPORTS, nfs_server_threads=64,
                   nfs_server_config={"nfsd": {"vers3": "n", "lease-time": 60},
                                      "mountd": {"manage-gids": True}})
    conf = _plan([server, *CLIENTS]).upload("storage1", nfs_derive.NFS_CONF_FILE)
    assert "[nfsd]\nthreads=64\nvers3=n\nvers4=y\nvers4.1=y\nvers4.2=y\nlease-time=60\n" in conf
    assert "[mountd]\nmanage-gids=y\n" in conf


# ---------------------------------------------------------------------------
# A second run, an export change
# ---------------------------------------------------------------------------


def _deployed(fresh, host: str, changed: dict[str, str] | None = None) -> dict:
    """Facts of a host where ``fresh`` (a plan) has run: its uploads in place (with
    ``changed`` contents instead, where given), packages in, units up, fstab written."""
    uploads = {}
    for op in fresh.ops[host]:
        for command in op.commands:
            if command.startswith("upload "):
                dest, text = command[len("upload "):].split("\n", 1)
                uploads[dest] = text
    uploads.update(changed or {})
    lines = [c.split("'")[1] for op in fresh.ops[host] for c in op.commands
             if "/etc/fstab" in c and c.startswith("echo '")]
    dirs = {"/srv/datasets": 1777}

    def file_fact(path, **kw):
        if path == APT_STAMP:
            return {"mode": 644, "user": "root", "group": "root", "mtime": NOW}
        return {"mode": 644, "user": "root", "group": "root"} if path in uploads else None

    def find_in_file(path, pattern, **kw):
        mount = pattern.split("[[:space:]]+", 1)[1].split("[[:space:]]")[0]
        return [line for line in lines if line.split()[1] == mount]

    units = {f"{u}.service": True for u in ("nfs-server", "nfs-ganesha", "rpcbind")}
    return {
        "DebPackages": {p: ["1:2.6.2-4"] for p in (
            "nfs-kernel-server", "nfs-common", "nfs-ganesha", "nfs-ganesha-vfs", "rpcbind")},
        "Date": NOW + timedelta(minutes=1),
        "File": file_fact,
        "Sha1File": lambda path, **kw: hashlib.sha1(uploads[path].encode()).hexdigest()
        if path in uploads else None,
        "Directory": lambda path, **kw: {"mode": dirs.get(path, 755), "user": "root",
                                         "group": "root"},
        "Link": lambda path, **kw: {"link_target": "/dev/null", "user": "root",
                                    "group": "root"},
        "FindInFile": find_in_file,
        "SystemdStatus": units,
        "SystemdEnabled": units,
        "Mounts": {"/": {"device": "/dev/sda1", "type": "ext4", "options": ["rw"]},
                   **{line.split()[1]: {"device": line.split()[0], "type": "nfs4",
                                        "options": ["rw"]} for line in lines}},
    }


def test_a_second_run_changes_nothing():
    fresh = _plan()
    facts = {h: _deployed(fresh, h) for h in ("storage1", "head", "gpu1", "cpu1")}
    p = _plan(facts=facts)
    for h in ("storage1", "head", "gpu1", "cpu1"):
        assert not p.changing(h), (h, p.changing(h))
    assert "/srv/models is mounted (changed options apply at its next mount)" not in \
        p.names("gpu1")  # a noop is not an operation
    assert not any(n.startswith("Mount /srv") for n in p.names("gpu1"))


def test_an_export_change_is_applied_with_exportfs_not_a_restart():
    fresh = _plan()
    old = fresh.upload("storage1", nfs_derive.EXPORTS_FILE).replace("10.99.0.0/16", "10.98.0.0/16")
    facts = {"storage1": _deployed(fresh, "storage1", {nfs_derive.EXPORTS_FILE: old})}
    p = _plan(facts=facts)
    # Only the exports file changes; the settings file (whose change alone restarts the
    # server) is as it was, so the restart's trigger does not fire.
    apply = "Apply the exports (exportfs -ra; clients keep their mounts)"
    assert p.changing("storage1") == ["Write the exports", apply]
    assert p.op("storage1", "NFS server settings (NFSv4.2, 12 nfsd threads)").commands == []
    assert p.op("storage1", apply).conditional and p.op("storage1", apply).text == "exportfs -ra"
    assert p.op("storage1", "Restart the NFS server (its settings changed)").skipped
    # Without a change to the exports, they are not applied again.
    again = _plan(facts={"storage1": _deployed(fresh, "storage1")})
    assert again.op("storage1", apply).skipped


# ---------------------------------------------------------------------------
# nfs-ganesha, and nodes whose kernel has no NFS
# ---------------------------------------------------------------------------


def test_ganesha_server_where_the_kernel_has_no_nfsd(caplog):
    server = _host("node1", 11, 10, nfs_server_impl="ganesha",
                   nfs_exports=[{"path": "/mnt/nvme-cache/shared", "mode": "1777"}])
    client = _host("node2", 12, 10)
    groups = {"nfs_server": ["node1"], "nfs_clients": ["node2"]}
    with caplog.at_level(logging.WARNING):
        p = _plan([server, client], groups, kernel=KERNEL_NONE)
    names = p.names("node1")
    for unit in nfs_derive.RPC_PIPEFS_UNITS:
        mask = p.op("node1", f"Mask {unit} (the kernel has no rpc_pipefs)").text
        assert f"ln -s /dev/null /etc/systemd/system/{unit}" in mask
    install = p.op("node1", "Install nfs-ganesha (VFS) and rpcbind").text
    assert "nfs-ganesha nfs-ganesha-vfs rpcbind" in install
    assert names.index("Mask run-rpc_pipefs.mount (the kernel has no rpc_pipefs)") < \
        names.index("Install nfs-ganesha (VFS) and rpcbind")
    conf = p.upload("node1", nfs_derive.GANESHA_CONF)
    assert 'Path = "/mnt/nvme-cache/shared";' in conf and "Protocols = 3, 4;" in conf
    assert "Squash = Root_Squash;" in conf and "Name = VFS;" in conf
    assert "Clients = 10.10.0.0/24;" in conf and "Clients = 10.30.0.0/24;" in conf
    reload = p.op("node1", "Reload nfs-ganesha's exports (SIGHUP; started if it was not running)")
    assert reload.conditional and reload.text == "systemctl reload-or-restart nfs-ganesha"
    assert "systemctl enable nfs-ganesha.service" in p.op(
        "node1", "nfs-ganesha running and enabled").text
    assert "nfs-kernel-server" not in p.commands("node1")
    # node2: the tools, rpc_pipefs masked, no fstab line, and the reason said.
    assert "nfs-common" in p.op("node2", "Install the NFS client tools").text
    assert "fstab" not in p.commands("node2") and "mount " not in p.commands("node2")
    said = [r.getMessage() for r in caplog.records if "[node2]" in r.getMessage()]
    assert any("mounts skipped: this node's kernel has no NFS client" in s for s in said), said


def test_a_kernel_server_on_a_kernel_without_nfsd_stops_naming_the_fix():
    server = _host("node1", 11, 10, nfs_exports=[{"path": "/srv/x"}])
    with pytest.raises(PyinfraError, match="set nfs_server_impl: ganesha"):
        _plan([server], {"nfs_server": ["node1"]}, kernel=KERNEL_NONE)


def test_the_fact_reads_proc_filesystems_and_modprobe():
    assert parse(["fs=nfs", "fs=nfs4", "fs=rpc_pipefs"]) == {
        "filesystems": ["nfs", "nfs4", "rpc_pipefs"], "modules": [], "client": True,
        "server": False, "rpc_pipefs": True,
    }
    assert parse(["module=nfsd", "module=sunrpc"])["server"]
    assert parse(["module=nfsd", "module=sunrpc"])["rpc_pipefs"]
    assert not any(parse([])[k] for k in ("client", "server", "rpc_pipefs"))
    assert nfs_derive.client_skip_reason(KERNEL_FULL) == ""


# ---------------------------------------------------------------------------
# The inventory
# ---------------------------------------------------------------------------


def _errors(server_data=None, client_data=None) -> list[str]:
    server = _host("storage1", 40, **{"nfs_exports": EXPORTS, **(server_data or {})})
    client = _host("gpu1", 21, 100, **(client_data or {}))
    try:
        _cluster([server, client], {"nfs_server": ["storage1"], "nfs_clients": ["gpu1"]})
    except InventoryError as exc:
        return exc.errors
    return []


def test_a_valid_server_and_client_have_no_errors():
    assert _errors() == []


#: (server data, client data, the one error expected).
BAD = [
    # The settings model's checks (model.py).
    ({"nfs_server_impl": "knfsd"}, None,
     "host 'storage1': nfs_server_impl: Input should be 'kernel' or 'ganesha' (got 'knfsd')"),
    ({"nfs_exports": [{"path": "srv/models"}]}, None,
     "host 'storage1': nfs_exports[0].path: String should match pattern "
     "'^/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$' (got 'srv/models')"),
    ({"nfs_exports": [{"path": "/srv/m", "options": ["rw", "nosquash"]}]}, None,
     "host 'storage1': nfs_exports[0].options: unknown export option 'nosquash' "
     "(exports(5))"),
    ({"nfs_exports": [{"path": "/srv/m", "options": ["rw", "ro"]}]}, None,
     "host 'storage1': nfs_exports[0].options: rw and ro contradict each other"),
    ({"nfs_exports": [{"path": "/srv/m", "options": ["anonuid=nobody"]}]}, None,
     "host 'storage1': nfs_exports[0].options: 'anonuid=nobody': anonuid takes a number"),
    ({"nfs_exports": [{"path": "/srv/m", "networks": ["backend"]}]}, None,
     "host 'storage1': nfs_exports[0].networks[0]: 'backend' is neither a network name "
     "(management, fabric, storage, ib) nor a subnet such as '10.30.0.0/24'"),
    ({"nfs_exports": [{"path": "/srv/m", "networks": ["10.30.0.1/24"]}]}, None,
     "host 'storage1': nfs_exports[0].networks[0]: '10.30.0.1/24' is neither a network name"),
    ({"nfs_exports": [{"path": "/srv/m", "networks": []}]}, None,
     "host 'storage1': nfs_exports[0].networks: List should have at least 1 item"),
    ({"nfs_exports": [{"path": "/srv/m", "mode": 755}]}, None,
     "host 'storage1': nfs_exports[0].mode: Input should be a valid string (got 755)"),
    ({"nfs_exports": [{"path": "/srv/m", "owner": "Root"}]}, None,
     "host 'storage1': nfs_exports[0].owner: String should match pattern"),
    ({"nfs_exports": [{"path": "/srv/m", "export_id": 2}, {"path": "/srv/n"}]}, None,
     "host 'storage1': nfs_exports: [1]: export_id 2 is used by another export ([0])"),
    ({"nfs_exports": [{"path": "/srv/m", "export_id": 0}]}, None,
     "host 'storage1': nfs_exports[0].export_id: Input should be greater than or equal to 1"),
    ({"nfs_exports": [{"path": "/srv/m"}, {"path": "/srv/m"}]}, None,
     "host 'storage1': nfs_exports: [1]: /srv/m is listed twice (also [0])"),
    ({"nfs_exports": [{"path": "/etc"}]}, None,
     "host 'storage1': nfs_exports[0].path: '/etc' is a system directory"),
    ({"nfs_exports": [{"path": "/srv/m", "size": 3}]}, None,
     "host 'storage1': nfs_exports[0].size: Extra inputs are not permitted"),
    ({"nfs_exports": {"path": "/srv/m"}}, None,
     "host 'storage1': nfs_exports: Input should be a valid list"),
    ({"nfs_export_default_options": []}, None,
     "host 'storage1': nfs_export_default_options: List should have at least 1 item"),
    ({"nfs_network": "backend"}, None,
     "host 'storage1': nfs_network: Input should be 'management', 'fabric', 'storage' or 'ib' "
     "(got 'backend')"),
    ({"nfs_server_threads": 0}, None,
     "host 'storage1': nfs_server_threads: Input should be greater than or equal to 1 (got 0)"),
    ({"nfs_server_config": {"nfsd": {"threads": [1]}}}, None,
     "host 'storage1': nfs_server_config.nfsd: threads: [1] is not a single value"),
    ({"nfs_server_config": {"nfsd": "threads=8"}}, None,
     "host 'storage1': nfs_server_config.nfsd: Input should be a valid dictionary"),
    (None, {"nfs_mounts": [{"export": "/srv/models", "path": "m"}]},
     "host 'gpu1': nfs_mounts[0].path: String should match pattern"),
    (None, {"nfs_mounts": [{"export": "/srv/models", "path": "/usr"}]},
     "host 'gpu1': nfs_mounts[0].path: '/usr' is a system directory"),
    (None, {"nfs_mounts": [{"export": "/srv/models"},
                           {"export": "/srv/datasets", "path": "/srv/models"}]},
     "host 'gpu1': nfs_mounts: [1]: /srv/models is listed twice (also [0])"),
    (None, {"nfs_mounts": [{"export": "/srv/models", "options": "ro"}]},
     "host 'gpu1': nfs_mounts[0].options: Input should be a valid list"),
    (None, {"nfs_mounts": [{"path": "/srv/models"}]},
     "host 'gpu1': nfs_mounts[0].export: Field required"),
    (None, {"nfs_version": "4.3"},
     "host 'gpu1': nfs_version: Input should be '3', '4', '4.0', '4.1' or '4.2' (got '4.3')"),
    (None, {"nfs_nconnect": 32},
     "host 'gpu1': nfs_nconnect: Input should be less than or equal to 16 (got 32)"),
    (None, {"nfs_nconnect_min_speed_gbps": 0},
     "host 'gpu1': nfs_nconnect_min_speed_gbps: Input should be greater than or equal to 1"),
    (None, {"nfs_mount_options": ["_netdev", "a b"]},
     "host 'gpu1': nfs_mount_options[1]: String should match pattern"),
    (None, {"nfs_fscache": "true"},
     "host 'gpu1': nfs_fscache: Input should be a valid boolean (got 'true')"),
    # The checks with the whole inventory (derive.validate).
    ({"nfs_exports": [{"path": "/srv/m", "networks": ["fabric"]}]}, None,
     "host 'storage1': nfs_exports[0].networks[0]: 'fabric' is not a network of the "
     "inventory (management, storage)"),
    ({"nfs_exports": []}, None,
     "host 'storage1': nfs_exports: the nfs_server exports nothing; give at least one "
     "{path: ...}"),
    ({"nfs_network": "fabric"}, None,
     "host 'storage1': nfs_network: 'fabric' is not a network of the inventory "
     "(management, storage)"),
    (None, {"nfs_mounts": [{"export": "/srv/scratch"}]},
     "host 'gpu1': nfs_mounts[0].export: '/srv/scratch' is not exported by the nfs_server "
     "'storage1' (its nfs_exports: /srv/models, /srv/datasets)"),
    (None, {"nfs_fscache": True},
     "host 'gpu1': nfs_fscache: FS-Cache needs cachefilesd on this host: give it an NVMe "
     "cache with nvme_cache_fscache: true"),
]


@pytest.mark.parametrize("server_data, client_data, error", BAD, ids=[
    f"{next(iter(s or c))}-{i}" for i, (s, c, _) in enumerate(BAD)])
def test_bad_inventory_input_is_refused_naming_host_and_field(server_data, client_data, error):
    errors = _errors(server_data, client_data)
    assert len(errors) == 1 and errors[0].startswith(error), errors


# ---------------------------------------------------------------------------
# Golden renders for the lab inventory
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab():
    return load_cluster(LAB)


def test_lab_renders(lab):
    server = template_vars("nfs", lab, "storage1", lab.hosts["storage1"].data, "Debian")
    assert server["nfs_server_address"] == "10.30.0.40" and server["nfs_network_name"] == "storage"
    assert_golden(GOLDEN / "aicluster.exports", render("nfs", "aicluster.exports.j2", server))
    assert_golden(GOLDEN / "aicluster-nfs.conf", render("nfs", "aicluster-nfs.conf.j2", server))
    # The same exports served by nfs-ganesha.
    assert_golden(GOLDEN / "ganesha.conf", render("nfs", "ganesha.conf.j2", server))
    for name in ("head", "gpu1"):
        v = template_vars("nfs", lab, name, lab.hosts[name].data, "Debian")
        lines = "".join(render("nfs", "fstab.j2", {**v, "nfs_mount": m})
                        for m in v["nfs_mount_list"])
        assert_golden(GOLDEN / f"fstab-lines.{name}", lines)
