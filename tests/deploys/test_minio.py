"""The minio deploy planned on fake hosts: one node with a directory, four nodes with two
drives each (MINIO_VOLUMES in MinIO's expansion notation), the disk-safety rule (a
drive holding data stops its host, wipe is honoured), the root credentials (never in
an operation's name, a command or the log; the environment file mode 0600, owned by
minio-user), a version bump (every server gets the new binary, then all restart in
one operation), a second run that changes nothing, and every bad input refused by
validation, host and field named.

Fake hosts: no host is contacted (tests/deploys/harness.py). The release pins here are
test fixtures for stand-in files this test makes ("stand-in minio"), not MinIO's
releases; their URLs are on 127.0.0.1, where nothing is ever downloaded from.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import pytest

from aicluster import PROJECT_ROOT, artifacts
from aicluster.common import minio_credentials
from aicluster.common.settings import template_vars
from aicluster.components.minio import deploy as minio
from aicluster.components.minio import derive as minio_derive
from aicluster.components.minio.probe import command_text as state_command
from aicluster.components.minio.probe import parse as state_parse
from aicluster.inventory import InventoryError, load_cluster, validate
from aicluster.render import render
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import plan
from tests.golden import GOLDEN_DIR, assert_golden

GOLDEN = GOLDEN_DIR / "minio"
OLD = b"#!/bin/sh\necho 'stand-in minio 1.0.0 (a test fixture, not MinIO)'\n"
NEW = b"#!/bin/sh\necho 'stand-in minio 2.0.0 (a test fixture, not MinIO)'\n"
MC = b"#!/bin/sh\necho 'stand-in mc (a test fixture, not MinIO's client)'\n"
PASSWORD = "stand-in-root-password-7Qx"
ENV = "AICLUSTER_TEST_MINIO_ROOT"
ENV_FILE = "/etc/default/minio"
RESTART = "Restart MinIO on every server together"
SYSTEM = {"name": "sda", "kname": "sda", "path": "/dev/sda", "type": "disk",
          "mountpoints": [None],
          "children": [{"name": "sda1", "kname": "sda1", "path": "/dev/sda1", "type": "part",
                        "mountpoints": ["/"], "children": []}]}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dev(host: str, j: int) -> str:
    return f"/dev/disk/by-id/ata-STANDIN_{host}_{j}"


def _real(host: str, j: int) -> str:
    return f"/dev/sd{chr(ord('a') + j)}{host[-1]}"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    """A download cache holding the stand-in files, and the root password's secret."""
    d = tmp_path / "cache"
    d.mkdir()
    for data in (OLD, NEW, MC):
        (d / sha(data)).write_bytes(data)
    monkeypatch.setattr(artifacts, "_RESOLVED", {})  # undone after the test
    monkeypatch.setenv(ENV, PASSWORD)
    return d


def _cluster(cache: Path, version: str = "2.0.0", **extra) -> dict:
    return {
        "cluster_name": "demo",
        "networks": {"management": {"subnet": "10.10.0.0/24"},
                     "storage": {"subnet": "10.30.0.0/24", "mtu": 9000}},
        "artifacts_cache_dir": str(cache),
        "secrets": {"minio_root_password": {"env": ENV}},
        "minio_version": version,
        "minio_artifacts": {
            "minio": {"url": "http://127.0.0.1:9/minio.RELEASE.{version}",
                      "sha256": {"1.0.0": {"amd64": sha(OLD)}, "2.0.0": {"amd64": sha(NEW)}}},
            "mc": {"url": "http://127.0.0.1:9/mc.RELEASE.standin",
                   "sha256": {"1.0.0": {"amd64": sha(MC)}, "2.0.0": {"amd64": sha(MC)}}},
        },
        **extra,
    }


def _host(name: str, n: int, devices: int = 0, **data) -> tuple[str, dict]:
    out: dict = {"ssh_hostname": f"10.10.0.{n}",
                 "hardware": {"nics": [{"name": "ens2", "network": "storage", "speed_gbps": 100,
                                        "address": f"10.30.0.{n}", "mtu": 9000}]},
                 **data}
    if devices:
        out["minio_drives"] = [{"device": _dev(name, j)} for j in range(1, devices + 1)]
    return name, out


def _four(devices: int = 2, **data):
    return [_host(f"stor{i}", 40 + i, devices, **data) for i in range(1, 5)]


def _record(real: str, signatures=(), holders=()) -> dict:
    return {"real": real, "exists": True, "block": True, "holders": list(holders),
            "signatures": list(signatures), "wipefs_error": "", "blkid": {}}


def _sig(kind: str, label: str = "", uuid: str = "") -> dict:
    return {"type": kind, "offset": "0x0", "label": label, "uuid": uuid}


def _block(name: str, count: int, records: dict | None = None, mounts: dict | None = None):
    records = records or {}
    devices = {_dev(name, j): records.get(j) or _record(_real(name, j))
               for j in range(1, count + 1)}
    value = {
        "lsblk": [SYSTEM, *({"name": r["real"][5:], "kname": r["real"][5:], "path": r["real"],
                             "type": "disk", "mountpoints": [None], "children": []}
                            for r in devices.values())],
        "devices": devices,
        "mounts": mounts or {},
    }
    return lambda **kw: value


def _facts(hosts, distro="debian12", block=None, state=None) -> dict:
    out = {}
    for name, data in hosts:
        out[name] = {"LinuxDistribution": DISTRIBUTIONS[distro], "Os": "Linux",
                     "Arch": "x86_64", "Which": lambda command, **kw: f"/usr/bin/{command}"}
        count = len(data.get("minio_drives") or [])
        if count:
            out[name]["BlockDevices"] = (block or {}).get(name) or _block(name, count)
        if state and name in state:
            out[name]["MinioState"] = state[name]
    return out


def _plan(hosts, cache, facts=None, groups=None, distro="debian12", **extra):
    groups = groups or {"minio": [n for n, _ in hosts]}
    return plan(hosts, groups, _cluster(cache, **extra),
                facts if facts is not None else _facts(hosts, distro), minio.deploy)


def _validated(hosts, cache, groups=None, **extra):
    groups = groups or {"minio": [n for n, _ in hosts]}
    return validate({n: (tuple(g for g, m in groups.items() if n in m),
                         {**_cluster(cache, **extra), **d}) for n, d in hosts})


# ---------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------


