"""The nfs component's settings (roles/nfs/defaults/main.yml holds their defaults). What
needs the whole inventory (the server's networks and address, the exports a client
mounts, FS-Cache on the client) is checked by aicluster.components.nfs.derive.validate."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, StringConstraints
from typing_extensions import NotRequired, TypedDict

from aicluster.components.nfs.derive import export_id
from aicluster.fields import AbsPath, AccountName, FileMode, MountOption, listed_once, scalar_config
from aicluster.inventory import NETWORK_NAMES, ComponentSettings

#: exports(5) options without a value, and those taking one.
EXPORT_FLAGS = frozenset({
    "rw", "ro", "sync", "async", "secure", "insecure", "wdelay", "no_wdelay", "hide",
    "nohide", "crossmnt", "subtree_check", "no_subtree_check", "secure_locks",
    "insecure_locks", "auth_nlm", "no_auth_nlm", "mountpoint", "mp", "root_squash",
    "no_root_squash", "all_squash", "no_all_squash", "pnfs", "no_pnfs", "security_label",
})
EXPORT_VALUED = frozenset({"anonuid", "anongid", "fsid", "sec", "refer", "replicas",
                           "mountpoint", "mp", "xprtsec"})
#: Options of which an export may give at most one.
EXCLUSIVE = (("rw", "ro"), ("sync", "async"), ("root_squash", "no_root_squash"),
             ("all_squash", "no_all_squash"), ("subtree_check", "no_subtree_check"),
             ("secure", "insecure"))
#: Directories that are neither exported nor mounted over.
SYSTEM_DIRS = ("/", "/boot", "/etc", "/usr", "/var", "/proc", "/sys", "/dev", "/run",
               "/bin", "/sbin", "/lib", "/lib64")


def _not_system(path: str) -> str:
    if path in SYSTEM_DIRS:
        raise ValueError(f"{path!r} is a system directory")
    return path


def _export_options(options: list[str]) -> list[str]:
    for o in options:
        key, sep, value = o.partition("=")
        if (not sep and key not in EXPORT_FLAGS) or (sep and key not in EXPORT_VALUED) or (
            sep and not value
        ):
            raise ValueError(f"unknown export option {o!r} (exports(5))")
        if key in ("anonuid", "anongid") and not value.isdigit():
            raise ValueError(f"{o!r}: {key} takes a number")
    keys = {o.partition("=")[0] for o in options}
    for pair in EXCLUSIVE:
        if set(pair) <= keys:
            raise ValueError(f"{pair[0]} and {pair[1]} contradict each other")
    return options


def _network(value: str) -> str:
    """A network name, or a subnet in CIDR notation (whether the name is one the
    inventory declares is checked with the whole inventory)."""
    if value in NETWORK_NAMES:
        return value
    try:
        if "/" not in value:
            raise ValueError
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise ValueError(f"{value!r} is neither a network name ({', '.join(NETWORK_NAMES)}) "
                         "nor a subnet such as '10.30.0.0/24'") from None
    return value


Directory = Annotated[AbsPath, AfterValidator(_not_system)]
ExportOptions = Annotated[list[str], Field(min_length=1), AfterValidator(_export_options)]
#: A word of nfs.conf(5): a section or key name.
ConfWord = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ConfSection = Annotated[dict[ConfWord, Any], AfterValidator(scalar_config)]


class Export(TypedDict):
    """An export; a key left out takes the default aicluster.components.nfs.derive
    gives it (every network of the inventory, nfs_export_default_options, root, 0755,
    the entry's position)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)
    path: Directory
    networks: NotRequired[Annotated[list[Annotated[str, AfterValidator(_network)]],
                                    Field(min_length=1)]]
    options: NotRequired[ExportOptions]
    owner: NotRequired[AccountName]
    group: NotRequired[AccountName]
    mode: NotRequired[FileMode]
    #: nfs-ganesha's Export_Id.
    export_id: NotRequired[Annotated[int, Field(ge=1, le=65535)]]


class Mount(TypedDict):
    """What a client mounts: an export of the server, at ``path`` (default: the
    export's path), with extra mount options."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)
    export: AbsPath
    path: NotRequired[Directory]
    options: NotRequired[list[MountOption]]


def _export_ids(exports: list[Export]) -> list[Export]:
    seen: dict[int, int] = {}
    for i, e in enumerate(exports):
        n = export_id(e, i)
        if n in seen:
            raise ValueError(f"[{i}]: export_id {n} is used by another export ([{seen[n]}])")
        seen[n] = i
    return exports


class Settings(ComponentSettings):
    nfs_server_impl: Literal["kernel", "ganesha"]
    #: None: max(8, 4 x the number of nfs_clients hosts).
    nfs_server_threads: Annotated[int, Field(ge=1, le=4096)] | None
    #: nfs.conf(5) sections (None: the section is left as aicluster writes it).
    nfs_server_config: dict[ConfWord, ConfSection | None]
    nfs_exports: Annotated[list[Export], listed_once(lambda e: e["path"]),
                           AfterValidator(_export_ids)]
    nfs_export_default_options: ExportOptions
    #: None: storage, fabric or management, the first where the server has an address.
    nfs_network: Literal[NETWORK_NAMES] | None  # type: ignore[valid-type]
    #: None: every export of the server, each at its own path.
    nfs_mounts: Annotated[list[Mount], listed_once(lambda m: m.get("path", m["export"]))] | None
    nfs_version: Literal["3", "4", "4.0", "4.1", "4.2"]
    nfs_mount_options: list[MountOption]
    nfs_nconnect: Annotated[int, Field(ge=1, le=16)]
    nfs_nconnect_min_speed_gbps: Annotated[int, Field(ge=1, le=800)]
    nfs_fscache: bool
