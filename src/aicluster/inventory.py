"""The inventory: schema, loading and validation, shared by pyinfra and Ansible.

An inventory is a pyinfra inventory file (``inventories/lab.py``): module-level lists
are groups of hosts, a host is ``(name, data)`` the first time it is named and a plain
name after that, and ``group_data/*.py`` beside the file hold group and cluster-wide
settings. This module

* loads such a file exactly as pyinfra does (pyinfra's own loader), without contacting
  any host;
* validates every host's merged data against the schema below and the cluster as a
  whole (groups, addresses, controllers), collecting *all* errors, each naming the
  host and the field;
* computes the derived values templates need (``/etc/hosts`` entries, cluster
  networks), once, for both engines;
* prints the Ansible JSON inventory when the file is run as a script, so Ansible
  reads the very same file (``ansible-playbook -i inventories/lab.py ...``).

An inventory file ends with ``aicluster.inventory.finish(globals())``: run by pyinfra
it validates before pyinfra connects anywhere; run by Ansible it prints the inventory.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import sys
import traceback
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from aicluster.common import epel
from aicluster.common.absence import host_mounts
from aicluster.common.limits import NETWORK_RETRIES, NETWORK_TIMEOUT
from aicluster.components import derive_module, model_module

# ---------------------------------------------------------------------------
# Groups and components
# ---------------------------------------------------------------------------

#: Component -> the inventory groups that ask for it. ``base`` applies to every host.
COMPONENT_GROUPS: dict[str, tuple[str, ...]] = {
    "base": (),
    "network": (),
    "infiniband": ("ib_nodes",),
    "nvidia": ("gpu_nodes",),
    "nvme_cache": ("gpu_nodes",),
    "nfs": ("nfs_server", "nfs_clients"),
    "ceph": ("ceph_mons", "ceph_osds", "ceph_mds", "ceph_clients"),
    "minio": ("minio",),
    "slurm": ("slurm_controller", "slurm_workers", "slurm_dbd"),
    "ray": ("ray_head", "ray_workers"),
    "k3s": ("k3s_servers", "k3s_agents"),
    "ollama": ("ollama", "ollama_gateway"),
    "monitoring": ("monitoring",),
}

#: Component -> a host data key that gives a host the component outside its groups
#: (a storage node with ``nvme_cache_devices`` gets the NVMe cache too).
COMPONENT_DATA_KEYS: dict[str, str] = {"nvme_cache": "nvme_cache_devices"}

#: Component -> a group that, once any host of the cluster is in it, gives the component
#: to every host: a cluster with a ``monitoring`` host runs the monitoring agents (node
#: exporter, textfiles) on every node; the group's own hosts run the server side too
#: (their role, as for any group). No host in the group: no host gets the component.
COMPONENT_CLUSTER_GROUPS: dict[str, str] = {"monitoring": "monitoring"}

#: The order components are deployed in (dependencies first).
COMPONENT_ORDER: tuple[str, ...] = tuple(COMPONENT_GROUPS)

KNOWN_GROUPS: frozenset[str] = frozenset(g for gs in COMPONENT_GROUPS.values() for g in gs)

#: Network names the inventory may declare, and what links they run on.
NETWORK_NAMES = ("management", "fabric", "storage", "ib")

#: The slowest fabric link the planning advice accepts between GPU nodes (Gb/s).
FABRIC_MIN_GBPS = 25

#: MTU limits by link type (Linux): Ethernet from the IPv6 minimum to the largest
#: jumbo frame switches commonly carry; IPoIB datagram mode is bounded by the IB MTU
#: (4096 - 4 bytes of IPoIB header), connected mode by the kernel's 65520.
MTU_LIMITS = {
    "ethernet": (1280, 9216),
    "ipoib-datagram": (1280, 4092),
    "ipoib-connected": (1280, 65520),
}

VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([-+~][0-9A-Za-z.+~-]+)?$")
HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
DEVICE_RE = re.compile(r"^/dev/[A-Za-z0-9][A-Za-z0-9_.:+@/-]*$")
MAC_RE = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$")
#: Data keys whose value is a secret: they must be given as a reference.
SECRET_KEY_RE = re.compile(r"(password|passwd|token|secret|credential|private_key|(^|_)key$)", re.I)
#: ... unless the key names where the secret is (``munge_key_file``) or is pyinfra's
#: path to the deploying machine's SSH key (``ssh_key``).
SECRET_REF_KEY_RE = re.compile(r"(_file|_path|_env|^ssh_key)$", re.I)

#: The file-name group pyinfra adds (``inventories/lab.py`` -> ``lab``) is allowed too.


def _ip_address(v: Any) -> Any:
    """An IP address written as a string, with one message when it is not one."""
    if isinstance(v, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return v
    try:
        if not isinstance(v, str):
            raise ValueError
        return ipaddress.ip_address(v)
    except ValueError:
        raise ValueError(f"{v!r} is not an IP address") from None


def _ip_network(v: Any) -> Any:
    """A network in CIDR form written as a string, with one message when it is not one."""
    if isinstance(v, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return v
    try:
        if not isinstance(v, str):
            raise ValueError("give it as a string such as '10.0.0.0/24'")
        return ipaddress.ip_network(v)
    except ValueError as exc:
        raise ValueError(f"{v!r} is not a network in CIDR form ({exc})") from None


def _arch(v: Any) -> Any:
    """``uname -m``'s names for the architectures artifacts are pinned for."""
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(v, v) if isinstance(v, str) else v


IPAddress = Annotated[ipaddress.IPv4Address | ipaddress.IPv6Address, BeforeValidator(_ip_address)]
IPNetwork = Annotated[ipaddress.IPv4Network | ipaddress.IPv6Network, BeforeValidator(_ip_network)]


class InventoryError(Exception):
    """Bad inventory input. ``errors`` holds one line per problem, host and field named."""

    def __init__(self, errors: list[str], source: str | None = None):
        self.errors = errors
        self.source = source
        head = f"{source}: " if source else ""
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"{head}invalid inventory ({len(errors)} problem(s)):\n{lines}")


