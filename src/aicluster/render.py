"""Render a role's templates the way Ansible's ``template`` module does.

Templates live once, in ``roles/<component>/templates/``; pyinfra renders them here
and uploads the text, Ansible renders them itself. The Jinja2 settings match
Ansible's (``trim_blocks``, kept trailing newline, undefined variables are errors),
and the few filters templates use behave as Ansible's do. A test renders every
template through both engines and compares the text.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from aicluster import ROLES_DIR


def _to_nice_yaml(value: Any, indent: int = 4) -> str:
    return yaml.dump(value, indent=indent, allow_unicode=True, default_flow_style=False)


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true")
    return bool(value)


FILTERS = {
    "to_json": json.dumps,
    "to_nice_yaml": _to_nice_yaml,
    "bool": _bool,
}


@cache
def _environment(component: str) -> jinja2.Environment:
    """The Jinja2 environment of ``roles/<component>/templates/`` (one per component)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROLES_DIR / component / "templates")),
        trim_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        auto_reload=False,  # compiled once per run: no stat of the file at each use
    )
    env.filters.update(FILTERS)
    return env


def render(component: str, template: str, variables: Mapping[str, Any]) -> str:
    """Render ``roles/<component>/templates/<template>`` with ``variables``."""
    return _environment(component).get_template(template).render(**variables)


@cache
def _defaults_path(component: str) -> Path:
    return ROLES_DIR / component / "defaults" / "main.yml"


@cache
def _os_vars_path(component: str, os_family: str) -> tuple[Path, bool]:
    path = ROLES_DIR / component / "vars" / f"{os_family}.yml"
    return path, path.exists()


def defaults(component: str) -> dict[str, Any]:
    """The component's defaults: ``roles/<component>/defaults/main.yml``."""
    return _load_yaml(_defaults_path(component))


def default_value(component: str, key: str) -> Any:
    """One of the component's defaults (a copy), without copying the others; KeyError
    when the component has no such variable."""
    return plain_copy(_mapping(_defaults_path(component))[key])


def os_vars(component: str, os_family: str) -> dict[str, Any]:
    """Distribution differences: ``roles/<component>/vars/<os_family>.yml``."""
    path, exists = _os_vars_path(component, os_family)
    if not exists:
        raise ValueError(f"{component}: {os_family} systems are not supported (no {path.name})")
    return _load_yaml(path)


@cache
def _load_yaml_cached(path: str) -> str:
    return Path(path).read_text()


@cache
def _parsed(path: str) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(_load_yaml_cached(path), Loader=loader) or {}  # noqa: S506 (safe loader)


def _mapping(path: Path) -> dict[str, Any]:
    """The file's data, parsed once per process (shared: never hand it out as is)."""
    data = _parsed(str(path))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    return data


def _load_yaml(path: Path) -> dict[str, Any]:
    """The file's data, parsed once per process; each caller gets its own copy."""
    return plain_copy(_mapping(path))


_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None), datetime.datetime,
                        datetime.date})


def plain_copy(value: Any) -> Any:
    """A deep copy of plain data (dicts, lists, strings, numbers, dates: what YAML and
    facts hold), so no caller can alter another's view; ``copy.deepcopy`` for anything
    else. Several times quicker than ``deepcopy``, which keeps a memo of every object."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    # (members that are strings or numbers, most of them, are kept without a call each)
    if kind is dict:
        return {k: v if type(v) in _IMMUTABLE else plain_copy(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _IMMUTABLE else plain_copy(v) for v in value]
    if kind is tuple:
        return tuple(v if type(v) in _IMMUTABLE else plain_copy(v) for v in value)
    if kind is set:
        return set(value)  # members are hashable, so immutable here
    return copy.deepcopy(value)
