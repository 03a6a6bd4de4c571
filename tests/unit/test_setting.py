"""aicluster.deploys.setting: one variable of a component for a host, the value
layered() gives for it, for every variable of every component."""

from __future__ import annotations

import pytest

from aicluster.deploys import layered, setting
from aicluster.render import ROLES_DIR, defaults


@pytest.mark.parametrize("component", sorted(
    p.parent.parent.name for p in ROLES_DIR.glob("*/defaults/main.yml")))
def test_each_variable_is_what_layered_gives(component):
    keys = list(defaults(component))
    data = {keys[0]: "from the host", "not_a_variable": 1}
    whole = layered(component, data)
    for key in keys:
        assert setting(component, data, key) == whole[key]
    assert setting(component, data, keys[0]) == "from the host"
    with pytest.raises(KeyError):
        setting(component, data, "not_a_variable")  # as layered(...)["not_a_variable"]


def test_a_value_is_a_copy():
    value = setting("slurm", {}, "slurm_default_config")
    value["changed"] = True
    assert "changed" not in setting("slurm", {}, "slurm_default_config")
