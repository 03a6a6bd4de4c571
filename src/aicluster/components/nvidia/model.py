"""The nvidia component's settings (roles/nvidia/defaults/main.yml holds their defaults;
the package names by distribution are the role's vars/, not settings).

What needs the whole inventory (one upgrade batch size for the cluster, a repository URL
where NVIDIA GPUs are declared) is checked by
``aicluster.components.nvidia.derive.validate``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, ValidationInfo, field_validator

from aicluster.fields import Count, Size, one_message
from aicluster.inventory import ComponentSettings

#: "auto" (decided from what the node shows and the inventory declares), true or false.
AutoBool = Annotated[Literal["auto"] | bool, one_message("{value!r} is not 'auto', true or false")]


class Settings(ComponentSettings):
    nvidia_source: Literal["cuda_repo", "distribution"]
    nvidia_driver_branch: Annotated[str, StringConstraints(pattern=r"^[0-9]{3,4}$")]
    #: None: the newest of the branch.
    nvidia_driver_version: Annotated[
        str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+){1,2}$")] | None
    nvidia_open_kernel_modules: AutoBool
    #: Ubuntu's precompiled, signed kernel modules instead of DKMS (Secure Boot).
    nvidia_precompiled_modules: bool
    #: None: no CUDA toolkit.
    nvidia_cuda_version: Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+$")] | None
    nvidia_fabric_manager: AutoBool
    nvidia_peermem: AutoBool
    nvidia_persistenced: bool
    nvidia_dcgm: bool
    nvidia_container_toolkit: bool
    nvidia_upgrade_batch_size: Count
    nvidia_drain_timeout: Size
    nvidia_reboot_timeout: Annotated[int, Field(ge=60)]
    #: "": none given (derive.validate asks for one where NVIDIA GPUs are declared).
    nvidia_cuda_repo_url: Annotated[str, StringConstraints(pattern=r"^((https?|file)://\S+)?$")]
    #: "": the node's (ubuntu2204, ubuntu2404, debian12, rhel9).
    nvidia_cuda_repo_distro: Annotated[str, StringConstraints(pattern=r"^([a-z]+[0-9]+)?$")]
    #: "": the node's (x86_64, sbsa).
    nvidia_cuda_repo_arch: Annotated[str, StringConstraints(pattern=r"^([a-z0-9_]+)?$")]

    @field_validator("nvidia_driver_version")
    @classmethod
    def _of_the_branch(cls, value: str | None, info: ValidationInfo) -> str | None:
        branch = info.data.get("nvidia_driver_branch")
        if value is not None and branch is not None and not value.startswith(f"{branch}."):
            raise ValueError(f"{value} is not of nvidia_driver_branch {branch}")
        return value
