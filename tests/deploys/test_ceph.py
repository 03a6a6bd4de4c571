"""The ceph deploy planned on fake hosts: the first monitor's bootstrap (monmap, mkfs,
quorum, keys), managers, OSDs on named empty devices only (the disk-safety rule: a
device holding data is refused with nothing planned unless wipe, never when mounted),
a device holding an OSD of this cluster left as it is, pools and CephFS on the first
monitor, client mounts after CephFS exists; a second run plans no change; Ubuntu and
Rocky package plans; an OSD host added later touches only itself. The pinned release:
Ceph's repository (key, source, pin; dnf .repo) or the distribution's packages, and a
host whose installed (or, from the distribution, candidate) Ceph is another release
refused with nothing planned. Explicit CRUSH rules: every pool on aicluster-<domain>,
a cluster grown to as many OSD hosts as replicas moved to aicluster-host.

Fake hosts: no host is contacted; the BlockDevices and CephState facts come from
fixtures shaped as aicluster.common.disks.parse and aicluster.components.ceph.facts.parse return
them (tests/deploys/harness.py). The cluster's secret is a file in a temporary
directory (the inventory's secrets.ceph).
"""

from __future__ import annotations

import hashlib
import logging
import re
import stat
from datetime import datetime, timedelta

import pytest

from aicluster.components.ceph import deploy as ceph
from aicluster.components.ceph import derive as ceph_derive
from aicluster.components.ceph import probe as ceph_probe
from aicluster.inventory import InventoryError, validate
from aicluster.render import render
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan
from tests.golden import GOLDEN_DIR, assert_golden

GOLDEN = GOLDEN_DIR / "ceph"
D1 = "/dev/disk/by-id/nvme-KIOXIA_KCM7DRUG7T68_C1000001"
D2 = "/dev/disk/by-id/nvme-KIOXIA_KCM7DRUG7T68_C2000001"
D3 = "/dev/disk/by-id/nvme-KIOXIA_KCM7DRUG7T68_C3000001"
D4 = "/dev/disk/by-id/nvme-KIOXIA_KCM7DRUG7T68_C4000001"
REAL = "/dev/nvme1n1"
NOW = datetime(2026, 1, 1, 12, 0)
APT_STAMP = "/var/lib/apt/periodic/update-success-stamp"
FIXED_FSID = "4f1c2a9e-6b3d-4e8f-9a7c-0d2e5b6f8a10"
#: A site's mirror of Ceph's repository (aicluster names no package host).
MIRROR = "https://mirror.example.org/ceph"
SYSTEM = {"name": "nvme0n1", "kname": "nvme0n1", "path": "/dev/nvme0n1", "type": "disk",
          "mountpoints": [None],
          "children": [{"name": "nvme0n1p1", "kname": "nvme0n1p1", "path": "/dev/nvme0n1p1",
                        "type": "part", "mountpoints": ["/"], "children": []}]}


@pytest.fixture()
def secret(tmp_path):
    return str(tmp_path / "secrets" / "ceph.secret")


def _cluster_data(secret: str, **extra) -> dict:
    return {
        "cluster_name": "demo",
        "networks": {"management": {"subnet": "10.10.0.0/24"},
                     "storage": {"subnet": "10.30.0.0/24", "mtu": 9000}},
        "secrets": {"ceph": {"file": secret}},
        "ceph_repo_url": MIRROR,
        "ceph_pools": [{"name": "rbd", "pg_num": 32, "application": "rbd"}],
        **extra,
    }


def _host(name: str, n: int, devices: list | None = None, **data) -> tuple[str, dict]:
    out = {"ssh_hostname": f"10.10.0.{n}",
           "hardware": {"nics": [{"name": "ens2", "network": "storage", "speed_gbps": 100,
                                  "address": f"10.30.0.{n}", "mtu": 9000}]},
           **data}
    if devices is not None:
        out["ceph_osd_devices"] = devices
    return name, out


def _three(extra_osd=None):
    """ceph1..3: monitor + manager + OSD each, ceph1 the MDS; client1 mounts CephFS."""
    hosts = [_host("ceph1", 31, [{"device": D1}]), _host("ceph2", 32, [{"device": D2}]),
             _host("ceph3", 33, [{"device": D3}]), _host("client1", 41)]
    groups = {"ceph_mons": ["ceph1", "ceph2", "ceph3"],
              "ceph_osds": ["ceph1", "ceph2", "ceph3"],
              "ceph_mds": ["ceph1"], "ceph_clients": ["client1"]}
    if extra_osd:
        hosts.insert(3, _host(extra_osd, 34, [{"device": D4}]))
        groups["ceph_osds"] = [*groups["ceph_osds"], extra_osd]
    return hosts, groups


def _record(signatures=(), exists=True, holders=()) -> dict:
    return {"real": REAL, "exists": exists, "block": True if exists else None,
            "holders": list(holders), "signatures": list(signatures), "wipefs_error": "",
            "blkid": {}}


def _sig(kind: str, label: str = "") -> dict:
    return {"type": kind, "offset": "0x0", "label": label, "uuid": ""}


def _block(device: str, record: dict | None = None, mountpoints=(None,)):
    value = {
        "lsblk": [SYSTEM, {"name": "nvme1n1", "kname": "nvme1n1", "path": REAL, "type": "disk",
                           "mountpoints": list(mountpoints), "children": []}],
        "devices": {device: record or _record()},
        "mounts": {},
    }
    return lambda **kw: value


def _facts(hosts, distro="debian12", block=None, state=None) -> dict:
    out = {}
    for name, data in hosts:
        devices = [d["device"] for d in data.get("ceph_osd_devices", [])]
        out[name] = {"LinuxDistribution": DISTRIBUTIONS[distro], "Os": "Linux",
                     "Which": lambda command, **kw: f"/usr/bin/{command}"}
        if devices:
            out[name]["BlockDevices"] = (block or {}).get(name) or _block(devices[0])
        if state and name in state:
            out[name]["CephState"] = state[name]
    return out


def _plan(hosts, groups, secret, facts=None, distro="debian12", **extra):
    return plan(hosts, groups, _cluster_data(secret, **extra),
                facts if facts is not None else _facts(hosts, distro), ceph.deploy)


def _keys(secret, hosts, groups, name):
    from aicluster.inventory import validate as _validate

    cluster = _validate({n: (tuple(g for g, m in groups.items() if n in m),
                             {**_cluster_data(secret), **d}) for n, d in hosts})
    v = ceph_derive.derived_vars(cluster, name, cluster.hosts[name].data)
    return cluster, v, ceph_derive.secrets(v["ceph_keys_ref"], "ceph", 64, "", v["ceph_entities"],
                                    name, v["ceph_roles"], "aicluster")


# ---------------------------------------------------------------------------
# The first deploy: bootstrap, in the order the cluster needs
# ---------------------------------------------------------------------------


def test_the_first_monitor_bootstraps_the_cluster_from_a_generated_monmap(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret)
    _, _, keys = _keys(secret, hosts, groups, "ceph1")
    fsid = keys["fsid"]
    mkfs = p.op("ceph1", "Make this host's monitor (monmap, ceph-mon --mkfs)").text
    assert f"monmaptool --create --clobber --fsid {fsid} " in mkfs
    for n in (31, 32, 33):
        assert f"--addv ceph{n - 30} '[v2:10.30.0.{n}:3300,v1:10.30.0.{n}:6789]'" in mkfs
    assert ("runuser -u ceph -- ceph-mon --mkfs -i ceph1 --monmap "
            "/var/lib/ceph/tmp/aicluster-monmap --keyring /etc/ceph/aicluster-mon.keyring") in mkfs
    # Every monitor is made and started; only the first waits for quorum and imports keys.
    for name in ("ceph2", "ceph3"):
        mkfs = p.op(name, "Make this host's monitor (monmap, ceph-mon --mkfs)")
        assert f"-i {name} " in mkfs.text
        assert p.op(name, "Monitors in quorum, the cluster's keys registered (first monitor)"
                    ).commands == []
    keys_op = p.op("ceph1", "Monitors in quorum, the cluster's keys registered (first monitor)")
    assert "quorum_status" in keys_op.commands[0]
    assert keys_op.commands[1] == (
        "ceph --connect-timeout 60 auth import -i /etc/ceph/aicluster-auth.keyring")
    assert "systemctl start ceph-mgr@ceph1.service" in p.op(
        "ceph1", "ceph-mgr@ceph1 running and enabled").text
    targets = "Ceph's systemd targets enabled (daemons start at boot)"
    assert p.op("ceph1", targets).text == (
        "systemctl enable ceph.target ceph-mon.target ceph-mgr.target ceph-mds.target "
        "ceph-osd.target")
    assert targets not in p.names("client1")  # a client runs no daemon
    conf = p.upload("ceph1", "/etc/ceph/ceph.conf")
    assert f"fsid = {fsid}\n" in conf
    assert "mon_host = [v2:10.30.0.31:3300,v1:10.30.0.31:6789]," in conf
    assert "public_network = 10.30.0.0/24\n" in conf
    assert "osd_pool_default_size = 3\nosd_pool_default_min_size = 2\n" in conf
    assert "osd_crush_chooseleaf_type = 1\n" in conf  # three OSD hosts: replicas per host
    # The same ceph.conf everywhere.
    assert all(p.upload(h, "/etc/ceph/ceph.conf") == conf for h in ("ceph2", "client1"))


