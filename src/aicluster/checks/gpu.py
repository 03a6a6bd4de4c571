"""GPUs: the NVIDIA GPUs each node of ``gpu_nodes`` declares, as the inventory and the
nvidia component's pins say, healthy, and as fast as their model should be.

Planned for the nodes of ``gpu_nodes`` whose ``hardware.gpus`` declares NVIDIA GPUs
(``count > 0``); a node with a stand-in GPU (vendor ``standin``, the testbed) gets one
SKIP saying why, a node with none gets nothing.

Quick (one ``nvidia-smi`` round trip for the state, one for the kernel log, one more on
NVSwitch nodes):

- ``gpu.count``, ``gpu.model`` (the family in the name nvidia-smi reports, and the memory
  within ``gpu.memory_tolerance_percent`` of ``hardware.gpus.memory_gb``), ``gpu.driver``
  (the pinned ``nvidia_driver_version``, else any of ``nvidia_driver_branch``: the
  component's own post-reboot verify), ``gpu.persistence``, ``gpu.ecc`` (mode on, no
  uncorrected error since the driver loaded), ``gpu.row_remap`` (no remap pending, none
  failed), ``gpu.pcie_width`` (the profile's width, else the GPU's own maximum),
  ``gpu.temperature``;
- ``gpu.xid``: the Xid events in the kernel log since boot, each mapped to the action of
  NVIDIA's Xid catalog;
- NVSwitch nodes: ``gpu.nvlink`` (every GPU's links up, as many as the profile's
  ``nvlinks``) and ``gpu.fabric_manager`` (the service active, every GPU's fabric state
  Completed with status Success).

Standard and burn-in: ``gpu.dcgm_diag`` (``dcgmi diag -r <level> -j``), ``gpu.nccl``
(``all_reduce_perf`` on all the node's GPUs, ``gpu.nccl_iterations`` times: the median
bus bandwidth at the largest size against the profile's floor, ``#wrong`` 0 everywhere)
and, between two Slurm workers, ``gpu.nccl_pair`` (one GPU per node through ``srun``).
"""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
import statistics
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from aicluster.checks.context import Context, size_bytes
from aicluster.checks.result import Action, Result, Status
from aicluster.checks.runner import Completed, PairCheck, Probe
from aicluster.common.versions import version_matches

LAYER = "gpu"

#: The checks the state probe answers, in the order of its results.
STATE_CHECKS = ("gpu.count", "gpu.model", "gpu.driver", "gpu.persistence", "gpu.ecc",
                "gpu.row_remap", "gpu.pcie_width", "gpu.temperature")
FABRIC_CHECKS = ("gpu.nvlink", "gpu.fabric_manager")

#: ``nvidia-smi --query-gpu`` fields, in this order (``--format=csv,noheader,nounits``).
GPU_FIELDS = ("index", "pci.bus_id", "name", "driver_version", "persistence_mode",
              "ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
              "ecc.errors.uncorrected.aggregate.total", "pcie.link.width.current",
              "pcie.link.width.max", "temperature.gpu", "memory.total")
#: ``nvidia-smi --query-remapped-rows`` fields (Ampere and newer).
REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.correctable", "remapped_rows.uncorrectable",
                "remapped_rows.pending", "remapped_rows.failure")

#: Seconds a probe may run: the quick tier's three together stay within a minute a node.
STATE_TIMEOUT = 25
XID_TIMEOUT = 10
FABRIC_TIMEOUT = 25
#: ``dcgmi diag`` per level: 1 takes seconds, 2 about two minutes, 3 about 15 minutes
#: (30 and more on eight GPUs), 4 hours (DCGM's dcgmi-diag reference).
DCGM_TIMEOUT = {1: 300, 2: 900, 3: 3600, 4: 14400}
#: all_reduce_perf, all iterations together.
NCCL_TIMEOUT = {"standard": 1200, "burn-in": 3600}
#: The newest kernel-log lines with an Xid the probe sends back.
XID_LINES = 500
#: The active GPU tests (DCGM's diagnostic, all_reduce_perf) of one node take this lock
#: on the node (flock(1), root's /run) so that they never run on the GPUs at the same
#: time; each waits for the other within its own limit. Exit status when it waited out.
GPU_LOCK = "/run/aicluster-check-gpu.lock"
BUSY_RC = 75

_SECTION = re.compile(r"^## (\S+)(?: (.*))?$")


# ---------------------------------------------------------------------------
# Output framing: the probes print "## <name>" before each tool's output and
# "## rc <status>" after it.
# ---------------------------------------------------------------------------


def sections(text: str) -> dict[str, dict[str, Any]]:
    """``{name: {"lines": [...], "rc": int | None, "arg": str}}`` from a probe's output."""
    out: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m and m.group(1) == "rc" and current is not None:
            current["rc"] = int(m.group(2)) if (m.group(2) or "").strip().isdigit() else None
            continue
        if m and m.group(1) != "rc":
            current = out.setdefault(m.group(1), {"lines": [], "rc": None,
                                                  "arg": (m.group(2) or "").strip()})
            continue
        if current is not None:
            current["lines"].append(line)
    return out


def _value(text: str) -> str | None:
    """A CSV field of nvidia-smi: None for ``[N/A]``, ``N/A``, ``[Not Supported]``..."""
    text = text.strip()
    if not text or text.strip("[]").lower() in ("n/a", "not supported", "unknown error",
                                                "insufficient permissions"):
        return None
    return text


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------
# nvidia-smi failing as a whole
# ---------------------------------------------------------------------------

#: What nvidia-smi says when it cannot talk to the driver, and what to do about it.
SMI_FAILURES = (
    ("Driver/library version mismatch", Action.REBOOT,
     "the driver's user-space library and the loaded kernel module differ (the driver was "
     "upgraded without a reboot): reboot the node"),
    ("couldn't communicate with the NVIDIA driver", Action.REDEPLOY,
     "no NVIDIA kernel module is loaded (a kernel update without a rebuilt module?): "
     "deploy again, which installs the driver and reboots"),
    ("No devices were found", Action.REBOOT,
     "the driver sees no GPU: check the kernel log for Xid 79, reboot; a GPU that stays "
     "missing needs service"),
)


def _smi_failed(node: str, checks: Iterable[str], what: str, text: str, rc: int | None,
                ) -> list[Result]:
    """The checks nvidia-smi could not answer: the first FAILs with the cause, the others
    are ERRORs pointing at it."""
    detail = " ".join(line.strip() for line in text.splitlines() if line.strip())[-300:]
    action, cause = Action.INVESTIGATE, f"{what} failed (exit {rc}): {detail or 'no output'}"
    for needle, known_action, known_cause in SMI_FAILURES:
        if needle.lower() in text.lower():
            action, cause = known_action, f"{known_cause} ({needle})"
    checks = list(checks)
    first = Result(checks[0], Status.FAIL, node=node, action=action,
                   message=f"{node}: {cause}")
    return [first] + [Result(c, Status.ERROR, node=node, action=action,
                             message=f"{node}: not checked: {what} failed "
                                     f"(see {checks[0]})") for c in checks[1:]]


def _missing_tool(node: str, checks: Iterable[str], tool: str, hint: str) -> list[Result]:
    return [Result(c, Status.ERROR, node=node, action=Action.REDEPLOY,
                   message=f"{node}: {tool} is not installed; {hint}") for c in checks]


