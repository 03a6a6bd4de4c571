"""The layering DESIGN.md draws, checked: the Ansible side (filter plugins, the
components' engine-free modules) never imports pyinfra, and the import graph has no
circle, no component importing a sibling, and pyinfra internals in one place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = sorted(ROOT.glob("roles/*/filter_plugins/*.py"))
ENGINE_FREE = sorted(
    p for p in (ROOT / "src/aicluster/components").glob("*/*.py")
    if p.stem in ("derive", "probe", "model")
)


def _pyinfra_modules_after(code: str) -> list[str]:
    """The pyinfra modules a fresh interpreter holds after running ``code``."""
    probe = code + "\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
    probe += "('pyinfra', 'pyinfra_cli')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    return eval(out.strip().splitlines()[-1])  # a list of names printed by repr


def test_there_are_filter_plugins_and_engine_free_modules():
    assert len(PLUGINS) >= 9 and len(ENGINE_FREE) >= 12


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.parent.parent.name)
def test_a_filter_plugin_runs_without_pyinfra(plugin):
    """What ansible-playbook loads from our roles imports engine-free modules only."""
    code = f"import runpy\nruntime = runpy.run_path({str(plugin)!r})\n"
    code += "assert runtime['FilterModule']().filters()\n"
    assert _pyinfra_modules_after(code) == []


def test_the_engine_free_modules_import_no_pyinfra():
    names = [".".join(p.relative_to(ROOT / "src").with_suffix("").parts) for p in ENGINE_FREE]
    code = "import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names)
    code += "import aicluster.inventory, aicluster.common.settings, aicluster.common.disks\n"
    code += "import aicluster.common.netconf\n"
    assert _pyinfra_modules_after(code) == []


def test_the_structure_check_passes():
    """../shared/tools/structure.py: no import circle, no component importing another,
    pyinfra's private names used in one directory only."""
    tool = ROOT.parent / "shared" / "tools" / "structure.py"
    if not tool.exists():
        pytest.skip(f"{tool} is not beside the repository")
    proc = subprocess.run([sys.executable, str(tool)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
