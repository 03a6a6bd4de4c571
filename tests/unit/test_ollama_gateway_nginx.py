"""The Ollama gateway's nginx configuration (roles/ollama/templates/ollama-gateway.conf.j2)
run by a real nginx in front of two STAND-IN Ollama nodes (small HTTP servers of this
test, not Ollama): a busy node (Ollama's 503 when OLLAMA_MAX_QUEUE is reached) has its
request retried on the other node and is not marked failed, while a node that drops
connections is still left out after max_fails.

Needs an nginx binary: ``AICLUSTER_TEST_NGINX`` naming one, ``nginx`` on PATH, or the
distribution's package unpacked under .venv/opt/nginx by scripts/setup.sh (what CI
runs); skipped otherwise, saying so. The fake-host tests (tests/deploys/test_ollama.py)
check the rendered directives everywhere; this one checks what nginx does with them.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import socketserver
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from aicluster.render import render

#: scripts/setup.sh unpacks the distribution's nginx here (no service installed).
UNPACKED = Path(__file__).resolve().parents[2] / ".venv/opt/nginx/usr/sbin/nginx"
NGINX = (os.environ.get("AICLUSTER_TEST_NGINX") or shutil.which("nginx")
         or (str(UNPACKED) if UNPACKED.exists() else None))
pytestmark = pytest.mark.skipif(
    not NGINX, reason="no nginx binary (PATH or AICLUSTER_TEST_NGINX): the gateway's "
                      "behaviour under a busy node is not run here")
MAX_FAILS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Node(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """A STAND-IN Ollama node: answers every request with ``mode`` (an HTTP status, or
    "drop": the connection is closed with no answer, as a crashed node)."""

    daemon_threads = True

    def __init__(self, name: str):
        self.name, self.mode, self.hits = name, 200, 0
        super().__init__(("127.0.0.1", _free_port()), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        node = self.server
        node.hits += 1
        if node.mode == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if node.mode == 503:  # Ollama's own words (server/sched.go, ErrMaxQueue)
            out = {"error": "server busy, please try again.  maximum pending requests "
                            "exceeded"}
        else:
            out = {"node": node.name, "prompt": body.decode()}
        data = json.dumps(out).encode()
        self.send_response(node.mode)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST


@pytest.fixture
def gateway(tmp_path: Path):
    """nginx running the gateway's rendered configuration over nodes A and B."""
    a, b = _Node("A"), _Node("B")
    port = _free_port()
    conf = render("ollama", "ollama-gateway.conf.j2", {
        "ollama_gateway_upstreams": [f"127.0.0.1:{a.server_port}",
                                     f"127.0.0.1:{b.server_port}"],
        "ollama_gateway_max_fails": MAX_FAILS,
        "ollama_gateway_fail_timeout": 60,
        "ollama_gateway_keepalive": 8,
        "ollama_gateway_listen_address": f"127.0.0.1:{port}",
        "ollama_gateway_client_max_body_size": "0",
        "ollama_gateway_connect_timeout": 5,
        "ollama_gateway_proxy_timeout": 30,
    })
    temp = " ".join(f"{k}_temp_path {tmp_path}/{k};"
                    for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (tmp_path / "nginx.conf").write_text(
        f"daemon off; pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log info;\n"
        f"events {{}}\nhttp {{\naccess_log off; {temp}\n{conf}}}\n")
    proc = subprocess.Popen([NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.05)
    try:
        yield url, a, b, tmp_path / "error.log"
    finally:
        proc.terminate()
        proc.wait(10)
        for node in (a, b):
            node.shutdown()
            node.server_close()


def _post(url: str, prompt: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/api/generate", data=prompt.encode(),
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


def test_a_busy_node_is_retried_on_another_and_not_marked_failed(gateway):
    url, a, b, log = gateway
    a.mode = 503
    answers = [_post(url, f"prompt {i}") for i in range(4 * MAX_FAILS)]
    # Every generation answered, by B, with its own body: the request was read whole and
    # sent again after A refused it.
    assert answers == [(200, {"node": "B", "prompt": f"prompt {i}"})
                       for i in range(4 * MAX_FAILS)], answers
    assert a.hits >= MAX_FAILS  # A was asked (and refused) more than max_fails times
    assert "temporarily disabled" not in log.read_text()
    # A is no longer busy: it is in rotation at once, not after fail_timeout.
    a.mode, a.hits = 200, 0
    answers = [_post(url, f"again {i}") for i in range(6)]
    assert all(code == 200 for code, _ in answers) and a.hits >= 2, (answers, a.hits)


def test_every_node_busy_gives_the_client_ollamas_503(gateway):
    url, a, b, log = gateway
    a.mode = b.mode = 503
    assert _post(url, "p")[0] == 503
    assert a.hits + b.hits == 2  # tried once, retried once: no loop
    assert "temporarily disabled" not in log.read_text()


def test_a_node_that_drops_connections_is_still_left_out(gateway):
    url, a, b, log = gateway
    a.mode = "drop"
    for i in range(4 * MAX_FAILS):
        _post(url, f"prompt {i}")
    assert "upstream server temporarily disabled" in log.read_text()
    before = a.hits
    answers = [_post(url, f"later {i}") for i in range(6)]
    assert a.hits == before and all(code == 200 for code, _ in answers), answers
