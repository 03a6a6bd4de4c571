"""End-to-end tests on the local testbed (systemd-nspawn nodes on this machine).

Each engine gets its own fresh two-node testbed (module-scoped fixture), which is
torn down afterwards whatever happened. Needs root; marked ``e2e`` so a developer can
run the rest alone with ``-m 'not e2e'``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TESTBED_INVENTORY = ROOT / "inventories" / "testbed.py"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PATH"] = f"{BIN}:{out.get('PATH', '')}"
    out["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    out.pop("PYTHONPATH", None)
    return out


def run(
    args: list, timeout: int = 1200, check: bool = True, cwd: Path = ROOT,
    environ: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run a command (from the repository root, with :func:`env` unless ``environ`` is
    given), echoing its output into the test log."""
    print("$", " ".join(map(str, args)), flush=True)
    proc = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=environ if environ is not None else env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    print(proc.stdout[-20000:])
    print(proc.stderr[-20000:], file=sys.stderr)
    if check:
        assert proc.returncode == 0, f"{args[0]} exited {proc.returncode}"
    return proc


@dataclass
class Testbed:
    state: dict

    @property
    def nodes(self) -> list[dict]:
        return self.state["nodes"]

    def ssh(self, node: str, command: str, check: bool = True) -> str:
        proc = run([BIN / "aicluster", "testbed", "ssh", node, command], timeout=120, check=False)
        if check:
            assert proc.returncode == 0, f"{node}: {command!r} exited {proc.returncode}"
        return proc.stdout


@contextlib.contextmanager
def fresh_testbed(disks: tuple[tuple[str, str, str], ...] = ()) -> Iterator[
        tuple[Testbed, dict[tuple[str, str], dict]]]:
    """A fresh two-node testbed (one left over is taken down first), with a STAND-IN
    loop disk for each ``(node, name, size)`` in *disks*; taken down when the block
    ends, whatever happened. Yields the testbed and ``{(node, name): disk}`` (what
    ``testbed disk add`` made: its loop device and stable name)."""
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests need root (the testbed runs systemd-nspawn)")
    from aicluster import testbed as tb
    from aicluster.testbed.core import disk_add

    if tb.state.load_state():
        tb.down()
    try:
        state = tb.up(nodes=2)
        made = {(node, name): disk_add(node, name, size) for node, name, size in disks}
        if made:
            print("STAND-IN drives: sparse loop devices, " + ", ".join(
                f"/dev/disk/by-id/aicluster-testbed-{node}-{name} ({size})"
                for node, name, size in disks))
        yield Testbed(tb.state.load_state() or state), made
    finally:
        tb.down()


@pytest.fixture(scope="module")
def testbed():
    """A fresh two-node testbed for one test module (one engine)."""
    with fresh_testbed() as (bed, _):
        yield bed


def pyinfra_results(output: str) -> dict[str, int]:
    """The "Grand total" row of pyinfra's results table: operations that changed
    something ("Success"), failed ("Error") and found nothing to do ("No Change")."""
    for line in output.splitlines():
        if line.strip().startswith("Grand total"):
            cells = line.split()[2:]
            values = [0 if c == "-" else int(c) for c in cells]
            return dict(zip(("host_ops", "changed", "errors", "no_change"), values, strict=True))
    raise AssertionError("pyinfra printed no results table")


def ansible_changed(output: str) -> dict[str, int]:
    """changed=N per host from ansible-playbook's recap."""
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", output, re.M)
    }
