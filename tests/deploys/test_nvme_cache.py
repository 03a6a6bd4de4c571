"""The nvme_cache deploy planned on fake hosts: one drive (XFS), several (md RAID0, then
XFS: proven here only, the testbed has no md driver), and the rule above all: a drive
holding data is refused (nothing planned) unless the inventory sets wipe, and never
when it is mounted or holds /.

Fake hosts: no host is contacted; the BlockDevices fact comes from fixtures shaped as
aicluster.common.disks.parse returns it (tests/deploys/harness.py).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from pyinfra.api.exceptions import PyinfraError

from aicluster.common.disks import check_devices, parse, root_disks
from aicluster.components.nvme_cache import deploy as nvme_cache
from aicluster.components.nvme_cache import derive as nvme_cache_derive
from aicluster.inventory import InventoryError, validate
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan
from tests.golden import GOLDEN_DIR, assert_golden

GOLDEN = GOLDEN_DIR / "nvme_cache"
A = "/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S6GW10001"
B = "/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S6GW10002"
FSTAB = "/etc/fstab"
APT_STAMP = "/var/lib/apt/periodic/update-success-stamp"
NOW = datetime(2026, 1, 1, 12, 0)
MDADM_CONF = {
    "debian12": "/etc/mdadm/mdadm.conf.d/aicluster-nvme-cache.conf",
    "rocky9": "/etc/mdadm.conf.d/aicluster-nvme-cache.conf",
}
CLUSTER = {
    "cluster_name": "demo",
    "networks": {"management": {"subnet": "10.10.0.0/24"}},
    # The hosts are gpu_nodes, so the whole inventory must pass the nvidia checks too.
    "nvidia_source": "distribution",
}
REAL = {A: "/dev/nvme1n1", B: "/dev/nvme2n1"}


def _gpu(name: str, n: int, nvme: list[dict], **data) -> tuple[str, dict]:
    return (
        name,
        {
            "ssh_hostname": f"10.10.0.{n}",
            "hardware": {
                "gpus": {"model": "H100-SXM5-80GB", "count": 8, "memory_gb": 80},
                "nvme": nvme,
            },
            **data,
        },
    )


def _disk(path: str, children=(), mountpoints=(None,), kind="disk") -> dict:
    return {"name": path.rsplit("/", 1)[1], "kname": path.rsplit("/", 1)[1], "path": path,
            "type": kind, "mountpoints": list(mountpoints), "children": list(children)}


#: The system disk: / on nvme0n1p2.
SYSTEM = _disk("/dev/nvme0n1", [_disk("/dev/nvme0n1p1", mountpoints=["/boot/efi"], kind="part"),
                                _disk("/dev/nvme0n1p2", mountpoints=["/"], kind="part")])


def _record(real: str, signatures=(), holders=(), exists=True) -> dict:
    return {"real": real, "exists": exists, "block": True if exists else None,
            "holders": list(holders), "signatures": list(signatures), "wipefs_error": "",
            "blkid": {}}


def _sig(kind: str, label: str = "", uuid: str = "") -> dict:
    return {"type": kind, "offset": "0x0", "label": label, "uuid": uuid}


def _fact(devices: dict, tree: list | None = None, mounts: dict | None = None):
    """A BlockDevices fact: ``devices`` maps an inventory path to its record."""
    value = {
        "lsblk": [SYSTEM, *(tree if tree is not None else
                            [_disk(r["real"]) for r in devices.values() if r["exists"]])],
        "devices": devices,
        "mounts": mounts or {"/mnt/nvme-cache": None},
    }
    return lambda **kw: value


def _plan(hosts, facts, distro="debian12", groups=None, extra=None):
    host_facts = {}
    for name, _ in hosts:
        host_facts[name] = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "Os": "Linux",
            "Which": lambda command, **kw: f"/usr/sbin/{command}",
            **facts.get(name, {}),
        }
    groups = groups if groups is not None else {"gpu_nodes": [n for n, _ in hosts]}
    return plan(hosts, groups, {**CLUSTER, **(extra or {})}, host_facts, nvme_cache.deploy)


def _empty(*paths) -> dict:
    return {p: _record(REAL[p]) for p in paths}


# ---------------------------------------------------------------------------
# One drive, several drives
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("distro", sorted(DISTRIBUTIONS))
def test_one_empty_drive_becomes_xfs_mounted_by_uuid_with_nofail(distro):
    hosts = [_gpu("gpu1", 21, [{"device": A}])]
    p = _plan(hosts, {"gpu1": {"BlockDevices": _fact(_empty(A))}}, distro)
    uuid = nvme_cache_derive.fs_uuid(nvme_cache_cluster(hosts), "gpu1", [A])
    install = p.op("gpu1", "Install the NVMe cache's tools").text
    assert "xfsprogs" in install and "mdadm" not in install
    mkfs = p.op("gpu1", f"Make the cache's XFS on {A}").text
    assert mkfs == f"mkfs.xfs -q -L nvme-cache -m uuid={uuid} {A}"
    assert " -f" not in mkfs  # mkfs.xfs refuses a drive with a signature after all
    fstab = p.op("gpu1", "Mount the cache at /mnt/nvme-cache by UUID at boot (fstab, nofail)")
    line = f"UUID={uuid} /mnt/nvme-cache xfs noatime,nofail 0 0"
    assert fstab.text == f"echo '{line}' >> {FSTAB}"
    assert_golden(GOLDEN / "fstab-line.single", line + "\n")
    mount = p.op("gpu1", "Mount the cache at /mnt/nvme-cache").text
    assert mount.startswith("out=$(mount /mnt/nvme-cache 2>&1)"), mount
    assert "--mountpoint /mnt/nvme-cache" in mount and "' xfs '" in mount, mount
    assert not any("mdadm" in n or "RAID" in n for n in p.names("gpu1"))
    # Formatting comes after the tools, and the mount after the fstab line.
    names = p.names("gpu1")
    assert names.index("Install the NVMe cache's tools") < names.index(
        f"Make the cache's XFS on {A}") < names.index(
        "Mount the cache at /mnt/nvme-cache by UUID at boot (fstab, nofail)") < names.index(
        "Mount the cache at /mnt/nvme-cache")


def nvme_cache_cluster(hosts, groups=None):
    hostmap = {name: (("gpu_nodes",) if groups is None else tuple(
        g for g, m in groups.items() if name in m), {**CLUSTER, **data})
        for name, data in hosts}
    return validate(hostmap)


@pytest.mark.parametrize("distro", ["debian12", "rocky9"])
def test_several_drives_are_planned_as_raid0_recorded_in_mdadm_conf(distro):
    hosts = [_gpu("gpu1", 21, [{"device": A}, {"device": B}])]
    devices = {**_empty(A, B), "/dev/md/aicluster-nvme-cache": _record("", exists=False)}
    p = _plan(hosts, {"gpu1": {"BlockDevices": _fact(devices)}}, distro)
    assert "mdadm" in p.op("gpu1", "Install the NVMe cache's tools").text
    create = p.op("gpu1", "Create the RAID0 /dev/md/aicluster-nvme-cache of 2 drives").text
    assert create == (
        "mdadm --create /dev/md/aicluster-nvme-cache --run --metadata=1.2 --level=0 "
        f"--chunk=512 --raid-devices=2 --homehost=gpu1 --name=aicluster-nvme-cache {A} {B}"
    )
    conf = p.upload("gpu1", MDADM_CONF[distro])
    assert_golden(GOLDEN / "aicluster-nvme-cache.conf", conf)
    initramfs = p.op("gpu1", "Rebuild the initramfs (it carries mdadm's configuration)")
    assert initramfs.runs, "mdadm's record is new: the initramfs is rebuilt"
    assert initramfs.text == ("dracut -f" if distro == "rocky9" else "update-initramfs -u")
    mkfs = p.op("gpu1", "Make the cache's XFS on /dev/md/aicluster-nvme-cache").text
    assert mkfs.endswith(" /dev/md/aicluster-nvme-cache")
    names = p.names("gpu1")
    assert names.index("Create the RAID0 /dev/md/aicluster-nvme-cache of 2 drives") < \
        names.index("Make the cache's XFS on /dev/md/aicluster-nvme-cache")
    if distro == "rocky9":
        assert "touch /etc/mdadm.conf" in p.commands("gpu1")
    uuid = nvme_cache_derive.fs_uuid(nvme_cache_cluster(hosts), "gpu1", [A, B])
    line = f"UUID={uuid} /mnt/nvme-cache xfs noatime,nofail 0 0"
    assert line in p.op("gpu1",
                        "Mount the cache at /mnt/nvme-cache by UUID at boot (fstab, nofail)").text
    assert_golden(GOLDEN / "fstab-line.raid0", line + "\n")


def test_an_assembled_raid_with_the_cache_xfs_is_left_as_it_is():
    hosts = [_gpu("gpu1", 21, [{"device": A}, {"device": B}])]
    member = _sig("linux_raid_member", "gpu1:aicluster-nvme-cache")
    md = _disk("/dev/md127", mountpoints=["/mnt/nvme-cache"], kind="raid0")
    devices = {
        A: _record(REAL[A], [member], holders=["md127"]),
        B: _record(REAL[B], [member], holders=["md127"]),
        "/dev/md/aicluster-nvme-cache": _record("/dev/md127", [
            _sig("xfs", "nvme-cache", "11111111-2222-3333-4444-555555555555")]),
    }
    tree = [_disk(REAL[A], [md]), _disk(REAL[B], [md])]
    mounts = {"/mnt/nvme-cache": {"source": "/dev/md127", "fstype": "xfs"}}
    p = _plan(hosts, {"gpu1": {"BlockDevices": _fact(devices, tree, mounts)}})
    names = p.names("gpu1")
    assert not any(n.startswith(("Create the RAID0", "Assemble", "Make the cache's XFS",
                                 "Wipe", "Mount the cache at /mnt/nvme-cache")) and
                   n != "Mount the cache at /mnt/nvme-cache by UUID at boot (fstab, nofail)"
                   for n in names), names
    fstab = p.op("gpu1", "Mount the cache at /mnt/nvme-cache by UUID at boot (fstab, nofail)")
    assert "UUID=11111111-2222-3333-4444-555555555555 " in fstab.text


def test_raid_members_not_assembled_are_assembled_not_recreated():
    hosts = [_gpu("gpu1", 21, [{"device": A}, {"device": B}])]
    member = _sig("linux_raid_member", "gpu1:aicluster-nvme-cache")
    devices = {A: _record(REAL[A], [member]), B: _record(REAL[B], [member]),
               "/dev/md/aicluster-nvme-cache": _record("", exists=False)}
    p = _plan(hosts, {"gpu1": {"BlockDevices": _fact(devices)}})
    assert p.op("gpu1", "Assemble the RAID0 /dev/md/aicluster-nvme-cache").text == (
        f"mdadm --assemble /dev/md/aicluster-nvme-cache {A} {B}"
    )
    assert not any(n.startswith(("Create the RAID0", "Make the cache's XFS"))
                   for n in p.names("gpu1"))


# ---------------------------------------------------------------------------
# No data is lost
# ---------------------------------------------------------------------------


def _two_hosts(gpu1_nvme, gpu1_devices, tree=None, mounts=None):
    """gpu1 as given, gpu2 with one empty drive (it must go on when gpu1 is stopped).
    gpu2 comes first: the harness activates hosts one by one, as they are planned."""
    hosts = [_gpu("gpu2", 22, [{"device": A}]), _gpu("gpu1", 21, gpu1_nvme)]
    facts = {"gpu1": {"BlockDevices": _fact(gpu1_devices, tree, mounts)},
             "gpu2": {"BlockDevices": _fact(_empty(A))}}
    return _plan(hosts, facts)


def _refused(caplog, p, *needles):
    assert p.ops["gpu1"] == [], p.names("gpu1")  # nothing planned on gpu1 at all
    assert f"Make the cache's XFS on {A}" in p.names("gpu2")  # gpu2 goes on
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    text = "\n".join(errors)
    assert "host 'gpu1': nvme_cache:" in text, text
    for needle in needles:
        assert needle in text, text
    return text


def test_a_drive_with_a_filesystem_is_refused_and_nothing_is_planned(caplog):
    devices = {A: _record(REAL[A], [_sig("ext4", "data")])}
    p = _two_hosts([{"device": A}], devices)
    text = _refused(caplog, p, A, "/dev/nvme1n1", "ext4 (label 'data')", "wipe: true")
    assert "nothing is changed" in text


def test_the_same_drive_with_wipe_is_wiped_then_formatted():
    devices = {A: _record(REAL[A], [_sig("ext4", "data")])}
    p = _two_hosts([{"device": A, "wipe": True}], devices)
    names = p.names("gpu1")
    wipe = f"Wipe the signatures on {A} (wipe: true in the inventory)"
    assert p.op("gpu1", wipe).text == f"wipefs -a {A}"
    assert names.index(wipe) < names.index(f"Make the cache's XFS on {A}")


def test_a_mounted_drive_with_wipe_is_refused(caplog):
    devices = {A: _record(REAL[A], [_sig("ext4", "data")])}
    tree = [_disk(REAL[A], mountpoints=["/data"])]
    p = _two_hosts([{"device": A, "wipe": True}], devices, tree)
    _refused(caplog, p, A, "is mounted at /data", "never wiped, even with wipe: true")


def test_a_drive_with_a_mounted_partition_is_refused_even_with_wipe(caplog):
    devices = {A: _record(REAL[A], [_sig("gpt"), _sig("PMBR")])}
    tree = [_disk(REAL[A], [_disk("/dev/nvme1n1p1", mountpoints=["/scratch"], kind="part")])]
    p = _two_hosts([{"device": A, "wipe": True}], devices, tree)
    _refused(caplog, p, "a gpt partition table", "partition(s) /dev/nvme1n1p1",
             "mounted at /scratch")


def test_a_partitioned_drive_is_refused_naming_the_partitions(caplog):
    devices = {A: _record(REAL[A], [_sig("gpt")])}
    tree = [_disk(REAL[A], [_disk("/dev/nvme1n1p1", kind="part")])]
    p = _two_hosts([{"device": A}], devices, tree)
    _refused(caplog, p, "a gpt partition table", "partition(s) /dev/nvme1n1p1")


def test_raid_lvm_and_ceph_labels_are_refused(caplog):
    for kind in ("linux_raid_member", "LVM2_member", "ceph_bluestore"):
        caplog.clear()
        devices = {A: _record(REAL[A], [_sig(kind)])}
        _refused(caplog, _two_hosts([{"device": A}], devices), kind)


def test_a_drive_in_use_by_an_array_is_refused_even_with_wipe(caplog):
    devices = {A: _record(REAL[A], [_sig("linux_raid_member", "other:md0")],
                          holders=["md0"])}
    _refused(caplog, _two_hosts([{"device": A, "wipe": True}], devices),
             "is in use by md0")


def test_the_system_disk_is_never_touched_even_with_wipe(caplog):
    devices = {A: _record("/dev/nvme0n1", [_sig("gpt")])}
    p = _two_hosts([{"device": A, "wipe": True}], devices, tree=[])
    _refused(caplog, p, "holds / (the system disk)")


def test_a_missing_drive_is_refused(caplog):
    devices = {A: _record(REAL[A], exists=False)}
    _refused(caplog, _two_hosts([{"device": A}], devices, tree=[]), "does not exist")


def test_unreadable_signatures_are_refused(caplog):
    rec = _record(REAL[A])
    rec.update(signatures=None, wipefs_error="wipefs: /dev/nvme1n1: probing failed")
    _refused(caplog, _two_hosts([{"device": A}], {A: rec}), "cannot read its signatures")


def test_one_bad_drive_of_several_stops_the_whole_array(caplog):
    devices = {**_empty(A), B: _record(REAL[B], [_sig("xfs", "models")]),
               "/dev/md/aicluster-nvme-cache": _record("", exists=False)}
    p = _two_hosts([{"device": A}, {"device": B}], devices)
    _refused(caplog, p, B, "xfs (label 'models')")


def test_a_single_drive_cache_is_not_rebuilt_as_raid_without_wipe(caplog):
    ours = _sig("xfs", "nvme-cache", "11111111-2222-3333-4444-555555555555")
    devices = {A: _record(REAL[A], [ours]), **_empty(B),
               "/dev/md/aicluster-nvme-cache": _record("", exists=False)}
    _refused(caplog, _two_hosts([{"device": A}, {"device": B}], devices),
             "xfs (label 'nvme-cache')")


def test_something_else_mounted_at_the_cache_path_is_refused(caplog):
    mounts = {"/mnt/nvme-cache": {"source": "tmpfs", "fstype": "tmpfs"}}
    p = _two_hosts([{"device": A}], _empty(A), mounts=mounts)
    _refused(caplog, p, "/mnt/nvme-cache already has tmpfs (tmpfs) mounted")


def test_a_single_refused_host_stops_the_run():
    hosts = [_gpu("gpu1", 21, [{"device": A}])]
    devices = {A: _record(REAL[A], [_sig("ext4")])}
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        _plan(hosts, {"gpu1": {"BlockDevices": _fact(devices)}})


# ---------------------------------------------------------------------------
# A second run, directories, environment, FS-Cache
# ---------------------------------------------------------------------------


def test_a_deployed_cache_plans_no_change():
    hosts = [_gpu("gpu1", 21, [{"device": A}])]
    uuid = "11111111-2222-3333-4444-555555555555"
    devices = {A: _record(REAL[A], [_sig("xfs", "nvme-cache", uuid)])}
    tree = [_disk(REAL[A], mountpoints=["/mnt/nvme-cache"])]
    mounts = {"/mnt/nvme-cache": {"source": REAL[A], "fstype": "xfs"}}
    line = f"UUID={uuid} /mnt/nvme-cache xfs noatime,nofail 0 0"
    fresh = _plan(hosts, {"gpu1": {"BlockDevices": _fact(devices, tree, mounts)}})
    uploads = {dest: fresh.upload("gpu1", dest) for dest in (
        nvme_cache_derive.PROFILE_FILE, nvme_cache_derive.SYSTEMD_ENV_FILE)}
    files = _existing(uploads)
    users = {u: {"home": h, "shell": "/usr/sbin/nologin", "group": u, "groups": [],
                 "comment": None} for u, h in (("ollama", "/usr/share/ollama"),
                                               ("ray", "/var/lib/ray"))}
    facts = {"gpu1": {
        "BlockDevices": _fact(devices, tree, mounts),
        "FindInFile": lambda path, pattern, **kw: [line] if path == FSTAB else [],
        "DebPackages": {"xfsprogs": ["6.1.0-1"], "fio": ["3.33-3"]},
        "Date": NOW + timedelta(minutes=1),
        "Groups": ["root", "ollama", "ray"],
        "Users": users,
        **files,
    }}
    p = _plan(hosts, facts)
    assert not p.changing("gpu1"), p.changing("gpu1")
    assert p.op("gpu1", REMOUNT).skipped


def _existing(files: dict[str, str]):
    import hashlib

    owners = {"/mnt/nvme-cache/ollama": "ollama", "/mnt/nvme-cache/ray": "ray",
              "/usr/share/ollama": "ollama", "/var/lib/ray": "ray"}
    modes = {"huggingface": 1777, "torch": 1777, "ollama": 755, "ray": 777, "containers": 711}

    def file_fact(path, **kw):
        if path == APT_STAMP:  # apt's index was refreshed a minute ago
            return {"mode": 644, "user": "root", "group": "root", "mtime": NOW}
        return {"mode": 644, "user": "root", "group": "root"} if path in files else None

    def sha1_fact(path, **kw):
        return hashlib.sha1(files[path].encode()).hexdigest() if path in files else None

    def directory_fact(path, **kw):
        owner = owners.get(path, "root")
        mode = modes.get(path.rsplit("/", 1)[1], 755)
        return {"mode": mode, "user": owner, "group": owner}

    return {"File": file_fact, "Sha1File": sha1_fact, "Directory": directory_fact}


INITRAMFS = "Rebuild the initramfs (it carries mdadm's configuration)"
RELOAD_FSTAB = "Reload systemd units (fstab changed)"
REMOUNT = "Remount /mnt/nvme-cache with the options of fstab"
REEXEC = "Reload systemd's manager environment"
RESTART_CFD = "Restart cachefilesd (its configuration changed)"
GUARDED = (INITRAMFS, RELOAD_FSTAB, REMOUNT, REEXEC, RESTART_CFD)
CACHE_UUID = "11111111-2222-3333-4444-555555555555"
CACHE_LINE = f"UUID={CACHE_UUID} /mnt/nvme-cache xfs noatime,nofail 0 0"


def _deployed_plan(raid=False, changed=None, fstab=CACHE_LINE, run="RUN=yes"):
    """A re-run on a node whose cache (one drive, or a RAID0 of two) is made, mounted
    and in fstab as ``fstab``, with FS-Cache, holding what a run writes (``changed``
    replaces a file first: path -> text) and cachefilesd's default file saying ``run``."""
    hosts = [_gpu("gpu1", 21, [{"device": A}, {"device": B}] if raid else [{"device": A}],
                  nvme_cache_fscache=True)]
    xfs = _sig("xfs", "nvme-cache", CACHE_UUID)
    if raid:
        member = _sig("linux_raid_member", "gpu1:aicluster-nvme-cache")
        md = _disk("/dev/md127", mountpoints=["/mnt/nvme-cache"], kind="raid0")
        devices = {A: _record(REAL[A], [member], holders=["md127"]),
                   B: _record(REAL[B], [member], holders=["md127"]),
                   "/dev/md/aicluster-nvme-cache": _record("/dev/md127", [xfs])}
        tree, source = [_disk(REAL[A], [md]), _disk(REAL[B], [md])], "/dev/md127"
    else:
        devices = {A: _record(REAL[A], [xfs])}
        tree, source = [_disk(REAL[A], mountpoints=["/mnt/nvme-cache"])], REAL[A]
    block = _fact(devices, tree, {"/mnt/nvme-cache": {"source": source, "fstype": "xfs"}})
    fresh = _plan(hosts, {"gpu1": {"BlockDevices": block}})
    files = {dest: f.content.decode() for dest, f in fresh.files("gpu1").items()}
    assert set(changed or {}) <= set(files), sorted(files)
    files.update(changed or {})
    lines = {FSTAB: [fstab], nvme_cache_derive.CACHEFILESD_DEFAULT: [run]}
    running = {"cachefilesd.service": True}
    facts = {"gpu1": {
        "BlockDevices": block,
        "FindInFile": lambda path, **kw: lines.get(path, []),
        "SystemdStatus": running, "SystemdEnabled": running,
        **_existing(files),
    }}
    return _plan(hosts, facts)


