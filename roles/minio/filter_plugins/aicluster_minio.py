"""Filters the minio role uses: the very Python the pyinfra deploy runs
(aicluster.components.minio.derive, aicluster.components.minio.probe, aicluster.common.disks,
aicluster.common.minio_credentials),
so both engines decide alike what may be done with a drive, when every server restarts, which
buckets need mc, and derive the same root password. Filters run on the deploying machine: the
root secret is read there (the tasks that touch it have no_log)."""

from __future__ import annotations

from aicluster.common.minio_credentials import root_password
from aicluster.components.minio.derive import (
    bucket_commands,
    node_current,
    old_releases,
    plan_from_output,
)
from aicluster.components.minio.probe import parse


def aicluster_minio_root_password(ref, name, size, check_mode=False):
    """In check mode a missing secret file is not generated."""
    return root_password(ref, name, size, dry=bool(check_mode))


class FilterModule:
    def filters(self):
        return {
            "aicluster_minio_state": parse,
            "aicluster_minio_plan": plan_from_output,
            "aicluster_minio_root_password": aicluster_minio_root_password,
            "aicluster_minio_node_current": node_current,
            "aicluster_minio_bucket_commands": bucket_commands,
            "aicluster_minio_old_releases": old_releases,
        }
