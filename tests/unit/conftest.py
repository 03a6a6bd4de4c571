"""Small inventories written to a temporary directory, laid out as a user's would be:
an inventory file with the hosts (given once, in ``all``) and the groups, and
``group_data/all.py`` beside it with the cluster-wide settings.

Addresses are in the documentation ranges (RFC 5737: 192.0.2.0/24 management,
198.51.100.0/24 fabric, 203.0.113.0/24 IPoIB), which nothing answers on.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

NETWORKS = {
    "management": {"subnet": "192.0.2.0/24"},
    "fabric": {"subnet": "198.51.100.0/24", "mtu": 9000},
    "ib": {"subnet": "203.0.113.0/24"},
}


def node(n: int) -> dict[str, Any]:
    """A valid host: one fabric NIC with an address and a MAC."""
    return {
        "ssh_hostname": f"192.0.2.{n}",
        "hardware": {
            "cpus": 8,
            "memory_gb": 32,
            "nics": [
                {
                    "name": "eth1",
                    "mac": f"02:00:00:00:00:{n:02x}",
                    "network": "fabric",
                    "address": f"198.51.100.{n}",
                    "mtu": 9000,
                }
            ],
        },
    }


@dataclass
class InventorySpec:
    """What a test inventory holds; ``write()`` lays it out on disk."""

    directory: Path
    hosts: dict[str, dict[str, Any]] = field(default_factory=lambda: {"n1": node(1), "n2": node(2)})
    groups: dict[str, list[Any]] = field(default_factory=dict)
    cluster: dict[str, Any] = field(
        default_factory=lambda: {"cluster_name": "test", "networks": copy.deepcopy(NETWORKS)}
    )
    name: str = "cluster"
    #: The prefix of each host's name in ``all`` (``""``: pyinfra's own connector).
    connector: str = "@openssh/"

    node = staticmethod(node)

    def set(self, path: str, value: Any) -> InventorySpec:
        """Set a value by path: ``n2.hardware.nics[0].mtu`` (a host's data),
        ``all.secrets`` (group_data/all.py), ``groups.slurm_workers``. ``None``
        removes the key."""
        head, _, rest = path.partition(".")
        if head == "groups":
            self.groups[rest] = value
            return self
        target: Any = self.cluster if head == "all" else self.hosts[head]
        parts = [p for p in re.split(r"\.|\[(\d+)\]", rest) if p]
        keys: list[Any] = [int(p) if p.isdigit() else p for p in parts]
        for key in keys[:-1]:
            if isinstance(target, dict):
                target = target.setdefault(key, {})
            else:
                target = target[key]
        if value is None:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
        return self

    def write(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "group_data").mkdir(exist_ok=True)
        lines = [
            "from aicluster.inventory import finish",
            "",
            # As our inventories: each host given to the openssh connector by name.
            f"all = {[(self.connector + n, d) for n, d in self.hosts.items()]!r}",
        ]
        lines += [f"{group} = {members!r}" for group, members in self.groups.items()]
        lines += ["", "finish(globals())", ""]
        path = self.directory / f"{self.name}.py"
        path.write_text("\n".join(lines))
        all_py = "".join(f"{key} = {value!r}\n" for key, value in self.cluster.items())
        (self.directory / "group_data" / "all.py").write_text(all_py)
        return path


@pytest.fixture
def spec(tmp_path: Path) -> InventorySpec:
    """A valid two-host inventory (n1, n2) to change and write."""
    return InventorySpec(directory=tmp_path / "inventory")


@pytest.fixture(autouse=True)
def _pyinfra_accelerator_undone(monkeypatch):
    """Whatever a test installed of the pyinfra accelerator (aicluster.accel) is undone
    after it: pyinfra is stock again for the next test. (It asks for monkeypatch so
    that it is undone first, before what the test monkeypatched under it.)"""
    yield
    from aicluster import accel

    accel.disable()
