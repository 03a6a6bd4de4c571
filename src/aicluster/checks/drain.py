"""``aicluster check --drain``: take the Slurm nodes that failed out of scheduling, and
put back only the ones this tool took out (as LBNL NHC does).

A failed node is drained with the reason ``aicluster: <check>[, <check> ...]``. On a
later run, a node drained with a reason of that prefix that passes every check is
resumed; a node drained by anyone else (another reason) is never touched, neither
drained again with our reason nor resumed. Only nodes in ``slurm_workers`` that this
run checked are considered; ``scontrol`` runs on the first Slurm controller. The
monitoring layer's results never drain a node: a node that is not watched still runs
jobs.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from aicluster.checks.context import Context
from aicluster.checks.result import Result, Status
from aicluster.checks.runner import Transport
from aicluster.checks.stacks import SINFO_COMMAND, SLURM_DRAINED, parse_sinfo, slurm_state

PREFIX = "aicluster: "
#: Layers whose failures say nothing of whether a node can run jobs.
NEVER_DRAIN = frozenset({"monitoring"})


def parse_states(text: str) -> dict[str, tuple[str, str]]:
    """:data:`~aicluster.checks.stacks.SINFO_COMMAND`'s output -> node -> (state, its
    flags stripped; reason), read as the stacks layer reads it."""
    return {node: (slurm_state(entry["state"])[0], entry["reason"])
            for node, entry in parse_sinfo(text).items()}


def drained(state: str) -> bool:
    """Drained or draining, alone or with another state (``down+drain``)."""
    return any(word in SLURM_DRAINED for word in state.split("+"))


def failures(results: Iterable[Result]) -> dict[str, list[str]]:
    """Node -> the checks it failed (FAIL or TIMEOUT): its own, and pair tests it is
    blamed for after a re-test against a node that passed."""
    out: dict[str, list[str]] = {}
    for r in results:
        if r.status not in (Status.FAIL, Status.TIMEOUT) or r.layer in NEVER_DRAIN:
            continue
        node = r.node if r.pair is None else r.details.get("blamed")
        if node and r.check not in out.setdefault(node, []):
            out[node].append(r.check)
    return out


def decide(states: dict[str, tuple[str, str]], failed: dict[str, list[str]],
           checked: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """(node -> the reason to drain it with, nodes to resume)."""
    to_drain: dict[str, str] = {}
    to_resume: list[str] = []
    for node in checked:
        if node not in states:
            continue
        state, reason = states[node]
        ours = reason.startswith(PREFIX)
        if node in failed:
            if not drained(state) or ours:
                wanted = PREFIX + ", ".join(sorted(failed[node]))
                if not (drained(state) and reason == wanted):
                    to_drain[node] = wanted
        elif drained(state) and ours:
            to_resume.append(node)
    return to_drain, to_resume


def apply(ctx: Context, results: list[Result], transport: Transport) -> list[str]:
    """Drain and resume on the cluster; the lines saying what was done."""
    controllers = ctx.cluster.group("slurm_controller")
    workers = [n for n in ctx.nodes() if n in ctx.cluster.group("slurm_workers")]
    if not controllers or not workers:
        return ["--drain: no Slurm workers among the nodes checked: nothing to drain"]
    controller = controllers[0]
    unreachable = {r.node for r in results if r.check == "nodes.ssh"
                   and r.status is not Status.PASS}
    if controller in unreachable:
        return [f"--drain: the Slurm controller {controller} is not reachable: "
                "nothing drained or resumed"]
    done = transport(controller, SINFO_COMMAND, 30)
    if done.rc != 0:
        return [f"--drain: sinfo failed on {controller}: {done.stderr.strip()[-200:]}"]
    to_drain, to_resume = decide(parse_states(done.stdout), failures(results), workers)
    lines = []
    for node, reason in to_drain.items():
        command = (f"scontrol update NodeName={shlex.quote(node)} State=DRAIN "
                   f"Reason={shlex.quote(reason)}")
        ran = transport(controller, command, 30)
        lines.append(f"drained {node} ({reason})" if ran.rc == 0 else
                     f"could not drain {node}: {ran.stderr.strip()[-200:]}")
    for node in to_resume:
        ran = transport(controller, f"scontrol update NodeName={shlex.quote(node)} "
                                    "State=RESUME", 30)
        lines.append(f"resumed {node} (it passes now; drained by aicluster check)"
                     if ran.rc == 0 else f"could not resume {node}: "
                                         f"{ran.stderr.strip()[-200:]}")
    return lines or ["--drain: nothing to drain or resume"]
