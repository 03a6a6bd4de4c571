"""Desired absence, engine-free: what a node recorded, what the inventory wants now,
what to take away, and which removals to refuse.

Each deploy ends by writing, on the node, :data:`RECORD` with the components the
inventory gave it and the roles (inventory groups) it holds in each, e.g.
``{"components": {"base": [], "slurm": ["slurm_controller", "slurm_workers"]}}``. The
next deploy reads it back (pyinfra: the ``RecordedComponents`` fact; Ansible: slurp)
and, for what was recorded but is no longer wanted, stops and disables the
services, removes the configuration and unmounts the network mounts (recorded with
the components) a component's ``derive.REMOVAL`` names.
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


def record_text(wanted: Roles, mounts: Mapping[str, Iterable[str]] | None = None) -> str:
    """The record's text for a host given *wanted* (component -> its roles there) and
    *mounts* (component -> the network mounts it makes there, :func:`host_mounts`;
    recorded so that they can be unmounted once the inventory no longer names them)."""
    body: dict[str, Any] = {"components": {c: sorted(roles) for c, roles in wanted.items()}}
    made = {c: sorted(set(paths)) for c, paths in (mounts or {}).items() if paths}
    if made:
        body["mounts"] = made
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def _record_body(text: str | None) -> dict[str, Any]:
    if not (text or "").strip():
        return {}
    try:
        body = json.loads(text or "")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _lists(value: Any) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        return {}
    return {str(k): [str(i) for i in items] for k, items in value.items()
            if isinstance(items, list)}


def parse_record(text: str | None) -> dict[str, list[str]]:
    """What a node recorded (component -> roles); ``{}`` for no record or one this
    version cannot read (then nothing is removed: an unknown record is never guessed)."""
    return _lists(_record_body(text).get("components"))


def parse_record_mounts(text: str | None) -> dict[str, list[str]]:
    """The network mounts a node recorded (component -> mount points); ``{}`` when
    none (a record written before mounts were recorded has none)."""
    body = _record_body(text)
    if not isinstance(body.get("components"), dict):
        return {}
    return {c: [p for p in paths if p.startswith("/") and p != "/"]
            for c, paths in _lists(body.get("mounts")).items()}


def _slurped_text(result: Mapping[str, Any] | None) -> str:
    content = (result or {}).get("content")
    if not content:
        return ""
    try:
        return base64.b64decode(content).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def parse_slurped(result: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """:func:`parse_record` of an Ansible ``slurp`` result (absent file: ``{}``)."""
    return parse_record(_slurped_text(result))


def parse_slurped_mounts(result: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """:func:`parse_record_mounts` of an Ansible ``slurp`` result."""
    return parse_record_mounts(_slurped_text(result))


def host_mounts(cluster: Any, host_name: str) -> dict[str, list[str]]:
    """The network mounts the inventory gives a host, by component (each component's
    ``derive.mounts(cluster, host_name, data)``): what its record holds."""
    host = cluster.hosts[host_name]
    out: dict[str, list[str]] = {}
    for component in host.components():
        module = derive_module(component)
        made = getattr(module, "mounts", None) if module is not None else None
        paths = made(cluster, host_name, host.data) if made is not None else []
        if paths:
            out[component] = sorted(set(paths))
    return out


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


#: The kinds of step a component's ``derive.REMOVAL`` lists, per role (or the
#: component's own name, for taking it off altogether). Besides these, a role's entry
#: may say ``"unmount": True`` (the network mounts the component recorded on the host
#: are unmounted and their fstab lines removed) or ``"unbuilt": True`` (its removal is
#: not built: the deploy names it in a warning and its services keep running).
KINDS = ("services", "files", "reload")


def steps(component: str, roles: Iterable[str], whole: bool) -> dict[str, Any] | None:
    """The services to stop and disable, the files to remove and the services to reload
    afterwards, for taking *roles* (and, when *whole*, the component itself) off a host;
    ``unmount`` (whether its recorded mounts go) and ``unbuilt`` (the roles whose
    removal is not built). None when the component declares no removal."""
    spec = removal_spec(component)
    if spec is None:
        return None
    keys = [*roles, *([component] if whole else [])]
    out: dict[str, Any] = {kind: [] for kind in KINDS}
    out["unmount"], out["unbuilt"] = False, []
    for key in keys:
        entry = spec.get(key, {})
        for kind in KINDS:
            for item in entry.get(kind, []):
                if item not in out[kind]:
                    out[kind].append(item)
        out["unmount"] = out["unmount"] or bool(entry.get("unmount"))
        if entry.get("unbuilt"):
            out["unbuilt"].append(key)
    return out


def plan(recorded: Roles, wanted: Roles,
         mounts: Mapping[str, Iterable[str]] | None = None) -> dict[str, Any]:
    """Every step for one host (what :func:`steps` gives, over :func:`removals`):
    ``unmount``, the recorded network mounts (*mounts*, component -> mount points)
    to unmount, and ``unbuilt``: what was taken away but whose removal is not built,
    a component or ``component (role, ...)`` (its services stay)."""
    out: dict[str, Any] = {**{kind: [] for kind in KINDS}, "unmount": [], "unbuilt": [],
                           "components": {}}
    for component, what in removals(recorded, wanted).items():
        found = steps(component, what["roles"], what["whole"])
        out["components"][component] = what
        if found is None:
            out["unbuilt"].append(component)
            continue
        if found["unbuilt"]:
            out["unbuilt"].append(f"{component} ({', '.join(found['unbuilt'])})")
        for kind in KINDS:
            out[kind] += [i for i in found[kind] if i not in out[kind]]
        if found["unmount"]:
            out["unmount"] += [p for p in (mounts or {}).get(component, ())
                               if p not in out["unmount"]]
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