# ---------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ComponentSettings(BaseModel):
    """A component's settings: the keys of its ``roles/<c>/defaults/main.yml``, each
    typed. One model per component (``aicluster.components.<c>.model.Settings``) is the
    one validation of its variables, for both engines: checked strictly (a quoted "8"
    is refused where a number is wanted, so pyinfra and Ansible never see one a number
    and the other a string), and a key the component does not know is refused with the
    nearest known name. The defaults themselves live in the role's defaults file only:
    the model is checked on the defaults under the host's data."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class GPUs(_Model):
    """The node's GPUs. ``count: 0`` (the default) means none. ``vendor: "standin"``
    declares a stand-in for tests (no real GPU): Slurm still offers it as GRES, the
    nvidia component installs nothing and checks no count on such a node."""

    model: str = ""
    count: Annotated[int, Field(ge=0, le=16)] = 0
    memory_gb: Annotated[int, Field(ge=0, le=1024)] = 0
    nvswitch: bool = False
    vendor: Literal["nvidia", "standin"] = "nvidia"

    @model_validator(mode="after")
    def _model_named(self) -> GPUs:
        if self.count and not self.model:
            raise ValueError("a GPU model is required when count > 0")
        if self.nvswitch and not self.count:
            raise ValueError("nvswitch is set but the node has no GPUs")
        return self


class NIC(_Model):
    """An Ethernet interface on a cluster network, matched by name or MAC address."""

    name: str | None = None
    mac: str | None = None
    speed_gbps: Annotated[int, Field(ge=1, le=800)] = 25
    network: str
    address: IPAddress | None = None
    mtu: int = 1500

    @field_validator("name")
    @classmethod
    def _ifname(cls, v: str | None) -> str | None:
        if v is not None and not IFNAME_RE.match(v):
            raise ValueError(f"{v!r} is not a valid interface name (1-15 characters)")
        return v

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str | None) -> str | None:
        if v is not None:
            v = v.lower()
            if not MAC_RE.match(v):
                raise ValueError(f"{v!r} is not a MAC address (aa:bb:cc:dd:ee:ff)")
        return v

    @field_validator("mtu")
    @classmethod
    def _mtu(cls, v: int) -> int:
        low, high = MTU_LIMITS["ethernet"]
        if not low <= v <= high:
            raise ValueError(f"MTU {v} is out of range for Ethernet ({low}-{high})")
        return v

    @model_validator(mode="after")
    def _named(self) -> NIC:
        if not self.name and not self.mac:
            raise ValueError("a NIC needs a name or a mac")
        return self


class IBPort(_Model):
    """An InfiniBand HCA port, optionally carrying IPoIB on the ``ib`` network. It is found
    on the node by ``guid`` or ``pci`` when given (they survive rdma-core renaming the HCA),
    else by ``device``, the HCA's current name (kernel ``mlx5_0`` or persistent
    ``ibp65s0f0``)."""

    device: str | None = None
    pci: str | None = None
    guid: str | None = None
    port: Annotated[int, Field(ge=1, le=2)] = 1
    rate_gbps: Annotated[int, Field(ge=10, le=800)] = 400
    network: str | None = None
    address: IPAddress | None = None
    mode: Literal["datagram", "connected"] = "datagram"
    mtu: int = 2044

    @field_validator("device")
    @classmethod
    def _device(cls, v: str | None) -> str | None:
        # The kernel's names (mlx5_0) and rdma-core's persistent ones (ibp65s0f0,
        # ibP1p2s0f1, rocex525400c0fe1234ab, ibo3): a letter, then letters, digits or _.
        if v is not None and not re.match(r"^[A-Za-z][A-Za-z0-9_]{0,62}$", v):
            raise ValueError(f"{v!r} is not an HCA name such as mlx5_0 or ibp65s0f0")
        return v

    @field_validator("pci")
    @classmethod
    def _pci(cls, v: str | None) -> str | None:
        if v is None:
            return v
        m = re.match(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$", v)
        if not m:
            raise ValueError(f"{v!r} is not a PCI address such as 0000:41:00.0")
        domain, bus, slot, function = m.groups()
        return f"{domain or '0000'}:{bus}:{slot}.{function}".lower()

    @field_validator("guid")
    @classmethod
    def _guid(cls, v: str | None) -> str | None:
        if v is None:
            return v
        digits = v.lower().removeprefix("0x").replace(":", "")
        if not re.match(r"^[0-9a-f]{16}$", digits) or not int(digits, 16):
            raise ValueError(f"{v!r} is not a GUID such as 0xb8cef60300a12b3c "
                             "or b8ce:f603:00a1:2b3c")
        return ":".join(digits[i:i + 4] for i in range(0, 16, 4))

    @model_validator(mode="after")
    def _identified(self) -> IBPort:
        if not (self.device or self.pci or self.guid):
            raise ValueError("an InfiniBand port needs a device, pci or guid to be found "
                             "on the node")
        return self

    def ident(self) -> str:
        """What finds the port on the node: its GUID, else its PCI address, else its
        HCA's name (aicluster.components.infiniband.derive.match_port)."""
        return self.guid or self.pci or str(self.device)

    @field_validator("mtu")
    @classmethod
    def _mtu(cls, v: int, info: ValidationInfo) -> int:
        mode = info.data.get("mode")
        if mode is None:  # the mode itself is wrong, and reported
            return v
        low, high = MTU_LIMITS[f"ipoib-{mode}"]
        if not low <= v <= high:
            raise ValueError(f"MTU {v} is out of range for IPoIB {mode} mode ({low}-{high})")
        return v

    @model_validator(mode="after")
    def _address(self) -> IBPort:
        if self.address is not None and not self.network:
            raise ValueError("an IPoIB address needs a network")
        return self


class NVMe(_Model):
    """A local NVMe device. It is only ever formatted when it is empty or ``wipe`` is true."""

    device: str
    wipe: bool = False

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        parts = v.split("/")[1:]
        if not DEVICE_RE.match(v) or any(p in ("", ".", "..") for p in parts):
            raise ValueError(
                f"{v!r} is not a block device path (use /dev/disk/by-id/... or /dev/nvmeXnY)"
            )
        return v


class Hardware(_Model):
    """What the node is made of, as the inventory declares it (facts check it later)."""

    #: The CPU architecture release artifacts are picked for (``uname -m``'s
    #: ``x86_64``/``aarch64`` are accepted too).
    arch: Annotated[Literal["amd64", "arm64"], BeforeValidator(_arch)] = "amd64"
    cpus: Annotated[int, Field(ge=1, le=4096)] = 1
    #: The CPU layout (``lscpu``, ``slurmd -C``), all three or none: Slurm's NodeName
    #: line gives it, so that cores, not hyper-threads, are what CR_Core hands out.
    sockets: Annotated[int, Field(ge=1, le=64)] | None = None
    cores_per_socket: Annotated[int, Field(ge=1, le=1024)] | None = None
    threads_per_core: Annotated[int, Field(ge=1, le=8)] | None = None
    memory_gb: Annotated[int, Field(ge=1, le=65536)] = 1
    gpus: GPUs = GPUs()
    nics: list[NIC] = []
    ib_ports: list[IBPort] = []
    nvme: list[NVMe] = []

    @model_validator(mode="after")
    def _layout(self) -> Hardware:
        layout = (self.sockets, self.cores_per_socket, self.threads_per_core)
        if all(x is None for x in layout):
            return self
        if any(x is None for x in layout):
            raise ValueError("sockets, cores_per_socket and threads_per_core go together: "
                             "give all three or none")
        sockets, cores, threads = layout
        if sockets * cores * threads != self.cpus:
            raise ValueError(f"sockets x cores_per_socket x threads_per_core is "
                             f"{sockets} x {cores} x {threads} = {sockets * cores * threads}, "
                             f"but cpus is {self.cpus}")
        return self