def test_one_node_with_a_directory(cache):
    hosts = [("solo", {"ssh_hostname": "10.10.0.5"})]
    p = _plan(hosts, cache)
    env = p.upload("solo", ENV_FILE)
    assert 'MINIO_VOLUMES="/var/lib/minio/data"\n' in env
    # One host on the management network only: bound to its address there, never 0.0.0.0.
    assert ('MINIO_OPTS="--address 10.10.0.5:9000 --console-address 10.10.0.5:9001"\n'
            in env)
    assert "0.0.0.0" not in env
    names = p.names("solo")
    assert not any(n.startswith(("Make XFS", "Mount", "Wipe")) for n in names)
    assert "mkdir -p /var/lib/minio/data" in p.op(
        "solo", "MinIO drive /var/lib/minio/data (owned by minio-user)").text
    assert "chown minio-user:minio-user /var/lib/minio/data" in p.commands("solo")
    # No buckets named: nothing for mc to do.
    assert "Buckets and their anonymous access (mc)" not in names


def test_four_nodes_with_two_drives_each(cache):
    hosts = _four()
    p = _plan(hosts, cache, minio_buckets=[{"name": "models", "policy": "download",
                                            "versioning": True}])
    volumes = 'MINIO_VOLUMES="http://stor{1...4}-storage:9000/mnt/minio{1...2}"\n'
    cluster = _validated(hosts, cache)
    assert minio_derive.layout(cluster)["pools"][0]["set_size"] == 8
    for i, (name, _) in enumerate(hosts, start=1):
        env = p.upload(name, ENV_FILE)
        assert volumes in env
        assert (f'MINIO_OPTS="--address 10.30.0.{40 + i}:9000 '
                f'--console-address 10.30.0.{40 + i}:9001"\n') in env
        for j in (1, 2):
            uuid = minio_derive.fs_uuid(cluster, name, _dev(name, j))
            assert p.op(name, f"Make XFS on {_dev(name, j)}").text == (
                f"mkfs.xfs -q -L minio -m uuid={uuid} {_dev(name, j)}")
            line = f"UUID={uuid} /mnt/minio{j} xfs noatime,nofail 0 2"
            assert p.op(name, f"Mount /mnt/minio{j} by UUID at boot (fstab, nofail)").text == (
                f"echo '{line}' >> /etc/fstab")
            mount = p.op(name, f"Mount /mnt/minio{j}").text
            assert mount.startswith(f"out=$(mount /mnt/minio{j} 2>&1)"), mount
            assert "--mountpoint /mnt/minio" in mount and "' xfs '" in mount, mount
    # The buckets, on the first host only, once the cluster has write quorum.
    first = p.names("stor1")
    assert first.index("Wait until the MinIO cluster has write quorum (/minio/health/cluster)") \
        < first.index("Buckets and their anonymous access (mc)")
    assert p.op("stor1", "Buckets and their anonymous access (mc)").commands == [
        "/usr/local/sbin/aicluster-minio-mc mb --ignore-existing aicluster/models",
        "/usr/local/sbin/aicluster-minio-mc anonymous set download aicluster/models",
        "/usr/local/sbin/aicluster-minio-mc version enable aicluster/models",
    ]
    assert "Buckets and their anonymous access (mc)" not in p.names("stor2")


@pytest.mark.parametrize("names, paths, volumes", [
    # Host names that do not run in sequence: every drive listed (one pool).
    (["alpha", "beta"], None,
     "http://alpha-storage:9000/mnt/minio1 http://alpha-storage:9000/mnt/minio2 "
     "http://beta-storage:9000/mnt/minio1 http://beta-storage:9000/mnt/minio2"),
    # Zero-padded numbers expand as MinIO's {01...04} does.
    ([f"s0{i}" for i in range(1, 5)], None, "http://s{01...04}-storage:9000/mnt/minio{1...2}"),
    # Drive paths of the inventory's own, in sequence.
    (["n8", "n9", "n10", "n11"], ["/data/disk7", "/data/disk8"],
     "http://n{8...11}-storage:9000/data/disk{7...8}"),
])
def test_volumes_in_expansion_notation_when_names_allow(cache, names, paths, volumes):
    hosts = []
    for i, name in enumerate(names):
        drives = [{"device": _dev(name, j), **({"path": paths[j - 1]} if paths else {})}
                  for j in (1, 2)]
        hosts.append(_host(name, 50 + i, minio_drives=drives))
    cluster = _validated(hosts, cache)
    assert minio_derive.layout(cluster)["volumes"] == volumes


def test_a_second_pool_expands_the_cluster(cache):
    hosts = [*_four(), *(_host(f"stor{i}", 40 + i, 2, minio_pool=2) for i in range(5, 9))]
    cluster = _validated(hosts, cache)
    assert minio_derive.layout(cluster)["volumes"] == (
        "http://stor{1...4}-storage:9000/mnt/minio{1...2} "
        "http://stor{5...8}-storage:9000/mnt/minio{1...2}")


@pytest.mark.parametrize("lengths, size", [
    ([4, 2], 8), ([4, 4], 16), ([3, 2], 6), ([8, 4], 16), ([2], 2), ([16], 16), ([6, 8], 12),
    ([5, 2], 10), ([12], 12),
])
def test_erasure_set_sizes_are_minios(lengths, size):
    assert minio_derive.erasure_set_size(lengths) == (size, "")


# ---------------------------------------------------------------------------
# The disk-safety rule
# ---------------------------------------------------------------------------


def _refused(caplog, p, host, *needles):
    assert p.ops[host] == [], f"{host}: operations were planned: {p.names(host)}"
    text = caplog.text
    for needle in needles:
        assert needle in text, text


def test_a_drive_holding_data_stops_its_host_before_anything_changes(cache, caplog):
    hosts = _four()
    records = {2: _record(_real("stor3", 2), [_sig("ext4", "backup")])}
    facts = _facts(hosts, block={"stor3": _block("stor3", 2, records)})
    with caplog.at_level(logging.ERROR):
        p = _plan(hosts, cache, facts)
    _refused(caplog, p, "stor3", f"host 'stor3': minio: {_dev('stor3', 2)} ({_real('stor3', 2)}) "
             "holds ext4 (label 'backup'); nothing is changed",
             "set wipe: true on this device in the inventory (minio_drives)")
    assert p.ops["stor1"], "the other hosts are planned as usual"
    assert not any("wipefs" in op.text or "mkfs" in op.text for op in p.ops["stor3"])


def test_wipe_true_is_honoured_wipe_then_mkfs(cache):
    hosts = _four()
    hosts[2][1]["minio_drives"][1]["wipe"] = True
    records = {2: _record(_real("stor3", 2), [_sig("ext4", "backup")])}
    p = _plan(hosts, cache, _facts(hosts, block={"stor3": _block("stor3", 2, records)}))
    names = p.names("stor3")
    wipe = f"Wipe the signatures on {_dev('stor3', 2)} (wipe: true in the inventory)"
    assert p.op("stor3", wipe).text == f"wipefs -a {_dev('stor3', 2)}"
    assert names.index(wipe) < names.index(f"Make XFS on {_dev('stor3', 2)}")
    assert not any(n.startswith("Wipe") for n in p.names("stor1"))