def _guarded_running(p):
    """The guarded (``_if``) operations that run on gpu1; the others are skipped."""
    present = [name for name in GUARDED if name in p.names("gpu1")]
    ran = {name for name in present if p.op("gpu1", name).runs}
    for name in set(present) - ran:
        assert p.op("gpu1", name).skipped, name
    return ran


def test_a_deployed_cache_re_run_reloads_remounts_and_restarts_nothing():
    for raid in (False, True):
        p = _deployed_plan(raid)
        assert set(GUARDED) - {INITRAMFS} <= set(p.names("gpu1"))
        assert (INITRAMFS in p.names("gpu1")) == raid
        assert _guarded_running(p) == set(), raid


def test_each_change_runs_only_what_it_needs():
    older = "UUID=11111111-2222-3333-4444-555555555555 /mnt/nvme-cache xfs defaults 0 0"
    p = _deployed_plan(fstab=older)
    assert _guarded_running(p) == {RELOAD_FSTAB, REMOUNT}
    assert p.op("gpu1", REMOUNT).commands == ["mount -o remount /mnt/nvme-cache"]
    cases = [
        (nvme_cache_derive.SYSTEMD_ENV_FILE, {REEXEC}),
        (nvme_cache_derive.CACHEFILESD_CONF, {RESTART_CFD}),
        (nvme_cache_derive.PROFILE_FILE, set()),
    ]
    for path, wanted in cases:
        assert _guarded_running(_deployed_plan(changed={path: "# older\n"})) == wanted, path
    # Debian's default file did not let cachefilesd run: it restarts once it may.
    assert _guarded_running(_deployed_plan(run="#RUN=yes")) == {RESTART_CFD}
    changed = {nvme_cache_derive.CACHEFILESD_CONF: "# older\n"}
    restart = _deployed_plan(changed=changed).op("gpu1", RESTART_CFD)
    assert restart.commands == ["systemctl restart cachefilesd.service"]


