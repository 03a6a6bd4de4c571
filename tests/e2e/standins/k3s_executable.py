#!/usr/bin/env python3
"""STAND-IN k3s for aicluster's end-to-end tests. NOT k3s: no Kubernetes, no
containers; TLS like k3s, with self-signed certificates the stand-in makes itself.

tests/e2e/standins/k3s.py writes this file, with its version filled in, where
``aicluster artifacts`` finds the k3s binary; the deploy installs it as
/usr/local/bin/k3s exactly as it installs the real one. It answers only what the
deploy (both engines), the rollout helper and the tests use, and fails loudly
("stand-in k3s: unsupported ...") on anything else, so a deploy that starts to use
more of k3s fails here instead of passing by accident:

- ``k3s --version``;
- ``k3s server`` / ``k3s agent`` (``-c/--config FILE``, default
  /etc/rancher/k3s/config.yaml: one ``key: <JSON value>`` per line, as aicluster
  writes it). Like k3s, both listen on ``bind-address`` (k3s's default: every
  address): the server's API on ``https-listen-port`` (6443) and both the "kubelet"
  port 10250, each over TLS (HTTPS) as in k3s; a client that speaks plain HTTP there
  gets Go's answer, 400 "Client sent an HTTP request to an HTTPS server.", and nothing
  else. The certificates are made with the ``openssl`` command (Debian's openssl
  package, which ca-certificates pulls in) when the process starts, EC P-256 as k3s's:
  a server makes its cluster CA once, self-signed, <data-dir>/server/tls/server-ca.crt
  (its key server-ca.key, 0600), and at every start the API's certificate signed by it,
  serving-kube-apiserver.crt, for localhost, 127.0.0.1, ::1, the kubernetes service
  names, ``node-name``, ``node-ip``, ``bind-address`` and every ``tls-san``; every node
  makes at every start a self-signed kubelet certificate,
  <data-dir>/agent/serving-kubelet.crt (k3s signs that one with its CA; the stand-in's
  agents have no CA key). The API answers ``/readyz``, ``/livez`` and ``/healthz``
  with 200 "ok" to a client with credentials and 401 to one without (k3s turns
  anonymous access off), ``/cacerts`` (the CA's PEM) to anyone. A server keeps the
  cluster's nodes and an event log in <data-dir>/server/standin-state.json, writes the
  admin kubeconfig (``write-kubeconfig``, default /etc/rancher/k3s/k3s.yaml, mode
  ``write-kubeconfig-mode``) naming ``https://<bind-address, else 127.0.0.1>:<port>``
  and the CA (``certificate-authority-data``) as k3s does, registers itself as a node
  and then tells systemd READY=1. Every node fetches the CA from ``/cacerts`` of the
  server named by ``server`` (a server: uses its own), unverified as a k3s agent with
  a token that pins no CA hash does, then verifies the server's certificate (name
  included) with it in every call, and registers with that server proving the cluster
  token by its sha256 (the token never crosses the network), after the server reached
  its kubelet port at its ``node-ip`` (over TLS, the certificate not verified); it gets
  a node credential, written with the CA to <data-dir>/agent/kubelet.kubeconfig (mode
  0600), and heartbeats every 2 s. A node is Ready while its last heartbeat is under
  10 s old; its kubeletVersion is that of the process that registered last, so right
  after a restart the Node still shows the old process's status, as in Kubernetes.
  SIGTERM stops it cleanly.
- ``k3s kubectl`` (or ``kubectl`` through the symlink): ``get node[s] [NAME]`` (a
  table, or ``-o jsonpath=`` with paths, ``[?(@.k=="v")]`` filters, ``range``/``end``
  and string literals), ``cordon``, ``uncordon``, ``drain NAME --ignore-daemonsets
  --delete-emptydir-data --timeout=Ns`` (there are no pods: it cordons and logs),
  ``annotate [--overwrite] node NAME KEY=VALUE|KEY-``; ``--kubeconfig`` or
  $KUBECONFIG or /etc/rancher/k3s/k3s.yaml. It verifies the server's certificate with
  the kubeconfig's ``certificate-authority-data`` (or ``certificate-authority``, a
  file), as kubectl does; ``insecure-skip-tls-verify: true`` turns that off, and a
  kubeconfig naming neither verifies with the system's CAs.

Standard library only (and the openssl command, for the certificates): the nodes have
python3 and nothing else of ours.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

VERSION = "@VERSION@"
BANNER = f"STAND-IN k3s v{VERSION} for aicluster's end-to-end tests: not k3s"
CONFIG = "/etc/rancher/k3s/config.yaml"
DATA_DIR = "/var/lib/rancher/k3s"
KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
KUBELET_PORT = 10250
HEARTBEAT_S = 2.0
READY_WITHIN_S = 10.0
#: config.yaml keys the stand-in understands (k3s's names and meanings).
COMMON_KEYS = {"node-name", "node-ip", "bind-address", "token-file", "server", "flannel-iface",
               "node-label", "data-dir"}
SERVER_KEYS = COMMON_KEYS | {"https-listen-port", "write-kubeconfig", "write-kubeconfig-mode",
                             "cluster-init", "tls-san"}


class Unsupported(SystemExit):
    def __init__(self, what: str, prog: str = "k3s"):
        print(f"stand-in {prog}: unsupported: {what} ({BANNER})", file=sys.stderr)
        super().__init__(2)


def log(message: str) -> None:
    print(f"k3s-standin: {message}", file=sys.stderr, flush=True)


def die(message: str) -> None:
    log(f"fatal: {message}")
    raise SystemExit(1)


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- config ----------------------------------------------------------------------------


def read_config(path: str, role: str) -> dict:
    allowed = SERVER_KEYS if role == "server" else COMMON_KEYS
    out: dict = {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        die(f"cannot read {path}: {exc}")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        try:
            parsed = json.loads(value) if sep else None
        except ValueError:
            parsed = None
        if not sep or parsed is None:
            raise Unsupported(f"{path} line {number}: not 'key: <JSON value>' (the stand-in "
                              "reads only config.yaml as aicluster writes it)")
        key = key.strip()
        if key not in allowed:
            raise Unsupported(f"{path}: setting {key!r} for a k3s {role}")
        out[key] = parsed
    return out


def read_token(config: dict) -> str:
    path = config.get("token-file")
    if not path:
        raise Unsupported("no token-file in config.yaml (aicluster always writes one)")
    token = Path(path).read_text().strip()
    if not token:
        die(f"{path} is empty")
    return token


# --- TLS: certificates made with the openssl command ------------------------------------

#: The Kubernetes service's names, in k3s's API certificate too.
API_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local")
OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {cn}
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,digitalSignature,keyEncipherment,keyCertSign
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = {sans}
"""
NEW_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(args: list[str], cn: str, sans: list[str], work: Path) -> None:
    """Run ``openssl ARGS`` with a config naming *cn* and the ``subjectAltName`` *sans*
    (``-config`` and ``-extfile`` point to it), dying with openssl's words if it fails."""
    cfg = work / "openssl.cnf"
    cfg.write_text(OPENSSL_CONFIG.format(cn=cn, sans=", ".join(sans) or "DNS:localhost"))
    args = [cfg.as_posix() if a == "@CONFIG@" else a for a in args]
    try:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60,
                              check=False)
    except FileNotFoundError:
        die("no openssl command: the stand-in makes its TLS certificates with it "
            "(Debian: apt-get install openssl)")
    if done.returncode:
        die(f"openssl {args[0]} failed: {done.stderr.strip()}")


