"""The Ansible side mirrors the shared data: argument_specs name every default, and
site.yml applies the roles in aicluster's component order."""

from __future__ import annotations

import pytest
import yaml

from aicluster import PROJECT_ROOT, ROLES_DIR
from aicluster.inventory import COMPONENT_ORDER
from aicluster.render import defaults

ROLES = sorted(p.name for p in ROLES_DIR.iterdir() if (p / "defaults" / "main.yml").exists())


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
    assert applied == [c for c in COMPONENT_ORDER if c in ROLES]
