"""What the node's kernel offers NFS: the client (nfs, nfs4), the server (nfsd) and
rpc_pipefs, each either registered in ``/proc/filesystems`` already or loadable as a
module (``modprobe -n``). A node where neither holds (a container such as the local
testbed's nodes, a kernel built without NFS) reads as "no", never as an error. The
Ansible role runs the same shell (:data:`KERNEL_COMMAND`) and parses its output with
:func:`parse` through its filter plugin.
"""

from __future__ import annotations

from aicluster.common.facts import ParsedFact
from aicluster.components.nfs.probe import KERNEL_COMMAND, parse


class NfsKernel(ParsedFact):
    """The kernel's NFS client, server and rpc_pipefs (present or loadable)."""

    shell = KERNEL_COMMAND
    parse = staticmethod(parse)
