"""Mounting a filesystem and proving it is mounted: the one command both engines run
for every mount the deploy makes (the NVMe cache, NFS, CephFS, MinIO's drives).

``mount`` does not always say when it failed: a FUSE helper (``mount.fuse.ceph``) can
exit 0 while ``ceph-fuse`` found no ``/dev/fuse``. So the command asks ``findmnt``
afterwards whether the mount point holds a filesystem of the expected type (waiting a
few seconds for a FUSE daemon to finish mounting) and fails, with the source, the
mount point and ``mount``'s own message, when it does not. A deploy never reports a
mount that is not there.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

FSTAB = "/etc/fstab"

#: Seconds to wait for the mount point to show the filesystem after ``mount`` returned.
MOUNT_WAIT_SECONDS = 15


def mount_command(path: str, fstypes: Iterable[str], source: str,
                  wait: int = MOUNT_WAIT_SECONDS) -> str:
    """A ``sh`` command: ``mount PATH`` (its fstab entry), then succeed only when
    ``findmnt`` shows a filesystem of one of *fstypes* at *path*; otherwise print
    ``<source> is not mounted at <path> ...`` with ``mount``'s exit status and output
    on stderr and exit 1. *source* names the device or server for the message."""
    types = " ".join(sorted(set(fstypes)))
    if not types:
        raise ValueError("mount_command needs at least one filesystem type")
    p = shlex.quote(path)
    message = shlex.quote(f"{source} is not mounted at {path}")
    return (
        f"out=$(mount {p} 2>&1); rc=$?; n=0; "
        f"while :; do t=$(findmnt -rn -o FSTYPE --mountpoint {p} | tail -n 1); "
        f"case ' {types} ' in *\" $t \"*) [ -n \"$t\" ] && exit 0 ;; esac; "
        f"[ $n -ge {int(wait)} ] && break; n=$((n + 1)); sleep 1; done; "
        f"echo {message}\" (mount exited $rc; the mount point has "
        f"${{t:-no filesystem}}, expected {types}): ${{out:-mount printed nothing}}\" >&2; "
        f"exit 1"
    )


def fstab_regexp(path: str) -> str:
    """The fstab line that mounts something at *path*, as a POSIX extended regular
    expression (grep -E and sed -E, for pyinfra's files.line)."""
    return rf"^[^#[:space:]]+[[:space:]]+{path.replace('.', '[.]')}[[:space:]]"


def fstab_python_regexp(path: str) -> str:
    """The same line as a Python regular expression (Ansible's lineinfile)."""
    return rf"^[^#\s]+\s+{re.escape(path)}\s"
