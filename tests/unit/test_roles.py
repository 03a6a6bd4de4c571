"""The Ansible side mirrors the shared data: argument_specs name every default, and
site.yml applies the roles in aicluster's component order."""

from __future__ import annotations

import pytest
import yaml

from aicluster import PROJECT_ROOT, ROLES_DIR
from aicluster.inventory import COMPONENT_ORDER
from aicluster.render import defaults

ROLES = sorted(p.name for p in ROLES_DIR.iterdir() if (p / "defaults" / "main.yml").exists())
#: The roles whose tasks are built: site.yml applies these. A role with settings and
#: templates only (a component whose deploy has not landed) is applied by neither engine.
BUILT = [r for r in ROLES if (ROLES_DIR / r / "tasks" / "main.yml").exists()]


def test_every_role_is_a_component():
    assert ROLES, "no roles found"
    assert set(ROLES) <= set(COMPONENT_ORDER)


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_mirror_the_defaults(role):
    specs = yaml.safe_load((ROLES_DIR / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(defaults(role))
    for name, spec in options.items():
        assert spec.get("type"), f"{role}: {name} has no type"
        assert spec.get("description"), f"{role}: {name} has no description"
        assert "default" not in spec, f"{role}: {name}: defaults live in defaults/main.yml only"


def test_site_applies_the_roles_in_component_order():
    plays = yaml.safe_load((PROJECT_ROOT / "playbooks" / "site.yml").read_text())
    applied = [
        role["role"] if isinstance(role, dict) else role
        for play in plays
        for role in play.get("roles", [])
    ]
    assert applied == [c for c in COMPONENT_ORDER if c in BUILT]


def test_a_role_without_tasks_has_no_pyinfra_deploy_either():
    """Settings and templates first, the deploy later: both engines at once."""
    from aicluster.components import component_module

    for role in sorted(set(ROLES) - set(BUILT)):
        assert component_module(role) is None, role


def test_each_play_is_tagged_with_its_component():
    """`--tags slurm` runs the Slurm play alone (docs/rerunning.md): each role's play
    carries its role's name, the absence and record plays theirs, and the first play,
    which makes the release files ready, the name of each component that has some."""
    plays = yaml.safe_load((PROJECT_ROOT / "playbooks" / "site.yml").read_text())
    tags = {}
    for play in plays:
        roles = [r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])]
        tasks = play.get("tasks", [])
        from_ = [t["ansible.builtin.include_role"].get("tasks_from") for t in tasks
                 if "ansible.builtin.include_role" in t]
        name = roles[0] if roles else (from_[0].removesuffix(".yml") if from_ else "first")
        tags[name] = play.get("tags")
    for role in BUILT:
        assert tags[role] == [role], (role, tags[role])
    assert tags["absence"] == ["absence"] and tags["record"] == ["record"]
    with_files = sorted(r for r in BUILT if defaults(r).get(f"{r}_artifacts"))
    assert with_files and sorted(tags["first"]) == with_files
