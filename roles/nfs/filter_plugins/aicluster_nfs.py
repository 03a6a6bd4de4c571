"""Filters the nfs role uses: the very Python the pyinfra deploy runs
(aicluster.components.nfs.probe, aicluster.components.nfs.derive), so both engines decide alike."""

from __future__ import annotations

from aicluster.components.nfs.derive import client_skip_reason, server_problem
from aicluster.components.nfs.probe import parse


class FilterModule:
    def filters(self):
        return {
            "aicluster_nfs_kernel": parse,
            "aicluster_nfs_client_skip": client_skip_reason,
            "aicluster_nfs_server_problem": server_problem,
        }
