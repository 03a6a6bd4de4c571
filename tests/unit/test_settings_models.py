"""One settings model per component: it agrees with the role's defaults and its
argument_specs.yml, it accepts the defaults, and both engines get the same typed values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from aicluster.inventory import COMPONENT_ORDER, load_hosts, settings_model
from aicluster.render import defaults

ROOT = Path(__file__).resolve().parents[2]
MODELLED = [c for c in COMPONENT_ORDER if settings_model(c) is not None]
ANSIBLE_TYPES = {int: "int", str: "str", bool: "bool", list: "list", dict: "dict", float: "float"}


def _ansible_type(annotation) -> set[str]:
    """The argument_specs type(s) a field's annotation allows (None stripped)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _ansible_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        out = set()
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                out |= _ansible_type(arg)
        return out
    if origin is typing.Literal:
        return {ANSIBLE_TYPES[type(v)] for v in typing.get_args(annotation) if v is not None}
    base = origin or annotation
    return {ANSIBLE_TYPES.get(base, "raw")}


def test_components_have_models():
    assert "slurm" in MODELLED


@pytest.mark.parametrize("component", MODELLED)
def test_the_model_the_defaults_and_the_argument_specs_name_the_same_keys(component):
    model = settings_model(component)
    specs = yaml.safe_load((ROOT / f"roles/{component}/meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert set(model.model_fields) == set(defaults(component))
    assert set(options) == set(model.model_fields)
    for name, field in model.model_fields.items():
        want = options[name].get("type", "str")
        have = _ansible_type(field.annotation)
        assert want in have or have == {"raw"} or want == "raw", (name, want, have)


@pytest.mark.parametrize("component", MODELLED)
def test_the_model_accepts_the_role_defaults(component):
    settings_model(component).model_validate(defaults(component))


@pytest.mark.parametrize("inventory", ["inventories/lab.py"])
def test_pyinfra_and_ansible_get_the_same_values(inventory):
    """Every host's data as pyinfra holds it equals what ``ansible-inventory``
    hands Ansible for the same keys (a value is never a number for one and a string for
    the other)."""
    hosts = load_hosts(ROOT / inventory)
    binary = Path(sys.executable).parent / "ansible-inventory"
    # the inventory script (its first line: aicluster-inventory) is found on PATH: this one
    env = {**os.environ, "PATH": f"{binary.parent}:{os.environ.get('PATH', '')}",
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    proc = subprocess.run([str(binary), "-i", inventory, "--list"],
                          capture_output=True, text=True, cwd=ROOT, check=True, env=env)
    hostvars = json.loads(proc.stdout)["_meta"]["hostvars"]
    compared = 0
    for name, (_groups, data) in hosts.items():
        for key, value in data.items():
            if key.startswith("_"):
                continue
            assert hostvars[name][key] == json.loads(json.dumps(value, default=str)), (name, key)
            compared += 1
    assert compared > 100
