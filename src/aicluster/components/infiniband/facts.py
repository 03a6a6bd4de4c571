"""InfiniBand and RoCE ports, read from ``/sys/class/infiniband`` (no tool needed):
each HCA port's device, port number, state, rate, link layer and the IPoIB (or RoCE)
network interface on it. A node without an HCA, or without the directory, reads as
none (an empty list), never as an error. The Ansible role runs the same shell
(:data:`PORTS_COMMAND`) and parses it with :func:`parse` through its filter plugin.
"""

from __future__ import annotations

from aicluster.common.facts import ParsedFact
from aicluster.components.infiniband.probe import PORTS_COMMAND, parse


class InfinibandPorts(ParsedFact):
    """Every InfiniBand/RoCE port of the node (empty without an HCA)."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True
    shell = PORTS_COMMAND
    parse = staticmethod(parse)
