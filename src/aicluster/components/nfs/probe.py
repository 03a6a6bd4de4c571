"""Whether the node's kernel can serve and mount NFS: the filesystems it has registered
and the modules modprobe could load, read without loading anything.
"""

from __future__ import annotations

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