class HostSpec(BaseModel):
    """One host's own fields. Component settings (``slurm_*`` ...) pass through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    ssh_hostname: IPAddress
    ssh_user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]*$")] = "root"
    ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22
    ssh_key: str | None = None
    #: Seconds the SSH connection to the host stays open after a run (0: none kept).
    ssh_control_persist: Annotated[int, Field(ge=0, le=86400)] = 60
    hardware: Hardware = Hardware()


class Network(_Model):
    subnet: IPNetwork
    mtu: int | None = None


class SecretRef(_Model):
    """A secret is named by reference: a file on the deploying machine or an env var."""

    file: str | None = None
    env: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if self.file is not None and self.env is not None:
            raise ValueError("gives both 'file' and 'env'; give exactly one of them")
        if self.file is None and self.env is None:
            raise ValueError("gives neither 'file' nor 'env'; give exactly one of them")
        if self.env is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", self.env):
            raise ValueError(f"{self.env!r} is not an environment variable name")
        return self


class ClusterSpec(BaseModel):
    """Cluster-wide settings (``group_data/all.py`` and the inventory file's group)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    cluster_name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,39}$")] = "aicluster"
    networks: dict[str, Network]
    secrets: dict[str, SecretRef] = {}
    package_cache: str | None = None
    package_proxy: Annotated[str | None, Field(pattern=r"^https?://[^\s/]+(:[0-9]+)?/?$")] = None
    #: Release artifacts (aicluster.artifacts), on the deploying machine: a directory
    #: of pinned files for sites without internet, and the download cache.
    artifacts_dir: str | None = None
    artifacts_cache_dir: str | None = None
    #: The pyinfra accelerator (aicluster.accel: fact memo and prefetch, cheaper
    #: operation bookkeeping, one connection per host). False: the deploy runs on stock
    #: pyinfra. It is off anyway on a pyinfra it was not tested with, or with
    #: AICLUSTER_ACCEL=0 in the environment.
    pyinfra_accelerator: bool = True
    #: Components whose packages (and software installed beside the package manager)
    #: a deploy removes from a host the inventory no longer gives them
    #: (aicluster.common.absence); any other component's packages stay.
    remove_packages: list[str] = []

    @field_validator("artifacts_dir", "artifacts_cache_dir")
    @classmethod
    def _local_dir(cls, v: str | None) -> str | None:
        if v is None:
            return v
        path = Path(v).expanduser()
        if not path.is_absolute():
            raise ValueError(
                f"{v!r} is not an absolute path (a directory on the deploying machine)"
            )
        if path.exists() and not path.is_dir():
            raise ValueError(f"{v} exists and is not a directory")
        return v

    @field_validator("networks")
    @classmethod
    def _networks(cls, v: dict[str, Network]) -> dict[str, Network]:
        unknown = sorted(set(v) - set(NETWORK_NAMES))
        if unknown:
            raise ValueError(
                f"unknown network(s) {', '.join(unknown)}; known: {', '.join(NETWORK_NAMES)}"
            )
        if "management" not in v:
            raise ValueError("the management network is required")
        names = list(v)
        for i, name in enumerate(names):
            for other in names[:i]:
                a, b = v[other].subnet, v[name].subnet
                if a.version == b.version and a.overlaps(b):
                    raise ValueError(
                        f"{name}.subnet: {b} overlaps the {other} network {a}; each network "
                        "needs a subnet of its own (the firewall, the routes and every "
                        "'address on network X' rule tell them apart by subnet)"
                    )
        for name, network in v.items():
            kind = "ipoib-connected" if name == "ib" else "ethernet"
            low, high = MTU_LIMITS[kind]
            if network.mtu is not None and not low <= network.mtu <= high:
                raise ValueError(
                    f"{name}.mtu: MTU {network.mtu} is out of range for the {name} network "
                    f"({low}-{high})"
                )
        return v

    @field_validator("secrets", mode="before")
    @classmethod
    def _no_inline(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            for name, ref in v.items():
                if not isinstance(ref, Mapping):
                    raise ValueError(
                        f"secret {name!r} is written inline; give {{'file': PATH}} "
                        f"or {{'env': VARIABLE}} instead"
                    )
        return v


# ---------------------------------------------------------------------------
# The validated cluster and its derived values
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    name: str
    groups: tuple[str, ...]
    spec: HostSpec
    data: Mapping[str, Any]
    #: The groups of the whole cluster that have a host (COMPONENT_CLUSTER_GROUPS).
    cluster_groups: frozenset[str] = frozenset()

    @property
    def address(self) -> str:
        return str(self.spec.ssh_hostname)

    def components(self) -> list[str]:
        """The components this host is given, in deploy order: by its groups, by a
        data key that asks for the component (COMPONENT_DATA_KEYS), or by a group any
        host of the cluster is in (COMPONENT_CLUSTER_GROUPS)."""
        return [
            c
            for c, groups in COMPONENT_GROUPS.items()
            if not groups
            or any(g in self.groups for g in groups)
            or self.data.get(COMPONENT_DATA_KEYS.get(c, ""), None) is not None
            or COMPONENT_CLUSTER_GROUPS.get(c, "") in self.cluster_groups
        ]

    def roles(self) -> dict[str, list[str]]:
        """Each component this host is given, with the groups of that component it is in
        (its roles there, e.g. ``slurm_controller``): what a deploy records on the node
        (aicluster.common.absence)."""
        return {c: [g for g in COMPONENT_GROUPS[c] if g in self.groups]
                for c in self.components()}

    def network_address(self, network: str) -> str | None:
        """This host's address on a network (NICs first, then IPoIB ports, then the
        bonds and VLANs of ``network_bonds``/``network_vlans``)."""
        for item in (*self.spec.hardware.nics, *self.spec.hardware.ib_ports):
            if item.network == network and item.address is not None:
                return str(item.address)
        for key in ("network_bonds", "network_vlans"):
            entries = self.data.get(key)
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, Mapping) and entry.get("network") == network \
                        and entry.get("address"):
                    return str(entry["address"])
        return None


@dataclass(frozen=True)
class Cluster:
    spec: ClusterSpec
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]]
    warnings: list[str] = field(default_factory=list)

    def group(self, name: str) -> tuple[str, ...]:
        return self.groups.get(name, ())

    def etc_hosts(self) -> list[dict[str, Any]]:
        """Entries for /etc/hosts: every node by its management name, and where it has
        them, ``<node>-fabric`` and ``<node>-ib`` (and ``<node>-storage``)."""
        entries = []
        for name, host in self.hosts.items():
            entries.append({"address": host.address, "names": [name]})
            for network, suffix in (("fabric", "fabric"), ("storage", "storage"), ("ib", "ib")):
                address = host.network_address(network)
                if address:
                    entries.append({"address": address, "names": [f"{name}-{suffix}"]})
        return entries

    def network_subnets(self) -> list[str]:
        """The cluster's own networks, management first."""
        return [str(n.subnet) for n in self.spec.networks.values()]

    def trusted_sources(self, host_name: str) -> list[str]:
        """The source networks a host's firewall accepts everything from: the cluster's
        own networks, then the networks its components' traffic comes from on that host
        (each component's ``derive.trusted_sources(cluster, host_name, data)``, found
        through the registry: k3s's pod and service networks)."""
        out = self.network_subnets()
        host = self.hosts[host_name]
        for component in host.components():
            module = derive_module(component)
            extra = getattr(module, "trusted_sources", None) if module is not None else None
            for network in extra(self, host_name, host.data) if extra is not None else []:
                if network not in out:
                    out.append(network)
        return out


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


#: pydantic error types whose message does not show the value given: add it.
_SHOW_INPUT = frozenset(
    {
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "string_pattern_mismatch",
        "int_parsing",
        "int_type",
        "int_from_float",
        "bool_parsing",
        "bool_type",
        "literal_error",
        "string_type",
        "list_type",
        "dict_type",
        "float_type",
    }
)


def _pydantic_errors(where: str, exc: ValidationError | list[Any],
                     prefix: str = "") -> list[str]:
    errors = []
    for err in exc.errors() if isinstance(exc, ValidationError) else exc:
        # Drop pydantic's union-branch names ("IPv4Address") from the location.
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p[:1].isupper())]
        path = _loc([*([prefix] if prefix else []), *loc])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] in _SHOW_INPUT and "secrets" not in loc:
            shown = repr(err["input"])
            msg += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
        errors.append(f"{where}: {path}: {msg}" if path else f"{where}: {msg}")
    return errors


#: Data keys pyinfra and Ansible read themselves (they pass through unchecked).
_ENGINE_KEY_RE = re.compile(r"^(_|ansible_|ssh_|winrm_|docker_|chroot_|local_|terraform_)")


def _near_misses(where: str, data: Mapping[str, Any]) -> list[str]:
    """A data key that is no field, no component setting and no engine's own key, but
    nearly a field's name (``hardwre``, ``network`` for ``networks``): refused with the
    name meant, since the field would silently keep its default."""
    known = sorted({*HostSpec.model_fields, *ClusterSpec.model_fields})
    errors = []
    for key in data:
        key = str(key)
        if key in known or component_of_key(key) is not None or _ENGINE_KEY_RE.match(key):
            continue
        near = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        if near:
            errors.append(f"{where}: {key}: not a host or cluster field; did you mean "
                          f"{near[0]}?")
    return errors


def _inline_secrets(data: Mapping[str, Any], path: str = "") -> list[str]:
    """Field paths whose name says "secret" but whose value is written inline."""
    found = []
    for key, value in data.items():
        here = f"{path}.{key}" if path else str(key)
        if key == "secrets":
            continue
        if isinstance(value, Mapping):
            found += _inline_secrets(value, here)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    found += _inline_secrets(item, f"{here}[{i}]")
        elif (
            SECRET_KEY_RE.search(str(key))
            and not SECRET_REF_KEY_RE.search(str(key))
            and isinstance(value, str)
            and value
        ):
            found.append(here)
    return found


