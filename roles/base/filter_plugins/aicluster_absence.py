"""Filters of desired absence (site.yml's absence and record plays, through the base
role's tasks absence.yml and record.yml): the very Python the pyinfra deploy runs
(aicluster.common.absence), so both engines record, remove and refuse alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aicluster.common.absence import (
    parse_slurped,
    parse_slurped_mounts,
    plan,
    record_text,
    refusals,
)
from aicluster.common.mounts import fstab_python_regexp
from aicluster.common.settings import layered


def absence_plan(slurped: Mapping[str, Any] | None, wanted: Mapping[str, Any],
                 host: str = "", remove_packages: Iterable[str] = (),
                 family: str | None = None, data: Mapping[str, Any] | None = None) -> dict:
    """What this host no longer runs (commands, services, after, files, reload, unmount,
    unbuilt, packages, software, components), from its slurped record, the inventory's
    ``aicluster_components`` and ``aicluster_remove_packages``, the host's name, its OS
    family (packages are named once it is known) and its variables (*data*)."""
    return plan(parse_slurped(slurped), wanted or {}, parse_slurped_mounts(slurped),
                host=host, remove_packages=remove_packages or (), family=family,
                settings_of=lambda component: layered(component, data or {}))


def absence_refusals(play_hosts: Iterable[str], hostvars: Any,
                     all_hosts: Iterable[str]) -> list[str]:
    """The removals that would break the cluster: the records of the hosts of the play
    (``base_absence_recorded``, slurped), against what every host is given now."""
    recorded = {h: parse_slurped(hostvars[h].get("base_absence_recorded"))
                for h in play_hosts}
    wanted = {h: dict(hostvars[h].get("aicluster_components") or {}) for h in all_hosts}
    return refusals(recorded, wanted)


def absence_record(wanted: Mapping[str, Any], mounts: Mapping[str, Any] | None = None) -> str:
    """The text of /etc/aicluster/components for a host given *wanted* (the inventory's
    ``aicluster_components``) and *mounts* (``aicluster_mounts``)."""
    return record_text(wanted or {}, mounts or {})


class FilterModule:
    def filters(self):
        return {
            "aicluster_absence_plan": absence_plan,
            "aicluster_absence_refusals": absence_refusals,
            "aicluster_absence_record": absence_record,
            # The fstab line mounting something at a path (the line pyinfra removes).
            "aicluster_fstab_regexp": fstab_python_regexp,
        }
