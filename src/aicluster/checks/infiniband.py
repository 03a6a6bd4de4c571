"""InfiniBand: every declared HCA port ACTIVE and LinkUp at its declared rate (quick); a
subnet manager answering the fabric (quick); ib_write_bw between every two nodes, port
by port, against a floor per link rate, with the port's error counters read before and
after (standard).

A declared port is found on the node as the infiniband component finds it (by GUID or
PCI address, which survive rdma-core renaming ``mlx5_0`` to ``ibp65s0f0``, else by the
HCA's name: :func:`aicluster.components.infiniband.derive.match_port`), from the
component's own sysfs probe plus the fields only a check needs (physical state, the
rate with its width, the subnet manager's LID). A port repeats under one check name on
a node or pair; the result's ``details["subject"]`` says which it is.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from functools import partial
from typing import Any

from aicluster.checks.context import Context
from aicluster.checks.result import Action, Result, Status, worst
from aicluster.checks.runner import Completed, PairCheck, Probe
from aicluster.components.infiniband.derive import match_port, opensm_hosts, port_label
from aicluster.components.infiniband.probe import PORTS_COMMAND, parse

LAYER = "infiniband"

SYSFS = "/sys/class/infiniband"
#: ib_write_bw's TCP port for the exchange before the test (perftest's default).
PERFTEST_PORT = 18515
#: Tries of the ib_write_bw client while the server on the other node comes up.
CLIENT_TRIES = 10
DETAIL_MARK = "#detail"
SMINFO_MARK = "#sminfo"
OPENSM_MARK = "#opensm"

#: Per port: ``DEVICE PORT|PHYS_STATE|RATE|SM_LID|LID``, the raw sysfs values (``5:
#: LinkUp``, ``400 Gb/sec (4X NDR)``, ``0x1``), "-" where a file is missing.
DETAIL_COMMAND = (
    f"for p in {SYSFS}/*/ports/*; do [ -d \"$p\" ] || continue; "
    "d=${p%/ports/*}; d=${d##*/}; "
    "ph=$(cat \"$p/phys_state\" 2>/dev/null); r=$(cat \"$p/rate\" 2>/dev/null); "
    "s=$(cat \"$p/sm_lid\" 2>/dev/null); l=$(cat \"$p/lid\" 2>/dev/null); "
    "echo \"$d ${p##*/}|${ph:--}|${r:--}|${s:--}|${l:--}\"; done 2>/dev/null; true"
)

#: The component's port lines, then the details.
PORTS_PROBE = f"{PORTS_COMMAND}; echo '{DETAIL_MARK}'; {DETAIL_COMMAND}"

#: ``sminfo`` through the first ACTIVE InfiniBand port of the node (any port of the
#: fabric reaches its subnet manager), bounded by its own MAD timeout.
SMINFO_COMMAND = (
    f"echo '{SMINFO_MARK}'; "
    "if ! command -v sminfo >/dev/null 2>&1; then echo 'notool'; else "
    f"for p in {SYSFS}/*/ports/*; do [ -d \"$p\" ] || continue; "
    "[ \"$(cat \"$p/link_layer\" 2>/dev/null)\" = InfiniBand ] || continue; "
    "case \"$(cat \"$p/state\" 2>/dev/null)\" in *ACTIVE*) ;; *) continue;; esac; "
    "d=${p%/ports/*}; d=${d##*/}; sminfo -t 2000 -C \"$d\" -P \"${p##*/}\" 2>&1; break; "
    "done; fi; true"
)

_RATE = re.compile(r"^([0-9.]+)\s*Gb/sec(?:\s*\((\d+)X\s*([A-Za-z]*)\))?")
_SMINFO = re.compile(r"sm lid (\S+) sm guid (\S+), activity count (\d+) priority (\d+) "
                     r"state (\d+) (\S+)")


def _state_word(raw: str | None) -> str | None:
    """``4: ACTIVE`` -> ``ACTIVE``; ``5: LinkUp`` -> ``LinkUp``."""
    if not raw or raw == "-":
        return None
    return raw.split(":", 1)[-1].strip()


def parse_rate(raw: str | None) -> dict[str, Any]:
    """``400 Gb/sec (4X NDR)`` -> ``{gbps: 400.0, width: "4X", speed: "NDR"}``."""
    m = _RATE.match(raw or "")
    if not m:
        return {"gbps": None, "width": None, "speed": None}
    return {"gbps": float(m.group(1)), "width": f"{m.group(2)}X" if m.group(2) else None,
            "speed": m.group(3) or None}


def _lid(raw: str | None) -> int | None:
    try:
        return int(str(raw), 0)
    except ValueError:
        return None


def parse_ports(text: str) -> list[dict[str, Any]]:
    """:data:`PORTS_PROBE`'s output: the component's port entries
    (:func:`aicluster.components.infiniband.probe.parse`) with ``phys_state``,
    ``rate`` (the raw sysfs line), ``width``, ``speed``, ``sm_lid`` and ``lid``."""
    head, _, tail = text.partition(DETAIL_MARK)
    ports = parse(head.splitlines())
    detail: dict[tuple[str, int], list[str]] = {}
    for line in tail.splitlines():
        key, _, rest = line.partition("|")
        parts = key.split()
        if len(parts) == 2 and parts[1].isdigit():
            detail[(parts[0], int(parts[1]))] = rest.split("|")
    for port in ports:
        values = detail.get((port["device"], port["port"]), [])
        phys, rate, sm_lid, lid = (values + ["-"] * 4)[:4]
        port.update({"phys_state": _state_word(phys), "rate": None if rate == "-" else rate,
                     **{k: v for k, v in parse_rate(rate).items() if k != "gbps"},
                     "sm_lid": _lid(sm_lid), "lid": _lid(lid)})
    return ports


def declared_ports(ctx: Context, node: str) -> list[dict[str, Any]]:
    """The node's declared ports as the infiniband component's matching takes them."""
    return [{"device": p.device, "pci": p.pci, "guid": p.guid, "port": p.port,
             "rate_gbps": p.rate_gbps}
            for p in ctx.host(node).spec.hardware.ib_ports]


def _seen(found: list[Mapping[str, Any]]) -> str:
    return ", ".join(f"{f['device']} port {f['port']}"
                     + (f" (pci {f['pci']})" if f.get("pci") else "") for f in found) or "none"


# ---------------------------------------------------------------------------
# infiniband.port
# ---------------------------------------------------------------------------


def judge_port(node: str, declared: Mapping[str, Any], found: list[Mapping[str, Any]]
               ) -> Result:
    label = port_label(declared)
    want = declared["rate_gbps"]
    base = {"node": node, "threshold": want, "unit": "Gb/s"}
    if not found:
        return Result("infiniband.port", Status.FAIL, **base, action=Action.INVESTIGATE,
                      details={"subject": label},
                      message=f"{node}: {label}: the node has no InfiniBand HCA at all "
                              f"({SYSFS} is empty): the card is missing or its driver "
                              "(mlx5_ib) is not loaded")
    port = match_port(declared, found)
    if port is None:
        return Result("infiniband.port", Status.FAIL, **base, action=Action.INVESTIGATE,
                      details={"subject": label},
                      message=f"{node}: {label} not found (the node has: {_seen(found)}); "
                              "fix the inventory's guid/pci/device")
    name = f"{port['device']} port {port['port']}"
    problems: list[tuple[Status, Action, str]] = []
    if port["state"] != "ACTIVE":
        why = {"INIT": "no subnet manager has configured it (see infiniband.sm)",
               "ARMED": "the subnet manager has not activated it yet",
               "DOWN": "no link"}.get(str(port["state"]), "")
        problems.append((Status.FAIL, Action.INVESTIGATE,
                         f"state {port['state']}" + (f": {why}" if why else "")))
    if port.get("phys_state") != "LinkUp":
        why = {"Polling": "no cable or no peer", "Disabled": "the port is disabled",
               "LinkErrorRecovery": "the link is recovering from errors"}.get(
            str(port.get("phys_state")), "")
        problems.append((Status.FAIL, Action.INVESTIGATE,
                         f"physical state {port.get('phys_state')}"
                         + (f" ({why})" if why else "")))
    rate = port.get("rate_gbps")
    if port["state"] == "ACTIVE":
        if rate is None:
            problems.append((Status.FAIL, Action.INVESTIGATE, "no link rate reported"))
        elif rate < want:
            problems.append((Status.FAIL, Action.INVESTIGATE,
                             f"link at {port.get('rate')}, declared {want} Gb/s (a cable, "
                             "transceiver or switch port downtrained it: reseat or replace)"))
    status, action = worst(problems)
    details = {"subject": label, "device": port["device"], "port": port["port"],
               "state": port["state"], "phys_state": port.get("phys_state"),
               "rate": port.get("rate"), "width": port.get("width"),
               "link_layer": port.get("link_layer"), "pci": port.get("pci")}
    message = (f"{node}: {label} ({name}): " + "; ".join(p[2] for p in problems)
               if problems else f"{label} ({name}) ACTIVE, LinkUp, {port.get('rate')}")
    return Result("infiniband.port", status, **base, value=rate, action=action,
                  message=message, details=details)


def judge_ports(node: str, declared: list[dict[str, Any]], done: Completed) -> list[Result]:
    found = parse_ports(done.stdout)
    return [judge_port(node, d, found) for d in declared]


def judge_undeclared(node: str, done: Completed) -> Result:
    """An ib_nodes member that declares no port: a SKIP, or a WARN where it has HCAs the
    inventory does not name (they are then checked by nothing)."""
    found = parse_ports(done.stdout)
    if found:
        return Result("infiniband.port", Status.WARN, node=node, action=Action.MONITOR,
                      details={"subject": "undeclared", "found": _seen(found)},
                      message=f"{node}: has InfiniBand ports ({_seen(found)}) but the "
                              "inventory declares none (hardware.ib_ports): declare them "
                              "to have them checked")
    return Result("infiniband.port", Status.SKIP, node=node, details={"subject": "none"},
                  message=f"{node}: declares no InfiniBand port (hardware.ib_ports) and "
                          f"has no HCA ({SYSFS} is empty): nothing to check")


# ---------------------------------------------------------------------------
# infiniband.sm
# ---------------------------------------------------------------------------


def parse_sminfo(text: str) -> dict[str, Any] | None:
    """``sminfo: sm lid 37 sm guid 0x..., activity count 4484381 priority 14 state 3
    SMINFO_MASTER`` -> its fields; None when sminfo got no answer."""
    m = _SMINFO.search(text)
    if not m:
        return None
    return {"sm_lid": _lid(m.group(1)), "sm_guid": m.group(2),
            "activity_count": int(m.group(3)), "priority": int(m.group(4)),
            "state": int(m.group(5)), "state_name": m.group(6)}


def sm_command(opensm_here: bool) -> str:
    out = f"{PORTS_PROBE}; {SMINFO_COMMAND}"
    if opensm_here:
        out += f"; echo \"{OPENSM_MARK} $(systemctl is-active opensm 2>/dev/null)\""
    return out


def judge_sm(node: str, declared: list[dict[str, Any]], opensm_here: bool,
             done: Completed) -> Result:
    ports_text, _, rest = done.stdout.partition(SMINFO_MARK)
    sminfo_text, _, opensm_text = rest.partition(OPENSM_MARK)
    found = parse_ports(ports_text)
    mine = [p for p in (match_port(d, found) for d in declared) if p is not None]
    ib = [p for p in mine if p.get("link_layer") == "InfiniBand"]
    if not mine:
        return Result("infiniband.sm", Status.SKIP, node=node,
                      message=f"{node}: none of its declared ports was found (infiniband.port "
                              "says why): no port to reach a subnet manager through")
    if not ib:
        return Result("infiniband.sm", Status.SKIP, node=node,
                      message=f"{node}: its ports are RoCE (Ethernet link layer), which "
                              "needs no subnet manager")
    problems: list[tuple[Status, Action, str]] = []
    without = [f"{p['device']} port {p['port']}" for p in ib if not p.get("sm_lid")]
    if without:
        problems.append((Status.FAIL, Action.INVESTIGATE,
                         f"no subnet manager known to {', '.join(without)} (sm_lid 0)"))
    sminfo = parse_sminfo(sminfo_text)
    details: dict[str, Any] = {"sm_lids": {f"{p['device']}/{p['port']}": p.get("sm_lid")
                                           for p in ib}}
    if sminfo_text.strip() == "notool":
        problems.append((Status.WARN, Action.REDEPLOY,
                         "sminfo is not installed (infiniband-diags, which the infiniband "
                         "component installs): judged by the ports' sm_lid alone"))
    elif sminfo is None:
        said = sminfo_text.strip().splitlines()
        problems.append((Status.FAIL, Action.INVESTIGATE,
                         "no subnet manager answers sminfo"
                         + (f" ({said[-1].strip()})" if said else " (no ACTIVE port to ask "
                            "through)")))
    else:
        details.update(sminfo)
        if sminfo["state"] != 3:
            problems.append((Status.WARN, Action.MONITOR,
                             f"the subnet manager at LID {sminfo['sm_lid']} is in state "
                             f"{sminfo['state_name']}, not master"))
    if opensm_here:
        state = opensm_text.strip() or "unknown"
        details["opensm"] = state
        if state != "active":
            managed = not without and sminfo is not None
            problems.append((Status.WARN if managed else Status.FAIL,
                             Action.RESTART_SERVICE,
                             f"opensm is {state} here, where the inventory runs it"
                             + (" (another subnet manager manages the fabric)" if managed
                                else "")))
    status, action = worst(problems)
    value = sminfo["sm_lid"] if sminfo else (ib[0].get("sm_lid") or None)
    if problems:
        message = f"{node}: " + "; ".join(p[2] for p in problems)
    else:
        message = (f"subnet manager at LID {value}"
                   + (f" (guid {sminfo['sm_guid']}, priority {sminfo['priority']}, "
                      f"{sminfo['state_name']})" if sminfo else ""))
    return Result("infiniband.sm", status, node=node, value=value, action=action,
                  message=message, details=details)


# ---------------------------------------------------------------------------
# infiniband.write_bw
# ---------------------------------------------------------------------------


def find_device(declared: Mapping[str, Any], sysfs: str = SYSFS) -> str:
    """Shell that sets ``dev`` to the node's name of the declared port's HCA (empty when
    it has none), matched as :func:`match_port` matches: GUID (the HCA's node GUID or
    the port's), PCI function, else the HCA's name."""
    port = int(declared["port"])
    tests = []
    if declared.get("guid"):
        guid = shlex.quote(str(declared["guid"]))
        tests.append(f"g=$(cat \"$d/node_guid\" 2>/dev/null); "
                     f"pg=$(cat \"$d/ports/{port}/gids/0\" 2>/dev/null); "
                     "pg=${pg#????:????:????:????:}; "
                     f"{{ [ \"$g\" = {guid} ] || [ \"$pg\" = {guid} ]; }}")
    if declared.get("pci"):
        tests.append("f=$(readlink -f \"$d/device\" 2>/dev/null); "
                     f"[ \"${{f##*/}}\" = {shlex.quote(str(declared['pci']))} ]")
    if not tests:
        tests.append(f"[ \"${{d##*/}}\" = {shlex.quote(str(declared['device']))} ]")
    test = " && ".join(f"{{ {t}; }}" for t in tests)
    return (f"dev=; for d in {sysfs}/*; do [ -d \"$d/ports/{port}\" ] || continue; "
            f"if {test}; then dev=${{d##*/}}; break; fi; done")


def write_bw_server(declared: Mapping[str, Any], seconds: int) -> str:
    return (f"{find_device(declared)}; [ -n \"$dev\" ] || exit 1; "
            f"exec ib_write_bw -d \"$dev\" -i {int(declared['port'])} -p {PERFTEST_PORT} "
            f"-F --report_gbits -D {int(seconds)}")


def write_bw_client(declared: Mapping[str, Any], peer: str, seconds: int,
                    counters: list[str]) -> str:
    """The client: the port's error counters, ib_write_bw against the server on the
    peer's management address (tried again while it comes up), the counters again."""
    port = int(declared["port"])
    names = " ".join(shlex.quote(c) for c in counters)
    run = (f"ib_write_bw -d \"$dev\" -i {port} -p {PERFTEST_PORT} -F --report_gbits "
           f"-D {int(seconds)} {shlex.quote(peer)} 2>&1")
    return (
        f"{find_device(declared)}; "
        "[ -n \"$dev\" ] || { echo '#nodev'; exit 0; }; "
        "command -v ib_write_bw >/dev/null 2>&1 || { echo '#notool'; exit 0; }; "
        f"c={SYSFS}/$dev/ports/{port}/counters; "
        f"counters() {{ for k in {names}; do v=$(cat \"$c/$k\" 2>/dev/null) || v=-; "
        "printf ' %s=%s' \"$k\" \"$v\"; done; echo; }; "
        "echo \"#dev $dev\"; printf '#before'; counters; "
        f"i=0; while :; do out=$({run}); rc=$?; "
        "case \"$out\" in *\"Couldn't connect\"*) "
        f"i=$((i + 1)); [ \"$i\" -ge {CLIENT_TRIES} ] && break; sleep 1;; "
        "*) break;; esac; done; "
        "printf '%s\\n#rc %s\\n' \"$out\" \"$rc\"; printf '#after'; counters"
    )


#: Without --report_gbits perftest reports MB/sec (older) or MiB/sec (newer).
_SCALE = {"Gb/sec": 1.0, "MB/sec": 8 / 1000, "MiB/sec": 8 * 1.048576 / 1000}


def parse_write_bw(text: str) -> float | None:
    """The BW average (Gb/s) of ib_write_bw's report line (the column under the
    header's ``BW average[...]``), None when it has none."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "BW average[" not in line:
            continue
        columns = [c for c in re.split(r"\s{2,}", line.strip()) if c]
        column = next(n for n, c in enumerate(columns) if c.startswith("BW average["))
        unit = columns[column].partition("[")[2].rstrip("]")
        for row in lines[i + 1:]:
            cells = row.split()
            if len(cells) > column and cells[0].isdigit() and cells[1].isdigit():
                return round(float(cells[column]) * _SCALE.get(unit, 1.0), 2)
    return None


def _reason(text: str) -> str | None:
    """What ib_write_bw said when it gave no result: its first error line."""
    said = [line.strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#")]
    errors = [line for line in said
              if re.search(r"couldn't|unable|failed|error", line, re.I)]
    return (errors or said or [None])[0]


def parse_counters(line: str) -> dict[str, int]:
    out = {}
    for item in line.split():
        key, _, value = item.partition("=")
        if value.isdigit():
            out[key] = int(value)
    return out


def judge_write_bw(a: str, b: str, label: str, floor: float | None, rate: int,
                   done: Completed) -> Result:
    pair = (a, b)
    base = {"pair": pair, "threshold": floor, "unit": "Gb/s"}
    details: dict[str, Any] = {"subject": label, "rate_gbps": rate}
    text = done.stdout
    if "#nodev" in text:
        return Result("infiniband.write_bw", Status.FAIL, **base, details=details,
                      action=Action.INVESTIGATE,
                      message=f"{a}: {label} not found on the node (see infiniband.port)")
    if "#notool" in text or done.rc == 127:
        return Result("infiniband.write_bw", Status.ERROR, **base, details=details,
                      action=Action.REDEPLOY,
                      message=f"{a}: ib_write_bw is not installed (perftest, which the "
                              "infiniband component installs: deploy again)")
    marks = {line.split(None, 1)[0]: line.split(None, 1)[1] if " " in line else ""
             for line in text.splitlines() if line.startswith("#")}
    before = parse_counters(marks.get("#before", ""))
    after = parse_counters(marks.get("#after", ""))
    grown = {k: after[k] - before[k] for k in before if k in after and after[k] > before[k]}
    details.update({"device": marks.get("#dev"), "counters_before": before,
                    "counters_grown": grown})
    gbps = parse_write_bw(text)
    problems: list[tuple[Status, Action, str]] = []
    if gbps is None:
        reason = _reason(text) or f"exit {marks.get('#rc', done.rc)}"
        problems.append((Status.FAIL, Action.INVESTIGATE,
                         f"ib_write_bw gave no result ({reason}); is {b}'s port up and "
                         f"its server reachable on TCP {PERFTEST_PORT}?"))
    elif floor is None:
        problems.append((Status.WARN, Action.MONITOR,
                         f"{gbps:g} Gb/s; no floor for a {rate} Gb/s link (add "
                         f"check_thresholds.infiniband.ib_write_bw_min_gbps.{rate})"))
    elif gbps < floor:
        problems.append((Status.FAIL, Action.INVESTIGATE,
                         f"{gbps:g} Gb/s, below {floor:g} Gb/s for a {rate} Gb/s link"))
    if grown:
        problems.append((Status.FAIL, Action.INVESTIGATE,
                         "error counters grew during the test: "
                         + ", ".join(f"{k} +{v}" for k, v in sorted(grown.items()))))
    status, action = worst(problems)
    where = f"{a} -> {b} {label}"
    message = (f"{where}: " + "; ".join(p[2] for p in problems) if problems
               else f"{where}: {gbps:g} Gb/s, no error counter grew")
    return Result("infiniband.write_bw", status, **base, value=gbps, action=action,
                  message=message, details=details)


def _write_bw_probe(ctx: Context, index: int, a: str, b: str) -> Probe:
    mine, theirs = declared_ports(ctx, a)[index], declared_ports(ctx, b)[index]
    rate = min(mine["rate_gbps"], theirs["rate_gbps"])
    seconds = int(ctx.threshold(a, "infiniband.ib_write_bw_seconds"))
    counters = [str(c) for c in ctx.threshold(a, "infiniband.error_counters")]
    peer = str(ctx.address(b, "management"))
    return Probe("infiniband.write_bw", LAYER,
                 write_bw_client(mine, peer, seconds, counters),
                 partial(judge_write_bw, a, b, port_label(mine), ctx.ib_floor(a, rate), rate),
                 timeout=seconds + CLIENT_TRIES + 30, pair=(a, b),
                 server=write_bw_server(theirs, seconds))


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------


def probes(ctx: Context) -> list[Probe]:
    """infiniband.port and infiniband.sm on the ib_nodes that declare ports; on those
    that declare none, one infiniband.port that says so (or finds HCAs nobody named)."""
    out = []
    sms = {name for name, _ in opensm_hosts(ctx.cluster)}
    for node in ctx.in_groups("ib_nodes"):
        declared = declared_ports(ctx, node)
        if not declared:
            out.append(Probe("infiniband.port", LAYER, PORTS_PROBE,
                             partial(judge_undeclared, node), timeout=15, node=node))
            continue
        out.append(Probe("infiniband.port", LAYER, PORTS_PROBE,
                         partial(judge_ports, node, declared), timeout=15, node=node))
        here = node in sms
        out.append(Probe("infiniband.sm", LAYER, sm_command(here),
                         partial(judge_sm, node, declared, here), timeout=20, node=node))
    return out


def pair_checks(ctx: Context) -> list[PairCheck]:
    """infiniband.write_bw (standard tier): port i of every ib_node with port i against
    port i of every other."""
    if not ctx.standard:
        return []
    nodes = ctx.in_groups("ib_nodes")
    most = max((len(ctx.host(n).spec.hardware.ib_ports) for n in nodes), default=0)
    return [PairCheck("infiniband.write_bw", LAYER,
                      [n for n in nodes if len(ctx.host(n).spec.hardware.ib_ports) > i],
                      partial(_write_bw_probe, ctx, i))
            for i in range(most)]
