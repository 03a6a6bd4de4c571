"""The ray component's settings (roles/ray/defaults/main.yml holds their defaults)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

from aicluster.fields import (
    AbsPath,
    AccountName,
    Count,
    IPAddressText,
    NetworkChoice,
    Port,
    Size,
    Version,
    or_empty,
)
from aicluster.inventory import ComponentSettings

#: Resources Ray sets itself from --num-cpus, --num-gpus, --memory ...
RESERVED_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


def _resource_name(name: str) -> str:
    if name in RESERVED_RESOURCES:
        raise ValueError(f"Ray sets {name} itself from the inventory's hardware; name the "
                         "custom resource otherwise")
    return name


ResourceName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$"),
    AfterValidator(_resource_name),
]
#: A share of the node's memory.
Fraction = Annotated[float, Field(gt=0, lt=1)]


class Settings(ComponentSettings):
    #: "" until the inventory pins it (derive refuses a Ray node without one).
    ray_version: Version
    ray_pip_extras: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]*$")]]
    #: "": the distribution's (vars/<os family>.yml).
    ray_python: Annotated[str, StringConstraints(pattern=r"^([A-Za-z0-9_./-]+)?$")]
    ray_install_dir: AbsPath
    ray_pip_timeout: Count
    ray_pip_retries: Size
    ray_network: NetworkChoice
    ray_port: Port
    #: "": the NVMe cache's ray directory, else Ray's own default.
    ray_temp_dir: or_empty(AbsPath)
    ray_dashboard: bool
    #: "": the head's address on the Ray network.
    ray_dashboard_host: or_empty(IPAddressText)
    ray_dashboard_port: Port
    ray_metrics_export_port: Port
    ray_memory_fraction: Fraction
    ray_object_store_fraction: Fraction
    ray_object_store_max_gb: Count
    ray_resources: dict[ResourceName, Annotated[float, Field(ge=0)]]
    ray_user: AccountName
    ray_stop_timeout: Count
