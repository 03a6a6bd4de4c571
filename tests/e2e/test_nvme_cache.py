"""nvme_cache end to end, with both engines, one after the other, on one two-node
testbed made as a user makes it (`aicluster testbed up --nodes 2 --disks 1`); it stays
up for tests/e2e/test_zz_teardown.py, which takes it down.

STAND-IN drives: the testbed has no NVMe, so each node gets a loop device (a sparse
file on the host) under a stable name, /dev/disk/by-id/aicluster-testbed-NODE-disk1.
One drive per node: md RAID cannot be built here (no md driver), so the RAID0 path is
proven on fake hosts only (tests/deploys/test_nvme_cache.py).

- node1's drive holds an ext4 filesystem with a file (written from the host): the
  deploy refuses node1, naming the drive and what is on it, changes nothing on node1
  (not even a package), and the file's checksum is the same afterwards;
- node2's drive is empty: pyinfra makes it the XFS cache, mounted at /mnt/nvme-cache by
  UUID with noatime,nofail, with its directories and environment; a second deploy
  changes nothing (and refuses node1 again);
- then Ansible (`site.yml --tags nvme_cache`) over the same nodes: it refuses node1 the
  same way and finds node2's cache as its role would make it, changing nothing (its
  own first cache on empty drives: tests/e2e/test_ansible_molecule.py's nvme_cache
  scenario);
- then node2 no longer given the cache (desired absence, with Ansible's absence and
  record plays): the cache is unmounted and its fstab line and environment files
  removed, and the drive keeps its filesystem and a file written in the cache; given
  back, the same filesystem is mounted again, the file in it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from aicluster.components.nvme_cache.derive import fs_uuid
from aicluster.inventory import load_cluster
from tests.e2e import conftest
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, ansible_changed, pyinfra_results, run

HELD = "/dev/disk/by-id/aicluster-testbed-node1-disk1"
CACHE = "/dev/disk/by-id/aicluster-testbed-node2-disk1"
PATH = "/mnt/nvme-cache"
RECORD = "/etc/aicluster/components"
DEPLOY = Path(__file__).with_name("deploy_nvme_cache.py")


def _host(*argv: str) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{argv}: {proc.stderr}"
    return proc.stdout


def _held_checksum(loop: str) -> str:
    """sha256 of the file on the held drive, read on the host (mounted read-only)."""
    with tempfile.TemporaryDirectory() as mnt:
        _host("mount", "-o", "ro", loop, mnt)
        try:
            return hashlib.sha256(Path(mnt, "precious.bin").read_bytes()).hexdigest()
        finally:
            _host("umount", mnt)


@pytest.fixture(scope="module")
def nvme_testbed():
    """A fresh two-node testbed, one empty STAND-IN drive (a loop device) on each node;
    node1's then given a filesystem holding a file. Left up (test_zz_teardown.py, or
    the session's end, takes it down)."""
    bed = conftest.cli_testbed_up("--disks", "1", "--disk-size", "1G")
    held = next(d for d in bed.state["disks"] if d["node"] == "node1")
    # Data on node1's drive, written from the host before any deploy.
    _host("mkfs.ext4", "-q", "-L", "held", held["loop"])
    with tempfile.TemporaryDirectory() as mnt:
        _host("mount", held["loop"], mnt)
        try:
            Path(mnt, "precious.bin").write_bytes(os.urandom(1 << 20))
        finally:
            _host("umount", mnt)
    return bed, held, _held_checksum(held["loop"])


def _deploy(engine: str) -> tuple[int, str, dict]:
    if engine == "pyinfra":
        proc = run([BIN / "pyinfra", "-y", TESTBED_INVENTORY, DEPLOY], timeout=900, check=False)
        output = proc.stdout + proc.stderr
        return proc.returncode, output, pyinfra_results(output)
    proc = run([BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, "playbooks/site.yml",
                "--tags", "nvme_cache"], timeout=900, check=False)
    output = proc.stdout + proc.stderr
    return proc.returncode, output, ansible_changed(output)


def _assert_node1_untouched(tb: conftest.Testbed, held: dict, checksum: str, output: str) -> None:
    # Ansible's YAML output may fold a long message at spaces: compare words.
    words = " ".join(output.split())
    assert "nvme_cache:" in words and "node1" in words, output[-3000:]
    assert f"{HELD} ({held['loop']}) holds ext4" in words, output[-3000:]
    assert "set wipe: true on this device" in words
    # Nothing was changed on node1: no package, no fstab line, nothing mounted.
    assert tb.ssh("node1", "dpkg -s xfsprogs >/dev/null 2>&1 && echo yes || echo no").strip() \
        == "no"
    assert PATH not in tb.ssh("node1", "cat /etc/fstab")
    assert tb.ssh("node1", f"findmnt -n {PATH} || true").strip() == ""
    assert tb.ssh("node1", f"blkid -p -o value -s TYPE {HELD}").strip() == "ext4"
    assert _held_checksum(held["loop"]) == checksum


