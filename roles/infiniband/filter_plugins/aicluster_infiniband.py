"""Filters the infiniband role uses: the very Python the pyinfra deploy runs
(aicluster.components.infiniband.derive, aicluster.components.infiniband.probe), so both engines
read the HCA ports, decide about opensm and build the IPoIB interfaces alike. The network role's
filters (aicluster_network_*) write the IPoIB interfaces."""

from __future__ import annotations

from aicluster.common.drift import missing_modules, modules_command, parse_modules
from aicluster.common.netconf import (
    apply_commands,
    ipoib_interfaces,
    render_files,
    renderer,
    rollback_commands,
)
from aicluster.components.infiniband.derive import missing_ports, opensm_decision, with_netdevs
from aicluster.components.infiniband.probe import parse
from aicluster.components.network.derive import touches


def _ipoib(ports, found, host_name):
    """IPoIB interfaces (the network model) of the ports the node has a netdev for."""
    return ipoib_interfaces(with_netdevs(ports, found), host_name)


def _decision(found, variables):
    run, why = opensm_decision(variables, found)
    return {"run": run, "why": why}


class FilterModule:
    def filters(self):
        return {
            "aicluster_infiniband_parse": parse,
            "aicluster_infiniband_missing_ports": lambda declared, host, found: missing_ports(
                host, declared, found
            ),
            "aicluster_infiniband_opensm": _decision,
            "aicluster_infiniband_ipoib": _ipoib,
            "aicluster_infiniband_with_netdevs": with_netdevs,
            # Loaded kernel modules (aicluster.common.drift, as the pyinfra deploy reads them).
            "aicluster_modules_command": modules_command,
            "aicluster_modules_parse": parse_modules,
            "aicluster_modules_missing": missing_modules,
            # The network role's, for the IPoIB interfaces (a role's filters are its own).
            "aicluster_network_renderer": renderer,
            "aicluster_network_files": render_files,
            "aicluster_network_apply_commands": lambda items, r: apply_commands(r, items),
            "aicluster_network_touches": touches,
            "aicluster_network_rollback": lambda items, r, paths, s: dict(
                zip(("arm", "confirm"), rollback_commands(r, list(paths), list(items), int(s)),
                    strict=True)
            ),
        }
