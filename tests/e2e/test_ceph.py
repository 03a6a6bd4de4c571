"""ceph end to end, with each engine on its own fresh two-node testbed.

STAND-IN disks: the testbed has no spare drives, so each node gets a loop device (a
10 GiB sparse file on the host: a small OSD fills up and hangs) under a stable name,
/dev/disk/by-id/aicluster-testbed-NODE-ceph (aicluster testbed disk add). node1 runs
the monitor, the manager and the MDS; both nodes run an OSD on their disk (ceph-volume
raw mode: the nodes' kernel has no device-mapper, so no LVM) and mount CephFS with
ceph-fuse.

- the cluster has 2 OSDs up and in, an active manager, health OK or only warnings
  that come from its small size, every placement group active+clean;
- an object put with rados on node1 is read back on node2 (as the restricted client)
  with the same checksum; a file node1 writes to CephFS is read on node2, same
  checksum;
- keyrings are mode 0600 owned by ceph, and no key appears in the deploy's output;
- a second deploy changes nothing;
- afterwards the testbed is down: no state, node, bridge, loop device or mount left.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from aicluster.components.ceph.derive import derive_key
from tests.e2e import conftest
from tests.e2e.checks import assert_ceph_healthy as _assert_healthy
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, ansible_changed, pyinfra_results, run

DEPLOY = Path(__file__).with_name("deploy_ceph.py")


@pytest.fixture(scope="module", params=["pyinfra", "ansible"])
def ceph_testbed(request):
    """A fresh two-node testbed per engine, each node with an empty 10 GiB STAND-IN
    disk for its OSD."""
    try:
        with conftest.fresh_testbed(
                (("node1", "ceph", "10G"), ("node2", "ceph", "10G"))) as (bed, _):
            for node in ("node1", "node2"):
                # ceph-fuse needs /dev/fuse: the testbed gives each node the host's.
                bed.ssh(node, "test -c /dev/fuse")
            yield request.param, bed
    finally:
        _assert_testbed_down()


def _assert_testbed_down() -> None:
    """What test_zz_teardown checks, after each engine's testbed: no state, no node,
    no bridge, no loop device of the testbed's is left on the host."""
    from aicluster.testbed import state

    def sh(cmd: str) -> str:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout

    assert state.load_state() is None
    assert not state.state_dir().exists(), list(state.state_dir().iterdir())
    assert sh("pgrep -x systemd-nspawn").strip() == ""
    links = sh("ip -o link show")
    for name in ("acmgmt0", "acfab0", "vb-node", "vf-node"):
        assert name not in links, f"{name} is still there"
    assert "aicluster" not in sh("losetup -a")
    assert "aicluster" not in sh("cat /proc/mounts")
    print("testbed down: no state, node, bridge, loop device or mount left")


def _deploy(engine: str) -> tuple[int, str, dict]:
    if engine == "pyinfra":
        proc = run([BIN / "pyinfra", "-y", TESTBED_INVENTORY, DEPLOY], timeout=1500,
                   check=False)
        output = proc.stdout + proc.stderr
        return proc.returncode, output, pyinfra_results(output)
    proc = run([BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, "playbooks/site.yml",
                "--tags", "ceph"], timeout=1500, check=False)
    output = proc.stdout + proc.stderr
    return proc.returncode, output, ansible_changed(output)


def _sha(tb: conftest.Testbed, node: str, path: str) -> str:
    return tb.ssh(node, f"sha256sum {path}").split()[0]


def _assert_data_crosses_nodes(tb: conftest.Testbed, engine: str) -> None:
    tb.ssh("node1", "head -c 4194304 /dev/urandom > /root/object.bin && "
                    "rados -p testbed put object-1 /root/object.bin")
    tb.ssh("node2", "rados --id aicluster -p testbed get object-1 /root/object.bin")
    assert _sha(tb, "node1", "/root/object.bin") == _sha(tb, "node2", "/root/object.bin")
    for node in ("node1", "node2"):
        assert tb.ssh(node, "findmnt -n -o FSTYPE /mnt/cephfs").strip() == "fuse.ceph-fuse"
    name = f"/mnt/cephfs/from-node1-{engine}.bin"
    tb.ssh("node1", f"head -c 8388608 /dev/urandom > {name} && sync")
    assert _sha(tb, "node1", name) == _sha(tb, "node2", name)


def _assert_keys_kept_secret(tb: conftest.Testbed, output: str) -> None:
    for path in ("/etc/ceph/ceph.client.admin.keyring", "/etc/ceph/aicluster-mon.keyring",
                 "/var/lib/ceph/bootstrap-osd/ceph.keyring"):
        assert tb.ssh("node1", f"stat -c '%a %U' {path}").strip() == "600 ceph", path
    assert tb.ssh("node2", "stat -c '%a %U' /etc/ceph/ceph.client.aicluster.keyring"
                  ).strip() == "600 ceph"
    from aicluster.testbed.state import state_dir

    secret = (state_dir() / "secrets" / "ceph.secret").read_bytes()
    for entity in ("mon.", "client.admin", "client.bootstrap-osd", "client.aicluster",
                   "mgr.node1", "mds.node1"):
        key = derive_key(secret, entity)
        assert key not in output, f"the key of {entity} appears in the deploy's output"
        assert key[8:] not in output


def test_ceph_across_both_nodes_then_a_second_deploy_changes_nothing(ceph_testbed):
    engine, tb = ceph_testbed
    rc, output, first = _deploy(engine)
    assert rc == 0, output[-5000:]
    if engine == "pyinfra":
        assert first["changed"] > 0 and first["errors"] == 0, first
    else:
        assert first.get("node1", 0) > 0 and first.get("node2", 0) > 0, first
    _assert_keys_kept_secret(tb, output)
    _assert_healthy(tb)
    _assert_data_crosses_nodes(tb, engine)

    rc, output, second = _deploy(engine)
    assert rc == 0, output[-5000:]
    if engine == "pyinfra":
        assert second["changed"] == 0 and second["errors"] == 0, second
    else:
        assert second == {"node1": 0, "node2": 0}, second
    _assert_keys_kept_secret(tb, output)
    _assert_healthy(tb)
