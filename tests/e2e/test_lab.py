"""The lab in miniature: every component the testbed can run, together on two nodes with
disks, deployed from scratch with pyinfra, then re-run.

Combinations are where bugs hide that one component alone never shows: a mount that
failed reported as a success, a directory two components both own. Here:

- the first deploy succeeds; every service answers (base, network, the NVMe cache on
  both nodes, NFS through ganesha, Ceph healthy with CephFS mounted on both nodes and a
  file written on one read on the other, MinIO, Slurm, Ray, k3s, Ollama);
- the second and the third deploy change nothing;
- Ceph's data crosses nodes: an object node1 puts with rados is read on node2 as the
  restricted client, same checksum; the keyrings are 0600 ceph and no key (derived from
  the testbed's secret) is in the first deploy's output;
- a CephFS mount that fails (node2's /dev/fuse taken away: ceph-fuse cannot mount, and
  ``mount`` still exits 0) fails the deploy, naming the host and the mount point; given
  the device back, the next deploy mounts it and the one after changes nothing.

STAND-INs (said in the output): loop devices for the drives, a character device for the
GPU, and small executables for the k3s, Ollama and MinIO release files
(tests/e2e/standins). The lab is shared with the other ``test_lab*.py`` modules.
"""

from __future__ import annotations

import json
import re
import urllib.request

from aicluster.components.ceph.derive import derive_key
from tests.e2e.checks import (
    RAY_VERSION,
    assert_base,
    assert_ceph_healthy,
    assert_network,
    assert_nfs,
    assert_nvidia_skipped,
    assert_ray,
    assert_slurm,
    make_standin_gpus,
)
from tests.e2e.conftest import Deploy, Lab

CEPHFS = "/mnt/cephfs"
CACHE = "/mnt/nvme-cache"


def _assert_rerun_changes_nothing(lab: Lab, which: str) -> None:
    rerun = lab.read_deploy().succeeded()
    changed = [line for line in rerun.output.splitlines() if "Success" in line]
    assert rerun.results["changed"] == 0, (rerun.results, changed)
    print(f"{which} deploy: {rerun.results}")


def test_first_deploy_brings_up_every_component(lab: Lab):
    make_standin_gpus(lab.testbed)
    first = Deploy.read(lab.first_deploy()).succeeded()
    output = first.output
    assert first.results["changed"] > 0, first.results
    bed = lab.testbed
    assert_base(bed)
    assert_network(bed, output)
    assert_nvidia_skipped(bed, output)
    for node in ("node1", "node2"):
        assert bed.ssh(node, f"findmnt -n -o FSTYPE --mountpoint {CACHE}").strip() == "xfs"
        # One owner for Ray's temporary directory on the cache (nvme_cache makes it,
        # world-writable as Ray makes it when it starts).
        assert bed.ssh(node, f"stat -c '%U %a' {CACHE}/ray").split() == ["ray", "777"]
    assert_nfs(bed, output)
    assert_ceph_healthy(bed)
    assert_slurm(bed)
    assert_ray(bed, lab.ray_version or RAY_VERSION)
    _assert_minio(lab)
    _assert_k3s(lab)
    _assert_ollama(lab)


def test_second_and_third_deploy_change_nothing(lab: Lab):
    _assert_rerun_changes_nothing(lab, "second")
    _assert_rerun_changes_nothing(lab, "third")


def test_cephfs_is_mounted_on_both_nodes_and_shared(lab: Lab):
    for node in ("node1", "node2"):
        fstype = lab.ssh(node, f"findmnt -n -o FSTYPE --mountpoint {CEPHFS}").strip()
        assert fstype == "fuse.ceph-fuse", (node, fstype)
    lab.ssh("node1", f"head -c 1048576 /dev/urandom > {CEPHFS}/lab-probe.bin")
    written = lab.ssh("node1", f"sha256sum < {CEPHFS}/lab-probe.bin").split()[0]
    read = lab.ssh("node2", f"sha256sum < {CEPHFS}/lab-probe.bin").split()[0]
    assert read == written
    print(f"CephFS: node1 wrote 1 MiB to {CEPHFS}, node2 read it back (sha256 {read})")


