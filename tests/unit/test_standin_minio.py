"""The STAND-IN MinIO and mc the minio end-to-end tests deploy (tests/e2e/standins/
minio.py), run here on this machine before they go to the testbed: two servers on
127.0.0.1 (two ports, a drive each under /dev/shm: a file system other than /'s, as a
multi-drive deployment needs) started from the built release file, as systemd starts it.

- the release file is the compiled launcher: its process is the release file
  (/proc/PID/exe, what the deploy reads), it tells $NOTIFY_SOCKET READY=1 once both
  servers answer, and it exits 0 on SIGTERM;
- boto3 with the root credentials: a bucket made through one server, an object put
  through one and read through the other; a wrong password is refused
  (SignatureDoesNotMatch), a wrong user too (InvalidAccessKeyId), so is a tampered
  payload; anonymous users get what the bucket's policy grants, nothing else;
- the stand-in mc answers what the role runs, in the JSON the fact parses
  (aicluster.components.minio.facts), with "private" for no policy as the real mc says;
- writes are refused while a server is down, /minio/health/cluster says 503;
- /minio/v2/metrics/cluster takes the bearer token aicluster mints
  (aicluster.common.minio_credentials, checked by the stand-in's own code) and refuses
  any other (403); its drive and node gauges follow the servers that answer (promtool
  check metrics reads them where promtool is installed).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from aicluster import PROJECT_ROOT
from aicluster.common.minio_credentials import prometheus_token
from aicluster.components.minio.probe import parse as state_parse
from tests.e2e.standins import minio as standin

USER = "aicluster-admin"
PASSWORD = "stand-in-password-0123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    art = tmp_path_factory.mktemp("artifacts")
    overrides = standin.build(art)
    version = overrides["minio_version"]
    return {
        "overrides": overrides,
        "minio": art / "minio" / version / "amd64" / f"minio.RELEASE.{version}",
        "mc": art / "minio" / version / "amd64" / "mc",
    }


def _server_env(notify: Path) -> dict[str, str]:
    """The environment systemd gives a server: the root credentials, $NOTIFY_SOCKET."""
    return {"PATH": "/usr/bin:/bin", "MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": PASSWORD,
            "NOTIFY_SOCKET": str(notify)}


@pytest.fixture(scope="module")
def cluster(built):
    """Two stand-in servers of one deployment, started like systemd starts them."""
    shm = Path(tempfile.mkdtemp(prefix="aicluster-standin-", dir="/dev/shm"))
    drives = [shm / "d1", shm / "d2"]
    for d in drives:
        d.mkdir()
    ports = [_free_port(), _free_port()]
    volumes = " ".join(f"http://127.0.0.1:{p}{d}" for p, d in zip(ports, drives, strict=True))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = shm / "notify"
    notify.bind(str(notify_path))
    notify.settimeout(30)
    env = _server_env(notify_path)
    procs = []
    try:
        for p in ports:
            procs.append(subprocess.Popen(
                [str(built["minio"]), "server", "--address", f"127.0.0.1:{p}",
                 "--console-address", f"127.0.0.1:{_free_port()}", *volumes.split()],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        ready = sorted(notify.recv(4096).decode().splitlines()[0] for _ in procs)
        assert ready == ["READY=1", "READY=1"]
        yield {"ports": ports, "procs": procs, "drives": drives, "volumes": volumes,
               "env": env}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        notify.close()
        subprocess.run(["rm", "-rf", str(shm)], check=False)


# boto3 (a test dependency, pyproject.toml) is imported where it is used, not when the
# module is collected: the fake-host tests import pyinfra in this process, which
# monkey-patches ssl with gevent, and botocore imported before that patch then fails
# (RecursionError in ssl) when it makes a client.


def _client_error() -> type:
    from botocore.exceptions import ClientError

    return ClientError


def _s3(port: int, password: str = PASSWORD, user: str = USER):
    import boto3
    from botocore.client import Config

    return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                        aws_access_key_id=user, aws_secret_access_key=password,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}))


def _mc(built, port: int, *args: str, password: str = PASSWORD) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin",
           "MC_HOST_aicluster": f"http://{USER}:{password}@127.0.0.1:{port}"}
    return subprocess.run([str(built["mc"]), "--config-dir", "/nonexistent", "--quiet", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_release_files_are_pinned_and_say_they_are_stand_ins(built, tmp_path):
    overrides = built["overrides"]
    pins = overrides["minio_artifacts"]
    assert overrides["minio_version"] == standin.VERSIONS[0]
    assert set(pins["minio"]["sha256"]) == set(standin.VERSIONS) == set(pins["mc"]["sha256"])
    data = built["minio"].read_bytes()
    assert data[:4] == b"\x7fELF", "the server's release file is an executable of its own"
    assert standin.sha256(data) == pins["minio"]["sha256"][standin.VERSIONS[0]]["amd64"]
    out = subprocess.run([str(built["minio"]), "--version"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0
    assert out.stdout.strip() == (f"minio version RELEASE.{standin.VERSIONS[0]} "
                                  "(STAND-IN for tests, not MinIO)")
    out = subprocess.run([str(built["mc"]), "--version"], capture_output=True, text=True,
                         timeout=30)
    assert "STAND-IN" in out.stdout
    out = subprocess.run([str(built["minio"]), "gateway", "s3"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1 and "STAND-IN minio: unsupported command" in out.stderr
    assert standin.pinned_versions(overrides) == list(standin.VERSIONS)


def test_the_process_is_the_release_file_and_every_request_is_signed(built, cluster):
    for proc in cluster["procs"]:
        assert os.readlink(f"/proc/{proc.pid}/exe") == str(built["minio"])
    a, b = (_s3(p) for p in cluster["ports"])
    a.create_bucket(Bucket="models")
    body = os.urandom(300_000)
    a.put_object(Bucket="models", Key="dir/weights.bin", Body=body)
    got = b.get_object(Bucket="models", Key="dir/weights.bin")
    assert got["Body"].read() == body
    assert [o["Key"] for o in b.list_objects_v2(Bucket="models")["Contents"]] == [
        "dir/weights.bin"]
    listed = b.list_objects_v2(Bucket="models", Delimiter="/")
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["dir/"]
    assert "models" in [x["Name"] for x in b.list_buckets()["Buckets"]]
    # On every drive: each server keeps every object.
    for drive in cluster["drives"]:
        assert (drive / "models" / "dir" / "weights.bin").read_bytes() == body
    with pytest.raises(_client_error()) as wrong:
        _s3(cluster["ports"][1], password="not-the-password").get_object(
            Bucket="models", Key="dir/weights.bin")
    assert wrong.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(_client_error()) as who:
        _s3(cluster["ports"][0], user="someone-else").list_buckets()
    assert who.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    with pytest.raises(_client_error()) as nobody:
        a.get_object(Bucket="models", Key="missing")
    assert nobody.value.response["Error"]["Code"] == "NoSuchKey"


def test_a_tampered_payload_is_refused(cluster):
    from tests.e2e.standins.minio_standin import sign

    port = cluster["ports"][0]
    headers = sign("PUT", f"127.0.0.1:{port}", "/models/x", "", {}, b"signed", USER, PASSWORD)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/models/x", data=b"changed",
                                 method="PUT", headers=headers)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and b"XAmzContentSHA256Mismatch" in e.value.read()


def test_anonymous_users_get_what_the_policy_grants(built, cluster):
    port = cluster["ports"][0]
    a = _s3(port)
    for name in ("public-data", "private-data"):
        a.create_bucket(Bucket=name)
        a.put_object(Bucket=name, Key="f.txt", Body=b"hello")
    assert _mc(built, port, "anonymous", "set", "download", "aicluster/public-data").returncode == 0
    url = f"http://127.0.0.1:{cluster['ports'][1]}"
    with urllib.request.urlopen(f"{url}/public-data/f.txt", timeout=10) as r:
        assert r.read() == b"hello"
    for path in ("/private-data/f.txt", "/private-data", "/"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{url}{path}", timeout=10)
        assert e.value.code == 403, path
    put = urllib.request.Request(f"{url}/public-data/g.txt", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(put, timeout=10)
    assert e.value.code == 403, "download does not grant uploads"


def test_mc_answers_what_the_role_runs_in_what_the_fact_parses(built, cluster, tmp_path):
    port = cluster["ports"][0]
    # Its own "models" bucket (another test of the module may make it first, or not run).
    assert _mc(built, port, "mb", "--ignore-existing", "aicluster/models").returncode == 0
    for _ in range(2):
        out = _mc(built, port, "mb", "--ignore-existing", "aicluster/checkpoints")
        assert out.returncode == 0, out.stderr
    again = _mc(built, port, "mb", "aicluster/checkpoints")
    assert again.returncode == 1 and "already own it" in again.stderr
    assert _mc(built, port, "version", "enable", "aicluster/checkpoints").returncode == 0
    assert _mc(built, port, "anonymous", "set", "download", "aicluster/checkpoints"
               ).returncode == 0
    assert _mc(built, port, "anonymous", "set", "none", "aicluster/models").returncode == 0
    lines = ["mc-rc=0"]
    lines += [f"bucket={line}" for line in _mc(built, port, "ls", "--json", "aicluster/"
                                               ).stdout.splitlines()]
    for name in ("checkpoints", "models"):
        for kind, args in (("anonymous", ["anonymous", "get"]), ("versioning", ["version",
                                                                               "info"])):
            text = _mc(built, port, *args, "--json", f"aicluster/{name}").stdout
            lines.append(f"{kind}={name} {text.replace(chr(10), '')}")
    state = state_parse(lines)["buckets"]
    assert state["reachable"]
    assert {"checkpoints", "models"} <= set(state["names"])
    assert state["anonymous"]["checkpoints"] == "download"
    assert state["anonymous"]["models"] == "none", "mc says private; the fact reads none"
    assert state["versioning"] == {"checkpoints": "Enabled", "models": ""}
    src = tmp_path / "probe.bin"
    src.write_bytes(os.urandom(5000))
    assert _mc(built, port, "cp", str(src), "aicluster/checkpoints/probe.bin").returncode == 0
    cat = subprocess.run([str(built["mc"]), "cat", "aicluster/checkpoints/probe.bin"],
                         env={"MC_HOST_aicluster":
                              f"http://{USER}:{PASSWORD}@127.0.0.1:{cluster['ports'][1]}"},
                         capture_output=True, timeout=60)
    assert cat.stdout == src.read_bytes()
    wrong = _mc(built, port, "ls", "aicluster/", password="not-the-password")
    assert wrong.returncode == 1
    assert "signature we calculated does not match" in wrong.stderr
    unsupported = _mc(built, port, "admin", "info", "aicluster")
    assert unsupported.returncode == 1 and "STAND-IN: unsupported command" in unsupported.stderr


def _metrics(port: int, token: str | None) -> tuple[int, str]:
    """GET MinIO's cluster metrics from the server on ``port`` (with ``token`` as the
    bearer token): the status and the body."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/minio/v2/metrics/cluster")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _gauges(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            out[name_labels.split("{", 1)[0]] = float(value)
    return out


def _other_issuer_token() -> str:
    """A token right in every way but its issuer (MinIO takes only "prometheus")."""
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    signing = f"{part({'alg': 'HS512', 'typ': 'JWT'})}." + part(
        {"exp": 4102444800, "iss": "console", "sub": USER})
    mac = hmac.new(PASSWORD.encode(), signing.encode(), hashlib.sha512).digest()
    return f"{signing}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"


def test_cluster_metrics_take_the_token_aicluster_mints_and_no_other(cluster):
    """The stand-in checks the token with its own code (verify_metrics_token), apart
    from aicluster's minting: the minted token passing it proves the two agree."""
    port = cluster["ports"][0]
    status, text = _metrics(port, prometheus_token(USER, PASSWORD))
    assert status == 200, text
    gauges = _gauges(text)
    capacity = {k: gauges.pop(k) for k in ("minio_cluster_capacity_usable_total_bytes",
                                           "minio_cluster_capacity_usable_free_bytes")}
    assert gauges == {
        "minio_cluster_drive_offline_total": 0, "minio_cluster_drive_online_total": 2,
        "minio_cluster_drive_total": 2, "minio_cluster_nodes_offline_total": 0,
        "minio_cluster_nodes_online_total": 2}
    assert 0 < capacity["minio_cluster_capacity_usable_free_bytes"] \
        <= capacity["minio_cluster_capacity_usable_total_bytes"], capacity
    assert f'server="127.0.0.1:{port}"' in text
    promtool = shutil.which("promtool") or str(
        PROJECT_ROOT / ".venv" / "opt" / "prometheus" / "usr" / "bin" / "promtool")
    if Path(promtool).exists():
        lint = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                              capture_output=True, timeout=30)
        # Parsed (1 would be a format error); the one lint promtool raises is MinIO's own
        # naming: these gauges end in _total (MinIO declares them gauges).
        lines = (lint.stdout + lint.stderr).splitlines()
        assert lint.returncode in (0, 3), lines
        assert all('non-counter metrics should not have "_total" suffix' in line
                   for line in lines if line.strip()), lines
    good = prometheus_token(USER, PASSWORD)
    header, claims, sig = good.split(".")
    other_claims = base64.urlsafe_b64encode(json.dumps(
        {"exp": 4102444801, "iss": "prometheus", "sub": USER}).encode()
    ).decode().rstrip("=")
    refused = {
        "no token": None,
        "the wrong password": prometheus_token(USER, "not-the-password"),
        "another user": prometheus_token("someone-else", PASSWORD),
        "expired": prometheus_token(USER, PASSWORD, expires=int(time.time()) - 60),
        "claims changed after signing": f"{header}.{other_claims}.{sig}",
        "another issuer": _other_issuer_token(),
        "not a JWT": "not-a-jwt",
    }
    for why, token in refused.items():
        status, body = _metrics(port, token)
        assert status == 403, why
        assert "AccessDenied" in body, why


