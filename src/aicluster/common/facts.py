"""The two shapes of the components' own facts (a yes/no answer, a fixed command's
parsed output), and small facts about a node's system that several deploys ask: whether
it is a container, whether an nftables table is loaded, which files a glob matches, the block
devices the inventory names (:mod:`aicluster.common.disks` reads them), whether EL9's
CodeReady Builder is enabled (:mod:`aicluster.common.epel`).

They are fact classes rather than ``server.Command`` reads so that
:mod:`aicluster.accel.memo` remembers them between runs and reads them with all the
others in one command (arbitrary commands are never remembered).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from pyinfra.api import FactBase

from aicluster.common import drift, epel
from aicluster.common.absence import RECORD, parse_record, parse_record_mounts
from aicluster.common.disks import command_text, parse
from aicluster.common.stamps import applied_command


class YesNoFact(FactBase):
    """A fact whose one shell text (``shell``, each subclass its own) prints ``yes`` or
    ``no``: True when it printed ``yes``."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True
    shell: str

    def command(self) -> str:
        return self.shell

    def process(self, output):
        return "".join(output).strip() == "yes"

    default = bool


class ParsedFact(FactBase):
    """A fact whose one shell text (``shell``) prints lines that ``parse`` (each subclass
    its own, a staticmethod) reads; with no output, what ``parse`` makes of none."""

    shell: str
    parse: Callable[[list[str]], Any]

    def command(self) -> str:
        return self.shell

    def process(self, output):
        return self.parse(output)

    def default(self):
        return self.parse([])


class ContainerVirt(FactBase):
    """The container technology the node runs in (``systemd-nspawn``, ``lxc``,
    ``docker`` ...), or ``None`` on bare metal or a VM (``systemd-detect-virt``).
    Where systemd runs in a container it has recorded which in /run/systemd/container,
    one of the files systemd-detect-virt reads: that file, read by the shell, spares
    starting systemd-detect-virt there."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    def command(self) -> str:
        return ("{ read -r c < /run/systemd/container && [ -n \"$c\" ] && echo \"$c\"; } "
                "2>/dev/null || systemd-detect-virt --container 2>/dev/null || true")

    def process(self, output):
        value = "\n".join(output).strip()
        return None if value in ("", "none") else value


class CrbEnabled(YesNoFact):
    """Whether CodeReady Builder (CRB) is enabled on an EL9 node, read from its .repo
    files (:data:`aicluster.common.epel.CRB_STATE_COMMAND`); False elsewhere."""

    shell = epel.CRB_STATE_COMMAND


class NftTable(FactBase):
    """Whether the nftables table ``family table`` is loaded (False without nft)."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    def command(self, family: str, table: str) -> str:
        return (f"nft list table {shlex.quote(family)} {shlex.quote(table)} >/dev/null 2>&1 "
                "&& echo yes || echo no")

    def process(self, output):
        return "\n".join(output).strip() == "yes"


class NftTableDrift(FactBase):
    """Whether the live nftables table matches the rules file: one of
    :data:`aicluster.common.drift.NFT_STATES` (``absent``, ``same``, ``different`` ...),
    compared in nft's own form (:func:`aicluster.common.drift.nft_table_command`)."""

    def default(self) -> str:
        return "no-nft"

    def command(self, rules_file: str, family: str = "inet", table: str = "aicluster") -> str:
        return drift.nft_table_command(rules_file, family, table)

    def process(self, output):
        return drift.nft_table_state(output)


class SysctlValues(FactBase):
    """The live values of the given sysctl keys and the values the last drift repair
    found the kernel refused: ``{"live": {key: value}, "refused": {key: value}}``; a key
    the kernel (or the node's network namespace) does not have is left out."""

    def default(self) -> dict:
        return {"live": {}, "refused": {}}

    def command(self, keys: list[str]) -> str:
        return drift.sysctl_command(keys)

    def process(self, output):
        return {"live": drift.parse_sysctl(output), "refused": drift.parse_refused(output)}


class KernelModulesLoaded(FactBase):
    """Which of the given kernel modules the kernel has (loaded or built in), and the
    container the node runs in, if any: ``{"loaded": [...], "container": ...}``."""

    def default(self) -> dict:
        return {"loaded": [], "container": None}

    def command(self, modules: list[str]) -> str:
        return drift.modules_command(modules)

    def process(self, output):
        return drift.parse_modules(output)


