"""The STAND-IN k3s (tests/e2e/standins/k3s.py builds it from k3s_executable.py) run
locally, as the e2e tests' nodes run it: a server and an agent, each on its own loopback
address (the kubelet port, 10250, is fixed, as in k3s), their state under tmp_path.

- the API port and the kubelet port speak TLS, as in k3s; plain HTTP there is answered
  400 "Client sent an HTTP request to an HTTPS server." (Go's words) and nothing else;
- ``/readyz`` (``/livez``, ``/healthz``) answers 401 to an anonymous client and 200
  "ok" with credentials, so the monitoring's blackbox module k3s_api (200 or 401, the
  certificate not verified) passes against it;
- the API's certificate is signed by the cluster CA the server made (self-signed, key
  0600), for its address and the ``tls-san`` names and no other; the admin kubeconfig
  carries that CA (``certificate-authority-data``), the stand-in kubectl verifies the
  server with it and refuses a server the kubeconfig's CA did not sign;
- an agent fetches the CA from ``/cacerts``, joins, and its kubelet kubeconfig carries
  the same CA.

STAND-IN: these tests prove the stand-in, never k3s."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.standins import k3s as standin

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="the stand-in makes its certificates with openssl")

TOKEN = "stand-in-cluster-token-0123"
TLS_SAN = "k3s.example.test"
KUBELET_PORT = 10250
READY = ('jsonpath={range .items[*]}{.metadata.name}='
         '{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}')


def _addresses() -> tuple[str, str]:
    """Two loopback addresses of their own, so that both nodes' kubelet port 10250 is
    free (unless something listens on it on every address: then the tests skip)."""
    base = f"127.{random.randint(64, 250)}.{random.randint(1, 250)}"
    addresses = (f"{base}.1", f"{base}.2")
    for address in addresses:
        with socket.socket() as s:
            try:
                s.bind((address, KUBELET_PORT))
            except OSError as exc:
                pytest.skip(f"cannot listen on {address}:{KUBELET_PORT}: {exc}")
    return addresses


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _config(path: Path, settings: dict) -> Path:
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in settings.items()))
    return path


class Node:
    def __init__(self, exe: Path, root: Path, role: str, settings: dict):
        self.exe, self.root = exe, root
        self.data = root / "data"
        self.log = root / "k3s.log"
        config = _config(root / "config.yaml", {**settings, "data-dir": str(self.data)})
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(exe), role, "-c", str(config)], stdout=log,
                stderr=subprocess.STDOUT, env={"PATH": os.environ.get("PATH", "/usr/bin")})

    def wait_registered(self, timeout: float = 30) -> None:
        path = self.data / "agent" / "kubelet.kubeconfig"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the stand-in did not register (rc {self.proc.poll()}):\n"
                            + self.log.read_text())
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A stand-in server and agent, started as systemd starts them (config.yaml as
    aicluster writes it), stopped by SIGTERM afterwards."""
    print(standin.banner())
    root = tmp_path_factory.mktemp("k3s")
    exe = root / "k3s"
    exe.write_bytes(standin.executable(standin.VERSIONS[0]))
    exe.chmod(0o755)
    token = root / "token"
    token.write_text(TOKEN + "\n")
    server_ip, agent_ip = _addresses()
    port = _free_port(server_ip)
    (root / "server").mkdir()
    (root / "agent").mkdir()
    server = Node(exe, root / "server", "server", {
        "bind-address": server_ip, "https-listen-port": port, "node-ip": server_ip,
        "node-name": "node1", "token-file": str(token), "tls-san": [TLS_SAN],
        "write-kubeconfig": str(root / "server" / "k3s.yaml"),
        "write-kubeconfig-mode": "0600"})
    agent = None
    try:
        server.wait_registered()
        agent = Node(exe, root / "agent", "agent", {
            "bind-address": agent_ip, "node-ip": agent_ip, "node-name": "node2",
            "token-file": str(token), "server": f"https://{server_ip}:{port}"})
        agent.wait_registered()
        yield {"exe": exe, "root": root, "server": server, "agent": agent,
               "address": server_ip, "agent_address": agent_ip, "port": port,
               "url": f"https://{server_ip}:{port}",
               "kubeconfig": root / "server" / "k3s.yaml"}
    finally:
        for node in (agent, server):
            if node is not None:
                node.stop()
    for node in (agent, server):
        assert node.proc.returncode == 0, node.log.read_text()
        assert "stopped (SIGTERM)" in node.log.read_text()


