"""Bad inventories stop every entry point with status 2 and the problem named:
``aicluster validate``, the inventory run as an Ansible inventory script, and
``pyinfra INVENTORY deploy.py``, which must stop before it connects to any host.

They run the real commands (new Python processes; `aicluster validate` also in-process
through click), on a representative subset of the cases in test_inventory_errors.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aicluster.cli import main

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab.py"
BROKEN = REPO / "tests" / "fixtures" / "inventories" / "broken"
TIMEOUT = 60


def _run(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT
    )


def _validate(path: str | Path) -> subprocess.CompletedProcess[str]:
    return _run(sys.executable, "-m", "aicluster.cli", "validate", path)


def test_validate_lab_succeeds():
    result = _validate("inventories/lab.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "inventories/lab.py: 6 hosts, groups: ceph_clients, ceph_mds, ceph_mons, ceph_osds, "
        "gpu_nodes, ib_nodes,"
    )
    assert result.stdout.rstrip().endswith(": OK")
    assert "warning: slurm_controller has one host" in result.stderr


@pytest.mark.parametrize(
    "path, value, message",
    [
        pytest.param(
            "n2.ssh_hostname",
            "192.0.2.1",
            "host 'n2': ssh_hostname: address 192.0.2.1 is also used by host 'n1'",
            id="duplicate-management-address",
        ),
        pytest.param(
            "groups.slurm_worker",
            ["n1"],
            "host 'n1': groups: unknown group 'slurm_worker'",
            id="unknown-group",
        ),
        pytest.param(
            "all.secrets",
            {"munge_key": "abc"},
            "host 'n1': secrets: secret 'munge_key' is written inline",
            id="inline-secret",
        ),
        pytest.param(
            "n1.hardware.nvme",
            [{"device": "/dev/../etc/passwd"}],
            "host 'n1': hardware.nvme[0].device: '/dev/../etc/passwd' is not a block device",
            id="device-path",
        ),
        pytest.param(
            "n1.hardware.ib_ports",
            [{"device": "mlx5_0", "mtu": 4096}],
            "host 'n1': hardware.ib_ports[0].mtu: MTU 4096 is out of range for IPoIB datagram",
            id="ipoib-mtu",
        ),
        pytest.param(
            "all.base_chrony_server_host",
            "ntp1",
            "host 'n1': base_chrony_server_host: 'ntp1' is not a host of this inventory",
            id="chrony-server",
        ),
    ],
)
def test_validate_bad_input_exits_2(spec, path, value, message):
    """In-process through click (the same command `aicluster validate` runs)."""
    inventory = spec.set(path, value).write()
    result = CliRunner().invoke(main, ["validate", str(inventory)])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert f"{inventory}: invalid inventory (1 problem(s))" in result.stderr
    assert result.stdout == ""


def test_validate_missing_file_exits_2(tmp_path):
    result = _validate(tmp_path / "nope.py")
    assert result.returncode == 2
    assert "no such inventory file" in result.stderr


def test_validate_broken_fixture_report_is_golden():
    """The whole report, as docs/inventory.md shows it."""
    result = _validate("tests/fixtures/inventories/broken/broken.py")
    assert result.returncode == 2
    assert result.stderr == (BROKEN / "expected-errors.txt").read_text()


def test_lab_as_ansible_inventory_script_lists_json():
    result = _run(sys.executable, LAB, "--list")
    assert result.returncode == 0, result.stderr
    inventory = json.loads(result.stdout)
    assert set(inventory["_meta"]["hostvars"]) == {
        "head",
        "gpu1",
        "gpu2",
        "gpu3",
        "gpu4",
        "storage1",
    }
    assert inventory["slurm_controller"] == {"hosts": ["head"]}
    assert "slurm_controller" in inventory["all"]["children"]
    assert inventory["_meta"]["hostvars"]["head"]["ansible_host"] == "10.10.0.10"


def test_lab_as_ansible_inventory_script_host():
    result = _run(sys.executable, LAB, "--host", "gpu2")
    assert result.returncode == 0, result.stderr
    hostvars = json.loads(result.stdout)
    assert hostvars["ansible_host"] == "10.10.0.22"
    assert hostvars["base_chrony_sources"] == ["server 10.10.0.10 iburst"]


def test_bad_inventory_as_ansible_inventory_script_exits_2():
    result = _run(sys.executable, BROKEN / "broken.py", "--list")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "invalid inventory (6 problem(s))" in result.stderr
    assert "host 'gpu2': ssh_hostname: address 192.0.2.10 is also used by host 'head'" in (
        result.stderr
    )


@pytest.mark.parametrize("where", ["repository", "elsewhere"])
def test_pyinfra_stops_on_a_bad_inventory_before_connecting(where, tmp_path):
    """Run from the repository, pyinfra's config.py validates before the inventory is
    loaded; run elsewhere, the inventory file does as it is loaded (its import of
    aicluster.inventory, then ``finish(globals())``). Either way pyinfra exits before
    its "Connecting to hosts" stage; the addresses (RFC 5737 TEST-NET) would not answer
    anyway."""
    pyinfra = Path(sys.executable).parent / "pyinfra"
    cwd = REPO if where == "repository" else tmp_path
    result = _run(pyinfra, BROKEN / "broken.py", REPO / "deploy.py", "-y", cwd=cwd)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Loading config" in output
    assert "invalid inventory (6 problem(s))" in output
    assert "host 'gpu1': hardware.nics[0].mtu: MTU 9600 is out of range" in output
    assert "Traceback" not in output
    assert "Connecting" not in output
    assert "Connected" not in output