def _not_found(done: Completed) -> bool:
    return done.rc == 127 or "not found" in done.stderr


# ---------------------------------------------------------------------------
# The state: nvidia-smi --query-gpu and --query-remapped-rows
# ---------------------------------------------------------------------------


def state_command() -> str:
    gpu = ",".join(GPU_FIELDS)
    remap = ",".join(REMAP_FIELDS)
    return (
        "command -v nvidia-smi >/dev/null 2>&1 || { echo 'nvidia-smi: not found' >&2; "
        "exit 127; }\n"
        "echo '## query-gpu'\n"
        f"nvidia-smi --query-gpu={gpu} --format=csv,noheader,nounits 2>&1\n"
        'echo "## rc $?"\n'
        "echo '## query-remapped-rows'\n"
        f"nvidia-smi --query-remapped-rows={remap} --format=csv,noheader 2>&1\n"
        'echo "## rc $?"\n'
    )


def parse_query_gpu(lines: Iterable[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The GPUs of ``--query-gpu=GPU_FIELDS --format=csv,noheader,nounits``, and the lines
    that are no GPU (nvidia-smi's complaints about one it lost)."""
    gpus, other = [], []
    for row in csv.reader([line for line in lines if line.strip()], skipinitialspace=True):
        if len(row) != len(GPU_FIELDS) or not row[0].strip().isdigit():
            other.append(", ".join(row))
            continue
        raw = dict(zip(GPU_FIELDS, (f.strip() for f in row), strict=True))
        gpus.append({
            "index": int(raw["index"]),
            "bus": raw["pci.bus_id"],
            "name": raw["name"],
            "driver": raw["driver_version"],
            "persistence": raw["persistence_mode"],
            "ecc_mode": _value(raw["ecc.mode.current"]),
            "ecc_volatile": _int(_value(raw["ecc.errors.uncorrected.volatile.total"])),
            "ecc_aggregate": _int(_value(raw["ecc.errors.uncorrected.aggregate.total"])),
            "width": _int(_value(raw["pcie.link.width.current"])),
            "width_max": _int(_value(raw["pcie.link.width.max"])),
            "temperature": _int(_value(raw["temperature.gpu"])),
            "memory_mib": _int(_value(raw["memory.total"])),
        })
    return gpus, other


def parse_remapped_rows(lines: Iterable[str]) -> list[dict[str, Any]]:
    """``--query-remapped-rows=REMAP_FIELDS --format=csv,noheader``: one entry per GPU
    (None values where the GPU does not support row remapping)."""
    out = []
    for row in csv.reader([line for line in lines if line.strip()], skipinitialspace=True):
        if len(row) != len(REMAP_FIELDS):
            continue
        bus, correctable, uncorrectable, pending, failure = (f.strip() for f in row)
        out.append({
            "bus": bus,
            "correctable": _int(_value(correctable)),
            "uncorrectable": _int(_value(uncorrectable)),
            "pending": _yes(_value(pending)),
            "failure": _yes(_value(failure)),
        })
    return out


def _yes(text: str | None) -> bool | None:
    if text is None:
        return None
    return text.strip().lower() in ("yes", "1", "true")


def _gpu(g: dict[str, Any]) -> str:
    return f"GPU {g['index']} ({g['bus']})"


def _family(model: str) -> str:
    """The GPU family in a model name as the inventory writes it: ``H100-SXM5-80GB``
    -> ``H100`` (its first word holding a digit)."""
    words = [w for w in re.split(r"[-_\s/]+", model.upper()) if w]
    return next((w for w in words if re.search(r"\d", w)), model.upper())


def judge_count(node: str, want: int, gpus: list[dict], other: list[str]) -> Result:
    seen = len(gpus)
    if seen == want:
        return Result("gpu.count", Status.PASS, node=node, value=seen, threshold=want,
                      unit="GPUs", message=f"{seen} GPU(s) answer, as declared")
    lost = f"; nvidia-smi: {' | '.join(other)[:300]}" if other else ""
    if seen < want:
        return Result("gpu.count", Status.FAIL, node=node, value=seen, threshold=want,
                      unit="GPUs", action=Action.REBOOT, details={"nvidia_smi": other},
                      message=f"{node}: nvidia-smi sees {seen} GPU(s), the inventory declares "
                              f"{want}: a GPU is lost (look for Xid 79 in the kernel log); "
                              f"reboot, and have the node serviced if it stays missing{lost}")
    return Result("gpu.count", Status.FAIL, node=node, value=seen, threshold=want,
                  unit="GPUs", action=Action.INVESTIGATE,
                  message=f"{node}: nvidia-smi sees {seen} GPU(s), the inventory declares "
                          f"{want}: correct hardware.gpus.count")


def judge_model(node: str, model: str, memory_gb: int, tolerance: float,
                gpus: list[dict]) -> Result:
    family = _family(model)
    wrong = []
    for g in gpus:
        words = re.split(r"[-_\s/]+", g["name"].upper())
        if family not in words and family not in g["name"].upper():
            wrong.append(f"{_gpu(g)} is a {g['name']}")
        elif memory_gb and g["memory_mib"] is not None:
            have = g["memory_mib"] / 1024
            if abs(have - memory_gb) > memory_gb * tolerance / 100:
                wrong.append(f"{_gpu(g)} has {have:.0f} GiB ({g['name']}), declared "
                             f"{memory_gb} GB")
    names = sorted({g["name"] for g in gpus})
    if wrong:
        return Result("gpu.model", Status.FAIL, node=node, value=", ".join(names),
                      threshold=model, action=Action.INVESTIGATE,
                      details={"mismatch": wrong},
                      message=f"{node}: not the GPU hardware.gpus declares ({model}, "
                              f"{memory_gb or '?'} GB): {'; '.join(wrong[:4])}")
    return Result("gpu.model", Status.PASS, node=node, value=", ".join(names),
                  threshold=model, message=f"{family} as declared")


def judge_driver(node: str, want: str, gpus: list[dict]) -> Result:
    have = sorted({g["driver"] for g in gpus})
    value = ", ".join(have)
    if len(have) == 1 and version_matches(have[0], want):
        return Result("gpu.driver", Status.PASS, node=node, value=value, threshold=want,
                      message="the pinned driver is loaded")
    return Result("gpu.driver", Status.FAIL, node=node, value=value, threshold=want,
                  action=Action.REDEPLOY,
                  message=f"{node}: NVIDIA driver {value} is loaded, the inventory pins "
                          f"{want} (nvidia_driver_version, else nvidia_driver_branch): deploy "
                          "again (drain, install, reboot, verify)")


def judge_persistence(node: str, wanted: bool, gpus: list[dict]) -> Result:
    if not wanted:
        return Result("gpu.persistence", Status.SKIP, node=node,
                      message="nvidia_persistenced is false in the inventory: persistence "
                              "mode is not expected")
    off = [_gpu(g) for g in gpus if g["persistence"].lower() != "enabled"]
    on = len(gpus) - len(off)
    if off:
        return Result("gpu.persistence", Status.FAIL, node=node, value=on,
                      threshold=len(gpus), unit="GPUs", action=Action.RESTART_SERVICE,
                      message=f"{node}: persistence mode is off on {', '.join(off)}: "
                              "restart nvidia-persistenced (the deploy runs it with "
                              "persistence mode on)")
    return Result("gpu.persistence", Status.PASS, node=node, value=on, threshold=len(gpus),
                  unit="GPUs", message="persistence mode on every GPU")


def judge_ecc(node: str, gpus: list[dict]) -> Result:
    unsupported = [g for g in gpus if g["ecc_mode"] is None]
    if gpus and len(unsupported) == len(gpus):
        return Result("gpu.ecc", Status.SKIP, node=node,
                      message=f"ECC is not supported by {gpus[0]['name']}")
    off = [_gpu(g) for g in gpus if g["ecc_mode"] is not None
           and g["ecc_mode"].lower() != "enabled"]
    volatile = sum(g["ecc_volatile"] or 0 for g in gpus)
    aggregate = sum(g["ecc_aggregate"] or 0 for g in gpus)
    hit = [f"{_gpu(g)}: {g['ecc_volatile']}" for g in gpus if g["ecc_volatile"]]
    details = {"volatile": volatile, "aggregate": aggregate}
    if off:
        return Result("gpu.ecc", Status.FAIL, node=node, value=volatile, threshold=0,
                      unit="errors", action=Action.INVESTIGATE, details=details,
                      message=f"{node}: ECC is off on {', '.join(off)}: turn it on "
                              "(nvidia-smi -e 1) and reset the GPUs or reboot")
    if volatile:
        return Result("gpu.ecc", Status.FAIL, node=node, value=volatile, threshold=0,
                      unit="errors", action=Action.RESET_GPU, details=details,
                      message=f"{node}: uncorrected ECC errors since the driver loaded "
                              f"({'; '.join(hit)}): drain the node and reset the GPU")
    if aggregate:
        return Result("gpu.ecc", Status.WARN, node=node, value=volatile, threshold=0,
                      unit="errors", action=Action.MONITOR, details=details,
                      message=f"{node}: none since the driver loaded, {aggregate} uncorrected "
                              "ECC error(s) over the GPUs' lifetime: watch gpu.row_remap")
    return Result("gpu.ecc", Status.PASS, node=node, value=0, threshold=0, unit="errors",
                  details=details, message="ECC on, no uncorrected error")


def judge_row_remap(node: str, section: dict[str, Any] | None,
                    gpus: list[dict]) -> Result:
    lines = (section or {}).get("lines", [])
    rows = parse_remapped_rows(lines)
    if not rows or all(r["pending"] is None and r["failure"] is None for r in rows):
        text = " ".join(lines).strip()
        if section is None or (section.get("rc") not in (0, None) and
                               "not supported" not in text.lower()):
            return Result("gpu.row_remap", Status.ERROR, node=node,
                          message=f"{node}: nvidia-smi --query-remapped-rows gave nothing "
                                  f"readable: {text[:200] or 'no output'}")
        name = gpus[0]["name"] if gpus else "these GPUs"
        return Result("gpu.row_remap", Status.SKIP, node=node,
                      message=f"row remapping is not supported by {name} (before Ampere: "
                              "page retirement)")
    index = {g["bus"].lower(): g for g in gpus}

    def where(r: dict) -> str:
        g = index.get(r["bus"].lower())
        return _gpu(g) if g else r["bus"]

    failed = [where(r) for r in rows if r["failure"]]
    pending = [where(r) for r in rows if r["pending"]]
    uncorrectable = sum(r["uncorrectable"] or 0 for r in rows)
    details = {"rows": rows}
    if failed:
        return Result("gpu.row_remap", Status.FAIL, node=node, value=uncorrectable,
                      unit="rows", action=Action.ISOLATE, details=details,
                      message=f"{node}: row remapping failed on {', '.join(failed)}: the "
                              "GPU's spare memory rows are used up; take the node out of "
                              "service and have the GPU replaced (RMA)")
    if pending:
        return Result("gpu.row_remap", Status.FAIL, node=node, value=uncorrectable,
                      unit="rows", action=Action.RESET_GPU, details=details,
                      message=f"{node}: a row remap is pending on {', '.join(pending)}: "
                              "drain the node and reset the GPU (or reboot) to apply it")
    return Result("gpu.row_remap", Status.PASS, node=node, value=uncorrectable,
                  unit="rows", details=details,
                  message="no row remap pending or failed")


def judge_pcie_width(node: str, want: int, gpus: list[dict]) -> Result:
    narrow = []
    for g in gpus:
        expect = want or g["width_max"] or 0
        if g["width"] is None or (expect and g["width"] < expect):
            narrow.append(f"{_gpu(g)} x{g['width']} of x{expect}")
    widths = [g["width"] for g in gpus if g["width"] is not None]
    value = min(widths) if widths else None
    threshold = want or max((g["width_max"] or 0 for g in gpus), default=0) or None
    if narrow:
        return Result("gpu.pcie_width", Status.FAIL, node=node, value=value,
                      threshold=threshold, unit="lanes", action=Action.INVESTIGATE,
                      message=f"{node}: PCIe link narrower than it should be: "
                              f"{', '.join(narrow)}: reseat the GPU or its riser, check the "
                              "slot's BIOS setting")
    return Result("gpu.pcie_width", Status.PASS, node=node, value=value,
                  threshold=threshold, unit="lanes", message="every GPU at full PCIe width")


def judge_temperature(node: str, warn_c: float, fail_c: float, gpus: list[dict]) -> Result:
    temps = [(g["temperature"], g) for g in gpus if g["temperature"] is not None]
    if not temps:
        return Result("gpu.temperature", Status.ERROR, node=node,
                      message=f"{node}: nvidia-smi reports no GPU temperature")
    hottest, g = max(temps, key=lambda t: t[0])
    if hottest > fail_c:
        return Result("gpu.temperature", Status.FAIL, node=node, value=hottest,
                      threshold=fail_c, unit="C", action=Action.INVESTIGATE,
                      message=f"{node}: {_gpu(g)} is at {hottest} C: check the fans and "
                              "the airflow before it throttles or shuts down")
    if hottest > warn_c:
        return Result("gpu.temperature", Status.WARN, node=node, value=hottest,
                      threshold=warn_c, unit="C", action=Action.MONITOR,
                      message=f"{node}: {_gpu(g)} is at {hottest} C (idle GPUs should be "
                              "cooler): check the airflow")
    return Result("gpu.temperature", Status.PASS, node=node, value=hottest,
                  threshold=warn_c, unit="C", message="the hottest GPU")


def judge_state(node: str, expect: dict[str, Any], done: Completed) -> list[Result]:
    """The state probe's output (:func:`state_command`) against the inventory."""
    if _not_found(done):
        return _missing_tool(node, STATE_CHECKS, "nvidia-smi",
                             "the nvidia component installs the driver with it: deploy "
                             "again")
    parts = sections(done.stdout)
    query = parts.get("query-gpu")
    if query is None:
        return _smi_failed(node, STATE_CHECKS, "the nvidia-smi probe",
                           done.stdout + done.stderr, done.rc)
    gpus, other = parse_query_gpu(query["lines"])
    if not gpus:
        return _smi_failed(node, STATE_CHECKS, "nvidia-smi --query-gpu",
                           "\n".join(query["lines"]), query["rc"])
    return [
        judge_count(node, expect["count"], gpus, other),
        judge_model(node, expect["model"], expect["memory_gb"], expect["memory_tolerance"],
                    gpus),
        judge_driver(node, expect["driver"], gpus),
        judge_persistence(node, expect["persistence"], gpus),
        judge_ecc(node, gpus),
        judge_row_remap(node, parts.get("query-remapped-rows"), gpus),
        judge_pcie_width(node, expect["pcie_width"], gpus),
        judge_temperature(node, expect["temperature_warn"], expect["temperature_fail"],
                          gpus),
    ]


# ---------------------------------------------------------------------------
# Xid events in the kernel log since boot
# ---------------------------------------------------------------------------

#: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
#: the "Resolution Bucket (Immediate Action)" column; as NVIDIA's NVSentinel ships it in
#: xiderrorsmapping.csv), by bucket. An Xid in none of them is one the catalog says to
#: report (UNEXPECTED_ERR_REPORT_ISSUE), or a newer one: investigate.
XID_IGNORE = frozenset({14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 121, 137, 141,
                        152, 153, 157, 161})
XID_RESTART_APP = frozenset({8, 11, 13, 25, 31, 32, 39, 40, 41, 45, 60, 68, 69, 70, 71, 72,
                             75, 76, 77, 80, 82, 83, 84, 85, 86, 88, 89, 94, 96, 97, 98, 99,
                             100, 101, 102, 103, 104, 105, 126, 127, 128, 129, 130, 131,
                             132, 133, 134, 135, 139, 159})
XID_RESET_GPU = frozenset({46, 48, 62, 74, 95, 109, 110, 119, 120, 136, 140, 143, 144, 145,
                           146, 147, 148, 149, 150, 155, 156, 158, 162})
XID_REBOOT = frozenset({79, 151, 160})
#: Row remapping failed: the catalog's immediate action is a GPU reset, but the GPU's
#: spare rows are used up, which NVIDIA's memory error management names an RMA
#: criterion: take the node out of service (as AWS's GPU health checks do).
XID_ISOLATE = frozenset({64})
#: What the common ones are, for the message.
XID_NAMES = {
    13: "graphics engine exception", 31: "GPU memory page fault",
    43: "GPU stopped processing", 45: "preemptive cleanup after an earlier error",
    46: "GPU stopped processing (timeout)", 48: "double-bit ECC error",
    54: "power-reduced clocking", 62: "internal micro-controller halt",
    63: "row remapping event", 64: "row remapping failure", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error", 140: "unrecovered ECC error", 154: "GPU recovery action changed",
}
#: The order in which actions win (the worst first).
_ACTION_RANK = [Action.ISOLATE, Action.REBOOT, Action.RESET_GPU, Action.INVESTIGATE,
                Action.MONITOR, Action.NONE]

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)$")
_RECOVERY = re.compile(r"to 0x[0-9a-f]+ \(([^)]*)\)", re.I)


def xid_command() -> str:
    keep = "grep -E '^## rc |NVRM: Xid' | tail -n " + str(XID_LINES)
    return (
        "if command -v journalctl >/dev/null 2>&1 && "
        "journalctl -k -b -q --no-pager -n 1 >/dev/null 2>&1; then\n"
        "  echo '## xid journal'\n"
        "  { journalctl -k -b -q --no-pager -o short-iso 2>&1; echo \"## rc $?\"; } | "
        f"{keep}\n"
        "else\n"
        "  echo '## xid dmesg'\n"
        f"  {{ dmesg 2>&1; echo \"## rc $?\"; }} | {keep}\n"
        "fi\n"
    )


def parse_xids(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The Xid events of kernel-log lines (``NVRM: Xid (PCI:0000:18:00): 79, ...``)."""
    out = []
    for line in lines:
        m = _XID.search(line)
        if m:
            out.append({"pci": m.group(1).lower(), "code": int(m.group(2)),
                        "text": m.group(3).strip(), "line": line.strip()})
    return out


def xid_action(code: int, text: str = "") -> Action:
    """What NVIDIA's Xid catalog says to do about one Xid (NONE: ignore it)."""
    if code == 154:  # the driver's recommended recovery, in words
        m = _RECOVERY.search(text)
        wanted = (m.group(1) if m else text).lower()
        if "reboot" in wanted:
            return Action.REBOOT
        if "reset" in wanted or "drain" in wanted:
            return Action.RESET_GPU
        return Action.NONE
    if code in XID_ISOLATE:
        return Action.ISOLATE
    if code in XID_REBOOT:
        return Action.REBOOT
    if code in XID_RESET_GPU:
        return Action.RESET_GPU
    if code in XID_RESTART_APP:
        return Action.MONITOR
    if code in XID_IGNORE:
        return Action.NONE
    return Action.INVESTIGATE


def judge_xid(node: str, done: Completed) -> Result:
    parts = sections(done.stdout)
    log = parts.get("xid")
    if log is None or log["rc"] not in (0,):
        return Result("gpu.xid", Status.ERROR, node=node,
                      message=f"{node}: could not read the kernel log "
                              f"({(log or {}).get('arg') or 'journalctl/dmesg'} exit "
                              f"{(log or {}).get('rc')}): {done.stderr.strip()[-200:]}")
    events = parse_xids(log["lines"])
    by_code: dict[int, dict[str, Any]] = {}
    for e in events:
        entry = by_code.setdefault(e["code"], {"count": 0, "gpus": [], "action": Action.NONE,
                                               "last": ""})
        entry["count"] += 1
        if e["pci"] not in entry["gpus"]:
            entry["gpus"].append(e["pci"])
        entry["last"] = e["line"]
        action = xid_action(e["code"], e["text"])
        if _ACTION_RANK.index(action) < _ACTION_RANK.index(entry["action"]):
            entry["action"] = action
    counted = {c: v for c, v in by_code.items() if v["action"] is not Action.NONE}
    details = {"source": log["arg"], "xids": {
        str(c): {"count": v["count"], "gpus": v["gpus"], "action": v["action"].value,
                 "last": v["last"]} for c, v in sorted(by_code.items())}}
    if len(log["lines"]) >= XID_LINES - 1:  # tail kept the "## rc" line too
        details["truncated"] = f"only the newest {XID_LINES} lines were read"
    value = sum(v["count"] for v in counted.values())
    if not counted:
        ignored = f" ({sum(v['count'] for v in by_code.values())} the catalog ignores)" \
            if by_code else ""
        return Result("gpu.xid", Status.PASS, node=node, value=0, threshold=0,
                      unit="events", details=details,
                      message=f"no Xid to act on since boot{ignored}")
    worst = min((v["action"] for v in counted.values()), key=_ACTION_RANK.index)
    words = {Action.ISOLATE: "take the node out of service and have the GPU serviced",
             Action.REBOOT: "drain and reboot the node",
             Action.RESET_GPU: "drain the node and reset the GPU (or reboot)",
             Action.INVESTIGATE: "investigate (NVIDIA's catalog says to report it)",
             Action.MONITOR: "application errors: the GPU recovered; watch for repeats"}

    def name(code: int, last: str) -> str:
        if code == 154:
            m = _RECOVERY.search(last)
            return f"recovery action: {m.group(1)}" if m else XID_NAMES[154]
        return XID_NAMES.get(code) or _XID.search(last).group(3)[:60]

    listed = "; ".join(
        f"Xid {c} ({name(c, v['last'])}) x{v['count']} on {', '.join(v['gpus'])}"
        for c, v in sorted(counted.items(),
                           key=lambda kv: _ACTION_RANK.index(kv[1]["action"])))
    status = Status.WARN if worst is Action.MONITOR else Status.FAIL
    return Result("gpu.xid", status, node=node, value=value, threshold=0, unit="events",
                  action=worst, details=details,
                  message=f"{node}: since boot: {listed}: {words[worst]}")


# ---------------------------------------------------------------------------
# NVSwitch nodes: NVLink and Fabric Manager
# ---------------------------------------------------------------------------


def fabric_command() -> str:
    return (
        "command -v nvidia-smi >/dev/null 2>&1 || { echo 'nvidia-smi: not found' >&2; "
        "exit 127; }\n"
        'echo "## fabricmanager $(systemctl is-active nvidia-fabricmanager 2>/dev/null)"\n'
        "echo '## nvlink'\n"
        "nvidia-smi nvlink -s 2>&1\n"
        'echo "## rc $?"\n'
        "echo '## query'\n"
        "nvidia-smi -q 2>&1\n"
        'echo "## rc $?"\n'
    )


_NVLINK_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: [^)]*\))?\s*$")
_NVLINK_LINK = re.compile(r"^\s*Link (\d+): (.*)$")