def validate(
    hosts: Mapping[str, tuple[Iterable[str], Mapping[str, Any]]],
    *,
    extra_groups: Iterable[str] = (),
    defined_twice: Mapping[str, list[str]] | None = None,
    undeclared: Mapping[str, list[str]] | None = None,
    source: str | None = None,
) -> Cluster:
    """Validate every host (name -> (groups, merged data)) and the cluster as a whole.

    ``defined_twice``: hosts given with data in more than one group (host -> groups);
    ``undeclared``: names a group lists that ``all`` does not give (name -> groups).
    Raises :class:`InventoryError` listing every problem found.
    """
    errors: list[str] = []
    allowed_groups = KNOWN_GROUPS | set(extra_groups) | {"all"}
    parsed: dict[str, Host] = {}
    cluster_specs: dict[str, ClusterSpec] = {}

    for name, where_groups in (defined_twice or {}).items():
        errors.append(
            f"host {name!r}: defined twice (with data in groups {', '.join(where_groups)}); "
            "give its data once and name it alone elsewhere"
        )
    for name, where_groups in (undeclared or {}).items():
        errors.append(
            f"host {name!r}: groups: named in {', '.join(where_groups)} but not given in "
            "'all'; add it to 'all' with its data, or correct the name"
        )

    if not hosts:
        raise InventoryError(["the inventory has no hosts"], source)

    for name, (groups, data) in hosts.items():
        where = f"host {name!r}"
        groups = tuple(g for g in groups if g != "all")
        if not HOSTNAME_RE.match(name):
            errors.append(f"{where}: name: not a valid host name (a-z, 0-9, '-'; max 63)")
        for g in groups:
            if g not in allowed_groups:
                errors.append(
                    f"{where}: groups: unknown group {g!r}; known groups: "
                    f"{', '.join(sorted(KNOWN_GROUPS))}"
                )
        errors += _near_misses(where, data)
        inline = _inline_secrets(data)
        for path in inline:
            errors.append(
                f"{where}: {path}: a secret is written inline; put it in a file or an "
                "environment variable and name it under 'secrets'"
            )
        for key, value in data.items():
            # A component's settings model checks its own versions.
            if key.endswith("_version") and value is not None and not _modelled(key):
                if not isinstance(value, str) or not VERSION_RE.match(value):
                    errors.append(
                        f"{where}: {key}: {value!r} is not a version (like '23.11.4' or '535')"
                    )
        # An inline secret is reported once, as one (never as an unknown key besides).
        errors += [e for e in _settings_errors(where, data)
                   if not any(e.startswith(f"{where}: {path}:") for path in inline)]
        try:
            spec = HostSpec.model_validate(dict(data))
        except ValidationError as exc:
            errors += _pydantic_errors(where, exc)
            spec = None
        try:
            cluster_specs[name] = ClusterSpec.model_validate(dict(data))
        except ValidationError as exc:
            errors += _pydantic_errors(where, exc)
        if spec is not None:
            parsed[name] = Host(name=name, groups=groups, spec=spec, data=data)

    if not cluster_specs:
        raise InventoryError(_collapse(errors), source)
    for fld in ClusterSpec.model_fields:
        first_name = majority_first(cluster_specs, lambda n, f=fld: getattr(cluster_specs[n], f))
        cspec = cluster_specs[first_name]
        for name, other in cluster_specs.items():
            if getattr(other, fld) != getattr(cspec, fld):
                    errors.append(
                        f"host {name!r}: {fld}: not the same as on host {first_name!r}; "
                        "cluster-wide settings must be the same for every host (set them in "
                        "group_data)"
                    )
    cspec = cluster_specs[majority_first(cluster_specs, lambda n: cluster_specs[n])]

    groups: dict[str, tuple[str, ...]] = {}
    for name, (hgroups, _data) in hosts.items():
        for g in hgroups:
            if g != "all":
                groups.setdefault(g, ())
                groups[g] += (name,)

    present = frozenset(g for g, members in groups.items()
                        if members and g in COMPONENT_CLUSTER_GROUPS.values())
    parsed = {n: replace(h, cluster_groups=present) for n, h in parsed.items()}
    errors += _check_hosts(parsed, cspec)
    errors += _check_secret_names(parsed, cspec)
    errors += _check_groups(parsed, groups, cspec)
    if errors:
        raise InventoryError(_collapse(errors), source)

    cluster = Cluster(spec=cspec, hosts=parsed, groups=groups)
    errors += _component_checks(cluster)
    if errors:
        raise InventoryError(_collapse(errors), source)
    cluster.warnings.extend(_warnings(cluster))
    cluster.warnings.extend(_minio_archived_warning(cluster))
    cluster.warnings.extend(_component_warnings(cluster))
    return cluster


def majority_first(names: Iterable[str], value_of: Any) -> str:
    """The host whose value most hosts share (the first such host, in inventory order):
    the reference a "must be the same on every host" rule compares the others with, so
    that one odd host is reported, not every host that agrees with the rest."""
    names = list(names)
    values = [value_of(n) for n in names]
    counts = [sum(1 for w in values if w == v) for v in values]
    return names[counts.index(max(counts))]


def _collapse(errors: list[str]) -> list[str]:
    """One line per problem: the same problem on several hosts (a bad value in
    group_data/all.py reaches every host) is reported once, naming the other hosts."""
    out: list[str] = []
    first: dict[str, int] = {}
    others: dict[str, list[str]] = {}
    for line in errors:
        m = re.match(r"^host '([^']*)': (.*)$", line, re.S)
        if not m:
            out.append(line)
            continue
        name, problem = m.groups()
        if problem in first:
            others[problem].append(name)
        else:
            first[problem] = len(out)
            others[problem] = []
            out.append(line)
    for problem, i in first.items():
        more = others[problem]
        if more:
            shown = ", ".join(repr(h) for h in more[:3]) + (", ..." if len(more) > 3 else "")
            out[i] += f" (and on {len(more)} more host(s): {shown})"
    return out


def settings_model(component: str) -> type[ComponentSettings] | None:
    """The component's settings model, or None where it has none yet."""
    module = model_module(component)
    return getattr(module, "Settings", None) if module is not None else None


def _modelled(key: str) -> bool:
    """Whether a host data key is a setting of a component that has a settings model."""
    component = component_of_key(key)
    return component is not None and settings_model(component) is not None


def component_of_key(key: str) -> str | None:
    """The component whose settings a host data key is (by its prefix), or None."""
    found = [c for c in COMPONENT_ORDER if key.startswith(f"{c}_")]
    return max(found, key=len) if found else None


def _modelled(key: str) -> bool:
    """Whether a component's settings model checks this data key."""
    component = component_of_key(key)
    return component is not None and settings_model(component) is not None


#: pydantic's names in an error's location that are no part of the path: a union's
#: branch (``str``, ``function-after[...]``) and the mark of a mapping's key (``[key]``).
_NOT_A_PATH = re.compile(r"^(str|int|float|bool|none|list|dict|.*\[.*\])$")


def _settings_path(loc: Iterable[Any]) -> str:
    return _loc(p for p in loc if not (isinstance(p, str) and _NOT_A_PATH.match(p)))


def _settings_errors(where: str, data: Mapping[str, Any]) -> list[str]:
    """Each component's settings the host's data gives, checked by the component's
    model (on the role's defaults under the host's data): host and field named, an
    unknown key with the nearest known name."""
    from aicluster.render import defaults

    given: dict[str, list[str]] = {}
    for key in data:
        component = component_of_key(str(key))
        if component is not None:
            given.setdefault(component, []).append(str(key))
    errors: list[str] = []
    for component, keys in given.items():
        model = settings_model(component)
        if model is None:
            continue
        values = defaults(component)
        values.update({k: data[k] for k in keys})
        try:
            model.model_validate(values)
        except ValidationError as exc:
            known = sorted(model.model_fields)
            for err in exc.errors():
                if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
                    key = str(err["loc"][0])
                    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                    hint = f"did you mean {near[0]}?" if near else (
                        f"the {component} settings are: {', '.join(known)}")
                    errors.append(f"{where}: {key}: not a {component} setting; {hint}")
            # The path as one part: a settings path may hold a key written in capitals
            # (minio_config.MINIO_BROWSER), which _pydantic_errors would take for the name
            # of a union's branch.
            rest = [{**e, "loc": (_settings_path(e["loc"]),)} for e in exc.errors()
                    if e["type"] != "extra_forbidden" or len(e["loc"]) > 1]
            if rest:
                errors += _pydantic_errors(where, rest)
    return errors


