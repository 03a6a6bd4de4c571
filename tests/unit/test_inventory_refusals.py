"""Each kind of inventory mistake is refused the same way by every entry point:
``aicluster validate``, ``pyinfra INVENTORY deploy.py`` (before it connects to any host)
and the inventory run as Ansible's inventory script (``INVENTORY --list``): the same
report on stderr, the host and the field named, no traceback, exit status 2.

The cases are test_inventory_errors.py's (one per mistake class, run there through
``load_cluster``); here each also goes through the three real commands (new Python
processes). pyinfra is started outside the repository, so that the inventory file's own
check stops it (test_inventory_cli.py covers the repository's config.py too). The
addresses are RFC 5737 TEST-NET ones, which nothing answers on.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aicluster.cli import main

# The error cases of the file beside this one (tests/unit is on sys.path, not a package:
# a local test file, not an installed module).
_errors = importlib.import_module("test_inventory_errors")
CASES, _apply = _errors.CASES, _errors._apply


REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PYINFRA = BIN / "pyinfra"
TIMEOUT = 120

#: One case per mistake class of issue 20's list (and the ones added with it).
CLASSES = [
    "unknown-group",
    "nfs-setting-unknown-key",
    "nfs-setting-quoted-number",
    "networks-overlap",
    "nic-address-outside-fabric",
    "duplicate-management-address",
    "duplicate-mac",
    "nic-listed-twice",
    "device-listed-twice",
    "ib-port-listed-twice",
    "nic-address-is-the-network-address",
    "host-name-underscore",
    "group-names-unknown-host",
    "host-with-data-twice",
    "version-latest",
    "secret-name-not-declared",
    "minio-parity-above-half-the-set",
    "minio-servers-with-unequal-drives",
    "ceph-pool-size-above-the-osd-hosts",
    "ceph-min-size-above-the-default-size",
    "cluster-setting-odd-on-the-first-host",
    "ray-setting-odd-on-the-first-host",
    "two-ray-heads",
    "host-field-misspelt",
]
BY_ID = {case[0]: case for case in CASES}


def _report(text: str) -> list[str]:
    """The refusal in a command's output: the header line and its problem lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "invalid inventory (" in line)
    out = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  - "):
            break
        out.append(line)
    return out


def _run(*args, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT)


def _refusals(path: Path, tmp_path: Path) -> dict[str, tuple[int, str, str]]:
    """(exit status, stdout, stderr) of the three entry points for one inventory."""
    validate = CliRunner().invoke(main, ["validate", str(path)])
    listed = _run(sys.executable, path, "--list", cwd=tmp_path)
    pyinfra = _run(PYINFRA, path, REPO / "deploy.py", "-y", cwd=tmp_path)
    return {
        "aicluster validate": (validate.exit_code, validate.stdout, validate.stderr),
        "--list": (listed.returncode, listed.stdout, listed.stderr),
        "pyinfra": (pyinfra.returncode, pyinfra.stdout, pyinfra.stderr),
    }


def _assert_same_refusal(results, expected_lines=None):
    reports = {}
    for entry, (status, out, err) in results.items():
        assert status == 2, (entry, out, err)
        assert "Traceback" not in out + err, (entry, out, err)
        reports[entry] = _report(err)
    assert reports["--list"] == reports["aicluster validate"] == reports["pyinfra"], reports
    assert results["--list"][1] == "", "--list prints no inventory when it refuses"
    assert "Connecting" not in results["pyinfra"][1] + results["pyinfra"][2]
    if expected_lines is not None:
        assert reports["pyinfra"][1:] == expected_lines
    return reports["pyinfra"]


@pytest.mark.parametrize("case_id", CLASSES)
def test_every_entry_point_refuses_the_same_way(case_id, spec, tmp_path):
    _, changes, host, field, wording = BY_ID[case_id]
    _apply(spec, changes)
    path = spec.write()
    report = _assert_same_refusal(_refusals(path, tmp_path))
    assert report[0] == f"{path}: invalid inventory (1 problem(s)):"
    assert report[1].startswith(f"  - host {host!r}: {field}"), report
    assert wording in report[1], report


