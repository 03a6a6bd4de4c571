"""What a node has of Ethernet: its interfaces (name, MAC, MTU, state, speed, kind)
and which one holds the address the deploy connects through (the management NIC).

Both read ``/sys/class/net`` and ``ip`` only; a machine without ``ip`` reads as
"none" (no management interface known), never as an error. The Ansible role runs the
very same shell (:data:`INTERFACES_COMMAND`) and parses it with the same
:func:`parse_interfaces` through its filter plugin.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from aicluster.common.facts import ParsedFact
from aicluster.components.network.probe import (
    INTERFACES_COMMAND,
    management_command,
    parse_interfaces,
    parse_management,
)


class NetworkInterfaces(ParsedFact):
    """The node's network interfaces, as :func:`parse_interfaces` describes them."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True
    shell = INTERFACES_COMMAND
    parse = staticmethod(parse_interfaces)


class ManagementInterface(FactBase):
    """The interface holding the address the deploy connects through, or None."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    requires_command = "ip"

    def command(self, address: str) -> str:
        return management_command(address)

    def process(self, output) -> dict | None:
        return parse_management(output)

    def default(self):
        return None
