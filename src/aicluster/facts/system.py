"""Small facts about a node's system that several deploys ask: whether it is a
container, whether an nftables table is loaded, which files a glob matches.

They are fact classes rather than ``server.Command`` reads so that
:mod:`aicluster.facts.memo` remembers them between runs and reads them with all the
others in one command (arbitrary commands are never remembered).
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class ContainerVirt(FactBase):
    """The container technology the node runs in (``systemd-nspawn``, ``lxc``,
    ``docker`` ...), or ``None`` on bare metal or a VM (``systemd-detect-virt``)."""

    def command(self) -> str:
        return "systemd-detect-virt --container 2>/dev/null || true"

    def process(self, output):
        value = "\n".join(output).strip()
        return None if value in ("", "none") else value


class NftTable(FactBase):
    """Whether the nftables table ``family table`` is loaded (False without nft)."""

    def command(self, family: str, table: str) -> str:
        return (f"nft list table {shlex.quote(family)} {shlex.quote(table)} >/dev/null 2>&1 "
                "&& echo yes || echo no")

    def process(self, output):
        return "\n".join(output).strip() == "yes"


class GlobPaths(FactBase):
    """The paths a shell glob matches, sorted (an empty list when none)."""

    def command(self, pattern: str) -> str:
        # The pattern is a glob: it is expanded by the shell, so it is not quoted.
        return f"ls -1d {pattern} 2>/dev/null || true"

    def process(self, output):
        return sorted(line for line in (x.strip() for x in output) if line)
