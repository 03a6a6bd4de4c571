"""Filters the nvme_cache role uses: the very Python the pyinfra deploy runs
(aicluster.common.disks, aicluster.components.nvme_cache.derive), so both engines decide alike
whether a drive may be touched. A role of another storage component (ceph, minio)
imports ``aicluster.common.disks`` in a filter plugin of its own the same way."""

from __future__ import annotations

from aicluster.common.disks import check_devices, parse
from aicluster.components.nvme_cache.derive import plan_from_output


def aicluster_disk_check(lines, wanted, ours=()):
    """The disk-safety rule on the output of the block-device fact's command."""
    return check_devices(parse(lines), wanted, ours)


class FilterModule:
    def filters(self):
        return {
            "aicluster_disk_check": aicluster_disk_check,
            "aicluster_nvme_cache_plan": plan_from_output,
        }
