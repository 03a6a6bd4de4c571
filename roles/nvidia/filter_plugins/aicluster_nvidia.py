"""Filters the nvidia role uses: the very Python the pyinfra deploy runs
(aicluster.facts.nvidia, aicluster.deploys.nvidia), so both engines decide alike."""

from __future__ import annotations

from aicluster.deploys.nvidia import decide, repo_dirs
from aicluster.facts.nvidia import parse


def _decide(node, settings, host_name, distro_id, installed_packages=None):
    return decide(dict(settings), node, host_name, distro_id, list(installed_packages or []))


class FilterModule:
    def filters(self):
        return {
            "aicluster_nvidia_parse": parse,
            "aicluster_nvidia_decide": _decide,
            "aicluster_nvidia_repo_dirs": repo_dirs,
        }