def parse_nvlink_status(lines: Iterable[str]) -> list[dict[str, Any]]:
    """``nvidia-smi nvlink -s``: per GPU, its links' speeds (GB/s; None: inactive)."""
    gpus: list[dict[str, Any]] = []
    for line in lines:
        m = _NVLINK_GPU.match(line)
        if m:
            gpus.append({"index": int(m.group(1)), "name": m.group(2), "links": {},
                         "note": ""})
            continue
        m = _NVLINK_LINK.match(line)
        if m and gpus:
            speed = re.match(r"([0-9.]+)\s*GB/s", m.group(2).strip())
            gpus[-1]["links"][int(m.group(1))] = float(speed.group(1)) if speed else None
        elif gpus and "inactive" in line.lower():
            gpus[-1]["note"] = line.strip()
    return gpus


def parse_fabric(lines: Iterable[str]) -> list[dict[str, str]]:
    """Each GPU's ``Fabric`` section of ``nvidia-smi -q`` (its State and Status), as the
    nvidia component's driver verify reads it."""
    gpus: list[dict[str, str]] = []
    in_fabric = False
    for line in lines:
        words = line.split()
        if line.startswith("GPU ") and len(words) == 2:
            gpus.append({"bus": words[1], "state": "", "status": ""})
            in_fabric = False
        elif words == ["Fabric"]:
            in_fabric = True
        elif in_fabric and gpus and words and words[0] in ("State", "Status") \
                and ":" in line:
            gpus[-1][words[0].lower()] = line.split(":", 1)[1].strip()
            if words[0] == "Status":
                in_fabric = False
    return gpus