def test_the_order_monitors_keys_osds_pools_cephfs_mounts(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret)

    def at(host, name):
        return p.op(host, name).index

    keys = at("ceph1", "Monitors in quorum, the cluster's keys registered (first monitor)")
    assert at("ceph3", "ceph-mon@ceph3 running and enabled") < keys
    for h, d in (("ceph1", D1), ("ceph2", D2), ("ceph3", D3)):
        create = at(h, f"Make an OSD on {d} (ceph-volume raw)")
        assert keys < create < at("ceph1", "Pools (ceph_pools and CephFS's; first monitor)")
        assert p.op(h, f"Make an OSD on {d} (ceph-volume raw)").text == (
            f"/usr/local/sbin/aicluster-ceph-osd create {d}")
    pools = p.op("ceph1", "Pools (ceph_pools and CephFS's; first monitor)").commands
    # Three OSD hosts for three replicas: the host rule, made first, on every pool.
    assert pools[0] == ("ceph --connect-timeout 60 osd crush rule create-replicated "
                        "aicluster-host default host")
    assert "ceph --connect-timeout 60 osd pool create rbd 32 32 replicated aicluster-host" \
        in pools
    assert "ceph --connect-timeout 60 osd pool set rbd size 3" in pools
    assert "ceph --connect-timeout 60 osd pool application enable rbd rbd" in pools
    assert "ceph --connect-timeout 60 osd pool create cephfs_metadata 16 16 replicated " \
        "aicluster-host" in pools
    fs = p.op("ceph1", "CephFS (ceph fs new, an MDS active; first monitor)")
    assert "fs new cephfs cephfs_metadata cephfs_data" in fs.commands[0]
    assert fs.index > at("ceph1", "Pools (ceph_pools and CephFS's; first monitor)")
    assert at("client1", "Mount CephFS at /mnt/cephfs") > fs.index
    fstab = p.op("client1", "Mount CephFS at /mnt/cephfs at boot (fstab, _netdev, nofail)")
    assert "none /mnt/cephfs fuse.ceph ceph.id=aicluster,ceph.conf=/etc/ceph/ceph.conf," \
        "_netdev,nofail,x-systemd.mount-timeout=5min,defaults 0 0" in fstab.text


def test_keyrings_are_0600_owned_by_ceph_and_their_keys_never_named(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret)
    cluster, v, keys = _keys(secret, hosts, groups, "ceph1")
    for path in ("/etc/ceph/ceph.client.admin.keyring", "/etc/ceph/aicluster-mon.keyring",
                 "/var/lib/ceph/mgr/ceph-ceph1/keyring", "/var/lib/ceph/mds/ceph-ceph1/keyring",
                 "/var/lib/ceph/bootstrap-osd/ceph.keyring"):
        op = p.op("ceph1", f"Keyring {path} (mode 0600, never shown)")
        assert f"chmod 600 {path}" in op.text and f"chown ceph:ceph {path}" in op.text
        assert p.upload("ceph1", path) == repr(keys["keyrings"][path].encode())
    names = "\n".join(op.name for h in p.ops for op in p.ops[h])
    for text in keys["keyrings"].values():
        for key in re.findall(r"key = (\S+)", text):
            assert key not in names
    # The client gets its own restricted key only.
    ring = eval(p.upload("client1", "/etc/ceph/ceph.client.aicluster.keyring")).decode()
    assert ring.startswith("[client.aicluster]\n")
    assert 'caps mon = "allow r"' in ring and 'caps mds = "allow rw"' in ring
    assert 'caps osd = "allow rw pool=cephfs_data"' in ring
    assert not any(op.name.startswith("Keyring /etc/ceph/ceph.client.admin")
                   for op in p.ops["client1"])
    # The secret file was generated once, mode 0600; the same keys the second time.
    from pathlib import Path

    assert stat.S_IMODE(Path(secret).stat().st_mode) == 0o600
    assert _keys(secret, hosts, groups, "ceph1")[2] == keys


def test_keys_are_cephx_keys_derived_from_the_one_secret():
    import base64

    a = ceph_derive.derive_key(b"s" * 64, "client.admin")
    raw = base64.b64decode(a)
    assert len(raw) == 28 and raw[:2] == b"\x01\x00" and raw[10:12] == b"\x10\x00"
    assert a != ceph_derive.derive_key(b"s" * 64, "client.bootstrap-osd")
    assert a != ceph_derive.derive_key(b"t" * 64, "client.admin")
    fsid = ceph_derive.derive_fsid(b"s" * 64)
    assert re.match(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
                    fsid)


# ---------------------------------------------------------------------------
# No data is lost
# ---------------------------------------------------------------------------


def _two(secret, record, wipe=False, mountpoints=(None,)):
    """ceph1 (monitor, OSD on an empty D1) and ceph2 (OSD on D2 as given)."""
    hosts = [_host("ceph1", 31, [{"device": D1}]),
             _host("ceph2", 32, [{"device": D2, "wipe": wipe}])]
    groups = {"ceph_mons": ["ceph1"], "ceph_osds": ["ceph1", "ceph2"]}
    facts = _facts(hosts, block={"ceph2": _block(D2, record, mountpoints)})
    return _plan(hosts, groups, secret, facts)


def _refused(caplog, p, *needles):
    assert p.ops["ceph2"] == [], p.names("ceph2")  # nothing planned on ceph2 at all
    assert f"Make an OSD on {D1} (ceph-volume raw)" in p.names("ceph1")  # ceph1 goes on
    text = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert "host 'ceph2': ceph:" in text, text
    for needle in needles:
        assert needle in text, text
    return text


def test_a_device_with_a_filesystem_is_refused_and_nothing_is_planned(caplog, secret):
    p = _two(secret, _record([_sig("ext4", "data")]))
    text = _refused(caplog, p, D2, REAL, "ext4 (label 'data')", "wipe: true")
    assert "nothing is changed" in text


def test_the_same_device_with_wipe_is_wiped_then_made_an_osd(secret):
    p = _two(secret, _record([_sig("ext4", "data")]), wipe=True)
    names = p.names("ceph2")
    wipe = f"Wipe {D2} (wipe: true in the inventory)"
    assert p.op("ceph2", wipe).text.startswith(f"wipefs -a {D2} && dd if=/dev/zero of={D2}")
    assert names.index(wipe) < names.index(f"Make an OSD on {D2} (ceph-volume raw)")


def test_a_mounted_device_with_wipe_is_refused(caplog, secret):
    p = _two(secret, _record([_sig("xfs")]), wipe=True, mountpoints=["/data"])
    _refused(caplog, p, "is mounted at /data", "never wiped, even with wipe: true")


def test_an_osd_of_another_cluster_is_refused(caplog, secret):
    state = {"ceph2": {"mon": False, "mounted": None, "cluster": None,
                       "osds": {D2: {"ceph_fsid": FIXED_FSID, "osd_id": 7, "osd_uuid": "u",
                                     "running": False}}}}
    hosts = [_host("ceph1", 31, [{"device": D1}]), _host("ceph2", 32, [{"device": D2}])]
    groups = {"ceph_mons": ["ceph1"], "ceph_osds": ["ceph1", "ceph2"]}
    facts = _facts(hosts, block={"ceph2": _block(D2, _record([_sig("ceph_bluestore")]))},
                   state=state)
    p = _plan(hosts, groups, secret, facts)
    _refused(caplog, p, f"an OSD of another Ceph cluster (fsid {FIXED_FSID})")


def test_an_osd_of_this_cluster_is_ours_and_only_started_when_stopped(secret):
    hosts = [_host("ceph1", 31, [{"device": D1}]), _host("ceph2", 32, [{"device": D2}])]
    groups = {"ceph_mons": ["ceph1"], "ceph_osds": ["ceph1", "ceph2"]}
    _, _, keys = _keys(secret, hosts, groups, "ceph1")

    def state(running):
        return {"mon": False, "mounted": None, "cluster": None,
                "osds": {D2: {"ceph_fsid": keys["fsid"], "osd_id": 1, "osd_uuid": "u",
                              "running": running}}}

    for running in (False, True):
        facts = _facts(hosts, block={"ceph2": _block(D2, _record([_sig("ceph_bluestore")]))},
                       state={"ceph2": state(running)})
        names = _plan(hosts, groups, secret, facts).names("ceph2")
        assert f"Make an OSD on {D2} (ceph-volume raw)" not in names
        assert (f"Start the OSD on {D2}" in names) is (not running)


def test_an_osd_wipefs_does_not_name_is_still_never_made_again(secret):
    hosts = [_host("ceph1", 31, [{"device": D1}]), _host("ceph2", 32, [{"device": D2}])]
    groups = {"ceph_mons": ["ceph1"], "ceph_osds": ["ceph1", "ceph2"]}
    _, _, keys = _keys(secret, hosts, groups, "ceph1")
    state = {"mon": False, "mounted": None, "cluster": None,
             "osds": {D2: {"ceph_fsid": keys["fsid"], "osd_id": 1, "osd_uuid": "u",
                           "running": True}}}
    facts = _facts(hosts, state={"ceph2": state})  # wipefs shows nothing on D2
    p = _plan(hosts, groups, secret, facts)
    assert not any(n.startswith(("Make an OSD", "Start the OSD on")) for n in p.names("ceph2"))


def test_a_bluestore_label_only_blkid_names_is_not_empty(caplog, secret):
    """wipefs (util-linux 2.38) lists no signature on a bluestore OSD; blkid -p names
    it (TYPE=ceph_bluestore, seen on the testbed). The rule counts it, for every
    component: here a foreign or unreadable OSD is refused."""
    from aicluster.common.disks import check_devices

    record = _record()
    record["blkid"] = {"TYPE": "ceph_bluestore", "USAGE": "other"}
    fact = {"lsblk": [SYSTEM], "devices": {D2: record}, "mounts": {}}
    checked = check_devices(fact, [{"device": D2}])
    assert checked["devices"][D2]["state"] == "refused", checked
    assert "ceph_bluestore" in checked["problems"][0]
    p = _two(secret, record)
    _refused(caplog, p, "ceph_bluestore", "does not show as an OSD of this cluster")


def test_the_system_disk_is_never_an_osd(caplog, secret):
    record = _record([_sig("gpt")])
    record["real"] = "/dev/nvme0n1"
    p = _two(secret, record, wipe=True)
    _refused(caplog, p, "holds / (the system disk)")


# ---------------------------------------------------------------------------
# A second run, other systems, a new OSD host
# ---------------------------------------------------------------------------


#: The always-on manager modules of a recent release, as `ceph mgr module ls -f json`
#: lists them (MgrMonitor's "mgr module ls": always_on_modules, enabled_modules).
ALWAYS_ON = ["balancer", "crash", "devicehealth", "orchestrator", "pg_autoscaler", "progress",
             "rbd_support", "status", "telemetry", "volumes"]


