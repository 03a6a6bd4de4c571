"""End-to-end tests on the local testbed (systemd-nspawn nodes on this machine).

A module that needs a testbed of its own makes a fresh two-node one as a user does
(``cli_testbed_up``), left up for the next modules. The ``test_lab*.py`` modules share
one "lab in miniature" (the ``lab`` fixture: every component together on two nodes
with disks, deployed once with pyinfra), made at the first of them and taken down by
the next testbed or at the session's end; the ``test_ansible*.py`` modules share
another made the same way (``ansible_lab``), which they deploy with Ansible. Needs root; marked
``e2e`` so a developer can run the rest alone with ``-m 'not e2e'``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TESTBED_INVENTORY = ROOT / "inventories" / "testbed.py"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


#: Where every Ansible run of the session (molecule's included) records how long each
#: task took on each host (Ansible's own junit callback, one XML file per run); the
#: session's end prints the slowest (:func:`ansible_timings`).
ANSIBLE_TIMINGS = Path("/tmp/aicluster-e2e-ansible-timings")


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PATH"] = f"{BIN}:{out.get('PATH', '')}"
    out["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    out["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.builtin.junit"
    out["JUNIT_OUTPUT_DIR"] = str(ANSIBLE_TIMINGS)
    out["JUNIT_TASK_RELATIVE_PATH"] = str(ROOT)
    out["JUNIT_HIDE_TASK_ARGUMENTS"] = "true"
    out.pop("PYTHONPATH", None)
    return out


def ansible_timings(directory: Path = ANSIBLE_TIMINGS, top: int = 25) -> list[str]:
    """The tasks that took longest over the session's Ansible runs (summed over hosts
    and runs), as lines ``seconds  runs  file:line task``."""
    import xml.etree.ElementTree as ET

    total: dict[str, list[float]] = {}
    for path in sorted(directory.glob("*.xml")):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            name = re.sub(r"^\[[^]]*\] ", "", case.get("name", ""))
            key = f"{case.get('classname', '')} {name}"
            total.setdefault(key, []).append(float(case.get("time") or 0))
    ranked = sorted(total.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [f"{sum(times):8.1f} s {len(times):4d}x  {key}" for key, times in ranked]


#: Whether this session ran an end-to-end test (its timings are this session's).
_RAN_E2E = False


def pytest_terminal_summary(terminalreporter):
    lines = ansible_timings() if _RAN_E2E else []
    if lines:
        terminalreporter.section("slowest Ansible tasks (summed over hosts and runs)")
        for line in lines:
            terminalreporter.write_line(line)


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


def _clear_testbed() -> None:
    """Before a fresh testbed: root checked, and the one left over (the lab's
    included) taken down and forgotten."""
    global _LAB
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests need root (the testbed runs systemd-nspawn)")
    from aicluster import testbed as tb

    _LAB = None
    if tb.state.load_state():
        tb.down()


def testbed_up(disks: tuple[tuple[str, str, str], ...] = ()) -> tuple[
        Testbed, dict[tuple[str, str], dict]]:
    """A fresh two-node testbed (one left over, the lab's included, is taken down
    first), with a STAND-IN loop disk for each ``(node, name, size)`` in *disks*.
    Returns the testbed and ``{(node, name): disk}`` (what ``testbed disk add`` made:
    its loop device and stable name). The caller takes it down."""
    from aicluster import testbed as tb
    from aicluster.testbed.core import disk_add

    _clear_testbed()
    try:
        state = tb.up(nodes=2)
        made = {(node, name): disk_add(node, name, size) for node, name, size in disks}
    except BaseException:
        tb.down()
        raise
    if made:
        print("STAND-IN drives: sparse loop devices, " + ", ".join(
            f"/dev/disk/by-id/aicluster-testbed-{node}-{name} ({size})"
            for node, name, size in disks))
    return Testbed(tb.state.load_state() or state), made


def cli_testbed_up(*options: str) -> Testbed:
    """A fresh two-node testbed made as a user makes one, ``aicluster testbed up
    --nodes 2 OPTIONS...`` (one left over, the lab's included, is taken down first).
    Left up: the next testbed, tests/e2e/test_zz_teardown.py or the session's end takes
    it down."""
    global _KEPT
    from aicluster import testbed as tb

    _clear_testbed()
    _KEPT = True
    run([BIN / "aicluster", "testbed", "up", "--nodes", "2", *options], timeout=900)
    return Testbed(tb.state.load_state())


# --- The lab in miniature: one whole-stack testbed shared by the test_lab*.py modules ---

#: The Ray release before the one the inventories pin. The lab starts on it (its
#: overrides), so tests/e2e/test_lab_ray_upgrade.py's bump is the user's own: deploy,
#: bump the version, deploy again.
RAY_PREVIOUS = "2.59.0"

#: STAND-IN drives of the lab in miniature (sparse loop devices): an NVMe cache on each
#: node (node1's also holds the NFS export), a Ceph OSD disk and a MinIO drive on each.
LAB_DISKS = (
    ("node1", "cache", "2G"), ("node2", "cache", "2G"),
    ("node1", "ceph", "10G"), ("node2", "ceph", "10G"),
    ("node1", "minio", "1G"), ("node2", "minio", "1G"),
)


@dataclass
class Deploy:
    """One pyinfra deploy, read: its process, its ``output`` (stdout then stderr, where
    pyinfra writes its progress and results table) and ``results``, the table's "Grand
    total" (:func:`pyinfra_results`; empty when it printed none, as when every host was
    refused before any operation)."""

    proc: subprocess.CompletedProcess
    output: str
    results: dict[str, int]

    @classmethod
    def read(cls, proc: subprocess.CompletedProcess) -> Deploy:
        output = proc.stdout + proc.stderr
        return cls(proc, output, pyinfra_results(output) if "Grand total" in output else {})

    @property
    def rc(self) -> int:
        return self.proc.returncode

    def succeeded(self) -> Deploy:
        """Check it exited 0 with no error (the output's end in the message if not)."""
        assert self.rc == 0 and self.results.get("errors") == 0, (
            self.rc, self.results, self.output[-5000:])
        return self


@dataclass
class Lab:
    """Every component the testbed can run, together on two nodes with disks: the
    NVMe cache, NFS (ganesha), Ceph (CephFS mounted on both nodes), MinIO, Slurm, Ray,
    k3s and Ollama (k3s, Ollama and MinIO from STAND-IN release files, or the real ones
    from $AICLUSTER_E2E_ARTIFACTS_DIR), with base, network, infiniband and nvidia.

    One lab is made for the test session and shared by the ``test_lab*.py`` modules
    (they run one after another); a test that changes it leaves it converged. The
    first deploy is made once, by whichever test asks first. Ray starts on
    :data:`RAY_PREVIOUS` until tests/e2e/test_lab_ray_upgrade.py bumps it."""

    testbed: Testbed
    overrides: dict
    first: subprocess.CompletedProcess | None = None
    #: Which engine's modules share it: "pyinfra" (the ``lab`` fixture, the
    #: ``test_lab*.py`` modules) or "ansible" (``ansible_lab``, ``test_ansible*.py``).
    engine: str = "pyinfra"
    #: The roles a molecule scenario converged on it (the Ansible lab:
    #: tests/e2e/test_ansible_molecule.py).
    converged: set[str] = field(default_factory=set)

    @property
    def nodes(self) -> list[dict]:
        return self.testbed.nodes

    def ssh(self, node: str, command: str, check: bool = True) -> str:
        return self.testbed.ssh(node, command, check=check)

    @property
    def ray_version(self) -> str | None:
        """The Ray release the lab's overrides pin (None: the inventories' own)."""
        return self.overrides.get("ray_version")

    def set_overrides(self, **changes) -> None:
        """Lay *changes* over the lab's overrides (<state dir>/overrides.json, which
        the testbed inventory reads); a value of None removes the key."""
        from aicluster.testbed.state import state_dir

        for key, value in changes.items():
            if value is None:
                self.overrides.pop(key, None)
            else:
                self.overrides[key] = value
        (state_dir() / "overrides.json").write_text(json.dumps(self.overrides))

    @contextlib.contextmanager
    def overridden(self, **changes) -> Iterator[None]:
        """:meth:`set_overrides` for the block: each key changed is put back as it was
        when the block ends, whatever happened."""
        before = {key: self.overrides.get(key) for key in changes}
        self.set_overrides(**changes)
        try:
            yield
        finally:
            self.set_overrides(**before)

    def deploy(self, *extra: str, check: bool = True, timeout: int = 2400,
               environ: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``pyinfra -y inventories/testbed.py deploy.py`` (the whole stack)."""
        return run([BIN / "pyinfra", "-y", *extra, TESTBED_INVENTORY, "deploy.py"],
                   timeout=timeout, check=check, environ=environ)

    def read_deploy(self, *extra: str, environ: dict[str, str] | None = None) -> Deploy:
        """A whole-stack deploy (:meth:`deploy`, whatever it exits with), read."""
        return Deploy.read(self.deploy(*extra, check=False, environ=environ))

    def playbook(self, *extra: str, check: bool = True,
                 timeout: int = 2400) -> subprocess.CompletedProcess:
        """``ansible-playbook -i inventories/testbed.py playbooks/site.yml`` (the whole
        stack, with Ansible)."""
        return run([BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, *extra,
                    "playbooks/site.yml"], timeout=timeout, check=check)

    def deployed(self) -> Lab:
        """The lab after its first deploy (made now if no test made it), which must
        have succeeded: what a module that works on the deployed lab starts from."""
        first = self.first_deploy()
        assert first.returncode == 0, "the lab's first deploy failed (tests/e2e/test_lab.py)"
        return self

    def first_deploy(self) -> subprocess.CompletedProcess:
        """The lab's first deploy (made once; later calls return it)."""
        if self.first is None:
            self.first = self.deploy(check=False)
        return self.first


_LAB: Lab | None = None
_SINK = None


def alert_sink():
    """The webhook Alertmanager sends the pyinfra lab's alerts to (tests/e2e/alert_sink.py):
    started once, on the host's management address, for the whole session."""
    global _SINK
    from aicluster.testbed.state import HOST_ADDRESS
    from tests.e2e.alert_sink import AlertSink

    if _SINK is None:
        log = Path("/tmp/aicluster-e2e-alerts") / "alerts.jsonl"
        log.parent.mkdir(exist_ok=True)
        (log.parent / (log.name + ".ready")).unlink(missing_ok=True)
        _SINK = AlertSink(HOST_ADDRESS, log).start()
    return _SINK
#: Whether a testbed was left up for later modules (a lab, or :func:`cli_testbed_up`'s):
#: the session's end takes it down if nothing else did.
_KEPT = False


def _build_lab(tmp: Path, engine: str) -> Lab:
    global _KEPT
    from aicluster import testbed as tb
    from aicluster.testbed.state import state_dir
    from tests.e2e.standins import dcgm, k3s, minio, ollama

    bed, _made = testbed_up(LAB_DISKS)
    _KEPT = True
    try:
        overrides: dict = {}
        if engine == "pyinfra":
            overrides["ray_version"] = RAY_PREVIOUS
            print(f"lab: Ray {RAY_PREVIOUS} first, the release before the pinned one "
                  "(tests/e2e/test_lab_ray_upgrade.py bumps it)")
            overrides.update(alert_sink().overrides())
            print(f"lab: Alertmanager sends every alert to the test's webhook {alert_sink().url}")
        for standin in (k3s, ollama, minio):
            overrides.update(standin.build(tmp / "artifacts"))
            print(standin.banner())
        # The stand-in GPUs get dcgm-exporter's STAND-IN (its package from a repository
        # put on each node, serving captured DCGM metrics), so the GPU alerts can fire.
        dcgm.install_repo(bed, dcgm.build(tmp / "dcgm"))
        overrides["monitoring_dcgm_exporter"] = True
        print(dcgm.banner())
        (state_dir() / "overrides.json").write_text(json.dumps(overrides))
        for node in bed.nodes:
            bed.ssh(node["name"], "test -c /dev/fuse")
        print("testbed: each node has the host's /dev/fuse (ceph-fuse mounts CephFS)")
    except BaseException:
        tb.down()
        raise
    # Kept up: the next testbed_up(), or the session's end, takes it down.
    return Lab(bed, overrides, engine=engine)


def _shared_lab(tmp_path_factory, engine: str) -> Lab:
    global _LAB
    from aicluster import testbed as tb

    if _LAB is None or _LAB.engine != engine or not tb.state.load_state():
        _LAB = _build_lab(tmp_path_factory.mktemp(f"lab-{engine}"), engine)
    return _LAB


@pytest.fixture
def lab(tmp_path_factory) -> Lab:
    """The lab in miniature (:class:`Lab`), made on first use in the session and kept
    up for the next ``test_lab*.py`` module; deployed once (``lab.first_deploy()``)."""
    return _shared_lab(tmp_path_factory, "pyinfra")


@pytest.fixture
def ansible_lab(tmp_path_factory) -> Lab:
    """The Ansible lab: the same testbed, drives and STAND-IN release files as the lab
    in miniature (Ray on the pinned release), shared by the ``test_ansible*.py``
    modules, which deploy it with Ansible: tests/e2e/test_ansible_molecule.py converges
    it role by role (molecule), then tests/e2e/test_ansible_site.py runs
    playbooks/site.yml over it. Made on first use; the next other testbed, or the
    session's end, takes it down."""
    return _shared_lab(tmp_path_factory, "ansible")


@pytest.fixture(scope="session", autouse=True)
def _kept_testbed_down_at_the_end():
    import shutil

    global _RAN_E2E
    _RAN_E2E = True
    shutil.rmtree(ANSIBLE_TIMINGS, ignore_errors=True)
    yield
    if _SINK is not None:
        _SINK.stop()
    if _KEPT:
        from aicluster import testbed as tb

        if tb.state.load_state():
            tb.down()


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