def judge_nvlink(node: str, links_wanted: int, section: dict[str, Any] | None) -> Result:
    gpus = parse_nvlink_status((section or {}).get("lines", []))
    if not gpus:
        text = " ".join((section or {}).get("lines", [])).strip()
        return Result("gpu.nvlink", Status.ERROR, node=node,
                      message=f"{node}: nvidia-smi nvlink -s gave nothing readable: "
                              f"{text[:200] or 'no output'}")
    bad = []
    for g in gpus:
        up = [n for n, speed in g["links"].items() if speed]
        down = sorted(n for n, speed in g["links"].items() if not speed)
        want = links_wanted or len(g["links"]) or 1
        if len(up) < want:
            why = f"links {', '.join(map(str, down))} inactive" if down else \
                (g["note"] or "no link listed")
            bad.append(f"GPU {g['index']}: {len(up)} of {want} up ({why})")
    fewest = min(sum(1 for s in g["links"].values() if s) for g in gpus)
    details = {"links_up": {str(g["index"]): sum(1 for s in g["links"].values() if s)
                            for g in gpus}}
    if bad:
        return Result("gpu.nvlink", Status.FAIL, node=node, value=fewest,
                      threshold=links_wanted or None, unit="links", action=Action.REBOOT,
                      details=details,
                      message=f"{node}: NVLinks down: {'; '.join(bad[:4])}: drain and reboot "
                              "the node; links that stay down need the baseboard serviced")
    return Result("gpu.nvlink", Status.PASS, node=node, value=fewest,
                  threshold=links_wanted or None, unit="links", details=details,
                  message=f"every GPU's NVLinks up ({len(gpus)} GPUs)")