def _unverified() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _get(url: str, context: ssl.SSLContext | None = None, token: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _kubeconfig_field(path: Path, key: str) -> str:
    match = re.search(rf"^\s+{key}:\s*(\S+)", path.read_text(), re.M)
    assert match, f"{path}: no {key}"
    return match.group(1)


def _admin_token(cluster) -> str:
    return _kubeconfig_field(cluster["kubeconfig"], "token")


def _ca_pem(kubeconfig: Path) -> str:
    return base64.b64decode(_kubeconfig_field(kubeconfig, "certificate-authority-data")).decode()


def _handshake(address: str, port: int, context: ssl.SSLContext, name: str) -> dict:
    with socket.create_connection((address, port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name) as tls:
        return tls.getpeercert()


def _kubectl(cluster, *args: str, kubeconfig: Path | None = None):
    return subprocess.run(
        [sys.executable, str(cluster["exe"]), "kubectl", "--kubeconfig",
         str(kubeconfig or cluster["kubeconfig"]), *args],
        capture_output=True, text=True, timeout=30, check=False)


def test_readyz_answers_https_401_anonymously_and_200_with_credentials(cluster):
    """What the blackbox module k3s_api sees (verification off): 401, a valid status."""
    for path in ("/readyz", "/livez", "/healthz"):
        status, body = _get(cluster["url"] + path, _unverified())
        assert status == 401, (path, status, body)
        assert json.loads(body)["reason"] == "Unauthorized"
        status, body = _get(cluster["url"] + path, _unverified(), _admin_token(cluster))
        assert (status, body) == (200, b"ok"), path
    # A node's own credentials read it too (any authenticated client may).
    node_token = _kubeconfig_field(
        cluster["agent"].data / "agent" / "kubelet.kubeconfig", "token")
    assert _get(cluster["url"] + "/readyz", _unverified(), node_token) == (200, b"ok")


def test_plain_http_is_refused_on_the_api_and_kubelet_ports(cluster):
    """Plain HTTP gets Go's 400 and no API answer, with or without credentials."""
    for address, port in ((cluster["address"], cluster["port"]),
                          (cluster["address"], KUBELET_PORT),
                          (cluster["agent_address"], KUBELET_PORT)):
        status, body = _get(f"http://{address}:{port}/readyz", token=_admin_token(cluster))
        assert status == 400, (address, port, status, body)
        assert body == b"Client sent an HTTP request to an HTTPS server.\n"
    with socket.create_connection((cluster["address"], cluster["port"]), timeout=10) as s:
        s.sendall(b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  + _admin_token(cluster).encode() + b"\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 400 ") and b"NodeList" not in answer, answer


def test_the_api_certificate_is_signed_by_the_clusters_self_signed_ca(cluster):
    data = cluster["server"].data
    tls = data / "server" / "tls"
    ca_pem = _ca_pem(cluster["kubeconfig"])
    assert ca_pem == (tls / "server-ca.crt").read_text()
    assert (tls / "server-ca.key").stat().st_mode & 0o777 == 0o600
    assert (tls / "serving-kube-apiserver.key").stat().st_mode & 0o777 == 0o600
    assert tls.stat().st_mode & 0o777 == 0o700
    # Anyone may fetch the CA (agents do, before they trust the server).
    assert _get(cluster["url"] + "/cacerts", _unverified()) == (200, ca_pem.encode())

    verified = ssl.create_default_context(cadata=ca_pem)
    for name in (cluster["address"], TLS_SAN, "localhost", "kubernetes.default.svc"):
        cert = _handshake(cluster["address"], cluster["port"], verified, name)
        issuer = dict(x[0] for x in cert["issuer"])
        subject = dict(x[0] for x in cert["subject"])
        assert issuer["commonName"].startswith("k3s-server-ca@"), cert
        assert subject["commonName"] == "kube-apiserver", cert
    with pytest.raises(ssl.SSLCertVerificationError):  # a name it was not made for
        _handshake(cluster["address"], cluster["port"], verified, "elsewhere.example.test")
    with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs: self-signed
        _handshake(cluster["address"], cluster["port"], ssl.create_default_context(),
                   cluster["address"])
    # Its kubeconfig's API URL verifies with its CA (urllib, names checked).
    assert _get(cluster["url"] + "/readyz", verified, _admin_token(cluster)) == (200, b"ok")


def test_the_kubelet_port_is_https_with_a_self_signed_certificate(cluster):
    for node, address in ((cluster["server"], cluster["address"]),
                          (cluster["agent"], cluster["agent_address"])):
        own = (node.data / "agent" / "serving-kubelet.crt").read_text()
        assert (node.data / "agent" / "serving-kubelet.key").stat().st_mode & 0o777 == 0o600
        assert _get(f"https://{address}:{KUBELET_PORT}/healthz", _unverified())[0] == 200
        cert = _handshake(address, KUBELET_PORT, ssl.create_default_context(cadata=own),
                          address)
        assert cert["issuer"] == cert["subject"], cert


def test_kubectl_and_the_agent_verify_the_server_with_the_kubeconfigs_ca(cluster):
    nodes = _kubectl(cluster, "get", "nodes", "-o", READY)
    assert nodes.returncode == 0, nodes.stderr
    assert sorted(nodes.stdout.split()) == ["node1=True", "node2=True"], nodes.stdout
    # The agent took the server's CA from /cacerts and keeps it in its kubeconfig; with
    # it, it reads its own Node object (what `aicluster-k3s wait` runs).
    kubelet = cluster["agent"].data / "agent" / "kubelet.kubeconfig"
    assert _ca_pem(kubelet) == _ca_pem(cluster["kubeconfig"])
    own = _kubectl(cluster, "get", "node", "node2", "-o",
                   'jsonpath={.metadata.name}={.status.conditions[?(@.type=="Ready")].status}',
                   kubeconfig=kubelet)
    assert own.returncode == 0 and own.stdout == "node2=True", own

    # A kubeconfig whose CA did not sign the server's certificate: refused, as kubectl
    # refuses it; unless it says insecure-skip-tls-verify.
    wrong_ca = (cluster["agent"].data / "agent" / "serving-kubelet.crt").read_text()
    text = cluster["kubeconfig"].read_text()
    current = _kubeconfig_field(cluster["kubeconfig"], "certificate-authority-data")
    wrong = cluster["root"] / "wrong-ca.yaml"
    wrong.write_text(text.replace(current, base64.b64encode(wrong_ca.encode()).decode()))
    refused = _kubectl(cluster, "get", "nodes", kubeconfig=wrong)
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("Unable to connect to the server: tls: "), refused.stderr
    assert "certificate" in refused.stderr
    insecure = cluster["root"] / "insecure.yaml"
    insecure.write_text(text.replace(f"certificate-authority-data: {current}",
                                     "insecure-skip-tls-verify: true"))
    assert _kubectl(cluster, "get", "nodes", kubeconfig=insecure).returncode == 0
