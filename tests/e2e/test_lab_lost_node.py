"""A dry run that changes nothing on the deploying machine, and a node lost mid-run
(docs/rerunning.md).

``pyinfra inventories/testbed.py deploy.py --dry`` with a secret the inventory names as
a file that does not exist yet: the run plans, names the secret it would generate, and
leaves the secret, artifact-cache and fact-reads directories exactly as they were.

A node lost mid-run (docs/rerunning.md, "A node lost mid-run"): its link is cut on
the host while a pyinfra deploy with work on both nodes runs. The run lets it go after
its first connection failure (one bounded check), names it in one line, finishes the
other node and exits non-zero; once the link is back, a re-run converges and the next
one changes nothing.

The cut is the testbed's: the node's management veth on the host set down
(``ip link set vb-node2 down``), which stops every packet to and from it at once, as a
pulled cable would (TESTBED.md). On the lab in miniature (every component together,
shared with the other ``test_lab*.py`` modules), left converged, link up, with the
overrides it had, whatever happens.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import threading
import time

import pytest

from aicluster.accel.memo import READS_DIR
from aicluster.artifacts import default_cache_dir
from aicluster.testbed.state import host_veth_names, state_dir
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, env

#: A change that gives both nodes work (their network sysctl drop-in is rewritten).
CHANGE = {"base_sysctl": {"net.core.somaxconn": 8192}}
SYSCTL_FILE = "/etc/sysctl.d/90-aicluster-network.conf"


def _link(name: str, up: bool) -> None:
    subprocess.run(["ip", "link", "set", name, "up" if up else "down"], check=True)


@pytest.fixture
def lab(lab):
    """The lab in miniature (tests/e2e/conftest.py), deployed."""
    return lab.deployed()


def _snapshot(*dirs) -> dict[str, str]:
    """Every path under *dirs*: its mode, modification time and content's hash."""
    out = {}
    for top in dirs:
        top = top.expanduser()
        for path in sorted([top, *top.rglob("*")]) if top.exists() else []:
            info = path.lstat()
            digest = "dir"
            if path.is_file():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[str(path)] = f"{oct(info.st_mode)} {info.st_mtime_ns} {digest}"
    return out


def test_dry_changes_nothing_on_the_deploying_machine(lab, tmp_path):
    key = tmp_path / "secrets" / "munge.key"  # not there yet, as on a fresh checkout
    dirs = (tmp_path, state_dir() / "secrets", default_cache_dir(), READS_DIR)
    # The testbed inventory's own secrets (overrides replace the whole mapping), but
    # munge's key named where there is none yet.
    theirs = {name: {"file": str(state_dir() / "secrets" / file)} for name, file in (
        ("ceph", "ceph.secret"), ("k3s_token", "k3s-token"),
        ("minio_root_password", "minio.secret"))}
    with lab.overridden(secrets={**theirs, "munge_key": {"file": str(key)}}):
        machine = _snapshot(*dirs)
        dry = lab.read_deploy("--dry")
        assert _snapshot(*dirs) == machine
    out = dry.output
    assert dry.rc == 0
    assert (f"aicluster: --dry: would generate the secret munge_key at {key} (1024 random "
            "bytes, mode 0600)") in out
    assert out.count("would generate the secret munge_key") == 1
    assert "Beginning operation run" not in out


def _deploy_cutting(veth: str) -> tuple[int, list[tuple[float, str]], float | None]:
    """A deploy during which *veth* is set down as soon as operations start running:
    (exit status, its output lines with the seconds since start, when it was cut)."""
    proc = subprocess.Popen(
        [str(BIN / "pyinfra"), "-y", str(TESTBED_INVENTORY), "deploy.py"],
        cwd=TESTBED_INVENTORY.parents[1], env=env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    guard = threading.Timer(1500, proc.kill)  # a hung run fails the test, not the suite
    guard.start()
    start, lines, cut = time.monotonic(), [], None
    try:
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
            print(line, end="", flush=True)
            if cut is None and "Beginning operation run" in line:
                _link(veth, up=False)
                cut = time.monotonic() - start
                print(f"--- test: {veth} set down at {cut:.1f} s", flush=True)
        code = proc.wait()
    finally:
        guard.cancel()
    return code, lines, cut


def test_a_node_lost_mid_run_is_let_go_then_rejoins(lab):
    node1, node2 = (n["name"] for n in lab.nodes)
    veth = host_veth_names(node2)[0]
    overrides = state_dir() / "overrides.json"
    before = overrides.read_text() if overrides.exists() else None
    old = json.loads(before) if before else {}
    converged = False
    try:
        overrides.write_text(json.dumps({**old, **CHANGE}))
        code, lines, cut = _deploy_cutting(veth)
        texts = [text for _, text in lines]
        # The times, printed (tests assert no timings): when node1 printed its last
        # operation's result, when node2 was let go, when the run ended.
        node1_last = max((t for t, text in lines if f"[{node1}]" in text), default=-1.0)
        lost_at = next((t for t, text in lines if " LOST: " in text), -1.0)
        print(f"--- test: cut at {cut or -1:.1f} s, {node2} let go at {lost_at:.1f} s, "
              f"{node1}'s last line at {node1_last:.1f} s, run ended at {lines[-1][0]:.1f} s")
        assert cut is not None, "the deploy never started running operations"
        assert code != 0, "a run that lost a node exited 0"
        lost = [t for t in texts if " LOST: " in t]
        assert len(lost) == 1 and f"{node2} LOST: " in lost[0], lost
        assert "out of this run" in lost[0]
        # The lost node's errors: those of the operation that found it lost (one line
        # per fact it read), not one or more per remaining operation (52 before).
        node2_errors = [t for t in texts if f"[{node2}]" in t and any(
            word in t for word in ("Error", "error", "could not", "No route", "timed out"))]
        print(f"--- test: {len(node2_errors)} error line(s) for {node2}:", *node2_errors,
              sep="\n")
        skipped = int(re.search(r"its (\d+) remaining operation", lost[0]).group(1))
        assert skipped >= 10, lost[0]  # the run had many more operations for node2
        assert len(node2_errors) <= 10, node2_errors
        assert not [t for t in texts if f"[{node1}]" in t and "Error" in t]
        # node1 finished its work: its change is there.
        assert "net.core.somaxconn = 8192" in lab.ssh(node1, f"cat {SYSCTL_FILE}")

        _link(veth, up=True)
        lab.read_deploy().succeeded()
        assert "net.core.somaxconn = 8192" in lab.ssh(node2, f"cat {SYSCTL_FILE}")
        third = lab.read_deploy().succeeded()
        assert third.results["changed"] == 0, third.results
    finally:
        _link(veth, up=True)
        if before is None:
            overrides.unlink(missing_ok=True)
        else:
            overrides.write_text(before)
        # Back to the testbed's own settings, converged, for whatever runs next.
        final = lab.read_deploy()
        converged = final.rc == 0 and final.results.get("errors") == 0
    assert converged, "the testbed did not converge back after the test"