@pytest.mark.parametrize("bad, error", [
    ("x = true", "NameError: name 'true' is not defined (Python writes True)"),
    ("x = undefined_name + 1", "NameError: name 'undefined_name' is not defined"),
    ("x = {'a': 1}['b']", "KeyError: 'b'"),
])
def test_a_python_error_is_file_and_line_everywhere(bad, error, spec, tmp_path):
    path = spec.write()
    lines = path.read_text().splitlines()
    lines.insert(2, bad)
    path.write_text("\n".join(lines) + "\n")
    _assert_same_refusal(_refusals(path, tmp_path), [f"  - {path}:3: {error}"])


def _as_ansible_runs_it(path: Path) -> Path:
    """*path* given our inventories' first line (``#!/usr/bin/env aicluster-inventory``)
    and made executable, as Ansible's script plugin runs an inventory file."""
    path.write_text("#!/usr/bin/env aicluster-inventory\n" + path.read_text())
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("bad", ["all = [(", "def f(:", "  x = 1"])
def test_a_syntax_error_is_file_and_line_everywhere(bad, spec, tmp_path):
    """A SyntaxError stops Python before any of the file runs: pyinfra reports it the
    same way through the repository's config.py (run before the inventory is loaded),
    and Ansible's run of the file (``INVENTORY --list``) through its first line,
    ``aicluster-inventory``, which compiles the file before running it."""
    path = spec.write()
    if bad.startswith("all"):
        path.write_text(path.read_text().replace("all = [", bad, 1))
    else:
        lines = path.read_text().splitlines()
        lines.insert(2, bad)
        path.write_text("\n".join(lines) + "\n")
    path = _as_ansible_runs_it(path)
    validate = CliRunner().invoke(main, ["validate", str(path)])
    pyinfra = _run(PYINFRA, path, "deploy.py", "-y", cwd=REPO)
    environ = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    listed = subprocess.run([str(path), "--list"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=TIMEOUT, env=environ)
    for status, output in ((validate.exit_code, validate.stderr),
                           (pyinfra.returncode, pyinfra.stdout + pyinfra.stderr),
                           (listed.returncode, listed.stdout + listed.stderr)):
        assert status == 2, output
        assert "Traceback" not in output
        assert f"  - {path}:" in output and "Error: " in output, output
        assert "Connecting" not in output
    assert _report(validate.stderr) == _report(pyinfra.stderr) == _report(listed.stderr)
    assert listed.stdout == ""


def test_the_inventory_script_explains_its_arguments(spec):
    path = spec.write()
    proc = subprocess.run([str(BIN / "aicluster-inventory"), str(path)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 2 and "usage: aicluster-inventory" in proc.stderr, proc.stderr
    listed = subprocess.run([str(BIN / "aicluster-inventory"), str(path), "--list"],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["_meta"]["hostvars"]


def test_our_inventories_run_through_aicluster_inventory():
    for path in (REPO / "inventories").glob("*.py"):
        assert path.read_text().startswith("#!/usr/bin/env aicluster-inventory\n"), path
        assert os.access(path, os.X_OK), path


def test_a_module_level_setting_is_refused_everywhere(spec, tmp_path):
    path = spec.write()
    lines = path.read_text().splitlines()
    lines.insert(2, 'slurm_version = "23.11"')
    lines.insert(3, "_helper = {'private': True}")
    lines.insert(4, "import json as _json")
    path.write_text("\n".join(lines) + "\n")
    report = _assert_same_refusal(_refusals(path, tmp_path))
    assert report[1:] == [
        f"  - {path}:3: slurm_version: a module-level variable is not a setting (pyinfra "
        "reads only lists and tuples here, as groups, and ignores the rest); put it in the "
        "data of 'all' (all = (hosts, {...})), of a group, or in group_data/all.py, or name "
        "it with a leading '_' if it is a helper"
    ]


def test_a_group_written_as_a_string_is_refused(spec, tmp_path):
    path = spec.write()
    lines = path.read_text().splitlines()
    lines.insert(3, 'monitoring = "n1"')
    path.write_text("\n".join(lines) + "\n")
    report = _assert_same_refusal(_refusals(path, tmp_path))
    assert report[1:] == [
        f"  - {path}:4: monitoring: a group is a list of host names: monitoring = ['n1']"
    ]


@pytest.mark.parametrize("data, message", [
    ("ssh_port=0", "host 'n1': ssh_port: Input should be greater than or equal to 1"),
    ("ray_versio=2.60.0", "host 'n1': ray_versio: not a ray setting; did you mean ray_version?"),
    # pyinfra reads 23.11 as a number: a version must be a string.
    ("slurm_version=23.11", "host 'n1': slurm_version: "),
])
def test_pyinfra_data_overrides_are_validated_before_connecting(data, message, spec, tmp_path):
    """``--data key=value`` reaches the hosts' data after the inventory file ran; it is
    validated with it, before pyinfra connects."""
    path = spec.write()
    assert CliRunner().invoke(main, ["validate", str(path)]).exit_code == 0
    result = _run(PYINFRA, path, REPO / "deploy.py", "-y", "--data", data, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert "Connecting" not in output
    key = data.split("=")[0]
    assert f"{path} (with --data {key}): invalid inventory (1 problem(s)):" in output
    assert message in output


def test_warnings_are_printed_and_do_not_refuse(spec, tmp_path):
    """An even number of Ceph monitors, slow fabric links between GPU nodes and a
    cluster without a monitoring host are warnings: ``aicluster validate`` exits 0 and
    shows them; pyinfra prints each once (``debug-inventory`` stops before connecting)."""
    spec.set("groups.ceph_mons", ["n1", "n2"]).set("groups.ceph_osds", ["n1", "n2"])
    spec.set("n1.ceph_osd_devices", [{"device": "/dev/nvme0n1"}])
    spec.set("n2.ceph_osd_devices", [{"device": "/dev/nvme0n1"}])
    spec.set("all.ceph_repo_url", "https://mirror.example.org/ceph")
    spec.set("groups.gpu_nodes", ["n1", "n2"])
    for n in ("n1", "n2"):
        spec.set(f"{n}.hardware.gpus", {"model": "H100-SXM5-80GB", "count": 8})
    spec.set("all.nvidia_cuda_repo_url", "https://mirror.example.org/nvidia/cuda/repos")
    spec.set("n2.hardware.nics[0].speed_gbps", 10)
    path = spec.write()
    expected = [
        "aicluster: warning: host 'n2': groups: ceph_mons has 2 hosts ('n1', 'n2'); an even "
        "number of monitors survives no more failures than 1 (a quorum is a majority): use "
        "an odd number",
        "aicluster: warning: host 'n2': hardware.nics[0].speed_gbps: 10 Gb/s on the fabric "
        "network of a cluster with 2 GPU nodes; jobs across nodes want at least 25 Gb/s",
        "aicluster: warning: groups: monitoring: no host is in the monitoring group: a "
        "cluster monitored only later has paid for its first dead GPU, flapping link or full "
        "disk by the time it is; name a monitoring host now (two for a replica and an "
        "Alertmanager pair)",
    ]
    validate = CliRunner().invoke(main, ["validate", str(path)])
    assert validate.exit_code == 0, validate.stderr
    assert validate.stderr.splitlines() == expected
    result = _run(PYINFRA, path, "debug-inventory", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in expected:
        assert (result.stdout + result.stderr).count(line) == 1, result.stderr
    # Without the mistakes, only monitoring's (this cluster has no monitoring host).
    spec.set("groups.ceph_mons", ["n1"]).set("n2.hardware.nics[0].speed_gbps", 25)
    validate = CliRunner().invoke(main, ["validate", str(spec.write())])
    assert validate.exit_code == 0 and validate.stderr.splitlines() == expected[-1:]
