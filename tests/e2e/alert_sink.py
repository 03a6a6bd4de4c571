"""A webhook receiver for Alertmanager on the host, for the e2e tests: Alertmanager's
webhook payloads (its JSON: ``{"status", "alerts": [{"status", "labels", ...}]}``)
POSTed to ``http://<host's management address>:<PORT>/alerts`` are appended, one alert
a line with the time it came, to a file, so a test waits for an alert to arrive
firing, then resolved. The server is a process of its own (``python -m
tests.e2e.alert_sink ADDRESS PORT FILE``), not a thread of the test session: pyinfra's
gevent must not find a thread it did not patch.

The lab in miniature names it as its receiver (tests/e2e/conftest.py's overrides), and
it is started with the lab, so no notification of the session is lost. It listens on
the host's address on the testbed's management bridge only: the nodes reach it over
the bridge, nothing else can.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: The port the sink listens on (the inventory's receiver URL names it).
PORT = 19095


@dataclass
class Notification:
    at: float
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclass
class AlertSink:
    address: str
    log: Path
    port: int = PORT
    pid: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/alerts"

    def overrides(self) -> dict:
        """The inventory settings that send every alert here, batched quickly (the
        testbed's overrides: tests/e2e/conftest.py)."""
        return {"monitoring_receivers": [{"name": "e2e", "type": "webhook", "url": self.url}],
                "monitoring_route": {"default": "e2e"},
                "monitoring_alert_group_wait": "10s",
                "monitoring_alert_group_interval": "30s"}

    def start(self) -> AlertSink:
        self.log.write_text("")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.alert_sink", self.address, str(self.port),
             str(self.log)], cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = proc.pid
        for _ in range(50):
            if (self.log.parent / (self.log.name + ".ready")).exists():
                return self
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"the alert sink did not start on {self.url} (exit "
                           f"{proc.poll()}: is the port taken? ss -ltnp 'sport = {self.port}')")

    def stop(self) -> None:
        """Stop the sink's own process (the one :meth:`start` made), by its id."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.pid = None

    def since(self, start: float) -> list[Notification]:
        out = []
        for line in self.log.read_text().splitlines():
            entry = json.loads(line)
            if entry["at"] >= start:
                out.append(Notification(entry["at"], entry["status"], entry["labels"],
                                        entry["annotations"]))
        return out

    def wait(self, alertname: str, status: str, start: float, timeout: float,
             **labels: str) -> Notification:
        """The first notification of *alertname* with *status* ("firing" or
        "resolved") and *labels* received since *start*; fails after *timeout* s,
        listing what did arrive."""
        deadline = time.time() + timeout
        while True:
            for n in self.since(start):
                if (n.labels.get("alertname") == alertname and n.status == status
                        and all(n.labels.get(k) == v for k, v in labels.items())):
                    return n
            if time.time() > deadline:
                seen = sorted({(n.labels.get("alertname"), n.labels.get("node", ""), n.status)
                               for n in self.since(start)})
                raise AssertionError(
                    f"no {status} {alertname} {labels} within {timeout:.0f} s; received: {seen}")
            time.sleep(2)


def serve(address: str, port: int, log: Path) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            now = time.time()
            with log.open("a") as f:
                for alert in body.get("alerts") or []:
                    f.write(json.dumps({"at": now, "status": alert.get("status", ""),
                                        "labels": alert.get("labels") or {},
                                        "annotations": alert.get("annotations") or {}}) + "\n")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    (log.parent / (log.name + ".ready")).write_text("")
    # It ends with the test session that started it: a sink left by a session that was
    # killed would hold the port, and the next session's could not start.
    parent = os.getppid()

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
