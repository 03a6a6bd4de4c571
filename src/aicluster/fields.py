"""Field types the components' settings models share, each written once: absolute paths,
system account names, environment variable names, file modes, TCP ports, versions,
counts, and config dicts (a key=value file written as a mapping)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    WrapValidator,
)
from pydantic import ConfigDict as ModelConfig


def _no_dots(path: str) -> str:
    if any(part in (".", "..") for part in path.split("/")):
        raise ValueError(f"{path!r} has a '.' or '..' component")
    return path


#: An absolute path of plain names (no spaces, no '..').
AbsPath = Annotated[
    str, StringConstraints(pattern=r"^/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$"),
    AfterValidator(_no_dots),
]
#: A path below another (no leading '/').
RelPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$"),
                    AfterValidator(_no_dots)]
#: A system account or group name.
AccountName = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]
#: An environment variable name.
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
#: A file mode in octal, as a string ("0755").
FileMode = Annotated[str, StringConstraints(pattern=r"^[0-7]{3,4}$")]
#: A mount or export option (``noatime``, ``nconnect=8``).
MountOption = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.=:+/-]+$")]
#: A TCP or UDP port.
Port = Annotated[int, Field(ge=1, le=65535)]
#: A count of at least one.
Count = Annotated[int, Field(ge=1)]
#: A count that may be zero.
Size = Annotated[int, Field(ge=0)]
_VERSION = re.compile(r"^([0-9]+(\.[0-9]+)*([-+~][0-9A-Za-z.+~-]+)?)?$")


def _version(value: str) -> str:
    if not _VERSION.fullmatch(value):
        raise ValueError(f"{value!r} is not a version (like '23.11.4' or '535')")
    return value


#: A package or release version, or "" for "the newest the repository has".
Version = Annotated[str, AfterValidator(_version)]
#: A secret's name under the inventory's ``secrets``.
SecretName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]

_NEWLINE = re.compile(r"[\r\n]")


def scalar_config(value: dict[str, Any]) -> dict[str, Any]:
    """A config mapping whose values are scalars (or None: the key is left out) that hold
    no newline (they are written one key a line)."""
    for key, item in value.items():
        if isinstance(item, (dict, list, tuple)):
            raise ValueError(f"{key}: {item!r} is not a single value")
        if item is not None and _NEWLINE.search(str(item)):
            raise ValueError(f"{key}: a value may not hold a newline")
    return value


ScalarConfig = Annotated[dict[str, Any], AfterValidator(scalar_config)]


def _cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a network in CIDR notation (like 10.0.0.0/8, "
                         "no host bits set)") from None
    return value


#: An IPv4 or IPv6 network written as a string (``10.0.0.0/8``, ``2001:db8::/32``; a
#: plain address is one host), kept as the string given.
Cidr = Annotated[str, AfterValidator(_cidr)]


def one_message(message: str) -> WrapValidator:
    """A validator that turns every error of the type it wraps into one message
    (``{value!r}`` in it is the value given), so that a union's branches are not
    reported one by one: ``Annotated[Literal["auto"] | bool, one_message(...)]``."""

    def check(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(message.format(value=value)) from None

    return WrapValidator(check)


def matches(pattern: str, what: str) -> AfterValidator:
    """A validator for a string: it must match ``pattern`` (from its start), else the
    error is ``{value!r} is not {what}``."""
    rx = re.compile(pattern)

    def check(value: str) -> str:
        if not rx.match(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


class Entry(BaseModel):
    """An entry of a list or mapping setting with a fixed shape (a bond, a user): strict,
    an unknown key refused. A key whose default is None may be left out (the component's
    own default applies); given, it must have its type: pydantic never checks a
    default, so an explicit null is refused where the type has no None."""

    model_config = ModelConfig(extra="forbid", strict=True, frozen=True)


def _power_of_two(value: int) -> int:
    if value & (value - 1):
        raise ValueError(f"{value} is not a power of two")
    return value


#: A power of two (1, 2, 4 ...): Ceph's pg_num, md RAID chunk sizes.
PowerOfTwo = Annotated[int, Field(ge=1), AfterValidator(_power_of_two)]
#: An XFS filesystem label (at most 12 characters).
XfsLabel = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,12}$")]


def listed_once(key: Callable[[Any], Any] | None = None) -> AfterValidator:
    """For a list: refuse an item given twice (or two items with the same ``key(item)``),
    naming the second."""
    def check(items: list[Any]) -> list[Any]:
        seen: dict[Any, int] = {}
        for i, item in enumerate(items):
            k = key(item) if key else item
            if k in seen:
                raise ValueError(f"[{i}]: {k} is listed twice (also [{seen[k]}])")
            seen[k] = i
        return items
    return AfterValidator(check)


# -- added for minio, ray, k3s, ollama ----------------------------------------------

#: The cluster network a component runs on, or "" to let aicluster choose one.
NetworkChoice = Literal["", "management", "fabric", "storage", "ib"]


def _ip(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address") from None
    return value


#: An IPv4 or IPv6 address, as text.
IPAddressText = Annotated[str, AfterValidator(_ip)]
#: A sha256 digest (64 lowercase hex digits).
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
#: An architecture release files are pinned for.
Arch = Literal["amd64", "arm64"]
_URL = re.compile(r"^(https?://|\{base_url\}/)\S+$")


def _url_pattern(value: Any) -> Any:
    """An http(s) URL pattern (or one under ``{base_url}``, the component's
    ``<c>_release_base_url``), or a mapping architecture -> pattern."""
    urls = value if isinstance(value, dict) else {"": value}
    for arch, url in urls.items():
        if arch not in ("", "amd64", "arm64") or not isinstance(url, str) or not _URL.match(url):
            raise ValueError(f"{value!r} is not an http(s) URL pattern (or a mapping "
                             "architecture -> pattern, for amd64 and arm64)")
    return value


#: A release file's http(s) URL pattern (aicluster.artifacts: {version}, {arch} ...), or one
#: per architecture.
URLPatterns = Annotated[Any, AfterValidator(_url_pattern)]


class ArtifactPin(BaseModel):
    """One pinned release file (aicluster.artifacts): its URL pattern (or one per
    architecture), its sha256 per version and architecture, the groups that need it
    and, where the URL's last part is not the file's name, the file name pattern."""

    model_config = ModelConfig(extra="forbid", strict=True, frozen=True)

    url: URLPatterns
    sha256: dict[str, dict[Arch, Sha256]]
    groups: list[str] | None = None
    filename: Annotated[str, StringConstraints(pattern=r"^[^/\s]+$")] | None = None
    #: The settings holding this file's version and base URL, where not the component's
    #: ``<c>_version`` and ``<c>_release_base_url``; a boolean setting that must be true
    #: on a host for it to need the file.
    version_setting: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")] | None = None
    base_url_setting: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")] | None = None
    enabled_by: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")] | None = None


#: A component's pinned release files, by name (``<c>_artifacts``).
ArtifactPins = dict[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]*$")], ArtifactPin]


def or_empty(kind: Any) -> Any:
    """A text setting of type ``kind``, or "" (where empty means "aicluster chooses"):
    one error when it is neither, not one per branch as a union would give."""
    adapter = TypeAdapter(kind)

    def check(value: str) -> str:
        if value:
            try:
                adapter.validate_python(value, strict=True)
            except ValidationError as exc:
                msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
                shown = repr(value)
                raise ValueError(msg if shown in msg else f"{msg} (got {shown})") from None
        return value

    return Annotated[str, AfterValidator(check)]
