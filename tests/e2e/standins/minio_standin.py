"""STAND-IN for MinIO's server and its client mc (tests only, never a real MinIO).

MinIO's release binaries cannot be downloaded on the machines the tests run on, so
tests/e2e/standins/minio.py builds two release files from this one file (Python 3
standard library only; the testbed's nodes have python3):

- ``minio.RELEASE.<version>``: a small compiled launcher (minio_launcher.c) with this file
  appended as a zip archive's ``__main__.py`` (``PROGRAM = "minio"``);
- ``mc``: this file as a script (``PROGRAM = "mc"``).

The server answers what the minio deploy, the role and the tests use, and refuses
anything else with "STAND-IN: unsupported ...":

- ``minio --version``; ``minio server --address IP:PORT --console-address IP:PORT VOLUMES``
  with ``MINIO_ROOT_USER`` and ``MINIO_ROOT_PASSWORD`` from the environment, VOLUMES in
  MinIO's expansion notation (``http://node{1...2}:9000/mnt/minio1`` or local paths).
  It finds its own endpoints as MinIO does (the host is this machine, the port its
  own), checks each local drive exists, is writable and, when the deployment has
  more than one drive, is not on the root drive (MinIO refuses that);
- binds the S3 API and the console to exactly the addresses it is given;
- S3 over HTTP, path style: ListBuckets; Create/Head/DeleteBucket; Get/Put/DeleteBucket
  policy; Get/PutBucketVersioning (the status only: no object versions are kept);
  GetBucketLocation; ListObjects (v1, v2); Put/Get/Head/DeleteObject;
- every request is authenticated by verifying its AWS Signature Version 4 against
  MINIO_ROOT_USER / MINIO_ROOT_PASSWORD (HMAC-SHA256, the payload's sha256 checked);
  a wrong access key is InvalidAccessKeyId, a wrong secret SignatureDoesNotMatch (403).
  Requests without a signature get only what the bucket's policy grants anonymous
  users (s3:GetObject for ``mc anonymous set download`` ...);
- a distributed deployment keeps every object on every drive: each write is applied
  to the local drives and forwarded to every other server, signed with the root
  credentials (so servers with different credentials cannot work together), and
  refused (503) while a server does not answer, as MinIO without write quorum;
- ``/minio/health/live`` (the process is up), ``/minio/health/cluster`` (every
  server answers);
- ``/minio/v2/metrics/cluster``, what Prometheus scrapes: the request needs
  ``Authorization: Bearer <JWT>`` as ``mc admin prometheus generate`` makes it, checked
  here in this file's own code (verify_metrics_token): HMAC (HS256/384/512 by the
  header's ``alg``; ours is HS512) with MINIO_ROOT_PASSWORD over ``header.claims``, the
  access key (claim ``accessKey``, else ``sub``) MINIO_ROOT_USER (the stand-in has no
  other users), ``iss`` "prometheus", ``exp`` in the future (required here; MinIO's
  parser leaves it optional); anything else is refused 403 (AccessDenied), as MinIO's
  metrics AuthMiddleware refuses it (minio/minio cmd/metrics.go, cmd/jwt.go,
  internal/jwt/parser.go). With MINIO_PROMETHEUS_AUTH_TYPE=public no token is needed.
  It serves, in Prometheus' text format, gauges with MinIO's v2 names (minio/minio
  docs/metrics/prometheus/list.md, "Cluster Drive Metrics" and "Cluster Health
  Metrics"), label ``server`` (its own API address): ``minio_cluster_drive_online_total``,
  ``minio_cluster_drive_offline_total``, ``minio_cluster_drive_total``,
  ``minio_cluster_capacity_usable_{total,free}_bytes`` (the smallest local drive's),
  ``minio_cluster_nodes_online_total`` and ``minio_cluster_nodes_offline_total``. The
  values come from the stand-in's own state, never from a real MinIO: its own drives
  that are directories, and the drives of every server that answers its health check,
  are online; the other drives (a server that does not answer: all of its drives) are
  offline; a server that does not answer is a node offline, itself and the others
  online;
- tells systemd it is ready (``READY=1``) once every other server answers, as MinIO
  reports ready only once its peers are up; exits 0 on SIGTERM.

mc: ``--version``; ``ls``, ``mb [--ignore-existing]``, ``anonymous set|get``,
``version enable|suspend|info``, ``cp`` (a local file to or from the server), ``cat``
and ``rm`` (one object), with ``--json``, ``--quiet`` and ``--config-dir``; the alias's endpoint and
credentials from ``MC_HOST_<alias>``, as mc reads them. It signs its requests itself.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import email.utils
import fnmatch
import hashlib
import hmac
import http.client
import http.server
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
import zlib
from pathlib import Path
from xml.etree import ElementTree
from xml.sax.saxutils import escape

#: Set in each release file tests/e2e/standins/minio.py builds: the program this file is
#: ("minio" or "mc"; empty: the first argument names it) and the version it reports.
PROGRAM = ""
VERSION = "dev"

STANDIN = "STAND-IN"
ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED = "UNSIGNED-PAYLOAD"
S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
INTERNODE = "x-minio-standin-internode"
MAX_BODY = 256 * 1024 * 1024
MAX_SKEW = datetime.timedelta(minutes=15)
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=([^,\s]+)\s*,\s*SignedHeaders=([^,\s]+)\s*,"
    r"\s*Signature=([0-9a-f]{64})\s*$"
)
ELLIPSES_RE = re.compile(r"\{([^{}]*)\.\.\.([^{}]*)\}")
#: MinIO's cluster metrics (v2), what Prometheus scrapes.
METRICS_PATH = "/minio/v2/metrics/cluster"
#: The HMAC signing methods MinIO's JWT parser accepts (internal/jwt/parser.go).
JWT_HASHES = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}
B64URL_RE = re.compile(r"^[A-Za-z0-9_-]*$")


class Unsupported(Exception):
    """Something the stand-in does not do (said loudly, never ignored)."""


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ---------------------------------------------------------------------------
# AWS Signature Version 4 (both programs)
# ---------------------------------------------------------------------------


def canonical_uri(raw_path: str) -> str:
    return urllib.parse.quote(urllib.parse.unquote(raw_path), safe="/")


def query_pairs(raw_query: str) -> list[tuple[str, str]]:
    pairs = []
    for part in raw_query.split("&") if raw_query else []:
        if part:
            key, _, value = part.partition("=")
            pairs.append((urllib.parse.unquote(key), urllib.parse.unquote(value)))
    return pairs


def canonical_query(raw_query: str) -> str:
    encoded = sorted((urllib.parse.quote(k, safe=""), urllib.parse.quote(v, safe=""))
                     for k, v in query_pairs(raw_query))
    return "&".join(f"{k}={v}" for k, v in encoded)


def canonical_request(method: str, raw_path: str, raw_query: str, values: dict[str, str],
                      signed: list[str], payload_hash: str) -> str:
    headers = "".join(f"{name}:{values[name]}\n" for name in signed)
    return "\n".join([method, canonical_uri(raw_path), canonical_query(raw_query), headers,
                      ";".join(signed), payload_hash])


def signature(secret: str, amz_date: str, scope: str, creq: str) -> str:
    date, region, service, _ = scope.split("/")
    key = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    to_sign = "\n".join([ALGORITHM, amz_date, scope,
                         hashlib.sha256(creq.encode()).hexdigest()])
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def sign(method: str, host: str, raw_path: str, raw_query: str, headers: dict[str, str],
         body: bytes, access: str, secret: str, region: str = "us-east-1") -> dict[str, str]:
    """The headers of a request signed with AWS Signature Version 4 (payload hashed)."""
    amz_date = now().strftime("%Y%m%dT%H%M%SZ")
    out = {**headers, "host": host, "x-amz-date": amz_date,
           "x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    values = {k.lower(): " ".join(str(v).split()) for k, v in out.items()}
    signed = sorted(values)
    scope = f"{amz_date[:8]}/{region}/s3/aws4_request"
    creq = canonical_request(method, raw_path, raw_query, values, signed,
                             out["x-amz-content-sha256"])
    sig = signature(secret, amz_date, scope, creq)
    out["Authorization"] = (f"{ALGORITHM} Credential={access}/{scope}, "
                            f"SignedHeaders={';'.join(signed)}, Signature={sig}")
    return out


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


class S3Error(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def denied() -> S3Error:
    return S3Error(403, "AccessDenied", "Access Denied.")


def not_implemented(what: str) -> S3Error:
    return S3Error(501, "NotImplemented", f"{STANDIN}: unsupported {what}")


def log(text: str) -> None:
    print(f"{STANDIN} minio: {text}", flush=True)


def _b64url(part: str) -> bytes:
    """base64url without padding, strictly (as Go's RawURLEncoding reads it)."""
    if not B64URL_RE.match(part) or len(part) % 4 == 1:
        raise ValueError("not unpadded base64url")
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def verify_metrics_token(token: str, user: str, password: str, now_ts: float) -> str:
    """Why MinIO's metrics endpoint refuses this bearer token ("" when it takes it): a
    JWT (compact serialization: header.claims.signature, each unpadded base64url) whose
    HMAC, by the header's ``alg``, with the root password over ``header.claims`` is the
    signature; the access key (``accessKey``, else ``sub``) the root user; ``iss``
    "prometheus"; ``exp`` in the future. Written here, apart from aicluster's own
    minting (aicluster.common.minio_credentials), so that a test of the two proves
    they agree."""
    parts = token.split(".")
    if len(parts) != 3:
        return "not a JWT (header.claims.signature)"
    try:
        header = json.loads(_b64url(parts[0]))
        claims = json.loads(_b64url(parts[1]))
        sig = _b64url(parts[2])
    except (ValueError, binascii.Error):
        return "a malformed JWT"
    if not isinstance(header, dict) or not isinstance(claims, dict):
        return "a malformed JWT"
    hasher = JWT_HASHES.get(header.get("alg"))
    if hasher is None:
        return f"signing method {header.get('alg')!r} is unavailable"
    access = claims.get("accessKey", claims.get("sub"))
    if not isinstance(access, str):
        return "accessKey/sub missing"
    if access != user:
        return "the access key is not the root user (the stand-in has no other user)"
    expected = hmac.new(password.encode(), f"{parts[0]}.{parts[1]}".encode(), hasher).digest()
    if not hmac.compare_digest(sig, expected):
        return "signature is invalid"
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        return "exp missing (the stand-in requires it)"
    if exp <= now_ts:
        return "token is expired"
    if claims.get("iss") != "prometheus":
        return "issuer is not prometheus"
    return ""


def expand(arg: str) -> list[str]:
    """MinIO's expansion notation: ``{1...4}``, ``{01...16}`` (numbers only here)."""
    m = ELLIPSES_RE.search(arg)
    if not m:
        return [arg]
    lo, hi = m.group(1), m.group(2)
    if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
        raise Unsupported(f"ellipses range {m.group(0)} (numbers, ascending, only)")
    width = len(lo) if len(lo) > 1 and lo.startswith("0") else 0
    out = []
    for n in range(int(lo), int(hi) + 1):
        for rest in expand(arg[m.end():]):
            out.append(arg[:m.start()] + (str(n).zfill(width) if width else str(n)) + rest)
    return out


def split_address(text: str, option: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"{STANDIN} minio: {option} {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def resolves_to(host: str, address: str) -> bool:
    """Whether ``host`` is ``address`` (the server listens on that address only, so its
    endpoints are the ones on it; MinIO itself takes any address of the machine)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return any(sockaddr[0] == address for *_, sockaddr in infos)


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names an address of this machine (one it can bind)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((sockaddr[0], 0))
                return True
            except OSError:
                continue
    return False


class Store:
    """Buckets and objects on the local drives (every drive holds everything).

    ``<drive>/<bucket>/<key>``: the object's bytes; ``<drive>/.minio.sys/buckets/
    <bucket>/bucket.json``: its policy and versioning status; ``.../objects/<sha256 of
    the key>.json``: each object's key, size, ETag, type and time."""

    def __init__(self, drives: list[Path]):
        self.drives = drives
        self.lock = threading.RLock()

    def _meta(self, drive: Path, bucket: str) -> Path:
        return drive / ".minio.sys" / "buckets" / bucket

    def _write(self, drive: Path, path: Path, data: bytes) -> None:
        tmp = drive / ".minio.sys" / "tmp" / uuid.uuid4().hex
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)

    def bucket(self, name: str) -> dict | None:
        path = self._meta(self.drives[0], name) / "bucket.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None

    def buckets(self) -> list[dict]:
        root = self.drives[0] / ".minio.sys" / "buckets"
        names = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        return [b for b in (self.bucket(n) for n in names) if b]

    def save_bucket(self, meta: dict) -> None:
        with self.lock:
            for drive in self.drives:
                (drive / meta["name"]).mkdir(exist_ok=True)
                self._write(drive, self._meta(drive, meta["name"]) / "bucket.json",
                            json.dumps(meta).encode())

    def delete_bucket(self, name: str) -> None:
        with self.lock:
            for drive in self.drives:
                meta = self._meta(drive, name)
                for path in sorted(meta.rglob("*"), reverse=True):
                    path.rmdir() if path.is_dir() else path.unlink()
                if meta.exists():
                    meta.rmdir()
                data = drive / name
                for path in sorted(data.rglob("*"), reverse=True):
                    path.rmdir() if path.is_dir() else path.unlink()
                if data.exists():
                    data.rmdir()

    def _object_meta(self, drive: Path, bucket: str, key: str) -> Path:
        return self._meta(drive, bucket) / "objects" / (
            hashlib.sha256(key.encode()).hexdigest() + ".json")

    def objects(self, bucket: str) -> list[dict]:
        root = self._meta(self.drives[0], bucket) / "objects"
        out = [json.loads(p.read_text()) for p in root.glob("*.json")] if root.is_dir() else []
        return sorted(out, key=lambda o: o["key"])

    def head(self, bucket: str, key: str) -> dict | None:
        try:
            return json.loads(self._object_meta(self.drives[0], bucket, key).read_text())
        except FileNotFoundError:
            return None

    def read(self, bucket: str, key: str) -> bytes:
        return (self.drives[0] / bucket / key).read_bytes()

    def put(self, bucket: str, key: str, data: bytes, content_type: str) -> dict:
        meta = {"key": key, "size": len(data), "etag": hashlib.md5(data).hexdigest(),
                "type": content_type, "mtime": time.time()}
        with self.lock:
            for drive in self.drives:
                try:
                    self._write(drive, drive / bucket / key, data)
                except (IsADirectoryError, NotADirectoryError, FileExistsError):
                    raise S3Error(409, "XMinioParentIsObject",
                                  "Object-prefix is already an object, please choose a "
                                  "different object-prefix name.") from None
                self._write(drive, self._object_meta(drive, bucket, key),
                            json.dumps(meta).encode())
        return meta

    def delete(self, bucket: str, key: str) -> None:
        with self.lock:
            for drive in self.drives:
                self._object_meta(drive, bucket, key).unlink(missing_ok=True)
                path = drive / bucket / key
                path.unlink(missing_ok=True)
                parent = path.parent
                while parent != drive / bucket and parent.is_dir() and not any(
                        parent.iterdir()):
                    parent.rmdir()
                    parent = parent.parent


class Server:
    def __init__(self, argv: list[str]):
        self.user = os.environ.get("MINIO_ROOT_USER", "")
        self.password = os.environ.get("MINIO_ROOT_PASSWORD", "")
        if len(self.user) < 3 or len(self.password) < 8:
            raise SystemExit(
                f"{STANDIN} minio: ERROR Unable to validate credentials inherited from the "
                "shell environment: MINIO_ROOT_USER (3 characters or more) and "
                "MINIO_ROOT_PASSWORD (8 characters or more) must be set")
        self.region = os.environ.get("MINIO_SITE_REGION") or os.environ.get("MINIO_REGION", "")
        address, console, volumes = "", "", []
        args = iter(argv)
        for arg in args:
            if arg in ("--address", "--console-address"):
                value = next(args, "")
                if arg == "--address":
                    address = value
                else:
                    console = value
            elif arg.startswith("--address="):
                address = arg.split("=", 1)[1]
            elif arg.startswith("--console-address="):
                console = arg.split("=", 1)[1]
            elif arg.startswith("-"):
                raise Unsupported(f"server option {arg} (TLS with --certs-dir included)")
            else:
                volumes.append(arg)
        if not volumes:
            raise SystemExit(f"{STANDIN} minio: no volumes given (MINIO_VOLUMES)")
        self.api = split_address(address or ":9000", "--address")
        if not console:
            raise Unsupported("a console without --console-address (MinIO picks a random port)")
        self.console = split_address(console, "--console-address")
        self.peers: list[str] = []
        self.peer_drives = {}
        #: MINIO_PROMETHEUS_AUTH_TYPE=public: the metrics need no token.
        self.metrics_public = os.environ.get("MINIO_PROMETHEUS_AUTH_TYPE", "").lower() == "public"
        drives = self._endpoints(volumes)
        for d in drives:
            self._check_drive(d, multi=self.total > 1)
        self.store = Store(drives)
        self.initialized = threading.Event()
        #: Set by SIGTERM/SIGINT. A plain flag, never a threading.Event: a signal handler
        #: runs in the main thread between two bytecodes, and one that takes a lock
        #: (Event.set) deadlocks when the signal lands while that thread holds it, as
        #: when systemd's SIGTERM and the launcher's forwarded one arrive together.
        self.stopping = False

    def _endpoints(self, volumes: list[str]) -> list[Path]:
        expanded = [e for v in volumes for e in expand(v)]
        self.total = len(expanded)
        urls = [e for e in expanded if "://" in e]
        if urls and len(urls) != len(expanded):
            raise SystemExit(f"{STANDIN} minio: volumes mix URLs and paths: {volumes}")
        if not urls:
            return [Path(e) for e in expanded]
        local, peers = [], []
        self.peer_drives: dict[str, int] = {}
        for e in urls:
            u = urllib.parse.urlsplit(e)
            if u.scheme != "http":
                raise Unsupported(f"endpoint scheme {u.scheme!r} (TLS)")
            if not u.hostname or not u.port or not u.path.startswith("/"):
                raise SystemExit(f"{STANDIN} minio: endpoint {e!r} needs a host, port and path")
            here = u.port == self.api[1] and (
                resolves_to(u.hostname, self.api[0]) if self.api[0]
                else is_this_machine(u.hostname))
            if here:
                local.append(Path(u.path))
                continue
            peer = f"{u.hostname}:{u.port}"
            self.peer_drives[peer] = self.peer_drives.get(peer, 0) + 1
            if peer not in peers:
                peers.append(peer)
        if not local:
            raise SystemExit(f"{STANDIN} minio: no endpoint of {volumes} is this host "
                             f"(listening on port {self.api[1]})")
        self.peers = peers
        return local

    def _check_drive(self, drive: Path, multi: bool) -> None:
        if not drive.is_dir():
            raise SystemExit(f"{STANDIN} minio: drive {drive} does not exist or is not a "
                             "directory")
        if multi and os.stat(drive).st_dev == os.stat("/").st_dev:
            raise SystemExit(f"{STANDIN} minio: Drive `{drive}` is part of root drive, will "
                             "not be used (MinIO refuses a drive on the root drive when the "
                             "deployment has more than one)")
        probe = drive / ".minio.sys" / "tmp" / f"probe-{uuid.uuid4().hex}"
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"probe")
            probe.unlink()
        except OSError as exc:
            raise SystemExit(f"{STANDIN} minio: drive {drive} is not writable by uid "
                             f"{os.getuid()}: {exc}") from None
        fmt = drive / ".minio.sys" / "format.json"
        if not fmt.exists():
            fmt.write_text(json.dumps({"version": "1", "format": "standin",
                                       "id": str(uuid.uuid4()), "note": STANDIN}))

    # -- peers ---------------------------------------------------------------

    def peer_live(self, peer: str) -> bool:
        host, port = split_address(peer, "peer")
        try:
            conn = http.client.HTTPConnection(host, port, timeout=3)
            conn.request("GET", "/minio/health/live")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def forward(self, peer: str, method: str, raw_path: str, raw_query: str,
                headers: dict[str, str], body: bytes) -> None:
        host, port = split_address(peer, "peer")
        target = raw_path + (f"?{raw_query}" if raw_query else "")
        signed = sign(method, f"{host}:{port}", raw_path, raw_query,
                      {**headers, INTERNODE: "1"}, body, self.user, self.password,
                      self.region or "us-east-1")
        try:
            conn = http.client.HTTPConnection(host, port, timeout=30)
            conn.request(method, target, body=body, headers=signed)
            resp = conn.getresponse()
            answer = resp.read()
            conn.close()
        except OSError as exc:
            raise S3Error(503, "SlowDownWrite", f"Resource requested is unwritable ({STANDIN}: "
                          f"server {peer} did not take the write: {exc})") from None
        if resp.status >= 300:
            raise S3Error(503, "SlowDownWrite", f"Resource requested is unwritable ({STANDIN}: "
                          f"server {peer} answered {resp.status}: {answer[:300]!r})")

    # -- authentication --------------------------------------------------------

    def authenticate(self, method: str, raw_path: str, raw_query: str, headers,
                     body: bytes) -> str | None:
        """"root" for a request signed with the root credentials, None for an anonymous
        one; anything else raises."""
        if any(k.lower() == "x-amz-algorithm" for k, _ in query_pairs(raw_query)):
            raise not_implemented("presigned URL (query string authentication)")
        auth = headers.get("Authorization")
        if auth is None:
            return None
        m = AUTH_RE.match(auth)
        if not m:
            if auth.startswith("AWS "):
                raise not_implemented("AWS signature version 2")
            raise S3Error(400, "AuthorizationHeaderMalformed",
                          "The authorization header is malformed.")
        credential, signed_text, given = m.groups()
        parts = credential.split("/")
        if len(parts) != 5 or parts[3] != "s3" or parts[4] != "aws4_request":
            raise S3Error(400, "AuthorizationHeaderMalformed",
                          "The authorization header is malformed; the Credential is "
                          "mal-formed.")
        access, scope = parts[0], "/".join(parts[1:])
        if not hmac.compare_digest(access.encode(), self.user.encode()):
            raise S3Error(403, "InvalidAccessKeyId", "The Access Key Id you provided does "
                          "not exist in our records.")
        amz_date = headers.get("x-amz-date", "")
        try:
            when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(
                tzinfo=datetime.timezone.utc)
        except ValueError:
            raise S3Error(403, "AccessDenied", "AWS authentication requires a valid Date "
                          "or x-amz-date header") from None
        if abs(now() - when) > MAX_SKEW:
            raise S3Error(403, "RequestTimeTooSkewed", "The difference between the request "
                          "time and the server's time is too large.")
        if parts[1] != amz_date[:8]:
            raise S3Error(403, "SignatureDoesNotMatch", "The request signature we calculated "
                          "does not match the signature you provided. Check your key and "
                          "signing method.")
        signed = signed_text.split(";")
        if "host" not in signed or signed != sorted(signed):
            raise S3Error(400, "AuthorizationHeaderMalformed", "SignedHeaders must include "
                          "host, sorted")
        values = {}
        for name in signed:
            got = headers.get_all(name)
            if got is None:
                raise S3Error(403, "AccessDenied", f"There were headers present in the "
                              f"request which were not signed ({name} is missing)")
            values[name] = ",".join(" ".join(v.split()) for v in got)
        payload = headers.get("x-amz-content-sha256") or EMPTY_SHA256
        if payload.startswith("STREAMING-"):
            raise not_implemented(f"payload encoding {payload} (aws-chunked)")
        if payload != UNSIGNED:
            if not re.fullmatch(r"[0-9a-f]{64}", payload):
                raise S3Error(400, "InvalidArgument", "x-amz-content-sha256 is not a sha256")
            if payload != hashlib.sha256(body).hexdigest():
                raise S3Error(400, "XAmzContentSHA256Mismatch", "The provided "
                              "'x-amz-content-sha256' header does not match what was computed.")
        creq = canonical_request(method, raw_path, raw_query, values, signed, payload)
        expected = signature(self.password, amz_date, scope, creq)
        if not hmac.compare_digest(expected, given):
            raise S3Error(403, "SignatureDoesNotMatch", "The request signature we calculated "
                          "does not match the signature you provided. Check your key and "
                          "signing method.")
        return "root"

    def allowed(self, principal: str | None, action: str, bucket: str, key: str = "") -> None:
        """Raise AccessDenied unless the root user asks, or the bucket's policy grants
        ``action`` on the resource to anonymous users."""
        if principal == "root":
            return
        meta = self.store.bucket(bucket)
        policy = (meta or {}).get("policy")
        if not policy:
            raise denied()
        resource = f"arn:aws:s3:::{bucket}" + (f"/{key}" if key else "")
        verdict = False
        for st in json.loads(policy).get("Statement", []):
            principal_ = st.get("Principal")
            aws = principal_.get("AWS") if isinstance(principal_, dict) else principal_
            if aws not in ("*", ["*"]) or st.get("Condition"):
                continue
            actions = st.get("Action", [])
            resources = st.get("Resource", [])
            actions = [actions] if isinstance(actions, str) else actions
            resources = [resources] if isinstance(resources, str) else resources
            if any(fnmatch.fnmatchcase(action, a) for a in actions) and any(
                    fnmatch.fnmatchcase(resource, r) for r in resources):
                if st.get("Effect") == "Deny":
                    raise denied()
                verdict = verdict or st.get("Effect") == "Allow"
        if not verdict:
            raise denied()

    # -- requests ----------------------------------------------------------------

    def dispatch(self, method: str, raw_path: str, raw_query: str, headers,
                 body: bytes) -> tuple[int, dict[str, str], bytes]:
        path = urllib.parse.unquote(raw_path)
        if path == "/minio" or path.startswith("/minio/"):
            return self.minio_api(method, path, headers)
        principal = self.authenticate(method, raw_path, raw_query, headers, body)
        internode = headers.get(INTERNODE) == "1"
        if internode and principal != "root":
            raise denied()
        if not internode and not self.initialized.is_set():
            raise S3Error(503, "XMinioServerNotInitialized",
                          "Server not initialized yet, please try again.")
        query = dict(query_pairs(raw_query))
        query.pop("x-id", None)
        bucket, _, key = path.lstrip("/").partition("/")
        if not bucket:
            if method != "GET" or query:
                raise not_implemented(f"service request {method} {raw_path}?{raw_query}")
            if principal != "root":
                raise denied()
            return self.list_buckets()
        if not BUCKET_RE.match(bucket) or ".." in bucket:
            raise S3Error(400, "InvalidBucketName", "The specified bucket is not valid.")
        write = (method, raw_path, raw_query, headers, body, internode)
        if key:
            return self.object_request(principal, method, bucket, key, query, headers, body,
                                       write)
        return self.bucket_request(principal, method, bucket, query, headers, body, write)

    def minio_api(self, method: str, path: str,
                  headers=None) -> tuple[int, dict[str, str], bytes]:
        if method not in ("GET", "HEAD"):
            raise not_implemented(f"MinIO API {method} {path}")
        if path in ("/minio/health/live", "/minio/health/ready"):
            return 200, {}, b""
        if path == "/minio/health/cluster":
            down = [p for p in self.peers if not self.peer_live(p)]
            if down or not self.initialized.is_set():
                return 503, {}, b""
            return 200, {}, b""
        if path == METRICS_PATH:
            return self.cluster_metrics(headers)
        raise not_implemented(f"MinIO API {path} (no admin API in the stand-in)")

    # -- MinIO's cluster metrics ---------------------------------------------------

    def cluster_metrics(self, headers) -> tuple[int, dict[str, str], bytes]:
        """METRICS_PATH: the bearer token checked (unless the metrics are public), then
        the drive and node gauges from this server's own state (the module's text)."""
        if not self.metrics_public:
            auth = (headers.get("Authorization") if headers is not None else None) or ""
            token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            why = verify_metrics_token(token, self.user, self.password, time.time()) \
                if token else "no bearer token (JWT token missing)"
            if why:
                log(f"{METRICS_PATH}: refused: {why}")
                body = json.dumps({"Code": "AccessDenied", "Message": (
                    f"Access Denied. ({STANDIN}: {why})"), "Resource": METRICS_PATH})
                return 403, {"Content-Type": "application/json"}, body.encode()
        answering = {p: self.peer_live(p) for p in self.peers}
        local_online = sum(1 for d in self.store.drives if d.is_dir())
        online = local_online + sum(self.peer_drives.get(p, 0) for p, up in answering.items()
                                    if up)
        nodes_up = 1 + sum(1 for up in answering.values() if up)
        # Every object is on every drive here: the usable space is the smallest drive's.
        stats = [os.statvfs(d) for d in self.store.drives if d.is_dir()]
        usable = min((st.f_blocks * st.f_frsize for st in stats), default=0)
        usable_free = min((st.f_bavail * st.f_frsize for st in stats), default=0)
        gauges = [
            ("minio_cluster_drive_offline_total", "Total drives offline in this cluster.",
             self.total - online),
            ("minio_cluster_drive_online_total", "Total drives online in this cluster.",
             online),
            ("minio_cluster_drive_total", "Total drives in this cluster.", self.total),
            ("minio_cluster_nodes_offline_total", "Total number of MinIO nodes offline.",
             1 + len(self.peers) - nodes_up),
            ("minio_cluster_nodes_online_total", "Total number of MinIO nodes online.",
             nodes_up),
            ("minio_cluster_capacity_usable_total_bytes",
             "Total usable capacity online in the cluster.", usable),
            ("minio_cluster_capacity_usable_free_bytes",
             "Total free usable capacity online in the cluster.", usable_free),
        ]
        server = fmt(self.api)
        lines = []
        for name, text, value in gauges:
            lines += [f"# HELP {name} {text} ({STANDIN})", f"# TYPE {name} gauge",
                      f'{name}{{server="{server}"}} {value}']
        return 200, {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}, \
            ("\n".join(lines) + "\n").encode()

    def mutate(self, write: tuple, apply):
        """Apply a write here and on every other server (refused while one is down)."""
        method, raw_path, raw_query, headers, body, internode = write
        if not internode:
            down = [p for p in self.peers if not self.peer_live(p)]
            if down:
                raise S3Error(503, "SlowDownWrite", "Resource requested is unwritable, please "
                              f"reduce your request rate ({STANDIN}: {', '.join(down)} does "
                              "not answer)")
        result = apply()
        if not internode:
            passed = {k: v for k, v in headers.items()
                      if k.lower() in ("content-type", "content-md5")}
            for peer in self.peers:
                self.forward(peer, method, raw_path, raw_query, passed, body)
        return result

    def need_bucket(self, bucket: str) -> dict:
        meta = self.store.bucket(bucket)
        if meta is None:
            raise S3Error(404, "NoSuchBucket", "The specified bucket does not exist")
        return meta

    def list_buckets(self) -> tuple[int, dict[str, str], bytes]:
        items = "".join(f"<Bucket><Name>{escape(b['name'])}</Name><CreationDate>"
                        f"{iso(b['created'])}</CreationDate></Bucket>"
                        for b in self.store.buckets())
        return xml(f'<ListAllMyBucketsResult xmlns="{S3_NS}"><Owner><ID>02d6176db174dc93cb1b899f7c'
                   f'6078f08654445fe8cf1b6ce98d8855f66bdbf4</ID><DisplayName>minio</DisplayName>'
                   f'</Owner><Buckets>{items}</Buckets></ListAllMyBucketsResult>')

    def bucket_request(self, principal, method, bucket, query, headers, body, write):
        sub = set(query)
        listing = {"list-type", "prefix", "delimiter", "max-keys", "continuation-token",
                   "start-after", "encoding-type", "fetch-owner", "marker"}
        internode = write[-1]
        if method == "PUT" and not sub:
            if principal != "root":
                raise denied()
            if self.store.bucket(bucket) is not None and not internode:
                raise S3Error(409, "BucketAlreadyOwnedByYou", "Your previous request to "
                              "create the named bucket succeeded and you already own it.")
            meta = self.store.bucket(bucket) or {"name": bucket, "created": time.time(),
                                                 "policy": None, "versioning": ""}
            self.mutate(write, lambda: self.store.save_bucket(meta))
            return 200, {"Location": f"/{bucket}"}, b""
        meta = self.need_bucket(bucket)
        if method == "HEAD" and not sub:
            self.allowed(principal, "s3:ListBucket", bucket)
            return 200, {}, b""
        if method == "GET" and sub <= listing:
            self.allowed(principal, "s3:ListBucket", bucket)
            return self.list_objects(bucket, query)
        if method == "GET" and sub == {"location"}:
            self.allowed(principal, "s3:GetBucketLocation", bucket)
            return xml(f'<LocationConstraint xmlns="{S3_NS}">{escape(self.region)}'
                       "</LocationConstraint>")
        if principal != "root":
            raise denied()
        if sub == {"policy"}:
            if method == "GET":
                if not meta.get("policy"):
                    raise S3Error(404, "NoSuchBucketPolicy", "The bucket policy does not exist")
                return 200, {"Content-Type": "application/json"}, meta["policy"].encode()
            if method == "PUT":
                meta["policy"] = self.checked_policy(bucket, body)
            elif method == "DELETE":
                meta["policy"] = None
            else:
                raise not_implemented(f"{method} ?policy")
            self.mutate(write, lambda: self.store.save_bucket(meta))
            return 204, {}, b""
        if sub == {"versioning"}:
            if method == "GET":
                status = f"<Status>{meta['versioning']}</Status>" if meta["versioning"] else ""
                return xml(f'<VersioningConfiguration xmlns="{S3_NS}">{status}'
                           "</VersioningConfiguration>")
            if method != "PUT":
                raise not_implemented(f"{method} ?versioning")
            meta["versioning"] = self.checked_versioning(body)
            self.mutate(write, lambda: self.store.save_bucket(meta))
            return 200, {}, b""
        if method == "DELETE" and not sub:
            if self.store.objects(bucket) and not internode:
                raise S3Error(409, "BucketNotEmpty", "The bucket you tried to delete is not "
                              "empty")
            self.mutate(write, lambda: self.store.delete_bucket(bucket))
            return 204, {}, b""
        raise not_implemented(f"bucket request {method} ?{'&'.join(sorted(sub))}")

    def checked_policy(self, bucket: str, body: bytes) -> str:
        try:
            policy = json.loads(body)
            statements = policy["Statement"]
            for st in statements:
                resources = st["Resource"]
                for r in [resources] if isinstance(resources, str) else resources:
                    if not (r == f"arn:aws:s3:::{bucket}"
                            or r.startswith(f"arn:aws:s3:::{bucket}/")):
                        raise S3Error(400, "MalformedPolicy", "Policy has invalid resource.")
        except (ValueError, KeyError, TypeError):
            raise S3Error(400, "MalformedPolicy", "Policy has invalid JSON.") from None
        return json.dumps(policy)

    def checked_versioning(self, body: bytes) -> str:
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            raise S3Error(400, "MalformedXML", "The XML you provided was not well-formed or "
                          "did not validate against our published schema.") from None
        status = ""
        for el in root:
            tag = el.tag.rsplit("}", 1)[-1]
            if tag == "Status":
                status = (el.text or "").strip()
            elif tag in ("MFADelete", "ExcludedPrefixes", "ExcludeFolders"):
                raise not_implemented(f"versioning setting {tag}")
        if status not in ("Enabled", "Suspended"):
            raise S3Error(400, "IllegalVersioningConfigurationException", "The versioning "
                          "configuration specified in the request is invalid.")
        return status

    def list_objects(self, bucket: str, query: dict[str, str]):
        v2 = query.get("list-type") == "2"
        if "list-type" in query and not v2:
            raise not_implemented(f"list-type={query['list-type']}")
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        url = query.get("encoding-type") == "url"
        enc = (lambda s: urllib.parse.quote(s, safe="/")) if url else escape
        try:
            max_keys = max(0, min(1000, int(query.get("max-keys", "1000"))))
        except ValueError:
            raise S3Error(400, "InvalidArgument", "max-keys is not a number") from None
        if v2:
            token = query.get("continuation-token", "")
            after = base64.urlsafe_b64decode(token.encode()).decode() if token else \
                query.get("start-after", "")
        else:
            after = query.get("marker", "")
        entries: list[tuple[str, dict | None]] = []
        seen = set()
        for o in self.store.objects(bucket):
            k = o["key"]
            if not k.startswith(prefix) or k <= after:
                continue
            if delimiter and delimiter in k[len(prefix):]:
                common = k[:len(prefix) + k[len(prefix):].index(delimiter) + len(delimiter)]
                if common in seen or common <= after:
                    continue
                seen.add(common)
                entries.append((common, None))
            else:
                entries.append((k, o))
        truncated = len(entries) > max_keys
        entries = entries[:max_keys]
        parts = [f'<ListBucketResult xmlns="{S3_NS}"><Name>{escape(bucket)}</Name>'
                 f"<Prefix>{enc(prefix)}</Prefix><MaxKeys>{max_keys}</MaxKeys>"
                 f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
        if delimiter:
            parts.append(f"<Delimiter>{enc(delimiter)}</Delimiter>")
        if url:
            parts.append("<EncodingType>url</EncodingType>")
        if v2:
            parts.append(f"<KeyCount>{len(entries)}</KeyCount>")
            if query.get("continuation-token"):
                parts.append(f"<ContinuationToken>{escape(query['continuation-token'])}"
                             "</ContinuationToken>")
            if query.get("start-after"):
                parts.append(f"<StartAfter>{enc(query['start-after'])}</StartAfter>")
            if truncated and entries:
                token = base64.urlsafe_b64encode(entries[-1][0].encode()).decode()
                parts.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
        else:
            parts.append(f"<Marker>{enc(after)}</Marker>")
            if truncated and entries:
                parts.append(f"<NextMarker>{enc(entries[-1][0])}</NextMarker>")
        for k, o in entries:
            if o is None:
                parts.append(f"<CommonPrefixes><Prefix>{enc(k)}</Prefix></CommonPrefixes>")
            else:
                parts.append(f"<Contents><Key>{enc(k)}</Key><LastModified>{iso(o['mtime'])}"
                             f"</LastModified><ETag>&quot;{o['etag']}&quot;</ETag>"
                             f"<Size>{o['size']}</Size><StorageClass>STANDARD</StorageClass>"
                             "</Contents>")
        parts.append("</ListBucketResult>")
        return xml("".join(parts))

    def object_request(self, principal, method, bucket, key, query, headers, body, write):
        if query:
            raise not_implemented(f"object request {method} ?{'&'.join(sorted(query))}")
        segments = key.split("/")
        if (len(key.encode()) > 1024 or "\0" in key or
                any(s in ("", ".", "..") for s in segments) or segments[0] == ".minio.sys"):
            raise S3Error(400, "XMinioInvalidObjectName", f"Object name contains unsupported "
                          f"characters ({STANDIN}: no empty, '.' or '..' path segments).")
        self.need_bucket(bucket)
        if method == "PUT":
            if headers.get("x-amz-copy-source"):
                raise not_implemented("CopyObject (x-amz-copy-source)")
            self.allowed(principal, "s3:PutObject", bucket, key)
            check_digests(headers, body)
            kind = headers.get("Content-Type") or "application/octet-stream"
            meta = self.mutate(write, lambda: self.store.put(bucket, key, body, kind))
            return 200, {"ETag": f'"{meta["etag"]}"'}, b""
        if method in ("GET", "HEAD"):
            if headers.get("Range"):
                raise not_implemented("ranged GET (Range header)")
            self.allowed(principal, "s3:GetObject", bucket, key)
            meta = self.store.head(bucket, key)
            if meta is None:
                raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
            data = self.store.read(bucket, key) if method == "GET" else b""
            out = {"Content-Type": meta["type"], "ETag": f'"{meta["etag"]}"',
                   "Last-Modified": email.utils.formatdate(meta["mtime"], usegmt=True),
                   "Content-Length": str(meta["size"])}
            return 200, out, data
        if method == "DELETE":
            self.allowed(principal, "s3:DeleteObject", bucket, key)
            self.mutate(write, lambda: self.store.delete(bucket, key))
            return 204, {}, b""
        raise not_implemented(f"object request {method}")

    # -- running ---------------------------------------------------------------------

    def serve(self) -> int:
        def on_signal(signum, frame):
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        api = self._listen(self.api, api_handler(self))
        console = self._listen(self.console, console_handler())
        log(f"MinIO {VERSION} ({STANDIN} for tests: not MinIO), {self.total} drive(s), "
            f"local {', '.join(map(str, self.store.drives))}, peers "
            f"{', '.join(self.peers) or 'none'}; root user {self.user}")
        log(f"API: http://{fmt(self.api)}  Console: http://{fmt(self.console)}")
        for srv in (api, console):
            threading.Thread(target=srv.serve_forever, daemon=True).start()
        waited = 0.0
        while not self.stopping:
            down = [p for p in self.peers if not self.peer_live(p)]
            if not down:
                break
            if waited % 10 == 0:
                log(f"Waiting for all MinIO sub-systems to be initialized ({STANDIN}: no answer "
                    f"yet from {', '.join(down)})")
            self.sleep(1)
            waited += 1
        if not self.stopping:
            self.initialized.set()
            log("initialized: every server answers; ready")
            notify_ready(f"READY=1\nSTATUS={STANDIN} MinIO {VERSION} serving\n")
        while not self.stopping:
            self.sleep(1)
        log("stopping (SIGTERM)")
        failsafe = threading.Timer(10, lambda: os._exit(0))
        failsafe.daemon = True
        failsafe.start()
        for srv in (api, console):
            srv.shutdown()
            srv.server_close()
        return 0

    def sleep(self, seconds: float) -> None:
        """Sleep *seconds*, or less once a signal has asked the server to stop."""
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(0.1)

    def _listen(self, address: tuple[str, int], handler):
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Listener(http.server.ThreadingHTTPServer):
            address_family = family
            daemon_threads = True
            request_queue_size = 64

        try:
            return Listener((host, port), handler)
        except OSError as exc:
            raise SystemExit(f"{STANDIN} minio: cannot listen on {fmt(address)}: {exc}") from None


def fmt(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host or '0.0.0.0'}:{port}"


def xml(body: str) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/xml"}, (
        '<?xml version="1.0" encoding="UTF-8"?>\n' + body).encode()


