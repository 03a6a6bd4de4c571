"""The components, one package each, siblings that never import each other.

A component ``<c>`` is ``aicluster.components.<c>``:

* ``derive.py``: engine-free (no pyinfra, no Ansible). ``derived_vars(cluster,
  host_name, data)``, the values computed from the whole inventory that its templates
  need (both engines get them: pyinfra through :func:`aicluster.common.settings.template_vars`,
  Ansible through the inventory's host variables); optionally ``validate(cluster)``,
  its own checks of the inventory, one line per problem naming host and field; and the
  pure decisions its Ansible filter plugins call;
* ``facts.py`` (where it reads the node): pyinfra facts, parsing with engine-free code;
* ``deploy.py``: the pyinfra ``@deploy`` (the only module of the component that imports
  pyinfra's operations).

This registry finds them by name, so that the layers below (the inventory) never import
component code; it imports nothing of aicluster itself.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_LOADED: dict[tuple[str, str], ModuleType | None] = {}


def _module(component: str, part: str) -> ModuleType | None:
    key = (component, part)
    if key not in _LOADED:
        name = f"{__name__}.{component}.{part}"
        try:
            _LOADED[key] = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name not in (name, f"{__name__}.{component}"):
                raise
            _LOADED[key] = None
    return _LOADED[key]


def component_module(component: str) -> ModuleType | None:
    """The pyinfra deploy module of a component, or None when it is not built yet."""
    return _module(component, "deploy")


def derive_module(component: str) -> ModuleType | None:
    """The engine-free derive module of a component, or None when it has none."""
    return _module(component, "derive")


def model_module(component: str) -> ModuleType | None:
    """The engine-free settings model module of a component, or None when it has none."""
    return _module(component, "model")