def subject_alt_names(names) -> list[str]:
    """``IP:``/``DNS:`` entries for *names* (addresses and host names), each once."""
    out: list[str] = []
    for name in names:
        name = str(name or "").strip().strip("[]")
        if not name or name in ("0.0.0.0", "::"):
            continue
        try:
            entry = f"IP:{ipaddress.ip_address(name)}"
        except ValueError:
            entry = f"DNS:{name}"
        if entry not in out:
            out.append(entry)
    return out


def make_ca(tls_dir: Path) -> tuple[Path, Path]:
    """The cluster CA (self-signed, ten years, as k3s's), made once and kept."""
    crt, key = tls_dir / "server-ca.crt", tls_dir / "server-ca.key"
    if crt.exists() and key.exists():
        return crt, key
    tls_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(dir=tls_dir) as work:
        w = Path(work)
        openssl(["req", "-x509", "-new", *NEW_KEY, "-keyout", (w / "k").as_posix(),
                 "-out", (w / "c").as_posix(), "-days", "3650", "-config", "@CONFIG@",
                 "-extensions", "ca"], f"k3s-server-ca@{int(time.time())}", [], w)
        os.chmod(w / "k", 0o600)
        os.replace(w / "k", key)
        os.replace(w / "c", crt)
    log(f"made the cluster CA {crt} (self-signed)")
    return crt, key


