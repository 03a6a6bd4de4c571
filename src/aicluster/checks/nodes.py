"""Nodes: reachable over SSH, time in step, deployed as the inventory says (the
components the last deploy recorded, the pinned versions running). All quick."""

from __future__ import annotations

import re
import shlex
from functools import partial

from aicluster.checks.context import Context
from aicluster.checks.result import Action, Result, Status
from aicluster.checks.runner import Completed, Probe
from aicluster.common.absence import RECORD, parse_record
from aicluster.components.ray.derive import venv_path

LAYER = "nodes"

#: What the reachability probe prints: a word no login banner or shell profile would.
_MARK = "aicluster-check-reached"


# ---------------------------------------------------------------------------
# SSH
# ---------------------------------------------------------------------------


def judge_ssh(node: str, done: Completed) -> Result:
    if done.rc == 0 and _MARK in done.stdout:
        kernel = done.stdout.split(_MARK, 1)[1].strip().splitlines()
        return Result("nodes.ssh", Status.PASS, node=node,
                      value=kernel[0] if kernel else "", message="reached over SSH")
    reason = (done.stderr.strip().splitlines() or [f"exit {done.rc}"])[-1]
    return Result("nodes.ssh", Status.FAIL, node=node, action=Action.INVESTIGATE,
                  message=f"{node}: not reachable over SSH: {reason}")


# ---------------------------------------------------------------------------
# Time (chrony)
# ---------------------------------------------------------------------------

_OFFSET = re.compile(r"^(System time|Last offset)\s*:\s*([-+]?[0-9.]+)\s+seconds", re.M)
_LEAP = re.compile(r"^Leap status\s*:\s*(.+)$", re.M)
_REF = re.compile(r"^Reference ID\s*:\s*(\S+)\s*\(([^)]*)\)", re.M)


def parse_tracking(text: str) -> dict:
    """``chronyc -n tracking``: the offsets (seconds), the leap status, the source."""
    offsets = {m.group(1): abs(float(m.group(2))) for m in _OFFSET.finditer(text)}
    leap = _LEAP.search(text)
    ref = _REF.search(text)
    if not offsets or leap is None:
        raise ValueError("not chronyc tracking output")
    return {"offset_s": max(offsets.values()), "leap": leap.group(1).strip(),
            "source": ref.group(2) if ref else ""}


def judge_time(node: str, warn_ms: float, fail_ms: float, done: Completed) -> Result:
    if done.rc == 127 or "not found" in done.stderr:
        return Result("nodes.time", Status.ERROR, node=node,
                      message=f"{node}: chronyc is not installed (base installs chrony)",
                      action=Action.REDEPLOY)
    if done.rc != 0:
        return Result("nodes.time", Status.FAIL, node=node, action=Action.RESTART_SERVICE,
                      message=f"{node}: chronyd does not answer: "
                              f"{done.stderr.strip()[-200:] or f'exit {done.rc}'}")
    t = parse_tracking(done.stdout)
    offset_ms = round(t["offset_s"] * 1000, 3)
    where = f" (source {t['source']})" if t["source"] else ""
    if t["leap"] == "Not synchronised":
        return Result("nodes.time", Status.FAIL, node=node, value=offset_ms,
                      threshold=fail_ms, unit="ms", action=Action.INVESTIGATE,
                      message=f"{node}: chrony is not synchronised{where}")
    if offset_ms > fail_ms:
        status, action = Status.FAIL, Action.INVESTIGATE
    elif offset_ms > warn_ms:
        status, action = Status.WARN, Action.MONITOR
    else:
        status, action = Status.PASS, Action.NONE
    return Result("nodes.time", status, node=node, value=offset_ms,
                  threshold=warn_ms if status is not Status.FAIL else fail_ms, unit="ms",
                  action=action, message=f"offset from its time source{where}")


# ---------------------------------------------------------------------------
# Deployed as the inventory says
# ---------------------------------------------------------------------------


def judge_deployed(node: str, wanted: dict[str, list[str]], done: Completed) -> Result:
    """The components (and roles) the last deploy recorded on the node against the
    inventory's: a node the inventory changed since, or one never deployed, fails."""
    if done.rc != 0 or not done.stdout.strip():
        return Result("nodes.deployed", Status.FAIL, node=node, action=Action.REDEPLOY,
                      message=f"{node}: no deploy record ({RECORD}): never deployed? "
                              "deploy it")
    recorded = parse_record(done.stdout)
    if not recorded:
        return Result("nodes.deployed", Status.FAIL, node=node, action=Action.REDEPLOY,
                      message=f"{node}: {RECORD} cannot be read; deploy again")
    problems = []
    for component in sorted(set(wanted) | set(recorded)):
        want, have = sorted(wanted.get(component, [])), sorted(recorded.get(component, []))
        if component not in recorded:
            problems.append(f"{component} not deployed")
        elif component not in wanted:
            problems.append(f"{component} deployed but no longer in the inventory")
        elif want != have:
            problems.append(f"{component} roles {have} deployed, {want} in the inventory")
    if problems:
        return Result("nodes.deployed", Status.FAIL, node=node, action=Action.REDEPLOY,
                      message=f"{node}: the inventory changed since the last deploy: "
                              + "; ".join(problems), details={"problems": problems})
    return Result("nodes.deployed", Status.PASS, node=node,
                  message=f"{len(wanted)} components as the inventory says")


