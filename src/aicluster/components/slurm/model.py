"""The slurm component's settings (roles/slurm/defaults/main.yml holds their defaults)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from aicluster.fields import Count, Port, SecretName, Version
from aicluster.inventory import ComponentSettings

_KEY = r"^[A-Za-z][A-Za-z0-9]*$"


def _slurm_config(value: dict[str, Any]) -> dict[str, Any]:
    """slurm.conf-style settings: keys are Slurm words, values one line without '#'."""
    for key, item in value.items():
        if not isinstance(key, str) or not re.match(_KEY, key):
            raise ValueError(f"{key!r} is not a Slurm key")
        if isinstance(item, (dict, list, tuple)):
            raise ValueError(f"{key}: {item!r} is not a single value")
        if item is not None and any(c in str(item) for c in "\n\r#"):
            raise ValueError(f"{key}: a value may not hold a newline or '#'")
    return value


SlurmConfig = Annotated[dict[str, Any], AfterValidator(_slurm_config)]


class Settings(ComponentSettings):
    slurm_version: Version
    slurm_munge_key_name: SecretName
    slurm_munge_key_bytes: Annotated[int, Field(ge=32, le=1024 * 1024)]
    slurm_default_config: SlurmConfig
    slurm_config: SlurmConfig
    #: None: detect whether every Slurm node can write its cgroups.
    slurm_cgroup_plugins: bool | None
    slurm_default_cgroup_config: SlurmConfig
    slurm_cgroup_config: SlurmConfig
    slurm_memory_percent: Annotated[int, Field(ge=1, le=100)]
    #: None: hardware.gpus.count.
    slurm_gres_gpus: Annotated[int, Field(ge=0)] | None
    #: None: detect the NVIDIA driver.
    slurm_gres_autodetect: bool | None
    slurm_gpu_device_pattern: Annotated[str, StringConstraints(pattern=r"^/dev/\S*\{index\}\S*$")]
    slurm_partition_name: Annotated[str, StringConstraints(pattern=r"^([A-Za-z0-9_.-]+)?$")]
    slurm_gpu_partition_name: Annotated[str, StringConstraints(pattern=r"^([A-Za-z0-9_.-]+)?$")]
    slurm_partition_options: SlurmConfig
    slurm_restart_keys: list[Annotated[str, StringConstraints(pattern=_KEY)]]
    slurm_upgrade_batch_size: Count
    slurm_dbd_port: Port
    slurm_dbd_database: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,64}$")]
