"""``pyinfra INVENTORY deploy.py --dry`` changes nothing on the deploying machine: the
repository's whole ``deploy.py`` planned on fake hosts, as pyinfra runs it with
``--dry``, downloads no release artifact and generates no secret (it names each, once),
leaves the secret and artifact directories byte for byte as they were, and still
plans every operation.

Fake hosts: no host is contacted (tests/deploys/harness.py). The release pins are test
fixtures for bytes this test makes, not a real release's checksums; their URLs are on
127.0.0.1, where nothing is ever downloaded from here (a download attempted would fail
the test: it would not be dry). pyinfra's command line is this test's
(``sys.argv``), read by ``aicluster.common.ops.pyinfra_dry`` as pyinfra reads it.
"""

from __future__ import annotations

import hashlib
import runpy
import sys
from pathlib import Path

import pytest

from aicluster import DEPLOY_FILE, artifacts, dryrun, secrets
from aicluster.common.ops import pyinfra_dry
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan

BINARY = b"#!/bin/sh\necho stand-in k3s\n" * 40
IMAGES = b"stand-in air-gap images\n" * 40
VERSION = "1.36.0+k3s1"
HOSTS = [("s1", {"ssh_hostname": "10.10.0.11", "hardware": {"cpus": 8, "memory_gb": 32}}),
         ("w1", {"ssh_hostname": "10.10.0.21", "hardware": {"cpus": 8, "memory_gb": 32}})]
GROUPS = {"k3s_servers": ["s1"], "k3s_agents": ["w1"],
          "slurm_controller": ["s1"], "slurm_workers": ["w1"]}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cluster(cache: Path, secret_dir: Path) -> dict:
    return {
        "networks": {"management": {"subnet": "10.10.0.0/24"}},
        "secrets": {"k3s_token": {"file": str(secret_dir / "k3s-token")},
                    "munge_key": {"file": str(secret_dir / "munge.key")}},
        "artifacts_cache_dir": str(cache),
        "slurm_version": "22.05.8",
        "k3s_version": VERSION,
        "k3s_artifacts": {
            "k3s": {"url": "http://127.0.0.1:9/k3s/{version}/k3s",
                    "sha256": {VERSION: {"amd64": _sha(BINARY)}}},
            "images": {"url": "http://127.0.0.1:9/k3s/{version}/k3s-airgap-images-{arch}.tar.zst",
                       "sha256": {VERSION: {"amd64": _sha(IMAGES)}}},
        },
    }


def _snapshot(*dirs: Path) -> dict[str, str]:
    """Every path under *dirs* (directories too), with its mode and its content's hash."""
    out = {}
    for top in dirs:
        for path in sorted([top, *top.rglob("*")]):
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            out[str(path)] = f"{oct(info.st_mode)} {digest}"
    return out


def _facts() -> dict:
    return {name: {"LinuxDistribution": DISTRIBUTIONS["debian12"], "Arch": "x86_64",
                   "CgroupWritable": True, "NvidiaDriver": False}
            for name, _ in HOSTS}


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """The deploying machine's directories as a fresh checkout finds them: a secret
    directory holding another secret, and a cache holding one damaged artifact (the
    air-gap images, with wrong bytes) and none of the rest."""
    secret_dir, cache = tmp_path / "secrets", tmp_path / "cache"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "other.key").write_bytes(b"another cluster's secret")
    cache.mkdir()
    (cache / _sha(IMAGES)).write_bytes(b"a download cut short")
    monkeypatch.setattr(artifacts, "_RESOLVED", {})
    monkeypatch.setattr(secrets, "_DRY_VALUES", {})
    monkeypatch.setattr(dryrun, "_SAID", set())
    monkeypatch.setattr(dryrun, "_DRY", [False])
    monkeypatch.setenv("AICLUSTER_ACCEL", "0")  # the fake hosts answer facts; stock pyinfra
    return secret_dir, cache


def _plan_deploy_py(argv: list[str], secret_dir: Path, cache: Path, monkeypatch):
    import pyinfra_cli.cli  # noqa: F401  (pyinfra's command is what is running)

    monkeypatch.setattr(sys, "argv", argv)
    return plan(HOSTS, GROUPS, _cluster(cache, secret_dir), _facts(),
                lambda: runpy.run_path(str(DEPLOY_FILE)))


