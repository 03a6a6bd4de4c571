"""The repository is lint-clean: ruff (Python), yamllint (YAML), ansible-lint (roles and
playbooks, the settings in .yamllint and .ansible-lint at the repository root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aicluster import PROJECT_ROOT

BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> None:
    exe = BIN / tool
    if not exe.exists():
        pytest.fail(f"{tool} is not installed beside {sys.executable} (pip install -e '.[test]')")
    proc = subprocess.run(
        [str(exe), *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, (
        f"{tool} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )


def test_ruff():
    _run("ruff", "check", "src", "tests", "deploy.py", "inventories", "bench")


def test_yamllint():
    _run("yamllint", "--strict", "roles", "playbooks")


def test_ansible_lint():
    roles = sorted(str(p.relative_to(PROJECT_ROOT)) for p in (PROJECT_ROOT / "roles").iterdir())
    _run("ansible-lint", "--offline", *roles, "playbooks")