def _assert_cache(tb: conftest.Testbed) -> None:
    uuid = fs_uuid(load_cluster(TESTBED_INVENTORY), "node2", [CACHE])
    assert tb.ssh("node2", f"blkid -p -o value -s UUID {CACHE}").strip() == uuid
    assert tb.ssh("node2", f"blkid -p -o value -s LABEL {CACHE}").strip() == "nvme-cache"
    fstype, options = tb.ssh("node2", f"findmnt -n -o FSTYPE,OPTIONS {PATH}").split()
    assert fstype == "xfs" and "noatime" in options.split(","), options
    assert f"UUID={uuid} {PATH} xfs noatime,nofail 0 0\n" in tb.ssh("node2", "cat /etc/fstab")
    assert tb.ssh("node2", f"stat -c '%U %a' {PATH}/ray {PATH}/huggingface").split() == [
        "ray", "777", "root", "1777"
    ]
    assert tb.ssh("node2", "bash -lc 'echo $HF_HOME'").strip() == f"{PATH}/huggingface"
    assert f"OLLAMA_MODELS={PATH}/ollama" in tb.ssh(
        "node2", "systemctl show-environment")


def test_pyinfra_refuses_a_drive_holding_data_and_makes_an_empty_one_the_cache(
        nvme_testbed):
    tb, held, checksum = nvme_testbed
    print(f"STAND-IN drive {HELD} holds ext4 with a file, sha256 {checksum}")
    rc, output, first = _deploy("pyinfra")
    assert rc != 0, "node1 should have been refused"
    assert first["changed"] > 0, first
    _assert_node1_untouched(tb, held, checksum, output)
    _assert_cache(tb)

    rc, output, second = _deploy("pyinfra")
    assert second["changed"] == 0 and second["errors"] == 0, second
    _assert_node1_untouched(tb, held, checksum, output)
    _assert_cache(tb)


def test_ansible_refuses_the_same_drive_and_agrees_with_the_cache(nvme_testbed):
    tb, held, checksum = nvme_testbed
    # After the pyinfra test, node2's cache is there: the role must find it as it
    # would have made it. Alone (-k), this test makes it first.
    made = tb.ssh("node2", f"findmnt -n {PATH} || true").strip() != ""
    rc, output, first = _deploy("ansible")
    assert rc != 0 and "node1" in output and "failed=1" in output, first
    if made:
        assert first.get("node2") == 0, f"Ansible changed pyinfra's cache: {first}"
        print("Ansible found node2's cache, made by pyinfra, as its own: changed=0")
    else:
        assert first.get("node2", 0) > 0, first
    _assert_node1_untouched(tb, held, checksum, output)
    _assert_cache(tb)

    rc, output, second = _deploy("ansible")
    assert second.get("node2") == 0, second
    _assert_node1_untouched(tb, held, checksum, output)
    _assert_cache(tb)


def test_a_node_no_longer_given_the_cache_unmounts_it_and_keeps_what_it_holds(nvme_testbed):
    from aicluster.components.nvme_cache.derive import PROFILE_FILE
    from aicluster.testbed.state import state_dir

    tb, held, checksum = nvme_testbed
    overrides = state_dir() / "overrides.json"
    plays = ("--tags", "absence,nvme_cache,record")
    uuid = tb.ssh("node2", f"blkid -p -o value -s UUID {CACHE}").strip()
    tb.ssh("node2", f"echo kept > {PATH}/huggingface/kept")
    # The record, written once by the record play (node1 is refused on its drive).
    _playbook(*plays)
    assert "nvme_cache" in json.loads(tb.ssh("node2", f"cat {RECORD}"))["mounts"]
    overrides.write_text(json.dumps({"groups": {"gpu_nodes": []},
                                     "nvme_cache_devices": None}))
    try:
        _playbook(*plays)
        assert tb.ssh("node2", f"findmnt -n {PATH} || echo none").strip() == "none"
        assert f" {PATH} " not in tb.ssh("node2", "cat /etc/fstab")
        assert tb.ssh("node2", f"test -e {PROFILE_FILE} || echo gone").strip() == "gone"
        # The drive keeps its filesystem and what the cache held.
        assert tb.ssh("node2", f"blkid -p -o value -s UUID {CACHE}").strip() == uuid
        again = ansible_changed(_playbook(*plays))
        assert again.get("node2") == 0, again
    finally:
        overrides.unlink()
    _playbook(*plays)
    _assert_cache(tb)
    assert tb.ssh("node2", f"cat {PATH}/huggingface/kept") == "kept\n"
    assert _held_checksum(held["loop"]) == checksum


def _playbook(*extra: str) -> str:
    """site.yml limited to *extra*'s plays; node1 fails (its drive holds data), node2
    must not."""
    proc = run([BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, "playbooks/site.yml",
                *extra], timeout=900, check=False)
    output = proc.stdout + proc.stderr
    assert "node2" in output and not re.search(r"node2\s*:.*failed=[1-9]", output), (
        output[-4000:])
    return output
