"""Names, addresses, directories and the state file of the local testbed.

Everything other code may rely on lives here: the state file schema (see
``docs/testbed.md``), the node naming (``nodeN``), and the address plan
(management ``10.213.0.(10+N)``, fabric ``10.213.1.(10+N)``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

#: Default directories (overridable with the environment variables below).
DEFAULT_STATE_DIR = "/var/lib/aicluster/testbed"
DEFAULT_CACHE_DIR = "/var/cache/aicluster/testbed"
STATE_DIR_ENV = "AICLUSTER_TESTBED_DIR"
CACHE_DIR_ENV = "AICLUSTER_TESTBED_CACHE"

MGMT_BRIDGE = "acmgmt0"
MGMT_PREFIX = "10.213.0"
MGMT_SUBNET = f"{MGMT_PREFIX}.0/24"
HOST_ADDRESS = f"{MGMT_PREFIX}.1"
FABRIC_BRIDGE = "acfab0"
FABRIC_PREFIX = "10.213.1"
FABRIC_SUBNET = f"{FABRIC_PREFIX}.0/24"
FABRIC_NIC = "fabric0"
FABRIC_MTU = 9000

APT_PROXY_PORT = 3142
PIP_PROXY_PORT = 8888
PACKAGE_PROXY = f"http://{HOST_ADDRESS}:{APT_PROXY_PORT}"
PIP_PROXY = f"http://{HOST_ADDRESS}:{PIP_PROXY_PORT}"

#: Nodes are numbered 1..MAX_NODES (the address plan leaves room for that many).
MAX_NODES = 200

#: Name of the per-node cgroup parent under each cgroup hierarchy we use.
CGROUP_PARENT = "aicluster-testbed"

_NODE_RE = re.compile(r"^node([1-9][0-9]*)$")


def state_dir() -> Path:
    """The state directory (``$AICLUSTER_TESTBED_DIR`` or ``/var/lib/aicluster/testbed``)."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def cache_dir() -> Path:
    """The cache directory (``$AICLUSTER_TESTBED_CACHE`` or ``/var/cache/aicluster/testbed``)."""
    return Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR)


def state_file(base: Path | None = None) -> Path:
    """Path of ``state.json`` in *base* (default: :func:`state_dir`)."""
    return (base or state_dir()) / "state.json"


def _check_number(n: int) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_NODES:
        raise ValueError(f"node number must be an integer in 1..{MAX_NODES}, got {n!r}")
    return n


def node_name(n: int) -> str:
    """Name of node number *n*: ``node1``, ``node2``, ..."""
    return f"node{_check_number(n)}"


def node_number(name: str) -> int:
    """Inverse of :func:`node_name` (``"node3"`` -> 3); ValueError for other names."""
    m = _NODE_RE.match(name)
    if not m:
        raise ValueError(f"not a testbed node name: {name!r} (expected nodeN)")
    return _check_number(int(m.group(1)))


def management_address(n: int) -> str:
    """Management (SSH) address of node *n*: ``10.213.0.(10+n)``."""
    return f"{MGMT_PREFIX}.{10 + _check_number(n)}"


def fabric_address(n: int) -> str:
    """Fabric address of node *n*: ``10.213.1.(10+n)``.

    The testbed leaves the fabric NIC unconfigured (link up only); the ``network``
    component assigns this address.
    """
    return f"{FABRIC_PREFIX}.{10 + _check_number(n)}"


def fabric_mac(n: int) -> str:
    """Stable, locally administered MAC of node *n*'s fabric NIC: ``02:ac:13:01:HH:LL``."""
    _check_number(n)
    return f"02:ac:13:01:{n >> 8:02x}:{n & 0xFF:02x}"


def host_veth_names(name: str) -> tuple[str, str]:
    """Host-side interface names nspawn creates for node *name*: (management, fabric).

    The management one is nspawn's own ``vb-NAME``; the fabric one is ours, ``vf-NAME``.
    Both must fit Linux's 15-character limit.
    """
    mgmt, fab = f"vb-{name}", f"vf-{name}"
    for ifname in (mgmt, fab):
        if len(ifname) > 15:
            raise ValueError(f"interface name too long: {ifname}")
    return mgmt, fab


def node_dir(name: str, base: Path | None = None) -> Path:
    """Directory holding one node's overlay layers, root mount point and logs."""
    return (base or state_dir()) / "nodes" / name


def empty_state(base: Path | None = None) -> dict[str, Any]:
    """A state with bridges and proxies described but no nodes and no pids yet."""
    base = base or state_dir()
    return {
        "nodes": [],
        "management": {"bridge": MGMT_BRIDGE, "subnet": MGMT_SUBNET, "host_address": HOST_ADDRESS},
        "fabric": {"bridge": FABRIC_BRIDGE, "subnet": FABRIC_SUBNET},
        "ssh_key": str(base / "id_ed25519"),
        "package_proxy": PACKAGE_PROXY,
        "pip_proxy": PIP_PROXY,
        "proxies": {},
    }


def node_entry(n: int, pid: int | None, base: Path | None = None) -> dict[str, Any]:
    """The state record of node *n*."""
    name = node_name(n)
    return {
        "name": name,
        "address": management_address(n),
        "fabric_nic": FABRIC_NIC,
        "fabric_mac": fabric_mac(n),
        "pid": pid,
        "root": str(node_dir(name, base) / "root"),
    }


def load_state(base: Path | None = None) -> dict[str, Any] | None:
    """Read ``state.json``; ``None`` when there is no testbed.

    The ``nodes`` list is sorted by node number.
    """
    path = state_file(base)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    data: dict[str, Any] = json.loads(text)
    data.setdefault("nodes", [])
    data["nodes"].sort(key=lambda node: node_number(node["name"]))
    return data


def save_state(data: dict[str, Any], base: Path | None = None) -> Path:
    """Write ``state.json`` atomically (write a temporary file, then rename)."""
    path = state_file(base)
    path.parent.mkdir(parents=True, exist_ok=True)
    data["nodes"].sort(key=lambda node: node_number(node["name"]))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path
