"""Two reads the Slurm component takes from its nodes: whether cgroup v2 is writable for
slurmd, and whether an NVIDIA driver is loaded.
"""

from __future__ import annotations

#: Whether the node may write its cgroups: cgroup v2 at /sys/fs/cgroup mounted
#: read-write with the cpuset and memory controllers Slurm needs, or v1's freezer
#: hierarchy mounted read-write. In containers they are read-only or not delegated.
CGROUP_COMMAND = (
    "if [ -f /sys/fs/cgroup/cgroup.controllers ]; then t=/sys/fs/cgroup; "
    "grep -qw cpuset $t/cgroup.controllers && grep -qw memory $t/cgroup.controllers "
    "|| t=/nonexistent; else t=/sys/fs/cgroup/freezer; fi; "
    'if [ -d "$t" ] && awk -v t="$t" \'$2 == t { split($4, o, ","); if (o[1] == "rw") f = 1 } '
    "END { exit !f }' /proc/mounts && [ -w \"$t\" ]; then echo yes; else echo no; fi"
)
NVIDIA_COMMAND = "test -r /proc/driver/nvidia/version && echo yes || echo no"

