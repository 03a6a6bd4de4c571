"""Filters the network role (and infiniband's IPoIB) use: the very Python the pyinfra deploy runs
(aicluster.components.network.derive, aicluster.components.network.probe), so both engines
choose the renderer, the files, the commands and the refusals alike."""

from __future__ import annotations

from aicluster.common.netconf import apply_commands, render_files, renderer, rollback_commands
from aicluster.components.network.derive import (
    management_refusal,
    missing_nics,
    mtu_drift,
    touches,
)
from aicluster.components.network.probe import parse_interfaces, parse_management


def _refusal(ids, host_name, mgmt):
    return management_refusal(host_name, mgmt, list(ids))


def _rollback(items, renderer_name, paths, seconds):
    arm, confirm = rollback_commands(renderer_name, list(paths), list(items), int(seconds))
    return {"arm": arm, "confirm": confirm}


class FilterModule:
    def filters(self):
        return {
            "aicluster_network_parse_interfaces": parse_interfaces,
            "aicluster_network_parse_management": parse_management,
            "aicluster_network_renderer": renderer,
            "aicluster_network_files": render_files,
            "aicluster_network_apply_commands": lambda items, r: apply_commands(r, items),
            "aicluster_network_touches": touches,
            "aicluster_network_refusal": _refusal,
            "aicluster_network_missing_nics": missing_nics,
            "aicluster_network_mtu_drift": mtu_drift,
            "aicluster_network_rollback": _rollback,
        }
