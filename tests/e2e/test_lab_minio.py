"""minio end to end with pyinfra, on the lab in miniature (every component together,
deployed by the whole-stack deploy.py; shared with the other ``test_lab*.py`` modules,
tests/e2e/test_lab.py deploys it first).

STAND-IN release files: MinIO's binaries cannot be fetched on this machine, so the
lab's artifact directory holds the stand-ins tests/e2e/standins/minio.py builds (our own
small S3 server and mc, which VERIFY every request's AWS Signature Version 4 against the
root credentials of /etc/default/minio), pinned by their own sha256 and deployed through
the same verified artifact path as the real files. With $AICLUSTER_E2E_ARTIFACTS_DIR set
(filled by `aicluster artifacts fetch`), the same tests run the real release files and
the defaults' pins. STAND-IN drives: each node has an empty 1 GiB sparse loop device,
/dev/disk/by-id/aicluster-testbed-NODE-minio (the lab's disks named minio,
tests/e2e/conftest.py LAB_DISKS).

Deployed: the whole stack (deploy.py), minio among the rest. The inventory's minio
block (inventories/testbed.py) makes both nodes servers of one deployment,
``http://node{1...2}:9000/mnt/minio1``, with a versioned bucket and a bucket anonymous
users may read. On the lab in miniature:

- minio.service active and enabled on both nodes, its process the pinned release file;
  the S3 API (9000) and the console (9001) bound only to the node's cluster address;
- each drive made XFS (label minio), mounted at /mnt/minio1, owned by minio-user;
- /etc/default/minio mode 0600, owned by minio-user, holding the password derived from
  the testbed's secret, which appears in no deploy's output (the lab's first deploy's
  and each whole-stack deploy's here);
- from this machine with boto3 and the root credentials: an object put through node1 is
  read through node2, same bytes; a wrong password (SignatureDoesNotMatch) and a wrong
  user (InvalidAccessKeyId) are refused; the buckets exist, one versioned, the other
  readable anonymously (an anonymous GET of the first is refused);
- a whole-stack re-run changes nothing;
- a version bump (``minio_version`` in the lab's overrides): every node gets the new
  release file and both servers restart (new MainPID and start time), from the new
  file; the old release file is gone; the objects are still there;
- another whole-stack re-run changes nothing. The lab is left converged on the new
  version (its override kept in the lab's overrides); if a step failed after the lab
  was changed, one more whole-stack deploy is made at the module's end to converge it.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request

import pytest

from aicluster.common.minio_credentials import root_password
from tests.e2e.conftest import Deploy, Lab
from tests.e2e.standins import minio as standin
from tests.e2e.standins import real_artifacts_dir

USER = "aicluster-admin"
BUCKETS = {"testbed", "testbed-public"}
RESTART = "Restart MinIO on every server together"


@pytest.fixture(scope="module")
def seen():
    """What the tests found, filled as they go: ``versions`` (the pinned versions when
    the module started, the deployed one first), ``object``, ``services``, ``bumped``;
    ``converged`` False from each deploy of ours until it is shown to have changed
    nothing. At the module's end an unconverged lab gets one more whole-stack deploy,
    so the next ``test_lab*.py`` module finds it converged."""
    state: dict = {}
    yield state
    lab = state.get("lab")
    if lab is not None and state.get("converged") is False:
        print("minio: a step failed after the lab was changed; one more whole-stack "
              "deploy to converge it")
        converging = lab.read_deploy()
        print("converging deploy: exited", converging.rc,
              converging.results or "with no results table")


@pytest.fixture
def lab(lab, seen):
    """The lab in miniature (tests/e2e/conftest.py), deployed."""
    lab = lab.deployed()
    seen["lab"] = lab
    seen.setdefault("versions", standin.pinned_versions(lab.overrides))
    return lab


def _password() -> str:
    from aicluster.testbed.state import state_dir

    ref = {"file": str(state_dir() / "secrets" / "minio.secret")}
    return root_password(ref, "minio_root_password", 64)


def _checked(deploy: Deploy, started: float | None = None) -> Deploy:
    """*deploy* succeeded, no errors, and printed no root password."""
    if started is not None:
        print(f"deploy took {time.monotonic() - started:.0f} s")
    deploy.succeeded()
    assert _password() not in deploy.output, "the root password appears in the deploy's output"
    return deploy


def _deploy(lab: Lab) -> Deploy:
    """A whole-stack deploy (deploy.py), :func:`_checked`."""
    started = time.monotonic()
    return _checked(lab.read_deploy(), started)


# boto3 (a test dependency, pyproject.toml) is imported where it is used, not when the
# module is collected: the fake-host tests import pyinfra in this process, which
# monkey-patches ssl with gevent, and botocore imported before that patch then fails
# (RecursionError in ssl) when it makes a client.


def _client_error() -> type:
    from botocore.exceptions import ClientError

    return ClientError


def _s3(node: dict, password: str | None = None, user: str = USER):
    import boto3
    from botocore.client import Config

    return boto3.client(
        "s3", endpoint_url=f"http://{node['address']}:9000", region_name="us-east-1",
        aws_access_key_id=user, aws_secret_access_key=password or _password(),
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                      connect_timeout=10, read_timeout=30))


def _wait_cluster_healthy(lab: Lab) -> None:
    """Every server answers /minio/health/cluster (write quorum: all servers up)."""
    deadline = time.monotonic() + 90
    for node in lab.nodes:
        url = f"http://{node['address']}:9000/minio/health/cluster"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, f"{url} did not answer 200 within 90 s"
            time.sleep(1)


def _service(lab: Lab, name: str) -> dict[str, str]:
    out = lab.ssh(name, "systemctl show minio -p ActiveState -p UnitFileState -p MainPID "
                        "-p ExecMainStartTimestampMonotonic")
    return dict(line.split("=", 1) for line in out.strip().splitlines())


def _assert_servers(lab: Lab, version: str) -> dict[str, dict[str, str]]:
    """Both servers run the pinned release from its file, bound to their own address."""
    release = f"/usr/local/bin/minio.RELEASE.{version}"
    sums = (lab.overrides.get("minio_artifacts") or {}).get("minio", {}).get("sha256")
    # A server reports ready (active) once every server answers; the deploy waits only
    # until each answers /minio/health/live.
    _wait_cluster_healthy(lab)
    out = {}
    for node in lab.nodes:
        name, address = node["name"], node["address"]
        service = _service(lab, name)
        for _ in range(30):
            if service["ActiveState"] != "activating":
                break
            time.sleep(1)
            service = _service(lab, name)
        assert service["ActiveState"] == "active", (name, service)
        assert service["UnitFileState"] == "enabled", (name, service)
        assert lab.ssh(name, f"readlink /proc/{service['MainPID']}/exe").strip() == release
        assert lab.ssh(name, "readlink /usr/local/bin/minio").strip() == release
        if sums:
            assert lab.ssh(name, f"sha256sum {release}").split()[0] == \
                sums[version]["amd64"]
        said = lab.ssh(name, "/usr/local/bin/minio --version")
        assert f"RELEASE.{version}" in said, said
        if not real_artifacts_dir():
            assert "STAND-IN" in said, said
        listening = {line.split()[3] for line in lab.ssh(name, "ss -ltnH").splitlines()}
        for port in (9000, 9001):
            bound = sorted(a for a in listening if a.rsplit(":", 1)[-1] == str(port))
            assert bound == [f"{address}:{port}"], (name, port, listening)
        out[name] = service
    print("minio.service active and enabled on both nodes, from", release, "; 9000 and 9001 "
          "bound only to each node's cluster address")
    return out


def _assert_drives_and_secret(lab: Lab) -> None:
    digest = hashlib.sha256(_password().encode()).hexdigest()
    for node in lab.nodes:
        name = node["name"]
        mount = lab.ssh(name, "findmnt -n -o SOURCE,FSTYPE /mnt/minio1").split()
        assert mount[1] == "xfs", (name, mount)
        label = lab.ssh(name, f"blkid -s LABEL -o value {mount[0]}").strip()
        assert label == "minio", (name, label)
        assert "nofail" in lab.ssh(name, "grep ' /mnt/minio1 ' /etc/fstab")
        assert lab.ssh(name, "stat -c '%U %a' /mnt/minio1").strip() == "minio-user 750"
        assert lab.ssh(name, "stat -c '%a %U' /etc/default/minio").strip() == \
            "600 minio-user"
        # The node's file holds the password derived here (compared by its checksum: the
        # password itself is never printed).
        held = lab.ssh(name, "sed -n 's/^MINIO_ROOT_PASSWORD=//p' /etc/default/minio "
                             "| tr -d '\\n' | sha256sum").split()[0]
        assert held == digest, f"{name}: /etc/default/minio holds another password"
    print("drives: XFS (label minio) at /mnt/minio1 on both nodes; /etc/default/minio 0600 "
          "minio-user with the testbed's password")


def _assert_s3(lab: Lab, key: str) -> bytes:
    """Put through node1, read through node2 with the root credentials; wrong ones
    refused; the inventory's buckets and their settings."""
    node1, node2 = lab.nodes
    _wait_cluster_healthy(lab)
    body = os.urandom(1 << 20)
    _s3(node1).put_object(Bucket="testbed", Key=key, Body=body)
    _s3(node1).put_object(Bucket="testbed-public", Key=key, Body=body)
    got = _s3(node2).get_object(Bucket="testbed", Key=key)["Body"].read()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(body).hexdigest()
    assert BUCKETS <= {b["Name"] for b in _s3(node2).list_buckets()["Buckets"]}
    assert _s3(node2).get_bucket_versioning(Bucket="testbed").get("Status") == "Enabled"
    with pytest.raises(_client_error()) as wrong:
        _s3(node2, password="not-the-root-password").get_object(Bucket="testbed", Key=key)
    assert wrong.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(_client_error()) as who:
        _s3(node1, user="someone-else").list_buckets()
    assert who.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    # Anonymous users may read testbed-public (policy download), nothing of testbed.
    with urllib.request.urlopen(f"http://{node2['address']}:9000/testbed-public/{key}",
                                timeout=30) as r:
        assert r.read() == body
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"http://{node2['address']}:9000/testbed/{key}", timeout=30)
    assert anonymous.value.code == 403
    print(f"S3: {key} (1 MiB) put through node1, read through node2 with the root "
          "credentials; wrong password and wrong user refused; testbed versioned, "
          "testbed-public readable anonymously, testbed not")
    return body


