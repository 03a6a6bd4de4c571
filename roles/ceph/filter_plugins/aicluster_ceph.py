"""Filters the ceph role uses: the very Python the pyinfra deploy runs
(aicluster.components.ceph.derive, aicluster.common.disks), so both engines derive the same
keys and decide alike whether a device may become an OSD. Filters run on the
deploying machine: the cluster's secret is read there and never leaves it (only the
keyrings this host needs are copied, with no_log)."""

from __future__ import annotations

from aicluster.components.ceph.derive import (
    decide_from_output,
    mon_mkfs_command,
    pool_commands,
    secrets,
)


def aicluster_ceph_secrets(ref, name, size, fsid, entities, host_name, roles, client_name,
                           check_mode=False):
    """The fsid, this host's keyrings and the key digests
    (aicluster.components.ceph.derive.secrets); in check mode a missing secret file is
    not generated."""
    return secrets(ref, name, size, fsid, entities, host_name, roles, client_name,
                   dry=bool(check_mode))


def aicluster_ceph_decide(block_lines, ceph_lines, request, fsid, digests):
    return decide_from_output(block_lines, ceph_lines, request, fsid, digests)


def aicluster_ceph_mon_mkfs(fsid, name, mons, msgr2):
    return mon_mkfs_command(fsid, name, mons, msgr2)


def aicluster_ceph_pool_commands(plan, timeout):
    return pool_commands(plan, timeout)


class FilterModule:
    def filters(self):
        return {
            "aicluster_ceph_secrets": aicluster_ceph_secrets,
            "aicluster_ceph_decide": aicluster_ceph_decide,
            "aicluster_ceph_mon_mkfs": aicluster_ceph_mon_mkfs,
            "aicluster_ceph_pool_commands": aicluster_ceph_pool_commands,
        }