def test_a_mounted_drive_is_never_wiped(cache, caplog):
    # (The refused host is not the first: the harness activates hosts one by one.)
    hosts = _four()
    hosts[1][1]["minio_drives"][0]["wipe"] = True
    records = {1: _record(_real("stor2", 1), [_sig("xfs", "data")])}
    value = _block("stor2", 2, records)()
    value["lsblk"][1]["mountpoints"] = ["/srv/data"]
    with caplog.at_level(logging.ERROR):
        p = _plan(hosts, cache, _facts(hosts, block={"stor2": lambda **kw: value}))
    _refused(caplog, p, "stor2", "is mounted at /srv/data", "never wiped, even with wipe: true")


def test_our_own_drives_are_kept_and_mounted_by_their_uuid(cache):
    hosts = _four()
    records = {j: _record(_real("stor1", j), [_sig("xfs", "minio", f"uuid-{j}")]) for j in (1, 2)}
    p = _plan(hosts, cache, _facts(hosts, block={"stor1": _block("stor1", 2, records)}))
    assert not any(n.startswith("Make XFS") for n in p.names("stor1"))
    assert "UUID=uuid-1 /mnt/minio1 xfs" in p.op(
        "stor1", "Mount /mnt/minio1 by UUID at boot (fstab, nofail)").text


def test_a_directory_on_the_system_disk_is_refused_in_a_multi_drive_cluster(cache, caplog):
    hosts = [_host("stor1", 41, minio_drives=[{"path": "/srv/minio"}]),
             _host("stor2", 42, minio_drives=[{"path": "/srv/minio"}])]
    state = {n: {**state_parse([]), "dirs": {"/srv/minio": "root"}} for n, _ in hosts}
    state["stor1"]["dirs"] = {"/srv/minio": "other"}  # a drive mounted there by hand
    with caplog.at_level(logging.ERROR):
        p = _plan(hosts, cache, _facts(hosts, state=state))
    _refused(caplog, p, "stor2", "host 'stor2': minio: minio_drives: /srv/minio is on the "
             "system disk", "MinIO refuses such a drive when the cluster has more than one")
    assert p.ops["stor1"]


def test_a_directory_on_the_system_disk_is_fine_for_one_drive_alone(cache):
    hosts = [("solo", {"ssh_hostname": "10.10.0.5"})]
    state = {"solo": {**state_parse([]), "dirs": {"/var/lib/minio/data": "root"}}}
    p = _plan(hosts, cache, _facts(hosts, state=state))
    assert p.op("solo", RESTART).commands == [minio_derive.restart_command(300)]


def _fake_systemctl(tmp_path: Path, changes_after: int | None) -> dict[str, str]:
    """A ``systemctl`` on PATH that logs its arguments; ``show`` prints the old
    InvocationID until it has been asked ``changes_after`` times after the restart."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    script = bin_dir / "systemctl"
    after = "" if changes_after is None else str(changes_after)
    script.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$1" in
restart) touch {tmp_path}/restarted ;;
show)
    if [ -e {tmp_path}/restarted ] && [ -n "{after}" ]; then
        n=$(grep -c '^show' {log})
        [ "$n" -gt $(( {after} + 1 )) ] && {{ echo new-id; exit 0; }}
    fi
    echo old-id ;;
esac
""")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "LC_ALL": "C"}


