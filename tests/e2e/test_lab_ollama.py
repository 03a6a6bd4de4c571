"""Ollama end to end (pyinfra) on the lab in miniature, with STAND-IN release files.

STAND-IN: Ollama's release cannot be downloaded here, so tests/e2e/standins/ollama.py
builds "stand-in ollama (not Ollama)" tarballs (a small Python HTTP server answering the
API the deploy and these checks use, in Ollama's layout) for two versions, and the
deploy takes them through the same pinned, verified artifact path as the real release
(the lab is built with them: tests/e2e/conftest.py). nginx, the gateway, is Debian's
real package (through the testbed's package proxy). With $AICLUSTER_E2E_ARTIFACTS_DIR
(a real artifact directory) the same tests run against the real release; the checks
that need the stand-in's answers are then skipped.

Both nodes run Ollama on <address>:11434, node1 also the gateway on 10.213.0.11:11435
(inventories/testbed.py). Every component is deployed together, each deploy the whole
stack (deploy.py), on the lab in miniature shared with the other ``test_lab*.py``
modules (tests/e2e/test_lab.py makes its first deploy). The lab is left converged: on
the newer Ollama version, with the offline models archive's overrides kept (the next
whole-stack re-run changes nothing; either is set back and re-deployed if its test
fails), ollama started again on node2 whatever happens.

On the lab in miniature:

- ollama is active and enabled on both nodes, nginx on node1; the drop-in holds the
  listen address and the models directory; Ollama and the gateway listen only on the
  node's cluster address; the inventory's model was pulled once on each node;
- 20 requests through the gateway are answered by both nodes (the X-Ollama-Upstream
  header nginx adds, and the stand-in's own hostname in the answer);
- a generation streams through the gateway: its first line arrives before the stand-in
  wrote its last;
- passive health check: with ollama stopped on node2, every request through the
  gateway (GET and POST) is answered by node1;
- a whole-stack re-run changes and restarts nothing;
- a version bump unpacks the new release, switches the link, restarts Ollama (a new
  MainPID) and removes the old release; nginx is not restarted; the next whole-stack
  re-run changes nothing;
- offline models (stand-in): a pinned models archive gives both nodes a new model
  without any pull; the next whole-stack re-run changes nothing.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from pathlib import Path

import pytest

from aicluster.components.ollama.derive import models_location
from aicluster.inventory import load_cluster
from tests.e2e.conftest import TESTBED_INVENTORY, Deploy, Lab
from tests.e2e.standins import ollama as standin

PORT, GATEWAY_PORT = 11434, 11435
FIRST, SECOND = standin.versions()
#: Where the stand-in records each pull, in OLLAMA_MODELS.
PULL_LOG = ".stand-in-pulls"
#: The overrides the offline models archive sets (standin.models_archive).
ARCHIVE_KEYS = ("ollama_models", "ollama_models_archive", "ollama_models_archive_sha256")
STANDIN_ONLY = pytest.mark.skipif(not standin.is_standin(),
                                  reason="needs the stand-in's answers (real release in use)")


class Bed:
    """What these checks read of the lab (tests/e2e/conftest.py's :class:`Lab`)."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.address = {n["name"]: n["address"] for n in lab.nodes}
        self.names = sorted(self.address)
        self.gateway = (self.address["node1"], GATEWAY_PORT)
        # OLLAMA_MODELS as the deploy derives it: on the lab, the NVMe cache's directory.
        cluster = load_cluster(TESTBED_INVENTORY)
        self.models = {name: models_location(cluster, name, cluster.hosts[name].data)[0]
                       for name in self.names}

    @property
    def artifacts(self) -> Path:
        """The lab's artifact directory (where its stand-in releases are)."""
        return Path(self.lab.overrides["artifacts_dir"])

    def deploy(self) -> dict:
        """A whole-stack deploy (deploy.py) that must succeed: its results."""
        return self.lab.read_deploy().succeeded().results

    def node(self, name: str) -> dict[str, str]:
        """What the checks read on a node, in one SSH round trip."""
        models = self.models[name]
        out = self.lab.ssh(name, (
            "for u in ollama nginx; do "
            "echo \"$u.active=$(systemctl is-active $u)\"; "
            "echo \"$u.enabled=$(systemctl is-enabled $u 2>/dev/null)\"; "
            "echo \"$u.pid=$(systemctl show -p MainPID --value $u)\"; "
            "echo \"$u.since=$(systemctl show -p ActiveEnterTimestampMonotonic --value $u)\"; "
            "done; "
            "echo \"link=$(readlink /usr/local/bin/ollama)\"; "
            "echo \"version=$(/usr/local/bin/ollama --version 2>&1)\"; "
            "echo \"releases=$(ls /opt/ollama | tr '\\n' ' ')\"; "
            "echo \"groups=$(id -nG ollama)\"; "
            f"echo \"pulls=$(cat {models}/{PULL_LOG} 2>/dev/null | wc -l)\"; "
            f"echo \"manifests=$(cd {models}/manifests 2>/dev/null && "
            "find . -type f | sort | tr '\\n' ' ')\"; "
            f"echo \"owner=$(stat -c %U {models}/manifests 2>/dev/null)\"; "
            f"echo \"list=$(OLLAMA_HOST={self.address[name]}:{PORT} /usr/local/bin/ollama "
            "list 2>/dev/null | tail -n +2 | awk '{print $1}' | tr '\\n' ' ')\"; "
            f"echo \"archive_left=$(ls -a {models} | grep -c aicluster-models)\""
        ))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _request(address: tuple[str, int], method: str, path: str, body: dict | None = None,
             timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _last_upstream(headers: dict[str, str]) -> str:
    """The node nginx finally sent a request to ($upstream_addr lists every one tried)."""
    return headers["x-ollama-upstream"].split(",")[-1].strip()


@pytest.fixture
def bed(lab: Lab) -> Bed:
    """The lab in miniature (tests/e2e/conftest.py), deployed, with its release files
    said (the stand-ins the lab was built with, or the real ones)."""
    print(standin.banner())
    return Bed(lab.deployed())


def test_deploy_runs_ollama_on_both_nodes_and_the_gateway_on_node1(bed):
    # The lab's first (whole-stack) deploy, which lab.deployed() found succeeded.
    first = Deploy.read(bed.lab.first).succeeded().results
    assert first["changed"] > 0, first
    for name in bed.names:
        s = bed.node(name)
        assert (s["ollama.active"], s["ollama.enabled"]) == ("active", "enabled"), s
        assert s["link"] == f"/opt/ollama/{FIRST}/bin/ollama", s
        assert re.match(rf"ollama version is {re.escape(FIRST)}\b", s["version"]), s
        assert s["releases"].split() == [FIRST], s
        assert {"ollama", "render", "video"} <= set(s["groups"].split()), s
        unit = bed.lab.ssh(name, "systemctl cat ollama")
        assert "/etc/systemd/system/ollama.service.d/aicluster.conf" in unit
        assert f'Environment="OLLAMA_HOST={bed.address[name]}:{PORT}"' in unit
        assert f'Environment="OLLAMA_MODELS={bed.models[name]}"' in unit
        if standin.is_standin():
            # The inventory's model, pulled once (the stand-in records each pull).
            assert s["manifests"].split() == ["./registry.ollama.ai/library/tiny/1b"], s
            assert s["owner"] == "ollama", s
            assert s["pulls"] == "1", s
            assert s["list"].split() == standin.MODELS, s
        if name == "node1":
            assert (s["nginx.active"], s["nginx.enabled"]) == ("active", "enabled"), s
        else:
            assert s["nginx.active"] != "active", s
    print("ollama active and enabled on", ", ".join(bed.names), "; nginx on node1")


def test_ollama_and_the_gateway_listen_only_on_cluster_addresses(bed):
    for name in bed.names:
        listening = bed.lab.ssh(name, "ss -ltnpH")
        sockets = [(line.split()[3], line) for line in listening.splitlines() if line.strip()]
        ours = {}
        for local, line in sockets:
            port = int(local.rsplit(":", 1)[1])
            if port in (PORT, GATEWAY_PORT):
                ours.setdefault(port, []).append(local)
                assert local.rsplit(":", 1)[0] == bed.address[name], line
        assert ours.get(PORT) == [f"{bed.address[name]}:{PORT}"], listening
        if name == "node1":
            assert ours.get(GATEWAY_PORT) == [f"{bed.address[name]}:{GATEWAY_PORT}"], listening
        else:
            assert GATEWAY_PORT not in ours, listening
        # nginx listens nowhere else: the distribution's default site (port 80 on every
        # address) was removed.
        others = [line for _, line in sockets if '"nginx"' in line
                  and int(line.split()[3].rsplit(":", 1)[1]) != GATEWAY_PORT]
        assert not others, listening
        print(f"{name}: ollama on {ours[PORT][0]}"
              + (f", gateway on {ours[GATEWAY_PORT][0]}, nginx nowhere else"
                 if GATEWAY_PORT in ours else ""))


def test_the_gateway_spreads_requests_over_both_nodes(bed):
    upstream = {f"{a}:{PORT}": n for n, a in bed.address.items()}
    seen: dict[str, int] = {}
    for _ in range(20):
        status, headers, body = _request(bed.gateway, "GET", "/api/tags")
        assert status == 200, body
        node = upstream[_last_upstream(headers)]
        seen[node] = seen.get(node, 0) + 1
        if standin.is_standin():
            answer = json.loads(body)
            # The stand-in names the host that answered: the one nginx says it chose.
            assert answer["served_by"] == node, (answer, headers)
            assert [m["name"] for m in answer["models"]] == standin.MODELS, answer
    print("20 requests through the gateway, answered by:", seen)
    assert set(seen) == set(bed.names), seen


@STANDIN_ONLY
def test_a_generation_streams_through_the_gateway_unbuffered(bed):
    conn = http.client.HTTPConnection(*bed.gateway, timeout=30)
    conn.request("POST", "/api/generate", body=json.dumps(
        {"model": standin.MODELS[0], "prompt": "who serves this?", "options":
         {"num_predict": 5}}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    lines, first_arrived = [], None
    for raw in resp:
        if raw.strip():
            lines.append(json.loads(raw))
            first_arrived = first_arrived or time.time()
    conn.close()
    assert lines[-1]["done"] is True and len(lines) == 6, lines
    # The testbed's nodes share this machine's clock: the first line reached the client
    # before the stand-in wrote its last (it sleeps between lines), so nothing buffered it.
    assert first_arrived < lines[-1]["written_at"], (first_arrived, lines[-1])
    print(f"first line through the gateway {lines[-1]['written_at'] - first_arrived:.2f} s "
          f"before the stand-in on {lines[0]['served_by']} wrote its last")
    status, _, body = _request(bed.gateway, "POST", "/api/generate",
                               {"model": "absent:1b", "prompt": "x"})
    assert status == 404 and b"not found" in body, (status, body)


def test_with_node2_stopped_the_gateway_answers_from_node1(bed):
    node1 = f"{bed.address['node1']}:{PORT}"
    bed.lab.ssh("node2", "systemctl stop ollama")
    try:
        tried = []
        for i in range(10):
            if i % 2 or not standin.is_standin():
                status, headers, body = _request(bed.gateway, "GET", "/api/tags")
            else:
                status, headers, body = _request(bed.gateway, "POST", "/api/generate", {
                    "model": standin.MODELS[0], "prompt": "x", "stream": False,
                    "options": {"num_predict": 1}})
            assert status == 200, (status, headers, body)
            assert _last_upstream(headers) == node1, headers
            tried.append(headers["x-ollama-upstream"])
        print("with ollama stopped on node2, nginx tried:", tried)
        # nginx did try node2 (and moved the request on), until it left it out.
        assert any(f"{bed.address['node2']}:{PORT}" in t for t in tried), tried
    finally:
        # Started again whatever happened (the lab is shared); that it answers again is
        # checked below, so a failure above stays the one reported.
        bed.lab.ssh("node2", "systemctl start ollama", check=False)
    status = 0
    for _ in range(30):
        try:
            status = _request((bed.address["node2"], PORT), "GET", "/api/version", timeout=2)[0]
        except OSError:
            status = 0
        if status == 200:
            break
        time.sleep(1)
    assert status == 200, "ollama on node2 did not answer again after its start"


def test_a_whole_stack_rerun_changes_and_restarts_nothing(bed):
    before = {n: bed.node(n) for n in bed.names}
    second = bed.deploy()
    assert second["changed"] == 0, second
    for name in bed.names:
        after = bed.node(name)
        for key in ("ollama.pid", "ollama.since", "nginx.pid", "pulls"):
            assert after[key] == before[name][key], (name, key, before[name], after)
    print("whole-stack re-run: no change; no service restarted; no model pulled again")


@pytest.mark.skipif(SECOND is None, reason="needs two pinned Ollama releases (the "
                                         "STAND-IN builds them; the defaults pin one)")
def test_a_version_bump_replaces_the_binary_and_restarts_ollama(bed):
    before = {n: bed.node(n) for n in bed.names}
    old = bed.lab.overrides.get("ollama_version")
    bed.lab.set_overrides(ollama_version=SECOND)
    kept = False
    try:
        bumped = bed.deploy()
        assert bumped["changed"] > 0, bumped
        for name in bed.names:
            s = bed.node(name)
            assert s["link"] == f"/opt/ollama/{SECOND}/bin/ollama", s
            assert re.match(rf"ollama version is {re.escape(SECOND)}\b", s["version"]), s
            assert s["releases"].split() == [SECOND], s  # the old release is gone
            assert s["ollama.active"] == "active", s
            assert s["ollama.pid"] != before[name]["ollama.pid"], (before[name], s)
            assert int(s["ollama.since"]) > int(before[name]["ollama.since"]), (
                before[name], s)
            assert s["nginx.pid"] == before[name]["nginx.pid"], (before[name], s)
            assert s["pulls"] == before[name]["pulls"], s  # the models stayed on disk
            status, _, body = _request((bed.address[name], PORT), "GET", "/api/version")
            assert status == 200 and json.loads(body)["version"] == SECOND, body
        print(f"version bump {FIRST} -> {SECOND}: link switched, ollama restarted on both "
              f"nodes (new MainPID), /opt/ollama/{FIRST} removed, nginx untouched")
        again = bed.deploy()
        assert again["changed"] == 0, again
        # The lab stays on the newer version (its override kept): converged, as the
        # re-run just showed.
        kept = True
    finally:
        if not kept:
            # The bump failed: the lab back on the version it was built with, re-deployed
            # (whatever it gives: the failure above is the one reported).
            bed.lab.set_overrides(ollama_version=old)
            bed.lab.deploy(check=False)


@STANDIN_ONLY
def test_offline_models_come_from_the_pinned_archive_without_a_pull(bed):
    models = [*standin.MODELS, "offline:1b"]
    old = {key: bed.lab.overrides.get(key) for key in ARCHIVE_KEYS}
    bed.lab.set_overrides(**standin.models_archive(bed.artifacts, models))
    kept = False
    try:
        before = {n: bed.node(n) for n in bed.names}
        result = bed.deploy()
        assert result["changed"] > 0, result
        for name in bed.names:
            s = bed.node(name)
            assert s["manifests"].split() == ["./registry.ollama.ai/library/offline/1b",
                                              "./registry.ollama.ai/library/tiny/1b"], s
            assert s["pulls"] == before[name]["pulls"], s  # nothing pulled
            assert s["archive_left"] == "0", s  # the copy was deleted after unpacking
            assert s["ollama.pid"] == before[name]["ollama.pid"], s  # no restart for a model
            assert sorted(s["list"].split()) == sorted(models), s
        status, _, body = _request(bed.gateway, "POST", "/api/generate", {
            "model": "offline:1b", "prompt": "x", "stream": False,
            "options": {"num_predict": 1}})
        assert status == 200, body
        print("offline models: offline:1b unpacked from the pinned archive on both nodes, "
              "no pull")
        again = bed.deploy()
        assert again["changed"] == 0, again
        # The archive's overrides stay in the lab's: converged with them, as the re-run
        # just showed (the archive stays in the lab's artifact directory).
        kept = True
    finally:
        if not kept:
            # The lab back on the models it was built with, re-deployed (whatever it
            # gives: the failure above is the one reported). Models on disk stay.
            bed.lab.set_overrides(**old)
            bed.lab.deploy(check=False)