def check_digests(headers, body: bytes) -> None:
    md5 = headers.get("Content-MD5")
    if md5 and base64.b64decode(md5) != hashlib.md5(body).digest():
        raise S3Error(400, "BadDigest", "The Content-Md5 you specified did not match what we "
                      "received.")
    for name, value in headers.items():
        name = name.lower()
        if not name.startswith("x-amz-checksum-"):
            continue
        algorithm = name[len("x-amz-checksum-"):]
        if algorithm == "crc32":
            digest = zlib.crc32(body).to_bytes(4, "big")
        elif algorithm in ("sha1", "sha256"):
            digest = hashlib.new(algorithm, body).digest()
        else:
            raise not_implemented(f"checksum algorithm {algorithm}")
        if base64.b64decode(value) != digest:
            raise S3Error(400, "XAmzContentChecksumMismatch", f"The provided "
                          f"'x-amz-checksum-{algorithm}' header does not match what was "
                          "computed.")


def notify_ready(message: str) -> None:
    """Readiness for systemd: through the launcher's pipe (the launcher is the unit's main
    process), or straight to $NOTIFY_SOCKET when this file runs without it."""
    fd = os.environ.pop("AICLUSTER_STANDIN_READY_FD", "")
    if fd.isdigit():
        os.write(int(fd), message.encode())
        os.close(int(fd))
        return
    path = os.environ.get("NOTIFY_SOCKET", "")
    if path:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(message.encode(), "\0" + path[1:] if path.startswith("@") else path)


