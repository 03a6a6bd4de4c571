"""The node's network interfaces (names, MACs, links) and which one carries the management
address, read by shell commands and parsed.
"""

from __future__ import annotations

import shlex

#: One line per interface: name, MAC, MTU, operstate, speed (Mb/s, "-" unknown), the
#: ARPHRD type (1 Ethernet, 32 InfiniBand, 772 loopback), and its kind ("bond",
#: "bridge", "vlan", "virtual" for software devices, "-" for hardware).
INTERFACES_COMMAND = (
    "for d in /sys/class/net/*; do [ -e \"$d/address\" ] || continue; n=${d##*/}; "
    "k=-; [ -d \"$d/bonding\" ] && k=bond; [ -d \"$d/bridge\" ] && k=bridge; "
    "[ -e /proc/net/vlan/$n ] && k=vlan; "
    "[ \"$k\" = - ] && [ ! -e \"$d/device\" ] && k=virtual; "
    # The shell's own read, not a cat per file: one process for the whole loop. A file
    # that cannot be read (speed of a virtual device) leaves its value empty.
    "a=; m=; o=; t=; s=; read -r a < \"$d/address\"; read -r m < \"$d/mtu\"; "
    "read -r o < \"$d/operstate\"; read -r t < \"$d/type\"; read -r s < \"$d/speed\"; "
    "[ -n \"$s\" ] || s=-; "
    "echo \"$n $a $m $o $s $t $k\"; done 2>/dev/null; true"
)


def parse_interfaces(lines) -> list[dict]:
    """``[{name, mac, mtu, state, speed_mbps, type, kind}]`` from
    :data:`INTERFACES_COMMAND`'s output (lines it cannot read are skipped)."""
    out = []
    for line in lines:
        parts = str(line).split()
        if len(parts) != 7:
            continue
        name, mac, mtu, state, speed, kind_type, kind = parts
        try:
            speed_mbps = int(speed)
        except ValueError:
            speed_mbps = None
        out.append(
            {
                "name": name,
                "mac": mac.lower(),
                "mtu": int(mtu) if mtu.isdigit() else None,
                "state": state,
                "speed_mbps": speed_mbps if speed_mbps and speed_mbps > 0 else None,
                "type": {"1": "ether", "32": "infiniband", "772": "loopback"}.get(
                    kind_type, kind_type
                ),
                "kind": None if kind == "-" else kind,
            }
        )
    return out


def management_command(address: str) -> str:
    """The interface that holds ``address`` (the one the deploy connects to), with
    its MAC: ``NAME MAC``; nothing when no interface holds it."""
    q = shlex.quote(address)
    # `ip -o` prints one line per address: "2: eth0    inet 10.0.0.5/24 ...". The
    # shell picks the line and reads the MAC: one process, ip itself.
    return (
        "ip -o addr show 2>/dev/null | while read -r _ n _ a _; do "
        f'[ "${{a%/*}}" = {q} ] || continue; n=${{n%%@*}}; m=-; '
        'read -r m 2>/dev/null < "/sys/class/net/$n/address" || m=-; '
        'echo "$n $m"; break; done'
    )


def parse_management(lines) -> dict | None:
    """``{name, mac}`` of the management interface, or None when unknown."""
    for line in lines:
        parts = str(line).split()
        if len(parts) == 2:
            return {"name": parts[0], "mac": None if parts[1] == "-" else parts[1].lower()}
    return None

