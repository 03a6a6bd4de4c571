"""Filters the ceph role uses: the very Python the pyinfra deploy runs
(aicluster.components.ceph.derive, aicluster.common.disks), so both engines derive the same
keys and decide alike whether a device may become an OSD. Filters run on the
deploying machine: the cluster's secret is read there and never leaves it (only the
keyrings this host needs are copied, with no_log)."""

from __future__ import annotations

from aicluster.common.epel import needs_crb
from aicluster.components.ceph.derive import (
    decide_from_output,
    mgr_commands,
    mon_mkfs_command,
    pool_commands,
    release_packages,
    repo_suite,
    secrets,
)


def aicluster_ceph_secrets(ref, name, size, fsid, entities, host_name, roles, client_name,
                           check_mode=False):
    """The fsid, this host's keyrings and the key digests
    (aicluster.components.ceph.derive.secrets); in check mode a missing secret file is
    not generated."""
    return secrets(ref, name, size, fsid, entities, host_name, roles, client_name,
                   dry=bool(check_mode))


def aicluster_ceph_decide(block_lines, ceph_lines, request, fsid, digests, suite=""):
    return decide_from_output(block_lines, ceph_lines, request, fsid, digests, suite)


def aicluster_ceph_repo_suite(family, distribution, version, codename=""):
    """The system's directory in Ceph's repository, from Ansible's facts (os_family,
    distribution, distribution_version, distribution_release)."""
    return repo_suite(str(family), str(distribution), str(version), str(codename or ""))


def aicluster_ceph_release_packages(source, release, release_pkgs, prepare_pkgs):
    """What is installed before Ceph (the Storage SIG's release package, or EPEL)."""
    return release_packages({"ceph_source": source, "ceph_release": release,
                             "ceph_release_packages": release_pkgs,
                             "ceph_repo_prepare_packages": prepare_pkgs})


def aicluster_ceph_needs_crb(packages):
    """Installing these before Ceph installs EPEL (EL9): CodeReady Builder first."""
    return needs_crb(list(packages or []))


def aicluster_ceph_mon_mkfs(fsid, name, mons, msgr2):
    return mon_mkfs_command(fsid, name, mons, msgr2)


def aicluster_ceph_pool_commands(plan, timeout):
    return pool_commands(plan, timeout)


def aicluster_ceph_mgr_commands(plan, timeout):
    return mgr_commands(plan, timeout)


class FilterModule:
    def filters(self):
        return {
            "aicluster_ceph_secrets": aicluster_ceph_secrets,
            "aicluster_ceph_decide": aicluster_ceph_decide,
            "aicluster_ceph_repo_suite": aicluster_ceph_repo_suite,
            "aicluster_ceph_release_packages": aicluster_ceph_release_packages,
            "aicluster_ceph_needs_crb": aicluster_ceph_needs_crb,
            "aicluster_ceph_mon_mkfs": aicluster_ceph_mon_mkfs,
            "aicluster_ceph_pool_commands": aicluster_ceph_pool_commands,
            "aicluster_ceph_mgr_commands": aicluster_ceph_mgr_commands,
        }