def test_a_changed_mdadm_record_rebuilds_the_initramfs_only():
    p = _deployed_plan(raid=True, changed={MDADM_CONF["debian12"]: "# older\n"})
    assert _guarded_running(p) == {INITRAMFS}
    assert p.op("gpu1", INITRAMFS).commands == ["update-initramfs -u"]


def test_cache_directories_and_the_environment_tools_read():
    hosts = [_gpu("gpu1", 21, [{"device": A}])]
    p = _plan(hosts, {"gpu1": {"BlockDevices": _fact(_empty(A))}})
    hf = p.op("gpu1", "Cache directory /mnt/nvme-cache/huggingface").text
    assert "chmod 1777 /mnt/nvme-cache/huggingface" in hf
    ray = p.op("gpu1", "Cache directory /mnt/nvme-cache/ray").text
    assert "chown ray:ray /mnt/nvme-cache/ray" in ray
    assert "useradd -d /var/lib/ray -s /usr/sbin/nologin -g ray -r -m ray" in p.op(
        "gpu1", "User ray").text
    profile = p.upload("gpu1", nvme_cache_derive.PROFILE_FILE)
    assert_golden(GOLDEN / "aicluster-nvme-cache.sh", profile)
    assert "export HF_HOME=/mnt/nvme-cache/huggingface\n" in profile
    env = p.upload("gpu1", nvme_cache_derive.SYSTEMD_ENV_FILE)
    assert_golden(GOLDEN / "90-aicluster-nvme-cache.conf", env)
    assert "OLLAMA_MODELS=/mnt/nvme-cache/ollama" in env
    reexec = p.op("gpu1", "Reload systemd's manager environment")
    assert reexec.runs and reexec.text == "systemctl daemon-reexec"
    names = p.names("gpu1")
    assert names.index("Mount the cache at /mnt/nvme-cache") < names.index(
        "Cache directory /mnt/nvme-cache/huggingface")