def judge_fabric_manager(node: str, count: int, fm_state: str,
                         section: dict[str, Any] | None) -> Result:
    gpus = parse_fabric((section or {}).get("lines", []))
    with_state = [g for g in gpus if g["state"]]
    done = [g for g in with_state if g["state"] == "Completed"
            and g["status"] in ("Success", "")]
    problems = []
    if fm_state != "active":
        problems.append(f"nvidia-fabricmanager is {fm_state or 'not installed'}")
    for g in with_state:
        if g not in done:
            problems.append(f"{g['bus']}: fabric state {g['state']}, status {g['status']}")
    details = {"fabric_manager": fm_state,
               "gpus": {g["bus"]: f"{g['state']}/{g['status']}" for g in gpus}}
    if problems:
        return Result("gpu.fabric_manager", Status.FAIL, node=node, value=len(done),
                      threshold=count, unit="GPUs", action=Action.RESTART_SERVICE,
                      details=details,
                      message=f"{node}: {'; '.join(problems[:4])}: restart "
                              "nvidia-fabricmanager (journalctl -u nvidia-fabricmanager); "
                              "CUDA cannot use the GPUs until their fabric is Completed")
    if not with_state:
        return Result("gpu.fabric_manager", Status.PASS, node=node, threshold=count,
                      unit="GPUs", details=details,
                      message="nvidia-fabricmanager active (this driver shows no per-GPU "
                              "fabric state)")
    return Result("gpu.fabric_manager", Status.PASS, node=node, value=len(done),
                  threshold=count, unit="GPUs", details=details,
                  message="Fabric Manager active, every GPU's fabric Completed")


def judge_fabric(node: str, count: int, links_wanted: int, done: Completed) -> list[Result]:
    if _not_found(done):
        return _missing_tool(node, FABRIC_CHECKS, "nvidia-smi",
                             "the nvidia component installs the driver with it: deploy "
                             "again")
    parts = sections(done.stdout)
    fm = parts.get("fabricmanager", {}).get("arg", "")
    return [judge_nvlink(node, links_wanted, parts.get("nvlink")),
            judge_fabric_manager(node, count, fm, parts.get("query"))]


# ---------------------------------------------------------------------------
# DCGM diagnostics
# ---------------------------------------------------------------------------


def exclusive(wait: float) -> str:
    """Shell that holds :data:`GPU_LOCK` for the rest of the command (waiting at most
    ``wait`` seconds for another GPU test of this tool to end), where flock(1) exists and
    the lock's directory is writable."""
    lock = shlex.quote(GPU_LOCK)
    return ("if command -v flock >/dev/null 2>&1 && "
            f"[ -w \"$(dirname {lock})\" ]; then\n"
            f"  exec 9>>{lock}\n"
            f"  flock -w {max(1, int(wait))} 9 || {{ echo \"another GPU test of aicluster "
            f"check held the GPUs for {int(wait)} s\" >&2; exit {BUSY_RC}; }}\n"
            "fi\n")


def _busy(check: str, where: dict[str, Any], done: Completed) -> Result | None:
    if done.rc == BUSY_RC and "held the GPUs" in done.stderr:
        label = where.get("node") or "<->".join(where["pair"])
        return Result(check, Status.ERROR, **where,
                      message=f"{label}: not run: {done.stderr.strip().splitlines()[-1]}")
    return None


