"""The infiniband component's settings (roles/infiniband/defaults/main.yml holds their
defaults).

What needs the whole inventory (the fabric has a subnet manager, the standby's priority
is below the primary's, ib_nodes lock unlimited memory) is checked by
``aicluster.components.infiniband.derive.validate``."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StringConstraints, ValidationInfo, field_validator

from aicluster.fields import ScalarConfig
from aicluster.inventory import ComponentSettings

_OPTION = re.compile(r"^[A-Za-z0-9_]+$")


def _opensm_options(value: dict[str, Any]) -> dict[str, Any]:
    """opensm.conf options: plain names, not sm_priority (infiniband_opensm_priority
    sets it), each value given (None drops the option)."""
    for option, item in value.items():
        if option == "sm_priority":
            raise ValueError("sm_priority: set it with infiniband_opensm_priority")
        if not _OPTION.match(option):
            raise ValueError(f"{option!r} is not an opensm option name")
        if item == "":
            raise ValueError(f"{option}: '' is not a value (null drops the option)")
    return value


OpensmConfig = Annotated[ScalarConfig, AfterValidator(_opensm_options)]
#: A kernel module name.
ModuleName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_-]+$")]


class Settings(ComponentSettings):
    infiniband_subnet_manager: Literal["opensm", "switch"]
    #: opensm's priority on this node, the primary highest; None: no opensm here.
    infiniband_opensm_priority: Annotated[int, Field(ge=0, le=15)] | None
    infiniband_opensm_default_config: OpensmConfig
    infiniband_opensm_config: OpensmConfig
    infiniband_ipoib_modules: list[ModuleName]

    @field_validator("infiniband_opensm_priority")
    @classmethod
    def _not_with_a_switch(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("infiniband_subnet_manager") == "switch":
            raise ValueError("set while infiniband_subnet_manager is 'switch' (the switch "
                             "runs the subnet manager); remove one of them")
        return value
