"""What one check found: :class:`Result`, and the run's exit code from all of them.

Every check ends in one :class:`Status`, never a hang: PASS, WARN (works, but below
what the profile expects or degraded), FAIL, TIMEOUT (the probe ran past its hard
limit and was killed: on a node, a hung mount or a stuck driver looks exactly like
that), SKIP (not applicable here; the reason says why) or ERROR (the check could not
run: a probe that printed nothing readable, a tool missing where the inventory says it
should be). A result names where it ran (``node``, or ``pair`` for a test between two
nodes), the measured ``value`` beside its ``threshold`` and ``unit`` where the check
measures something, how long it took, and the ``action`` an operator should take.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


class Status(str, enum.Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    TIMEOUT = "TIMEOUT"
    SKIP = "SKIP"
    ERROR = "ERROR"


#: Worst first: the order of the summary table.
SEVERITY = {Status.FAIL: 0, Status.TIMEOUT: 1, Status.ERROR: 2, Status.WARN: 3,
            Status.SKIP: 4, Status.PASS: 5}


class Action(str, enum.Enum):
    """What to do about a result that is not a PASS (AWS's GPU health checks map every
    failure to one of these; ``none`` for a pass or a skip)."""

    NONE = "none"
    MONITOR = "monitor"
    INVESTIGATE = "investigate"
    REDEPLOY = "redeploy"
    RESTART_SERVICE = "restart-service"
    REBOOT = "reboot"
    RESET_GPU = "reset-gpu"
    ISOLATE = "isolate"


@dataclass
class Result:
    check: str
    status: Status
    node: str | None = None
    #: For a test between two nodes: the two names, in the order the test ran them.
    pair: tuple[str, str] | None = None
    layer: str = ""
    value: float | str | None = None
    threshold: float | str | None = None
    unit: str = ""
    message: str = ""
    action: Action = Action.NONE
    duration: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        self.action = Action(self.action)
        if self.pair is not None:
            self.pair = (str(self.pair[0]), str(self.pair[1]))
        if (self.node is None) == (self.pair is None):
            raise ValueError(f"{self.check}: a result names one node or one pair")

    @property
    def where(self) -> str:
        """The node, or ``a<->b`` for a pair."""
        return self.node if self.pair is None else f"{self.pair[0]}<->{self.pair[1]}"

    def as_json(self) -> dict[str, Any]:
        """One object of ``--json`` (result.schema.json)."""
        out = asdict(self)
        out["status"] = self.status.value
        out["action"] = self.action.value
        out["pair"] = list(self.pair) if self.pair else None
        out["duration"] = round(self.duration, 3)
        return out


def worst_first(results: Iterable[Result]) -> list[Result]:
    return sorted(results, key=lambda r: (SEVERITY[r.status], r.layer, r.check, r.where))


def worst(problems: Iterable[tuple[Status, Action, str]]) -> tuple[Status, Action]:
    """The status and action of the worst of a check's problems (status, action, what);
    PASS when there is none."""
    listed = list(problems)
    if not listed:
        return Status.PASS, Action.NONE
    status, action, _ = min(listed, key=lambda p: SEVERITY[p[0]])
    return status, action


def exit_code(results: Iterable[Result]) -> int:
    """0 when nothing failed (PASS, WARN, SKIP); 1 when a check failed or timed out;
    3 when none failed but a check could not run (ERROR). (2 is bad input, before any
    check runs.)"""
    statuses = {r.status for r in results}
    if statuses & {Status.FAIL, Status.TIMEOUT}:
        return 1
    if Status.ERROR in statuses:
        return 3
    return 0
