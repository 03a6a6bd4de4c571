"""Filters the slurm role uses: the very Python the pyinfra deploy runs
(aicluster.components.slurm.derive), so both engines decide alike."""

from __future__ import annotations

from aicluster.common.versions import version_matches
from aicluster.components.slurm.derive import gres_autodetect_probed, restart_needed


class FilterModule:
    def filters(self):
        return {
            "aicluster_slurm_restart_needed": restart_needed,
            "aicluster_slurm_version_matches": version_matches,
            "aicluster_slurm_gres_autodetect": gres_autodetect_probed,
        }
