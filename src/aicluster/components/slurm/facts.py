"""Facts the slurm deploy reads on a node before it changes anything."""

from __future__ import annotations

from pyinfra.api import FactBase

from aicluster.common.facts import ParsedFact, YesNoFact
from aicluster.components.slurm.probe import (
    CGROUP_COMMAND,
    NVIDIA_COMMAND,
    NVML_COMMAND,
    parse_nvml,
)


class CgroupWritable(YesNoFact):
    """True when Slurm's cgroup plugins can work here (cgroups mounted read-write)."""

    shell = CGROUP_COMMAND


class NvidiaDriver(YesNoFact):
    """True when the NVIDIA kernel driver is loaded (not merely installed)."""

    shell = NVIDIA_COMMAND


class NvmlPlugin(ParsedFact):
    """Slurm's gpu/nvml plugin: its path, the package (and version) that owns it and the
    installed slurmd's version (``{plugin, package, version, slurmd}``, None where there
    is none)."""

    shell = NVML_COMMAND
    parse = staticmethod(parse_nvml)


class SlurmConf(FactBase):
    """The node's current slurm.conf ("" when there is none)."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    def command(self) -> str:
        return "cat /etc/slurm/slurm.conf 2>/dev/null || true"

    def process(self, output):
        return "\n".join(output)

    default = str


class MariadbUser(FactBase):
    """True when slurmdbd's database and MariaDB user exist."""

    def command(self, database: str) -> str:
        return (
            "mysql -N -B -e \"SELECT COUNT(*) FROM mysql.user WHERE user = 'slurm'; "
            f"SHOW DATABASES LIKE '{database}'\" 2>/dev/null || true"
        )

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return len(lines) >= 2 and lines[0] != "0"

    default = bool
