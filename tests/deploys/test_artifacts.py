"""Pushing a release artifact to nodes with pyinfra (aicluster.artifacts.put), planned
on fake hosts: the cached, verified file is uploaded; a node that has the same file
gets nothing (pyinfra compares checksums); a node of another architecture than the
inventory says, or an artifact that cannot be had, stops the deploy before any
operation runs.

Fake hosts: no host is contacted (tests/deploys/harness.py). The pin is a test fixture
for a file this test makes, not a real release's checksum; its URL is on 127.0.0.1,
where nothing is ever downloaded from here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError

from aicluster import artifacts
from tests.deploys.harness import plan

DATA = b"#!/bin/sh\necho stand-in release binary\n" * 50
SHA256 = hashlib.sha256(DATA).hexdigest()
DEST = "/usr/local/bin/minio"
HOSTS = [("n1", {"ssh_hostname": "10.10.0.1"}), ("n2", {"ssh_hostname": "10.10.0.2"})]
GROUPS = {"minio": ["n1", "n2"]}
OP = "Install minio/minio 1.0.0 (amd64) at /usr/local/bin/minio"


def _cluster(cache: Path, **extra) -> dict:
    return {
        "networks": {"management": {"subnet": "10.10.0.0/24"}},
        "artifacts_cache_dir": str(cache),
        "minio_version": "1.0.0",
        "minio_artifacts": {
            "minio": {
                "url": "http://127.0.0.1:9/minio.RELEASE.{version}",
                "sha256": {"1.0.0": {"amd64": SHA256}},
            }
        },
        **extra,
    }


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    """A download cache that already holds the artifact (named by its sha256)."""
    d = tmp_path / "cache"
    d.mkdir()
    (d / SHA256).write_bytes(DATA)
    monkeypatch.setattr(artifacts, "_RESOLVED", {})  # undone after the test
    return d


def _has(files: dict[str, bytes]):
    """File, Sha1File and Directory facts of a node that has ``files``."""
    def file_fact(path, **kw):
        return {"mode": 755, "user": "root", "group": "root"} if path in files else None

    def sha1(path, **kw):
        return hashlib.sha1(files[path]).hexdigest() if path in files else None

    def directory(path, **kw):
        return {"mode": 755, "user": "root", "group": "root"} if path == "/usr/local/bin" \
            else None

    return {"File": file_fact, "Sha1File": sha1, "Directory": directory}


def _deploy():
    artifacts.put("minio", "minio", DEST)


def test_the_cached_file_is_uploaded(cache):
    facts = {"n1": {"Arch": "x86_64", **_has({})}, "n2": {"Arch": "x86_64", **_has({})}}
    p = plan(HOSTS, GROUPS, _cluster(cache), facts, _deploy)
    for host in ("n1", "n2"):
        assert p.names(host) == [OP]
        assert f"FileUploadCommand({cache / SHA256}, {DEST})" in p.commands(host)
        assert "chmod 755 /usr/local/bin/minio" in p.commands(host)


def test_a_node_with_the_same_file_gets_nothing(cache):
    facts = {
        "n1": {"Arch": "x86_64", **_has({DEST: DATA})},
        "n2": {"Arch": "x86_64", **_has({DEST: b"the previous release"})},
    }
    p = plan(HOSTS, GROUPS, _cluster(cache), facts, _deploy)
    assert p.commands("n1") == ""
    assert f"FileUploadCommand({cache / SHA256}, {DEST})" in p.commands("n2")


def test_a_node_of_another_architecture_is_refused(cache):
    facts = {"n1": {"Arch": "aarch64", **_has({})}, "n2": {"Arch": "x86_64", **_has({})}}
    with pytest.raises(DeployError, match="host 'n1' is aarch64 but hardware.arch says amd64"):
        plan(HOSTS, GROUPS, _cluster(cache), facts, _deploy)


def test_an_artifact_that_cannot_be_had_stops_before_any_operation(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "_RESOLVED", {})  # undone after the test
    facts = {"n1": {"Arch": "x86_64", **_has({})}, "n2": {"Arch": "x86_64", **_has({})}}
    offline = tmp_path / "offline"
    offline.mkdir()
    cluster = _cluster(tmp_path / "empty-cache", artifacts_dir=str(offline))
    with pytest.raises(DeployError) as err:
        plan(HOSTS, GROUPS, cluster, facts, _deploy)
    msg = str(err.value)
    assert "1 release artifact(s) cannot be had; nothing was installed" in msg
    assert "minio/minio 1.0.0 (amd64): not downloaded: cannot reach 127.0.0.1:9" in msg
    assert "needed by host(s) 'n1', 'n2'" in msg
    assert "aicluster artifacts fetch INVENTORY --dest DIR" in msg
