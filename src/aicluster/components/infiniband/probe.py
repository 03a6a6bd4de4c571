"""The node's InfiniBand HCA ports, read from sysfs by one shell loop (state, rate, link
layer, IPoIB netdev), and the parsing of its lines.
"""

from __future__ import annotations

import re

#: One line per HCA port:
#: ``DEVICE PORT STATE RATE_GBPS LINK_LAYER NETDEV PCI NODE_GUID PORT_GUID`` ("-" where
#: there is none). DEVICE is the HCA's current name: the kernel's (``mlx5_0``) or the one
#: rdma-core's udev rule gave it (``ibp65s0f0``, 60-rdma-persistent-naming.rules); PCI is
#: the PCI function the HCA is (``/sys/class/infiniband/<dev>/device``), NODE_GUID its
#: ``node_guid``, PORT_GUID the port's (the low 64 bits of its GID 0). The netdev of a port
#: is the interface under the HCA's PCI device whose dev_port is the port number minus one.
PORTS_COMMAND = (
    "for p in /sys/class/infiniband/*/ports/*; do [ -d \"$p\" ] || continue; "
    "dev=${p%/ports/*}; dev=${dev##*/}; port=${p##*/}; "
    "state=$(sed 's/^[0-9]*: *//' \"$p/state\" 2>/dev/null); "
    "rate=$(sed 's/ .*//' \"$p/rate\" 2>/dev/null); "
    "ll=$(cat \"$p/link_layer\" 2>/dev/null); nd=-; "
    "for n in /sys/class/infiniband/$dev/device/net/*; do [ -e \"$n/dev_port\" ] || continue; "
    "[ \"$(cat \"$n/dev_port\")\" = \"$((port - 1))\" ] && nd=${n##*/}; done; "
    "pci=-; [ -e \"/sys/class/infiniband/$dev/device\" ] && "
    "pci=$(readlink -f \"/sys/class/infiniband/$dev/device\") && pci=${pci##*/}; "
    "ng=$(cat \"/sys/class/infiniband/$dev/node_guid\" 2>/dev/null); "
    "pg=$(cat \"$p/gids/0\" 2>/dev/null); pg=${pg#????:????:????:????:}; "
    "echo \"$dev $port ${state:--} ${rate:--} ${ll:--} $nd ${pci:--} ${ng:--} ${pg:--}\"; "
    "done 2>/dev/null; true"
)

_RATE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_PCI_RE = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
_GUID_RE = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){3}$")
_ZERO_GUID = "0000:0000:0000:0000"


def _pci(text: str) -> str | None:
    text = text.lower()
    return text if _PCI_RE.match(text) else None


def _guid(text: str) -> str | None:
    text = text.lower()
    return text if _GUID_RE.match(text) and text != _ZERO_GUID else None


def parse(lines) -> list[dict]:
    """``[{device, port, state, rate_gbps, link_layer, netdev, pci, node_guid,
    port_guid}]`` from :data:`PORTS_COMMAND`'s output; ``state`` is e.g. ``ACTIVE`` or
    ``DOWN``, ``link_layer`` ``InfiniBand`` or ``Ethernet`` (RoCE), ``pci`` as
    ``0000:41:00.0``, the GUIDs as sysfs writes them (``b8ce:f603:00a1:2b3c``)."""
    out = []
    for line in lines:
        parts = str(line).split()
        if len(parts) == 6:  # an older command's output: no PCI address or GUIDs
            parts += ["-", "-", "-"]
        if len(parts) != 9 or not parts[1].isdigit():
            continue
        device, port, state, rate, link_layer, netdev, pci, node_guid, port_guid = parts
        out.append(
            {
                "device": device,
                "port": int(port),
                "state": None if state == "-" else state,
                "rate_gbps": float(rate) if _RATE_RE.match(rate) else None,
                "link_layer": None if link_layer == "-" else link_layer,
                "netdev": None if netdev == "-" else netdev,
                "pci": _pci(pci),
                "node_guid": _guid(node_guid),
                "port_guid": _guid(port_guid),
            }
        )
    return out