def _say_standins(lab: Lab) -> None:
    """The STAND-IN statements: the release files (or the real ones) and the drives."""
    print(standin.banner())
    drives = {d["node"]: d for d in lab.testbed.state.get("disks") or []
              if d["name"].startswith("minio")}
    assert sorted(drives) == sorted(n["name"] for n in lab.nodes), drives
    print("STAND-IN drives: sparse loop devices, " + ", ".join(
        f"{d['by_id']} ({d['size_bytes'] >> 20} MiB)" for _, d in sorted(drives.items())))


def test_two_servers_s3_across_nodes_with_the_root_credentials(lab, seen):
    _say_standins(lab)
    # The lab's first deploy (the whole stack, tests/e2e/test_lab.py made it).
    first = _checked(Deploy.read(lab.first_deploy()))
    output = first.output
    assert first.results["changed"] > 0, first.results
    versions = seen["versions"]
    assert f"Install the MinIO server {versions[0]}" in output
    _assert_servers(lab, versions[0])
    _assert_drives_and_secret(lab)
    seen["object"] = ("first.bin", _assert_s3(lab, "first.bin"))


def _rerun_changes_nothing(lab: Lab, seen: dict, version: str) -> dict[str, dict[str, str]]:
    """A whole-stack re-run changes nothing; the servers run *version* (returned)."""
    seen["converged"] = False
    result = _deploy(lab).results
    assert result["changed"] == 0, result
    seen["converged"] = True
    return _assert_servers(lab, version)


