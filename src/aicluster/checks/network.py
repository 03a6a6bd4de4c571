"""Network: every NIC, bond and VLAN the inventory declares is up at its speed and MTU
(quick); a don't-fragment ping at each cluster network's MTU between every two nodes
on it (quick); iperf3 between every two nodes on the fabric, against a fraction of the
slower declared link (standard).

What a node should have is the network component's own model of it
(:func:`aicluster.common.netconf.interfaces`: NICs matched by MAC or name, bonds, VLANs,
each with its MTU); what it has is read with the component's own probe
(:data:`aicluster.components.network.probe.INTERFACES_COMMAND`).

A NIC, a network or a port repeats under one check name on a node or pair; the result's
``details["subject"]`` says which it is.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Mapping
from functools import partial
from typing import Any

from aicluster.checks.context import Context
from aicluster.checks.result import Action, Result, Status, worst
from aicluster.checks.runner import Completed, PairCheck, Probe
from aicluster.common.netconf import interfaces
from aicluster.components.network.derive import find_interface
from aicluster.components.network.probe import INTERFACES_COMMAND, parse_interfaces
from aicluster.inventory import NETWORK_NAMES

LAYER = "network"

#: The TCP port of the iperf3 server a pair test starts (iperf3's own default).
IPERF3_PORT = 5201
#: Tries of the iperf3 client while the server on the other node comes up (1 s apart).
CLIENT_TRIES = 10
#: The bytes of IP and ICMP headers a ping's payload leaves out of the MTU.
_HEADERS = {4: 28, 6: 48}


def _tool_missing(done: Completed, marker: str) -> bool:
    return marker in done.stdout or done.rc == 127


# ---------------------------------------------------------------------------
# network.nic: each declared NIC, bond and VLAN up, at its speed and MTU
# ---------------------------------------------------------------------------


def declared_interfaces(ctx: Context, node: str) -> list[dict[str, Any]]:
    """The node's declared interfaces (the network component's model): each with
    ``speed_gbps`` the speed it should report, None where none is expected (a VLAN
    reports its link's)."""
    items = interfaces(ctx.cluster, node, ctx.host(node).data)
    by_id = {i["id"]: i for i in items}
    out = []
    for item in items:
        speed = item.get("speed_gbps")
        if item["kind"] == "bond":
            members = [by_id[m]["speed_gbps"] for m in item["members"] if m in by_id]
            # The bonding driver reports the sum of the members that can send, or one
            # member's in the modes where one sends at a time.
            one_at_a_time = item["bond_mode"] in ("active-backup", "broadcast")
            speed = (min(members) if one_at_a_time else sum(members)) if members else None
        elif item["kind"] != "ethernet":
            speed = None
        out.append({"id": item["id"], "kind": item["kind"], "name": item["name"],
                    "mac": item["mac"], "network": item["network"], "bond": item["bond"],
                    "mtu": item["mtu"], "speed_gbps": speed})
    return out


def _label(item: Mapping[str, Any]) -> str:
    """``fabric NIC b8:3f:d2:00:01:01``, ``NIC ens2f0 of bond0``, ``storage bond bond0``."""
    what = {"ethernet": "NIC", "bond": "bond", "vlan": "VLAN"}.get(item["kind"], "interface")
    on = item.get("network")
    ident = item["name"] or item["mac"]
    if item["kind"] == "ethernet" and item["name"] and item["mac"]:
        ident = f"{item['name']} ({item['mac']})"
    of = f" of {item['bond']}" if item.get("bond") else ""
    return f"{on + ' ' if on else ''}{what} {ident}{of}"


def judge_nic(node: str, item: Mapping[str, Any], found: list[dict]) -> Result:
    """One declared interface against what the node has."""
    label = _label(item)
    subject = item["name"] or item["mac"]
    want_speed = item.get("speed_gbps")
    base = {"node": node, "unit": "Gb/s", "threshold": want_speed}
    have = find_interface(item, found)
    if have is None:
        names = ", ".join(sorted(f"{f['name']} {f['mac']}" for f in found
                                 if f["type"] == "ether")) or "none"
        return Result("network.nic", Status.FAIL, **base, action=Action.INVESTIGATE,
                      message=f"{node}: {label} not found (the node has: {names}); "
                              "fix the inventory or the cabling",
                      details={"subject": subject})
    problems: list[tuple[Status, Action, str]] = []
    if have["state"] == "unknown":
        problems.append((Status.WARN, Action.MONITOR,
                         "its driver reports no link state (operstate unknown)"))
    elif have["state"] != "up":
        problems.append((Status.FAIL, Action.INVESTIGATE,
                         f"link {have['state']} (cable, transceiver or switch port)"))
    if have["mtu"] != item["mtu"]:
        problems.append((Status.FAIL, Action.REDEPLOY,
                         f"MTU {have['mtu']}, the inventory says {item['mtu']}: deploy again"))
    speed = have["speed_mbps"] / 1000 if have["speed_mbps"] else None
    if want_speed is not None and have["state"] == "up":
        if speed is None:
            problems.append((Status.WARN, Action.MONITOR,
                             "speed not reported by its driver (a virtual NIC?)"))
        elif speed < want_speed:
            problems.append((Status.FAIL, Action.INVESTIGATE,
                             f"link at {speed:g} Gb/s, declared {want_speed} Gb/s "
                             + ("(a member down or out of the aggregate?)"
                                if item["kind"] == "bond"
                                else "(cable, transceiver or switch port downtrained it)")))
    status, action = worst(problems)
    details = {"subject": subject, "interface": have["name"], "mac": have["mac"],
               "state": have["state"], "mtu": have["mtu"], "mtu_declared": item["mtu"]}
    message = (f"{node}: {label} ({have['name']}): " + "; ".join(p[2] for p in problems)
               if problems else
               f"{label} ({have['name']}) up, MTU {have['mtu']}"
               + (f", {speed:g} Gb/s" if speed else ""))
    return Result("network.nic", status, **{**base, "value": speed}, action=action,
                  message=message, details=details)


def judge_nics(node: str, declared: list[dict[str, Any]], done: Completed) -> list[Result]:
    found = parse_interfaces(done.stdout.splitlines())
    if not found:
        raise ValueError("no network interface read from /sys/class/net")
    return [judge_nic(node, item, found) for item in declared]


# ---------------------------------------------------------------------------
# network.path_mtu: don't-fragment pings at the network's MTU
# ---------------------------------------------------------------------------

#: The cluster networks the path test covers: all but management (the SSH one).
PATH_NETWORKS = tuple(n for n in NETWORK_NAMES if n != "management")

_SENT = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received")
_LOCAL = re.compile(r"message too long, mtu[= ]+(\d+)")
_FRAG = re.compile(r"Frag needed and DF set \(mtu = (\d+)\)")
_RTT = re.compile(r"= [0-9.]+/([0-9.]+)/")
SMALL_MARK = "#small"


def network_mtu(ctx: Context, node: str, network: str) -> int | None:
    """The MTU of the node's interface on a network (its address's): a NIC, bond or VLAN
    of the network component's model, else an IPoIB port; None where it has none."""
    for item in interfaces(ctx.cluster, node, ctx.host(node).data):
        if item["network"] == network and item["addresses"]:
            return int(item["mtu"])
    for port in ctx.host(node).spec.hardware.ib_ports:
        if port.network == network and port.address is not None:
            return int(port.mtu)
    return None


def ping_command(peer: str, mtu: int, count: int) -> str:
    """Pings at the full MTU with fragmentation forbidden; when they fail, one small
    ping tells an MTU problem from a peer that is not there at all."""
    version = ipaddress.ip_address(peer).version
    size = mtu - _HEADERS[version]
    family = "-6 " if version == 6 else ""
    q = shlex.quote(peer)
    return (f"command -v ping >/dev/null 2>&1 || {{ echo '#notool'; exit 0; }}; "
            f"ping {family}-n -M do -s {size} -c {count} -i 0.2 -W 1 {q} 2>&1 || "
            f"{{ echo '{SMALL_MARK}'; ping {family}-n -c 1 -W 1 {q} 2>&1; }}; true")


def parse_ping(text: str) -> dict[str, Any]:
    """iputils ping's summary: packets sent and received, the average RTT (ms), and the
    MTU a local error or an ICMP "fragmentation needed" named."""
    sent = _SENT.search(text)
    local = _LOCAL.search(text)
    frag = _FRAG.search(text)
    rtt = _RTT.search(text)
    if sent is None and local is None:
        raise ValueError("not ping output")
    return {"sent": int(sent.group(1)) if sent else 0,
            "received": int(sent.group(2)) if sent else 0,
            "local_mtu": int(local.group(1)) if local else None,
            "hop_mtu": int(frag.group(1)) if frag else None,
            "rtt_ms": float(rtt.group(1)) if rtt else None}


def judge_path_mtu(a: str, b: str, network: str, mtu: int, peer: str,
                   done: Completed) -> Result:
    pair = (a, b)
    where = f"{a} -> {b}'s {network} address {peer}"
    base = {"pair": pair, "threshold": mtu, "unit": "bytes"}
    details: dict[str, Any] = {"subject": network, "network": network, "peer": peer}
    if _tool_missing(done, "#notool"):
        return Result("network.path_mtu", Status.ERROR, **base, action=Action.REDEPLOY,
                      details=details,
                      message=f"{a}: ping is not installed (iputils-ping / iputils)")
    big, _, small = done.stdout.partition(SMALL_MARK)
    ping = parse_ping(big)
    details.update(ping)
    if ping["sent"] and ping["received"] == ping["sent"]:
        return Result("network.path_mtu", Status.PASS, **base, value=mtu, details=details,
                      message=f"{network}: {ping['received']} unfragmented {mtu}-byte "
                              f"packets {a} -> {b}")
    if ping["received"]:
        return Result("network.path_mtu", Status.WARN, **base, value=mtu, details=details,
                      action=Action.MONITOR,
                      message=f"{where}: {ping['sent'] - ping['received']} of {ping['sent']} "
                              f"unfragmented {mtu}-byte packets lost")
    if ping["local_mtu"] is not None:
        return Result("network.path_mtu", Status.FAIL, **base, value=ping["local_mtu"],
                      details=details, action=Action.REDEPLOY,
                      message=f"{where}: fragmentation needed: {a}'s own interface has "
                              f"MTU {ping['local_mtu']}, the {network} network {mtu}")
    if ping["hop_mtu"] is not None:
        return Result("network.path_mtu", Status.FAIL, **base, value=ping["hop_mtu"],
                      details=details, action=Action.INVESTIGATE,
                      message=f"{where}: fragmentation needed: a hop on the path has MTU "
                              f"{ping['hop_mtu']}, the {network} network {mtu}")
    small_ok = bool(small) and _SENT.search(small) is not None \
        and parse_ping(small)["received"] > 0
    details["small_ping_answered"] = small_ok
    if small_ok:
        return Result("network.path_mtu", Status.FAIL, **base, details=details,
                      action=Action.INVESTIGATE,
                      message=f"{where}: 100% loss of unfragmented {mtu}-byte packets, "
                              f"small ones pass: a switch port or {b}'s interface has a "
                              f"smaller MTU than {mtu}")
    return Result("network.path_mtu", Status.FAIL, **base, details=details,
                  action=Action.INVESTIGATE,
                  message=f"{where}: no answer at all (100% loss, small packets too): "
                          f"{b} is down on the {network} network, or the address is not "
                          "configured")


def _path_mtu_probe(ctx: Context, network: str, a: str, b: str) -> Probe:
    mtus = [m for m in (network_mtu(ctx, a, network), network_mtu(ctx, b, network)) if m]
    mtu = min(mtus)
    peer = str(ctx.address(b, network))
    count = int(ctx.threshold(a, "network.ping_count"))
    return Probe("network.path_mtu", LAYER, ping_command(peer, mtu, count),
                 partial(judge_path_mtu, a, b, network, mtu, peer),
                 timeout=count + 10, pair=(a, b))


# ---------------------------------------------------------------------------
# network.iperf3: TCP bandwidth on the fabric
# ---------------------------------------------------------------------------


def interface_speed_gbps(ctx: Context, node: str, network: str) -> int | None:
    """The declared speed of the node's link on a network: its NIC's, its bond's (the
    members' together), or the NIC or bond its VLAN rides on."""
    items = {i["id"]: i for i in declared_interfaces(ctx, node)}
    model = {i["id"]: i for i in interfaces(ctx.cluster, node, ctx.host(node).data)}
    for ident, item in model.items():
        if item["network"] == network and item["addresses"]:
            if item["kind"] == "vlan":
                parent = items.get(item.get("link") or "")
                return parent["speed_gbps"] if parent else None
            return items[ident]["speed_gbps"]
    return None


def iperf3_server(address: str) -> str:
    return f"iperf3 -s -1 -B {shlex.quote(address)} -p {IPERF3_PORT}"


def iperf3_client(address: str, source: str, seconds: int, streams: int) -> str:
    """The client, tried again while the server on the other node is not up yet; prints
    iperf3's JSON (its own "error" when it never connected)."""
    run = (f"iperf3 -c {shlex.quote(address)} -B {shlex.quote(source)} -p {IPERF3_PORT} "
           f"-J -t {int(seconds)} -P {int(streams)} 2>/dev/null")
    return ("command -v iperf3 >/dev/null 2>&1 || { echo '#notool'; exit 0; }; "
            f"i=0; while :; do out=$({run}); "
            'case "$out" in *"unable to connect"*|*"Connection refused"*) '
            f'i=$((i + 1)); [ "$i" -ge {CLIENT_TRIES} ] && break; sleep 1;; '
            '*) break;; esac; done; printf \'%s\\n\' "$out"')


def parse_iperf3(text: str) -> dict[str, Any]:
    """iperf3 -J: the bandwidth the receiver saw (Gb/s), the sender's retransmits, and
    iperf3's error where there is one."""
    doc = json.loads(text)
    if doc.get("error"):
        return {"error": str(doc["error"])}
    end = doc["end"]
    return {"gbps": round(end["sum_received"]["bits_per_second"] / 1e9, 2),
            "retransmits": end.get("sum_sent", {}).get("retransmits"),
            "streams": len(end.get("streams", []))}


def judge_iperf3(a: str, b: str, floor_gbps: float, fraction: float, link_gbps: float,
                 done: Completed) -> Result:
    pair = (a, b)
    base = {"pair": pair, "threshold": floor_gbps, "unit": "Gb/s"}
    if _tool_missing(done, "#notool"):
        return Result("network.iperf3", Status.ERROR, **base, action=Action.REDEPLOY,
                      details={"subject": "fabric"},
                      message=f"{a}: iperf3 is not installed (the network component "
                              "installs it: deploy again)")
    found = parse_iperf3(done.stdout)
    details = {"subject": "fabric", **found, "link_gbps": link_gbps, "fraction": fraction}
    if "error" in found:
        return Result("network.iperf3", Status.FAIL, **base, details=details,
                      action=Action.INVESTIGATE,
                      message=f"{a} -> {b} on the fabric: iperf3 failed: {found['error']} "
                              f"(is iperf3 installed on {b}, and port {IPERF3_PORT} open?)")
    if found["gbps"] < floor_gbps:
        return Result("network.iperf3", Status.FAIL, **base, value=found["gbps"],
                      details=details, action=Action.INVESTIGATE,
                      message=f"{a} -> {b} on the fabric: {found['gbps']:g} Gb/s, below "
                              f"{fraction:g} of the {link_gbps:g} Gb/s link")
    return Result("network.iperf3", Status.PASS, **base, value=found["gbps"],
                  details=details,
                  message=f"{a} -> {b} on the fabric: {found['gbps']:g} Gb/s")


def _iperf3_probe(ctx: Context, a: str, b: str) -> Probe:
    speeds = [s for s in (interface_speed_gbps(ctx, a, "fabric"),
                          interface_speed_gbps(ctx, b, "fabric")) if s]
    link = float(min(speeds)) if speeds else 0.0
    fraction = float(ctx.threshold(a, "network.iperf3_min_fraction"))
    seconds = int(ctx.threshold(a, "network.iperf3_seconds"))
    streams = int(ctx.threshold(a, "network.iperf3_streams"))
    address, source = str(ctx.address(b, "fabric")), str(ctx.address(a, "fabric"))
    return Probe("network.iperf3", LAYER,
                 iperf3_client(address, source, seconds, streams),
                 partial(judge_iperf3, a, b, round(fraction * link, 2), fraction, link),
                 timeout=seconds + CLIENT_TRIES + 20, pair=(a, b),
                 server=iperf3_server(address))


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------


def probes(ctx: Context) -> list[Probe]:
    """network.nic on every node that declares cluster NICs, bonds or VLANs."""
    out = []
    for node in ctx.with_component("network"):
        declared = declared_interfaces(ctx, node)
        if declared:
            out.append(Probe("network.nic", LAYER, INTERFACES_COMMAND,
                             partial(judge_nics, node, declared), timeout=15, node=node))
    return out


def pair_checks(ctx: Context) -> list[PairCheck]:
    """network.path_mtu on each cluster network (not management) between the nodes with
    an address on it; network.iperf3 on the fabric (standard tier)."""
    out = []
    for network in PATH_NETWORKS:
        if network not in ctx.cluster.spec.networks:
            continue
        nodes = [n for n in ctx.with_component("network")
                 if ctx.address(n, network) and network_mtu(ctx, n, network)]
        out.append(PairCheck("network.path_mtu", LAYER, nodes,
                             partial(_path_mtu_probe, ctx, network)))
    if ctx.standard and "fabric" in ctx.cluster.spec.networks:
        nodes = [n for n in ctx.with_component("network") if ctx.address(n, "fabric")]
        out.append(PairCheck("network.iperf3", LAYER, nodes, partial(_iperf3_probe, ctx)))
    return out