def make_leaf(crt: Path, key: Path, cn: str, names, ca: tuple[Path, Path] | None) -> None:
    """A serving certificate for *names*, signed by *ca* (its cert and key), else
    self-signed; its key 0600. Made anew at every start, as the names may change."""
    crt.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    sans = subject_alt_names(names)
    with tempfile.TemporaryDirectory(dir=crt.parent) as work:
        w = Path(work)
        if ca is None:
            openssl(["req", "-x509", "-new", *NEW_KEY, "-keyout", (w / "k").as_posix(),
                     "-out", (w / "c").as_posix(), "-days", "365", "-config", "@CONFIG@",
                     "-extensions", "leaf"], cn, sans, w)
        else:
            openssl(["req", "-new", *NEW_KEY, "-keyout", (w / "k").as_posix(),
                     "-out", (w / "r").as_posix(), "-config", "@CONFIG@"], cn, sans, w)
            openssl(["x509", "-req", "-in", (w / "r").as_posix(), "-CA", ca[0].as_posix(),
                     "-CAkey", ca[1].as_posix(), "-set_serial",
                     f"0x{secrets.token_hex(16)}", "-days", "365", "-extfile", "@CONFIG@",
                     "-extensions", "leaf", "-out", (w / "c").as_posix()], cn, sans, w)
        os.chmod(w / "k", 0o600)
        os.replace(w / "k", key)
        os.replace(w / "c", crt)
    log(f"made {crt} ({'signed by ' + ca[0].name if ca else 'self-signed'}; "
        f"{', '.join(sans)})")


def server_context(crt: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(crt, key)
    return context


def client_context(ca_pem: str | None = None, verify: bool = True) -> ssl.SSLContext:
    """Verifying with *ca_pem* (else the system's CAs), names included; or not at all."""
    if not verify:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cadata=ca_pem) if ca_pem else \
        ssl.create_default_context()


# --- HTTP plumbing ------------------------------------------------------------------------

#: What Go's net/http answers a plain-HTTP request on a TLS port (and then hangs up).
NOT_TLS_ANSWER = (b"HTTP/1.0 400 Bad Request\r\n\r\n"
                  b"Client sent an HTTP request to an HTTPS server.\n")


def serve(address: str, port: int, handler,
          context: ssl.SSLContext) -> http.server.ThreadingHTTPServer:
    """HTTPS on *address*:*port*; each connection's TLS handshake in its own thread."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    class Server(http.server.ThreadingHTTPServer):
        address_family = family
        daemon_threads = True
        allow_reuse_address = True

        def finish_request(self, sock, client_address):
            sock.settimeout(10)
            try:
                first = sock.recv(1, socket.MSG_PEEK)
                if first and first != b"\x16":  # not a TLS record (a handshake's is 0x16)
                    if first.isalpha():
                        sock.sendall(NOT_TLS_ANSWER)
                    return
                if not first:
                    return
                tls = context.wrap_socket(sock, server_side=True)
            except OSError:  # ssl.SSLError included: a failed handshake; hang up
                return
            try:
                self.RequestHandlerClass(tls, client_address, self)
            finally:
                tls.close()

    try:
        httpd = Server((address, port), handler)
    except OSError as exc:
        die(f"cannot listen on {url_host(address)}:{port}: {exc}")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log(f"listening on {url_host(address)}:{port} (HTTPS)")
    return httpd


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "k3s-standin"
    timeout = 30

    def log_message(self, fmt, *args):  # requests are not logged (no secret in any)
        pass

    def reply(self, status: int, body) -> None:
        self.reply_bytes(status, (json.dumps(body) + "\n").encode(), "application/json")

    def reply_bytes(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            value = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            value = None
        return value if isinstance(value, dict) else {}

    def bearer(self) -> str:
        value = self.headers.get("Authorization") or ""
        return value[7:] if value.startswith("Bearer ") else ""


def fetch(method: str, url: str, context: ssl.SSLContext, credential: str = "", body=None,
          timeout: float = 10) -> tuple[int, bytes]:
    """(status, body bytes) of one HTTPS call; raises OSError when nothing answers (or
    the TLS handshake fails: ssl.SSLError, in urllib's URLError)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if credential:
        req.add_header("Authorization", f"Bearer {credential}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def request(method: str, url: str, context: ssl.SSLContext, credential: str = "", body=None,
            timeout: float = 10):
    """(status, JSON body) of one API call; raises OSError when nothing answers."""
    status, data = fetch(method, url, context, credential, body, timeout)
    try:
        return status, json.loads(data or b"{}")
    except ValueError:
        return status, {}


def notify_ready() -> None:
    """READY=1 to systemd (Type=notify units), as k3s does once it serves."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(path)
        sock.sendall(b"READY=1")
    log("told systemd READY=1")


# --- the server's state (one file, like the datastore) -----------------------------------


class Cluster:
    def __init__(self, path: Path, token: str):
        self.path = path
        self.token_digest = digest(token)
        self.lock = threading.Lock()
        self.heartbeats: dict[str, float] = {}
        if path.exists():
            self.state = json.loads(path.read_text())
        else:
            self.state = {"admin": secrets.token_hex(24), "nodes": {}, "events": [], "seq": 0}
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.state, f, indent=1)
        os.replace(tmp, self.path)

    def event(self, node: str, kind: str, **detail) -> None:
        self.state["seq"] += 1
        self.state["events"].append({"seq": self.state["seq"], "time": time.time(),
                                     "node": node, "event": kind, **detail})

    def who(self, credential: str) -> str | None:
        """'admin', a node's name, or None."""
        if credential and hmac.compare_digest(credential, self.state["admin"]):
            return "admin"
        for name, node in self.state["nodes"].items():
            if credential and hmac.compare_digest(credential, node["credential"]):
                return name
        return None

    def node_object(self, name: str) -> dict:
        node = self.state["nodes"][name]
        beat = self.heartbeats.get(name)
        ready = beat is not None and time.monotonic() - beat < READY_WITHIN_S
        labels = {"kubernetes.io/hostname": name}
        labels.update(dict(x.split("=", 1) for x in node["labels"]))
        if node["role"] == "server":
            labels["node-role.kubernetes.io/control-plane"] = "true"
        spec = {"unschedulable": True} if node["unschedulable"] else {}
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": node["annotations"]},
            "spec": spec,
            "status": {
                "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown",
                                "reason": "KubeletReady" if ready else "NodeStatusUnknown"}],
                "addresses": [{"type": "InternalIP", "address": node["address"]},
                              {"type": "Hostname", "address": name}],
                "nodeInfo": {"kubeletVersion": "v" + node["version"]},
            },
        }


