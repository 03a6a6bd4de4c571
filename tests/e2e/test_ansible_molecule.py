"""molecule for each role, the roles in deploy order on the Ansible lab
(tests/e2e/conftest.py ``ansible_lab``: two nodes with the lab's STAND-IN drives, an
NVMe cache, a Ceph disk and a MinIO drive on each, and its STAND-IN k3s, Ollama and MinIO
release files in the lab's overrides): ``molecule converge`` (its create.yml finds that
testbed running, and the drives it needs, and uses it), then ``molecule verify``. So
each role converges on nodes the roles before it already converged, as in a site
deploy, and its verify must pass; the testbed stays up, converged, for
tests/e2e/test_ansible_site.py, whose first ``playbooks/site.yml`` run over it is every
role's second converge at once and must change nothing: the idempotence step of each
scenario's own ``molecule test`` sequence (which a developer runs in a role's directory:
create, converge, idempotence, verify, destroy), run once for the whole stack rather
than once per role. The syntax is ansible-lint's (tests/unit/test_lint.py).

- base: the base role on node1 and node2;
- slurm: base, then slurm; srun across both nodes and a job on a STAND-IN GPU in verify;
- ray: head on node1, node2 joins; `ray status` in verify.
- network: each node's fabric NIC gets its address and MTU 9000 through systemd-networkd;
  a 9000-byte frame crosses the fabric, a larger one does not;
- infiniband: the RDMA packages on HCA-less nodes, no opensm (and why).
- nvidia: the nodes' GPU is a STAND-IN (no NVIDIA device): the role skips them, says
  why, writes nothing.
- nvme_cache: each node's empty STAND-IN drive (a loop device) becomes the XFS cache,
  mounted by UUID with nofail.
- ceph: each node's empty 10 GiB STAND-IN disk (a sparse loop device) becomes an OSD
  (ceph-volume raw); monitor, manager and MDS on node1; verify checks both OSDs up, a
  rados round trip and the ceph-fuse mounts.
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
- monitoring: the node exporter and its textfile collectors on both nodes, the STAND-IN
  dcgm-exporter (tests/e2e/standins/dcgm.py: its package from a repository put on each
  node) on both, Prometheus, Alertmanager and the blackbox exporter on node1; verify
  checks the exporters listen on each node's cluster address only and that the
  deployed configuration passes promtool and amtool.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import BIN, ROOT, Lab, run

#: The roles in deploy order (site.yml's); tests/e2e/test_ansible_site.py reads it.
ROLES = ["base", "network", "infiniband", "nvidia", "nvme_cache", "nfs", "ceph", "slurm",
         "ray", "ollama", "k3s", "minio", "monitoring"]


@pytest.mark.parametrize("role", ROLES)
def test_molecule_scenario(role, ansible_lab: Lab):
    from aicluster import testbed as tb

    for command in ("converge", "verify"):
        proc = run([BIN / "molecule", command, "--scenario-name", "default"],
                   timeout=1800, check=False, cwd=ROOT / "roles" / role)
        assert proc.returncode == 0, f"molecule {command} of the {role} role failed"
    ansible_lab.converged.add(role)
    state = tb.state.load_state()
    assert state and state["nodes"] == ansible_lab.nodes, (
        "the scenario's create replaced the testbed it found")
