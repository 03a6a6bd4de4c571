"""Run probes on the nodes in parallel, bounded, each with a hard time limit.

A :class:`Probe` is one shell command for one node (or one pair, run on its first
node) and the function that reads its output into results. :func:`run_probes` runs
them through a :data:`Transport` on at most ``workers`` at once. Nothing waits
forever:

- on the node, the command runs under coreutils' ``timeout`` (TERM at the limit, KILL
  5 s later), so a probe stuck in a hung mount or a wedged driver call ends there and
  leaves nothing running;
- here, the transport's own process (the SSH client, or the local shell) is killed
  with its whole process group a few seconds after that, should the node not answer
  at all.

A probe that ran past its limit is a TIMEOUT result naming the node and the limit; one
whose output cannot be read, or whose reader raised, is an ERROR result with the
reason (never a traceback); the other probes go on either way.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from aicluster.checks.result import Action, Result, Status
from aicluster.checks.schedule import retest_pairs, rounds, suspects_after_retest

#: Seconds the node's ``timeout`` waits after TERM before it KILLs the probe.
KILL_AFTER = 5
#: Seconds this side waits beyond a probe's limit before it kills the transport.
GRACE = 10


@dataclass
class Completed:
    """A probe command that ended: its exit status and output, and how long it took."""

    rc: int
    stdout: str
    stderr: str
    duration: float


class TimedOut(Exception):
    """The command ran past its limit and was killed."""


#: Runs a shell command on a node within a limit (seconds): returns what it printed,
#: or raises :class:`TimedOut`. The transports here also take ``stdin=TEXT``, the text
#: fed to the command (what `aicluster check --publish` writes on a node).
Transport = Callable[[str, str, float], Completed]


@dataclass
class Probe:
    check: str
    layer: str
    command: str
    #: Reads the command's result into this probe's results.
    read: Callable[[Completed], Result | list[Result]]
    timeout: float = 30.0
    node: str | None = None
    pair: tuple[str, str] | None = None
    #: For a pair: a command started in the background on the pair's second node
    #: before ``command`` runs on the first (an iperf3 or ib_write_bw server), bounded by
    #: the same limit. The command on the first node waits for it (retries).
    server: str | None = None

    @property
    def runs_on(self) -> str:
        """The node the command runs on (a pair's first)."""
        return self.node if self.pair is None else self.pair[0]

    @property
    def where(self) -> dict:
        return {"node": self.node} if self.pair is None else {"pair": self.pair}


def bounded(command: str, limit: float) -> str:
    """``command`` under coreutils' ``timeout`` on the node: TERM at ``limit`` seconds,
    KILL :data:`KILL_AFTER` later; exit status 124 (or 137) when it ran out."""
    return (f"timeout -k {KILL_AFTER} {max(1, int(limit))} "
            f"sh -c {shlex.quote(command)}")


def _run(argv: Sequence[str], limit: float, stdin: str | None = None) -> Completed:
    """Run argv in a process group of its own (``stdin``: the text fed to it; none: no
    input); past ``limit`` seconds the whole group is killed and :class:`TimedOut`
    raised."""
    start = time.monotonic()
    proc = subprocess.Popen(list(argv),
                            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(input=stdin, timeout=limit)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise TimedOut(f"killed after {limit:g} s") from None
    return Completed(proc.returncode, out, err, time.monotonic() - start)


def local_transport(node: str, command: str, limit: float,
                    stdin: str | None = None) -> Completed:
    """Runs the command on this machine (the node's name unused): the transport of the
    runner's own tests and of checks of the deploying machine."""
    completed = _run(["sh", "-c", bounded(command, limit)], limit + GRACE, stdin)
    if completed.rc in (124, 137):
        raise TimedOut(f"ran past {limit:g} s")
    return completed


def ssh_transport(argv_for: Callable[[str], list[str]]) -> Transport:
    """A transport running the command on the node with the OpenSSH client
    (``argv_for(node)``: the client's command line up to the remote command)."""

    def transport(node: str, command: str, limit: float,
                  stdin: str | None = None) -> Completed:
        completed = _run([*argv_for(node), bounded(command, limit)], limit + GRACE, stdin)
        if completed.rc in (124, 137):
            raise TimedOut(f"ran past {limit:g} s")
        return completed

    return transport


def background(command: str, limit: float) -> str:
    """``command`` started detached on the node (its own session, no terminal, output
    discarded), under ``timeout`` so that it never outlives ``limit`` seconds."""
    return (f"setsid {bounded(command, limit)} </dev/null >/dev/null 2>&1 & "
            "echo started")


def run_probe(probe: Probe, transport: Transport) -> list[Result]:
    start = time.monotonic()
    try:
        if probe.server is not None and probe.pair is not None:
            transport(probe.pair[1], background(probe.server, probe.timeout), 15)
        completed = transport(probe.runs_on, probe.command, probe.timeout)
    except TimedOut as exc:
        return [Result(probe.check, Status.TIMEOUT, layer=probe.layer,
                       message=f"{probe.runs_on}: the probe {exc} and was stopped",
                       action=Action.INVESTIGATE, duration=time.monotonic() - start,
                       threshold=probe.timeout, unit="s", **probe.where)]
    except OSError as exc:
        return [Result(probe.check, Status.ERROR, layer=probe.layer,
                       message=f"{probe.runs_on}: could not run the probe: {exc}",
                       duration=time.monotonic() - start, **probe.where)]
    try:
        read = probe.read(completed)
    except Exception as exc:  # a reader's bug or an output it does not know
        return [Result(probe.check, Status.ERROR, layer=probe.layer,
                       message=f"{probe.runs_on}: could not read the probe's output "
                               f"({type(exc).__name__}: {exc}); exit {completed.rc}, "
                               f"stderr: {completed.stderr.strip()[-200:]}",
                       duration=completed.duration, **probe.where)]
    results = [read] if isinstance(read, Result) else list(read)
    for result in results:
        if not result.duration:
            result.duration = completed.duration
        if not result.layer:
            result.layer = probe.layer
    return results


def run_probes(
    probes: Iterable[Probe],
    transport: Transport,
    workers: int = 16,
    progress: Callable[[int, int, Probe], None] | None = None,
) -> list[Result]:
    """Every probe's results, in the probes' order; at most ``workers`` run at once.
    ``progress(done, total, probe)`` is called as each ends."""
    todo = list(probes)
    results: list[list[Result]] = [[] for _ in todo]
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(run_probe, p, transport): i for i, p in enumerate(todo)}
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            done += 1
            if progress:
                progress(done, len(todo), todo[i])
    return [r for rs in results for r in rs]


@dataclass
class PairCheck:
    """A test between every two of ``nodes``: ``make(a, b)`` is its probe for one pair
    (run on ``a``, its server on ``b``). Run in rounds of disjoint pairs, then each
    node of a failed pair that passed with nobody is re-tested against a node that
    passed (:mod:`aicluster.checks.schedule`)."""

    check: str
    layer: str
    nodes: list[str]
    make: Callable[[str, str], Probe]


def _passed(results: list[Result]) -> bool:
    return all(r.status in (Status.PASS, Status.WARN, Status.SKIP) for r in results)


def _disjoint_batches(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The pairs in batches where no node is in two pairs (greedy, order kept)."""
    batches: list[list[tuple[str, str]]] = []
    for pair in pairs:
        for batch in batches:
            if not {n for p in batch for n in p} & set(pair):
                batch.append(pair)
                break
        else:
            batches.append([pair])
    return batches


def run_pair_check(
    pair_check: PairCheck,
    transport: Transport,
    workers: int = 16,
    progress: Callable[[int, int, Probe], None] | None = None,
) -> list[Result]:
    """Every pair's results, round by round, then the re-tests (their results carry
    ``details["retest"]``; a suspect whose re-test failed too is named in it as
    ``details["blamed"]``)."""
    results: list[Result] = []
    passed: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []
    for batch in rounds(pair_check.nodes):
        for pair, pair_results in zip(batch, _run_batch(pair_check, batch, transport,
                                                         workers, progress), strict=True):
            (passed if _passed(pair_results) else failed).append(pair)
            results += pair_results
    retests = retest_pairs(failed, passed)
    retested: list[tuple[tuple[str, str], list[Result]]] = []
    for batch in _disjoint_batches(retests):
        retested += zip(batch, _run_batch(pair_check, batch, transport, workers, progress),
                        strict=True)
    blamed = set(suspects_after_retest((pair, _passed(rs)) for pair, rs in retested))
    for pair, pair_results in retested:
        for result in pair_results:
            result.details["retest"] = True
            if pair[0] in blamed:
                result.details["blamed"] = pair[0]
                result.message = (f"{pair[0]} failed again against {pair[1]}, a node "
                                  f"that passed: {pair[0]} is the likely cause; "
                                  + result.message)
        results += pair_results
    return results


def _run_batch(pair_check: PairCheck, batch: list[tuple[str, str]], transport: Transport,
               workers: int, progress) -> list[list[Result]]:
    probes = [pair_check.make(a, b) for a, b in batch]
    out: list[list[Result]] = [[] for _ in probes]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(probes)))) as pool:
        futures = {pool.submit(run_probe, p, transport): i for i, p in enumerate(probes)}
        for future in as_completed(futures):
            i = futures[future]
            out[i] = future.result()
            if progress:
                progress(0, 0, probes[i])
    return out