def test_fscache_runs_cachefilesd_with_its_cache_on_the_nvme():
    hosts = [_gpu("gpu1", 21, [{"device": A}], nvme_cache_fscache=True)]
    p = _plan(hosts, {"gpu1": {"BlockDevices": _fact(_empty(A))}})
    assert "cachefilesd" in p.op("gpu1", "Install the NVMe cache's tools").text
    conf = p.upload("gpu1", "/etc/cachefilesd.conf")
    assert_golden(GOLDEN / "cachefilesd.conf", conf)
    assert conf.startswith("# Written by aicluster") and "dir /mnt/nvme-cache/fscache\n" in conf
    assert "RUN=yes" in p.op("gpu1", "cachefilesd enabled (Debian's RUN=yes)").text
    assert p.op("gpu1", RESTART_CFD).runs
    assert "systemctl start cachefilesd.service" in p.op(
        "gpu1", "cachefilesd running and enabled").text
    # Without it (the default), no cachefilesd.
    p = _plan([_gpu("gpu1", 21, [{"device": A}])], {"gpu1": {"BlockDevices": _fact(_empty(A))}})
    assert "cachefilesd" not in p.commands("gpu1")


def test_who_gets_the_cache():
    # A GPU node without drives gets nothing; a storage node only when it asks.
    storage = ("storage1", {"ssh_hostname": "10.10.0.40",
                            "hardware": {"nvme": [{"device": A}, {"device": B}]}})
    asks = ("storage2", {"ssh_hostname": "10.10.0.41", "nvme_cache_devices": [B],
                         "hardware": {"nvme": [{"device": A}, {"device": B}]}})
    bare = _gpu("gpu1", 21, [])
    facts = {"storage2": {"BlockDevices": _fact(_empty(B))}}
    p = _plan([bare, storage, asks], facts, groups={"gpu_nodes": ["gpu1"]})
    assert not p.changing("gpu1") and not p.changing("storage1")
    assert p.changing("storage2")
    assert f"Make the cache's XFS on {B}" in p.names("storage2")  # only the listed drive
    assert A not in p.commands("storage2")


