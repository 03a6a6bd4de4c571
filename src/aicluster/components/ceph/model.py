"""The ceph component's settings (roles/ceph/defaults/main.yml holds their defaults).
What needs the whole inventory (the monitors, the declared networks and the hosts'
addresses on them, the OSD count against pool sizes, the MDS, the NVMe cache's drives)
is checked by aicluster.components.ceph.derive.validate."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from typing_extensions import NotRequired, TypedDict

from aicluster.components.ceph.derive import DERIVED_KEYS, RELEASES
from aicluster.fields import AbsPath, Port, PowerOfTwo, SecretName, listed_once, scalar_config
from aicluster.inventory import DEVICE_RE, NETWORK_NAMES, ComponentSettings

_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_ABS_PATH = TypeAdapter(AbsPath)
_SECTION_RE = re.compile(r"^(global|mon|mgr|osd|mds|client)(\.[A-Za-z0-9_.-]+)?$")
_OPTION_RE = re.compile(r"^[a-z][a-z0-9_ ]*$")


def _device(value: str) -> str:
    if not DEVICE_RE.match(value) or any(p in ("", ".", "..") for p in value.split("/")[1:]):
        raise ValueError(f"{value!r} is not a block device path (use /dev/disk/by-id/...)")
    return value


def _fsid(value: str) -> str:
    if value and not _UUID_RE.match(value):
        raise ValueError(f"{value!r} is not a UUID (like 7b0c3f62-52a9-4d43-9d53-5d1f0f3c2a61)")
    return value


def _client_name(value: str) -> str:
    if not re.match(r"^[a-z0-9][a-z0-9_-]{0,31}$", value) or value in ("admin", "bootstrap-osd"):
        raise ValueError(f"{value!r} is not a client name of ours (lowercase letters, digits, "
                         "'_', '-'; not admin)")
    return value


def _mount(value: str) -> str:
    if value:
        try:
            _ABS_PATH.validate_python(value)
        except ValidationError:
            raise ValueError(f"{value!r} is not an absolute path (or \"\" for no mount)") from None
    return value


def _sections(config: dict[str, Any]) -> dict[str, Any]:
    for section in config:
        if not _SECTION_RE.match(section):
            raise ValueError(f"{section}: not a ceph.conf section (global, mon, mgr, osd, mds, "
                             "client[.NAME])")
    return config


def _options(options: dict[str, Any]) -> dict[str, Any]:
    """A ceph.conf section's options: one value each, none computed from the inventory."""
    for key in options:
        if not _OPTION_RE.match(key):
            raise ValueError(f"{key!r} is not an option name (lowercase, '_' or ' ')")
        if key.replace(" ", "_") in DERIVED_KEYS:
            raise ValueError(f"{key}: is computed from the inventory; set it through the "
                             "ceph_* settings instead")
    return scalar_config(options)


def _plain_device(value: Any) -> Any:
    """A plain device path means ``{device: PATH}`` (wipe false)."""
    return {"device": value} if isinstance(value, str) else value


#: A Ceph release by codename (aicluster.components.ceph.derive.RELEASES).
Release = Literal[tuple(RELEASES)]  # type: ignore[valid-type]
#: A system's directory in Ceph's repository: a Debian or Ubuntu suite, or el<N>.
Suite = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9]{1,31}$")]
Device = Annotated[str, AfterValidator(_device)]
#: A pool or file system name.
PoolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
Replicas = Annotated[int, Field(ge=1, le=10)]
Network = Literal[("", *NETWORK_NAMES)]  # type: ignore[valid-type]
Options = Annotated[dict[str, Any], AfterValidator(_options)]
#: ceph.conf by section (a section or option set to null is left out).
CephConfig = Annotated[dict[str, Options | None], AfterValidator(_sections)]


class OsdDevice(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)
    device: Device
    wipe: NotRequired[bool]


class Pool(TypedDict):
    """A pool; a key left out takes the default aicluster.components.ceph.derive.pools
    gives it (ceph_pool_default_pg_num, ceph_pool_default_size, size - size // 2, rbd)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)
    name: PoolName
    pg_num: NotRequired[PowerOfTwo]
    size: NotRequired[Replicas]
    min_size: NotRequired[Annotated[int, Field(ge=1)]]
    application: NotRequired[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]]


def _min_size(pool: Pool) -> Pool:
    if "size" in pool and pool.get("min_size", 1) > pool["size"]:
        raise ValueError(f"min_size {pool['min_size']} is more than the pool's size "
                         f"{pool['size']}")
    return pool


class Settings(ComponentSettings):
    #: Ceph's own repository (ceph_repo_url) or the distribution's packages.
    ceph_source: Literal["ceph_repo", "distribution"]
    #: The release every Ceph host runs, by codename.
    ceph_release: Release
    #: "": none given (derive.validate asks for one with ceph_source ceph_repo).
    ceph_repo_url: Annotated[str, StringConstraints(pattern=r"^((https?|file)://\S+)?$")]
    #: The systems Ceph's repository (or the site's mirror) builds each release for.
    ceph_repo_builds: dict[Release, list[Suite]]
    #: "": storage, fabric or management, the first every Ceph host has an address on.
    ceph_network: Network
    #: "": the public network.
    ceph_cluster_network: Network
    #: "": derived from the cluster's secret.
    ceph_fsid: Annotated[str, AfterValidator(_fsid)]
    ceph_keys_name: SecretName
    ceph_keys_bytes: Annotated[int, Field(ge=32, le=1024 * 1024)]
    ceph_msgr2: bool
    #: The managers' prometheus module (false: left as it is).
    ceph_mgr_prometheus: bool
    ceph_mgr_prometheus_port: Port
    ceph_osd_devices: Annotated[list[Annotated[OsdDevice, BeforeValidator(_plain_device)]],
                                listed_once(lambda d: d["device"])]
    ceph_osd_mode: Literal["raw", "lvm"]
    ceph_pools: Annotated[list[Annotated[Pool, AfterValidator(_min_size)]],
                          listed_once(lambda p: p["name"])]
    #: None: one replica per OSD, at most 3.
    ceph_pool_default_size: Replicas | None
    #: "": host when there are at least as many OSD hosts as replicas, else osd.
    ceph_failure_domain: Literal["", "host", "osd"]
    ceph_pool_default_pg_num: PowerOfTwo
    ceph_cephfs_name: PoolName
    ceph_cephfs_data_pool: PoolName
    ceph_cephfs_metadata_pool: PoolName
    ceph_cephfs_data_pg_num: PowerOfTwo
    ceph_cephfs_metadata_pg_num: PowerOfTwo
    ceph_client_name: Annotated[str, AfterValidator(_client_name)]
    ceph_client_pools: list[PoolName]
    #: "": CephFS is not mounted.
    ceph_cephfs_mount: Annotated[str, AfterValidator(_mount)]
    ceph_cephfs_mount_type: Literal["fuse", "kernel"]
    ceph_default_config: CephConfig
    ceph_config: CephConfig
    ceph_command_timeout: Annotated[int, Field(ge=1, le=3600)]