def dcgm_command(level: int, wait: float = 0) -> str:
    return (exclusive(wait)
            + "command -v dcgmi >/dev/null 2>&1 || { echo 'dcgmi: not found' >&2; exit 127; }\n"
            f"dcgmi diag -r {int(level)} -j\n")


def parse_dcgm(text: str) -> dict[str, Any]:
    """``dcgmi diag -j`` (DCGM 4's "DCGM Diagnostic" document, DCGM 3's "DCGM GPU
    Diagnostic" too): ``{"tests": [{"category", "name", "status", "gpus", "warnings"}],
    "runtime_error": str, "version": str}``."""
    doc = json.loads(text[text.index("{"):])
    body = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic")
    if not isinstance(body, dict):
        raise ValueError("no 'DCGM Diagnostic' object in dcgmi's JSON")
    tests = []
    for category in body.get("test_categories") or []:
        for test in category.get("tests") or []:
            results = test.get("results") or []
            statuses = {}
            warnings = []
            for r in results:
                status = str(r.get("status", "")).capitalize()
                gpu = r.get("entity_id", r.get("gpu_id", r.get("gpu_ids", "")))
                statuses.setdefault(status, []).append(str(gpu))
                for w in r.get("warnings") or []:
                    text_ = w.get("warning") if isinstance(w, dict) else str(w)
                    if text_ and text_ not in warnings:
                        warnings.append(str(text_).strip())
            summary = str((test.get("test_summary") or {}).get("status", "")).capitalize()
            worst = next((s for s in ("Fail", "Warn", "Pass", "Skip") if s in statuses),
                         summary or "Skip")
            if summary == "Fail":
                worst = "Fail"
            tests.append({"category": category.get("category", ""),
                          "name": test.get("name", ""), "status": worst,
                          "gpus": statuses.get(worst, []), "warnings": warnings})
    return {"tests": tests, "runtime_error": body.get("runtime_error") or "",
            "version": (doc.get("metadata") or {}).get("version", "")}


def judge_dcgm(node: str, level: int, done: Completed) -> Result:
    busy = _busy("gpu.dcgm_diag", {"node": node}, done)
    if busy:
        return busy
    if _not_found(done):
        return Result("gpu.dcgm_diag", Status.ERROR, node=node, action=Action.REDEPLOY,
                      message=f"{node}: dcgmi is not installed (nvidia_dcgm installs "
                              "datacenter-gpu-manager-4): deploy again")
    text = done.stdout + done.stderr
    if "{" not in done.stdout:
        if re.search(r"unable to establish a connection|host engine", text, re.I):
            return Result("gpu.dcgm_diag", Status.FAIL, node=node,
                          action=Action.RESTART_SERVICE,
                          message=f"{node}: dcgmi cannot reach DCGM's host engine: restart "
                                  "nvidia-dcgm")
        return Result("gpu.dcgm_diag", Status.ERROR, node=node,
                      message=f"{node}: dcgmi diag -r {level} printed no JSON (exit "
                              f"{done.rc}): {text.strip()[-200:]}")
    diag = parse_dcgm(done.stdout)
    tests = diag["tests"]
    details = {"level": level, "dcgm": diag["version"],
               "tests": {t["name"]: t["status"] for t in tests}}
    if diag["runtime_error"]:
        return Result("gpu.dcgm_diag", Status.ERROR, node=node, details=details,
                      message=f"{node}: dcgmi diag -r {level} could not run: "
                              f"{diag['runtime_error'][:300]}")
    failed = [t for t in tests if t["status"] == "Fail"]
    warned = [t for t in tests if t["status"] == "Warn"]
    ran = [t for t in tests if t["status"] != "Skip"]

    def said(t: dict) -> str:
        first = f" ({t['warnings'][0].rstrip('.')})" if t["warnings"] else ""
        return f"{t['name']} on GPU {', '.join(t['gpus']) or '?'}{first}"

    if failed:
        hardware = any(t["category"].lower() != "deployment" for t in failed)
        return Result("gpu.dcgm_diag", Status.FAIL, node=node, value=len(failed),
                      threshold=0, unit="tests",
                      action=Action.ISOLATE if hardware else Action.INVESTIGATE,
                      details=details,
                      message=f"{node}: DCGM diagnostic level {level} failed: "
                              + "; ".join(said(t)[:240] for t in failed[:4])
                              + ("; take the node out of service and have the GPU "
                                 "checked (NVIDIA's field diagnostic)" if hardware else ""))
    if not ran:
        return Result("gpu.dcgm_diag", Status.ERROR, node=node, details=details,
                      message=f"{node}: dcgmi diag -r {level} ran no test")
    if warned:
        return Result("gpu.dcgm_diag", Status.WARN, node=node, value=0, threshold=0,
                      unit="tests", action=Action.MONITOR, details=details,
                      message=f"{node}: DCGM diagnostic level {level} warns: "
                              + "; ".join(said(t)[:240] for t in warned[:4]))
    return Result("gpu.dcgm_diag", Status.PASS, node=node, value=0, threshold=0,
                  unit="tests", details=details,
                  message=f"DCGM diagnostic level {level}: {len(ran)} test(s) passed")


# ---------------------------------------------------------------------------
# NCCL all_reduce_perf
# ---------------------------------------------------------------------------


def nccl_binary(directory: str) -> str:
    """Shell that sets ``$b`` to all_reduce_perf (in ``directory``, else on PATH), or
    exits 127 saying where it looked."""
    path = shlex.quote(f"{directory.rstrip('/')}/all_reduce_perf")
    return (f"b={path}\n"
            '[ -x "$b" ] || b=$(command -v all_reduce_perf 2>/dev/null) || b=\n'
            f'[ -n "$b" ] || {{ echo "all_reduce_perf: not found in '
            f'{shlex.quote(directory)} or on PATH" >&2; exit 127; }}\n')


def nccl_command(directory: str, iterations: int, max_bytes: str, gpus: int,
                 wait: float = 0) -> str:
    run = f'"$b" -b 8 -e {shlex.quote(max_bytes)} -f 2 -g {int(gpus)}'
    return (exclusive(wait) + nccl_binary(directory)
            + f'i=0; while [ "$i" -lt {int(iterations)} ]; do {run} || exit $?; '
              'i=$((i + 1)); done\n')


_HEADER = re.compile(r"nThread\s+\d+\s+nGpus\s+\d+")
_RANK = re.compile(r"^#?\s*Rank\s+\d+\s")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(\w+)")


def parse_nccl(text: str) -> list[dict[str, Any]]:
    """Each all_reduce_perf run in ``text`` (a run starts at its ``nThread .. nGpus``
    header): its ranks, its rows (size, out-of-place and in-place busbw and #wrong), the
    average bus bandwidth and the out-of-bounds count it printed."""
    runs: list[dict[str, Any]] = []
    for line in text.splitlines():
        if _HEADER.search(line):
            runs.append({"ranks": 0, "rows": [], "avg": None, "oob": None})
            continue
        if not runs:
            continue
        run = runs[-1]
        if _RANK.match(line):
            run["ranks"] += 1
            continue
        m = _AVG.search(line)
        if m:
            run["avg"] = float(m.group(1))
            continue
        m = _OOB.search(line)
        if m:
            run["oob"] = int(m.group(1))
            continue
        words = line.split()
        if len(words) >= 12 and words[0].isdigit() and words[1].isdigit():
            oop, inplace = words[-8:-4], words[-4:]
            run["rows"].append({"size": int(words[0]),
                                "busbw": _float(oop[2]), "wrong": _wrong(oop[3]),
                                "busbw_in_place": _float(inplace[2]),
                                "wrong_in_place": _wrong(inplace[3])})
    return runs


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _wrong(text: str) -> float:
    """A ``#wrong`` field (older nccl-tests print the error's size, e.g. ``0e+00``);
    N/A (no check) counts as none."""
    value = _float(text)
    return value if value is not None else 0.0