def _from_components(function: str, cluster: Cluster) -> list[str]:
    """What each built component's own ``function(cluster)`` says
    (``aicluster.components.<c>.derive``, found through the components' registry), in
    deploy order."""
    lines: list[str] = []
    for component in COMPONENT_ORDER:
        module = derive_module(component)
        if module is not None and hasattr(module, function):
            lines += getattr(module, function)(cluster)
    return lines


def _component_checks(cluster: Cluster) -> list[str]:
    """Each built component's own ``validate(cluster)``: its refusals."""
    return _from_components("validate", cluster)


def _component_warnings(cluster: Cluster) -> list[str]:
    """Each built component's own ``warnings(cluster)``: what its planning advice says
    of the plan without refusing it (printed by ``aicluster validate`` and every deploy)."""
    return _from_components("warnings", cluster)


def derived_vars(cluster: Cluster, host_name: str) -> dict[str, Any]:
    """Every derived value the host's components' templates use (for Ansible)."""
    host = cluster.hosts[host_name]
    out: dict[str, Any] = {}
    for component in host.components():
        module = derive_module(component)
        if module is not None and hasattr(module, "derived_vars"):
            out.update(module.derived_vars(cluster, host_name, host.data))
    return out


def _check_hosts(hosts: Mapping[str, Host], cspec: ClusterSpec) -> list[str]:
    errors = []
    seen_addr: dict[str, str] = {}
    seen_mac: dict[str, str] = {}
    for name, host in hosts.items():
        where = f"host {name!r}"
        mgmt = cspec.networks.get("management")
        addrs: list[tuple[str, Any, str]] = [("ssh_hostname", host.spec.ssh_hostname, "management")]
        hw = host.spec.hardware
        for i, nic in enumerate(hw.nics):
            if nic.address is not None:
                addrs.append((f"hardware.nics[{i}].address", nic.address, nic.network))
            if nic.network not in cspec.networks:
                errors.append(
                    f"{where}: hardware.nics[{i}].network: unknown network {nic.network!r}; "
                    f"declared: {', '.join(cspec.networks)}"
                )
            if nic.mac:
                if nic.mac in seen_mac:
                    errors.append(
                        f"{where}: hardware.nics[{i}].mac: {nic.mac} is also used by "
                        f"{seen_mac[nic.mac]}"
                    )
                seen_mac[nic.mac] = f"host {name!r}"
        for i, port in enumerate(hw.ib_ports):
            if port.address is not None:
                addrs.append((f"hardware.ib_ports[{i}].address", port.address, port.network))
            if port.network and port.network not in cspec.networks:
                errors.append(
                    f"{where}: hardware.ib_ports[{i}].network: unknown network "
                    f"{port.network!r}; declared: {', '.join(cspec.networks)}"
                )
        ports = [(p.ident(), p.port) for p in hw.ib_ports]
        for i, port in enumerate(ports):
            if port in ports[:i]:
                errors.append(f"{where}: hardware.ib_ports[{i}]: {port[0]} port {port[1]} is "
                              "listed twice")
        devices = [d.device for d in hw.nvme]
        for i, dev in enumerate(devices):
            if dev in devices[:i]:
                errors.append(f"{where}: hardware.nvme[{i}].device: {dev} is listed twice")
        names = [nic.name for nic in hw.nics if nic.name]
        for i, nic in enumerate(hw.nics):
            if nic.name and names.count(nic.name) > 1 and names.index(nic.name) != i:
                errors.append(f"{where}: hardware.nics[{i}].name: {nic.name} is listed twice")
        for fld, addr, network in addrs:
            net = cspec.networks.get(network) if network else None
            if network == "management" and mgmt is None:
                continue
            if net is not None and addr not in net.subnet:
                errors.append(
                    f"{where}: {fld}: {addr} is outside the {network} network {net.subnet}"
                )
            elif net is not None and net.subnet.version == 4 and net.subnet.prefixlen < 31 \
                    and addr in (net.subnet.network_address, net.subnet.broadcast_address):
                which = "network" if addr == net.subnet.network_address else "broadcast"
                errors.append(
                    f"{where}: {fld}: {addr} is the {which} address of the {network} network "
                    f"{net.subnet}, not a host's; give an address between them"
                )
            key = str(addr)
            if key in seen_addr:
                errors.append(f"{where}: {fld}: address {addr} is also used by {seen_addr[key]}")
            else:
                seen_addr[key] = f"host {name!r} ({fld})"
    return errors


#: Component settings that name a secret under ``secrets`` (``slurm_munge_key_name``).
SECRET_NAME_KEY_RE = re.compile(r"_keys?_name$")


def _check_secret_names(hosts: Mapping[str, Host], cspec: ClusterSpec) -> list[str]:
    """A setting naming a secret names one the inventory declares under ``secrets``; only
    the component's default name may be left undeclared (its secret is then the file
    ``~/.local/share/aicluster/<cluster_name>/...``, made once). A misspelt name is
    refused rather than silently given a new, generated secret."""
    from aicluster.render import defaults

    errors = []
    for name, host in hosts.items():
        for key, value in host.data.items():
            component = component_of_key(str(key))
            # (A name that is not a secret name at all is the settings model's refusal.)
            if component is None or not SECRET_NAME_KEY_RE.search(str(key)) \
                    or not isinstance(value, str) or not re.match(r"^[a-z][a-z0-9_]*$", value):
                continue
            default = defaults(component).get(key)
            if value == default or value in cspec.secrets:
                continue
            declared = ", ".join(sorted(cspec.secrets)) or "none"
            errors.append(
                f"host {name!r}: {key}: names the secret {value!r}, which `secrets` does not "
                f"declare (declared: {declared}); add it to `secrets` as {{'file': PATH}} "
                f"(made once when missing) or {{'env': VARIABLE}}, or correct the name"
            )
    return errors


def _check_groups(
    hosts: Mapping[str, Host], groups: Mapping[str, tuple[str, ...]], cspec: ClusterSpec
) -> list[str]:
    errors = []

    def members(g: str) -> tuple[str, ...]:
        return groups.get(g, ())

    pairs = [
        ("slurm_workers", "slurm_controller", (1, 2), "one slurm_controller (two with a backup)"),
        ("ray_workers", "ray_head", (1, 1), "exactly one ray_head"),
        ("k3s_agents", "k3s_servers", (1, 99), "at least one k3s_servers host"),
        ("ceph_osds", "ceph_mons", (1, 99), "at least one ceph_mons host"),
        ("nfs_clients", "nfs_server", (1, 1), "exactly one nfs_server"),
    ]
    for workers, ctrl, (low, high), wanted in pairs:
        have = len(members(ctrl))
        if members(workers) and not low <= have <= high:
            first = members(workers)[0]
            errors.append(
                f"host {first!r}: groups: is in {workers}, which needs {wanted}; "
                f"the inventory has {have}"
            )
        elif have > high:
            errors.append(
                f"host {members(ctrl)[high]!r}: groups: {ctrl} allows at most {high} host(s); "
                f"the inventory has {have} ({', '.join(repr(m) for m in members(ctrl))})"
            )
    for name in members("gpu_nodes"):
        if name in hosts and hosts[name].spec.hardware.gpus.count == 0:
            errors.append(
                f"host {name!r}: hardware.gpus.count: is in gpu_nodes but declares no GPUs"
            )
    # An ib_nodes host that declares no InfiniBand port is valid: it gets the RDMA
    # packages and no subnet manager (the infiniband deploy says so).
    if cspec.package_cache and hosts and cspec.package_cache not in hosts:
        first = next(iter(hosts))
        errors.append(
            f"host {first!r}: package_cache: {cspec.package_cache!r} is not a host of "
            "this inventory"
        )
    errors += _check_remove_packages(cspec, hosts)
    return errors