def api_handler(server: Server):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"MinIO ({STANDIN})"
        sys_version = ""

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            pass

        def handle_request(self):
            request_id = uuid.uuid4().hex[:16].upper()
            raw_path, _, raw_query = self.path.partition("?")
            try:
                body = self.read_body()
                status, headers, payload = server.dispatch(
                    self.command, raw_path, raw_query, self.headers, body)
            except Unsupported as exc:
                status, headers, payload = error(not_implemented(str(exc)), raw_path,
                                                 request_id)
            except S3Error as exc:
                status, headers, payload = error(exc, raw_path, request_id)
            except Exception:  # the stand-in's own fault: said, not hidden
                log(f"internal error on {self.command} {raw_path}:\n{traceback.format_exc()}")
                status, headers, payload = error(
                    S3Error(500, "InternalError", f"{STANDIN}: internal error"), raw_path,
                    request_id)
            if status >= 400 and not raw_path.startswith("/minio/health"):
                log(f"{self.command} {raw_path} -> {status}")
            self.send_response(status)
            headers = {"x-amz-request-id": request_id, **headers}
            if "Content-Length" not in headers:
                headers["Content-Length"] = str(len(payload))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD" and payload:
                self.wfile.write(payload)

        def read_body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                self.close_connection = True
                raise S3Error(411, "MissingContentLength", "You must provide the "
                              "Content-Length HTTP header.")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.close_connection = True
                raise S3Error(400, "EntityTooLarge", f"{STANDIN}: at most {MAX_BODY} bytes")
            return self.rfile.read(length) if length else b""

        do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_request

    return Handler


