"""What every layer's checks are planned from: the validated inventory, the tier, and
the thresholds for each node.

Thresholds are data (``thresholds.yaml`` beside this module), laid under the
inventory's ``check_thresholds`` for each host (pyinfra's layering: host > group >
all), key by key at every depth: ``{"network": {"iperf3_min_fraction": 0.5}}`` changes
that one figure and keeps the rest. A key the defaults do not have is refused, naming
the host and the key, before any probe runs.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from aicluster.common.settings import setting
from aicluster.inventory import Cluster, Host

#: The shipped defaults.
THRESHOLDS = Path(__file__).with_name("thresholds.yaml")
#: The host data key that overrides them.
OVERRIDE_KEY = "check_thresholds"


class Tier(str, enum.Enum):
    """How deep a run goes: ``quick`` (inventory against reality, services, ports, MTU,
    time: <= 60 s per node), ``standard`` (adds bandwidth, storage and stack smoke
    tests), ``burn-in`` (adds long GPU and NCCL runs)."""

    QUICK = "quick"
    STANDARD = "standard"
    BURN_IN = "burn-in"


class ThresholdError(ValueError):
    """An inventory's ``check_thresholds`` that does not fit the defaults."""


@cache
def defaults() -> dict[str, Any]:
    return yaml.safe_load(THRESHOLDS.read_text())


def _merge(base: Mapping[str, Any], over: Mapping[str, Any], where: str,
           path: str = "") -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        here = f"{path}.{key}" if path else str(key)
        if key not in base:
            near = difflib.get_close_matches(str(key), [str(k) for k in base], n=1)
            hint = f"; did you mean {near[0]}?" if near else (
                f"; known here: {', '.join(str(k) for k in base)}")
            raise ThresholdError(f"{where}: {OVERRIDE_KEY}.{here}: no such threshold{hint}")
        if isinstance(base[key], Mapping):
            if not isinstance(value, Mapping):
                raise ThresholdError(f"{where}: {OVERRIDE_KEY}.{here}: expected a mapping, "
                                     f"got {value!r}")
            # A table keyed by rate or model takes new rows (a rate or a GPU model the
            # defaults lack); its rows are checked against the default row where one is.
            if here in ("infiniband.ib_write_bw_min_gbps", "gpu.profiles"):
                table = dict(base[key])
                for row, row_value in value.items():
                    template = table.get(row, table.get("default"))
                    if isinstance(template, Mapping):
                        table[row] = _merge(template, row_value, where, f"{here}.{row}")
                    else:
                        table[row] = _number(row_value, where, f"{here}.{row}")
                out[key] = table
            else:
                out[key] = _merge(base[key], value, where, here)
        elif isinstance(base[key], list):
            if not isinstance(value, list):
                raise ThresholdError(f"{where}: {OVERRIDE_KEY}.{here}: expected a list, "
                                     f"got {value!r}")
            out[key] = list(value)
        elif isinstance(base[key], str):
            out[key] = str(value)
        else:
            out[key] = _number(value, where, here)
    return out


def _number(value: Any, where: str, path: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ThresholdError(f"{where}: {OVERRIDE_KEY}.{path}: expected a number >= 0, "
                             f"got {value!r}")
    return value


def thresholds_for(host: Host) -> dict[str, Any]:
    """The defaults with the host's ``check_thresholds`` laid over them."""
    over = host.data.get(OVERRIDE_KEY) or {}
    if not isinstance(over, Mapping):
        raise ThresholdError(f"{host.name}: {OVERRIDE_KEY}: expected a mapping, got {over!r}")
    return _merge(defaults(), over, host.name)


def check_thresholds(cluster: Cluster) -> list[str]:
    """Every host's ``check_thresholds`` error (empty: all fit)."""
    errors = []
    for host in cluster.hosts.values():
        try:
            thresholds_for(host)
        except ThresholdError as exc:
            errors.append(str(exc))
    return errors


_SIZE = re.compile(r"^([0-9]+)([KMGT]?)$")


def size_bytes(text: str) -> int:
    """``8G`` -> bytes (the sizes NCCL's tests take)."""
    m = _SIZE.match(str(text).strip().upper())
    if not m:
        raise ValueError(f"{text!r} is not a size such as 8G")
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " ")


@dataclass
class Context:
    """One check run's plan inputs. Layers read the inventory through it only."""

    cluster: Cluster
    tier: Tier = Tier.STANDARD
    #: Only these nodes are checked (all when empty).
    limit: tuple[str, ...] = ()
    _thresholds: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.tier = Tier(self.tier)
        unknown = [n for n in self.limit if n not in self.cluster.hosts]
        if unknown:
            raise ThresholdError(f"--limit: no such host(s) in the inventory: "
                                 f"{', '.join(unknown)}")

    @property
    def standard(self) -> bool:
        """The standard tier or deeper: bandwidth, storage and stack smoke tests."""
        return self.tier is not Tier.QUICK

    @property
    def burn_in(self) -> bool:
        return self.tier is Tier.BURN_IN

    # -- the inventory ----------------------------------------------------------

    def host(self, name: str) -> Host:
        return self.cluster.hosts[name]

    def nodes(self) -> list[str]:
        """The nodes to check, in inventory order."""
        return [n for n in self.cluster.hosts if not self.limit or n in self.limit]

    def in_groups(self, *groups: str) -> list[str]:
        """The nodes to check that are in any of the groups, in inventory order."""
        members = {m for g in groups for m in self.cluster.group(g)}
        return [n for n in self.nodes() if n in members]

    def with_component(self, component: str) -> list[str]:
        """The nodes to check that are given the component (by group or data key)."""
        return [n for n in self.nodes() if component in self.host(n).components()]

    def setting(self, node: str, component: str, key: str) -> Any:
        """A component's effective setting on a node: its role default under the
        node's data."""
        return setting(component, self.host(node).data, key)

    def address(self, node: str, network: str) -> str | None:
        """The node's address on a network; the management network's is the SSH one."""
        found = self.host(node).network_address(network)
        if found is None and network == "management":
            return self.host(node).address
        return found

    # -- thresholds -------------------------------------------------------------

    def thresholds(self, node: str) -> dict[str, Any]:
        if node not in self._thresholds:
            self._thresholds[node] = thresholds_for(self.host(node))
        return self._thresholds[node]

    def threshold(self, node: str, path: str) -> Any:
        """One threshold by dotted path, e.g. ``network.iperf3_min_fraction``."""
        value: Any = self.thresholds(node)
        for part in path.split("."):
            value = value[part]
        return value

    def gpu_profile(self, node: str) -> tuple[str, dict[str, Any]]:
        """The GPU profile the node's declared model matches (the longest profile name
        found in ``hardware.gpus.model``, case-insensitive), or ``default``."""
        model = self.host(node).spec.hardware.gpus.model.upper()
        profiles = self.threshold(node, "gpu.profiles")
        for name in sorted((p for p in profiles if p != "default"), key=len, reverse=True):
            if str(name).upper() in model:
                return str(name), profiles[name]
        return "default", profiles["default"]

    def ib_floor(self, node: str, rate_gbps: int) -> float | None:
        """ib_write_bw's floor for a port of this declared rate (None: no row)."""
        table = self.threshold(node, "infiniband.ib_write_bw_min_gbps")
        for key in (rate_gbps, str(rate_gbps)):
            if key in table:
                return float(table[key])
        return None