def versions_command(pins: dict[str, str]) -> str:
    """Prints ``<what>=<version line>`` for each pinned piece of software."""
    parts = []
    for what, command in pins.items():
        parts.append(f"printf '%s=%s\\n' {shlex.quote(what)} "
                     f"\"$({command} 2>/dev/null | head -n 1)\"")
    return "; ".join(parts)


_PATTERNS = {
    "slurm": re.compile(r"slurm(?:-wlm)?\s+([0-9][0-9.]*)"),
    "ray": re.compile(r"version\s+([0-9][0-9.a-z]*)"),
    "ceph": re.compile(r"ceph version \S+ \([0-9a-f]+\) ([a-z]+)"),
}


def judge_versions(node: str, wanted: dict[str, str], done: Completed) -> list[Result]:
    """Each pinned version against the one the node runs."""
    found = {}
    for line in done.stdout.splitlines():
        key, _, text = line.partition("=")
        m = _PATTERNS.get(key, re.compile("^$")).search(text)
        found[key] = m.group(1) if m else ""
    results = []
    for what, want in wanted.items():
        have = found.get(what, "")
        check = f"nodes.version_{what}"
        if not have:
            results.append(Result(check, Status.FAIL, node=node, threshold=want,
                                  action=Action.REDEPLOY,
                                  message=f"{node}: {what} {want} is pinned but not installed "
                                          "or does not answer"))
        elif have != want and not (what == "slurm" and have.startswith(want)):
            results.append(Result(check, Status.FAIL, node=node, value=have, threshold=want,
                                  action=Action.REDEPLOY,
                                  message=f"{node}: runs {what} {have}, the inventory pins "
                                          f"{want}: deploy to bring it in line"))
        else:
            results.append(Result(check, Status.PASS, node=node, value=have, threshold=want,
                                  message=f"{what} as pinned"))
    return results


def _pins(ctx: Context, node: str) -> tuple[dict[str, str], dict[str, str]]:
    """(what -> the command printing its version, what -> the pinned version)."""
    commands, wanted = {}, {}
    components = ctx.host(node).components()
    if "slurm" in components and ctx.setting(node, "slurm", "slurm_version"):
        daemon = "slurmctld" if node in ctx.cluster.group("slurm_controller") else "slurmd"
        commands["slurm"] = f"{daemon} -V"
        wanted["slurm"] = str(ctx.setting(node, "slurm", "slurm_version"))
    if "ray" in components and ctx.setting(node, "ray", "ray_version"):
        venv = venv_path({key: ctx.setting(node, "ray", key)
                          for key in ("ray_install_dir", "ray_version")})
        commands["ray"] = f"{shlex.quote(venv)}/bin/ray --version"
        wanted["ray"] = str(ctx.setting(node, "ray", "ray_version"))
    if "ceph" in components:
        commands["ceph"] = "ceph --version"
        wanted["ceph"] = str(ctx.setting(node, "ceph", "ceph_release"))
    return commands, wanted


def reach_probes(ctx: Context) -> list[Probe]:
    """SSH to every node: run first; a node that fails it is checked no further."""
    return [Probe("nodes.ssh", LAYER, f"echo {_MARK}; uname -r", partial(judge_ssh, node),
                  timeout=20, node=node) for node in ctx.nodes()]


def probes(ctx: Context) -> list[Probe]:
    out = []
    for node in ctx.nodes():
        host = ctx.host(node)
        out.append(Probe(
            "nodes.time", LAYER, "chronyc -n tracking",
            partial(judge_time, node, ctx.threshold(node, "nodes.time_offset_warn_ms"),
                    ctx.threshold(node, "nodes.time_offset_fail_ms")),
            timeout=15, node=node))
        out.append(Probe("nodes.deployed", LAYER, f"cat {RECORD}",
                         partial(judge_deployed, node, host.roles()), timeout=15, node=node))
        commands, wanted = _pins(ctx, node)
        if commands:
            out.append(Probe("nodes.versions", LAYER, versions_command(commands),
                             partial(judge_versions, node, wanted), timeout=30, node=node))
    return out
