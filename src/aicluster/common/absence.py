"""Desired absence, engine-free: what a node recorded, what the inventory wants now,
what to take away, and which removals to refuse.

Each deploy ends by writing, on the node, :data:`RECORD` with the components the
inventory gave it and the roles (inventory groups) it holds in each, e.g.
``{"components": {"base": [], "slurm": ["slurm_controller", "slurm_workers"]}}``. The
next deploy reads it back (pyinfra: the ``RecordedComponents`` fact; Ansible: slurp)
and, for what was recorded but is no longer wanted, runs the checks and commands,
stops and disables the services, removes the configuration and unmounts the mounts
(recorded with the components) a component's ``derive.REMOVAL`` names. Packages stay
unless the inventory's ``remove_packages`` names the component; data (disks, pools,
buckets, exported directories, state directories) is never removed. A removal that
would break the cluster (each component's ``derive.removal_refusals``) stops the whole
run before any host is changed.

Both engines call the functions below, so they decide alike.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aicluster.components import derive_module
from aicluster.render import defaults, os_vars

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
#: component's own name, for taking it off altogether), in the order they run:
#: ``commands`` (shell, before anything stops: a check that fails the host before
#: anything is taken away, or a step the services' stop does not do), ``services``
#: (stopped and disabled), ``after`` (shell, once those services are stopped),
#: ``files`` (removed), ``reload`` (services reloaded when a file was removed). ``{host}``
#: in any of them is the host's name. Besides these, an entry may say
#: ``"unmount": True`` (the mounts the component recorded on the host are unmounted
#: and their fstab lines removed), ``"unbuilt": True`` (its removal is not built: the
#: deploy names it in a warning and its services keep running), ``"packages"`` (names
#: of the component's OS variables, ``roles/<component>/vars/<family>.yml``, whose
#: packages are removed when the inventory's ``remove_packages`` names the component)
#: and ``"software"`` (paths of what the component installs outside the package
#: manager, removed with its packages).
KINDS = ("commands", "services", "after", "files", "reload")


def whole_key(component: str, spec: Mapping[str, Any]) -> str:
    """The entry of a component's ``derive.REMOVAL`` for taking the component itself
    away: its name, or ``<component>:all`` where the spec has that entry, for a
    component one of whose roles has the component's own name (monitoring: the
    ``monitoring`` group is its server side, while every node of a monitored cluster
    runs its agents; a host leaving the group loses the server side only)."""
    return f"{component}:all" if f"{component}:all" in spec else component


def steps(component: str, roles: Iterable[str], whole: bool,
          host: str = "") -> dict[str, Any] | None:
    """The steps of each kind (:data:`KINDS`) for taking *roles* (and, when *whole*, the
    component itself) off *host*; ``unmount`` (whether its recorded mounts go),
    ``unbuilt`` (the roles whose removal is not built), ``packages`` (OS variable
    names) and ``software`` (paths). None when the component declares no removal."""
    spec = removal_spec(component)
    if spec is None:
        return None
    keys = [*roles, *([whole_key(component, spec)] if whole else [])]
    out: dict[str, Any] = {kind: [] for kind in (*KINDS, "packages", "software")}
    out["unmount"], out["unbuilt"] = False, []
    for key in keys:
        entry = spec.get(key, {})
        for kind in (*KINDS, "packages", "software"):
            for item in entry.get(kind, []):
                item = item.replace("{host}", host)
                if item not in out[kind]:
                    out[kind].append(item)
        out["unmount"] = out["unmount"] or bool(entry.get("unmount"))
        if entry.get("unbuilt"):
            out["unbuilt"].append(key)
    return out


def package_names(component: str, variables: Iterable[str], family: str) -> list[str]:
    """The packages the component's OS *variables* name on *family* (a variable may
    hold one name or a list; a name that is no variable there is a package name)."""
    found = os_vars(component, family)
    out: list[str] = []
    for name in variables:
        value = found.get(name, [] if "_" in name else name) or []
        for package in [value] if isinstance(value, str) else value:
            if package not in out:
                out.append(str(package))
    return out


def plan(recorded: Roles, wanted: Roles,
         mounts: Mapping[str, Iterable[str]] | None = None, *, host: str = "",
         remove_packages: Iterable[str] = (), family: str | None = None,
         settings_of: Callable[[str], Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Every step for one host (what :func:`steps` gives, over :func:`removals`):
    ``unmount``, the recorded mounts (*mounts*, component -> mount points) to
    unmount; ``unbuilt``, what was taken away but whose removal is not built, a
    component or ``component (role, ...)`` (its services stay); ``packages`` and
    ``software``, what is uninstalled, for the components *remove_packages* names
    (packages on *family*, when known; ``packages_wanted`` says whether any is).
    A ``{setting}`` in a file's or software's path is the component's setting on the
    host, ``settings_of(component)`` (default: the component's defaults)."""
    out: dict[str, Any] = {**{kind: [] for kind in KINDS}, "unmount": [], "unbuilt": [],
                           "packages": [], "software": [], "packages_wanted": False,
                           "components": {}}
    uninstall = set(remove_packages)

    def add(kind: str, items: Iterable[str], component: str) -> None:
        for item in items:
            if kind in ("files", "software") and "{" in item:
                item = item.format_map((settings_of or defaults)(component))
            if item not in out[kind]:
                out[kind].append(item)

    for component, what in removals(recorded, wanted).items():
        found = steps(component, what["roles"], what["whole"], host)
        out["components"][component] = what
        if found is None:
            out["unbuilt"].append(component)
            continue
        if found["unbuilt"]:
            out["unbuilt"].append(f"{component} ({', '.join(found['unbuilt'])})")
        for kind in KINDS:
            add(kind, found[kind], component)
        if found["unmount"]:
            add("unmount", (mounts or {}).get(component, ()), component)
        if component in uninstall:
            out["packages_wanted"] = out["packages_wanted"] or bool(found["packages"])
            add("software", found["software"], component)
            if family is not None:
                add("packages", package_names(component, found["packages"], family),
                    component)
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
