"""The two host bridges: management (with the host address) and fabric (MTU 9000)."""

from __future__ import annotations

from pathlib import Path

from aicluster.testbed import state as st
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.system import run, wait_until

SYS_NET = Path("/sys/class/net")


def link_exists(ifname: str) -> bool:
    """True when network interface *ifname* exists in the host namespace."""
    return (SYS_NET / ifname).exists()


def _address_in_use_elsewhere(prefix: str, bridge: str) -> str | None:
    """Name of another interface that already holds an address in *prefix*.x, if any."""
    out = run(["ip", "-o", "-4", "addr", "show"], timeout=15).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] != bridge and fields[3].startswith(prefix + "."):
            return fields[1]
    return None


def ensure_bridges() -> None:
    """Create (if missing) and bring up ``acmgmt0`` (host address 10.213.0.1/24) and
    ``acfab0`` (no address, MTU 9000). IP forwarding is left as it is (off)."""
    clash = _address_in_use_elsewhere(st.MGMT_PREFIX, st.MGMT_BRIDGE)
    if clash:
        raise TestbedError(
            f"interface {clash} already has an address in {st.MGMT_SUBNET}; "
            "the testbed needs that subnet for its management bridge"
        )
    if not link_exists(st.MGMT_BRIDGE):
        run(["ip", "link", "add", st.MGMT_BRIDGE, "type", "bridge"], timeout=15)
    out = run(["ip", "-o", "-4", "addr", "show", "dev", st.MGMT_BRIDGE], timeout=15).stdout
    if f" {st.HOST_ADDRESS}/24 " not in out:
        run(["ip", "addr", "add", f"{st.HOST_ADDRESS}/24", "dev", st.MGMT_BRIDGE], timeout=15)
    run(["ip", "link", "set", st.MGMT_BRIDGE, "up"], timeout=15)

    if not link_exists(st.FABRIC_BRIDGE):
        run(["ip", "link", "add", st.FABRIC_BRIDGE, "type", "bridge"], timeout=15)
    run(["ip", "link", "set", st.FABRIC_BRIDGE, "mtu", str(st.FABRIC_MTU), "up"], timeout=15)
    # The management address must be usable before the proxies bind to it.
    if not wait_until(lambda: _has_address(st.MGMT_BRIDGE, st.HOST_ADDRESS), 10):
        raise TestbedError(f"{st.MGMT_BRIDGE} did not get {st.HOST_ADDRESS}")


def _has_address(ifname: str, address: str) -> bool:
    out = run(["ip", "-o", "-4", "addr", "show", "dev", ifname], timeout=15, check=False).stdout
    return f" {address}/" in out


def attach_to_fabric(ifname: str) -> None:
    """Put host-side veth *ifname* on the fabric bridge with MTU 9000 and bring it up."""
    run(["ip", "link", "set", "dev", ifname, "mtu", str(st.FABRIC_MTU)], timeout=15)
    run(["ip", "link", "set", "dev", ifname, "master", st.FABRIC_BRIDGE, "up"], timeout=15)
    # The bridge MTU was set by us, so the kernel keeps it; set it again to be sure.
    run(["ip", "link", "set", st.FABRIC_BRIDGE, "mtu", str(st.FABRIC_MTU)], timeout=15)


def wait_links_gone(names: list[str], timeout: float = 30) -> list[str]:
    """Wait until none of *names* exists; delete (they are ours) whatever is left after
    *timeout* s. Returns the names that had to be deleted."""
    if wait_until(lambda: not any(link_exists(n) for n in names), timeout):
        return []
    left = [n for n in names if link_exists(n)]
    for name in left:
        run(["ip", "link", "del", name], timeout=15, check=False)
    return left


def remove_bridges() -> None:
    """Delete both testbed bridges (no-op for those already gone)."""
    for bridge in (st.MGMT_BRIDGE, st.FABRIC_BRIDGE):
        if link_exists(bridge):
            run(["ip", "link", "del", bridge], timeout=15)
