"""The minio component's settings (roles/minio/defaults/main.yml holds their defaults)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from aicluster.fields import (
    AbsPath,
    AccountName,
    ArtifactPins,
    MountOption,
    NetworkChoice,
    Port,
    SecretName,
    Version,
    matches,
)
from aicluster.inventory import DEVICE_RE, ComponentSettings

#: Keys of the environment file computed from the inventory (minio_config may not set them).
COMPUTED_ENV = ("MINIO_VOLUMES", "MINIO_OPTS", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD",
                "MINIO_ROOT_USER_FILE", "MINIO_ROOT_PASSWORD_FILE", "MINIO_ACCESS_KEY",
                "MINIO_SECRET_KEY")


def _device(value: str) -> str:
    if not DEVICE_RE.match(value) or any(p in ("", ".", "..") for p in value.split("/")[1:]):
        raise ValueError(f"{value!r} is not a block device path (use /dev/disk/by-id/...)")
    return value


def _bucket_name(value: str) -> str:
    if (not re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", value) or ".." in value
            or re.match(r"^\d+\.\d+\.\d+\.\d+$", value)):
        raise ValueError(f"{value!r} is not a bucket name (3-63 lowercase letters, digits, "
                         "'.', '-')")
    return value


def _not_computed(value: str) -> str:
    if value in COMPUTED_ENV:
        raise ValueError("is computed from the inventory (drives, addresses, the "
                         "root secret); set it through the minio_* settings")
    return value


def _env_value(value: Any) -> Any:
    if isinstance(value, (dict, list)) or (
            value is not None and any(ch in str(value) for ch in '"\\$`\n')):
        raise ValueError(f"{value!r} must be one value without quotes, backslashes, '$' or "
                         "backticks")
    return value


def _local_file(value: str) -> str:
    if value and not Path(value).expanduser().is_absolute():
        raise ValueError(f"{value!r} is not an absolute path (a file on the deploying machine)")
    return value


class Drive(BaseModel):
    """A drive: a block device (made XFS when empty, or wiped when ``wipe``), mounted at
    ``path`` (default minio_mount_prefix<N>), or a directory ``path``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    device: Annotated[str, AfterValidator(_device)] | None = None
    wipe: bool | None = None
    path: AbsPath | None = None

    @model_validator(mode="after")
    def _device_or_path(self) -> Drive:
        if self.device is None and self.path is None:
            raise ValueError("must be {device: /dev/disk/by-id/..., wipe: false} or "
                             "{path: /srv/minio}")
        if self.device is None and self.wipe is not None:
            raise ValueError("wipe: only a device is wiped; a directory drive is never "
                             "emptied by aicluster")
        return self


class Bucket(BaseModel):
    """A bucket made on the first MinIO host: its anonymous access and versioning
    (absent: left as it is)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Annotated[str, AfterValidator(_bucket_name)]
    policy: Literal["none", "download", "upload", "public"] | None = None
    versioning: bool | None = None


MinioEnv = dict[Annotated[str, matches(r"^MINIO_[A-Z0-9_]+$",
                                        "a MinIO environment variable (MINIO_...)"),
                          AfterValidator(_not_computed)],
                Annotated[Any, AfterValidator(_env_value)]]
LocalFile = Annotated[str, AfterValidator(_local_file)]


class Settings(ComponentSettings):
    minio_version: Version
    minio_release_base_url: Annotated[str, matches(
        r"^https?://[^\s{}]*[^\s{}/]$",
        "an http(s) URL with no trailing '/' (where MinIO's releases are)")]
    minio_artifacts: ArtifactPins
    minio_binary: AbsPath
    minio_mc_binary: AbsPath
    minio_user: AccountName
    minio_group: AccountName
    minio_network: NetworkChoice
    minio_port: Port
    minio_console_port: Port
    minio_pool: Annotated[int, Field(ge=1)]
    minio_drives: list[Drive]
    minio_data_dir: AbsPath
    minio_mount_prefix: AbsPath
    minio_mount_options: list[MountOption]
    minio_fs_label: Annotated[str, matches(
        r"^[A-Za-z0-9_-]{1,12}$", "an XFS label (1-12 letters, digits, '_', '-')")]
    minio_root_user: Annotated[str, matches(
        r"^[A-Za-z0-9._~-]{3,64}$", "a root user name (3-64 letters, digits, '.', '_', '~', '-')")]
    minio_root_keys_name: SecretName
    minio_root_keys_bytes: Annotated[int, Field(ge=32, le=4096)]
    #: "": no TLS.
    minio_tls_cert_file: LocalFile
    minio_tls_key_file: LocalFile
    minio_tls_ca_file: LocalFile
    minio_certs_dir: AbsPath
    minio_default_config: MinioEnv
    minio_config: MinioEnv
    minio_buckets: list[Bucket]
    minio_health_timeout: Annotated[int, Field(ge=10)]
