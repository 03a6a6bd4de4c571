"""`aicluster check` on the deployed lab in miniature (every component together on two
nodes): the standard tier passes every applicable check and exits 0; breakages made
by hand (node2's fabric MTU at 1500, a Ceph OSD stopped, node2's node exporter stopped
(seen by node1's Prometheus), node1's NVMe cache filled, a hung probe, slurmd stopped)
each fail it naming the node and the check, and a
re-deploy and re-run bring it back to 0; `--drain` drains only the failed node and
resumes only its own drain; playbooks/check.yml reports the same results.

What runs for real here: ping with don't-fragment, iperf3 on the fabric bridge, fio on
the loop-device cache, Slurm jobs, Ray tasks, Ceph and ganesha NFS, Prometheus and
Alertmanager (Debian's). STAND-INs (named
in the output): the k3s, Ollama and MinIO binaries (tests/e2e/standins), the Slurm
GPU (a device node). No GPU or HCA: those checks are SKIP with the reason, and their
parsers are tested on captured outputs (tests/unit/test_check_*.py)."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

from aicluster.checks import report
from tests.e2e.checks import assert_ceph_healthy
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, run

FABRIC_MTU = "ip -o link show dev {nic} | sed -n 's/.* mtu \\([0-9]*\\) .*/\\1/p'"


@pytest.fixture
def lab(lab):
    """The lab in miniature (tests/e2e/conftest.py), deployed."""
    return lab.deployed()


def check(*options: str, expect: int | None = None, timeout: int = 600) -> tuple[int, dict, str]:
    """``aicluster check inventories/testbed.py OPTIONS --json FILE``: its exit status,
    the JSON document (validated against the schema) and the table it printed."""
    out = f"/tmp/aicluster-e2e-check-{time.monotonic_ns()}.json"
    start = time.monotonic()
    proc = run([BIN / "aicluster", "check", TESTBED_INVENTORY, *options, "--json", out],
               check=False, timeout=timeout)
    print(f"aicluster check {' '.join(options)}: exit {proc.returncode} in "
          f"{time.monotonic() - start:.1f} s")
    with open(out) as f:
        document = json.load(f)
    jsonschema.validate(document, json.loads(report.SCHEMA.read_text()))
    if expect is not None:
        assert proc.returncode == expect, "\n".join(
            line for line in proc.stdout.splitlines() if not line.startswith("PASS"))
    return proc.returncode, document, proc.stdout


def failed(document: dict) -> set[tuple[str, str]]:
    """(check, node or pair) of every result that failed or timed out."""
    return {(r["check"], r["node"] or "<->".join(r["pair"])) for r in document["results"]
            if r["status"] in ("FAIL", "TIMEOUT")}


def statuses(document: dict) -> dict[tuple[str, str], str]:
    return {(r["check"], r["node"] or "<->".join(r["pair"])): r["status"]
            for r in document["results"]}


def test_the_standard_tier_passes_on_the_deployed_lab(lab):
    # Ceph settled after the deploy (placement groups peered): until then
    # storage.ceph_health rightly fails, I/O to the unpeered groups blocking.
    assert_ceph_healthy(lab.testbed)
    lab.ssh("node2", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q libnfs-utils")
    print("test tool: libnfs-utils on node2 (NFS from user space: its kernel has no NFS "
          "client), for storage.nfs_shared")
    code, document, table = check(expect=0)
    assert "STATUS" in table.splitlines()[0]
    seen = {r["check"] for r in document["results"] if r["status"] in ("PASS", "WARN")}
    # Every layer the testbed can run proved something real.
    for name in ("nodes.ssh", "nodes.time", "nodes.deployed", "network.path_mtu",
                 "network.iperf3", "storage.nvme_mount", "storage.nvme_fio",
                 "storage.ceph_health", "stacks.slurm_nodes", "stacks.slurm_job",
                 "stacks.ray_nodes", "stacks.ray_task", "monitoring.targets",
                 "monitoring.rules", "monitoring.alertmanager", "monitoring.alerts"):
        assert name in seen, (name, sorted(seen))
    # node1's Prometheus scrapes every target the inventory derives, for each node.
    assert statuses(document)[("monitoring.targets", "node1")] == "PASS"
    assert statuses(document)[("monitoring.targets", "node2")] == "PASS"
    for r in document["results"]:
        if r["check"] == "monitoring.alerts":
            print(f"{r['status']} monitoring.alerts: {r['message']}")
    skipped = [r for r in document["results"] if r["status"] == "SKIP"]
    assert all(r["message"] for r in skipped), skipped
    for r in skipped:
        print(f"SKIP {r['check']} @ {r['node'] or r['pair']}: {r['message']}")


def test_breakages_fail_naming_node_and_check_and_a_redeploy_mends_them(lab):
    nic = lab.nodes[1]["fabric_nic"]
    osd = lab.ssh("node2", "ls /var/lib/ceph/osd").split()[0].removeprefix("ceph-")
    # node2's fabric MTU down to 1500; node2's OSD and node exporter stopped; node1's
    # cache 96 % full; chronyc on node1 hangs (a probe that never ends).
    lab.ssh("node2", f"ip link set dev {nic} mtu 1500")
    lab.ssh("node2", f"systemctl stop ceph-osd@{osd}")
    lab.ssh("node2", "systemctl stop prometheus-node-exporter")
    lab.ssh("node1", "set -e; cd /mnt/nvme-cache; avail=$(df -B1 --output=avail . | tail -1);"
                     " size=$(df -B1 --output=size . | tail -1);"
                     " fallocate -l $((avail - size * 3 / 100)) aicluster-e2e-fill")
    lab.ssh("node1", "printf '#!/bin/sh\\nsleep 3600\\n' > /usr/local/bin/chronyc && "
                     "chmod 755 /usr/local/bin/chronyc")
    try:
        # A stopped OSD tells the monitor it goes down; wait until the map says so.
        _wait(lambda: _osds_up(lab) < 2)
        start = time.monotonic()
        code, document, table = check(expect=1)
        took = time.monotonic() - start
        broken = failed(document)
        assert ("network.path_mtu", "node1<->node2") in broken or \
            ("network.path_mtu", "node2<->node1") in broken, broken
        assert ("network.nic", "node2") in broken, broken
        assert ("storage.ceph_health", "node1") in broken, broken
        assert ("storage.nvme_usage", "node1") in broken, broken
        # node1's Prometheus saw both from its own scrapes: node2's exporter refusing,
        # its full-MTU ping on the fabric failing.
        assert ("monitoring.targets", "node2") in broken, broken
        watched = next(r for r in document["results"]
                       if (r["check"], r["node"]) == ("monitoring.targets", "node2"))
        assert "the node exporter (" in watched["message"], watched["message"]
        assert "do-not-fragment ping of" in watched["message"], watched["message"]
        assert statuses(document)[("monitoring.targets", "node1")] == "PASS"
        hung = statuses(document)[("nodes.time", "node1")]
        assert hung == "TIMEOUT", hung
        # The hung probe ended at its limit; the others went on (node2's time passed).
        assert statuses(document)[("nodes.time", "node2")] == "PASS"
        assert took < 300, took
        for line in ("node2", "network.path_mtu", "storage.ceph_health", "storage.nvme_usage"):
            assert line in table
    finally:
        lab.ssh("node1", "rm -f /usr/local/bin/chronyc /mnt/nvme-cache/aicluster-e2e-fill")
    # The deploy puts the MTU, the OSD and the exporter back (the fill is data: removed
    # by hand above).
    lab.read_deploy().succeeded()
    assert lab.ssh("node2", FABRIC_MTU.format(nic=nic)).strip() == "9000"
    assert_ceph_healthy(lab.testbed)  # the OSD back up, its placement groups clean
    check(expect=0)


def _osds_up(lab) -> int:
    status = json.loads(lab.ssh("node1", "ceph --connect-timeout 30 status -f json"))
    return status["osdmap"].get("num_up_osds", 0)



def test_drain_takes_out_the_failed_node_only_and_resumes_only_its_own_drain(lab):
    # node1 drained by hand for another reason: never touched.
    lab.ssh("node1", "scontrol update NodeName=node1 State=DRAIN Reason='hand: DIMM swap'")
    try:
        lab.ssh("node2", "systemctl stop slurmd")
        try:
            code, document, _ = check("--quick", "--drain", expect=1)
            assert ("stacks.slurmd", "node2") in failed(document)
            reasons = _reasons(lab)
            assert reasons["node2"].startswith("aicluster: ") and \
                "stacks.slurmd" in reasons["node2"], reasons
            assert reasons["node1"] == "hand: DIMM swap", reasons
        finally:
            # The deploy starts slurmd again (its service is wanted running).
            lab.read_deploy().succeeded()
            assert lab.ssh("node2", "systemctl is-active slurmd").strip() == "active"
        # slurmd answers slurmctld again (not "idle*"): the quick tier passes, node2
        # still drained (a WARN).
        _wait(lambda: check("--quick")[0] == 0)
        check("--quick", "--drain", expect=0)
        reasons = _reasons(lab)
        assert "node2" not in reasons, reasons  # resumed: it was ours
        assert reasons["node1"] == "hand: DIMM swap", reasons  # not ours: left drained
    finally:
        lab.ssh("node1", "scontrol update NodeName=node1 State=RESUME", check=False)
        lab.ssh("node2", "scontrol update NodeName=node2 State=RESUME", check=False)
    assert _reasons(lab) == {}


def _reasons(lab) -> dict[str, str]:
    """Drained nodes -> their reason."""
    out = {}
    for line in lab.ssh("node1", "sinfo -N -h -o '%N|%T|%E'").splitlines():
        node, state, reason = line.split("|", 2)
        if "drain" in state:
            out[node] = reason
    return out


def _wait(done, tries: int = 20) -> None:
    for _ in range(tries):
        if done():
            return
        time.sleep(3)
    raise AssertionError("timed out")


def test_the_ansible_playbook_reports_the_same_results(lab, tmp_path):
    import xml.etree.ElementTree as ET

    _, document, _ = check("--quick")
    junit = tmp_path / "check.xml"
    proc = run([BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, "playbooks/check.yml",
                "-e", "aicluster_check_tier=quick",
                "-e", json.dumps({"aicluster_check_args": ["--junit", str(junit)]})],
               check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "nodes.time" in proc.stdout  # the table, shown
    cases = {}
    for case in ET.parse(junit).getroot():
        kind = next((c.tag for c in case), "passed")
        cases[case.get("name")] = kind
    kinds = {"FAIL": "failure", "TIMEOUT": "failure", "ERROR": "error", "SKIP": "skipped",
             "WARN": "system-out", "PASS": "passed"}
    mine = {}
    for r in document["results"]:
        where = r["node"] or "<->".join(r["pair"])
        subject = r["details"].get("subject")
        name = f"{r['check']} @ {where}" + (f" ({subject})" if subject else "")
        mine[name] = kinds[r["status"]]
    # The alerts firing are the one result that may change between the two runs (an
    # alert whose `for` runs out between them): the same cases, that one's kind aside.
    alerts = {n for n in mine if n.startswith("monitoring.alerts @ ")}
    assert alerts and alerts == {n for n in cases if n.startswith("monitoring.alerts @ ")}
    assert {n: k for n, k in cases.items() if n not in alerts} == \
        {n: k for n, k in mine.items() if n not in alerts}
