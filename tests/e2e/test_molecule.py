"""molecule's full sequence for each role (destroy, syntax, create, converge, idempotence,
verify, destroy), the roles in deploy order on ONE two-node testbed this module brings
up with the lab's STAND-IN drives (an NVMe cache, a Ceph disk and a MinIO drive on each
node) and takes down at its end. Each scenario's create.yml finds that testbed running
(and the drives it needs) and uses it; its destroy.yml leaves it, as it leaves any
testbed it did not start. So each role converges on nodes the roles before it already
converged, as in a site deploy, its second converge must change nothing, and its verify
must pass:

- base: the base role on node1 and node2;
- slurm: base, then slurm; srun across both nodes and a job on a STAND-IN GPU in verify;
- ray: head on node1, node2 joins; `ray status` in verify.
- network: each node's fabric NIC gets its address and MTU 9000 through systemd-networkd;
  a 9000-byte frame crosses the fabric, a larger one does not;
- infiniband: the RDMA packages on HCA-less nodes, no opensm (and why).
- nvidia: the nodes' GPU is a STAND-IN (no NVIDIA device): the role skips them, says
  why, writes nothing; the idempotence pass changes nothing.
- nvme_cache: each node's empty STAND-IN drive (a loop device) becomes the XFS cache,
  mounted by UUID with nofail; a second converge changes nothing.
- ceph: each node's empty 10 GiB STAND-IN disk (a sparse loop device) becomes an OSD
  (ceph-volume raw); monitor, manager and MDS on node1; verify checks both OSDs up, a
  rados round trip and the ceph-fuse mounts; a second converge changes nothing.
- nfs: node1 serves a directory of its NVMe cache (a STAND-IN drive) with nfs-ganesha;
  node2 (no kernel NFS client) mounts nothing and says why; verify writes and reads a
  file from node2 through ganesha with libnfs, checksums equal.
- ollama: the STAND-IN release ("stand-in ollama (not Ollama)", tests/e2e/standins/
  ollama.py) on both nodes, nginx (Debian's) as the gateway on node1; verify checks the
  units, the listen addresses, the pulled model, and 20 requests through the gateway
  answered by both nodes.
- k3s: the STAND-IN k3s (tests/e2e/standins/k3s.py; not k3s): server on node1, agent on
  node2; verify checks the units, that k3s listens only on each node's cluster address,
  the token file's mode, and both nodes Ready with the pinned version.
- minio: the STAND-IN minio and mc (tests/e2e/standins/minio.py: our own S3 server, which
  verifies every request's signature against the root credentials) on both nodes, each
  with an empty STAND-IN drive (a loop device) made XFS; verify checks the units, the
  listen addresses, an object put through node1 read through both, a wrong password
  refused, anonymous reads as the bucket policies say.
"""

from __future__ import annotations

import importlib
import json
import os

import pytest

from tests.e2e.conftest import BIN, LAB_DISKS, ROOT, fresh_testbed, run


@pytest.mark.parametrize(
    "role",
    ["base", "network", "infiniband", "nvidia", "nvme_cache", "nfs", "ceph", "slurm", "ray",
     "ollama", "k3s", "minio"],
)
def test_molecule_scenario(role, shared_testbed, tmp_path, monkeypatch):
    from aicluster import testbed as tb

    _release_overrides(role, tmp_path, monkeypatch)
    proc = run(
        [BIN / "molecule", "test", "--scenario-name", "default"],
        timeout=1800,
        check=False,
        cwd=ROOT / "roles" / role,
    )
    assert proc.returncode == 0, f"molecule test of the {role} role failed"
    assert "idempotence" in (proc.stdout + proc.stderr).lower()
    state = tb.state.load_state()
    assert state and state["nodes"] == shared_testbed.nodes, (
        "the scenario's destroy took down a testbed it did not start")


@pytest.fixture(scope="module")
def shared_testbed():
    """The module's one testbed (a testbed left running, the lab's included, is taken
    down first), with the lab's STAND-IN drives; down at the module's end."""
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests need root (the testbed runs systemd-nspawn)")
    with fresh_testbed(LAB_DISKS) as (bed, _):
        for node in bed.nodes:
            bed.ssh(node["name"], "test -c /dev/fuse")
        yield bed


def _release_overrides(role: str, tmp_path, monkeypatch) -> None:
    """For a role installed from release artifacts (k3s, ollama, minio): build its
    STAND-IN artifacts (tests/e2e/standins/<role>.py), or take the real artifact
    directory supplied, and hand the testbed inventory their overrides through
    $AICLUSTER_TESTBED_OVERRIDES."""
    try:
        standin = importlib.import_module(f"tests.e2e.standins.{role}")
    except ModuleNotFoundError as e:
        if e.name != f"tests.e2e.standins.{role}":
            raise
        return
    overrides = standin.build(tmp_path / "artifacts")
    path = tmp_path / "overrides.json"
    path.write_text(json.dumps(overrides))
    monkeypatch.setenv("AICLUSTER_TESTBED_OVERRIDES", str(path))
