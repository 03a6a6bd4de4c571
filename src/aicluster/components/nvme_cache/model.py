"""The nvme_cache component's settings (roles/nvme_cache/defaults/main.yml holds their
defaults). Whether the drives are the host's hardware.nvme drives is checked with the
whole inventory (aicluster.components.nvme_cache.derive.validate)."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from typing_extensions import NotRequired, TypedDict

from aicluster.fields import (
    AbsPath,
    AccountName,
    EnvName,
    FileMode,
    MountOption,
    PowerOfTwo,
    RelPath,
    XfsLabel,
    listed_once,
)
from aicluster.inventory import ComponentSettings

#: Directories the cache may not be mounted over.
SYSTEM_DIRS = ("/boot", "/etc", "/home", "/usr", "/var", "/tmp")


def _not_system(path: str) -> str:
    if path in SYSTEM_DIRS:
        raise ValueError(f"{path!r} is a system directory")
    return path


class Directory(TypedDict):
    """A directory on the cache; a key left out takes the default of
    aicluster.common.disks.cache_directories (owner root, group the owner, mode 0755)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)
    path: RelPath
    owner: NotRequired[AccountName]
    group: NotRequired[AccountName]
    #: The home of the owner when it is made (a system user).
    home: NotRequired[AbsPath]
    mode: NotRequired[FileMode]
    #: Environment variables set to the directory's path.
    env: NotRequired[list[EnvName]]


Percent = Annotated[int, Field(ge=0, le=99)]


class Culling(BaseModel):
    """cachefilesd's culling limits, in percent of the cache's space (b) and files (f)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    brun: Percent
    bcull: Percent
    bstop: Percent
    frun: Percent
    fcull: Percent
    fstop: Percent

    @model_validator(mode="after")
    def _ordered(self) -> Culling:
        if not (self.brun > self.bcull > self.bstop and self.frun > self.fcull > self.fstop):
            raise ValueError("cachefilesd needs brun > bcull > bstop and frun > fcull > fstop")
        return self


class Settings(ComponentSettings):
    #: None: every hardware.nvme drive of the host.
    nvme_cache_devices: Annotated[list[str], listed_once()] | None
    nvme_cache_path: Annotated[AbsPath, AfterValidator(_not_system)]
    nvme_cache_mount_options: list[MountOption]
    nvme_cache_fs_label: XfsLabel
    nvme_cache_raid_name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,24}$")]
    nvme_cache_raid_chunk_kb: Annotated[PowerOfTwo, Field(ge=4)]
    nvme_cache_directories: Annotated[list[Directory], listed_once(lambda d: d["path"])]
    nvme_cache_fscache: bool
    nvme_cache_fscache_dir: RelPath
    nvme_cache_fscache_culling: Culling