#: The API's health endpoints: "ok" to an authenticated client (anyone may read them
#: once authenticated, k3s's system:public-info-viewer), 401 to an anonymous one.
HEALTH_PATHS = ("/readyz", "/livez", "/healthz")


def api_handler(cluster: Cluster, ca_pem: str):
    class Api(Handler):
        def do_GET(self):
            if self.path == "/cacerts":  # as k3s: the CA to anyone (agents fetch it)
                return self.reply_bytes(200, ca_pem.encode(), "text/plain")
            with cluster.lock:
                if cluster.who(self.bearer()) is None:
                    return self.reply(401, {"kind": "Status", "apiVersion": "v1",
                                            "status": "Failure", "message": "Unauthorized",
                                            "reason": "Unauthorized", "code": 401})
                if self.path.split("?", 1)[0] in HEALTH_PATHS:
                    return self.reply_bytes(200, b"ok", "text/plain; charset=utf-8")
                if self.path == "/api/v1/nodes":
                    items = [cluster.node_object(n) for n in sorted(cluster.state["nodes"])]
                    return self.reply(200, {"kind": "NodeList", "items": items})
                name = self.path.removeprefix("/api/v1/nodes/")
                if name != self.path and name in cluster.state["nodes"]:
                    return self.reply(200, cluster.node_object(name))
            return self.reply(404, {"message": f'nodes "{name}" not found', "reason": "NotFound"})

        def do_PATCH(self):
            name = self.path.removeprefix("/api/v1/nodes/")
            body = self.body()
            with cluster.lock:
                who = cluster.who(self.bearer())
                if who is None:
                    return self.reply(401, {"message": "Unauthorized"})
                if who != "admin":
                    return self.reply(403, {"message": f"node {who!r} may not change nodes"})
                node = cluster.state["nodes"].get(name) if name != self.path else None
                if node is None:
                    return self.reply(404, {"message": f'nodes "{name}" not found',
                                            "reason": "NotFound"})
                if "unschedulable" in body:
                    node["unschedulable"] = bool(body["unschedulable"])
                for key, value in (body.get("annotations") or {}).items():
                    if value is None:
                        node["annotations"].pop(key, None)
                    else:
                        node["annotations"][key] = str(value)
                cluster.event(name, str(body.get("event") or "patch"),
                              unschedulable=node["unschedulable"],
                              annotations=dict(node["annotations"]))
                cluster.save()
                return self.reply(200, cluster.node_object(name))

        def do_POST(self):
            body = self.body()
            if self.path == "/v1-standin/register":
                return self.register(body)
            if self.path == "/v1-standin/heartbeat":
                with cluster.lock:
                    who = cluster.who(self.bearer())
                    if who in (None, "admin"):
                        return self.reply(401, {"message": "Unauthorized"})
                    cluster.heartbeats[who] = time.monotonic()
                return self.reply(200, {"ok": True})
            return self.reply(404, {"message": "not found"})

        def register(self, body: dict):
            name, address = str(body.get("name") or ""), str(body.get("address") or "")
            offered = str(body.get("token_sha256") or "")
            if not hmac.compare_digest(offered, cluster.token_digest):
                log(f"refused node {name!r}: it does not hold this cluster's token")
                return self.reply(403, {"message": "wrong cluster token"})
            # The server reaches the node's kubelet port at the node's address (as the
            # API server reaches kubelets): the node must be reachable there.
            try:
                status, _ = request("GET", f"https://{url_host(address)}:{KUBELET_PORT}/healthz",
                                    client_context(verify=False), timeout=3)
            except OSError as exc:
                status = str(exc)
            if status != 200:
                log(f"node {name!r}: kubelet port {url_host(address)}:{KUBELET_PORT} not "
                    f"reachable ({status}); not registered yet")
                return self.reply(503, {"message": f"kubelet at {address} not reachable"})
            with cluster.lock:
                node = cluster.state["nodes"].setdefault(name, {
                    "credential": secrets.token_hex(24), "unschedulable": False,
                    "annotations": {}})
                node.update(address=address, role=str(body.get("role")),
                            version=str(body.get("version")),
                            labels=[str(x) for x in body.get("labels") or []])
                cluster.heartbeats[name] = time.monotonic()
                cluster.event(name, "register", version=node["version"], role=node["role"],
                              address=address)
                cluster.save()
                log(f"node {name!r} registered (k3s v{node['version']}, {address})")
                return self.reply(200, {"credential": node["credential"]})

    return Api


