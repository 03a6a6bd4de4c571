"""What the node's kernel offers NFS: the client (nfs, nfs4), the server (nfsd) and
rpc_pipefs, each either registered in ``/proc/filesystems`` already or loadable as a
module (``modprobe -n``). A node where neither holds (a container such as the local
testbed's nodes, a kernel built without NFS) reads as "no", never as an error. The
Ansible role runs the same shell (:data:`KERNEL_COMMAND`) and parses its output with
:func:`parse` through its filter plugin.
"""

from __future__ import annotations

from pyinfra.api import FactBase

#: ``fs=NAME`` for each NFS-related filesystem the kernel has registered, and
#: ``module=NAME`` for each module modprobe could load (dry run: nothing is loaded).
KERNEL_COMMAND = (
    "for fs in nfs nfs4 nfsd rpc_pipefs; do "
    "grep -qw \"$fs\" /proc/filesystems 2>/dev/null && echo \"fs=$fs\"; done; "
    "for m in nfs nfsd sunrpc; do "
    "modprobe -n -q \"$m\" 2>/dev/null && echo \"module=$m\"; done; true"
)


def parse(lines) -> dict:
    """``{filesystems, modules, client, server, rpc_pipefs}`` from the command's output:
    ``client``/``server``/``rpc_pipefs`` are True when the kernel has that part of NFS
    or can load it."""
    fs: list[str] = []
    modules: list[str] = []
    for line in lines:
        key, _, value = str(line).strip().partition("=")
        if key == "fs" and value:
            fs.append(value)
        elif key == "module" and value:
            modules.append(value)
    return {
        "filesystems": fs,
        "modules": modules,
        "client": bool({"nfs", "nfs4"} & set(fs)) or "nfs" in modules,
        "server": "nfsd" in fs or "nfsd" in modules,
        "rpc_pipefs": "rpc_pipefs" in fs or "sunrpc" in modules,
    }


class NfsKernel(FactBase):
    """The kernel's NFS client, server and rpc_pipefs (present or loadable)."""

    def command(self) -> str:
        return KERNEL_COMMAND

    def process(self, output):
        return parse(output)

    @staticmethod
    def default():
        return parse([])
