"""Filters the monitoring role uses: the very Python the pyinfra deploy runs, so both
engines decide alike."""

from __future__ import annotations

from aicluster.common.versions import version_matches


def aicluster_monitoring_version_matches(installed, wanted):
    """Whether any installed version of a package is the pinned one (an empty pin: any)."""
    versions = [installed] if isinstance(installed, str) else list(installed or [])
    return any(version_matches(str(v), str(wanted or "")) for v in versions)


class FilterModule:
    def filters(self):
        return {"aicluster_monitoring_version_matches": aicluster_monitoring_version_matches}
