"""Filters the base role uses: the very Python the pyinfra deploy runs
(aicluster.common.drift), so both engines read the live firewall table and sysctl values
with the same commands and see the same drift."""

from __future__ import annotations

from aicluster.common.drift import (
    nft_needs_load,
    nft_table_command,
    nft_table_state,
    parse_refused,
    parse_sysctl,
    sysctl_apply_command,
    sysctl_command,
    sysctl_drift,
    sysctl_refused,
)


def aicluster_sysctl_drift(lines, settings):
    """The keys of ``settings`` whose live value (the read command's output lines)
    differs, values the kernel refused before left out."""
    return sysctl_drift(settings, parse_sysctl(lines), parse_refused(lines))


def aicluster_sysctl_refused(lines, settings):
    """The keys whose wanted value the kernel refused at the last repair."""
    return sysctl_refused(settings, parse_sysctl(lines), parse_refused(lines))


def aicluster_nft_needs_load(lines):
    """The live table (the nft state command's output) is missing or differs."""
    return nft_needs_load(nft_table_state(lines))


class FilterModule:
    def filters(self):
        return {
            "aicluster_nft_table_command": nft_table_command,
            "aicluster_nft_state": nft_table_state,
            "aicluster_nft_needs_load": aicluster_nft_needs_load,
            "aicluster_sysctl_command": sysctl_command,
            "aicluster_sysctl_drift": aicluster_sysctl_drift,
            "aicluster_sysctl_refused": aicluster_sysctl_refused,
            "aicluster_sysctl_apply_command": sysctl_apply_command,
        }