class Kubelet(Handler):
    def do_GET(self):
        if self.path == "/healthz":
            return self.reply(200, "ok")
        return self.reply(404, {"message": "not found"})


# --- server and agent -------------------------------------------------------------------


def write_private(path: str, text: str, mode: int = 0o600) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def kubeconfig_text(server: str, user: str, credential: str, ca_pem: str) -> str:
    ca_data = base64.b64encode(ca_pem.encode()).decode()
    return (
        "# STAND-IN k3s kubeconfig (aicluster's tests; not k3s)\n"
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- cluster:\n    certificate-authority-data: {ca_data}\n"
        f"    server: {server}\n  name: default\n"
        "contexts:\n- context:\n    cluster: default\n    user: default\n  name: default\n"
        "current-context: default\n"
        f"users:\n- name: default\n  user:\n    # {user}\n    token: {credential}\n"
    )


def run_node(role: str, args: list[str]) -> int:
    config_path = CONFIG
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("-c", "--config") and rest:
            config_path = rest.pop(0)
        elif arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        else:
            raise Unsupported(f"k3s {role} argument {arg!r}")
    config = read_config(config_path, role)
    log(BANNER)
    token = read_token(config)
    name = str(config.get("node-name") or socket.gethostname())
    node_ip = str(config.get("node-ip") or "")
    if not node_ip:
        raise Unsupported("no node-ip in config.yaml (aicluster always writes one)")
    bind = str(config.get("bind-address") or "0.0.0.0")
    iface = config.get("flannel-iface")
    if iface and not Path(f"/sys/class/net/{iface}").exists():
        die(f"flannel-iface {iface!r}: unable to find interface")
    data_dir = Path(str(config.get("data-dir") or DATA_DIR))
    labels = config.get("node-label") or []

    # Set by SIGTERM/SIGINT. A plain list, never a threading.Event: a signal handler runs
    # in the main thread between two bytecodes, and one that takes a lock (Event.set)
    # deadlocks when the signal lands while that thread holds it (two signals at once).
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    agent_dir = data_dir / "agent"
    kubelet_crt, kubelet_key = agent_dir / "serving-kubelet.crt", agent_dir / "serving-kubelet.key"
    make_leaf(kubelet_crt, kubelet_key, name, [name, node_ip, bind, "localhost", "127.0.0.1"],
              None)
    listeners = [serve(bind, KUBELET_PORT, Kubelet, server_context(kubelet_crt, kubelet_key))]
    ca_pem = ""
    if role == "server":
        if config.get("server"):
            raise Unsupported("a server joining another (embedded etcd across servers)")
        port = int(config.get("https-listen-port") or 6443)
        cluster = Cluster(data_dir / "server" / "standin-state.json", token)
        tls_dir = data_dir / "server" / "tls"
        ca = make_ca(tls_dir)
        ca_pem = ca[0].read_text()
        sans = config.get("tls-san") or []
        api_crt = tls_dir / "serving-kube-apiserver.crt"
        api_key = tls_dir / "serving-kube-apiserver.key"
        make_leaf(api_crt, api_key, "kube-apiserver",
                  [*API_NAMES, "127.0.0.1", "::1", name, node_ip, bind,
                   *([sans] if isinstance(sans, str) else sans)], ca)
        listeners.append(serve(bind, port, api_handler(cluster, ca_pem),
                               server_context(api_crt, api_key)))
        own = bind if bind not in ("0.0.0.0", "::") else "127.0.0.1"
        server_url = f"https://{url_host(own)}:{port}"
        mode = int(str(config.get("write-kubeconfig-mode") or "0600"), 8)
        admin_config = str(config.get("write-kubeconfig") or KUBECONFIG)
        write_private(admin_config, kubeconfig_text(server_url, "admin",
                                                    cluster.state["admin"], ca_pem), mode)
        log(f"wrote {admin_config} (server {server_url})")
    else:
        server_url = str(config.get("server") or "")
        if not server_url:
            raise Unsupported("an agent without server in config.yaml")
    if not server_url.startswith("https://"):
        raise Unsupported(f"server {server_url!r}: k3s's API is https://")

    registration = {"name": name, "role": role, "address": node_ip, "version": VERSION,
                    "labels": labels, "token_sha256": digest(token)}
    credential = ""
    told_systemd = False
    while not stopping:
        if not credential:
            try:
                if role != "server":  # an agent trusts the CA the server hands out
                    ca_pem = fetch_ca(server_url)
                status, answer = request("POST", f"{server_url}/v1-standin/register",
                                         client_context(ca_pem), body=registration)
            except OSError as exc:
                status, answer = str(getattr(exc, "reason", exc)), {}
            if status == 200:
                credential = answer["credential"]
                write_private(str(agent_dir / "kubelet.kubeconfig"),
                              kubeconfig_text(server_url, f"node {name}", credential, ca_pem))
                log(f"registered as node {name!r} with {server_url}")
                if not told_systemd:
                    notify_ready()
                    told_systemd = True
            else:
                log(f"registering with {server_url}: {status} "
                    f"{answer.get('message', '')}; retrying")
        else:
            try:
                status, _ = request("POST", f"{server_url}/v1-standin/heartbeat",
                                    client_context(ca_pem), credential)
            except OSError as exc:
                status = str(getattr(exc, "reason", exc))
            if status == 401:
                credential = ""
                continue
            if status != 200:
                log(f"heartbeat to {server_url}: {status}; retrying")
        deadline = time.monotonic() + HEARTBEAT_S
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
    for httpd in listeners:
        httpd.shutdown()
        httpd.server_close()
    log("stopped (SIGTERM)")
    return 0


