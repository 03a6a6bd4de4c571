"""The network component's settings (roles/network/defaults/main.yml holds their defaults).

What needs the whole inventory (a bond's members are NICs of hardware.nics, an address
lies in its network and is used once, a VLAN's MTU fits its link's) is checked by
``aicluster.components.network.derive.validate``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, ValidationInfo, field_validator

from aicluster.fields import Count, Entry
from aicluster.inventory import IFNAME_RE, MTU_LIMITS, ComponentSettings, IPAddress

#: A kernel interface name (1-15 characters).
IfName = Annotated[str, StringConstraints(pattern=IFNAME_RE.pattern)]
#: An Ethernet MTU.
EthernetMtu = Annotated[int, Field(ge=MTU_LIMITS["ethernet"][0], le=MTU_LIMITS["ethernet"][1])]
#: Linux bonding modes and transmit hash policies (the kernel's names).
BondMode = Literal["balance-rr", "active-backup", "balance-xor", "broadcast", "802.3ad",
                   "balance-tlb", "balance-alb"]
BondHash = Literal["layer2", "layer2+3", "layer3+4", "encap2+3", "encap3+4", "vlan+srcmac"]
#: Link monitoring interval, milliseconds.
Miimon = Annotated[int, Field(ge=1, le=10000)]
LacpRate = Literal["fast", "slow"]


class _Addressed(Entry):
    """An interface aicluster may give an address on one of the cluster's networks."""

    network: str | None = None
    address: IPAddress | None = None
    #: Default: the network's MTU (networks.<n>.mtu, else network_default_mtu).
    mtu: EthernetMtu | None = None

    @field_validator("address")
    @classmethod
    def _address_needs_network(cls, value: object, info: ValidationInfo) -> object:
        if value is not None and info.data.get("network") is None:
            raise ValueError("an address needs a network")
        return value


class BondOptions(Entry):
    """Keys left out take network_bond_defaults' (and those, the kernel's usual)."""

    mode: BondMode = None  # type: ignore[assignment]
    hash: BondHash = None  # type: ignore[assignment]
    miimon: Miimon = None  # type: ignore[assignment]
    lacp_rate: LacpRate = None  # type: ignore[assignment]


class Bond(BondOptions, _Addressed):
    name: IfName
    #: NICs of hardware.nics, by name or MAC.
    members: Annotated[list[str], Field(min_length=1)]


class Vlan(_Addressed):
    id: Annotated[int, Field(ge=1, le=4094)]
    #: A NIC of hardware.nics (name or MAC) or a bond.
    link: str
    #: Default: <link>.<id> where that fits 15 characters, else vlan<id>.
    name: IfName | None = None


class Settings(ComponentSettings):
    #: "": by distribution.
    network_renderer: Literal["", "netplan", "networkd", "networkmanager"]
    network_default_mtu: dict[str, EthernetMtu]
    network_bonds: list[Bond]
    network_bond_defaults: BondOptions
    network_vlans: list[Vlan]
    network_allow_management_change: bool
    network_rollback_seconds: Annotated[int, Field(ge=30, le=3600)]
    network_nic_tuning: bool
    network_tuning_min_speed_gbps: Count
    network_ring_rx: Count
    network_ring_tx: Count