def nccl_floor(profile: dict[str, Any], gpus: int) -> float:
    """The in-node busbw floor for ``gpus`` GPUs from the profile's floor at its
    ``nccl_gpus``. busbw is all-reduce's algbw x 2(n-1)/n, meant to hold across GPU counts;
    the floor assumes only algbw holds (the lower, safe side), so it is scaled by
    ((n-1)/n) / ((N-1)/N): 8 -> 4 GPUs keeps 86 % of it, 8 -> 2 keeps 57 %."""
    floor, at = float(profile.get("nccl_busbw_gbps") or 0), int(profile.get("nccl_gpus") or 0)
    if not floor or not at or gpus < 2:
        return 0.0
    if gpus == at or at < 2:
        return floor
    return round(floor * ((gpus - 1) / gpus) / ((at - 1) / at), 1)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def judge_nccl(check: str, where: dict[str, Any], floor: float, ranks: int,
               iterations: int, tool_hint: str, done: Completed) -> Result:
    """all_reduce_perf's runs: every ``#wrong`` 0, the median out-of-place busbw at the
    largest size not below ``floor`` (GB/s; 0: no floor)."""
    label = where.get("node") or "<->".join(where["pair"])
    busy = _busy(check, where, done)
    if busy:
        return busy
    if _not_found(done) and "all_reduce_perf" in done.stderr:
        return Result(check, Status.ERROR, action=Action.INVESTIGATE, **where,
                      message=f"{label}: {done.stderr.strip().splitlines()[-1]}: "
                              f"{tool_hint}")
    if _not_found(done):
        return Result(check, Status.ERROR, **where,
                      message=f"{label}: {done.stderr.strip()[-200:]}")
    runs = [r for r in parse_nccl(done.stdout) if r["rows"]]
    tail = (done.stderr.strip() or done.stdout.strip())[-300:]
    refused = [line for line in done.stderr.splitlines() if line.startswith("srun: error:")]
    if not runs and refused:
        return Result(check, Status.ERROR, action=Action.INVESTIGATE, **where,
                      message=f"{label}: Slurm did not run the test ({refused[0][13:].strip()}"
                              "): are the nodes busy, drained or down (sinfo -N)?")
    if not runs:
        return Result(check, Status.FAIL, action=Action.INVESTIGATE, **where,
                      message=f"{label}: all_reduce_perf gave no result (exit {done.rc}): "
                              f"{tail}")
    few = [r["ranks"] for r in runs if r["ranks"] and r["ranks"] != ranks]
    if few:
        return Result(check, Status.ERROR, action=Action.INVESTIGATE, **where,
                      message=f"{label}: all_reduce_perf ran {few[0]} rank(s), not {ranks}"
                              + (": each process ran alone; build nccl-tests with MPI=1 "
                                 "and check srun's --mpi (gpu.nccl_pair_mpi)"
                                 if "pair" in where else ""))
    largest = [max(r["rows"], key=lambda row: row["size"]) for r in runs]
    sizes = {row["size"] for row in largest}
    busbw = [row["busbw"] or 0.0 for row in largest]
    median = round(statistics.median(busbw), 2)
    wrong = [row for r in runs for row in r["rows"] if row["wrong"] or row["wrong_in_place"]]
    oob = sum(r["oob"] or 0 for r in runs)
    details = {"runs": len(runs), "busbw_at_largest": busbw, "size": max(sizes),
               "avg_busbw": [r["avg"] for r in runs]}
    if wrong or oob:
        first = _size(wrong[0]["size"]) if wrong else "?"
        return Result(check, Status.FAIL, value=median, threshold=floor or None,
                      unit="GB/s", action=Action.ISOLATE if "node" in where
                      else Action.INVESTIGATE, details=details, **where,
                      message=f"{label}: all_reduce_perf computed wrong results "
                              f"({len(wrong)} size(s) with #wrong > 0, first at {first}; "
                              f"{oob} out of bounds): the GPUs corrupt data; take the "
                              f"node{'s' if 'pair' in where else ''} out of service")
    if done.rc != 0 or len(runs) < iterations:
        return Result(check, Status.FAIL, value=median, threshold=floor or None,
                      unit="GB/s", action=Action.INVESTIGATE, details=details, **where,
                      message=f"{label}: all_reduce_perf stopped after {len(runs)} of "
                              f"{iterations} run(s) (exit {done.rc}): {tail}")
    if floor and median < floor:
        what = ("check gpu.nvlink and gpu.fabric_manager, and that the GPUs were idle"
                if "node" in where else
                "check the network NCCL uses (NCCL_DEBUG=INFO) and its links")
        return Result(check, Status.FAIL, value=median, threshold=floor, unit="GB/s",
                      action=Action.INVESTIGATE, details=details, **where,
                      message=f"{label}: all_reduce bus bandwidth {median} GB/s at "
                              f"{_size(max(sizes))} (median of {len(runs)}), below {floor} "
                              f"GB/s: "
                              f"{what}")
    note = "" if floor else " (no floor for this GPU model: set check_thresholds.gpu.profiles)"
    return Result(check, Status.PASS, value=median, threshold=floor or None, unit="GB/s",
                  details=details, **where,
                  message=f"median of {len(runs)} runs at {_size(max(sizes))}, no wrong "
                          f"result{note}")


# ---------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------


def gpu_nodes(ctx: Context) -> list[str]:
    """The nodes to check that ``gpu_nodes`` gives GPUs (stand-ins included)."""
    return [n for n in ctx.in_groups("gpu_nodes") if ctx.host(n).spec.hardware.gpus.count]


def nvidia_nodes(ctx: Context) -> list[str]:
    return [n for n in gpu_nodes(ctx)
            if ctx.host(n).spec.hardware.gpus.vendor == "nvidia"]


def _skip(check: str, node: str, reason: str) -> Probe:
    def read(done: Completed) -> Result:
        return Result(check, Status.SKIP, node=node, message=reason)

    return Probe(check, LAYER, "true", read, timeout=15, node=node)


def _expected(ctx: Context, node: str) -> dict[str, Any]:
    gpus = ctx.host(node).spec.hardware.gpus
    _, profile = ctx.gpu_profile(node)
    return {
        "count": gpus.count,
        "model": gpus.model,
        "memory_gb": gpus.memory_gb,
        "memory_tolerance": float(ctx.threshold(node, "gpu.memory_tolerance_percent")),
        "driver": str(ctx.setting(node, "nvidia", "nvidia_driver_version")
                      or ctx.setting(node, "nvidia", "nvidia_driver_branch") or ""),
        "persistence": bool(ctx.setting(node, "nvidia", "nvidia_persistenced")),
        "pcie_width": int(profile.get("pcie_width") or 0),
        "temperature_warn": float(ctx.threshold(node, "gpu.temperature_warn_c")),
        "temperature_fail": float(ctx.threshold(node, "gpu.temperature_fail_c")),
    }


