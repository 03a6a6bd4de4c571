"""The ceph deploy planned on fake hosts: the first monitor's bootstrap (monmap, mkfs,
quorum, keys), managers, OSDs on named empty devices only (the disk-safety rule: a
device holding data is refused with nothing planned unless wipe, never when mounted),
a device holding an OSD of this cluster left as it is, pools and CephFS on the first
monitor, client mounts after CephFS exists; a second run plans no change; Ubuntu and
Rocky package plans; an OSD host added later touches only itself.

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
    assert "ceph --connect-timeout 60 osd pool create rbd 32 32 replicated" in pools
    assert "ceph --connect-timeout 60 osd pool set rbd size 3" in pools
    assert "ceph --connect-timeout 60 osd pool application enable rbd rbd" in pools
    assert "ceph --connect-timeout 60 osd pool create cephfs_metadata 16 16 replicated" in pools
    fs = p.op("ceph1", "CephFS (ceph fs new, an MDS active; first monitor)")
    assert "fs new cephfs cephfs_metadata cephfs_data" in fs.commands[0]
    assert fs.index > at("ceph1", "Pools (ceph_pools and CephFS's; first monitor)")
    assert at("client1", "Mount CephFS at /mnt/cephfs") > fs.index
    assert "none /mnt/cephfs fuse.ceph ceph.id=aicluster,ceph.conf=/etc/ceph/ceph.conf," \
        "_netdev,defaults 0 0" in p.op("client1", "Mount CephFS at /mnt/cephfs at boot "
                                                  "(fstab, _netdev)").text


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
        if r["first_mon"]:
            pools = {pp["name"]: {"size": pp["size"], "min_size": pp["min_size"], "pg_num": 8,
                                  "applications": [pp["application"] or "cephfs"]}
                     for pp in v["ceph_request"]["pools"]}
            cluster_state = {"reachable": True, "pools": pools,
                             "fs": {"cephfs": {}} if v["ceph_cephfs"] else {},
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
            secret_file = "keyring" in path or path.endswith(".secret")
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
                "ceph-common", "ceph-mon", "ceph-mgr", "ceph-osd", "udev", "ceph-mds",
                "ceph-fuse")},
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


@pytest.mark.parametrize("distro", ["ubuntu2204", "ubuntu2404"])
def test_ubuntu_installs_ceph_volume_beside_the_osd(secret, distro):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret, _facts(hosts, distro))
    install = p.op("ceph2", "Install Ceph").text
    assert "apt-get" in install and "ceph-osd udev ceph-volume" in install
    assert "ceph-fuse" in p.op("client1", "Install Ceph").text


def test_rocky_adds_the_storage_sigs_repository_first(secret):
    hosts, groups = _three()
    p = _plan(hosts, groups, secret, _facts(hosts, "rocky9"))
    names = p.names("ceph1")
    repo = "Ceph's repository (release package)"
    assert "centos-release-ceph-reef" in p.op("ceph1", repo).text
    assert names.index(repo) < names.index("Install Ceph")
    install = p.op("ceph1", "Install Ceph").text
    assert "dnf" in install and "ceph-mon" in install and "ceph-volume" in install


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
    line = p.op("client1", "Mount CephFS at /mnt/cephfs at boot (fstab, _netdev)").text
    assert ":/ /mnt/cephfs ceph name=aicluster,secretfile=/etc/ceph/ceph.client.aicluster." \
        "secret,_netdev,noatime 0 0" in line
    assert "ceph-fuse" not in p.op("client1", "Install Ceph").text


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
    assert_golden(GOLDEN / "ceph.conf", render("ceph", "ceph.conf.j2", v))
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
]


@pytest.mark.parametrize("settings, needle", BAD_SETTINGS, ids=[
    f"{next(iter(s))}-{i}" for i, (s, _) in enumerate(BAD_SETTINGS)])
def test_bad_settings_are_refused_naming_host_and_field(secret, settings, needle):
    hosts, groups = _three()
    text = _errors(hosts, groups, secret, **settings)
    assert "problem(s)):\n  - host 'ceph1': " + needle in text, text
    assert text.count("\n") == 1 and "(and on 3 more host(s)" in text, text


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
