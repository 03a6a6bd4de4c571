#!/usr/bin/env python3
"""STAND-IN dcgm-exporter (not NVIDIA's): the ``/usr/bin/dcgm-exporter`` of the e2e
tests' stand-in ``datacenter-gpu-manager-exporter`` package.

The testbed has no GPU and no CUDA repository, so tests/e2e/standins/dcgm.py packs this
script into a .deb named and versioned as NVIDIA's package, which the production deploy
installs through its own pinned path. It takes the flags aicluster's command line passes
(``-f``/``--collectors FILE``, ``-a``/``--address [HOST]:PORT``,
``-r``/``--remote-hostengine-info HOST:PORT``; other dcgm-exporter flags are accepted and
ignored) and serves on ``GET /metrics`` the captured exposition of the state named in
``$AICLUSTER_STANDIN_DCGM_STATE_FILE`` (default /etc/aicluster-standin-dcgm/state, read
at each scrape: ``healthy`` when missing), from ``$AICLUSTER_STANDIN_DCGM_FIXTURES``
(default /usr/share/aicluster-standin-dcgm), with ``@HOSTNAME@`` replaced by this
node's name and only the metric families the counters file lists (as dcgm-exporter
serves only the fields its CSV names). A missing or unreadable counters file, or a
state with no fixture, fails as dcgm-exporter fails on a bad configuration: an error
and exit 1 (at start) or HTTP 500 (at a scrape). ``--version`` says STAND-IN.

Standard library only (the testbed's nodes are Debian 12 with python3).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = "unset"
WHAT = "STAND-IN dcgm-exporter (not NVIDIA's)"
STATE_FILE = "/etc/aicluster-standin-dcgm/state"
FIXTURES = "/usr/share/aicluster-standin-dcgm"
DEFAULT_STATE = "healthy"


def counters(path: str) -> set[str]:
    """The metric names a dcgm-exporter counters CSV lists (label-type rows excluded)."""
    names = set()
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",", 2)]
        if len(fields) != 3:
            raise ValueError(f"{path}: {line!r}: not 'field, type, help'")
        if fields[1] != "label":
            names.add(fields[0])
    return names


def exposition(state_file: str, fixtures: str, wanted: set[str], hostname: str) -> str:
    """The current state's fixture, as dcgm-exporter would serve it."""
    try:
        state = Path(state_file).read_text().strip() or DEFAULT_STATE
    except FileNotFoundError:
        state = DEFAULT_STATE
    if "/" in state or state.startswith("."):
        raise ValueError(f"{state_file}: {state!r} is not a state name")
    text = (Path(fixtures) / f"{state}.prom").read_text()
    out = []
    for line in text.splitlines():
        parts = line.split()
        if line.startswith("#"):
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in wanted:
                out.append(line)
            continue
        if line.strip() and line.split("{", 1)[0].split()[0] in wanted:
            out.append(line.replace("@HOSTNAME@", hostname))
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dcgm-exporter", add_help=True)
    parser.add_argument("-f", "--collectors", default="/etc/dcgm-exporter/default-counters.csv")
    parser.add_argument("-a", "--address", default=":9400")
    parser.add_argument("-r", "--remote-hostengine-info", default="")
    parser.add_argument("-v", "--version", action="store_true")
    args, _ignored = parser.parse_known_args(argv)
    if args.version:
        print(f"dcgm-exporter version {VERSION} ({WHAT})")
        return 0
    try:
        wanted = counters(args.collectors)
    except (OSError, ValueError) as exc:
        print(f"{WHAT}: cannot read the counters file: {exc}", file=sys.stderr)
        return 1
    host, _, port = args.address.rpartition(":")
    host = host.strip("[]")
    state_file = os.environ.get("AICLUSTER_STANDIN_DCGM_STATE_FILE", STATE_FILE)
    fixtures = os.environ.get("AICLUSTER_STANDIN_DCGM_FIXTURES", FIXTURES)
    hostname = socket.gethostname()
    engine = args.remote_hostengine_info or "embedded"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] != "/metrics":
                body, status, kind = f"{WHAT}: /metrics\n".encode(), 404, "text/plain"
            else:
                try:
                    body = exposition(state_file, fixtures, wanted, hostname).encode()
                    status, kind = 200, "text/plain; version=0.0.4; charset=utf-8"
                except (OSError, ValueError) as exc:
                    body, status, kind = f"{WHAT}: {exc}\n".encode(), 500, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Stand-In", WHAT)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, int(port)), Handler)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print(f"{WHAT} {VERSION}: serving {args.address}, counters {args.collectors}, "
          f"host engine {engine}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
