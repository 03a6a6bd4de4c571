"""A wheel of this source tree, installed into a fresh venv outside the clone (shared by
the packaging unit tests and the e2e deploy from the wheel)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the clone the tests run from
NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    ".ruff_cache", ".testbed", ".ansible",
)


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: int = 300) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def wheel_venv(tmp: Path) -> tuple[Path, dict[str, str], Path]:
    """(the fresh venv, the environment to run it with, a work directory outside the
    clone), with aicluster installed from a wheel built from this source tree; its
    dependencies are this venv's site-packages (a .pth file), so no index is needed
    beyond the build backend, and the clone's editable install is out of sight."""
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    # Build isolation: the build backend (setuptools) from the configured package index.
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
        "-q", "-w", tmp / "dist", source, cwd=tmp, timeout=600)
    (wheel,) = (tmp / "dist").glob("aicluster-*.whl")

    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
        "--no-index", "--disable-pip-version-check", "-q", wheel, cwd=tmp)
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                       cwd=tmp).strip())
    (purelib / "aicluster-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ANSIBLE"))}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    env["HOME"] = str(tmp / "home")
    work = tmp / "work"
    work.mkdir()
    return venv, env, work