# ---------------------------------------------------------------------------
# The inventory
# ---------------------------------------------------------------------------


def _errors(host_data: dict, groups=("gpu_nodes",)) -> list[str]:
    base = {"ssh_hostname": "10.10.0.21", "hardware": {
        "gpus": {"model": "H100", "count": 8}, "nvme": [{"device": A}]}}
    try:
        validate({"gpu1": (tuple(groups), {**CLUSTER, **base, **host_data})})
    except InventoryError as exc:
        return exc.errors
    return []


def test_a_valid_host_has_no_errors():
    assert _errors({}) == []


def test_a_drive_that_is_not_a_hardware_nvme_drive_is_refused():
    assert _errors({"nvme_cache_devices": [B]}) == [
        f"host 'gpu1': nvme_cache_devices[0]: {B} is not one of the host's hardware.nvme "
        f"devices ({A}); declare it there (with wipe: true only if its data may go)"
    ]


#: (settings, the one error expected): the settings model's checks (model.py).
BAD_SETTINGS = [
    ({"nvme_cache_devices": [A, A]}, f"nvme_cache_devices: [1]: {A} is listed twice (also [0])"),
    ({"nvme_cache_devices": A}, "nvme_cache_devices: Input should be a valid list"),
    ({"nvme_cache_path": "/var"}, "nvme_cache_path: '/var' is a system directory"),
    ({"nvme_cache_path": "cache"}, "nvme_cache_path: String should match pattern"),
    ({"nvme_cache_path": "/mnt/../etc"}, "nvme_cache_path: '/mnt/../etc' has a '.' or '..'"),
    ({"nvme_cache_mount_options": ["noatime", "a b"]},
     "nvme_cache_mount_options[1]: String should match pattern"),
    ({"nvme_cache_fs_label": "much-too-long-label"},
     "nvme_cache_fs_label: String should match pattern '^[A-Za-z0-9_-]{1,12}$' "
     "(got 'much-too-long-label')"),
    ({"nvme_cache_raid_name": "a:b"}, "nvme_cache_raid_name: String should match pattern"),
    ({"nvme_cache_raid_chunk_kb": 500}, "nvme_cache_raid_chunk_kb: 500 is not a power of two"),
    ({"nvme_cache_raid_chunk_kb": 2},
     "nvme_cache_raid_chunk_kb: Input should be greater than or equal to 4 (got 2)"),
    ({"nvme_cache_raid_chunk_kb": "512"},
     "nvme_cache_raid_chunk_kb: Input should be a valid integer (got '512')"),
    ({"nvme_cache_directories": [{"path": "hf", "mode": 755}]},
     "nvme_cache_directories[0].mode: Input should be a valid string (got 755)"),
    ({"nvme_cache_directories": [{"path": "../etc"}]},
     "nvme_cache_directories[0].path: '../etc' has a '.' or '..' component"),
    ({"nvme_cache_directories": [{"path": "hf", "size": 1}]},
     "nvme_cache_directories[0].size: Extra inputs are not permitted"),
    ({"nvme_cache_directories": [{"owner": "root"}]},
     "nvme_cache_directories[0].path: Field required"),
    ({"nvme_cache_directories": [{"path": "hf", "owner": "Big Name"}]},
     "nvme_cache_directories[0].owner: String should match pattern"),
    ({"nvme_cache_directories": [{"path": "hf", "env": ["HF HOME"]}]},
     "nvme_cache_directories[0].env[0]: String should match pattern"),
    ({"nvme_cache_directories": [{"path": "hf"}, {"path": "hf"}]},
     "nvme_cache_directories: [1]: hf is listed twice (also [0])"),
    ({"nvme_cache_fscache": "yes"}, "nvme_cache_fscache: Input should be a valid boolean"),
    ({"nvme_cache_fscache_dir": "/fscache"}, "nvme_cache_fscache_dir: String should match"),
    ({"nvme_cache_fscache_culling": {
        "brun": 5, "bcull": 7, "bstop": 3, "frun": 10, "fcull": 7, "fstop": 3}},
     "nvme_cache_fscache_culling: cachefilesd needs brun > bcull > bstop and frun > fcull "
     "> fstop"),
    ({"nvme_cache_fscache_culling": {
        "brun": 100, "bcull": 7, "bstop": 3, "frun": 10, "fcull": 7, "fstop": 3}},
     "nvme_cache_fscache_culling.brun: Input should be less than or equal to 99"),
    ({"nvme_cache_fscache_culling": {
        "brun": 10, "bcull": 7, "bstop": 3, "frun": 10, "fcull": 7}},
     "nvme_cache_fscache_culling.fstop: Field required"),
    ({"nvme_cache_pathh": "/x"}, "nvme_cache_pathh: not a nvme_cache setting; did you mean "
     "nvme_cache_path?"),
]