def _deployed(secret, hosts, groups, p) -> dict:
    """Facts of hosts where the plan ``p`` has run: files with its content, packages,
    services, the cluster as the first monitor reads it."""
    facts = {}
    cluster_state = None
    for name, _ in hosts:
        cluster, v, keys = _keys(secret, hosts, groups, name)
        files = {}
        for op in p.ops[name]:
            for command in op.commands:
                if command.startswith("upload "):
                    dest, body = command[len("upload "):].split("\n", 1)
                    files[dest] = eval(body) if body.startswith("b'") else body.encode()
        r = v["ceph_roles"]
        # What the plan downloads (the key of Ceph's repository) is there too.
        for op in p.ops[name]:
            if op.name == "Ceph repository key" and op.commands:
                files["/etc/apt/keyrings/aicluster-ceph.asc"] = b"-----BEGIN PGP PUBLIC KEY"
        if r["first_mon"]:
            pools = {pp["name"]: {"size": pp["size"], "min_size": pp["min_size"], "pg_num": 8,
                                  "crush_rule": pp["crush_rule"],
                                  "applications": [pp["application"] or "cephfs"]}
                     for pp in v["ceph_request"]["pools"]}
            rules = ["replicated_rule", *(c["name"] for c in v["ceph_request"]["crush_rules"])]
            cluster_state = {"reachable": True, "pools": pools, "crush_rules": rules,
                             "fs": {"cephfs": {}} if v["ceph_cephfs"] else {},
                             "mgr_modules": {"enabled": ["iostat", "nfs", "prometheus",
                                                         "restful"],
                                             "always_on": ALWAYS_ON},
                             "mgr_config": dict(v["ceph_request"]["mgr_config"]),
                             "auth": {e["entity"]: {"key": keys["digests"][e["entity"]],
                                                    "caps": e["caps"]}
                                      for e in v["ceph_entities"]}}
        devices = v["ceph_osd_device_list"]
        state = {"mon": r["mon"], "mounted": None, "cluster": None,
                 "targets": {t: True for t in v["ceph_request"]["targets"]},
                 "osds": {d: {"ceph_fsid": keys["fsid"], "osd_id": i, "osd_uuid": "u",
                              "running": True} for i, d in enumerate(devices)}}
        if v["ceph_cephfs_mount_path"]:
            state["mounted"] = {"source": "ceph-fuse", "fstype": "fuse.ceph-fuse"}
        if r["first_mon"]:
            state["cluster"] = cluster_state
        units = {f"{u}.service": True for u in (f"ceph-mon@{name}", f"ceph-mgr@{name}",
                                                f"ceph-mds@{name}", "aicluster-ceph-osds")}
        fstab = [v["ceph_fstab_line"]] if v["ceph_fstab_line"] else []

        def file_fact(path, files=files, **kw):
            if path == APT_STAMP:
                return {"mode": 644, "user": "root", "group": "root", "mtime": NOW}
            secret_file = ("keyring" in path and not path.startswith("/etc/apt/")) \
                or path.endswith(".secret")
            return {"mode": 600 if secret_file else 755 if path == ceph_derive.OSD_TOOL else 644,
                    "user": "ceph" if secret_file else "root",
                    "group": "ceph" if secret_file else "root"} if path in files else None

        def sha1_fact(path, files=files, **kw):
            return hashlib.sha1(files[path]).hexdigest() if path in files else None

        def directory_fact(path, **kw):
            owner = "ceph" if path.startswith("/var/lib/ceph") else "root"
            return {"mode": 750 if owner == "ceph" else 755, "user": owner, "group": owner}

        block = {"lsblk": [SYSTEM], "devices": {d: _record([_sig("ceph_bluestore")])
                                                for d in devices}, "mounts": {}}
        facts[name] = {
            "LinuxDistribution": DISTRIBUTIONS["debian12"], "Os": "Linux",
            "Which": lambda command, **kw: f"/usr/bin/{command}",
            "BlockDevices": lambda block=block, **kw: block,
            "CephState": state,
            "DebPackages": {pkg: ["16.2.11"] for pkg in (
                "ceph-common", "ceph-mon", "ceph-mgr", "ceph-osd", "udev", "ceph-volume",
                "ceph-mds", "ceph-fuse")},
            "Date": NOW + timedelta(minutes=1),
            "SystemdStatus": units, "SystemdEnabled": units,
            "FindInFile": lambda path, pattern, fstab=fstab, **kw: fstab
            if path == "/etc/fstab" else [],
            "File": file_fact, "Sha1File": sha1_fact, "Directory": directory_fact,
        }
    return facts


def test_a_deployed_cluster_plans_no_change(secret):
    hosts, groups = _three()
    first = _plan(hosts, groups, secret)
    p = _plan(hosts, groups, secret, _deployed(secret, hosts, groups, first))
    for name, _ in hosts:
        assert not p.changing(name), (name, p.changing(name))


def test_adding_an_osd_host_touches_only_that_host(secret):
    hosts, groups = _three()
    first = _plan(hosts, groups, secret)
    facts = _deployed(secret, hosts, groups, first)
    more_hosts, more_groups = _three(extra_osd="ceph4")
    facts.update(_facts([h for h in more_hosts if h[0] == "ceph4"]))
    p = _plan(more_hosts, more_groups, secret, facts)
    for name in ("ceph1", "ceph2", "ceph3", "client1"):
        assert not p.changing(name), (name, p.changing(name))
    assert f"Make an OSD on {D4} (ceph-volume raw)" in p.changing("ceph4")
    assert "Make this host's monitor (monmap, ceph-mon --mkfs)" not in p.names("ceph4")
    assert p.upload("ceph4", "/etc/ceph/ceph.conf") == first.upload("ceph1", "/etc/ceph/ceph.conf")


RELOAD_OSD_UNIT = "Reload systemd units (OSD unit changed)"
RELOAD_FSTAB = "Reload systemd units (fstab changed)"
OSD_UNIT_PATH = f"/etc/systemd/system/{ceph_derive.OSD_UNIT}"


def _re_run(secret, change=None):
    """The cluster planned again where the same plan ran; ``change(facts)`` alters
    what a node holds first."""
    hosts, groups = _three()
    facts = _deployed(secret, hosts, groups, _plan(hosts, groups, secret))
    if change:
        change(facts)
    return hosts, _plan(hosts, groups, secret, facts)


def _holds_other(facts, name, dest):
    """``name`` holds another file at ``dest`` than the deploy wrote."""
    sha1 = facts[name]["Sha1File"]
    facts[name]["Sha1File"] = lambda path, **kw: (
        hashlib.sha1(b"# older\n").hexdigest() if path == dest else sha1(path, **kw))


def _guarded(p, name):
    """The ``_if`` operations that run on ``name``; the others must be skipped."""
    ops = [op for op in p.ops[name] if op.conditional]
    for op in ops:
        assert op.runs != op.skipped, op
    return {op.name for op in ops if op.runs}


def test_a_re_run_reloads_nothing(secret):
    hosts, p = _re_run(secret)
    for name in ("ceph1", "ceph2", "ceph3"):
        assert p.op(name, RELOAD_OSD_UNIT).skipped, name
    assert p.op("client1", RELOAD_FSTAB).skipped
    for name, _ in hosts:
        assert _guarded(p, name) == set(), name


def _dead_mount(facts):
    """client1's CephFS is mounted but answers nothing (the MDS evicted the client)."""
    facts["client1"]["CephState"] = {**facts["client1"]["CephState"], "mounted": {
        "source": "ceph-fuse", "fstype": "fuse.ceph-fuse", "answers": False}}


def test_a_dead_cephfs_mount_is_unmounted_and_mounted_again_on_that_host_only(secret):
    hosts, p = _re_run(secret, _dead_mount)
    unmount = p.op("client1", "Unmount the dead CephFS at /mnt/cephfs (mounted but it answers "
                              "nothing: the MDS evicted this client; mounted again below)")
    assert unmount.commands == ["umount -l /mnt/cephfs"]
    mount = p.op("client1", "Mount CephFS at /mnt/cephfs")
    assert unmount.index < mount.index
    # The mount point, which no stat can read through the dead mount, is left alone.
    assert "Mount point /mnt/cephfs" not in p.names("client1")
    assert p.changing("client1") == [unmount.name, mount.name]
    for name in ("ceph1", "ceph2", "ceph3"):
        assert not p.changing(name), (name, p.changing(name))


def test_a_cephfs_mount_that_answers_or_an_older_probe_changes_nothing():
    request = {"host": "c", "roles": {"mon": False, "osd": False, "mds": False,
                                      "first_mon": False, "client": True},
               "devices": [], "mode": "raw", "mount": "/mnt/cephfs", "targets": []}
    mounted = {"source": "ceph-fuse", "fstype": "fuse.ceph-fuse"}
    for extra in ({"answers": True}, {}):
        state = {"mon": False, "osds": {}, "cluster": None, "mounted": {**mounted, **extra}}
        out = ceph_derive.decide({"lsblk": []}, state, request, "f", {}, "bookworm")
        assert (out["mount"], out["remount"]) == (False, False), extra
    state = {"mon": False, "osds": {}, "cluster": None,
             "mounted": {**mounted, "answers": False}}
    out = ceph_derive.decide({"lsblk": []}, state, request, "f", {}, "bookworm")
    assert (out["mount"], out["remount"]) == (True, True)


def test_a_changed_osd_unit_reloads_systemd_on_that_host_only(secret):
    hosts, p = _re_run(secret, lambda facts: _holds_other(facts, "ceph2", OSD_UNIT_PATH))
    assert _guarded(p, "ceph2") == {RELOAD_OSD_UNIT}
    assert p.op("ceph2", RELOAD_OSD_UNIT).index > p.op("ceph2",
                                                      "Start the OSDs at boot (unit)").index
    # The running OSDs are left alone: the unit only starts them at boot.
    assert p.changing("ceph2") == ["Start the OSDs at boot (unit)", RELOAD_OSD_UNIT]
    for name in ("ceph1", "ceph3", "client1"):
        assert _guarded(p, name) == set(), name


def test_a_changed_fstab_line_reloads_systemd_on_the_client(secret):
    def change(facts):
        facts["client1"]["FindInFile"] = lambda path, **kw: (
            ["ceph-fuse /mnt/old fuse.ceph-fuse defaults 0 0"] if path == "/etc/fstab" else [])

    hosts, p = _re_run(secret, change)
    assert _guarded(p, "client1") == {RELOAD_FSTAB}
    for name in ("ceph1", "ceph2", "ceph3"):
        assert _guarded(p, name) == set(), name