def _nccl_hint(directory: str) -> str:
    return (f"install nccl-tests (github.com/NVIDIA/nccl-tests, `make MPI=1 "
            f"CUDA_HOME=/usr/local/cuda`) so that {directory}/all_reduce_perf exists on "
            "every GPU node, or point check_thresholds.gpu.nccl_tests_dir at it")


def probes(ctx: Context) -> list[Probe]:
    out: list[Probe] = []
    for node in gpu_nodes(ctx):
        gpus = ctx.host(node).spec.hardware.gpus
        if gpus.vendor == "standin":
            out.append(_skip("gpu.count", node,
                             f"stand-in GPU ({gpus.count} x {gpus.model!r}, vendor "
                             "'standin'): no NVIDIA GPU on this node; the GPU checks do "
                             "not apply"))
            continue
        out.append(Probe("gpu.state", LAYER, state_command(),
                         partial(judge_state, node, _expected(ctx, node)),
                         timeout=STATE_TIMEOUT, node=node))
        out.append(Probe("gpu.xid", LAYER, xid_command(), partial(judge_xid, node),
                         timeout=XID_TIMEOUT, node=node))
        _, profile = ctx.gpu_profile(node)
        if gpus.nvswitch:
            out.append(Probe("gpu.fabric", LAYER, fabric_command(),
                             partial(judge_fabric, node, gpus.count,
                                     int(profile.get("nvlinks") or 0)),
                             timeout=FABRIC_TIMEOUT, node=node))
        if not ctx.standard:
            continue
        level = int(ctx.threshold(node, "gpu.dcgm_diag_level_burn_in" if ctx.burn_in
                                  else "gpu.dcgm_diag_level_standard"))
        dcgm_s = DCGM_TIMEOUT.get(level, DCGM_TIMEOUT[4])
        nccl_s = NCCL_TIMEOUT["burn-in" if ctx.burn_in else "standard"]
        dcgm = bool(ctx.setting(node, "nvidia", "nvidia_dcgm"))
        nccl = gpus.count >= 2
        if dcgm:
            # waits for this node's all_reduce_perf, if that got the GPUs first
            wait = nccl_s if nccl else 0
            out.append(Probe("gpu.dcgm_diag", LAYER, dcgm_command(level, wait),
                             partial(judge_dcgm, node, level), timeout=dcgm_s + wait,
                             node=node))
        else:
            out.append(_skip("gpu.dcgm_diag", node,
                             "nvidia_dcgm is false in the inventory: DCGM is not installed"))
        if not nccl:
            out.append(_skip("gpu.nccl", node,
                             "one GPU: nothing to all-reduce inside the node"))
            continue
        directory = str(ctx.threshold(node, "gpu.nccl_tests_dir"))
        iterations = int(ctx.threshold(node, "gpu.nccl_iterations"))
        wait = dcgm_s if dcgm else 0  # for this node's DCGM diagnostic, if it went first
        out.append(Probe(
            "gpu.nccl", LAYER,
            nccl_command(directory, iterations, _max_bytes(ctx, node), gpus.count, wait),
            partial(judge_nccl, "gpu.nccl", {"node": node}, nccl_floor(profile, gpus.count),
                    gpus.count, iterations, _nccl_hint(directory)),
            timeout=nccl_s + wait, node=node))
    return out


def _max_bytes(ctx: Context, node: str) -> str:
    key = "gpu.nccl_max_bytes_burn_in" if ctx.burn_in else "gpu.nccl_max_bytes"
    text = str(ctx.threshold(node, key))
    size_bytes(text)  # a size all_reduce_perf takes, or ValueError naming it
    return text


def link_gbps(ctx: Context, node: str) -> tuple[float, str]:
    """The link NCCL uses between nodes with one GPU each: an InfiniBand port where the
    node declares some (NCCL prefers InfiniBand, one port per GPU), else its fabric NIC."""
    hw = ctx.host(node).spec.hardware
    ib = [p.rate_gbps for p in hw.ib_ports]
    if ib:
        return float(max(ib)), "InfiniBand port"
    fabric = [n.speed_gbps for n in hw.nics if n.network == "fabric"]
    if fabric:
        return float(max(fabric)), "fabric NIC"
    return 0.0, ""


def pair_floor(ctx: Context, a: str, b: str) -> tuple[float, str]:
    """``gpu.nccl_pair_min_fraction`` of the slower of the two nodes' links, in GB/s."""
    (rate_a, kind_a), (rate_b, kind_b) = link_gbps(ctx, a), link_gbps(ctx, b)
    rate = min(rate_a, rate_b)
    if not rate:
        return 0.0, "no fabric link declared"
    fraction = float(ctx.threshold(a, "gpu.nccl_pair_min_fraction"))
    kind = kind_a if rate == rate_a else kind_b
    return round(fraction * rate / 8, 2), f"{fraction:g} x {rate:g} Gb/s ({kind})"


def pair_command(ctx: Context, a: str, b: str, timeout: float) -> str:
    directory = str(ctx.threshold(a, "gpu.nccl_tests_dir"))
    iterations = int(ctx.threshold(a, "gpu.nccl_iterations"))
    partition = (ctx.setting(a, "slurm", "slurm_gpu_partition_name")
                 or ctx.setting(a, "slurm", "slurm_partition_name"))
    wait = int(ctx.threshold(a, "stacks.slurm_job_timeout_s"))
    srun = ["srun", *(["-p", str(partition)] if partition else []), "-w", f"{a},{b}",
            "-N", "2", "--ntasks-per-node=1", "--gpus-per-node=1",
            f"--mpi={ctx.threshold(a, 'gpu.nccl_pair_mpi')}", f"--immediate={wait}",
            f"--time={max(1, math.ceil(timeout / iterations / 60))}"]
    run = (" ".join(shlex.quote(w) for w in srun)
           + f' "$b" -b 8 -e {shlex.quote(_max_bytes(ctx, a))} -f 2 -g 1')
    return (nccl_binary(directory)
            + f'i=0; while [ "$i" -lt {iterations} ]; do {run} || exit $?; '
              'i=$((i + 1)); done\n')


def pair_checks(ctx: Context) -> list[PairCheck]:
    if not ctx.standard or not ctx.cluster.group("slurm_controller"):
        return []
    workers = set(ctx.cluster.group("slurm_workers"))
    nodes = [n for n in nvidia_nodes(ctx) if n in workers]
    timeout = NCCL_TIMEOUT["burn-in" if ctx.burn_in else "standard"]

    def make(a: str, b: str) -> Probe:
        floor, why = pair_floor(ctx, a, b)
        directory = str(ctx.threshold(a, "gpu.nccl_tests_dir"))
        read: Callable[[Completed], Result] = partial(
            judge_nccl, "gpu.nccl_pair", {"pair": (a, b)}, floor, 2,
            int(ctx.threshold(a, "gpu.nccl_iterations")), _nccl_hint(directory))

        def read_with_floor(done: Completed) -> Result:
            result = read(done)
            result.details["floor"] = why
            return result

        return Probe("gpu.nccl_pair", LAYER, pair_command(ctx, a, b, timeout),
                     read_with_floor, timeout=timeout, pair=(a, b))

    return [PairCheck("gpu.nccl_pair", LAYER, nodes, make)]