def test_dry_changes_nothing_on_the_deploying_machine_and_says_what_it_would(
        machine, monkeypatch, capsys):
    secret_dir, cache = machine
    before = _snapshot(secret_dir, cache)
    p = _plan_deploy_py(["pyinfra", "inventory.py", "deploy.py", "--dry"], secret_dir, cache,
                        monkeypatch)
    assert _snapshot(secret_dir, cache) == before
    err = capsys.readouterr().err
    would = [line for line in err.splitlines() if line.startswith("aicluster: --dry: would ")]
    assert sorted(would) == sorted([
        f"aicluster: --dry: would download k3s/images {VERSION} (amd64) from http://127.0.0.1:9"
        f"/k3s/{VERSION}/k3s-airgap-images-amd64.tar.zst (sha256 {_sha(IMAGES)}) into "
        f"{cache / _sha(IMAGES)}",
        f"aicluster: --dry: would download k3s/k3s {VERSION} (amd64) from http://127.0.0.1:9"
        f"/k3s/{VERSION}/k3s (sha256 {_sha(BINARY)}) into {cache / _sha(BINARY)}",
        f"aicluster: --dry: would generate the secret k3s_token at {secret_dir / 'k3s-token'} "
        "(48 random bytes, mode 0600); this plan uses a value held in memory",
        f"aicluster: --dry: would generate the secret munge_key at {secret_dir / 'munge.key'} "
        "(1024 random bytes, mode 0600); this plan uses a value held in memory",
    ]), err
    # Every operation still planned: the artifacts' uploads (of a placeholder, never
    # sent) and the secrets' (a value held in memory) among them, on both hosts.
    for host in ("s1", "w1"):
        names = p.names(host)
        assert f"Stage the k3s {VERSION} binary (--dry: not downloaded)" in names
        assert "k3s cluster token (mode 0600, never shown)" in names
        assert any("munge" in n.lower() and "key" in n.lower() for n in names), names
        assert "Write network sysctls" in names
    # A secret's value, even a dry run's, is never shown.
    token = secrets._DRY_VALUES[secret_dir / "k3s-token"]
    assert token.hex() not in err and token not in err.encode()


def test_without_dry_the_same_deploy_generates_the_secrets(machine, monkeypatch, capsys):
    """The contrast: the same plan without ``--dry`` writes the missing secrets (and
    would download: here the cache is filled first, as a real run finds it)."""
    secret_dir, cache = machine
    (cache / _sha(IMAGES)).write_bytes(IMAGES)
    (cache / _sha(BINARY)).write_bytes(BINARY)
    _plan_deploy_py(["pyinfra", "inventory.py", "deploy.py", "-y"], secret_dir, cache,
                    monkeypatch)
    assert sorted(p.name for p in secret_dir.iterdir()) == ["k3s-token", "munge.key",
                                                            "other.key"]
    assert "--dry" not in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "dry"), [
    (["inv.py", "deploy.py", "--dry"], True),
    (["--dry", "inv.py", "deploy.py", "-y"], True),
    (["inv.py", "deploy.py", "-y", "--limit", "node1", "--dry"], True),
    (["inv.py", "deploy.py", "-y"], False),
    (["inv.py", "deploy.py", "--data", "note=--dry", "-y"], False),
    (["inv.py", "deploy.py", "--diff"], False),
])
def test_pyinfra_dry_reads_pyinfras_command_line_as_pyinfra_does(argv, dry):
    assert pyinfra_dry(argv) is dry


def test_ansibles_check_mode_generates_no_secret(tmp_path, monkeypatch, capsys):
    """The roles' filters read secrets on the deploying machine; given Ansible's check
    mode (``ansible_check_mode``) they generate none (the ``generate`` command tasks
    are skipped in check mode by Ansible itself)."""
    from aicluster.common import minio_credentials as minio
    from aicluster.components.ceph import derive as ceph
    from aicluster.components.k3s import derive as k3s

    monkeypatch.setattr(dryrun, "_SAID", set())
    monkeypatch.setattr(secrets, "_DRY_VALUES", {})
    k3s.cluster_token({"file": str(tmp_path / "k3s-token")}, 48, dry=True)
    minio.root_password({"file": str(tmp_path / "minio.keys")}, "minio_root_keys", 32, dry=True)
    ceph.secrets({"file": str(tmp_path / "ceph.secret")}, "ceph_keys", 64, "", [], "n1",
                 {}, "admin", dry=True)
    assert list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    for name in ("k3s-token", "minio.keys", "ceph.secret"):
        assert "would generate the secret" in err and str(tmp_path / name) in err