def test_a_changed_ceph_conf_restarts_and_reloads_nothing(secret):
    def change(facts):
        for name in facts:
            _holds_other(facts, name, ceph_derive.CONF)

    hosts, p = _re_run(secret, change)
    for name, _ in hosts:
        # Rewritten, and nothing else: the daemons read it when next restarted.
        assert p.changing(name) == ["ceph.conf"], (name, p.changing(name))
        assert _guarded(p, name) == set(), name


@pytest.mark.parametrize("distro, release, suite", [
    ("ubuntu2204", "tentacle", "jammy"),
    # Ceph's repository has no tentacle build for noble: umbrella has one.
    ("ubuntu2404", "umbrella", "noble"),
])
def test_ubuntu_installs_ceph_volume_beside_the_osd(secret, distro, release, suite):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret, _facts(hosts, distro), ceph_release=release)
    install = p.op("ceph2", "Install Ceph").text
    assert "apt-get" in install and "ceph-osd udev ceph-volume" in install
    assert "ceph-fuse" in p.op("client1", "Install Ceph").text
    source = p.upload("ceph2", "/etc/apt/sources.list.d/aicluster-ceph.list")
    assert f"{MIRROR}/debian-{release}/ {suite} main\n" in source


REPO_KEY = "/etc/apt/keyrings/aicluster-ceph.asc"
REPO_LIST = "/etc/apt/sources.list.d/aicluster-ceph.list"
REPO_PIN = "/etc/apt/preferences.d/aicluster-ceph.pref"
REPO_INDEX = "Read Ceph's repository's index (it was just added or changed)"


def test_cephs_repository_key_source_and_pin_come_before_the_install(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret)
    names = p.names("ceph2")
    key = p.op("ceph2", "Ceph repository key")
    assert f"curl -sSLf {MIRROR}/keys/release.asc -o " in key.text
    assert "mv /tmp/" in key.text and f" {REPO_KEY}" in key.text
    source = p.upload("ceph2", REPO_LIST)
    assert source.endswith(
        f"deb [signed-by={REPO_KEY}] {MIRROR}/debian-tentacle/ bookworm main\n"), source
    pin = p.upload("ceph2", REPO_PIN)
    assert "Package: ceph* libceph* librados* librbd* librgw* " in pin
    assert 'Pin: origin "mirror.example.org"\nPin-Priority: 990\n' in pin
    index = p.op("ceph2", REPO_INDEX)
    assert index.runs and "apt-get update" in index.text
    assert (names.index("Ceph repository key") < names.index(REPO_INDEX)
            < names.index("Install Ceph"))
    # Ceph's own Debian packages ship ceph-volume apart, as Ubuntu's do.
    assert "ceph-osd udev ceph-volume" in p.op("ceph2", "Install Ceph").text
    # No package host is named but the inventory's mirror.
    for name in ("ceph1", "ceph2", "client1"):
        urls = re.findall(r"https?://\S+", p.commands(name))
        assert urls and all(u.startswith(MIRROR + "/") for u in urls), urls


def test_the_installed_release_is_checked_only_when_the_packages_changed(secret):
    check = "Check the installed Ceph is tentacle (20)"
    hosts, groups = _three()
    first = _plan(hosts, groups, secret)
    op = first.op("ceph2", check)
    assert op.conditional and op.runs
    assert "ceph --version" in op.text and '[ "$v" != 20 ]' in op.text
    assert "the installed Ceph is ${v:-unreadable}, not ceph_release tentacle (20)" in op.text
    names = first.names("ceph2")
    assert names.index("Install Ceph") < names.index(check) < names.index("ceph.conf")
    again = _plan(hosts, groups, secret, _deployed(secret, hosts, groups, first))
    assert again.op("ceph2", check).skipped
    assert again.op("ceph2", REPO_INDEX).skipped


@pytest.mark.parametrize("printed, passes", [
    ("ceph version 20.2.5 (0123abcd) tentacle (stable)", True),
    # Ceph's own format (Debian 12's 16.2.15, as `ceph --version` prints it).
    ("ceph version 16.2.15 (618f440892089921c3e944a991122ddc44e60516) pacific (stable)", False),
    ("", False),
])
def test_the_check_after_the_install_reads_ceph_version(printed, passes):
    """The check's shell, run here with a STAND-IN `ceph` (a shell function)."""
    import subprocess

    command = ceph_derive.release_check_command(
        {"ceph_release": "tentacle", "ceph_source": "ceph_repo"}, "ceph2")
    out = subprocess.run(["sh", "-c", f"ceph() {{ echo '{printed}'; }}; {command}"],
                         capture_output=True, text=True, timeout=30)
    assert (out.returncode == 0) is passes, out.stderr
    if not passes:
        assert "aicluster: host ceph2: the installed Ceph is " in out.stderr
        assert "not ceph_release tentacle (20)" in out.stderr


def test_rocky_reads_cephs_rpm_repository_with_epel_first(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret, _facts(hosts, "rocky9"))
    names = p.names("ceph1")
    repo = p.upload("ceph1", "/etc/yum.repos.d/aicluster-ceph.repo")
    assert f"baseurl={MIRROR}/rpm-tentacle/el9/$basearch\n" in repo
    assert f"baseurl={MIRROR}/rpm-tentacle/el9/noarch\n" in repo
    assert repo.count("gpgcheck=1\n") == 2
    assert repo.count(f"gpgkey={MIRROR}/keys/release.asc\n") == 2
    assert "dnf install -y epel-release" in p.op("ceph1", "Before Ceph: epel-release").text
    assert (names.index("Before Ceph: epel-release")
            < names.index("Ceph repository (tentacle, el9)") < names.index("Install Ceph"))
    assert "centos-release-ceph" not in p.commands("ceph1")
    assert REPO_INDEX not in names and "Ceph repository key" not in names  # dnf: no apt
    install = p.op("ceph1", "Install Ceph").text
    assert "dnf" in install and "ceph-mon" in install and "ceph-volume" in install


CRB = "Enable CodeReady Builder (crb) before EPEL (EPEL's packages need it)"


def test_rocky_enables_codeready_builder_before_epel_only_where_it_is_off(secret):
    """EPEL's own instructions enable CRB before epel-release (some EPEL packages need
    it): planned on a Rocky node whose .repo files have it off, before EPEL; no change
    where it is on (a second run); nothing on Debian, or with the Storage SIG (no EPEL)."""
    from aicluster.common.epel import CRB_ENABLE_COMMAND

    hosts, groups = _three()
    p = _plan(hosts, groups, secret, _facts(hosts, "rocky9"))
    for name in ("ceph1", "client1"):
        names = p.names(name)
        assert p.op(name, CRB).commands == [CRB_ENABLE_COMMAND]
        assert names.index(CRB) < names.index("Before Ceph: epel-release")
    facts = _facts(hosts, "rocky9")
    for name in facts:
        facts[name]["CrbEnabled"] = True
    p = _plan(hosts, groups, secret, facts)
    assert not p.op("ceph1", CRB).runs and "Before Ceph: epel-release" in p.names("ceph1")
    assert CRB not in _plan(hosts, groups, secret).names("ceph1")
    sig = _plan(hosts, groups, secret, _facts(hosts, "rocky9"), ceph_source="distribution",
                ceph_release="squid")
    assert CRB not in sig.names("ceph1")


def test_rocky_with_the_distribution_adds_the_storage_sigs_release_package(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret, _facts(hosts, "rocky9"), ceph_source="distribution",
              ceph_release="squid")
    names = p.names("ceph1")
    sig = "Before Ceph: centos-release-ceph-squid"
    assert "dnf install -y centos-release-ceph-squid" in p.op("ceph1", sig).text
    assert names.index(sig) < names.index("Install Ceph")
    assert not any(n.startswith("Ceph repository") for n in names)
    # A repository file of an earlier ceph_repo deploy is taken away.
    assert "No /etc/yum.repos.d/aicluster-ceph.repo (ceph_source distribution)" in names


def test_debian_with_the_distribution_writes_no_repository(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret, ceph_source="distribution", ceph_release="pacific")
    names = p.names("ceph2")
    assert not any(n.startswith(("Ceph repository", "Pin Ceph's", "Before Ceph"))
                   for n in names)
    for path in (REPO_LIST, REPO_KEY, REPO_PIN):
        assert f"No {path} (ceph_source distribution)" in names
    assert "ceph-volume" not in p.op("ceph2", "Install Ceph").text  # Debian's own ceph-osd
    assert "Check the installed Ceph is pacific (16)" in names


def test_lvm_mode_installs_lvm2_and_the_tool_uses_ceph_volume_lvm(secret):
    hosts = [_host("ceph1", 31, [{"device": D1}], ceph_osd_mode="lvm")]
    groups = {"ceph_mons": ["ceph1"], "ceph_osds": ["ceph1"]}
    p = _plan(hosts, groups, secret)
    assert "lvm2" in p.op("ceph1", "Install Ceph").text
    tool = p.upload("ceph1", "/usr/local/sbin/aicluster-ceph-osd")
    assert "MODE=lvm\n" in tool and 'ceph-volume lvm create --bluestore --data "$real"' in tool


def test_the_kernel_client_mounts_with_a_secret_file(secret):
    hosts, groups = _three()
    hosts[-1] = _host("client1", 41, ceph_cephfs_mount_type="kernel")
    p = _plan(hosts, groups, secret)
    line = p.op("client1", "Mount CephFS at /mnt/cephfs at boot (fstab, _netdev, nofail)").text
    assert ":/ /mnt/cephfs ceph name=aicluster,secretfile=/etc/ceph/ceph.client.aicluster." \
        "secret,_netdev,nofail,x-systemd.mount-timeout=5min,noatime 0 0" in line
    assert "ceph-fuse" not in p.op("client1", "Install Ceph").text