def test_writes_wait_for_every_server_and_sigterm_stops_cleanly(cluster):
    """Last: stops the second server (the cluster metrics then say so)."""
    a_port, b_port = cluster["ports"]
    b = cluster["procs"][1]
    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=20) == 0
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{a_port}/minio/health/cluster", timeout=10)
    assert e.value.code == 503
    with urllib.request.urlopen(f"http://127.0.0.1:{a_port}/minio/health/live",
                                timeout=10) as r:
        assert r.status == 200
    with pytest.raises(_client_error()) as refused:
        _s3(a_port).put_object(Bucket="models", Key="late", Body=b"x")
    assert refused.value.response["Error"]["Code"] == "SlowDownWrite"
    status, text = _metrics(a_port, prometheus_token(USER, PASSWORD))
    assert status == 200
    gauges = _gauges(text)
    assert (gauges["minio_cluster_nodes_offline_total"],
            gauges["minio_cluster_nodes_online_total"]) == (1, 1)
    assert (gauges["minio_cluster_drive_offline_total"],
            gauges["minio_cluster_drive_online_total"]) == (1, 1)
    started = time.monotonic()
    a = cluster["procs"][0]
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=20) == 0 and time.monotonic() - started < 5


#: Bursts of SIGTERMs, each to a freshly started server.
ROUNDS = 10


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def test_bursts_of_sigterms_to_launcher_and_server_always_stop_it(built):
    """systemd's stop (KillMode=control-group) sends SIGTERM to the launcher and the
    server together, and the launcher forwards its own: a signal can land while the
    server's handler still runs. Given bursts of SIGTERMs, to both, the server must
    stop every time (a handler that took a lock, threading.Event.set, deadlocked here
    and in the lab, leaving minio.service in stop-sigterm for ever: its unit, as MinIO's
    own, waits for the server however long it takes)."""
    shm = Path(tempfile.mkdtemp(prefix="aicluster-standin-", dir="/dev/shm"))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(shm / "notify"))
    notify.settimeout(30)
    env = _server_env(shm / "notify")
    (shm / "d1").mkdir()
    try:
        for _ in range(ROUNDS):
            proc = subprocess.Popen(
                [str(built["minio"]), "server", "--address", f"127.0.0.1:{_free_port()}",
                 "--console-address", f"127.0.0.1:{_free_port()}", str(shm / "d1")],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                assert notify.recv(4096).decode().startswith("READY=1")
                (server,) = _children(proc.pid)
                # A burst, then nothing more: a handler blocked on a lock its own thread
                # holds waits for ever once no later signal interrupts it.
                for pid in (server, proc.pid, server, server):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                # Stopped: cleanly, or by a SIGTERM that landed once Python had put the
                # default action back while exiting (systemd counts both as a clean stop).
                assert proc.wait(timeout=15) in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
            finally:
                if proc.poll() is None:
                    for pid in _children(proc.pid):
                        os.kill(pid, signal.SIGKILL)
                    proc.kill()
                    proc.wait()
    finally:
        notify.close()
        subprocess.run(["rm", "-rf", str(shm)], check=False)