def _check_remove_packages(cspec: ClusterSpec, hosts: Mapping[str, Host]) -> list[str]:
    """``remove_packages`` names components whose removal uninstalls something."""
    errors = []
    first = next(iter(hosts), "")
    for name in cspec.remove_packages:
        if name not in COMPONENT_ORDER:
            near = difflib.get_close_matches(name, COMPONENT_ORDER, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]}?" if near else (
                f"the components are: {', '.join(COMPONENT_ORDER)}")
            errors.append(f"host {first!r}: remove_packages: {name!r} is not a component; "
                          f"{hint}")
            continue
        module = derive_module(name)
        spec = getattr(module, "REMOVAL", None) or {}
        if not any(e.get("packages") or e.get("software") for e in spec.values()):
            why = getattr(module, "KEEP_PACKAGES", "its removal uninstalls nothing")
            errors.append(f"host {first!r}: remove_packages: {name!r}: {why}")
    return errors


def _warnings(cluster: Cluster) -> list[str]:
    warnings = []
    if len(cluster.group("ollama")) > 1 and not cluster.group("ollama_gateway"):
        warnings.append(
            "ollama runs on several nodes without an ollama_gateway: each Ollama serves "
            "alone; add a gateway node to balance requests across them"
        )
    mons = cluster.group("ceph_mons")
    if mons and len(mons) % 2 == 0:
        warnings.append(
            f"host {mons[-1]!r}: groups: ceph_mons has {len(mons)} hosts "
            f"({', '.join(repr(m) for m in mons)}); an even number of monitors survives no "
            f"more failures than {len(mons) - 1} (a quorum is a majority): use an odd number"
        )
    gpu_hosts = [n for n in cluster.group("gpu_nodes") if n in cluster.hosts
                 and cluster.hosts[n].spec.hardware.gpus.count > 0
                 and cluster.hosts[n].spec.hardware.gpus.vendor != "standin"]
    if len(gpu_hosts) > 1:
        for name in gpu_hosts:
            for i, nic in enumerate(cluster.hosts[name].spec.hardware.nics):
                if nic.network == "fabric" and nic.speed_gbps < FABRIC_MIN_GBPS:
                    warnings.append(
                        f"host {name!r}: hardware.nics[{i}].speed_gbps: {nic.speed_gbps} Gb/s "
                        f"on the fabric network of a cluster with {len(gpu_hosts)} GPU nodes; "
                        f"jobs across nodes want at least {FABRIC_MIN_GBPS} Gb/s"
                    )
    if cluster.group("slurm_workers") and len(cluster.group("slurm_controller")) == 1:
        warnings.append(
            "slurm_controller has one host: it is a single point of failure "
            "(name a second host for a backup controller)"
        )
    warnings += _shared_gpus(cluster, gpu_hosts)
    warnings += _subnet_managers_in_one_batch(cluster, gpu_hosts)
    return warnings


#: The groups that hand a node's GPUs out, each as its own: what each calls them.
GPU_SCHEDULERS = (
    (("slurm_workers",), "Slurm (GRES)"),
    (("ray_head", "ray_workers"), "Ray (--num-gpus)"),
    (("k3s_servers", "k3s_agents"), "k3s (nvidia.com/gpu)"),
    (("ollama",), "Ollama"),
)


def _shared_gpus(cluster: Cluster, gpu_hosts: list[str]) -> list[str]:
    """A GPU node given to more than one scheduler: each hands out all its GPUs as its
    own, and none fences the others (Slurm's ConstrainDevices fences Slurm's jobs only)."""
    out = []
    for name in gpu_hosts:
        given = [what for groups, what in GPU_SCHEDULERS
                 if any(name in cluster.group(g) for g in groups)]
        if len(given) > 1:
            count = cluster.hosts[name].spec.hardware.gpus.count
            out.append(
                f"host {name!r}: groups: its {count} GPUs are handed out by "
                f"{', '.join(given)} at once, each as its own: a job given all of them by "
                f"one finds the others' processes on them (memory, compute); give each GPU "
                f"node one of them, or keep the others off its GPUs")
    return out


def _subnet_managers_in_one_batch(cluster: Cluster, gpu_hosts: list[str]) -> list[str]:
    """Every opensm host in one batch of a driver change on all GPU nodes (the batches go
    in inventory order, nvidia_upgrade_batch_size at a time): the batch reboots them
    together and the fabric has no subnet manager meanwhile."""
    infiniband, nvidia = derive_module("infiniband"), derive_module("nvidia")
    if infiniband is None or nvidia is None or not gpu_hosts:
        return []
    sms = [h for h, _ in infiniband.opensm_hosts(cluster) if h in gpu_hosts]
    if len(sms) < 2:
        return []
    size, batches = nvidia.upgrade_batches(cluster, gpu_hosts)
    if not any(set(sms) <= set(b) for b in batches):
        return []
    return [f"host {sms[-1]!r}: infiniband_opensm_priority: every subnet manager "
            f"({', '.join(sms)}) is in one batch of nvidia_upgrade_batch_size "
            f"{size}: a driver change on every GPU node reboots them together, and the "
            "fabric has no subnet manager meanwhile (a link that flaps stays down); put them "
            "apart in the "
            "inventory's order, or lower the batch size"]


def _minio_archived_warning(cluster: Cluster) -> list[str]:
    """The minio component installs MinIO's community edition, which is archived upstream
    (docs/components/minio.md): say so whenever the plan has MinIO hosts."""
    hosts = cluster.group("minio")
    if not hosts:
        return []
    return [
        f"host {hosts[0]!r}: groups: minio: MinIO's community edition is archived upstream "
        "and gets no more releases or security fixes; the pinned release still installs "
        "(from its GitHub release assets, minio_release_base_url); plan a move to a "
        "maintained S3 store (docs/components/minio.md)"
    ]


# ---------------------------------------------------------------------------
# Loading an inventory file (pyinfra's own loader) and the engine hooks
# ---------------------------------------------------------------------------

_LOADING = False


@contextmanager
def _loading():
    """Mark that aicluster itself is executing inventory files, inside a pyinfra state
    (pyinfra's file loader records the file it executes in the current state)."""
    global _LOADING
    from pyinfra.api import State
    from pyinfra.context import ctx_state

    previous, _LOADING = _LOADING, True
    try:
        if ctx_state.isset():
            yield
        else:
            with ctx_state.use(State()):
                yield
    finally:
        _LOADING = previous


#: The name prefix that gives a host to aicluster's ``openssh`` connector
#: (aicluster.connectors.openssh): ``@openssh/gpu1`` is the host ``gpu1``.
OPENSSH_PREFIX = "@openssh/"


def _host_name(name: Any) -> Any:
    """The host's name as pyinfra makes it from a name in the raw file: ``gpu1`` for
    ``gpu1`` and ``@openssh/gpu1`` alike."""
    return name.removeprefix(OPENSSH_PREFIX) if isinstance(name, str) else name


def _raw_group_items(module_globals: Mapping[str, Any]):
    """(group, items) for each group of the raw inventory file, as pyinfra reads them:
    public lists, or ``(list, data)`` tuples."""
    for key, value in module_globals.items():
        if key.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        items = value[0] if isinstance(value, tuple) else value
        if isinstance(items, (list, tuple)):
            yield key, items


