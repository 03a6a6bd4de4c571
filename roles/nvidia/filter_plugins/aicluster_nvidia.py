"""Filters the nvidia role uses: the very Python the pyinfra deploy runs
(aicluster.components.nvidia.probe, aicluster.components.nvidia.derive), so both engines decide
alike."""

from __future__ import annotations

from aicluster.components.nvidia.derive import decide, repo_dirs
from aicluster.components.nvidia.probe import parse


def _decide(node, settings, host_name, distro_id, installed_packages=None):
    return decide(dict(settings), node, host_name, distro_id, list(installed_packages or []))


class FilterModule:
    def filters(self):
        return {
            "aicluster_nvidia_parse": parse,
            "aicluster_nvidia_decide": _decide,
            "aicluster_nvidia_repo_dirs": repo_dirs,
        }
