"""The base component's settings (roles/base/defaults/main.yml holds their defaults)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints

from aicluster.fields import AbsPath, AccountName, Cidr, Count, Entry, Port, Size, one_message
from aicluster.inventory import ComponentSettings

_SYSCTL_NAME = re.compile(r"^[a-z0-9_]+(\.[A-Za-z0-9_-]+)+$")
_SYSCTL_VALUE = r"^[A-Za-z0-9 ._:-]+$"
_PUBLIC_KEY = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+) [A-Za-z0-9+/=]+( .*)?$")


def _sysctl_names(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        if not _SYSCTL_NAME.match(key):
            raise ValueError(f"{key!r} is not a sysctl name")
    return value


def _public_key(value: str) -> str:
    # The value is never shown: a private key pasted here must not reach the output.
    if "\n" in value or not _PUBLIC_KEY.match(value):
        raise ValueError("not an SSH public key (a private key must never be in the inventory)")
    return value


def _public_keys(value: Any) -> Any:
    if not isinstance(value, list):
        raise ValueError("must be a list of public keys")
    return value


#: A sysctl value (None: the key is dropped from the defaults).
SysctlValue = Annotated[
    int | Annotated[str, StringConstraints(pattern=_SYSCTL_VALUE)] | None,
    one_message("{value!r} is not a sysctl value"),
]
#: sysctl name -> value.
Sysctls = Annotated[dict[str, SysctlValue], AfterValidator(_sysctl_names)]
#: A chrony source line (``pool pool.ntp.org iburst``).
ChronySource = Annotated[str, StringConstraints(pattern=r"^(server|pool|peer|refclock) [^\r\n]+$")]
PublicKey = Annotated[str, AfterValidator(_public_key)]


class AdminUser(Entry):
    name: AccountName
    ssh_keys: Annotated[list[PublicKey], BeforeValidator(_public_keys)]
    sudo: bool = None  # type: ignore[assignment]
    #: Default: base_admin_shell.
    shell: AbsPath = None  # type: ignore[assignment]


class PublicPort(Entry):
    port: Port
    #: Default: tcp.
    proto: Literal["tcp", "udp"] = None  # type: ignore[assignment]


class Settings(ComponentSettings):
    base_hostname_manage: bool
    #: "" or a host of the inventory (derive.validate checks which).
    base_chrony_server_host: str
    base_chrony_upstream: list[ChronySource]
    base_default_sysctl: Sysctls
    base_sysctl: Sysctls
    #: "unlimited" or a number of KiB.
    base_memlock_limit: Annotated[
        Literal["unlimited"] | Annotated[int, Field(ge=1)],
        one_message("{value!r} is not a memlock limit ('unlimited' or a number of KiB)"),
    ]
    base_apt_retries: Size
    base_apt_timeout: Count
    base_package_cache_port: Port
    base_admin_users: list[AdminUser]
    base_admin_shell: AbsPath
    base_firewall_enabled: bool
    base_firewall_ssh_sources: list[Cidr]
    base_firewall_public_ports: list[PublicPort]