def test_ceph_objects_cross_nodes_and_keys_stay_secret(lab: Lab):
    lab.deployed()
    lab.ssh("node1", "head -c 4194304 /dev/urandom > /root/object.bin && "
                     "rados -p testbed put lab-object /root/object.bin")
    lab.ssh("node2", "rados --id aicluster -p testbed get lab-object /root/object.bin")
    put, got = (lab.ssh(n, "sha256sum /root/object.bin").split()[0] for n in ("node1", "node2"))
    assert put == got
    print(f"rados: node1 put 4 MiB, node2 (client.aicluster) read it back (sha256 {got})")
    for path in ("/etc/ceph/ceph.client.admin.keyring", "/etc/ceph/aicluster-mon.keyring",
                 "/var/lib/ceph/bootstrap-osd/ceph.keyring"):
        assert lab.ssh("node1", f"stat -c '%a %U' {path}").strip() == "600 ceph", path
    assert lab.ssh("node2", "stat -c '%a %U' /etc/ceph/ceph.client.aicluster.keyring"
                   ).strip() == "600 ceph"
    from aicluster.testbed.state import state_dir

    secret = (state_dir() / "secrets" / "ceph.secret").read_bytes()
    output = Deploy.read(lab.first).output
    for entity in ("mon.", "client.admin", "client.bootstrap-osd", "client.aicluster",
                   "mgr.node1", "mds.node1"):
        key = derive_key(secret, entity)
        assert key not in output and key[8:] not in output, (
            f"the key of {entity} appears in the deploy's output")


def test_a_failed_cephfs_mount_fails_the_deploy_and_is_repaired(lab: Lab):
    # node2 loses its CephFS mount and its FUSE device: ceph-fuse cannot mount (and
    # `mount` exits 0 all the same, the bug this guards against).
    lab.ssh("node2", f"umount {CEPHFS}")
    try:
        # ceph-fuse lets go of the device a moment after the unmount: detach it lazily.
        lab.ssh("node2", "umount -l /dev/fuse && rm -f /dev/fuse && test ! -e /dev/fuse")
        failing = lab.read_deploy()
        output = failing.output
        assert failing.rc != 0, "the deploy reported success for a failed mount"
        assert f"is not mounted at {CEPHFS}" in output, output[-3000:]
        failed = [line for line in output.splitlines() if f"is not mounted at {CEPHFS}" in line]
        assert all("node2" in line for line in failed), failed
        assert failing.results["errors"] >= 1
        print("deploy with node2's /dev/fuse gone failed as it must:", failed[0])
    finally:
        # FUSE's device (10:229), as the testbed gives it.
        lab.ssh("node2", "test -c /dev/fuse || mknod -m 666 /dev/fuse c 10 229")
    repair = lab.read_deploy().succeeded()
    assert repair.results["changed"] > 0, repair.results
    assert lab.ssh("node2", f"findmnt -n -o FSTYPE --mountpoint {CEPHFS}").strip() == (
        "fuse.ceph-fuse")
    _assert_rerun_changes_nothing(lab, "after the repair, the next")


# --- what the release components answer (STAND-IN executables unless real files) ---


def _get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (testbed only)
        return resp.status, resp.read()


def _wait_for(lab: Lab, what: str, probe, tries: int = 60):
    import time

    last: object = None
    for _ in range(tries):
        try:
            last = probe()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(2)
    raise AssertionError(f"{what}: {last}")


def _assert_minio(lab: Lab) -> None:
    for node in lab.nodes:
        url = f"http://{node['address']}:9000/minio/health/cluster"
        _wait_for(lab, url, lambda u=url: _get(u)[0] == 200)
    for node in ("node1", "node2"):
        assert lab.ssh(node, "findmnt -n -o FSTYPE --mountpoint /mnt/minio1").strip() == "xfs"
    print("MinIO: both servers answer /minio/health/cluster, their drives mounted (XFS)")


def _assert_k3s(lab: Lab) -> None:
    ready = ("jsonpath={range .items[*]}{.metadata.name}="
             '{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}')

    def nodes() -> bool:
        out = lab.ssh("node1", f"k3s kubectl get nodes -o '{ready}'", check=False)
        return sorted(out.split()) == ["node1=True", "node2=True"]

    _wait_for(lab, "k3s nodes Ready", nodes)
    print("k3s: node1 (server) and node2 (agent) Ready")


def _assert_ollama(lab: Lab) -> None:
    for node in lab.nodes:
        url = f"http://{node['address']}:11434/api/tags"
        status, body = _wait_for(lab, url, lambda u=url: _get(u))
        assert status == 200 and "models" in json.loads(body), body
    gateway = f"http://{lab.nodes[0]['address']}:11435/api/tags"
    status, _body = _wait_for(lab, gateway, lambda: _get(gateway))
    assert status == 200
    version = lab.ssh("node1", "ollama --version", check=False)
    print("Ollama: both nodes answer /api/tags, the gateway on node1 too;",
          re.sub(r"\s+", " ", version).strip())
