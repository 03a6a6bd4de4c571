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


def absence_plan(slurped: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> dict:
    """What this host no longer runs (services, files, reload, unmount, unbuilt,
    components), from its slurped record and the inventory's ``aicluster_components``."""
    return plan(parse_slurped(slurped), wanted or {}, parse_slurped_mounts(slurped))


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
