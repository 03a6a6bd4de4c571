"""The RayNode fact's shell (aicluster.components.ray.facts.command_text), run here: the Python
version it reports is the interpreter's own ``sys.version_info[:3]``, read with
``python -V``; a STAND-IN interpreter (a script printing what ``-V`` prints) covers
release-candidate and development builds; Ray's version comes from a venv laid out
here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aicluster.components.ray.probe import UNITS, command_text, parse


def _read(tmp_path: Path, python: str, units: dict[str, str] | None = None,
          others: tuple[str, ...] = ()) -> dict:
    """Run the fact's shell on a venv laid out under tmp_path/opt (plus the entries
    *others* there), with STAND-IN unit files (name: text) in place of /etc's."""
    venv = tmp_path / "opt" / "2.60.0" / "venv"
    info = venv / "lib" / "python3.11" / "site-packages" / "ray-2.60.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Name: ray\nVersion: 2.60.0\n")
    for name in others:
        (tmp_path / "opt" / name).mkdir()
    command = command_text(str(venv), str(tmp_path / "opt"))
    for unit in UNITS:
        standin = tmp_path / Path(unit).name
        if units and standin.name in units:
            standin.write_text(units[standin.name])
        command = command.replace(unit, str(standin))
    command = f"AICLUSTER_RAY_PYTHON={python}; {command}"
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return parse(proc.stdout.splitlines())


def test_the_python_version_is_the_interpreters_own(tmp_path):
    fact = _read(tmp_path, sys.executable)
    assert fact["python"] == ".".join(map(str, sys.version_info[:3]))
    assert fact["ray"] == "2.60.0"
    assert fact["versions"] == ["2.60.0"]


@pytest.mark.parametrize(
    ("printed", "version"),
    [("Python 3.13.0rc1", "3.13.0"), ("Python 3.12.1+", "3.12.1"), ("Python 3.11.2", "3.11.2")],
)
def test_a_pre_release_or_development_python_reads_as_x_y_z(tmp_path, printed, version):
    standin = tmp_path / "python-standin"
    standin.write_text(f"#!/bin/sh\n[ \"$1\" = -V ] && echo '{printed}'\n")
    standin.chmod(0o755)
    assert _read(tmp_path, str(standin))["python"] == version


@pytest.mark.parametrize("body", [None, "exit 1", "echo 'not a python'"])
def test_no_python_or_something_else_reads_as_none(tmp_path, body):
    standin = tmp_path / "python-standin"  # None: no such file
    if body is not None:
        standin.write_text(f"#!/bin/sh\n{body}\n")
        standin.chmod(0o755)
    fact = _read(tmp_path, str(standin))
    assert fact["python"] is None
    assert fact["ray"] == "2.60.0"  # the rest of the fact is still read


def test_the_deployed_version_is_the_ones_the_unit_starts(tmp_path):
    opt = tmp_path / "opt"
    unit = (f"[Service]\nExecStartPre=/bin/true\n"
            f"ExecStart={opt}/2.59.1/venv/bin/ray start --block --head --port=6379\n"
            f"ExecStart={opt}/a/b/venv/bin/ray start --block\n"  # not <dir>/<version>/venv
            f"ExecStart={opt}/2.1.0/venv/bin/python -m something\n")  # not ray start
    fact = _read(tmp_path, sys.executable, units={"ray-head.service": unit})
    assert fact["deployed"] == "2.59.1"


def test_a_unit_without_a_last_newline_still_reads(tmp_path):
    unit = f"[Service]\nExecStart={tmp_path}/opt/2.60.0/venv/bin/ray start --block"
    assert _read(tmp_path, sys.executable, units={"ray-worker.service": unit})[
        "deployed"] == "2.60.0"


def test_no_unit_reads_as_not_deployed(tmp_path):
    assert _read(tmp_path, sys.executable)["deployed"] is None


def test_installed_versions_are_the_entries_named_like_versions(tmp_path):
    fact = _read(tmp_path, sys.executable,
                 others=("2.9.3", "3.0.0rc1", "venv-old", ".hidden", "2.10 copy", "1+local~x"))
    assert sorted(fact["versions"]) == ["1+local~x", "2.60.0", "2.9.3", "3.0.0rc1"]