def _raw_definitions(module_globals: Mapping[str, Any]) -> dict[str, list[str]]:
    """Hosts given with data in more than one group of the raw inventory file."""
    where: dict[str, list[str]] = {}
    for key, items in _raw_group_items(module_globals):
        for item in items:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                where.setdefault(_host_name(item[0]), []).append(key)
    return {h: gs for h, gs in where.items() if len(gs) > 1}


def _raw_groups(module_globals: Mapping[str, Any]) -> dict[str, list[str]]:
    """Group -> host names, as the raw inventory file lists them."""
    groups: dict[str, list[str]] = {}
    for key, items in _raw_group_items(module_globals):
        names = [_host_name(item[0] if isinstance(item, tuple) else item) for item in items]
        if all(isinstance(n, str) for n in names):
            groups[key] = names
    return groups


def _undeclared(module_globals: Mapping[str, Any]) -> dict[str, list[str]]:
    """Names a group lists that the file's ``all`` does not give (pyinfra drops them
    silently, so a typo would lose the host its role)."""
    groups = _raw_groups(module_globals)
    if "all" not in groups:
        return {}
    declared = set(groups["all"])
    out: dict[str, list[str]] = {}
    for group, names in groups.items():
        for name in names:
            if name not in declared and group not in out.get(name, []):
                out.setdefault(name, []).append(group)
    return out


def _forget_compiled(path: str | os.PathLike) -> None:
    """pyinfra caches the code of every file it executes by file name: drop the
    inventory's and its group_data's, so a file edited since is read again."""
    from pyinfra_cli.util import PYTHON_CODES

    inventory = Path(path).resolve()
    group_data = inventory.parent / "group_data"
    for key in list(PYTHON_CODES):
        resolved = Path(key).resolve()
        if resolved == inventory or resolved.parent == group_data:
            PYTHON_CODES.pop(key, None)


def load_hosts(
    path: str | os.PathLike,
    override_data: Mapping[str, Any] | None = None,
    *,
    cwd: str | os.PathLike | None = None,
    group_data_directories: Iterable[str] = (),
) -> dict[str, tuple[tuple[str, ...], dict[str, Any]]]:
    """Load an inventory file exactly as the pyinfra CLI does, without connecting.

    ``override_data`` is pyinfra's ``--data key=value`` (and ``--ssh-user`` ...), laid
    over everything; ``cwd`` and ``group_data_directories`` are pyinfra's working
    directory and ``--group-data``. Returns host name -> (groups, merged data:
    override > host > group > all). A Python error in the file or its group_data is
    an :class:`InventoryError` (``file:line: message``).
    """
    from pyinfra_cli.inventory import make_inventory_from_files

    path = str(path)
    if not Path(path).is_file():
        raise InventoryError([f"no such inventory file: {path}"])
    _forget_compiled(path)
    try:
        with _loading():
            inventory = make_inventory_from_files(
                path,
                override_data=dict(override_data or {}),
                cwd=str(cwd or Path(path).resolve().parent),
                group_data_directories=list(group_data_directories) or None,
            )
    except Exception as exc:  # a Python error in the user's inventory or group data
        raise InventoryError([python_error(exc, path)], path) from None
    out = {}
    for host in inventory:
        out[host.name] = (tuple(host.groups), dict(host.data.dict()))
    return out


def python_error(exc: BaseException, path: str | os.PathLike) -> str:
    """A Python error raised while an inventory file (or its group data) was executed,
    as one line, ``file:line: Type: message``: the line in the user's file, not
    pyinfra's or ours (pyinfra wraps the error in an UnexpectedExternalError)."""
    cause = getattr(exc, "exception", exc)
    if isinstance(cause, SyntaxError):
        where = f"{cause.filename or path}:{cause.lineno}" if cause.lineno else str(path)
        return f"{where}: SyntaxError: {cause.msg}"
    tb = getattr(cause, "_traceback", None) or cause.__traceback__
    inventory = Path(path).resolve()
    frames = list(traceback.extract_tb(tb)) if tb is not None else []
    mine = [f for f in frames
            if Path(f.filename).resolve() == inventory
            or Path(f.filename).resolve().parent.name == "group_data"]
    frame = (mine or frames or [None])[-1]
    where = f"{frame.filename}:{frame.lineno}" if frame is not None else str(path)
    message = f"{where}: {type(cause).__name__}: {cause}"
    if isinstance(cause, NameError) and getattr(cause, "name", None) in _PYTHON_SPELLING:
        message += f" (Python writes {_PYTHON_SPELLING[cause.name]})"
    return message


#: Other languages' constants an inventory written by hand may hold.
_PYTHON_SPELLING = {"true": "True", "false": "False", "null": "None", "none": "None",
                    "yes": "True", "no": "False", "TRUE": "True", "FALSE": "False"}


def _module_settings(path: str | os.PathLike, module_globals: Mapping[str, Any]) -> list[str]:
    """Public module-level names of the inventory file that are neither a group (a list
    or a tuple) nor an import, a function or a class: settings pyinfra silently
    ignores (``slurm_version = "23.11"`` at the top of the file)."""
    import ast
    import types

    lines: dict[str, int] = {}
    try:
        tree = ast.parse(Path(path).read_text(), str(path))
        for node in tree.body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                       else [])
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        lines.setdefault(name.id, node.lineno)
    except (OSError, SyntaxError):
        pass
    errors = []
    for key, value in module_globals.items():
        if key.startswith("_") or isinstance(value, (list, tuple)):
            continue
        if isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                              type)) or callable(value):
            continue
        where = f"{path}:{lines[key]}" if key in lines else str(path)
        if key in KNOWN_GROUPS and isinstance(value, str):
            errors.append(f"{where}: {key}: a group is a list of host names: "
                          f"{key} = [{value!r}]")
            continue
        errors.append(
            f"{where}: {key}: a module-level variable is not a setting (pyinfra reads only "
            "lists and tuples here, as groups, and ignores the rest); put it in the data of "
            "'all' (all = (hosts, {...})), of a group, or in group_data/all.py, or name it "
            "with a leading '_' if it is a helper"
        )
    return errors


def _file_group(path: str | os.PathLike) -> str:
    return Path(path).name.rsplit(".", 1)[0]


def load_cluster(
    path: str | os.PathLike,
    override_data: Mapping[str, Any] | None = None,
    *,
    cwd: str | os.PathLike | None = None,
    group_data_directories: Iterable[str] = (),
) -> Cluster:
    """Load and validate an inventory file (with pyinfra's ``--data`` overrides, its
    working directory and ``--group-data`` where given). Raises :class:`InventoryError`."""
    from pyinfra_cli.util import exec_file

    if not Path(path).is_file():
        raise InventoryError([f"no such inventory file: {path}"])
    try:
        _forget_compiled(path)
        with _loading():
            module_globals = exec_file(str(path), return_locals=True)
    except Exception as exc:  # a Python error in the user's inventory file
        raise InventoryError([python_error(exc, path)], str(path)) from None
    hosts = load_hosts(path, override_data, cwd=cwd,
                       group_data_directories=group_data_directories)
    module_errors = _module_settings(path, module_globals)
    try:
        cluster = validate(
            hosts,
            extra_groups=[_file_group(path)],
            defined_twice=_raw_definitions(module_globals),
            undeclared=_undeclared(module_globals),
            source=str(path),
        )
    except InventoryError as exc:
        raise InventoryError(module_errors + exc.errors, str(path)) from None
    if module_errors:
        raise InventoryError(module_errors, str(path))
    return cluster


def cluster_from_pyinfra(inventory) -> Cluster:
    """Validate the inventory pyinfra has loaded (used by deploy.py)."""
    hosts = {h.name: (tuple(h.groups), dict(h.data.dict())) for h in inventory}
    extra = {g for h in inventory for g in h.groups if g not in KNOWN_GROUPS}
    # pyinfra adds the inventory file's own name as a group holding every host.
    file_groups = {g for g in extra if all(g in h.groups for h in inventory)}
    return validate(hosts, extra_groups=file_groups)