def _stand_in_repository(root, origin_dir, versions, key_home=None):
    """A Debian repository layout (dists/bookworm/main/binary-amd64/Packages and a
    Release with SHA256 sums, signed into InRelease with a key of ``key_home`` when
    given) listing ceph-common at ``versions``. apt-cache policy reads only indexes: no
    package file is made."""
    import email.utils
    import subprocess

    dists = root / origin_dir / "dists" / "bookworm"
    (dists / "main" / "binary-amd64").mkdir(parents=True)
    stanzas = [f"Package: ceph-common\nVersion: {v}\nArchitecture: amd64\nMaintainer: t <t@t>\n"
               f"Filename: pool/ceph-common_{v}_amd64.deb\nSize: 1\nSHA256: {'0' * 64}\n"
               "Description: STAND-IN\n" for v in versions]
    packages = "\n".join(stanzas).encode()
    (dists / "main" / "binary-amd64" / "Packages").write_bytes(packages)
    release = ("Origin: stand-in\nSuite: bookworm\nCodename: bookworm\nComponents: main\n"
               f"Architectures: amd64\nDate: {email.utils.formatdate(usegmt=True)}\nSHA256:\n"
               f" {hashlib.sha256(packages).hexdigest()} {len(packages)} "
               "main/binary-amd64/Packages\n")
    (dists / "Release").write_text(release)
    if key_home:
        subprocess.run(["gpg", "--batch", "--yes", "--clearsign", "-o", str(dists / "InRelease"),
                        str(dists / "Release")], env={"GNUPGHOME": str(key_home)},
                       check=True, capture_output=True)


