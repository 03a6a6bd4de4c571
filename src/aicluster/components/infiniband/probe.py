"""The node's InfiniBand HCA ports, read from sysfs by one shell loop (state, rate, link
layer, IPoIB netdev), and the parsing of its lines.
"""

from __future__ import annotations

import re

#: One line per HCA port:
#: ``DEVICE PORT STATE RATE_GBPS LINK_LAYER NETDEV`` ("-" where there is none).
#: The netdev of a port is the interface under the HCA's PCI device whose dev_port
#: is the port number minus one.
PORTS_COMMAND = (
    "for p in /sys/class/infiniband/*/ports/*; do [ -d \"$p\" ] || continue; "
    "dev=${p%/ports/*}; dev=${dev##*/}; port=${p##*/}; "
    "state=$(sed 's/^[0-9]*: *//' \"$p/state\" 2>/dev/null); "
    "rate=$(sed 's/ .*//' \"$p/rate\" 2>/dev/null); "
    "ll=$(cat \"$p/link_layer\" 2>/dev/null); nd=-; "
    "for n in /sys/class/infiniband/$dev/device/net/*; do [ -e \"$n/dev_port\" ] || continue; "
    "[ \"$(cat \"$n/dev_port\")\" = \"$((port - 1))\" ] && nd=${n##*/}; done; "
    "echo \"$dev $port ${state:--} ${rate:--} ${ll:--} $nd\"; done 2>/dev/null; true"
)

_RATE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def parse(lines) -> list[dict]:
    """``[{device, port, state, rate_gbps, link_layer, netdev}]`` from
    :data:`PORTS_COMMAND`'s output; ``state`` is e.g. ``ACTIVE`` or ``DOWN``,
    ``link_layer`` ``InfiniBand`` or ``Ethernet`` (RoCE)."""
    out = []
    for line in lines:
        parts = str(line).split()
        if len(parts) != 6 or not parts[1].isdigit():
            continue
        device, port, state, rate, link_layer, netdev = parts
        out.append(
            {
                "device": device,
                "port": int(port),
                "state": None if state == "-" else state,
                "rate_gbps": float(rate) if _RATE_RE.match(rate) else None,
                "link_layer": None if link_layer == "-" else link_layer,
                "netdev": None if netdev == "-" else netdev,
            }
        )
    return out

