"""The wheel works outside the clone, the dependencies are the ones the code imports, and
the roles build as an Ansible collection.

The wheel test builds the wheel from a copy of the source tree, installs it (without
dependencies) into a fresh venv that sees this venv's site-packages through a .pth
file (so the dependencies are the ones installed here, and no index is needed beyond
the build backend), and runs it from a directory outside the clone. The clone's own
editable install is out of sight: a .pth line adds a directory to sys.path without
reading the .pth files in it, and the fresh venv's site-packages come first anyway.
The testbed deploy from the wheel is scripts/wheel_check.sh (needs root and the
testbed; not run here).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from aicluster import PROJECT_ROOT, ROLES_DIR
from tests.wheel import ROOT
from tests.wheel import run as _run
from tests.wheel import wheel_venv as make_wheel_venv

pytestmark = pytest.mark.wheel

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(the fresh venv, its environment, a work directory outside the clone)."""
    return make_wheel_venv(tmp_path_factory.mktemp("wheel"))


def _py(venv: Path, env: dict[str, str], work: Path, code: str) -> str:
    return _run(venv / "bin" / "python", "-c", code, cwd=work, env=env)


def test_the_installed_package_comes_from_the_wheel(wheel_venv):
    venv, env, work = wheel_venv
    where = _py(venv, env, work, "import aicluster; print(aicluster.__file__)").strip()
    assert Path(where).is_relative_to(venv), f"aicluster imported from {where}, not the wheel"
    # Every module of the source tree, packages without an __init__.py included.
    installed = Path(where).parent
    modules = {p.relative_to(ROOT / "src" / "aicluster")
               for p in (ROOT / "src" / "aicluster").rglob("*.py")}
    missing = sorted(str(m) for m in modules if not (installed / m).is_file())
    assert not missing, f"not in the wheel: {missing}"


def test_roles_playbooks_and_deploy_file_resolve_inside_the_installed_package(wheel_venv):
    venv, env, work = wheel_venv
    paths = {}
    for what in ("roles", "playbooks", "deploy", "inventories", "ansible-cfg"):
        paths[what] = Path(_run(venv / "bin" / "aicluster", "path", what, cwd=work,
                                env=env).strip())
        assert paths[what].is_relative_to(venv), f"aicluster path {what}: {paths[what]}"
        assert paths[what].exists(), f"aicluster path {what}: {paths[what]} is missing"
    shipped = sorted(p.name for p in paths["roles"].iterdir())
    assert shipped == sorted(p.name for p in ROLES_DIR.iterdir())
    assert (paths["roles"] / "slurm" / "filter_plugins" / "aicluster_slurm.py").is_file()
    assert not list(paths["roles"].glob("*/molecule")), "test scenarios are not shipped"
    assert (paths["playbooks"] / "site.yml").is_file()
    assert paths["deploy"].read_text() == (ROOT / "deploy.py").read_text()


def test_aicluster_validate_works_from_the_wheel(wheel_venv):
    venv, env, work = wheel_venv
    # The example inventories the wheel ships, copied where a user would keep theirs.
    shipped = Path(_run(venv / "bin" / "aicluster", "path", "inventories", cwd=work,
                        env=env).strip())
    shutil.copytree(shipped, work / "inventories", dirs_exist_ok=True)
    out = _run(venv / "bin" / "aicluster", "validate", "inventories/lab.py", cwd=work, env=env)
    assert out.strip().endswith(": OK"), out


def test_templates_and_defaults_render_from_the_wheel(wheel_venv):
    venv, env, work = wheel_venv
    out = _py(venv, env, work, (
        "import aicluster.render as r\n"
        "print(r._defaults_path('base'))\n"
        "print(r.render('base', '90-aicluster-memlock.conf.j2', r.defaults('base')), end='')\n"
    ))
    path, text = out.split("\n", 1)
    assert Path(path).is_relative_to(venv), path
    from aicluster.render import defaults, render

    assert text == render("base", "90-aicluster-memlock.conf.j2", defaults("base"))
    assert "memlock" in text


def test_the_deploy_file_imports_from_the_wheel(wheel_venv):
    """Every module the shipped deploy.py imports is found, and from the wheel (a full
    deploy from the wheel is scripts/wheel_check.sh, on the testbed)."""
    venv, env, work = wheel_venv
    deploy = Path(_run(venv / "bin" / "aicluster", "path", "deploy", cwd=work,
                       env=env).strip())
    modules = sorted({node.module for node in ast.walk(ast.parse(deploy.read_text()))
                      if isinstance(node, ast.ImportFrom) and node.module})
    assert any(m.startswith("aicluster.") for m in modules)
    out = _py(venv, env, work, (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    print(name, importlib.import_module(name).__file__)\n"
    ))
    for line in out.splitlines():
        name, where = line.split(" ", 1)
        if name.startswith("aicluster"):
            assert Path(where).is_relative_to(venv), line