def test_the_restart_returns_once_the_old_server_has_stopped(tmp_path):
    """A restart without --no-block would wait for the peers; one that returns at once
    lets the health check reach the old server, still stopping (CI saw it)."""
    import subprocess

    env = _fake_systemctl(tmp_path, changes_after=3)
    done = subprocess.run(["sh", "-c", minio_derive.restart_command(30)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[1] == "restart --no-block minio", calls
    assert calls.count("show -p InvocationID --value minio") == 5, calls

    stuck = tmp_path / "stuck"
    stuck.mkdir()
    env = _fake_systemctl(stuck, changes_after=None)
    done = subprocess.run(["sh", "-c", minio_derive.restart_command(1)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == ("minio.service did not stop and start again within 1 s "
                                   "(systemctl status minio)")


# ---------------------------------------------------------------------------
# Credentials
# ---------------------------------------------------------------------------


def test_credentials_are_only_in_the_env_file_0600_owned_by_minio_user(cache, caplog):
    hosts = _four()
    with caplog.at_level(logging.DEBUG):
        p = _plan(hosts, cache)
    for name, _ in hosts:
        env_op = p.op(name, "MinIO settings and root credentials (/etc/default/minio, mode "
                            "0600, never shown)")
        env = p.upload(name, ENV_FILE)
        assert f"MINIO_ROOT_PASSWORD={PASSWORD}\n" in env
        assert "MINIO_ROOT_USER=aicluster-admin\n" in env
        assert "chmod 600 /etc/default/minio" in env_op.commands
        assert "chown minio-user:minio-user /etc/default/minio" in env_op.commands
        # The directory of the file is never handed to minio-user.
        assert not any(c.startswith("chown minio-user:minio-user /etc/default\n")
                       or c == "chown minio-user:minio-user /etc/default"
                       for c in env_op.commands)
        for op in p.ops[name]:
            assert PASSWORD not in op.name
            if op is not env_op:
                assert PASSWORD not in op.text, op.name
        wrapper = p.upload(name, "/usr/local/sbin/aicluster-minio-mc")
        assert PASSWORD not in wrapper and ". /etc/default/minio" in wrapper
    assert PASSWORD not in caplog.text


def test_pyinfra_diff_is_refused_as_it_would_show_the_credentials(cache, caplog, monkeypatch):
    from pyinfra.api import Config

    from tests.deploys import harness

    monkeypatch.setattr(harness, "Config", lambda: Config(DIFF=True))
    hosts = [_host("stor1", 41, 2), _host("stor2", 42, 2)]
    with caplog.at_level(logging.ERROR), pytest.raises(minio_hosts_gone()):
        _plan(hosts, cache)
    assert "host 'stor1': minio: pyinfra's --diff would show /etc/default/minio" in caplog.text
    assert PASSWORD not in caplog.text
    # What a diff would read of the file: no line of it.
    text = minio_derive.SecretText(f"MINIO_ROOT_PASSWORD={PASSWORD}\n")
    assert PASSWORD not in "".join(text.readlines()) and PASSWORD in text.getvalue()


def minio_hosts_gone():
    from pyinfra.api.exceptions import PyinfraError

    return PyinfraError


def test_a_generated_secret_gives_a_derived_password_the_same_every_time(tmp_path):
    path = tmp_path / "secrets" / "minio.secret"
    first = minio_credentials.root_password({"file": str(path)}, "minio_root_password", 64)
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_bytes()) == 64
    assert first == minio_credentials.root_password({"file": str(path)}, "minio_root_password", 64)
    assert minio_credentials.PASSWORD_RE.match(first) and len(first) == 40


def test_a_text_secret_that_is_no_password_is_refused_without_showing_it(tmp_path):
    path = tmp_path / "pw"
    path.write_text("has spaces and $igns\n")
    with pytest.raises(minio.SecretError) as exc:
        minio_credentials.root_password({"file": str(path)}, "minio_root_password", 64)
    assert "secrets.minio_root_password: is text but not a MinIO root password" in str(exc.value)
    assert "spaces" not in str(exc.value)


# ---------------------------------------------------------------------------
# Upgrade and a second run
# ---------------------------------------------------------------------------


def _deployed(cache, hosts, p, binary: bytes = NEW, **extra) -> dict:
    """Facts of hosts where the plan ``p`` has run (with the binary ``binary``)."""
    cluster = _validated(hosts, cache, **extra)
    facts = {}
    for name, data in hosts:
        v = template_vars("minio", cluster, name, cluster.hosts[name].data, "Debian")
        release = v["minio_release_binary"]
        files: dict[str, bytes] = {release: binary, v["minio_mc_binary"]: MC}
        for op in p.ops[name]:
            for command in op.commands:
                if command.startswith("upload "):
                    dest, body = command[len("upload "):].split("\n", 1)
                    files[dest] = body.encode()
        fstab = [item["line"] for item in minio_derive.plan(
            _block(name, len(data.get("minio_drives") or []))(), {},
            v["minio_request"])["fstab"]]
        mounts = {d["path"]: {"source": _real(name, j), "fstype": "xfs"}
                  for j, d in enumerate(v["minio_drive_list"], start=1) if d["kind"] == "device"}
        uuids = {j: minio_derive.fs_uuid(cluster, name, _dev(name, j)) for j in (1, 2)}
        records = {j: _record(_real(name, j), [_sig("xfs", "minio", uuids[j])]) for j in (1, 2)}
        first = name == v["minio_first_host"]
        buckets = {"reachable": True, "names": [b["name"] for b in v["minio_bucket_list"]],
                   "anonymous": {b["name"]: b["policy"] for b in v["minio_bucket_list"]},
                   "versioning": {b["name"]: "Enabled" for b in v["minio_bucket_list"]}}
        state = {"minio": sha(binary), "mc": sha(MC), "active": "active", "enabled": "enabled",
                 "exe": release, "releases": [release], "dirs": {},
                 "buckets": buckets if first else None}

        def file_fact(path, files=files, **kw):
            if path not in files:
                return None
            mode = 600 if path == ENV_FILE else 700 if path.endswith("minio-mc") else 755 \
                if path.endswith("/mc") or ".RELEASE." in path else 644
            owner = "minio-user" if path == ENV_FILE else "root"
            return {"mode": mode, "user": owner, "group": owner}

        def sha1_fact(path, files=files, **kw):
            return hashlib.sha1(files[path]).hexdigest() if path in files else None

        def directory_fact(path, v=v, files=files, **kw):
            if path in files or ".RELEASE." in path:
                return None  # a file
            drive_paths = [d["path"] for d in v["minio_drive_list"]]
            owner = "minio-user" if path in [*drive_paths, "/var/lib/minio"] else "root"
            return {"mode": 750 if owner != "root" else 755, "user": owner, "group": owner}

        facts[name] = {
            "LinuxDistribution": DISTRIBUTIONS["debian12"], "Os": "Linux", "Arch": "x86_64",
            "Which": lambda command, **kw: f"/usr/bin/{command}",
            "DebPackages": {"xfsprogs": ["6.1.0"], "curl": ["7.88.1"]},
            "Date": None,
            "Groups": ["root", "minio-user"],
            "Users": {"minio-user": {"home": "/var/lib/minio", "shell": "/usr/sbin/nologin",
                                     "group": "minio-user", "groups": [], "comment": None,
                                     "uid": 999, "gid": 999}},
            "BlockDevices": _block(name, 2, records, mounts),
            "MinioState": state,
            "FindInFile": lambda path, pattern, fstab=fstab, **kw: [
                line for line in fstab if re.search(pattern.replace("[:space:]", r"\s"), line)
            ] if path == "/etc/fstab" else [],
            "File": file_fact, "Sha1File": sha1_fact, "Directory": directory_fact,
            "Link": lambda path, release=release, v=v, **kw: {
                "link_target": release, "user": "root", "group": "root"}
            if path == v["minio_binary"] else None,
        }
    return facts


def _apt_fresh(facts):
    """apt's index was refreshed a minute ago (no apt-get update is due)."""
    from datetime import datetime, timedelta

    now = datetime(2026, 1, 1, 12, 0)
    for f in facts.values():
        f["Date"] = now + timedelta(minutes=1)
        previous = f["File"]

        def file_fact(path, previous=previous, **kw):
            if path == "/var/lib/apt/periodic/update-success-stamp":
                return {"mode": 644, "user": "root", "group": "root", "mtime": now}
            return previous(path, **kw)

        f["File"] = file_fact
    return facts


BUCKETS = [{"name": "models", "policy": "download", "versioning": True}]


def test_a_second_run_changes_nothing(cache):
    hosts = _four()
    first = _plan(hosts, cache, minio_buckets=BUCKETS)
    facts = _apt_fresh(_deployed(cache, hosts, first, minio_buckets=BUCKETS))
    p = _plan(hosts, cache, facts, minio_buckets=BUCKETS)
    for name, _ in hosts:
        assert not p.changing(name), (name, p.changing(name))


def test_a_bucket_without_policy_that_mc_calls_private_is_left_alone(cache):
    """mc answers `anonymous get` for a bucket without a policy with "private" (its
    stringToAccessPerm), where the inventory and `mc anonymous set` say "none". Read
    as it was printed, every deploy set the policy again (found on the testbed)."""
    hosts = _four()
    buckets = [{"name": "scratch"}]
    first = _plan(hosts, cache, minio_buckets=buckets)
    facts = _apt_fresh(_deployed(cache, hosts, first, minio_buckets=buckets))
    printed = [
        "mc-rc=0", 'bucket={"status":"success","type":"folder","key":"scratch/"}',
        'anonymous=scratch {"operation":"get","status":"success","bucket":'
        '"aicluster/scratch","permission":"private"}',
        'versioning=scratch {"Op":"info","status":"success","url":"aicluster/scratch",'
        '"versioning":{"status":"","MFADelete":""}}',
    ]
    facts["stor1"]["MinioState"] = {**facts["stor1"]["MinioState"],
                                    "buckets": state_parse(printed)["buckets"]}
    assert facts["stor1"]["MinioState"]["buckets"]["anonymous"] == {"scratch": "none"}
    p = _plan(hosts, cache, facts, minio_buckets=buckets)
    assert not p.changing("stor1"), p.changing("stor1")


def test_a_version_bump_replaces_every_binary_then_restarts_all_servers_together(cache):
    hosts = _four()
    old = _plan(hosts, cache, version="1.0.0")
    facts = _apt_fresh(_deployed(cache, hosts, old, binary=OLD, version="1.0.0"))
    p = _plan(hosts, cache, facts, version="2.0.0")
    install = "Install the MinIO server 2.0.0"
    link = "/usr/local/bin/minio is MinIO 2.0.0"
    indexes = set()
    for name, _ in hosts:
        # The new release is written beside the running one, then the link switched.
        assert f"FileUploadCommand({cache / sha(NEW)}, /usr/local/bin/minio.RELEASE.2.0.0)" \
            in p.op(name, install).text
        assert p.op(name, link).commands == [
            "rm -f /usr/local/bin/minio",
            "ln -s /usr/local/bin/minio.RELEASE.2.0.0 /usr/local/bin/minio"]
        restart = p.op(name, RESTART)
        assert restart.commands == [minio_derive.restart_command(300)]
        assert not restart.conditional, "an upgrade restarts every server, unconditionally"
        assert not restart.serial, "all servers at once, not one host after another"
        indexes.add(restart.index)
        # Every server's binary is replaced before any server restarts.
        assert all(p.op(h, install).index < restart.index for h, _ in hosts)
        assert p.op(name, "Wait until MinIO answers (/minio/health/live)").index > restart.index
        # The old release goes last.
        remove = p.op(name, "Remove /usr/local/bin/minio.RELEASE.1.0.0 (every server runs "
                            "2.0.0)")
        assert remove.commands == ["rm -f /usr/local/bin/minio.RELEASE.1.0.0"]
        assert remove.index > restart.index
    assert len(indexes) == 1, "one restart operation on every server, at the same step"


def test_a_server_still_running_a_replaced_binary_restarts_all(cache):
    hosts = _four()
    first = _plan(hosts, cache)
    facts = _apt_fresh(_deployed(cache, hosts, first))
    facts["stor2"]["MinioState"] = {**facts["stor2"]["MinioState"],
                                    "exe": "/usr/local/bin/minio.RELEASE.1.0.0 (deleted)"}
    p = _plan(hosts, cache, facts)
    for name, _ in hosts:
        assert not p.op(name, RESTART).conditional
        assert p.op(name, RESTART).runs and p.op(name, WAIT).runs


WAIT = "Wait until MinIO answers (/minio/health/live)"
RELOAD_UNIT = "Reload systemd units (MinIO unit changed)"
UNIT = "/etc/systemd/system/minio.service"


def _second_run(cache, change=None):
    """Four servers planned again where the same plan ran; ``change(facts)`` alters
    what a node holds first."""
    hosts = _four()
    facts = _apt_fresh(_deployed(cache, hosts, _plan(hosts, cache)))
    if change:
        change(facts)
    return hosts, _plan(hosts, cache, facts)


def _holds(facts, name, dest, body: bytes):
    """``name`` holds ``body`` at ``dest`` instead of what the deploy wrote."""
    previous = facts[name]["Sha1File"]
    facts[name]["Sha1File"] = lambda path, **kw: (
        hashlib.sha1(body).hexdigest() if path == dest else previous(path, **kw))


def _guarded(p, name):
    """The ``_if`` operations that run on ``name``; the others must be skipped."""
    ops = [op for op in p.ops[name] if op.conditional]
    assert {RESTART, WAIT, RELOAD_UNIT} <= {op.name for op in ops}
    for op in ops:
        assert op.runs != op.skipped, op
    return {op.name for op in ops if op.runs}


def test_a_second_run_restarts_reloads_and_waits_for_nothing(cache):
    hosts, p = _second_run(cache)
    for name, _ in hosts:
        assert _guarded(p, name) == set(), name
        assert any(op.name.startswith("Reload systemd units (fstab:") for op in p.ops[name])


def test_a_changed_unit_reloads_systemd_and_restarts_every_server(cache):
    def change(facts):
        for name in facts:
            _holds(facts, name, UNIT, b"[Service]\n")

    hosts, p = _second_run(cache, change)
    for name, _ in hosts:
        assert _guarded(p, name) == {RELOAD_UNIT, RESTART, WAIT}, name
        assert p.op(name, RELOAD_UNIT).index < p.op(name, RESTART).index \
            < p.op(name, WAIT).index
        assert p.op(name, RESTART).commands == [minio_derive.restart_command(300)]


def test_changed_settings_or_link_restart_that_server_without_reloading_systemd(cache):
    for change in (
        lambda facts: _holds(facts, "stor2", ENV_FILE, b"MINIO_VOLUMES=older\n"),
        lambda facts: facts["stor2"].update(Link=lambda path, **kw: {
            "link_target": "/usr/local/bin/minio.RELEASE.0.9.0", "user": "root",
            "group": "root"} if path == "/usr/local/bin/minio" else None),
    ):
        hosts, p = _second_run(cache, change)
        assert _guarded(p, "stor2") == {RESTART, WAIT}
        for name in ("stor1", "stor3", "stor4"):
            assert _guarded(p, name) == set(), name


def test_a_changed_fstab_line_reloads_systemd_and_restarts_nothing(cache):
    def change(facts):
        lines = {"/mnt/minio1": "UUID=0000 /mnt/minio1 xfs defaults 0 0"}
        facts["stor3"]["FindInFile"] = lambda path, pattern, **kw: [
            line for line in lines.values() if re.search(pattern.replace("[:space:]", r"\s"),
                                                         line)] if path == "/etc/fstab" else []

    hosts, p = _second_run(cache, change)
    reloads = {op.name for op in p.ops["stor3"] if op.name.startswith("Reload systemd units ("
                                                                     "fstab:")}
    assert reloads == {"Reload systemd units (fstab: /mnt/minio1)",
                       "Reload systemd units (fstab: /mnt/minio2)"}
    # minio1's line is replaced; minio2's is missing and added.
    assert _guarded(p, "stor3") == reloads
    assert _guarded(p, "stor1") == set()


def test_a_stopped_server_is_started_and_waited_for_not_restarted(cache):
    def change(facts):
        facts["stor4"]["MinioState"] = {**facts["stor4"]["MinioState"], "active": "inactive"}

    hosts, p = _second_run(cache, change)
    assert p.op("stor4", "Start MinIO").runs
    assert _guarded(p, "stor4") == {WAIT}
    assert "Start MinIO" not in p.names("stor1")
    assert _guarded(p, "stor1") == set()


def test_a_changed_tls_file_restarts_that_server(cache, tmp_path):
    local = {}
    for dest, name, mode in (("public.crt", "stor.crt", 644), ("private.key", "stor.key", 600),
                             ("CAs/aicluster-ca.crt", "ca.crt", 644)):
        path = tmp_path / name
        path.write_text(f"stand-in {name} (test fixture)\n")
        local[f"/etc/minio/certs/{dest}"] = (path, mode)
    hosts = _four(minio_tls_cert_file=str(local["/etc/minio/certs/public.crt"][0]),
                  minio_tls_key_file=str(local["/etc/minio/certs/private.key"][0]),
                  minio_tls_ca_file=str(local["/etc/minio/certs/CAs/aicluster-ca.crt"][0]))
    facts = _apt_fresh(_deployed(cache, hosts, _plan(hosts, cache)))
    for name in facts:
        # The node holds the certificates the deploy copied; stor3 an older one.
        file_fact, sha1 = facts[name]["File"], facts[name]["Sha1File"]
        older = name == "stor3"
        facts[name]["File"] = lambda path, file_fact=file_fact, **kw: (
            {"mode": local[path][1], "user": "minio-user", "group": "minio-user"}
            if path in local else file_fact(path, **kw))
        facts[name]["Sha1File"] = lambda path, sha1=sha1, older=older, **kw: (
            hashlib.sha1(b"older" if older and path.endswith("public.crt") else
                         local[path][0].read_bytes()).hexdigest()
            if path in local else sha1(path, **kw))
    p = _plan(hosts, cache, facts)
    assert p.op("stor3", "TLS public.crt").commands
    assert _guarded(p, "stor3") == {RESTART, WAIT}
    for name in ("stor1", "stor2", "stor4"):
        assert not p.op(name, "TLS public.crt").commands, name
        assert _guarded(p, name) == set(), name


@pytest.mark.parametrize("distro", sorted(DISTRIBUTIONS))
def test_every_supported_system_plans(cache, distro):
    p = _plan(_four(), cache, distro=distro)
    install = p.op("stor1", "Install MinIO's tools (XFS, curl)").text
    assert "xfsprogs" in install
    assert ("curl" in install) == (distro != "rocky9")


# ---------------------------------------------------------------------------
# The facts and the golden environment file
# ---------------------------------------------------------------------------


def test_the_state_fact_parses_what_its_command_prints():
    lines = [
        "minio=" + sha(NEW), "mc=", "active=active", "enabled=enabled",
        "exe=/usr/local/bin/minio.RELEASE.1.0.0 (deleted)",
        "release=/usr/local/bin/minio.RELEASE.2.0.0", "dir=/srv/minio root", "mc-rc=0",
        'bucket={"status":"success","type":"folder","key":"models/"}',
        'anonymous=models {"status":"success","permission":"download"}',
        'versioning=models {"Op":"info","status":"success","versioning":{"status":"Enabled"}}',
    ]
    state = state_parse(lines)
    assert state["minio"] == sha(NEW) and state["exe"].endswith("(deleted)")
    assert state["dirs"] == {"/srv/minio": "root"}
    assert state["buckets"] == {"reachable": True, "names": ["models"],
                                "anonymous": {"models": "download"},
                                "versioning": {"models": "Enabled"}}
    assert state["releases"] == ["/usr/local/bin/minio.RELEASE.2.0.0"]
    assert not minio_derive.node_current(state, "/usr/local/bin/minio.RELEASE.2.0.0", sha(NEW))
    assert minio_derive.node_current({**state, "exe": "/usr/local/bin/minio.RELEASE.2.0.0"},
                              "/usr/local/bin/minio.RELEASE.2.0.0", sha(NEW))
    assert minio_derive.bucket_commands(state, [{"name": "models", "policy": "download",
                                          "versioning": True}]) == []
    command = state_command("/usr/local/bin/minio", "/usr/local/bin/mc", ["/srv/minio"],
                            ["models"])
    assert "MINIO_ROOT" not in command and "aicluster-minio-mc ls --json aicluster/" in command


def test_golden_environment_file_for_the_lab():
    cluster = load_cluster(PROJECT_ROOT / "inventories" / "lab.py")
    names = minio_derive.minio_hosts(cluster)
    assert names, "the lab inventory has MinIO hosts"
    for name in names:
        v = template_vars("minio", cluster, name, cluster.hosts[name].data, "Debian")
        # A stand-in password (the lab's is read from the environment at deploy time).
        v["minio_root_password"] = "golden-stand-in-password"
        assert_golden(GOLDEN / f"minio.{name}", render("minio", "minio.j2", v))
        assert_golden(GOLDEN / f"minio.service.{name}", render("minio", "minio.service.j2", v))


# ---------------------------------------------------------------------------
# Validation: host and field named, before any host is touched
# ---------------------------------------------------------------------------


def _errors(hosts, cache, groups=None, **extra) -> str:
    with pytest.raises(InventoryError) as exc:
        _validated(hosts, cache, groups, **extra)
    return str(exc.value)


def _drive_case(**host3):
    hosts = _four()
    hosts[2][1].update(host3)
    return hosts


BAD_HOST = [
    ({"minio_drives": [{"device": "sdb"}, {"device": _dev("stor3", 2)}]},
     "host 'stor3': minio_drives[0].device: 'sdb' is not a block device path"),
    ({"minio_drives": [{"device": _dev("stor3", 1)}, {"device": _dev("stor3", 1)}]},
     f"host 'stor3': minio_drives[1].device: {_dev('stor3', 1)} is listed twice"),
    ({"minio_drives": [{"device": _dev("stor3", 1), "wipe": "yes"}, {"device": _dev("stor3", 2)}]},
     "host 'stor3': minio_drives[0].wipe: Input should be a valid boolean (got 'yes')"),
    ({"minio_drives": [{"device": _dev("stor3", 1), "size": 4}, {"device": _dev("stor3", 2)}]},
     "host 'stor3': minio_drives[0].size: Extra inputs are not permitted"),
    ({"minio_drives": [{"path": "relative"}, {"path": "/srv/b"}]},
     "host 'stor3': minio_drives[0].path: String should match pattern '^/"),
    ({"minio_drives": [{"path": "/srv/a", "wipe": True}, {"path": "/srv/b"}]},
     "host 'stor3': minio_drives[0]: wipe: only a device is wiped"),
    ({"minio_drives": [{"path": "/var"}, {"path": "/srv/b"}]},
     "host 'stor3': minio_drives[0].path: '/var' is a system directory"),
    ({"minio_drives": [{"path": "/srv/a"}, {"path": "/srv/a/b"}]},
     "host 'stor3': minio_drives[1].path: /srv/a/b and /srv/a are nested"),
    ({"minio_drives": "/dev/sdb"},
     "host 'stor3': minio_drives: Input should be a valid list (got '/dev/sdb')"),
    ({"minio_drives": [42, {"device": _dev("stor3", 2)}]},
     "host 'stor3': minio_drives[0]: Input should be a valid dictionary"),
    ({"minio_drives": [{"wipe": False}, {"device": _dev("stor3", 2)}]},
     "host 'stor3': minio_drives[0]: must be {device: /dev/disk/by-id/..., wipe: false} or"),
    ({"minio_pool": 0},
     "host 'stor3': minio_pool: Input should be greater than or equal to 1 (got 0)"),
    ({"minio_fs_label": "much-too-long-label"},
     "host 'stor3': minio_fs_label: 'much-too-long-label' is not an XFS label"),
    ({"minio_mount_options": "noatime"},
     "host 'stor3': minio_mount_options: Input should be a valid list (got 'noatime')"),
    ({"minio_user": "Bad User"},
     "host 'stor3': minio_user: String should match pattern '^[a-z_][a-z0-9_-]{0,31}$' "
     "(got 'Bad User')"),
    ({"minio_tls_cert_file": "/nonexistent/stor3.crt"},
     "host 'stor3': minio_tls_key_file: not set, but minio_tls_cert_file is"),
    ({"base_firewall_public_ports": [{"port": 9001}]},
     "host 'stor3': base_firewall_public_ports[0]: opens the MinIO console port 9001"),
    ({"minio_port": 9100}, "host 'stor3': minio_port: 9100 differs from 9000 on host 'stor1'"),
    # Different drive counts in one pool.
    ({"minio_drives": [{"device": _dev("stor3", 1)}]},
     "host 'stor3': minio_drives: has 1 drive(s), host 'stor1' of the same server pool 1 has 2"),
]


@pytest.mark.parametrize("host3, needle", BAD_HOST,
                         ids=[n.split(": ")[1] + f"-{i}" for i, (_, n) in enumerate(BAD_HOST)])
def test_bad_host_input_is_rejected_naming_host_and_field(cache, host3, needle):
    text = _errors(_drive_case(**host3), cache)
    assert needle in text, text


BAD_CLUSTER = [
    ({"minio_network": "ib"}, "host 'stor1': minio_network: 'ib' is not a network of this"),
    ({"minio_network": "management", "minio_console_port": 9000},
     "host 'stor1': minio_console_port: 9000 is minio_port too"),
    ({"minio_port": "9000"},
     "host 'stor1': minio_port: Input should be a valid integer (got '9000')"),
    ({"minio_root_user": "ab"}, "host 'stor1': minio_root_user: 'ab' is not a root user name"),
    ({"minio_root_keys_name": ""},
     "host 'stor1': minio_root_keys_name: String should match pattern '^[a-z][a-z0-9_]*$' "
     "(got '')"),
    ({"minio_health_timeout": 0},
     "host 'stor1': minio_health_timeout: Input should be greater than or equal to 10 (got 0)"),
    ({"minio_config": {"MINIO_VOLUMES": "/x"}},
     "host 'stor1': minio_config.MINIO_VOLUMES: is computed from the inventory"),
    ({"minio_config": {"browser": "on"}},
     "host 'stor1': minio_config.browser: 'browser' is not a MinIO environment variable"),
    ({"minio_config": {"MINIO_BROWSER": 'on" x'}},
     "host 'stor1': minio_config.MINIO_BROWSER: 'on\" x' must be one value without quotes"),
    ({"minio_buckets": [{"name": "Bad_Name"}]},
     "host 'stor1': minio_buckets[0].name: 'Bad_Name' is not a bucket name"),
    ({"minio_buckets": [{"name": "models"}, {"name": "models"}]},
     "host 'stor1': minio_buckets[1].name: models is listed twice"),
    ({"minio_buckets": [{"name": "models", "policy": "private"}]},
     "host 'stor1': minio_buckets[0].policy: Input should be 'none', 'download', 'upload' or "
     "'public' (got 'private')"),
    ({"minio_buckets": [{"name": "models", "versioning": "on"}]},
     "host 'stor1': minio_buckets[0].versioning: Input should be a valid boolean (got 'on')"),
    ({"minio_buckets": [{"name": "models", "quota": 1}]},
     "host 'stor1': minio_buckets[0].quota: Extra inputs are not permitted"),
    ({"minio_buckets": "models"},
     "host 'stor1': minio_buckets: Input should be a valid list (got 'models')"),
    # A key minio does not have: refused with the nearest name.
    ({"minio_bucket": []}, "host 'stor1': minio_bucket: not a minio setting; did you mean "
     "minio_buckets?"),
    ({"minio_release_base_url": "github.com/minio"},
     "host 'stor1': minio_release_base_url: 'github.com/minio' is not an http(s) URL with no "
     "trailing '/' (where MinIO's releases are)"),
    ({"minio_release_base_url": "https://mirror.example.org/minio/"},
     "host 'stor1': minio_release_base_url: 'https://mirror.example.org/minio/' is not an "
     "http(s) URL with no trailing '/'"),
]


@pytest.mark.parametrize("extra, needle", BAD_CLUSTER,
                         ids=[n.split(": ")[1] + f"-{i}" for i, (_, n) in enumerate(BAD_CLUSTER)])
def test_bad_cluster_settings_are_rejected_naming_host_and_field(cache, extra, needle):
    text = _errors(_four(), cache, **extra)
    assert needle in text, text


def test_layouts_minio_refuses_are_rejected(cache):
    # 17 hosts of one drive: no erasure set size of 2 to 16 divides 17.
    hosts = [_host(f"n{i}", 10 + i) for i in range(1, 18)]
    text = _errors(hosts, cache)
    assert ("host 'n1': minio_drives: server pool 1 (n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, "
            "n11, n12, n13, n14, n15, n16, n17) has 17 drives: no erasure set size of 2 to 16 "
            "divides it; MinIO refuses that layout") in text, text
    # A second pool of one host with one drive: too few drives for erasure coding.
    hosts = [*_four(), _host("stor5", 45, 1, minio_pool=2)]
    text = _errors(hosts, cache)
    assert ("host 'stor5': minio_drives: server pool 2 (stor5) has 1 drive(s): erasure "
            "coding needs at least 2") in text, text
    # Several pools whose host names do not run in sequence.
    hosts = [*_four(), _host("alpha", 51, 2, minio_pool=2), _host("beta", 52, 2, minio_pool=2)]
    text = _errors(hosts, cache)
    assert "host 'alpha': minio_pool: server pool 2 (alpha, beta) cannot be written in MinIO's " \
           "expansion notation" in text, text


def test_drives_on_a_host_outside_the_group_are_rejected(cache):
    hosts = [*_four(), _host("other", 60, 2)]
    text = _errors(hosts, cache, {"minio": [f"stor{i}" for i in range(1, 5)]})
    assert "host 'other': minio_drives: is set but the host is not in the minio group" in text


def test_a_device_that_is_also_the_nvme_cache_or_a_ceph_osd_is_rejected(cache):
    hosts = _four()
    dev = _dev("stor3", 1)
    hosts[2][1]["ceph_osd_devices"] = [{"device": dev}]
    groups = {"minio": [n for n, _ in hosts], "ceph_mons": ["stor3"], "ceph_osds": ["stor3"]}
    text = _errors(hosts, cache, groups)
    assert (f"host 'stor3': minio_drives[0].device: {dev} is also a Ceph OSD device "
            "(ceph_osd_devices); a device has one use") in text, text


def test_tls_files_must_exist_on_the_deploying_machine(cache, tmp_path):
    cert, key, ca = (tmp_path / f for f in ("stor.crt", "stor.key", "ca.crt"))
    cert.write_text("stand-in certificate\n")
    key.write_text("stand-in key\n")
    hosts = [_host(n, i, 2, minio_tls_cert_file=str(cert), minio_tls_key_file=str(key),
                   minio_tls_ca_file=str(ca)) for i, n in ((41, "stor1"), (42, "stor2"))]
    text = _errors(hosts, cache)
    assert f"host 'stor1': minio_tls_ca_file: {ca} does not exist on the deploying machine" \
        in text, text
    ca.write_text("stand-in CA\n")
    p = _plan(hosts, cache)
    env = p.upload("stor1", ENV_FILE)
    assert "--certs-dir /etc/minio/certs" in env
    assert 'MINIO_VOLUMES="https://stor{1...2}-storage:9000/mnt/minio{1...2}"' in env
    assert "SSL_CERT_FILE=/etc/minio/certs/CAs/aicluster-ca.crt" in p.upload(
        "stor1", "/usr/local/sbin/aicluster-minio-mc")
    key_op = p.op("stor1", "TLS private.key")
    assert "chmod 600 /etc/minio/certs/private.key" in key_op.commands
    # Every host serves TLS, or none.
    hosts[1][1].pop("minio_tls_cert_file")
    text = _errors(hosts, cache)
    assert "host 'stor2': minio_tls_cert_file: not set, but host 'stor1' serves TLS" in text, text


# ---------------------------------------------------------------------------
# The release source: MinIO's own download site is gone (410 since September 2026); the
# same files are the GitHub release assets of the archived projects
# ---------------------------------------------------------------------------

GITHUB = "https://github.com/minio"
SERVER_PINS = {  # roles/minio/defaults/main.yml, unchanged by the move
    ("2025-04-22T22-12-26Z", "amd64"):
        "53e2a2cb16c5366ea6fbbc479c19ddb4c6a0948273e752f740fb1fbf27bb817c",
    ("2025-04-22T22-12-26Z", "arm64"):
        "6c2f3142c94240206123177f4ba1e360daa5d1e0a4962e90757ef4f92c3ab57c",
    ("2025-04-08T15-41-24Z", "amd64"):
        "aa479bd2456d0722a6737f82a1cf193aa60f934269573a6a7e024aebe1069243",
    ("2025-04-08T15-41-24Z", "arm64"):
        "efce312e379102256112e5ec0c310348239725f20baa245631c9a110ec6d974c",
}
MC_PINS = {"amd64": "ac90da87a35641be5a0ac75d49de5161ddb47d629b5ba01261b0ae9e00aea15f",
           "arm64": "61bb88e7435919834478ddd4d405a6de6d2c227079da5e8ee9655147398819a0"}
MC_RELEASE = "RELEASE.2025-04-16T18-13-26Z"


def _default_pins(cache, version, arch, **extra):
    """The artifacts a host of ``arch`` needs with the defaults' own pins."""
    hosts = [_host("stor1", 41, hardware={"arch": arch, "nics": [
        {"name": "ens2", "network": "storage", "speed_gbps": 100, "address": "10.30.0.41",
         "mtu": 9000}]})]
    data = _cluster(cache, version=version, **extra)
    del data["minio_artifacts"]
    cluster = validate({"stor1": (("minio",), {**data, **hosts[0][1]})})
    return cluster, artifacts.host_artifacts(cluster, "stor1", "minio")


@pytest.mark.parametrize("version, arch", sorted(SERVER_PINS))
def test_the_default_pins_are_the_github_release_assets_with_the_same_checksums(
        cache, version, arch):
    _cluster_, arts = _default_pins(cache, version, arch)
    server, mc = arts["minio"], arts["mc"]
    assert server.url == (f"{GITHUB}/minio/releases/download/RELEASE.{version}/"
                          f"minio.linux-{arch}.RELEASE.{version}")
    assert mc.url == f"{GITHUB}/mc/releases/download/{MC_RELEASE}/mc.linux-{arch}.{MC_RELEASE}"
    # The same files as before the move: the same checksums, and the same names in an
    # artifact directory (aicluster artifacts fetch) and in /usr/local/bin.
    assert server.sha256 == SERVER_PINS[(version, arch)] and mc.sha256 == MC_PINS[arch]
    assert server.filename == f"minio.RELEASE.{version}" and mc.filename == f"mc.{MC_RELEASE}"
    assert server.relpath == f"minio/{version}/{arch}/minio.RELEASE.{version}"


def test_a_mirror_of_the_releases_is_a_setting_and_keeps_the_checksums(cache):
    mirror = "https://mirror.example.org/github/minio"
    _c, arts = _default_pins(cache, "2025-04-22T22-12-26Z", "amd64",
                             minio_release_base_url=mirror)
    assert arts["minio"].url == (f"{mirror}/minio/releases/download/RELEASE.2025-04-22T22-12-26Z"
                                 "/minio.linux-amd64.RELEASE.2025-04-22T22-12-26Z")
    assert arts["mc"].url.startswith(f"{mirror}/mc/releases/download/{MC_RELEASE}/")
    assert arts["minio"].sha256 == SERVER_PINS[("2025-04-22T22-12-26Z", "amd64")]
    assert arts["minio"].filename == "minio.RELEASE.2025-04-22T22-12-26Z"


ARCHIVED = ("groups: minio: MinIO's community edition is archived upstream and gets no more "
            "releases or security fixes")


def test_a_plan_with_minio_hosts_warns_that_minio_is_archived(cache):
    cluster = _validated(_four(), cache)
    assert [w for w in cluster.warnings if ARCHIVED in w] == [
        "host 'stor1': " + ARCHIVED + "; the pinned release still installs (from its GitHub "
        "release assets, minio_release_base_url); plan a move to a maintained S3 store "
        "(docs/components/minio.md)"
    ]
    # No MinIO host, no warning.
    other = _validated([_host("solo", 5)], cache, groups={"ollama": ["solo"]})
    assert not [w for w in other.warnings if "minio" in w]
