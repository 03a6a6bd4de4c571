"""The storage layer of `aicluster check` (src/aicluster/checks/storage.py): what it plans
from the lab's and a testbed-like inventory, each reader against fixtures (tests/fixtures/
check/storage, README there), and the probes' own shell run on this machine: the pair
test's writer and reader on a shared directory (and through fake libnfs tools), the
MinIO round trip against the STAND-IN S3 server (tests/e2e/standins/minio_standin.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aicluster.checks import storage
from aicluster.checks.context import Context
from aicluster.checks.result import Action, Status
from aicluster.checks.runner import Completed, Probe
from aicluster.inventory import load_cluster, validate
from aicluster.render import render

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "check" / "storage"
STANDIN = ROOT / "tests" / "e2e" / "standins" / "minio_standin.py"
LAB = "inventories/lab.py"
GPU = {"model": "standin", "count": 1, "vendor": "standin"}
D1 = "/dev/disk/by-id/aicluster-testbed-node1-disk1"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def done(stdout: str = "", rc: int = 0, stderr: str = "") -> Completed:
    return Completed(rc, stdout, stderr, 0.01)


@pytest.fixture(scope="module")
def lab():
    return load_cluster(LAB)


def the_testbed(**node1):
    """The testbed's storage (inventories/testbed.py): node1 an NVMe cache on a loop
    disk, the ganesha NFS server of /mnt/nvme-cache/shared, Ceph's monitor, MDS and an
    OSD; node2 an NFS client (no kernel client there) and an OSD; both CephFS clients."""
    def node(i, disks=(), **data):
        hw = {"cpus": 1, "memory_gb": 2, "gpus": GPU}
        if disks:
            hw["nvme"] = [{"device": d} for d in disks]
        return {"ssh_hostname": f"10.0.0.{i}", "hardware": hw, **data}

    hosts = {
        "node1": (["gpu_nodes", "nfs_server", "ceph_mons", "ceph_mds", "ceph_osds",
                   "ceph_clients"],
                  node(1, [D1], **{
                      "nvme_cache_devices": [D1], "nfs_server_impl": "ganesha",
                      "nfs_network": "management",
                      "nfs_exports": [{"path": "/mnt/nvme-cache/shared", "mode": "1777"}],
                      "ceph_osd_devices": [{"device": "/dev/disk/by-id/node1-ceph"}],
                      **node1})),
        "node2": (["gpu_nodes", "nfs_clients", "ceph_osds", "ceph_clients"],
                  node(2, ceph_osd_devices=[{"device": "/dev/disk/by-id/node2-ceph"}])),
    }
    common = {"networks": {"management": {"subnet": "10.0.0.0/24"}},
              "ceph_source": "distribution", "ceph_release": "pacific",
              "ceph_network": "management"}
    return validate({n: (g, {**d, **common}) for n, (g, d) in hosts.items()})


def minio_cluster(servers: int):
    hosts = {f"node{i}": (["minio"] if i <= servers else [],
                          {"ssh_hostname": f"10.0.0.{i}",
                           "minio_drives": [{"path": f"/srv/minio{i}"}] if i <= servers
                           else []})
             for i in (1, 2, 3)}
    for _, data in hosts.values():
        if not data["minio_drives"]:
            del data["minio_drives"]
    return validate({n: (g, {**d, "networks": {"management": {"subnet": "10.0.0.0/24"}},
                             "minio_network": "management",
                             "secrets": {"minio_root_password": {"env": "NOPE"}}})
                     for n, (g, d) in hosts.items()})


def probe_of(probes: list[Probe], check: str, node: str) -> Probe:
    return next(p for p in probes if p.check == check and p.node == node)


def mount_output(findmnt: str = "", responds: int = 0) -> str:
    if not findmnt:
        return "@@mount\n"
    return f"@@mount\n{fixture(findmnt)}responds={responds}\n"


# -- planning -------------------------------------------------------------------------


def test_nothing_is_planned_without_storage_components():
    cluster = validate({"n1": ([], {"ssh_hostname": "10.0.0.1", "networks": {
        "management": {"subnet": "10.0.0.0/24"}}})})
    assert storage.probes(Context(cluster)) == []
    assert storage.pair_checks(Context(cluster)) == []


def test_the_lab_plans_each_check_where_the_inventory_puts_it(lab):
    ctx = Context(lab)
    planned = {(p.check, p.node) for p in storage.probes(ctx)}
    gpus = [f"gpu{n}" for n in range(1, 5)]
    # The NVMe cache: gpu_nodes only (storage1 has NVMe drives, but for Ceph).
    assert {n for c, n in planned if c == "storage.nvme_mount"} == set(gpus)
    assert {n for c, n in planned if c == "storage.nvme_fio"} == set(gpus)
    # NFS: the clients, not the server.
    assert {n for c, n in planned if c == "storage.nfs_mount"} == {"head", *gpus}
    # Ceph: once, on the first monitor.
    assert [n for c, n in planned if c == "storage.ceph_health"] == ["head"]
    assert {n for c, n in planned if c == "storage.cephfs_mount"} == {"head", *gpus}
    # One MinIO server: the round trip on it (no other server to read through).
    assert [n for c, n in planned if c == "storage.minio"] == ["storage1"]
    pairs = {p.check: p.nodes for p in storage.pair_checks(ctx)}
    assert pairs["storage.nfs_shared"] == ["head", *gpus, "storage1"]
    assert pairs["storage.cephfs"] == ["head", *gpus]
    assert "storage.minio" not in pairs


def test_the_quick_tier_plans_no_data_test(lab):
    ctx = Context(lab, tier="quick")
    checks = {p.check for p in storage.probes(ctx)}
    assert checks == {"storage.nvme_mount", "storage.nfs_mount", "storage.ceph_health",
                      "storage.cephfs_mount"}
    assert storage.pair_checks(ctx) == []
    assert all(p.timeout <= 60 for p in storage.probes(ctx))


def test_a_gpu_node_without_drives_gets_no_cache_check():
    cluster = validate({"g1": (["gpu_nodes"], {
        "ssh_hostname": "10.0.0.1", "networks": {"management": {"subnet": "10.0.0.0/24"}},
        "hardware": {"gpus": GPU}})})
    assert storage.probes(Context(cluster)) == []


def test_the_testbed_plan():
    ctx = Context(the_testbed())
    planned = sorted((p.check, p.node) for p in storage.probes(ctx))
    assert planned == [
        ("storage.ceph_health", "node1"), ("storage.cephfs_mount", "node1"),
        ("storage.cephfs_mount", "node2"), ("storage.nfs_mount", "node2"),
        ("storage.nvme_fio", "node1"), ("storage.nvme_mount", "node1")]
    pairs = {p.check: p for p in storage.pair_checks(ctx)}
    nfs = pairs["storage.nfs_shared"]
    assert nfs.nodes == ["node1", "node2"]
    # The server writes on its own XFS, the client reads over NFS, whichever order the
    # rounds give them.
    for a, b in (("node1", "node2"), ("node2", "node1")):
        probe = nfs.make(a, b)
        assert probe.pair == ("node2", "node1")
        assert "nfs://10.0.0.1/mnt/nvme-cache/shared/.aicluster-check" in probe.command
        assert "nfs-cat" in probe.command and "/mnt/nvme-cache/shared" in probe.server
    assert pairs["storage.cephfs"].nodes == ["node1", "node2"]


# -- the NVMe cache --------------------------------------------------------------------


def nvme_probe(ctx, node="gpu1", check="storage.nvme_mount"):
    return probe_of(storage.probes(ctx), check, node)


def test_the_cache_mounted_with_room_passes(lab):
    probe = nvme_probe(Context(lab))
    assert "findmnt --json -M /mnt/nvme-cache" in probe.command
    mounted, usage = probe.read(done(mount_output("findmnt-nvme-cache.json") + "@@df\n"
                                     + fixture("df-nvme-cache.txt")))
    assert (mounted.check, mounted.status, mounted.value) == ("storage.nvme_mount",
                                                              Status.PASS, "xfs")
    assert (usage.status, usage.value, usage.threshold, usage.unit) == (Status.PASS, 21, 85,
                                                                        "%")


def test_a_full_cache_fails_naming_the_mount_and_the_percent(lab):
    probe = nvme_probe(Context(lab))
    _, usage = probe.read(done(mount_output("findmnt-nvme-cache.json") + "@@df\n"
                               + fixture("df-nvme-cache-full.txt")))
    assert usage.status is Status.FAIL and usage.value == 98 and usage.threshold == 95
    assert "gpu1" in usage.message and "/mnt/nvme-cache is 98% full" in usage.message
    assert usage.action is Action.INVESTIGATE
    _, usage = probe.read(done(mount_output("findmnt-nvme-cache.json") + "@@df\n"
                               + fixture("df-nvme-cache-90.txt")))
    assert usage.status is Status.WARN and usage.threshold == 85


def test_the_fill_thresholds_are_the_inventorys(lab):
    cluster = validate({"g1": (["gpu_nodes"], {
        "ssh_hostname": "10.0.0.1", "networks": {"management": {"subnet": "10.0.0.0/24"}},
        "hardware": {"gpus": GPU, "nvme": [{"device": D1}]},
        "check_thresholds": {"storage": {"nvme_used_fail_percent": 99}}})})
    probe = nvme_probe(Context(cluster), "g1")
    _, usage = probe.read(done(mount_output("findmnt-nvme-cache.json") + "@@df\n"
                               + fixture("df-nvme-cache-full.txt")))
    assert usage.status is Status.WARN


@pytest.mark.parametrize("findmnt,words", [
    ("", "is not mounted"),
    ("findmnt-nvme-cache-ext4.json", "/dev/nvme0n1p1 (ext4) is mounted there, not the NVMe "
                                     "cache (xfs)"),
    ("findmnt-nvme-cache-ro.json", "read-only"),
])
def test_a_cache_not_mounted_as_made_fails(lab, findmnt, words):
    probe = nvme_probe(Context(lab))
    mounted, usage = probe.read(done(mount_output(findmnt) + "@@df\n"))
    assert mounted.status is Status.FAIL and words in mounted.message, mounted.message
    assert mounted.message.startswith("gpu1: /mnt/nvme-cache")
    assert usage.status is Status.SKIP and "not usable" in usage.message


def test_a_hung_cache_mount_fails(lab):
    probe = nvme_probe(Context(lab))
    mounted, _ = probe.read(done(mount_output("findmnt-nvme-cache.json", responds=124)
                                 + "@@df\n"))
    assert mounted.status is Status.FAIL and "does not answer" in mounted.message


def fio_output(name: str, avail_kb: int = 900000000, rc: int = 0) -> str:
    return (f"avail_kb={avail_kb}\nneed_kb=327680\n@@fio\n{fixture(name)}\n"
            f"@@fio-rc={rc}\n")


def test_fio_on_a_fast_cache_passes(lab):
    probe = nvme_probe(Context(lab), check="storage.nvme_fio")
    assert "--output-format=json" in probe.command and "--direct=1" in probe.command
    assert "--size=256M" in probe.command and "--runtime=5" in probe.command
    assert "rm -f \"$f\"" in probe.command  # the test file goes, also when stopped
    result = probe.read(done(fio_output("fio-3.33-good.json")))
    assert result.status is Status.PASS, result.message
    assert (result.value, result.threshold, result.unit) == (2583.6, 1000, "MB/s")
    jobs = result.details["jobs"]
    assert jobs["seq-write"]["write_mbps"] == 3277.0
    assert jobs["rand-read-4k"]["read_p99_ms"] == 0.102


def test_fio_on_a_slow_cache_fails_naming_each_figure(lab):
    probe = nvme_probe(Context(lab), check="storage.nvme_fio")
    result = probe.read(done(fio_output("fio-3.33-slow.json")))
    assert result.status is Status.FAIL
    assert (result.value, result.threshold) == (412.3, 1000)
    for words in ("gpu1: the NVMe cache /mnt/nvme-cache is slow",
                  "sequential read 412.3 MB/s (below 1000)",
                  "sequential write 188.7 MB/s (below 500)",
                  "4k random read p99 6.193 ms (above 2)"):
        assert words in result.message, result.message


def test_a_cache_too_full_for_the_test_file_fails_with_that_reason(lab):
    probe = nvme_probe(Context(lab), check="storage.nvme_fio")
    result = probe.read(done("avail_kb=102400\nneed_kb=327680\nfull=1\n"))
    assert result.status is Status.FAIL
    assert "too full for the test: 100 MiB free" in result.message
    assert (result.value, result.threshold, result.unit) == (100, 320, "MiB")


def test_fio_missing_is_an_error_and_a_failed_fio_a_failure(lab):
    probe = nvme_probe(Context(lab), check="storage.nvme_fio")
    missing = probe.read(done("missing=fio\n"))
    assert missing.status is Status.ERROR and "fio is not installed" in missing.message
    unmounted = probe.read(done("notmounted=1\n"))
    assert unmounted.status is Status.FAIL and "not mounted" in unmounted.message
    failed = probe.read(done("avail_kb=900000000\nneed_kb=327680\n@@fio\n@@fio-rc=1\n",
                             stderr="fio: io_u error on file: Input/output error"))
    assert failed.status is Status.FAIL and "Input/output error" in failed.message


def test_the_fio_command_refuses_an_unmounted_cache_and_a_missing_fio(tmp_path):
    # The probe's own shell on this machine: a directory that is no mount point is
    # never tested in the cache's place.
    command = storage.nvme_fio_command(str(tmp_path), 16, 1)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() in ("notmounted=1", "missing=fio"), out.stdout
    assert not list(tmp_path.iterdir())


# -- NFS mounts ------------------------------------------------------------------------


def nfs_output(models: str = "findmnt-nfs-models.json",
               datasets: str = "findmnt-nfs-datasets.json", kernel: bool = True,
               responds: int = 0) -> str:
    head = "fs=nfs\nfs=nfs4\nmodule=nfs\nmodule=sunrpc\n" if kernel else "module=sunrpc\n"
    return head + mount_output(models, responds) + mount_output(datasets)


def test_nfs_mounts_as_the_inventory_says_pass(lab):
    probe = probe_of(storage.probes(Context(lab)), "storage.nfs_mount", "gpu1")
    result = probe.read(done(nfs_output()))
    assert result.status is Status.PASS and (result.value, result.threshold) == (2, 2)
    assert "/srv/datasets (10.30.0.40:/srv/datasets)" in result.message


@pytest.mark.parametrize("models,responds,words", [
    ("", 0, "/srv/models: the NFS export 10.30.0.40:/srv/models is not mounted"),
    ("findmnt-nfs-models.json", 124, "/srv/models: the NFS export 10.30.0.40:/srv/models does "
                                     "not answer"),
    ("findmnt-nfs-models.json", 1, "/srv/models: the NFS export 10.30.0.40:/srv/models is "
                                   "mounted but stat fails there (exit 1: a stale handle?"),
])
def test_an_nfs_mount_missing_or_hung_fails(lab, models, responds, words):
    probe = probe_of(storage.probes(Context(lab)), "storage.nfs_mount", "gpu1")
    result = probe.read(done(nfs_output(models=models, responds=responds)))
    assert result.status is Status.FAIL and result.message.startswith("gpu1: ")
    assert words in result.message, result.message
    assert result.value == 1 and result.threshold == 2


def test_a_local_filesystem_where_nfs_belongs_fails(lab):
    probe = probe_of(storage.probes(Context(lab)), "storage.nfs_mount", "gpu1")
    local = fixture("findmnt-nvme-cache-ext4.json").replace("/mnt/nvme-cache", "/srv/models")
    out = ("fs=nfs4\n@@mount\n" + local + "responds=0\n"
           + mount_output("findmnt-nfs-datasets.json"))
    result = probe.read(done(out))
    assert result.status is Status.FAIL
    assert "/srv/models: /dev/nvme0n1p1 (ext4) is mounted there, not the NFS export " \
        "10.30.0.40:/srv/models (nfs/nfs4)" in result.message, result.message


def test_an_nfs_mount_from_another_server_or_read_only_fails(lab):
    probe = probe_of(storage.probes(Context(lab)), "storage.nfs_mount", "gpu1")
    other = nfs_output().replace("10.30.0.40:/srv/datasets", "10.30.0.99:/srv/datasets")
    result = probe.read(done(other))
    assert result.status is Status.FAIL
    assert "mounted from 10.30.0.99:/srv/datasets, the inventory says 10.30.0.40" in \
        result.message
    ro = nfs_output().replace('"options": "rw,', '"options": "ro,')
    assert "read-only" in probe.read(done(ro)).message


def test_nfs_mounts_skip_where_the_kernel_has_no_nfs_client():
    probe = probe_of(storage.probes(Context(the_testbed())), "storage.nfs_mount", "node2")
    assert "/proc/filesystems" in probe.command  # the nfs component's own kernel probe
    result = probe.read(done("module=sunrpc\n@@mount\n"))
    assert result.status is Status.SKIP
    assert "node2: nfs: mounts skipped: this node's kernel has no NFS client" in result.message
    # The kernel has a client but nothing is mounted: that is a failure.
    assert probe.read(done("fs=nfs4\n@@mount\n")).status is Status.FAIL


# -- the pair tests (NFS, CephFS) ------------------------------------------------------


def test_the_nfs_pair_test_uses_an_export_root_may_write_to(lab):
    nfs = {p.check: p for p in storage.pair_checks(Context(lab))}["storage.nfs_shared"]
    probe = nfs.make("storage1", "gpu2")
    assert probe.pair == ("gpu2", "storage1")
    assert "/srv/datasets/.aicluster-check" in probe.command  # mode 1777, not /srv/models
    assert "/srv/models" not in probe.command
    assert "iflag=direct" in probe.command and "conv=fsync" in probe.server
    assert "head -c 67108864 /dev/urandom" in probe.server  # nfs_size_mb
    # root_squash: the server's files belong to the user a client's root becomes, so
    # the client may remove them from the sticky directory.
    assert "chown 65534:65534" in probe.server
    between_clients = nfs.make("gpu1", "gpu2")
    assert between_clients.pair == ("gpu1", "gpu2")


def test_no_writable_export_skips_the_nfs_pair_test_with_the_reason():
    cluster = the_testbed(nfs_exports=[{"path": "/mnt/nvme-cache/shared"}])  # 0755 root
    ctx = Context(cluster)
    assert "storage.nfs_shared" not in {p.check for p in storage.pair_checks(ctx)}
    probe = probe_of(storage.probes(ctx), "storage.nfs_shared", "node1")
    result = probe.read(done())
    assert result.status is Status.SKIP and "mode 1777" in result.message


NFS_SIZE = 64 * 1048576
SHA = "a" * 64


def shared_output(reader_mode="nfs", writer_mode="local", read_s=0.5, write_s=0.4,
                  read_sha=SHA, extra="") -> str:
    return (f"mode={reader_mode}\nwaited=0\nwriter.node=storage1\nwriter.mode={writer_mode}\n"
            f"writer.sha256={SHA}\nwriter.start=100.0\nwriter.end=100.3\nwriter.done=1\n"
            f"read_sha256={read_sha}\nread_start=200.0\nread_end={200 + read_s}\n"
            f"read_error=\nwrite_ok=1\nwrite_start=300.0\nwrite_end={300 + write_s}\n"
            f"cleanup=1\n{extra}")


def nfs_reader(lab):
    nfs = {p.check: p for p in storage.pair_checks(Context(lab))}["storage.nfs_shared"]
    return nfs.make("gpu2", "storage1")


def test_nfs_read_what_another_node_wrote_passes_with_each_clients_speed(lab):
    result = nfs_reader(lab).read(done(shared_output()))
    assert result.status is Status.PASS and result.pair == ("gpu2", "storage1")
    # 64 MiB in 0.5 s and 0.4 s over NFS; the server's own write is not NFS's speed.
    assert result.details["mbps"] == {"gpu2 read": 134.2, "gpu2 wrote": 167.8}
    assert (result.value, result.threshold, result.unit) == (134.2, 100, "MB/s")


def test_a_slow_nfs_client_fails(lab):
    result = nfs_reader(lab).read(done(shared_output(read_s=2.0)))
    assert result.status is Status.FAIL and result.value == 33.6
    assert "gpu2: the NFS export /srv/datasets is slow: gpu2 read 33.6 MB/s (below 100 " \
        "MB/s)" in result.message


@pytest.mark.parametrize("output,status,words", [
    (shared_output(read_sha="b" * 64), Status.FAIL, "gpu2: read other bytes than storage1 "
                                                    "wrote"),
    ("mode=nfs\nwaited=60\nmissing=1\n", Status.FAIL, "nothing storage1 wrote to the NFS "
                                                      "export /srv/datasets appeared within 60"),
    ("skip=this node's kernel has no NFS client\nmode=\n", Status.SKIP, "gpu2: this node's"),
    ("fail=/srv/datasets is not mounted\nmode=\n", Status.FAIL, "gpu2: /srv/datasets is not"),
    (shared_output(extra="writer.error=dd: Permission denied\n"), Status.FAIL,
     "storage1: could not write to the NFS export /srv/datasets: dd: Permission denied"),
    (shared_output(extra="write_ok=0\nwrite_error=Read-only file system\n"), Status.FAIL,
     "cannot write to the NFS export /srv/datasets itself: Read-only file system"),
])
def test_nfs_pair_failures_name_the_node_and_the_cause(lab, output, status, words):
    result = nfs_reader(lab).read(done(output))
    assert result.status is status and words in result.message, result.message


def run_pair(reader: storage.Side, writer: storage.Side, size: int, name: str,
             direct: bool = False, write_too: bool = True, wait: int = 10,
             env: dict | None = None) -> str:
    """The pair test's shell on this machine: the writer in the background, then the
    reader, as the runner starts them."""
    background = subprocess.Popen(
        ["sh", "-c", storage.writer_command(writer, name, size, direct)], env=env)
    try:
        out = subprocess.run(
            ["sh", "-c", storage.reader_command(reader, name, size, direct, wait, write_too)],
            capture_output=True, text=True, timeout=60, env=env)
    finally:
        background.wait(timeout=60)
    return out.stdout


def test_the_pair_shell_reads_back_what_the_writer_wrote(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    # (The NFS server gives its files to the squashed user: here, to ourselves.)
    writer = storage.Side("node1", "local", str(shared), owner=f"{os.getuid()}:{os.getgid()}")
    reader = storage.Side("node2", "local", str(shared))
    out = run_pair(reader, writer, 2 * 1048576, "aicluster-check-t1")
    kv = storage.parse_kv(out)
    assert kv["writer.sha256"] == kv["read_sha256"] and len(kv["read_sha256"]) == 64, out
    result = storage.judge_shared("storage.cephfs", "CephFS", "node2", "node1", 2 * 1048576,
                                  None, done(out))
    assert result.status is Status.PASS, result.message
    # The reader removed the test's files; the directory is every user's (1777).
    check_dir = shared / storage.CHECK_DIR
    assert list(check_dir.iterdir()) == []
    assert oct(check_dir.stat().st_mode & 0o7777) == "0o1777"
    # Nothing written under the name the reader waits for: it says so after its wait.
    out = subprocess.run(["sh", "-c", storage.reader_command(
        reader, "aicluster-check-none", 1048576, False, 1, False)],
        capture_output=True, text=True, timeout=30).stdout
    result = storage.judge_shared("storage.cephfs", "CephFS", "node2", "node1", 1048576,
                                  None, done(out))
    assert result.status is Status.FAIL and "appeared within 1 s" in result.message


def test_the_pair_shell_refuses_a_cephfs_that_is_not_mounted(tmp_path):
    side = storage.Side("node2", "cephfs", str(tmp_path), fstypes=("fuse.ceph-fuse",))
    out = subprocess.run(["sh", "-c", storage.reader_command(side, "x", 1024, False, 1,
                                                              False)],
                         capture_output=True, text=True, timeout=30).stdout
    result = storage.judge_shared("storage.cephfs", "CephFS", "node2", "node1", 1024, None,
                                  done(out))
    assert result.status is Status.FAIL
    assert f"CephFS is not mounted at {tmp_path} (findmnt shows nothing there" in \
        result.message


def _kernel_has_nfs() -> bool:
    text = Path("/proc/filesystems").read_text()
    return any(line.split()[-1] in ("nfs", "nfs4") for line in text.splitlines() if line)


@pytest.mark.skipif(_kernel_has_nfs(), reason="this machine's kernel has an NFS client: "
                    "the user-space path is taken only where it has none")
def test_a_client_without_kernel_nfs_goes_through_libnfs(tmp_path):
    """Fake nfs-cp/nfs-cat (copying to and from the directory the URL names) stand in for
    libnfs-utils; a fake modprobe says the kernel can load no NFS module."""
    shared = tmp_path / "export"
    shared.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    url = "nfs://10.0.0.1/export"
    (bin_dir / "nfs-cp").write_text(
        f"#!/bin/sh\nd={shared}/${{2#{url}/}}\n[ -e \"$d\" ] && exit 1\nexec cp \"$1\" \"$d\"\n")
    (bin_dir / "nfs-cat").write_text(f"#!/bin/sh\nexec cat {shared}/${{1#{url}/}}\n")
    (bin_dir / "modprobe").write_text("#!/bin/sh\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    writer = storage.Side("node1", "local", str(shared))
    reader = storage.Side("node2", "nfs", str(tmp_path / "not-mounted"), url=url)
    out = run_pair(reader, writer, 4 * 1048576, "aicluster-check-t2", direct=True, env=env)
    result = storage.judge_shared("storage.nfs_shared", "the NFS export /export", "node2",
                                  "node1", 4 * 1048576, 0.001, done(out))
    assert result.status is Status.PASS, out
    assert result.details["reader_mode"] == "libnfs"
    assert set(result.details["mbps"]) == {"node2 read", "node2 wrote"}
    # libnfs-utils cannot remove files: they stay for the server's next run to clear.
    assert result.details["cleanup"] is False
    assert len(list((shared / storage.CHECK_DIR).iterdir())) == 3
    # Without libnfs-utils the node is skipped, saying why.
    (bin_dir / "nfs-cp").unlink()
    out = subprocess.run(["sh", "-c", storage.reader_command(reader, "x", 1024, True, 1,
                                                              True)],
                         capture_output=True, text=True, env=env, timeout=30).stdout
    result = storage.judge_shared("storage.nfs_shared", "x", "node2", "node1", 1024, 100,
                                  done(out))
    assert result.status is Status.SKIP and "libnfs-utils" in result.message


# -- Ceph ------------------------------------------------------------------------------


def ceph_output(status: str, tree: str = "ceph-osd-tree.json", rc: int = 0) -> str:
    return (f"@@status\n{fixture(status)}@@status-rc={rc}\n"
            f"@@tree\n{fixture(tree)}@@tree-rc=0\n")


def ceph_probe(cluster, node="node1"):
    return probe_of(storage.probes(Context(cluster)), "storage.ceph_health", node)


def test_a_healthy_ceph_passes():
    probe = ceph_probe(the_testbed())
    assert "ceph --connect-timeout 15 status -f json" in probe.command
    assert "osd tree -f json" in probe.command
    result = probe.read(done(ceph_output("ceph-status-ok.json")))
    assert result.status is Status.PASS
    assert (result.value, result.threshold, result.unit) == (2, 2, "OSDs")
    assert result.message == ("2 of 2 declared OSDs up and in; HEALTH_OK; 25 placement "
                              "groups active+clean")


def test_ceph_warnings_are_reported_every_code():
    result = ceph_probe(the_testbed()).read(done(ceph_output("ceph-status-warn.json")))
    assert result.status is Status.WARN and result.action is Action.MONITOR
    assert "MDS_INSUFFICIENT_STANDBY (insufficient standby MDS daemons available)" in \
        result.message and "POOL_NO_REDUNDANCY" in result.message
    assert "OSDs" not in result.message  # the OSDs are fine: not mentioned
    assert result.details["health"]["checks"] == ["MDS_INSUFFICIENT_STANDBY",
                                                  "POOL_NO_REDUNDANCY"]


def test_a_stopped_osd_fails_naming_it_and_its_host_while_health_is_only_warn():
    result = ceph_probe(the_testbed()).read(done(ceph_output(
        "ceph-status-osd-down.json", "ceph-osd-tree-down.json")))
    assert result.details["health"]["status"] == "HEALTH_WARN"
    assert result.status is Status.FAIL and (result.value, result.threshold) == (1, 2)
    assert result.action is Action.RESTART_SERVICE
    assert result.message.startswith("node1: 1 of 2 OSDs down (osd.1 on node2)"), \
        result.message
    # Then the health's codes and the placement groups, each once.
    assert "OSD_DOWN (1 osds down)" in result.message
    assert "12 active+undersized, 13 active+undersized+degraded" in result.message


def test_ceph_in_error_fails_naming_every_cause():
    result = ceph_probe(the_testbed()).read(done(ceph_output(
        "ceph-status-err.json", "ceph-osd-tree-all-down.json")))
    assert result.status is Status.FAIL and result.value == 0
    for words in ("2 of 2 OSDs down (osd.0 on node1, osd.1 on node2)",
                  "Ceph reports HEALTH_ERR", "PG_AVAILABILITY",
                  "25 of 25 placement groups are not active"):
        assert words in result.message, result.message


def test_health_err_alone_fails():
    # Every OSD up, every PG clean, but a full OSD: Ceph says ERR, so does the check.
    full = json.loads(fixture("ceph-status-ok.json"))
    full["health"] = {"status": "HEALTH_ERR", "mutes": [], "checks": {"OSD_FULL": {
        "severity": "HEALTH_ERR", "summary": {"message": "1 full osd(s)", "count": 1},
        "muted": False}}}
    out = f"@@status\n{json.dumps(full)}\n@@status-rc=0\n@@tree\n@@tree-rc=1\n"
    result = ceph_probe(the_testbed()).read(done(out))
    assert result.status is Status.FAIL and result.action is Action.INVESTIGATE
    assert result.message == "node1: Ceph reports HEALTH_ERR: OSD_FULL (1 full osd(s))"


def test_the_osd_count_is_the_inventorys(lab):
    # The lab declares four OSDs (storage1's ceph_osd_devices): two, all up and with
    # HEALTH_OK, is a failure; more than declared a warning.
    probe = ceph_probe(lab, "head")
    result = probe.read(done(ceph_output("ceph-status-ok.json")))
    assert result.status is Status.FAIL and result.threshold == 4
    assert result.message == ("head: only 2 of the 4 declared OSDs exist "
                              "(ceph_osd_devices of ceph_osds): deploy again")
    assert result.action is Action.REDEPLOY
    five = json.loads(fixture("ceph-status-ok.json"))
    five["osdmap"].update(num_osds=5, num_up_osds=5, num_in_osds=5)
    out = f"@@status\n{json.dumps(five)}\n@@status-rc=0\n@@tree\n@@tree-rc=1\n"
    assert probe.read(done(out)).status is Status.WARN


def test_ceph_without_answer_fails_and_without_the_tool_errs():
    probe = ceph_probe(the_testbed())
    silent = probe.read(done("@@status\n@@status-rc=1\n@@tree\n@@tree-rc=1\n",
                             stderr="[errno 110] RADOS timed out (error connecting to the "
                                    "cluster)"))
    assert silent.status is Status.FAIL
    assert "got no answer from the monitors" in silent.message
    assert "RADOS timed out" in silent.message
    missing = probe.read(done("missing=ceph\n"))
    assert missing.status is Status.ERROR and "not installed" in missing.message


def test_cephfs_mounts():
    probe = probe_of(storage.probes(Context(the_testbed())), "storage.cephfs_mount", "node2")
    assert probe.read(done(mount_output("findmnt-cephfs-fuse.json"))).status is Status.PASS
    gone = probe.read(done(mount_output()))
    assert gone.status is Status.FAIL and "node2: /mnt/cephfs: CephFS is not mounted" in \
        gone.message
    # An evicted client: mounted, stat fails ("No such file or directory", exit 1).
    evicted = probe.read(done(mount_output("findmnt-cephfs-fuse.json", responds=1)))
    assert evicted.status is Status.FAIL and evicted.action is Action.REDEPLOY
    assert "stat fails there: the MDS evicted this client" in evicted.message


def test_the_cephfs_pair_test_writes_on_one_client_and_reads_on_the_other():
    pair = {p.check: p for p in storage.pair_checks(Context(the_testbed()))}["storage.cephfs"]
    probe = pair.make("node1", "node2")
    assert probe.pair == ("node1", "node2")
    assert "/mnt/cephfs/.aicluster-check" in probe.command
    assert "iflag=direct" not in probe.command  # FUSE: no O_DIRECT
    assert "head -c 16777216" in probe.server  # cephfs_size_mb
    ok = probe.read(done(shared_output(reader_mode="cephfs", writer_mode="cephfs")))
    assert ok.status is Status.PASS and ok.value is None
    bad = probe.read(done(shared_output(reader_mode="cephfs", writer_mode="cephfs",
                                        read_sha="0" * 64)))
    assert bad.status is Status.FAIL


# -- MinIO -----------------------------------------------------------------------------


def minio_output(live="200", cluster="200", put="0", get=SHA, rm="0", extra="") -> str:
    return (f"health_live={live}\nhealth_cluster={cluster}\nsha256={SHA}\nmb_rc=0\n"
            f"mb_error=\nput_rc={put}\nput_error=\nget_sha256={get}\nget_error=\n"
            f"rm_rc={rm}\nrm_error=\n{extra}")


def test_minio_on_the_lab_round_trips_on_its_only_server(lab):
    probe = probe_of(storage.probes(Context(lab)), "storage.minio", "storage1")
    assert "http://storage1-storage:9000/minio/health/cluster" in probe.command
    assert ". /etc/default/minio" in probe.command and "MC_HOST_aiclusterpeer" in probe.command
    assert "aicluster/aicluster-check/storage1-to-storage1.bin" in probe.command
    result = probe.read(done(minio_output()))
    assert result.status is Status.PASS and result.node == "storage1"
    assert "the only server" in result.message


def test_minio_with_two_servers_reads_through_the_other():
    ctx = Context(minio_cluster(2))
    assert "storage.minio" not in {p.check for p in storage.probes(ctx)}
    pair = {p.check: p for p in storage.pair_checks(ctx)}["storage.minio"]
    assert pair.nodes == ["node1", "node2"]
    probe = pair.make("node1", "node2")
    assert probe.pair == ("node1", "node2")
    assert "http://node2:9000/minio/health/live" in probe.command
    assert "@node2:9000" in probe.command
    result = probe.read(done(minio_output()))
    assert result.status is Status.PASS and "PUT through node1, read through node2" in \
        result.message


@pytest.mark.parametrize("output,status,words", [
    (minio_output(live="000"), Status.FAIL, "node2: MinIO is not up: /minio/health/live gave "
                                            "no answer, asked from node1"),
    (minio_output(cluster="503"), Status.FAIL, "node2: MinIO has no write quorum: "
                                               "/minio/health/cluster gave HTTP 503"),
    (minio_output(put="1"), Status.FAIL, "node1: PUT of aicluster-check/node1-to-node2.bin "
                                         "failed"),
    (minio_output(get="e3b0"), Status.FAIL, "node2: GET of aicluster-check/node1-to-node2.bin"),
    ("missing=/usr/local/bin/mc\n", Status.ERROR, "node1: /usr/local/bin/mc is missing"),
    (minio_output(rm="1"), Status.PASS, "the test object is left in aicluster-check"),
])
def test_minio_failures_name_the_server_and_the_cause(output, status, words):
    pair = {p.check: p for p in storage.pair_checks(Context(minio_cluster(2)))}[
        "storage.minio"]
    result = pair.make("node1", "node2").read(done(output))
    assert result.status is status and words in result.message, result.message


def test_minio_errors_never_show_credentials():
    leaked = minio_output(get="", extra="get_error=mc: <ERROR> Unable to read from "
                                        "http://aicluster-admin:s3cr3t-pw@node2:9000/x\n")
    pair = {p.check: p for p in storage.pair_checks(Context(minio_cluster(2)))}[
        "storage.minio"]
    result = pair.make("node1", "node2").read(done(leaked))
    assert result.status is Status.FAIL
    assert "s3cr3t-pw" not in result.message and "http://***@node2:9000" in result.message
    assert "s3cr3t-pw" not in storage.minio_command(storage.MinioTarget(
        url="http://node2:9000", cacert="", mc="/usr/local/bin/mc"), "b", "k", 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standin_minio(tmp_path):
    """A STAND-IN MinIO server (tests/e2e/standins/minio_standin.py) on 127.0.0.1, its mc,
    the root credentials in an env file as /etc/default/minio holds them, and the deploy's
    mc wrapper rendered from its template (reading that file)."""
    password = "stand-in-password-0123"
    port, console = _free_port(), _free_port()
    drive = tmp_path / "drive"
    drive.mkdir()
    env_file = tmp_path / "minio.env"
    env_file.write_text(f'MINIO_VOLUMES="{drive}"\nMINIO_ROOT_USER=aicluster-admin\n'
                        f"MINIO_ROOT_PASSWORD={password}\n")
    mc = tmp_path / "mc"
    mc.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} mc \"$@\"\n")
    mc.chmod(0o755)
    wrapper = tmp_path / "aicluster-minio-mc"
    wrapper.write_text(render("minio", "aicluster-minio-mc.j2", {
        "minio_mc_alias": "aicluster", "minio_url": f"http://127.0.0.1:{port}",
        "minio_scheme": "http", "minio_url_host": "127.0.0.1", "minio_port": port,
        "minio_tls_enabled": False, "minio_certs_dir": "/etc/minio/certs",
        "minio_mc_binary": str(mc)}).replace("/etc/default/minio", str(env_file)))
    wrapper.chmod(0o755)
    server = subprocess.Popen(
        [sys.executable, str(STANDIN), "minio", "server", "--address", f"127.0.0.1:{port}",
         "--console-address", f"127.0.0.1:{console}", str(drive)],
        env={"PATH": os.environ["PATH"], "MINIO_ROOT_USER": "aicluster-admin",
             "MINIO_ROOT_PASSWORD": password},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the stand-in server did not start"
                time.sleep(0.1)
        yield {"target": storage.MinioTarget(url=f"http://127.0.0.1:{port}", cacert="",
                                             mc=str(mc), wrapper=str(wrapper),
                                             env_file=str(env_file)),
               "password": password, "drive": drive, "env_file": env_file}
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_minio_shell_round_trips_through_the_standin(standin_minio):
    target = standin_minio["target"]
    command = storage.minio_command(target, "aicluster-check", "n1-to-n2.bin", 65536)
    assert standin_minio["password"] not in command
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert standin_minio["password"] not in out.stdout + out.stderr
    result = storage.judge_minio("n1", "n2", "aicluster-check", "n1-to-n2.bin",
                                 done(out.stdout, out.returncode, out.stderr))
    assert result.status is Status.PASS, out.stdout
    # Written through one server, read through the other, then removed with mc rm.
    assert "sha256 equal" in result.message
    assert not (standin_minio["drive"] / "aicluster-check" / "n1-to-n2.bin").exists()
    assert result.details["removed"] is True


def test_the_minio_shell_fails_when_the_peer_refuses_the_credentials(standin_minio,
                                                                     tmp_path):
    wrong = tmp_path / "wrong.env"
    wrong.write_text(standin_minio["env_file"].read_text().replace(
        standin_minio["password"], "not-the-root-password"))
    target = storage.MinioTarget(**{**standin_minio["target"].__dict__,
                                    "env_file": str(wrong)})
    out = subprocess.run(["sh", "-c", storage.minio_command(target, "aicluster-check", "k",
                                                            1024)],
                         capture_output=True, text=True, timeout=60)
    result = storage.judge_minio("n1", "n2", "aicluster-check", "k", done(out.stdout))
    assert result.status is Status.FAIL and "n2: GET of aicluster-check/k" in result.message
    assert "signature" in result.message.lower()
    assert "not-the-root-password" not in out.stdout + out.stderr
