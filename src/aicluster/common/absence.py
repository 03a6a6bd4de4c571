"""Desired absence, engine-free: what a node recorded, what the inventory wants now,
what to take away, and which removals to refuse.

Each deploy ends by writing, on the node, :data:`RECORD` with the components the
inventory gave it and the roles (inventory groups) it holds in each, e.g.
``{"components": {"base": [], "slurm": ["slurm_controller", "slurm_workers"]}}``. The
next deploy reads it back (pyinfra: the ``RecordedComponents`` fact; Ansible: slurp)
and, for what was recorded but is no longer wanted, stops and disables the
services and removes the configuration a component's ``derive.REMOVAL`` names.
Packages and data (disks, pools, buckets, exported directories, state directories)
are never removed. A removal that would break the cluster (each component's
``derive.removal_refusals``) stops the whole run before any host is changed.

Both engines call the functions below, so they decide alike.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

from aicluster.components import derive_module

#: The record each deploy writes on every node (the same file from both engines).
RECORD = "/etc/aicluster/components"
RECORD_DIR = "/etc/aicluster"

Roles = Mapping[str, Iterable[str]]


def record_text(wanted: Roles) -> str:
    """The record's text for a host given *wanted* (component -> its roles there)."""
    body = {"components": {c: sorted(roles) for c, roles in wanted.items()}}
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def parse_record(text: str | None) -> dict[str, list[str]]:
    """What a node recorded (component -> roles); ``{}`` for no record or one this
    version cannot read (then nothing is removed: an unknown record is never guessed)."""
    if not (text or "").strip():
        return {}
    try:
        body = json.loads(text or "")
    except ValueError:
        return {}
    comps = body.get("components") if isinstance(body, dict) else None
    if not isinstance(comps, dict):
        return {}
    return {str(c): [str(r) for r in roles] for c, roles in comps.items()
            if isinstance(roles, list)}


def parse_slurped(result: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """:func:`parse_record` of an Ansible ``slurp`` result (absent file: ``{}``)."""
    content = (result or {}).get("content")
    if not content:
        return {}
    try:
        return parse_record(base64.b64decode(content).decode())
    except (binascii.Error, UnicodeDecodeError):
        return {}


def removals(recorded: Roles, wanted: Roles) -> dict[str, dict[str, Any]]:
    """What to take away from a host: component -> ``{"roles": [...], "whole": bool}``
    for every recorded component the host is no longer given (``whole``), or still
    given with fewer roles (only those roles go). In reverse deploy order of the record
    (the stacks before the storage they use)."""
    out: dict[str, dict[str, Any]] = {}
    for component in reversed(list(recorded)):
        had = list(recorded[component])
        if component not in wanted:
            out[component] = {"roles": had, "whole": True}
            continue
        gone = [r for r in had if r not in set(wanted[component])]
        if gone:
            out[component] = {"roles": gone, "whole": False}
    return out


def removal_spec(component: str) -> Mapping[str, Mapping[str, list[str]]] | None:
    """The component's ``derive.REMOVAL`` (None: its removal is not built)."""
    module = derive_module(component)
    return getattr(module, "REMOVAL", None) if module is not None else None


def steps(component: str, roles: Iterable[str], whole: bool) -> dict[str, list[str]] | None:
    """The services to stop and disable, the files to remove and the services to reload
    afterwards, for taking *roles* (and, when *whole*, the component itself) off a host.
    None when the component declares no removal."""
    spec = removal_spec(component)
    if spec is None:
        return None
    keys = [*roles, *([component] if whole else [])]
    out: dict[str, list[str]] = {"services": [], "files": [], "reload": []}
    for key in keys:
        for kind in out:
            for item in spec.get(key, {}).get(kind, []):
                if item not in out[kind]:
                    out[kind].append(item)
    return out


def plan(recorded: Roles, wanted: Roles) -> dict[str, Any]:
    """Every step for one host (what :func:`steps` gives, over :func:`removals`), plus
    ``unbuilt``: recorded components whose removal is not built (their services stay)."""
    out: dict[str, Any] = {"services": [], "files": [], "reload": [], "unbuilt": [],
                           "components": {}}
    for component, what in removals(recorded, wanted).items():
        found = steps(component, what["roles"], what["whole"])
        out["components"][component] = what
        if found is None:
            out["unbuilt"].append(component)
            continue
        for kind in ("services", "files", "reload"):
            out[kind] += [i for i in found[kind] if i not in out[kind]]
    return out


def refusals(recorded: Mapping[str, Roles], wanted: Mapping[str, Roles]) -> list[str]:
    """The removals that would break the cluster, one explanation each: every
    component's ``derive.removal_refusals(recorded, wanted)`` (host -> component ->
    roles, before and after). Hosts with no record count as having had nothing."""
    components: list[str] = []
    for roles in (*recorded.values(), *wanted.values()):
        components += [c for c in roles if c not in components]
    out: list[str] = []
    for component in components:
        module = derive_module(component)
        rule = getattr(module, "removal_refusals", None) if module is not None else None
        if rule is not None:
            out += rule(recorded, wanted)
    return out


def holders(by_host: Mapping[str, Roles], component: str, role: str) -> list[str]:
    """The hosts holding *role* of *component* in *by_host*, sorted."""
    return sorted(h for h, roles in by_host.items() if role in (roles.get(component) or ()))


def anywhere(by_host: Mapping[str, Roles], component: str) -> bool:
    """Whether any host in *by_host* has *component*."""
    return any(component in roles for roles in by_host.values())


def keep_one(recorded: Mapping[str, Roles], wanted: Mapping[str, Roles], component: str,
             role: str, what: str) -> list[str]:
    """A refusal when every host that held *role* loses it while *component* stays in the
    cluster: the role's state lives on those hosts, and the rest of the component needs
    it (the last Slurm controller, the only k3s server)."""
    before = holders(recorded, component, role)
    if not before or not anywhere(wanted, component):
        return []
    after = holders(wanted, component, role)
    if any(h in after for h in before):
        return []
    staying = sorted(h for h, roles in wanted.items() if component in roles)
    return [
        f"refusing to remove {what} from {', '.join(before)}: no host that ran it keeps it "
        f"(inventory now: {', '.join(after) or 'none'} in {role}), and {component} stays in "
        f"the cluster ({', '.join(staying)}), which needs it: its state is on "
        f"{', '.join(before)}. Keep one of them in {role} while the new one joins, or take "
        f"{component} off every host."
    ]
