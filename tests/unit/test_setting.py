"""aicluster.deploys.setting: one variable of a component for a host, the value
layered() gives for it, for every variable of every component."""

from __future__ import annotations

import pytest

from aicluster.common.settings import layered, setting
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


def test_plain_copy_is_a_deep_copy_sharing_nothing_mutable():
    import copy
    import datetime

    from aicluster.render import plain_copy

    class Odd:
        def __init__(self):
            self.items = [1]

    value = {
        "name": "node1", "gpus": 8, "ratio": 0.5, "on": True, "none": None, "raw": b"x",
        "when": datetime.datetime(2026, 12, 1), "day": datetime.date(2026, 12, 1),
        "packages": {"bash": ["5.2"], "zlib1g": ["1:1.2", "1:1.3"]},
        "nested": [[{"a": [1, 2]}], ("t", ["in a tuple"])], "groups": {"ray", "sudo"},
        "odd": Odd(),
    }
    copied = plain_copy(value)
    assert copied == {**copy.deepcopy(value), "odd": copied["odd"]}
    assert copied["odd"] is not value["odd"] and copied["odd"].items == [1]

    def mutable(obj, path=()):
        if isinstance(obj, dict):
            yield path, obj
            for k, v in obj.items():
                yield from mutable(v, (*path, k))
        elif isinstance(obj, (list, set)):
            yield path, obj
            for n, v in enumerate(obj):
                yield from mutable(v, (*path, n))
        elif isinstance(obj, tuple):
            for n, v in enumerate(obj):
                yield from mutable(v, (*path, n))

    theirs = {id(obj) for _, obj in mutable(value)}
    assert all(id(obj) not in theirs for _, obj in mutable(copied))
    copied["packages"]["bash"].append("6.0")
    copied["nested"][0][0]["a"].append(3)
    assert value["packages"]["bash"] == ["5.2"] and value["nested"][0][0]["a"] == [1, 2]