def test_the_shipped_playbook_finds_the_shipped_roles(wheel_venv):
    """ansible-playbook --syntax-check of the wheel's site.yml, with the wheel's
    ansible.cfg: every role it names resolves inside the installed package."""
    venv, env, work = wheel_venv
    cfg = _run(venv / "bin" / "aicluster", "path", "ansible-cfg", cwd=work, env=env).strip()
    playbooks = _run(venv / "bin" / "aicluster", "path", "playbooks", cwd=work, env=env).strip()
    shipped = Path(_run(venv / "bin" / "aicluster", "path", "inventories", cwd=work,
                        env=env).strip())
    shutil.copytree(shipped, work / "inventories", dirs_exist_ok=True)
    out = _run(venv / "bin" / "python", "-m", "ansible", "playbook", "--syntax-check",
               "-i", "inventories/lab.py", f"{playbooks}/site.yml", cwd=work,
               env={**env, "ANSIBLE_CONFIG": cfg, "ANSIBLE_NOCOLOR": "1"})
    assert "playbook: " in out, out
    dump = _run(venv / "bin" / "python", "-m", "ansible", "config", "dump", "--only-changed",
                cwd=work, env={**env, "ANSIBLE_CONFIG": cfg, "ANSIBLE_NOCOLOR": "1"})
    (roles_path,) = re.findall(r"DEFAULT_ROLES_PATH\(.*\) = \['(.*)'\]", dump)
    assert Path(roles_path).is_relative_to(venv), dump


# --- dependencies ------------------------------------------------------------------

# Declared but used as a command, not imported: ansible-core is the second engine
# (ansible-playbook); the test tools run as commands (tests/unit/test_lint.py, molecule).
USED_AS_COMMANDS = {"ansible-core", "molecule", "ansible-lint", "yamllint", "ruff"}
# Declared ahead of its first import (the accelerator's pyinfra version check, issue 19):
# drop from here once the code imports it.
DECLARED_AHEAD = {"packaging"}
# Imported in code that runs on a node, not here (a Ray driver script in a string).
NOT_OURS = {"ray"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imports(paths: list[Path]) -> set[str]:
    """Top-level modules imported by the Python files under ``paths``."""
    found: set[str] = set()
    for path in paths:
        for file in [path] if path.is_file() else path.rglob("*.py"):
            if "molecule" in file.parts:
                continue
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if isinstance(node, ast.Import):
                    found.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found


def _distributions(modules: set[str]) -> tuple[set[str], set[str]]:
    """(the distributions providing ``modules``, the modules no distribution provides)."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    providers = importlib.metadata.packages_distributions()
    dists, unknown = set(), set()
    # bench/'s scripts import each other (run as `python bench/<script>.py`).
    local = {"aicluster", "tests"} | {p.stem for p in (ROOT / "bench").glob("*.py")}
    for module in modules - stdlib - local - NOT_OURS:
        if module in providers:
            dists.update(_name(d) for d in providers[module])
        else:
            unknown.add(module)
    return dists, unknown


def _declared() -> tuple[set[str], set[str]]:
    """(runtime, test extra): pyproject.toml's, as this venv's install of it recorded."""
    requires = importlib.metadata.requires("aicluster") or []
    return ({_name(r) for r in requires if "extra ==" not in r},
            {_name(r) for r in requires if re.search(r"extra == .test.", r)})


def test_every_module_the_code_imports_is_declared_and_nothing_else():
    runtime, test = _declared()
    shipped = [ROOT / "src", ROOT / "deploy.py", ROOT / "inventories",
               *ROOT.glob("roles/*/filter_plugins")]
    needed, unknown = _distributions(_imports(shipped))
    assert not unknown, f"imported, but no installed distribution provides: {unknown}"
    assert needed <= runtime, f"imported by the package, not declared: {needed - runtime}"
    needed_by_tests, unknown = _distributions(_imports([ROOT / "tests", ROOT / "bench"]))
    assert not unknown, f"tests import modules nothing installed provides: {unknown}"
    missing = needed_by_tests - runtime - test
    assert not missing, f"imported by tests or bench, not declared: {missing}"
    unused = (runtime | test) - needed - needed_by_tests - USED_AS_COMMANDS - DECLARED_AHEAD
    assert not unused, f"declared, never imported: {unused}"


# --- the Ansible collection --------------------------------------------------------


def test_the_roles_build_as_an_ansible_collection(tmp_path):
    _run(BIN / "ansible-galaxy", "collection", "build", "--output-path", tmp_path, ROOT,
         cwd=tmp_path, env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path)})
    (archive,) = tmp_path.glob("aicluster-cluster-*.tar.gz")
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    names = set(members)
    for role in ROLES_DIR.iterdir():
        # A role whose tasks are not built yet would ship its settings and templates.
        built = (role / "tasks" / "main.yml").exists()
        assert f"roles/{role.name}/{'tasks' if built else 'defaults'}/main.yml" in names
    assert {"MANIFEST.json", "meta/runtime.yml", "playbooks/site.yml"} <= names
    tops = {n.split("/")[0] for n in names}
    assert not tops & {".venv", ".git", "tests", "src", "inventories", "bench"}, tops
    assert not [n for n in names if "/molecule" in n or "__pycache__" in n]
    # Roles inside a collection do not load their own filter_plugins: the collection's
    # plugins/filter links each of them, once.
    plugins = {Path(n).name for n in names if n.startswith("plugins/filter/")}
    assert plugins == {p.name for p in ROLES_DIR.glob("*/filter_plugins/*.py")}
    assert all(members[f"plugins/filter/{p}"].issym() for p in plugins)


def test_project_root_is_the_clone_here():
    """From a clone (an editable install) the one lookup finds the repository's files,
    not a copy."""
    assert PROJECT_ROOT == ROOT
    assert not (ROOT / "src" / "aicluster" / "share").exists()
