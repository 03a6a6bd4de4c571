"""Three reads the Slurm component takes from its nodes: whether cgroup v2 is writable for
slurmd, whether an NVIDIA driver is loaded, and whether Slurm's NVML GPU plugin is installed
at slurmd's version.
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


#: Where distributions put Slurm's plugins: Debian and Ubuntu (slurm-wlm, one directory
#: per multiarch triplet), EL (EPEL's and SchedMD's RPMs), a plain ``make install``
#: layout last.
NVML_PLUGIN_PATHS = (
    "/usr/lib/*/slurm-wlm/gpu_nvml.so",
    "/usr/lib64/slurm/gpu_nvml.so",
    "/usr/lib/slurm/gpu_nvml.so",
)

#: Slurm's gpu/nvml plugin (``AutoDetect=nvml`` needs it) and whether it belongs to the
#: installed slurmd: ``plugin PATH`` when the file exists, ``package NAME VERSION`` of the
#: package that owns it, ``slurmd VERSION`` of the installed slurmd package (dpkg or rpm).
#: No line for what is not there. Debian ships the plugin apart from slurmd (contrib's
#: slurm-wlm-nvml-plugin, built against one Slurm version).
NVML_COMMAND = (
    "p=; for f in " + " ".join(NVML_PLUGIN_PATHS) + "; do "
    "[ -f \"$f\" ] && { p=$f; break; }; done; "
    "if [ -n \"$p\" ]; then echo \"plugin $p\"; fi; "
    "if command -v dpkg-query >/dev/null 2>&1; then "
    "if [ -n \"$p\" ]; then o=$({ dpkg-query -S \"$p\" || dpkg-query -S \"${p#/usr}\"; } "
    "2>/dev/null | sed -n '1s/: .*//p'); "
    "[ -n \"$o\" ] && echo \"package $o $(dpkg-query -W -f '${Version}' \"$o\" 2>/dev/null)\"; fi; "
    "s=$(dpkg-query -W -f '${Status} ${Version}' slurmd 2>/dev/null); "
    "case \"$s\" in *' installed '*) echo \"slurmd ${s##* }\";; esac; "
    "elif command -v rpm >/dev/null 2>&1; then "
    "if [ -n \"$p\" ]; then rpm -qf --qf 'package %{NAME} %{VERSION}-%{RELEASE}\\n' \"$p\" "
    "2>/dev/null | grep '^package ' | head -n 1; fi; "
    "rpm -q --qf 'slurmd %{VERSION}-%{RELEASE}\\n' slurm-slurmd 2>/dev/null | grep '^slurmd '; "
    "fi; true"
)


def parse_nvml(lines) -> dict:
    """``{plugin, package, version, slurmd}`` from :data:`NVML_COMMAND`'s output (None
    for what it did not print)."""
    out: dict = {"plugin": None, "package": None, "version": None, "slurmd": None}
    for line in lines or []:
        parts = str(line).split()
        if len(parts) == 2 and parts[0] == "plugin":
            out["plugin"] = parts[1]
        elif len(parts) == 3 and parts[0] == "package":
            out["package"], out["version"] = parts[1], parts[2]
        elif len(parts) == 2 and parts[0] == "slurmd":
            out["slurmd"] = parts[1]
    return out