def fetch_ca(server_url: str) -> str:
    """The cluster CA from the server's /cacerts, the server's certificate not verified
    (as a k3s agent whose token pins no CA hash fetches it); raises OSError when the
    answer is not a CA certificate."""
    status, data = fetch("GET", f"{server_url}/cacerts", client_context(verify=False))
    pem = data.decode(errors="replace")
    if status != 200 or "-----BEGIN CERTIFICATE-----" not in pem:
        raise OSError(f"{server_url}/cacerts: {status}, no CA certificate")
    try:
        client_context(pem)
    except ssl.SSLError as exc:
        raise OSError(f"{server_url}/cacerts: not a CA certificate ({exc})") from None
    return pem


# --- kubectl -----------------------------------------------------------------------------


def kubectl(args: list[str]) -> int:
    def unsupported(what):
        return Unsupported(what, "kubectl")

    kubeconfig = os.environ.get("KUBECONFIG") or KUBECONFIG
    words, output, overwrite, drain_flags = [], None, False, set()
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--kubeconfig" and rest:
            kubeconfig = rest.pop(0)
        elif arg.startswith("--kubeconfig="):
            kubeconfig = arg.split("=", 1)[1]
        elif arg in ("-o", "--output") and rest:
            output = rest.pop(0)
        elif arg.startswith(("-o=", "--output=")):
            output = arg.split("=", 1)[1]
        elif arg == "--overwrite":
            overwrite = True
        elif arg in ("--ignore-daemonsets", "--delete-emptydir-data") or re.fullmatch(
                r"--timeout=\d+s", arg):
            drain_flags.add(arg.split("=")[0])
        elif arg.startswith("-"):
            raise unsupported(f"flag {arg!r}")
        else:
            words.append(arg)
    if not words:
        raise unsupported("no command")
    verb = words[0]
    if output is not None and verb != "get":
        raise unsupported(f"-o with {verb}")
    if overwrite and verb != "annotate":
        raise unsupported(f"--overwrite with {verb}")
    if drain_flags and verb != "drain":
        raise unsupported(f"{', '.join(sorted(drain_flags))} with {verb}")

    server, credential, context = _kubeconfig(kubeconfig)

    def call(method, path, body=None):
        try:
            return request(method, f"{server}{path}", context, credential, body)
        except OSError as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLError):  # as kubectl words a TLS failure
                print(f"Unable to connect to the server: tls: "
                      f"{getattr(reason, 'verify_message', '') or reason}", file=sys.stderr)
            else:
                print(f"The connection to the server {server.split('://', 1)[-1]} was "
                      "refused - did you specify the right host or port?", file=sys.stderr)
            raise SystemExit(1) from None

    def fail(status, answer):
        reason = answer.get("reason") or {401: "Unauthorized", 403: "Forbidden"}.get(status, "")
        print(f"Error from server ({reason}): {answer.get('message', status)}", file=sys.stderr)
        return 1

    if verb == "get":
        if len(words) not in (2, 3) or words[1] not in ("node", "nodes", "no"):
            raise unsupported(f"get {' '.join(words[1:])} (only nodes)")
        path = "/api/v1/nodes" + (f"/{words[2]}" if len(words) == 3 else "")
        status, answer = call("GET", path)
        if status != 200:
            return fail(status, answer)
        if output is None:
            _table(answer["items"] if len(words) == 2 else [answer])
        elif output.startswith("jsonpath="):
            sys.stdout.write(jsonpath(output[len("jsonpath="):], answer))
        else:
            raise unsupported(f"-o {output}")
        return 0
    if verb in ("cordon", "uncordon", "drain"):
        if len(words) != 2:
            raise unsupported(f"{verb} with {len(words) - 1} names")
        if verb == "drain" and drain_flags != {"--ignore-daemonsets", "--delete-emptydir-data",
                                               "--timeout"}:
            raise unsupported("drain without --ignore-daemonsets --delete-emptydir-data "
                              "--timeout=Ns")
        status, answer = call("PATCH", f"/api/v1/nodes/{words[1]}",
                              {"unschedulable": verb != "uncordon", "event": verb})
        if status != 200:
            return fail(status, answer)
        if verb == "drain":
            print(f"node/{words[1]} cordoned")
            print(f"node/{words[1]} drained (stand-in: there are no pods)")
        else:
            print(f"node/{words[1]} {verb}ed")
        return 0
    if verb == "annotate":
        if len(words) != 4 or words[1] not in ("node", "nodes", "no"):
            raise unsupported(f"annotate {' '.join(words[1:])} (only one node, one key)")
        name, item = words[2], words[3]
        if item.endswith("-") and "=" not in item:
            change = {item[:-1]: None}
        elif "=" in item:
            key, value = item.split("=", 1)
            status, answer = call("GET", f"/api/v1/nodes/{name}")
            if status != 200:
                return fail(status, answer)
            old = answer["metadata"]["annotations"].get(key)
            if old is not None and old != value and not overwrite:
                print(f"error: --overwrite is false but found the following declared "
                      f"annotation(s): '{key}' already has a value ({old})", file=sys.stderr)
                return 1
            change = {key: value}
        else:
            raise unsupported(f"annotation {item!r}")
        status, answer = call("PATCH", f"/api/v1/nodes/{name}",
                              {"annotations": change, "event": "annotate"})
        if status != 200:
            return fail(status, answer)
        print(f"node/{name} annotated")
        return 0
    raise unsupported(f"command {verb!r}")