def ansible_inventory(path: str | os.PathLike, cluster: Cluster | None = None) -> dict[str, Any]:
    """The Ansible JSON inventory for an inventory file: the same hosts, groups and
    merged data pyinfra sees, plus Ansible's connection variables."""
    cluster = cluster or load_cluster(path)
    hosts = load_hosts(path)
    out: dict[str, Any] = {"_meta": {"hostvars": {}}, "all": {"children": ["ungrouped"]}}
    for name, (_groups, data) in hosts.items():
        hv = {k: v for k, v in data.items() if not k.startswith("_")}
        hv.update(derived_vars(cluster, name))
        # The timeout and retries of every task that waits on the network (as pyinfra's).
        hv["aicluster_network_timeout"] = NETWORK_TIMEOUT
        hv["aicluster_network_retries"] = NETWORK_RETRIES
        # EL9: how a role reads and enables CodeReady Builder before it installs EPEL (as
        # the pyinfra deploys do, aicluster.common.epel).
        hv["aicluster_crb_state_command"] = epel.CRB_STATE_COMMAND
        hv["aicluster_crb_enable_command"] = epel.CRB_ENABLE_COMMAND
        # What the deploy records on the node, and takes away when it is no longer wanted.
        hv["aicluster_components"] = cluster.hosts[name].roles()
        hv["aicluster_mounts"] = host_mounts(cluster, name)
        hv["aicluster_remove_packages"] = list(cluster.spec.remove_packages)
        hv["ansible_host"] = str(data["ssh_hostname"])
        hv["ansible_user"] = data.get("ssh_user", "root")
        hv["ansible_port"] = data.get("ssh_port", 22)
        if data.get("ssh_key"):
            hv["ansible_ssh_private_key_file"] = data["ssh_key"]
        out["_meta"]["hostvars"][name] = json.loads(json.dumps(hv, default=str))
    for group, members in cluster.groups.items():
        out.setdefault(group, {"hosts": []})["hosts"] = list(members)
        if group not in out["all"]["children"]:
            out["all"]["children"].append(group)
    return out


def _refuse(exc: InventoryError) -> None:
    """Every entry point's refusal: the report on stderr, exit status 2, no traceback."""
    print(str(exc), file=sys.stderr)
    raise SystemExit(2)


def warning_lines(cluster: Cluster) -> list[str]:
    """The plan's warnings as every entry point prints them."""
    return [f"aicluster: warning: {w}" for w in cluster.warnings]


#: The inventories validated in this pyinfra run: (file, overrides) -> done.
_PYINFRA_CHECKED: set[tuple[str, str]] = set()


def pyinfra_check() -> None:
    """Validate the inventory the running ``pyinfra`` command was given, with its
    ``--data`` overrides (and ``--ssh-user``/``--ssh-key``/``--ssh-port``,
    ``--group-data``), before pyinfra connects to any host: on bad input print every
    problem and exit with status 2; print the plan's warnings once.

    It reads the command's arguments from click's context (pyinfra's CLI is a click
    command), so it does nothing outside ``pyinfra`` or when the inventory is not a
    file. Called by the inventory file as it is loaded (its import of this module and
    ``finish(globals())``) and by the repository's ``config.py``, which pyinfra runs
    before it loads any inventory (so that a SyntaxError is reported the same way);
    whichever comes first validates, the others find it done.
    """
    import click
    from pyinfra_cli.util import parse_cli_arg

    context = click.get_current_context(silent=True)
    if context is None or _LOADING:
        return
    params = context.params
    inventory = params.get("inventory")
    if not isinstance(inventory, str) or not inventory.endswith(".py") \
            or not Path(inventory).is_file():
        return
    override: dict[str, Any] = {}
    for arg in params.get("data") or ():
        key, sep, value = str(arg).partition("=")
        if sep:
            override[key] = parse_cli_arg(value)
    for key in ("ssh_user", "ssh_key", "ssh_port"):
        if params.get(key):
            override[key] = params[key]
    done = (str(Path(inventory).resolve()), json.dumps(override, sort_keys=True, default=str))
    if done in _PYINFRA_CHECKED:
        return
    _PYINFRA_CHECKED.add(done)
    try:
        cluster = load_cluster(inventory, override, cwd=os.getcwd(),
                               group_data_directories=params.get("group_data") or ())
    except InventoryError as exc:
        if override:
            given = ", ".join(sorted(override))
            exc = InventoryError(exc.errors, f"{exc.source or inventory} (with --data {given})")
        _refuse(exc)
    for line in warning_lines(cluster):
        print(line, file=sys.stderr)


def finish(module_globals: dict[str, Any]) -> None:
    """The last line of an inventory file.

    * Run by Ansible as a script (``--list`` / ``--host NAME``): print the inventory.
    * Loaded by pyinfra: validate the whole inventory now (with the command's ``--data``
      overrides), before pyinfra connects to any host; on bad input print every
      problem and exit with status 2 (:func:`pyinfra_check`).
    * Loaded by aicluster itself: do nothing (the caller validates).
    """
    if _LOADING:
        return
    path = module_globals["__file__"]
    if module_globals.get("__name__") == "__main__":
        _ansible_main(path, sys.argv[1:])
        return
    pyinfra_check()


def _ansible_main(path: str, argv: list[str]) -> None:
    try:
        if argv[:1] == ["--host"]:
            data = ansible_inventory(path)["_meta"]["hostvars"].get(argv[1], {})
        else:
            data = ansible_inventory(path)
    except InventoryError as exc:
        _refuse(exc)
    json.dump(data, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


def script(argv: list[str] | None = None) -> None:
    """``aicluster-inventory FILE --list`` / ``--host NAME``: Ansible's inventory script,
    run through an inventory file's first line (``#!/usr/bin/env aicluster-inventory``).

    Python compiles a file before any of it runs, so a file run by ``python3`` cannot
    report its own SyntaxError; compiled here first, it is reported as every entry
    point reports it, ``file:line: SyntaxError: message`` with exit status 2. The file
    is then loaded as :func:`ansible_inventory` loads it (its other Python errors are
    reported the same way)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[1] not in ("--list", "--host") or (
            args[1] == "--host" and len(args) != 3):
        print("usage: aicluster-inventory INVENTORY.py --list | --host NAME "
              "(Ansible runs it as the inventory file's first line)", file=sys.stderr)
        raise SystemExit(2)
    path = args[0]
    try:
        source = Path(path).read_bytes()
    except OSError as exc:
        _refuse(InventoryError([f"{path}: cannot read it: {exc.strerror or exc}"], path))
    try:
        compile(source, path, "exec")
    except SyntaxError as exc:  # (and its subclasses: IndentationError, TabError)
        _refuse(InventoryError([python_error(exc, path)], path))
    _ansible_main(path, args[1:])


def _on_import() -> None:
    """An inventory file imports this module on its first line; by then nothing else of
    it has run. So that a Python error further down the file (``true`` for ``True``, a
    NameError) is reported as ``file:line: message`` with exit status 2 rather than as
    a traceback, the whole file is validated here, first:

    * run as an Ansible inventory script (``inventory.py --list`` / ``--host NAME``):
      print the inventory (or the refusal) now and exit, before the rest of the file
      runs a second time;
    * loaded by ``pyinfra``: :func:`pyinfra_check`.
    """
    if _LOADING:
        return
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main_file and sys.argv[1:2] in (["--list"], ["--host"]) \
            and Path(main_file).resolve() == Path(sys.argv[0]).resolve():
        try:
            is_inventory = "finish(globals())" in Path(main_file).read_text()
        except OSError:
            is_inventory = False
        if is_inventory:
            _ansible_main(main_file, sys.argv[1:])
            raise SystemExit(0)
        return
    # Never imports pyinfra itself (Ansible's filter plugins reach this module).
    pyinfra = sys.modules.get("pyinfra")
    if pyinfra is not None and getattr(pyinfra, "is_cli", False):
        pyinfra_check()


_on_import()
