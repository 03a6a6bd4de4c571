"""``--baseline FILE``: the fleet's own figures. The first run records every measured
value (bandwidths, latencies) per check and node or pair; later runs compare each
value with the fleet median recorded for that check, and a node more than the
tolerance (5 % by default) worse than that median is a WARN (``baseline.<check>``):
a node that still passes its floor but lags its identical peers is the first sign of
a bad cable, a downtrained link or a failing drive."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from aicluster.checks.result import Action, Result, Status

#: Units where more is better, and where less is.
HIGHER = {"Gb/s", "GB/s", "MB/s", "Mb/s", "IOPS"}
LOWER = {"ms", "us", "s"}


def _key(r: Result) -> str:
    """Where a figure was measured: the node or pair, and the NIC, port or network
    where the check has one result for each."""
    subject = r.details.get("subject")
    return f"{r.where} {subject}" if subject else r.where


def figures(results: list[Result]) -> dict[str, dict[str, float]]:
    """check -> where -> value, for the measured values a baseline keeps."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        if r.unit in HIGHER | LOWER and isinstance(r.value, int | float) \
                and not isinstance(r.value, bool) and r.status is not Status.SKIP:
            out.setdefault(r.check, {})[_key(r)] = float(r.value)
    return out


def record(path: Path, results: list[Result]) -> int:
    data = {"figures": figures(results),
            "units": {r.check: r.unit for r in results if r.unit in HIGHER | LOWER}}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return sum(len(v) for v in data["figures"].values())


def compare(path: Path, results: list[Result], tolerance: float = 0.05) -> list[Result]:
    """A WARN for every value more than ``tolerance`` worse than the recorded fleet
    median of its check; nothing for a check the baseline does not have."""
    data = json.loads(path.read_text())
    recorded = data.get("figures", {})
    out = []
    for r in results:
        fleet = recorded.get(r.check)
        if not fleet or r.unit not in HIGHER | LOWER or not isinstance(r.value, int | float):
            continue
        median = statistics.median(fleet.values())
        if median <= 0:
            continue
        if r.unit in HIGHER:
            worse = (median - r.value) / median
            limit = median * (1 - tolerance)
        else:
            worse = (r.value - median) / median
            limit = median * (1 + tolerance)
        if worse > tolerance:
            out.append(Result(
                f"baseline.{r.check}", Status.WARN, node=r.node, pair=r.pair, layer=r.layer,
                value=r.value, threshold=round(limit, 3), unit=r.unit, action=Action.MONITOR,
                message=f"{r.where}: {worse:.0%} worse than the fleet's recorded median "
                        f"{median:g} {r.unit} ({path.name})"))
    return out