def _kubeconfig(path: str) -> tuple[str, str, ssl.SSLContext]:
    """The server, the token and the TLS context (the kubeconfig's CA) of *path*."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        print(f"error: cannot read kubeconfig {path}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(1) from None

    def field(key: str) -> str | None:
        m = re.search(rf"^\s+{key}:\s*(\S+)", text, re.M)
        return m.group(1).strip("\"'") if m else None

    server, token = field("server"), field("token")
    if not server or not token or not server.startswith("https://"):
        raise Unsupported(f"kubeconfig {path}: not one written by the stand-in", "kubectl")
    ca_pem = None
    try:
        if field("certificate-authority-data"):
            ca_pem = base64.b64decode(field("certificate-authority-data")).decode()
        elif field("certificate-authority"):
            ca_pem = Path(field("certificate-authority")).read_text()
        context = client_context(ca_pem, verify=field("insecure-skip-tls-verify") != "true")
    except (OSError, ValueError) as exc:  # ssl.SSLError included
        print(f"error: kubeconfig {path}: unusable certificate authority: {exc}",
              file=sys.stderr)
        raise SystemExit(1) from None
    return server, token, context


def _table(items: list[dict]) -> None:
    print(f"{'NAME':<12} {'STATUS':<28} {'ROLES':<16} VERSION")
    for item in items:
        ready = [c["status"] for c in item["status"]["conditions"] if c["type"] == "Ready"]
        status = "Ready" if ready == ["True"] else "NotReady"
        if item["spec"].get("unschedulable"):
            status += ",SchedulingDisabled"
        roles = ("control-plane" if "node-role.kubernetes.io/control-plane"
                 in item["metadata"]["labels"] else "<none>")
        print(f"{item['metadata']['name']:<12} {status:<28} {roles:<16} "
              f"{item['status']['nodeInfo']['kubeletVersion']}")


# --- jsonpath (the forms the deploy and the tests use) ------------------------------------

_STEP = re.compile(
    r"\.((?:[^.\[\\]|\\.)+)"                            # .name (\. escapes a dot)
    r"|\[\*\]"                                          # [*]
    r"|\[\?\(@\.([A-Za-z0-9_]+)==\"([^\"]*)\"\)\]"      # [?(@.key=="value")]
)


def _path(expr: str, obj) -> list:
    values = [obj]
    pos = 0
    while pos < len(expr):
        m = _STEP.match(expr, pos)
        if not m:
            raise Unsupported(f"jsonpath {expr!r}", "kubectl")
        pos = m.end()
        nxt = []
        for value in values:
            if m.group(1) is not None:
                key = re.sub(r"\\(.)", r"\1", m.group(1))
                if isinstance(value, dict) and key in value:
                    nxt.append(value[key])
            elif m.group(2) is not None:
                if isinstance(value, list):
                    nxt += [x for x in value if isinstance(x, dict)
                            and str(x.get(m.group(2))) == m.group(3)]
            elif isinstance(value, list):
                nxt += value
        values = nxt
    return values


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def jsonpath(template: str, obj) -> str:
    parts = re.split(r"(\{[^{}]*\})", template)
    out, _ = _run(parts, 0, obj, template)
    return out


def _run(parts: list[str], i: int, obj, template: str) -> tuple[str, int]:
    out = []
    while i < len(parts):
        part = parts[i]
        i += 1
        if not (part.startswith("{") and part.endswith("}")):
            out.append(part)
            continue
        expr = part[1:-1].strip()
        if expr == "end":
            return "".join(out), i
        if expr.startswith("range "):
            body_start = i
            end = i
            for item in _path(expr[len("range "):].strip(), obj):
                text, end = _run(parts, body_start, item, template)
                out.append(text)
            if end == body_start:  # nothing to range over: skip the body
                _, end = _run(parts, body_start, {}, template)
            i = end
        elif expr.startswith('"') and expr.endswith('"'):
            out.append(json.loads(expr))
        elif expr.startswith("."):
            out.append(" ".join(_text(v) for v in _path(expr, obj)))
        else:
            raise Unsupported(f"jsonpath {template!r}", "kubectl")
    return "".join(out), i


# --- entry ------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    prog = os.path.basename(argv[0])
    if prog == "kubectl":
        return kubectl(argv[1:])
    if prog != "k3s" and not prog.startswith("k3s"):
        raise Unsupported(f"running as {prog!r}")
    args = argv[1:]
    if args in (["--version"], ["-v"], ["version"]):
        print(f"k3s version v{VERSION} (stand-in)")
        print(BANNER)
        return 0
    if args and args[0] in ("server", "agent"):
        return run_node(args[0], args[1:])
    if args and args[0] == "kubectl":
        return kubectl(args[1:])
    raise Unsupported(f"command {' '.join(args) or '(none)'!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
