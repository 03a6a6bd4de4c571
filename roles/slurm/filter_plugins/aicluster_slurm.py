"""Filters the slurm role uses: the very Python the pyinfra deploy runs
(aicluster.components.slurm.derive), so both engines decide alike."""

from __future__ import annotations

from aicluster.common.epel import needs_crb
from aicluster.common.versions import version_matches
from aicluster.components.slurm.derive import gres_autodetect_probed, restart_needed


def aicluster_slurm_needs_crb(packages):
    """Installing these before Slurm installs EPEL (EL9): CodeReady Builder first."""
    return needs_crb(list(packages or []))


class FilterModule:
    def filters(self):
        return {
            "aicluster_slurm_restart_needed": restart_needed,
            "aicluster_slurm_version_matches": version_matches,
            "aicluster_slurm_gres_autodetect": gres_autodetect_probed,
            "aicluster_slurm_needs_crb": aicluster_slurm_needs_crb,
        }