def error(exc: S3Error, resource: str, request_id: str) -> tuple[int, dict[str, str], bytes]:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{escape(exc.code)}</Code>'
            f"<Message>{escape(exc.message)}</Message><Resource>{escape(resource)}</Resource>"
            f"<RequestId>{request_id}</RequestId><HostId>{STANDIN}</HostId></Error>")
    return exc.status, {"Content-Type": "application/xml"}, body.encode()


def console_handler():
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"MinIO Console ({STANDIN})"
        sys_version = ""

        def log_message(self, format, *args):  # noqa: A002
            pass

        def do_GET(self):
            page = (f"<!doctype html><title>MinIO Console ({STANDIN})</title><p>{STANDIN} "
                    "for tests: the console is not served by the stand-in.</p>").encode()
            status = 200 if self.path.split("?")[0] in ("/", "/login") else 404
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

    return Handler


def main_minio(argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-v"]) or argv[:1] == ["version"]:
        print(f"minio version RELEASE.{VERSION} ({STANDIN} for tests, not MinIO)")
        return 0
    if argv[:1] != ["server"]:
        print(f"{STANDIN} minio: unsupported command {' '.join(argv) or '(none)'}; only "
              "--version and server", file=sys.stderr)
        return 1
    try:
        return Server(argv[1:]).serve()
    except Unsupported as exc:
        print(f"{STANDIN} minio: unsupported {exc}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------------
# mc
# ---------------------------------------------------------------------------


class McError(Exception):
    pass


class Alias:
    """An alias from ``MC_HOST_<alias>=http://ACCESS:SECRET@HOST:PORT``."""

    def __init__(self, name: str):
        value = os.environ.get(f"MC_HOST_{name}")
        if not value:
            raise McError(f"{STANDIN}: no MC_HOST_{name} in the environment (the stand-in mc "
                          "reads aliases from there only)")
        u = urllib.parse.urlsplit(value)
        if u.scheme != "http":
            raise McError(f"{STANDIN}: unsupported scheme {u.scheme!r} in MC_HOST_{name}")
        self.name = name
        self.host = f"{u.hostname}:{u.port or 80}"
        self.url = f"{u.scheme}://{u.hostname}:{u.port or 80}"
        self.access = urllib.parse.unquote(u.username or "")
        self.secret = urllib.parse.unquote(u.password or "")

    def request(self, method: str, path: str, query: str = "", body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        raw_path = urllib.parse.quote(path, safe="/")
        signed = sign(method, self.host, raw_path, query, dict(headers or {}), body,
                      self.access, self.secret)
        host, _, port = self.host.rpartition(":")
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request(method, raw_path + (f"?{query}" if query else ""), body=body,
                         headers=signed)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
        except OSError as exc:
            raise McError(f"Unable to reach {self.url}: {exc}") from None
        return resp.status, data


def s3_error(data: bytes) -> tuple[str, str]:
    try:
        root = ElementTree.fromstring(data)
        return root.findtext("Code") or "", root.findtext("Message") or ""
    except ElementTree.ParseError:
        return "", data[:200].decode(errors="replace")


def checked(status: int, data: bytes, what: str, ok=(200, 204)) -> bytes:
    if status not in ok:
        code, message = s3_error(data)
        raise McError(f"{what}. {message or code or status}")
    return data


def target(text: str) -> tuple[Alias, str, str]:
    alias, _, rest = text.partition("/")
    bucket, _, key = rest.partition("/")
    return Alias(alias), bucket, key


POLICY_ACTIONS = {
    "download": (["s3:GetBucketLocation", "s3:ListBucket"], ["s3:GetObject"]),
    "upload": (["s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
               ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:ListMultipartUploadParts",
                "s3:PutObject"]),
}
POLICY_ACTIONS["public"] = (
    sorted(set(POLICY_ACTIONS["download"][0] + POLICY_ACTIONS["upload"][0])),
    sorted(set(POLICY_ACTIONS["download"][1] + POLICY_ACTIONS["upload"][1])))


def canned_policy(permission: str, bucket: str) -> bytes:
    bucket_actions, object_actions = POLICY_ACTIONS[permission]
    statement = [
        {"Effect": "Allow", "Principal": {"AWS": ["*"]}, "Action": bucket_actions,
         "Resource": [f"arn:aws:s3:::{bucket}"]},
        {"Effect": "Allow", "Principal": {"AWS": ["*"]}, "Action": object_actions,
         "Resource": [f"arn:aws:s3:::{bucket}/*"]},
    ]
    return json.dumps({"Version": "2012-10-17", "Statement": statement}).encode()


def permission_of(policy: bytes, bucket: str) -> str:
    """What mc's ``anonymous get`` calls a bucket's policy."""
    actions = set()
    for st in json.loads(policy).get("Statement", []):
        if st.get("Effect") == "Allow":
            a = st.get("Action", [])
            actions.update([a] if isinstance(a, str) else a)
    read = "s3:GetObject" in actions
    write = "s3:PutObject" in actions
    return {(True, True): "public", (True, False): "download",
            (False, True): "upload"}.get((read, write), "custom")


def say(as_json: bool, message: dict, text: str, indent: bool = False) -> None:
    if as_json:
        print(json.dumps(message, indent=1) if indent else json.dumps(message))
    else:
        print(text)


def mc_ls(args: list[str], as_json: bool) -> int:
    if len(args) != 1:
        raise McError(f"{STANDIN}: unsupported ls arguments {args}")
    alias, bucket, key = target(args[0])
    if not bucket:
        data = checked(*alias.request("GET", "/"), "Unable to list folder")
        root = ElementTree.fromstring(data)
        for b in root.iter(f"{{{S3_NS}}}Bucket"):
            name, created = b.findtext(f"{{{S3_NS}}}Name"), b.findtext(f"{{{S3_NS}}}CreationDate")
            say(as_json, {"status": "success", "type": "folder", "lastModified": created,
                          "size": 0, "key": f"{name}/", "etag": "", "url": f"{alias.url}/",
                          "versionOrdinal": 1}, f"[{created}]     0B {name}/")
        return 0
    query = "delimiter=%2F&list-type=2" + (f"&prefix={urllib.parse.quote(key, safe='')}"
                                          if key else "")
    data = checked(*alias.request("GET", f"/{bucket}", query), "Unable to list folder")
    root = ElementTree.fromstring(data)
    for item in root:
        tag = item.tag.rsplit("}", 1)[-1]
        if tag == "CommonPrefixes":
            name = item.findtext(f"{{{S3_NS}}}Prefix")[len(key):]
            say(as_json, {"status": "success", "type": "folder", "size": 0, "key": name},
                f"[{'':23}]     0B {name}")
        elif tag == "Contents":
            name = item.findtext(f"{{{S3_NS}}}Key")[len(key):]
            size = int(item.findtext(f"{{{S3_NS}}}Size"))
            modified = item.findtext(f"{{{S3_NS}}}LastModified")
            say(as_json, {"status": "success", "type": "file", "lastModified": modified,
                          "size": size, "key": name,
                          "etag": item.findtext(f"{{{S3_NS}}}ETag").strip('"')},
                f"[{modified}] {size:>5}B {name}")
    return 0


def mc_mb(args: list[str], as_json: bool, ignore_existing: bool) -> int:
    if len(args) != 1:
        raise McError(f"{STANDIN}: unsupported mb arguments {args}")
    alias, bucket, key = target(args[0])
    if not bucket or key:
        raise McError(f"{STANDIN}: mb takes ALIAS/BUCKET, not {args[0]}")
    status, data = alias.request("PUT", f"/{bucket}")
    if status != 200:
        code, _ = s3_error(data)
        if not (ignore_existing and code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")):
            checked(status, data, f"Unable to make bucket `{args[0]}`")
    say(as_json, {"status": "success", "bucket": args[0], "region": ""},
        f"Bucket created successfully `{args[0]}`.")
    return 0


def anonymous_get(alias: Alias, bucket: str) -> str:
    status, data = alias.request("GET", f"/{bucket}", "policy=")
    if status == 404 and s3_error(data)[0] == "NoSuchBucketPolicy":
        return "private"
    return permission_of(checked(status, data, "Unable to get anonymous"), bucket)


def mc_anonymous(args: list[str], as_json: bool) -> int:
    if len(args) == 3 and args[0] == "set":
        permission, where = args[1], args[2]
        alias, bucket, key = target(where)
        if key:
            raise McError(f"{STANDIN}: unsupported anonymous access for a prefix ({where})")
        if permission in ("none", "private"):
            checked(*alias.request("DELETE", f"/{bucket}", "policy="),
                    f"Unable to set anonymous `{permission}` for `{where}`")
        elif permission in POLICY_ACTIONS:
            checked(*alias.request("PUT", f"/{bucket}", "policy=",
                                   canned_policy(permission, bucket)),
                    f"Unable to set anonymous `{permission}` for `{where}`")
        else:
            raise McError(f"Unrecognized permission `{permission}`. Allowed values are "
                          "[private, public, download, upload].")
        got = anonymous_get(alias, bucket)
        say(as_json, {"operation": "set", "status": "success", "bucket": where,
                      "permission": got},
            f"Access permission for `{where}` is set to `{got}`", indent=True)
        return 0
    if len(args) == 2 and args[0] == "get":
        alias, bucket, key = target(args[1])
        got = anonymous_get(alias, bucket)
        say(as_json, {"operation": "get", "status": "success", "bucket": args[1],
                      "permission": got},
            f"Access permission for `{args[1]}` is `{got}`", indent=True)
        return 0
    raise McError(f"{STANDIN}: unsupported anonymous arguments {args}")


def mc_version(args: list[str], as_json: bool) -> int:
    if len(args) != 2 or args[0] not in ("enable", "suspend", "info"):
        raise McError(f"{STANDIN}: unsupported version arguments {args}")
    op, where = args
    alias, bucket, _ = target(where)
    if op != "info":
        status = "Enabled" if op == "enable" else "Suspended"
        body = (f'<VersioningConfiguration xmlns="{S3_NS}"><Status>{status}</Status>'
                "</VersioningConfiguration>").encode()
        checked(*alias.request("PUT", f"/{bucket}", "versioning=", body),
                f"Unable to {op} versioning")
        say(as_json, {"Op": op, "status": "success", "url": where,
                      "versioning": {"status": status, "MFADelete": ""}},
            f"{where} versioning is {status.lower()}", indent=True)
        return 0
    data = checked(*alias.request("GET", f"/{bucket}", "versioning="),
                   "Unable to get versioning info")
    status = ElementTree.fromstring(data).findtext(f"{{{S3_NS}}}Status") or ""
    say(as_json, {"Op": "info", "status": "success", "url": where,
                  "versioning": {"status": status, "MFADelete": ""}},
        f"{where} versioning is {status.lower()}" if status else f"{where} is un-versioned",
        indent=True)
    return 0


def remote(text: str) -> bool:
    alias = text.split("/", 1)[0]
    return "/" in text and bool(alias) and f"MC_HOST_{alias}" in os.environ


def mc_cp(args: list[str], as_json: bool) -> int:
    if len(args) != 2:
        raise McError(f"{STANDIN}: unsupported cp arguments {args}")
    src, dst = args
    if remote(dst) and not remote(src):
        data = Path(src).read_bytes()
        alias, bucket, key = target(dst)
        if not key or key.endswith("/"):
            key = f"{key}{Path(src).name}"
        checked(*alias.request("PUT", f"/{bucket}/{key}", body=data,
                               headers={"content-type": "application/octet-stream"}),
                f"Failed to copy `{src}`")
    elif remote(src) and not remote(dst):
        alias, bucket, key = target(src)
        data = checked(*alias.request("GET", f"/{bucket}/{key}"), f"Failed to copy `{src}`",
                       ok=(200,))
        Path(dst).write_bytes(data)
    else:
        raise McError(f"{STANDIN}: unsupported cp from {src} to {dst} (a local file and an "
                      "object only)")
    say(as_json, {"status": "success", "source": src, "target": dst, "size": len(data),
                  "totalCount": 1, "totalSize": len(data)}, f"`{src}` -> `{dst}`")
    return 0


def mc_rm(args: list[str], as_json: bool) -> int:
    if len(args) != 1 or not remote(args[0]):
        raise McError(f"{STANDIN}: unsupported rm arguments {args} (one object only)")
    alias, bucket, key = target(args[0])
    checked(*alias.request("DELETE", f"/{bucket}/{key}"), f"Failed to remove `{args[0]}`",
            ok=(204, 200))
    say(as_json, {"status": "success", "key": args[0]}, f"Removed `{args[0]}`.")
    return 0


def mc_cat(args: list[str]) -> int:
    if len(args) != 1 or not remote(args[0]):
        raise McError(f"{STANDIN}: unsupported cat arguments {args}")
    alias, bucket, key = target(args[0])
    data = checked(*alias.request("GET", f"/{bucket}/{key}"), "Unable to read from "
                   f"`{args[0]}`", ok=(200,))
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return 0


def main_mc(argv: list[str]) -> int:
    as_json, ignore_existing, args = False, False, []
    items = iter(argv)
    for arg in items:
        if arg == "--json":
            as_json = True
        elif arg in ("--quiet", "-q", "--no-color", "--disable-pager"):
            pass
        elif arg in ("--config-dir", "-C"):
            next(items, None)
        elif arg.startswith("--config-dir="):
            pass
        elif arg in ("--version", "-v"):
            print(f"mc version RELEASE.{VERSION} ({STANDIN} for tests, not MinIO's mc)")
            return 0
        elif arg in ("--ignore-existing", "-p"):
            ignore_existing = True
        elif arg.startswith("-"):
            print(f"mc: <ERROR> {STANDIN}: unsupported flag {arg}", file=sys.stderr)
            return 1
        else:
            args.append(arg)
    command, rest = (args[0], args[1:]) if args else ("", [])
    try:
        if command == "ls":
            return mc_ls(rest, as_json)
        if command == "mb":
            return mc_mb(rest, as_json, ignore_existing)
        if command == "anonymous":
            return mc_anonymous(rest, as_json)
        if command == "version":
            return mc_version(rest, as_json)
        if command == "cp":
            return mc_cp(rest, as_json)
        if command == "cat":
            return mc_cat(rest)
        if command == "rm":
            return mc_rm(rest, as_json)
        raise McError(f"{STANDIN}: unsupported command {' '.join(args) or '(none)'}")
    except McError as exc:
        if as_json:
            print(json.dumps({"status": "error", "error": {"message": str(exc)}}),
                  file=sys.stderr)
        else:
            print(f"mc: <ERROR> {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    program = PROGRAM
    if not program:
        if not argv or argv[0] not in ("minio", "mc"):
            print(f"{STANDIN}: name the program first: minio ... or mc ...", file=sys.stderr)
            return 2
        program, argv = argv[0], argv[1:]
    return main_minio(argv) if program == "minio" else main_mc(argv)


if __name__ == "__main__":
    sys.exit(main())