@pytest.mark.parametrize("settings, error", BAD_SETTINGS,
                         ids=[next(iter(s)) + f"-{i}" for i, (s, _) in enumerate(BAD_SETTINGS)])
def test_bad_settings_are_refused_naming_host_and_field(settings, error):
    errors = _errors(settings)
    assert len(errors) == 1 and errors[0].startswith(f"host 'gpu1': {error}"), errors


# ---------------------------------------------------------------------------
# The fact and the rule, on text as a node prints it
# ---------------------------------------------------------------------------

NODE_OUTPUT = """\
@@lsblk
{"blockdevices": [
 {"name": "nvme0n1", "kname": "nvme0n1", "path": "/dev/nvme0n1", "type": "disk",
  "mountpoints": [null], "children": [
   {"name": "nvme0n1p1", "kname": "nvme0n1p1", "path": "/dev/nvme0n1p1", "type": "part",
    "mountpoints": ["/"]}]},
 {"name": "loop8", "kname": "loop8", "path": "/dev/loop8", "type": "loop", "fstype": null,
  "mountpoints": [null]},
 {"name": "loop9", "kname": "loop9", "path": "/dev/loop9", "type": "loop",
  "mountpoints": ["/srv/held"]}
]}
@@device /dev/disk/by-id/empty
real=/dev/loop8
block=yes
holders=
@@wipefs
@@wipefs-rc=0
@@device /dev/disk/by-id/held
real=/dev/loop9
block=yes
holders=
@@wipefs
{"signatures": [{"device": "loop9", "offset": "0x438", "type": "ext4",
  "uuid": "0fedcfbd-08f1-4423-aa6a-23750eb72535", "label": "data"}]}
@@wipefs-rc=0
blkid:TYPE=ext4
blkid:UUID=0fedcfbd-08f1-4423-aa6a-23750eb72535
@@device /dev/disk/by-id/gone
real=
@@mount /mnt/nvme-cache
@@mount /srv/held
/dev/loop9 ext4
"""