def test_the_apt_source_and_pin_keep_cephs_repository_over_the_distribution_real_apt(
        tmp_path, secret):
    """apt 2.6 itself (this machine's) reads the source and the pin the deploy writes,
    against STAND-IN repositories on loopback: Ceph's (signed with a key of this test,
    served over HTTP on a port, ceph-common 20.2.5) and a "distribution" (a file:
    repository with a NEWER 21.0.0 and Debian 12's 16.2.15). With the pin, the candidate
    is Ceph's repository's; without it, the newer one would win. The node's fact reads
    that candidate through the same apt (APT_CONFIG)."""
    import getpass
    import http.server
    import os
    import shutil
    import subprocess
    import threading
    from functools import partial

    if not all(shutil.which(t) for t in ("apt-get", "apt-cache", "gpg")):
        pytest.skip("needs apt-get, apt-cache and gpg (a Debian or Ubuntu machine)")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {"GNUPGHOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key",
                    "STAND-IN Ceph key <stand-in@example.org>", "default", "default", "never"],
                   env=env, check=True, capture_output=True)
    www = tmp_path / "www" / "ceph"
    (www / "keys").mkdir(parents=True)
    key = subprocess.run(["gpg", "--armor", "--export"], env=env, check=True,
                         capture_output=True).stdout
    (www / "keys" / "release.asc").write_bytes(key)
    _stand_in_repository(www, "debian-tentacle", ["20.2.5-1bookworm"], home)
    _stand_in_repository(tmp_path, "distro", ["21.0.0-1", PACIFIC])
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(http.server.SimpleHTTPRequestHandler,
                                  directory=str(tmp_path / "www")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/ceph"
        hosts = [_host("ceph1", 31, [{"device": D1}])]
        groups = {"ceph_mons": ["ceph1"], "ceph_osds": ["ceph1"]}
        p = _plan(hosts, groups, secret, ceph_repo_url=url)
        source = p.upload("ceph1", REPO_LIST).replace(REPO_KEY, str(tmp_path / "key.asc"))
        pin = p.upload("ceph1", REPO_PIN)
        assert 'Pin: origin "127.0.0.1"' in pin  # the host name alone, no port
        (tmp_path / "key.asc").write_bytes(key)

        def policy(with_pin: bool) -> tuple[str, dict]:
            etc, state = tmp_path / f"etc-{with_pin}", tmp_path / f"state-{with_pin}"
            for d in (etc / "sources.list.d", etc / "preferences.d", state / "lists" / "partial",
                      tmp_path / f"cache-{with_pin}" / "archives" / "partial"):
                d.mkdir(parents=True)
            (state / "status").write_text("")
            (etc / "sources.list").write_text(
                f"deb [trusted=yes] file:{tmp_path / 'distro'} bookworm main\n")
            (etc / "sources.list.d" / "aicluster-ceph.list").write_text(source)
            if with_pin:
                (etc / "preferences.d" / "aicluster-ceph.pref").write_text(pin)
            conf = tmp_path / f"apt-{with_pin}.conf"
            conf.write_text("\n".join([
                f'Dir::State "{state}";', f'Dir::State::status "{state}/status";',
                f'Dir::Cache "{tmp_path}/cache-{with_pin}";', f'Dir::Etc "{etc}";',
                'Dir::Etc::SourceList "sources.list";', 'Dir::Etc::SourceParts "sources.list.d";',
                'Dir::Etc::PreferencesParts "preferences.d";', 'APT::Architecture "amd64";',
                f'APT::Sandbox::User "{getpass.getuser()}";', 'Debug::NoLocking "true";', ""]))
            apt_env = {**os.environ, "APT_CONFIG": str(conf)}
            update = subprocess.run(["apt-get", "-q", "update"], env=apt_env,
                                    capture_output=True, text=True, timeout=120)
            assert update.returncode == 0 and "E:" not in update.stdout + update.stderr, (
                update.stdout + update.stderr)
            out = subprocess.run(["apt-cache", "policy", "ceph-common"], env=apt_env,
                                 capture_output=True, text=True, timeout=60, check=True).stdout
            return out, apt_env

        unpinned, _ = policy(False)
        assert "Candidate: 21.0.0-1" in unpinned, unpinned
        pinned, apt_env = policy(True)
        assert "Candidate: 20.2.5-1bookworm" in pinned, pinned
        assert re.search(r"20\.2\.5-1bookworm 990\n", pinned), pinned
        # The fact's own program reads the candidate from that apt.
        lines = _probe(apt_env, tmp_path)
        assert ceph_probe.parse(lines)["release"]["candidate"] == "20.2.5-1bookworm"
    finally:
        server.shutdown()


# ---------------------------------------------------------------------------
# One Ceph release on every host: refused before anything changes
# ---------------------------------------------------------------------------

#: What the node's fact reads (aicluster.components.ceph.probe), by release: the
#: installed ceph-common (dpkg's version) and apt's candidate.
PACIFIC = "16.2.15+ds-0+deb12u2"  # Debian 12's own (apt-cache policy, 2026-12-03)
TENTACLE = "20.2.5-1bookworm"


def _release_state(installed=None, candidate=None, unreadable=""):
    return {"mon": False, "osds": {}, "mounted": None, "cluster": None,
            "release": {"installed": installed, "candidate": candidate,
                        "unreadable": unreadable}}


def _refused_host(caplog, p, host, *needles):
    assert p.ops[host] == [], p.names(host)  # nothing at all on that host
    text = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert f"host {host!r}: ceph:" in text, text
    for needle in needles:
        assert needle in text, text
    return text


def test_mixed_releases_are_refused_per_host(caplog, secret):
    """ceph2 runs Debian's Pacific, ceph3 the pinned Tentacle: ceph2 is refused with
    nothing planned, naming both releases and how to upgrade; ceph3 and the others go on."""
    hosts, groups = _three()
    state = {"ceph2": _release_state(PACIFIC, TENTACLE),
             "ceph3": _release_state(TENTACLE, TENTACLE)}
    p = _plan(hosts, groups, secret, _facts(hosts, state=state))
    text = _refused_host(
        caplog, p, "ceph2", f"Ceph {PACIFIC} (pacific 16) is installed",
        "ceph_release tentacle (20)", "one release at a time, outside the deploy",
        "docs/components/ceph.md#upgrading", "nothing is changed")
    assert "'ceph3'" not in text and "'ceph1'" not in text
    assert f"Make an OSD on {D3} (ceph-volume raw)" in p.names("ceph3")
    assert "Install Ceph" in p.names("ceph1") and "Install Ceph" in p.names("client1")


def test_an_installed_older_release_is_refused_even_when_the_repository_has_the_pin(
        caplog, secret):
    hosts, groups = _three()
    # ceph_repo: the candidate (Ceph's repository already added) is the pinned release,
    # the installed one is older: the deploy does not upgrade between releases.
    state = {"client1": _release_state("19.2.3-0ubuntu0.24.04.2", TENTACLE)}
    p = _plan(hosts, groups, secret, _facts(hosts, state=state))
    _refused_host(caplog, p, "client1", "Ceph 19.2.3-0ubuntu0.24.04.2 (squid 19) is installed")


def test_the_pinned_release_installed_everywhere_is_accepted(secret):
    hosts, groups = _three()
    state = {n: _release_state(TENTACLE, TENTACLE) for n, _ in hosts}
    p = _plan(hosts, groups, secret, _facts(hosts, state=state))
    for name, _ in hosts:
        assert "Install Ceph" in p.names(name), name


def test_the_distributions_other_release_is_refused_before_it_is_installed(caplog, secret):
    """ceph_source distribution: Debian 12's candidate is Pacific; with tentacle pinned
    such a host is refused before anything is installed, pointing at ceph_repo, while
    hosts whose distribution ships tentacle (Ubuntu 26.04's 20.2.0-0ubuntu2) go on."""
    hosts, groups = _three()
    state = {n: _release_state(None, PACIFIC if n in ("ceph2", "client1") else
                               "20.2.0-0ubuntu2") for n, _ in hosts}
    p = _plan(hosts, groups, secret, _facts(hosts, state=state), ceph_source="distribution")
    for name in ("ceph2", "client1"):
        _refused_host(caplog, p, name, f"the distribution's Ceph here is {PACIFIC} "
                      "(pacific 16), not the cluster's ceph_release tentacle (20)",
                      "Set ceph_source 'ceph_repo'")
    assert "Install Ceph" in p.names("ceph1") and "Install Ceph" in p.names("ceph3")
    state = {n: _release_state(None, PACIFIC) for n, _ in hosts}
    # Pinned to what the distribution ships, it goes on.
    caplog.clear()
    p = _plan(hosts, groups, secret, _facts(hosts, state=state), ceph_source="distribution",
              ceph_release="pacific")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Install Ceph" in p.names("ceph2")


def test_a_system_cephs_repository_does_not_build_the_release_for_is_refused(caplog, secret):
    hosts, groups = _three()
    facts = _facts(hosts)
    facts["client1"] = _facts([hosts[-1]], "ubuntu2404")["client1"]
    p = _plan(hosts, groups, secret, facts)
    _refused_host(caplog, p, "client1", "Ceph's repository has no tentacle build for noble",
                  "ceph_repo_builds.tentacle: bookworm, jammy, el9",
                  "ceph_source 'distribution'")
    assert "Install Ceph" in p.names("ceph1")


def test_an_installed_ceph_whose_release_cannot_be_read_is_refused(caplog, secret):
    hosts, groups = _three()
    state = {"ceph3": _release_state(
        unreadable="/usr/bin/ceph is there but `ceph --version` names no version")}
    p = _plan(hosts, groups, secret, _facts(hosts, state=state))
    _refused_host(caplog, p, "ceph3", "`ceph --version` names no version",
                  "must be known to be ceph_release tentacle (20)")


def _stub_bin(tmp_path, dpkg=None, policy="", version=None):
    """Stand-ins for dpkg-query, apt-cache and ceph on PATH, printing what the real ones
    print (formats captured on Debian 12 on 2026-12-03: ``dpkg-query -W
    -f='${Status}\\t${Version}'`` of an installed package, ``apt-cache policy``; Ceph's
    ``ceph --version``)."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "dpkg-query": (f"printf 'install ok installed\\t{dpkg}'" if dpkg
                       else "echo 'dpkg-query: no packages found matching ceph-common' >&2; "
                            "exit 1"),
        "apt-cache": f"cat <<'EOF'\n{policy}EOF",
    }
    if version:
        scripts["ceph"] = f"echo 'ceph version {version} (0123abcd) squid (stable)'"
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


DEBIAN12_POLICY = f"""ceph-common:
  Installed: (none)
  Candidate: {PACIFIC}
  Version table:
     {PACIFIC} 500
"""


def _probe(env, tmp_path):
    import subprocess

    text = ceph_probe.command_text(ceph_probe.request_text(
        {"host": "n1", "mode": "raw", "devices": [], "cluster": False,
         "mount": str(tmp_path), "timeout": 5}))
    out = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_the_fact_reads_the_installed_and_candidate_release(tmp_path):
    """The fact's own program, run here with stand-in dpkg-query and apt-cache."""
    lines = _probe(_stub_bin(tmp_path, dpkg=PACIFIC, policy=DEBIAN12_POLICY), tmp_path)
    release = ceph_probe.parse(lines)["release"]
    assert release == {"installed": PACIFIC, "candidate": PACIFIC, "unreadable": ""}


def test_the_fact_falls_back_to_ceph_version(tmp_path):
    lines = _probe(_stub_bin(tmp_path, version="19.2.3"), tmp_path)
    release = ceph_probe.parse(lines)["release"]
    assert release["installed"] == "19.2.3" and release["candidate"] is None


def test_the_ansible_filter_refuses_the_same_host_from_the_facts_output(tmp_path, secret):
    """The role's filter (what Ansible runs) decides from the fact's printed lines as the
    pyinfra deploy does from the parsed fact."""
    import runpy

    from aicluster import ROLES_DIR

    filters = runpy.run_path(str(ROLES_DIR / "ceph/filter_plugins/aicluster_ceph.py"))
    decide = filters["FilterModule"]().filters()["aicluster_ceph_decide"]
    suite = filters["FilterModule"]().filters()["aicluster_ceph_repo_suite"]
    hosts, groups = _three()
    _, v, keys = _keys(secret, hosts, groups, "client1")
    lines = _probe(_stub_bin(tmp_path, dpkg=PACIFIC, policy=DEBIAN12_POLICY), tmp_path)
    assert suite("Debian", "debian", "12.8", "bookworm") == "bookworm"
    assert suite("RedHat", "rocky", "9.4", "Blue Onyx") == "el9"
    plan_ = decide([], lines, v["ceph_request"], keys["fsid"], keys["digests"], "bookworm")
    assert len(plan_["problems"]) == 1 and not plan_["mount"]
    assert f"host 'client1': ceph: Ceph {PACIFIC} (pacific 16) is installed" \
        in plan_["problems"][0]
    same = ceph_derive.decide({}, ceph_probe.parse(lines), v["ceph_request"], keys["fsid"],
                              keys["digests"], "bookworm")
    assert same == plan_


# ---------------------------------------------------------------------------
# CRUSH rules: explicit, on every pool the deploy manages
# ---------------------------------------------------------------------------


def _one_host_three_osds():
    devices = [D1, D2, D3]
    hosts = [_host("ceph1", 31, [{"device": d} for d in devices]), _host("client1", 41)]
    groups = {"ceph_mons": ["ceph1"], "ceph_osds": ["ceph1"], "ceph_mds": ["ceph1"],
              "ceph_clients": ["client1"]}
    block = {"lsblk": [SYSTEM], "devices": {d: _record() for d in devices}, "mounts": {}}
    return hosts, groups, {"ceph1": lambda **kw: block}


POOLS_OP = "Pools (ceph_pools and CephFS's; first monitor)"


def test_one_osd_host_puts_replicas_on_different_osds_by_its_own_rule(secret):
    hosts, groups, block = _one_host_three_osds()
    p = _plan(hosts, groups, secret, _facts(hosts, block=block))
    pools = p.op("ceph1", POOLS_OP).commands
    assert pools[0] == ("ceph --connect-timeout 60 osd crush rule create-replicated "
                        "aicluster-osd default osd")
    for pool, pg in (("rbd", 32), ("cephfs_metadata", 16), ("cephfs_data", 32)):
        assert (f"ceph --connect-timeout 60 osd pool create {pool} {pg} {pg} replicated "
                "aicluster-osd") in pools
    assert "osd_crush_chooseleaf_type = 0\n" in p.upload("ceph1", "/etc/ceph/ceph.conf")


def test_a_cluster_grown_to_three_osd_hosts_moves_its_pools_to_the_host_rule(secret):
    """Made with one OSD host (3 OSDs, size 3: rule aicluster-osd), then ceph2 and ceph3
    join as OSD hosts: the next deploy makes aicluster-host and sets it on every pool
    the deploy manages (size 3 stays); the deploy after that changes no pool."""
    hosts, groups, block = _one_host_three_osds()
    first = _plan(hosts, groups, secret, _facts(hosts, block=block))
    facts = _deployed(secret, hosts, groups, first)
    assert facts["ceph1"]["CephState"]["cluster"]["pools"]["rbd"]["crush_rule"] == \
        "aicluster-osd"
    grown = [*hosts[:1], _host("ceph2", 32, [{"device": D4}]),
             _host("ceph3", 33, [{"device": REAL}]), hosts[1]]
    grown_groups = {**groups, "ceph_osds": ["ceph1", "ceph2", "ceph3"]}
    facts.update(_facts([h for h in grown if h[0] in ("ceph2", "ceph3")],
                        block={"ceph3": _block(REAL)}))
    p = _plan(grown, grown_groups, secret, facts)
    ceph = "ceph --connect-timeout 60"
    assert p.op("ceph1", POOLS_OP).commands == [
        f"{ceph} osd crush rule create-replicated aicluster-host default host",
        f"{ceph} osd pool set rbd crush_rule aicluster-host",
        f"{ceph} osd pool set cephfs_metadata crush_rule aicluster-host",
        f"{ceph} osd pool set cephfs_data crush_rule aicluster-host",
    ]
    # Once moved, nothing more.
    moved = facts["ceph1"]["CephState"]["cluster"]
    moved["crush_rules"].append("aicluster-host")
    for pool in moved["pools"].values():
        pool["crush_rule"] = "aicluster-host"
    assert _plan(grown, grown_groups, secret, facts).op("ceph1", POOLS_OP).commands == []


def test_a_pool_set_to_another_rule_by_hand_is_set_back(secret):
    def change(facts):
        facts["ceph1"]["CephState"]["cluster"]["pools"]["rbd"]["crush_rule"] = \
            "replicated_rule"

    _, p = _re_run(secret, change)
    assert p.op("ceph1", POOLS_OP).commands == [
        "ceph --connect-timeout 60 osd pool set rbd crush_rule aicluster-host"]


# ---------------------------------------------------------------------------
# The managers' prometheus module: enabled, each manager on its own address
# ---------------------------------------------------------------------------


MGR_OP = "Manager modules and their options (prometheus; first monitor)"
MGR_WAIT = ("timeout 180 sh -c 'until ceph --connect-timeout 5 mgr stat -f json 2>/dev/null "
            "| grep -Eq \"\\\"available\\\": ?true\"; do sleep 2; done'")
SET = "ceph --connect-timeout 60 config set mgr"
MODULE = "ceph --connect-timeout 60 mgr module"


def test_a_first_deploy_binds_each_manager_to_its_address_then_enables_prometheus(secret):
    """Each manager (ceph1..3, one per monitor) gets its own server_addr, its host's
    address on the storage network (Ceph's public network here), the port once, and
    the module is enabled after them (it reads them when it starts), after the pools
    and CephFS, before the clients mount; every other host runs nothing for it."""
    hosts, groups = _three()
    p = _plan(hosts, groups, secret)
    assert p.op("ceph1", MGR_OP).commands == [
        MGR_WAIT,
        f"{SET} mgr/prometheus/ceph1/server_addr 10.30.0.31",
        f"{SET} mgr/prometheus/ceph2/server_addr 10.30.0.32",
        f"{SET} mgr/prometheus/ceph3/server_addr 10.30.0.33",
        f"{SET} mgr/prometheus/server_port 9283",
        f"{MODULE} enable prometheus",
    ]
    assert p.op("ceph1", MGR_OP).index > p.op(
        "ceph1", "CephFS (ceph fs new, an MDS active; first monitor)").index
    assert p.op("client1", "Mount CephFS at /mnt/cephfs").index > p.op("ceph1", MGR_OP).index
    for name in ("ceph2", "ceph3", "client1"):
        assert p.op(name, MGR_OP).commands == [], name


def test_a_re_run_whose_cluster_has_the_module_and_addresses_runs_nothing_for_it(secret):
    _, p = _re_run(secret)
    assert p.op("ceph1", MGR_OP).commands == []


def test_a_second_monitors_manager_gets_its_own_address_and_the_module_restarts(secret):
    """A cluster made with one monitor gains a second: only the new manager's address
    is set, and the running module is restarted (disabled, enabled) to bind it."""
    hosts, groups, block = _one_host_three_osds()
    first = _plan(hosts, groups, secret, _facts(hosts, block=block))
    assert f"{SET} mgr/prometheus/ceph1/server_addr 10.30.0.31" in first.op(
        "ceph1", MGR_OP).commands
    facts = _deployed(secret, hosts, groups, first)
    assert _plan(hosts, groups, secret, facts).op("ceph1", MGR_OP).commands == []
    grown = [*hosts[:1], _host("ceph2", 32), hosts[1]]
    grown_groups = {**groups, "ceph_mons": ["ceph1", "ceph2"]}
    facts.update(_facts([h for h in grown if h[0] == "ceph2"]))
    p = _plan(grown, grown_groups, secret, facts)
    assert p.op("ceph1", MGR_OP).commands == [
        MGR_WAIT,
        f"{SET} mgr/prometheus/ceph2/server_addr 10.30.0.32",
        f"{MODULE} disable prometheus",
        f"{MODULE} enable prometheus",
    ]
    assert p.op("ceph2", MGR_OP).commands == []


def test_a_changed_port_or_address_is_set_and_the_module_restarted(secret):
    def change(facts):
        config = facts["ceph1"]["CephState"]["cluster"]["mgr_config"]
        config["mgr/prometheus/ceph2/server_addr"] = "10.10.0.32"  # another network

    _, p = _re_run(secret, change)
    assert p.op("ceph1", MGR_OP).commands == [
        MGR_WAIT, f"{SET} mgr/prometheus/ceph2/server_addr 10.30.0.32",
        f"{MODULE} disable prometheus", f"{MODULE} enable prometheus"]
    hosts, groups = _three()
    facts = _deployed(secret, hosts, groups, _plan(hosts, groups, secret))
    p = _plan(hosts, groups, secret, facts, ceph_mgr_prometheus_port=9383)
    assert p.op("ceph1", MGR_OP).commands == [
        MGR_WAIT, f"{SET} mgr/prometheus/server_port 9383",
        f"{MODULE} disable prometheus", f"{MODULE} enable prometheus"]


def test_a_module_disabled_by_hand_is_enabled_again_without_a_restart(secret):
    def change(facts):
        facts["ceph1"]["CephState"]["cluster"]["mgr_modules"]["enabled"].remove("prometheus")

    _, p = _re_run(secret, change)
    assert p.op("ceph1", MGR_OP).commands == [MGR_WAIT, f"{MODULE} enable prometheus"]


def test_ceph_mgr_prometheus_false_leaves_the_module_alone(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret, ceph_mgr_prometheus=False)
    assert p.op("ceph1", MGR_OP).commands == []
    facts = _deployed(secret, hosts, groups, _plan(hosts, groups, secret))
    p = _plan(hosts, groups, secret, facts, ceph_mgr_prometheus=False)
    assert p.op("ceph1", MGR_OP).commands == []  # not disabled either


def test_the_ansible_filter_gives_the_same_manager_commands(secret):
    import runpy

    from aicluster import ROLES_DIR

    filters = runpy.run_path(str(ROLES_DIR / "ceph/filter_plugins/aicluster_ceph.py"))
    mgr = filters["FilterModule"]().filters()["aicluster_ceph_mgr_commands"]
    hosts, groups = _three()
    _, v, keys = _keys(secret, hosts, groups, "ceph1")
    decided = ceph_derive.decide(_block(D1)(), {"cluster": {"reachable": True, "mgr_modules": {
        "enabled": [], "always_on": ALWAYS_ON}, "mgr_config": {}}}, v["ceph_request"],
        keys["fsid"], keys["digests"], "bookworm")
    assert not decided["problems"]
    assert mgr(decided, 60) == ceph_derive.mgr_commands(decided, 60)
    assert mgr(decided, 60)[-1] == f"{MODULE} enable prometheus"


def test_the_fact_reads_the_managers_modules_and_options(tmp_path):
    """The fact's own program against a stand-in `ceph` answering as Ceph's monitors do
    (the JSON of MgrMonitor's `mgr module ls` and KVMonitor's `config-key dump`), with
    ceph.conf and the admin keyring in a temporary directory."""
    import json
    import os
    import subprocess

    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "ceph.conf").write_text("[global]\n")
    (etc / "ceph.client.admin.keyring").write_text("")
    modules = {"always_on_modules": ALWAYS_ON, "enabled_modules": ["iostat", "prometheus"],
               "disabled_modules": [{"name": "alerts", "can_run": True, "error_string": "",
                                     "module_options": {}}]}
    keys = {"config/mgr/mgr/prometheus/ceph1/server_addr": "10.30.0.31",
            "config/mgr/mgr/prometheus/server_port": "9283"}
    answers = {"auth ls": {"auth_dump": []}, "mgr module ls": modules,
               "config-key dump config/mgr/mgr/prometheus/": keys}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cases = "\n".join(f"  *' {k} '*) cat <<'EOF'\n{json.dumps(v)}\nEOF\n  ;;"
                      for k, v in answers.items())
    (bin_dir / "ceph").write_text(f'#!/bin/sh\ncase " $* " in\n{cases}\n  *) exit 2 ;;\nesac\n')
    (bin_dir / "ceph").chmod(0o755)
    program = ceph_probe.PROGRAM.replace("/etc/ceph/", f"{etc}/")
    request = ceph_probe.request_text({"host": "ceph1", "mode": "raw", "devices": [],
                                       "cluster": True, "mount": "", "timeout": 5})
    out = subprocess.run(["python3", "-c", program, request], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    cluster = ceph_probe.parse(out.stdout.splitlines())["cluster"]
    assert cluster["mgr_modules"] == {"enabled": ["iostat", "prometheus"],
                                      "always_on": sorted(ALWAYS_ON)}
    assert cluster["mgr_config"] == {"mgr/prometheus/ceph1/server_addr": "10.30.0.31",
                                     "mgr/prometheus/server_port": "9283"}


# ---------------------------------------------------------------------------
# Golden renders (the lab inventory) and the fact
# ---------------------------------------------------------------------------


def test_golden_ceph_conf_and_osd_files_for_the_lab():
    from aicluster import PROJECT_ROOT
    from aicluster.common.settings import template_vars
    from aicluster.inventory import load_cluster

    cluster = load_cluster(PROJECT_ROOT / "inventories" / "lab.py")
    v = template_vars("ceph", cluster, "storage1", cluster.hosts["storage1"].data, "Debian")
    v["ceph_fsid"] = FIXED_FSID  # derived from the cluster's secret at deploy time
    v["ceph_repo_suite"] = "bookworm"  # read from the node (Debian 12) at deploy time
    assert_golden(GOLDEN / "ceph.conf", render("ceph", "ceph.conf.j2", v))
    # The lab's mirror of Ceph's repository: the apt source and the pin.
    assert_golden(GOLDEN / "aicluster-ceph.list", render("ceph", "aicluster-ceph.list.j2", v))
    assert_golden(GOLDEN / "aicluster-ceph.pref", render("ceph", "aicluster-ceph.pref.j2", v))
    rocky = template_vars("ceph", cluster, "storage1", cluster.hosts["storage1"].data, "RedHat")
    rocky["ceph_repo_suite"] = "el9"
    assert_golden(GOLDEN / "aicluster-ceph.repo", render("ceph", "aicluster-ceph.repo.j2", rocky))
    assert_golden(GOLDEN / "aicluster-osd-devices", render("ceph", "aicluster-osd-devices.j2", v))
    assert_golden(GOLDEN / "aicluster-ceph-osd", render("ceph", "aicluster-ceph-osd.j2", v))
    assert_golden(GOLDEN / "aicluster-ceph-osds.service",
                  render("ceph", "aicluster-ceph-osds.service.j2", v))
    head = ceph_derive.derived_vars(cluster, "gpu1", cluster.hosts["gpu1"].data)
    assert_golden(GOLDEN / "fstab", head["ceph_fstab_line"] + "\n")


def test_the_fact_reads_json_and_prints_no_key():
    text = ceph_probe.command_text(ceph_probe.request_text(
        {"host": "n1", "mode": "raw", "devices": [D1], "cluster": True, "mount": "/mnt/cephfs",
         "timeout": 60}))
    assert text.startswith("python3 -c ")
    assert "hashlib.sha256(e.get(\"key\", \"\").encode()).hexdigest()" in ceph_probe.PROGRAM
    parsed = ceph_probe.parse(["noise", '@@ceph {"mon": true, "osds": {}, "mounted": null, '
                                       '"cluster": {"reachable": false}}'])
    assert parsed["mon"] is True and parsed["cluster"] == {"reachable": False}
    assert ceph_probe.parse(["nothing"])["mon"] is False


def test_the_fact_program_runs_on_a_machine_without_ceph(tmp_path):
    import subprocess

    text = ceph_probe.command_text(ceph_probe.request_text(
        {"host": "nohost", "mode": "raw", "devices": [str(tmp_path / "none")], "cluster": True,
         "mount": str(tmp_path), "timeout": 5}))
    out = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    parsed = ceph_probe.parse(out.stdout.splitlines())
    assert parsed["mon"] is False and parsed["osds"] == {str(tmp_path / "none"): None}


# ---------------------------------------------------------------------------
# Validation: host and field named, before any host is touched
# ---------------------------------------------------------------------------


def _errors(hosts, groups, secret, **extra) -> str:
    with pytest.raises(InventoryError) as exc:
        validate({n: (tuple(g for g, m in groups.items() if n in m),
                      {**_cluster_data(secret, **extra), **d}) for n, d in hosts})
    return str(exc.value)


@pytest.mark.parametrize("devices, needle", [
    ([{"device": "sdb"}], "ceph_osd_devices[0].device: 'sdb' is not a block device path"),
    (["/dev/../sdb"], "ceph_osd_devices[0].device: '/dev/../sdb' is not a block device path"),
    ([{"device": D2}, D2], f"ceph_osd_devices: [1]: {D2} is listed twice (also [0])"),
    ([{"device": D2, "wipe": "yes"}],
     "ceph_osd_devices[0].wipe: Input should be a valid boolean (got 'yes')"),
    ([{"device": D2, "size": 1}], "ceph_osd_devices[0].size: Extra inputs are not permitted"),
    ([{"wipe": True}], "ceph_osd_devices[0].device: Field required"),
    ([], "ceph_osd_devices: the host is in ceph_osds but names no device"),
])
def test_bad_osd_devices_are_rejected(secret, devices, needle):
    hosts, groups = _three()
    hosts[1] = _host("ceph2", 32, devices)
    text = _errors(hosts, groups, secret)
    assert "problem(s)):\n  - host 'ceph2': " + needle in text and text.count("\n") == 1, text


def test_osd_devices_on_a_host_not_in_ceph_osds_are_rejected(secret):
    hosts, groups = _three()
    hosts[3] = _host("client1", 41, [{"device": D4}])
    text = _errors(hosts, groups, secret)
    assert "host 'client1': ceph_osd_devices: is set but the host is not in ceph_osds" in text


def test_a_pool_larger_than_the_osds_is_rejected(secret):
    hosts, groups = _three()
    text = _errors(hosts, groups, secret, ceph_pools=[{"name": "big", "size": 4}])
    assert "host 'ceph1': ceph_pools[0].size: 4 replicas need 4 OSDs" in text, text
    text = _errors(hosts, groups, secret, ceph_pool_default_size=4)
    assert "host 'ceph1': ceph_pool_default_size: 4 replicas need 4 OSDs" in text, text


def test_a_pool_named_as_a_cephfs_pool_is_rejected(secret):
    hosts, groups = _three()
    text = _errors(hosts, groups, secret, ceph_pools=[{"name": "cephfs_data"}])
    assert "host 'ceph1': ceph_pools[0].name: cephfs_data is the CephFS pool" in text, text


def test_one_pool_for_cephfs_data_and_metadata_is_rejected(secret):
    hosts, groups = _three()
    text = _errors(hosts, groups, secret, ceph_cephfs_data_pool="fs",
                   ceph_cephfs_metadata_pool="fs")
    assert "host 'ceph1': ceph_cephfs_data_pool: is the metadata pool too" in text, text


#: Cluster-wide settings (group data, so every host reports them: once, naming the
#: others) refused by the settings model (model.py), each with its one message.
BAD_SETTINGS = [
    ({"ceph_network": "backend"},
     "ceph_network: Input should be '', 'management', 'fabric', 'storage' or 'ib' "
     "(got 'backend')"),
    ({"ceph_fsid": "not-a-uuid"}, "ceph_fsid: 'not-a-uuid' is not a UUID"),
    ({"ceph_keys_name": "Ceph Key"}, "ceph_keys_name: String should match pattern"),
    ({"ceph_keys_bytes": 8}, "ceph_keys_bytes: Input should be greater than or equal to 32"),
    ({"ceph_msgr2": "yes"}, "ceph_msgr2: Input should be a valid boolean (got 'yes')"),
    ({"ceph_osd_mode": "zfs"}, "ceph_osd_mode: Input should be 'raw' or 'lvm' (got 'zfs')"),
    ({"ceph_pools": [{"name": "bad pg"}]}, "ceph_pools[0].name: String should match pattern"),
    ({"ceph_pools": [{"name": "p", "pg_num": 12}]},
     "ceph_pools[0].pg_num: 12 is not a power of two"),
    ({"ceph_pools": [{"name": "p", "pg_num": "32"}]},
     "ceph_pools[0].pg_num: Input should be a valid integer (got '32')"),
    ({"ceph_pools": [{"name": "p", "size": 11}]},
     "ceph_pools[0].size: Input should be less than or equal to 10"),
    ({"ceph_pools": [{"name": "p", "size": 2, "min_size": 3}]},
     "ceph_pools[0]: min_size 3 is more than the pool's size 2"),
    ({"ceph_pools": [{"name": "p", "application": "RBD"}]},
     "ceph_pools[0].application: String should match pattern"),
    ({"ceph_pools": [{"name": "p", "replicas": 3}]},
     "ceph_pools[0].replicas: Extra inputs are not permitted"),
    ({"ceph_pools": [{"name": "p"}, {"name": "p"}]}, "ceph_pools: [1]: p is listed twice"),
    ({"ceph_pool_default_size": 0},
     "ceph_pool_default_size: Input should be greater than or equal to 1"),
    ({"ceph_failure_domain": "rack"},
     "ceph_failure_domain: Input should be '', 'host' or 'osd' (got 'rack')"),
    ({"ceph_pool_default_pg_num": 48}, "ceph_pool_default_pg_num: 48 is not a power of two"),
    ({"ceph_cephfs_name": "my fs"}, "ceph_cephfs_name: String should match pattern"),
    ({"ceph_cephfs_metadata_pg_num": 0},
     "ceph_cephfs_metadata_pg_num: Input should be greater than or equal to 1"),
    ({"ceph_client_name": "admin"}, "ceph_client_name: 'admin' is not a client name of ours"),
    ({"ceph_client_pools": "rbd"}, "ceph_client_pools: Input should be a valid list"),
    ({"ceph_cephfs_mount": "cephfs"}, "ceph_cephfs_mount: 'cephfs' is not an absolute path"),
    ({"ceph_cephfs_mount_type": "nfs"},
     "ceph_cephfs_mount_type: Input should be 'fuse' or 'kernel' (got 'nfs')"),
    ({"ceph_config": {"global": {"fsid": "x"}}},
     "ceph_config.global: fsid: is computed from the inventory; set it through the ceph_* "
     "settings instead"),
    ({"ceph_config": {"nosuch": {"a": 1}}},
     "ceph_config: nosuch: not a ceph.conf section (global, mon, mgr, osd, mds, client[.NAME])"),
    ({"ceph_config": {"osd": {"Osd-Memory": 1}}},
     "ceph_config.osd: 'Osd-Memory' is not an option name"),
    ({"ceph_config": {"osd": {"osd_memory_target": [1, 2]}}},
     "ceph_config.osd: osd_memory_target: [1, 2] is not a single value"),
    ({"ceph_command_timeout": "60"},
     "ceph_command_timeout: Input should be a valid integer (got '60')"),
    ({"ceph_pool": []}, "ceph_pool: not a ceph setting; did you mean ceph_pools?"),
    ({"ceph_release": "nautilus"},
     "ceph_release: Input should be 'pacific', 'quincy', 'reef', 'squid', 'tentacle' or "
     "'umbrella' (got 'nautilus')"),
    ({"ceph_source": "pip"},
     "ceph_source: Input should be 'ceph_repo' or 'distribution' (got 'pip')"),
    ({"ceph_repo_url": "mirror.example.org/ceph"},
     "ceph_repo_url: String should match pattern '^((https?|file)://\\S+)?$' "
     "(got 'mirror.example.org/ceph')"),
    ({"ceph_repo_url": ""},
     "ceph_repo_url: not set; with ceph_source 'ceph_repo' give the URL of Ceph's "
     "repository or of your site's mirror of it"),
    ({"ceph_repo_builds": {"nautilus": ["bookworm"]}},
     "ceph_repo_builds.nautilus: Input should be 'pacific', 'quincy', 'reef', 'squid', "
     "'tentacle' or 'umbrella' (got 'nautilus')"),
]


@pytest.mark.parametrize("settings, needle", BAD_SETTINGS, ids=[
    f"{next(iter(s))}-{i}" for i, (s, _) in enumerate(BAD_SETTINGS)])
def test_bad_settings_are_refused_naming_host_and_field(secret, settings, needle):
    hosts, groups = _three()
    text = _errors(hosts, groups, secret, **settings)
    assert "problem(s)):\n  - host 'ceph1': " + needle in text, text
    assert text.count("\n") == 1 and "(and on 3 more host(s)" in text, text


def test_a_host_pinned_to_another_release_is_rejected(secret):
    hosts, groups = _three()
    hosts[2] = _host("ceph3", 33, [{"device": D3}], ceph_release="squid")
    text = _errors(hosts, groups, secret)
    assert ("host 'ceph3': ceph_release: 'squid' differs from 'tentacle' on host 'ceph1'; it "
            "must be the same on every Ceph host") in text, text
    assert text.count("\n") == 1, text


def test_the_distribution_needs_no_repository_url(secret):
    hosts, groups = _three()
    cluster = validate({n: (tuple(g for g, m in groups.items() if n in m),
                            {**_cluster_data(secret, ceph_source="distribution",
                                             ceph_release="pacific", ceph_repo_url=""), **d})
                        for n, d in hosts})
    assert "ceph1" in cluster.hosts


def test_a_client_mount_without_an_mds_is_rejected(secret):
    hosts, groups = _three()
    groups["ceph_mds"] = []
    text = _errors(hosts, groups, secret)
    assert "host 'client1': ceph_cephfs_mount: CephFS needs an MDS" in text, text


def test_osd_hosts_without_monitors_and_unknown_networks_are_rejected(secret):
    hosts, groups = _three()
    text = _errors(hosts, {**groups, "ceph_mons": []}, secret)
    assert "needs at least one ceph_mons host" in text, text
    text = _errors(hosts, groups, secret, ceph_network="ib")
    assert "ceph_network: 'ib' is not a declared network" in text, text
    hosts[3] = ("client1", {"ssh_hostname": "10.10.0.41"})  # no storage address
    text = _errors(hosts, groups, secret, ceph_network="storage")
    assert "host 'client1': ceph_network: has no address on the storage network" in text


def test_an_undeclared_cluster_network_and_hosts_without_an_address_are_rejected(secret):
    hosts, groups = _three()
    text = _errors(hosts, groups, secret, ceph_cluster_network="fabric")
    assert "ceph_cluster_network: 'fabric' is not a declared network" in text, text


def test_a_device_that_is_also_the_nvme_cache_is_rejected(secret):
    hosts, groups = _three()
    name, data = hosts[1]
    data["hardware"]["nvme"] = [{"device": D2}]
    data["nvme_cache_devices"] = [D2]
    text = _errors(hosts, groups, secret)
    assert f"host 'ceph2': ceph_osd_devices[0].device: {D2} is also the host's NVMe cache" \
        in text, text