def test_a_whole_stack_rerun_changes_nothing(lab, seen):
    if "object" not in seen:
        pytest.skip("the first deploy's checks failed")
    seen["services"] = _rerun_changes_nothing(lab, seen, seen["versions"][0])


def test_a_version_bump_replaces_the_binary_and_restarts_both_servers(lab, seen):
    if "services" not in seen:
        pytest.skip("an earlier step failed")
    old, new = seen["versions"][0], seen["versions"][1]
    # Kept afterwards: the lab stays on the new version (the next modules' re-runs
    # deploy it and change nothing).
    seen["converged"] = False
    lab.set_overrides(minio_version=new)
    bump = _deploy(lab)
    output = bump.output
    assert bump.results["changed"] > 0, bump.results
    # Every node's new release is in place before the one restart of all servers.
    install = output.find(f"Starting operation: minio | Install the MinIO server {new}")
    restart = output.find(f"Starting operation: minio | {RESTART}")
    assert 0 <= install < restart, (install, restart)
    after = _assert_servers(lab, new)
    for name, before in seen["services"].items():
        assert after[name]["MainPID"] != before["MainPID"], name
        assert int(after[name]["ExecMainStartTimestampMonotonic"]) > \
            int(before["ExecMainStartTimestampMonotonic"]), name
        assert lab.ssh(name, f"test -e /usr/local/bin/minio.RELEASE.{old} || echo gone"
                       ).strip() == "gone"
    print(f"version bump {old} -> {new}: both servers restarted (new MainPID and start "
          f"time), from the new release; the old release file removed")
    key, body = seen["object"]
    _wait_cluster_healthy(lab)
    for node in lab.nodes:
        assert _s3(node).get_object(Bucket="testbed", Key=key)["Body"].read() == body
    _assert_s3(lab, "after-bump.bin")
    seen["bumped"] = True


def test_after_the_bump_a_whole_stack_rerun_changes_nothing(lab, seen):
    if "bumped" not in seen:
        pytest.skip("the version bump failed")
    _rerun_changes_nothing(lab, seen, seen["versions"][1])