def test_the_fact_reads_signatures_holders_and_mounts():
    fact = parse(NODE_OUTPUT.splitlines())
    assert root_disks(fact["lsblk"]) == ["/dev/nvme0n1"]
    empty = fact["devices"]["/dev/disk/by-id/empty"]
    assert empty["real"] == "/dev/loop8" and empty["exists"] and empty["signatures"] == []
    held = fact["devices"]["/dev/disk/by-id/held"]
    assert held["signatures"][0]["type"] == "ext4" and held["blkid"]["TYPE"] == "ext4"
    assert not fact["devices"]["/dev/disk/by-id/gone"]["exists"]
    assert fact["mounts"] == {"/mnt/nvme-cache": None,
                              "/srv/held": {"source": "/dev/loop9", "fstype": "ext4"}}
    checked = check_devices(fact, [{"device": "/dev/disk/by-id/empty"},
                                   {"device": "/dev/disk/by-id/held", "wipe": True},
                                   {"device": "/dev/disk/by-id/gone"}])
    assert checked["devices"]["/dev/disk/by-id/empty"]["state"] == "empty"
    assert checked["devices"]["/dev/disk/by-id/held"]["state"] == "refused"
    assert checked["problems"] == [
        "/dev/disk/by-id/held (/dev/loop9) is mounted at /srv/held (it holds ext4 (label "
        "'data'); mounted at /srv/held); a device in use is never wiped, even with wipe: true",
        "/dev/disk/by-id/gone does not exist on the node",
    ]


def test_a_failed_wipefs_is_not_read_as_an_empty_drive():
    text = NODE_OUTPUT.replace(
        "real=/dev/loop8\nblock=yes\nholders=\n@@wipefs\n@@wipefs-rc=0",
        "real=/dev/loop8\nblock=yes\nholders=\n@@wipefs\nwipefs: permission denied\n"
        "@@wipefs-rc=1",
    )
    fact = parse(text.splitlines())
    assert fact["devices"]["/dev/disk/by-id/empty"]["signatures"] is None
    problems = check_devices(fact, [{"device": "/dev/disk/by-id/empty"}])["problems"]
    assert problems == ["/dev/disk/by-id/empty (/dev/loop8): cannot read its signatures "
                        "(wipefs: wipefs: permission denied); nothing is changed on a device "
                        "that cannot be read"]