class GlobPaths(FactBase):
    """The paths a shell glob matches, sorted (an empty list when none)."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    def command(self, pattern: str) -> str:
        # The pattern is a glob: it is expanded by the shell, so it is not quoted. What
        # `ls -1d` would list (dangling links too), without starting ls.
        return f'for p in {pattern}; do [ -e "$p" ] || [ -L "$p" ] && echo "$p"; done; true'

    def process(self, output):
        return sorted(line for line in (x.strip() for x in output) if line)


class FilesApplied(FactBase):
    """Whether the files' contents (read in the order given, as one stream) hash to the
    sha256 recorded in ``stamp``, written when a daemon last took them up (restarted or
    reloaded after its check passed). False when the stamp or a file is missing: a
    file written by a run that stopped before its daemon took it up stays "not
    applied" until a run does (the ``did_change`` of a later run cannot say so)."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    def command(self, paths: list[str], stamp: str) -> str:
        return applied_command(paths, stamp)

    def process(self, output):
        return "".join(output).strip() == "yes"

    default = bool



class FileCapabilities(FactBase):
    """A file's capabilities as ``getcap`` prints them (``cap_net_raw=ep``; ``=`` for an
    empty set), or None when it has none (or getcap is missing)."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    def command(self, path: str) -> str:
        return f"getcap {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        text = " ".join(output).strip()
        return text.split(" ", 1)[1].strip() if " " in text else None


class UserAccount(FactBase):
    """One account as pyinfra's ``Users`` fact describes it (home, shell, comment,
    uid, gid, primary group, secondary groups), or None when there is no such user.

    ``Users`` runs five commands for every account on the node; this reads one, the
    way ``id`` sees it (through NSS, as useradd and the services do)."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    def command(self, user: str) -> str:
        q = shlex.quote(user)
        # `id -Gn USER` names the primary group first (what `id -gn USER` prints),
        # then the others: one id for both.
        return f"getent passwd {q} && id -Gn {q} || true"

    def process(self, output):
        lines = [str(line).rstrip("\n") for line in output if str(line).strip()]
        if len(lines) < 2:
            return None
        entry = lines[0].split(":")
        if len(entry) < 7:
            return None
        group = lines[1].split()[0]
        return {
            "home": entry[5] or None,
            "comment": entry[4] or None,
            "shell": entry[6] or None,
            "uid": int(entry[2]),
            "gid": int(entry[3]),
            "group": group,
            # As Users gives them: the secondary groups only.
            "groups": [g for g in lines[1].split() if g != group],
        }


class UnitLoaded(FactBase):
    """Whether systemd knows the unit (its unit file is installed), enabled or not."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    #: The unit property read (as pyinfra's systemd facts name theirs): the fact
    #: prefetch reads it with other units' states in one systemctl (accel.memo).
    state_key = "LoadState"

    def requires_command(self, *args, **kwargs) -> str:
        return "systemctl"

    def command(self, unit: str) -> str:
        return f"systemctl show --property LoadState --value {shlex.quote(unit)} || true"

    def process(self, output):
        return "\n".join(output).strip() == "loaded"


class BlockDevices(FactBase):
    """The node's block devices as :func:`parse` describes them, for the devices the
    inventory names (and what is mounted at the given paths)."""

    def default(self) -> dict:
        return {"lsblk": [], "devices": {}, "mounts": {}}

    def requires_command(self, *args, **kwargs) -> str:
        return "lsblk"

    def command(self, devices: list[str], paths: list[str] | None = None) -> str:
        return command_text(devices, paths or ())

    def process(self, output) -> dict:
        return parse(output)


class RecordedComponents(FactBase):
    """What the last deploy recorded on the node (aicluster.common.absence.RECORD):
    component -> its roles there; ``{}`` when there is no record yet."""

    @staticmethod
    def default():
        return {}

    def command(self) -> str:
        return f"cat {RECORD} 2>/dev/null || true"

    def process(self, output):
        return parse_record("\n".join(output))


class RecordedMounts(RecordedComponents):
    """The network mounts the last deploy recorded on the node (the same file):
    component -> mount points; ``{}`` when none."""

    def process(self, output):
        return parse_record_mounts("\n".join(output))
