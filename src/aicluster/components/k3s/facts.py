"""What a node holds of k3s: the installed binary (its sha256 and version), whether
the service runs, the digest of the cluster token file (never the token), and the
interface that holds the node's cluster address.

Both engines run the very same shell (:func:`command_text`): pyinfra through the
:class:`K3sNode` fact, Ansible through the ``k3s_fact_command`` the inventory hands it.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from aicluster.components.k3s.probe import command_text, parse


class K3sNode(FactBase):
    """k3s on a node, as :func:`parse` describes it."""

    def default(self) -> dict:
        return parse([])

    def command(self, unit: str, node_ip: str) -> str:
        return command_text(unit, node_ip)

    def process(self, output) -> dict:
        return parse(output)
