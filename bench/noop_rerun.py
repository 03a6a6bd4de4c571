#!/usr/bin/env python3
"""Time the no-op re-run of the whole deploy on the testbed, pyinfra and Ansible side
by side, and record the figures in docs/benchmarks.md.

    .venv/bin/python bench/noop_rerun.py [--nodes 2 10] [--runs 3] [--engines pyinfra]

For each node count: a fresh testbed (`testbed up`, warm image cache), the first
deploy with pyinfra (timed), then --runs no-op re-runs of each engine, alternating.
Both engines leave the same files (tests/unit/test_template_parity.py), so Ansible's
re-run after pyinfra's deploy is a true no-op; the script checks each re-run changed
nothing. Before the re-runs it waits (at most 5 minutes) for the nodes to be at rest
(:func:`at_rest`: this machine's CPU at least 80% idle over 10 s, and no longer getting
idler), since the nodes share its cores and finish starting their services (Ray
workers joining) after the first deploy; the idle share then is recorded. Needs root;
holds the testbed lock. Tests never assert timings: speed is measured here.

The testbed's nodes share this machine's cores, and its speed drifts over the quarter
hour a 10-node round takes. ``--nodes 2 10 2`` benches 2 nodes before and after 10;
the ratio then takes the mean of the two 2-node rounds, so a drift falls on both sides.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = ROOT / "docs" / "benchmarks.md"
LOCK = "/tmp/aicluster-testbed.lock"
INVENTORY = "inventories/testbed.py"
ENGINES = {
    "pyinfra": [BIN / "pyinfra", "-y", INVENTORY, "deploy.py"],
    "ansible": [BIN / "ansible-playbook", "-i", INVENTORY, "playbooks/site.yml"],
}


#: Before the re-runs, wait for the nodes to be at rest: this machine's CPU at least
#: SETTLE_IDLE idle over a window, and no idler than over the window before it by more
#: than SETTLE_STEADY (the nodes' start-up work has stopped falling off); at most
#: SETTLE_LIMIT seconds.
SETTLE_IDLE = 0.8
SETTLE_STEADY = 0.02
SETTLE_WINDOW = 10.0
SETTLE_LIMIT = 300.0

#: CPU seconds (user + system) the last timed() command used on this machine itself,
#: its child processes included (pyinfra's SSH sessions, Ansible's forks); not the nodes'.
LAST_CPU = [0.0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def append_section(head: str, lines: list[str]) -> None:
    """Append *lines* (a dated section) under the heading *head* of docs/benchmarks.md,
    the heading added at the end the first time."""
    text = RESULTS.read_text()
    if head not in text:
        text += f"\n{head}\n"
    RESULTS.write_text(text + "\n".join(lines) + "\n")
    print(f"recorded in {RESULTS.relative_to(ROOT)}")


def timed(args: list) -> tuple[float, str]:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    start, cpu = time.monotonic(), _children_cpu()
    proc = subprocess.run([str(a) for a in args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    LAST_CPU[0] = _children_cpu() - cpu
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        log = Path(f"/tmp/aicluster-bench-{int(time.time())}.log")
        log.write_text(out)
        sys.exit(f"{' '.join(map(str, args))} failed (whole output: {log}):\n{out[-4000:]}")
    return elapsed, out


def changed(engine: str, output: str) -> int:
    """How many changes a run reported (pyinfra's Grand total, Ansible's recap)."""
    if engine == "pyinfra":
        for line in output.splitlines():
            if line.strip().startswith("Grand total"):
                cell = line.split()[3]
                return 0 if cell == "-" else int(cell)
        sys.exit("pyinfra printed no results table")
    return sum(int(n) for n in re.findall(r"\bchanged=(\d+)", output))


def _cpu_idle(seconds: float) -> float:
    """This machine's idle CPU share over *seconds* (from /proc/stat)."""
    def sample():
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total
    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(1, total1 - total0)


def at_rest(idle: list[float]) -> bool:
    """Whether the idle shares of successive windows (oldest first) say the nodes are at
    rest: the last one at least SETTLE_IDLE, and not above the one before by more than
    SETTLE_STEADY. Services still starting (Ray workers joining, dashboards loading
    their modules) make each window idler than the last; at rest, what remains is the
    services' steady background, which a cluster in use has too."""
    return (len(idle) >= 2 and idle[-1] >= SETTLE_IDLE
            and idle[-1] - idle[-2] <= SETTLE_STEADY)


def settle(limit: float = SETTLE_LIMIT) -> tuple[float, float]:
    """Wait until the nodes are at rest after the first deploy (:func:`at_rest`), at
    most *limit* seconds. Returns the seconds waited and the last window's idle share.
    The testbed's nodes share this machine's cores, so a re-run timed while ten nodes
    start their services measures that, not the deploy."""
    start = time.monotonic()
    idle: list[float] = []
    while time.monotonic() - start < limit:
        idle.append(_cpu_idle(SETTLE_WINDOW))
        if at_rest(idle):
            break
    return time.monotonic() - start, idle[-1] if idle else 0.0


def bench(nodes: int, runs: int, engines: list[str]) -> dict:
    timed([BIN / "aicluster", "testbed", "down"])
    up, _ = timed([BIN / "aicluster", "testbed", "up", "--nodes", str(nodes)])
    first, _ = timed(ENGINES["pyinfra"])
    waited, idle = settle()
    print(f"{nodes} nodes: waited {waited:.0f}s for the nodes to settle after the first "
          f"deploy ({idle:.0%} idle)", flush=True)
    reruns: dict[str, list[float]] = {e: [] for e in engines}
    cpu: dict[str, list[float]] = {e: [] for e in engines}
    for _ in range(runs):
        for engine in engines:
            seconds, out = timed(ENGINES[engine])
            if changed(engine, out):
                sys.exit(f"{engine}'s re-run on {nodes} nodes changed something:\n{out[-4000:]}")
            reruns[engine].append(seconds)
            cpu[engine].append(LAST_CPU[0])
    result = {"nodes": nodes, "up": up, "first": first, "settle": waited, "idle": idle,
              **{e: statistics.median(v) for e, v in reruns.items()},
              **{f"{e}_cpu": statistics.median(v) for e, v in cpu.items()},
              **{f"{e}_all": v for e, v in reruns.items()}}
    print(f"{nodes} nodes: up {up:.1f}s, first pyinfra deploy {first:.1f}s, no-op re-run "
          + ", ".join(f"{e} median {result[e]:.1f}s (all {reruns[e]}, deploying machine's CPU "
                      f"{result[e + '_cpu']:.1f}s)" for e in engines),
          flush=True)
    return result


def ratio(results: list[dict], engine: str, hi: int, lo: int) -> float:
    """The *hi*-node re-run over the *lo*-node one; a node count benched in several
    rounds (``--nodes 2 10 2``) counts as the mean of its rounds' medians."""
    def mean(n: int) -> float:
        return statistics.mean(r[engine] for r in results if r["nodes"] == n)
    return mean(hi) / mean(lo)


def record(results: list[dict], runs: int, engines: list[str]) -> None:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"
    components = sorted(p.parent.name for p in
                        (ROOT / "src/aicluster/components").glob("*/deploy.py"))
    names = {"pyinfra": "pyinfra", "ansible": "Ansible"}
    head = ["nodes", "testbed up (s)", "first deploy, pyinfra (s)", "settle (s)",
            "idle at rest"]
    for e in engines:
        head += [f"no-op re-run, {names[e]} (s)", f"its CPU here, {names[e]} (s)"]
    if len(engines) == 2:
        head.append("Ansible / pyinfra")
    lines = [
        f"\n### {when} ({machine}; components: {', '.join(components)}; "
        f"median of {runs} re-runs)\n",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]
    for r in results:
        cells = [str(r["nodes"]), f"{r['up']:.1f}", f"{r['first']:.1f}", f"{r['settle']:.0f}",
                 f"{r['idle']:.0%}"]
        for e in engines:
            cells += [f"{r[e]:.1f}", f"{r[e + '_cpu']:.1f}"]
        if len(engines) == 2:
            cells.append(f"{r['ansible'] / r['pyinfra']:.1f}x")
        lines.append("| " + " | ".join(cells) + " |")
    counts = sorted({r["nodes"] for r in results})
    if len(counts) > 1:
        lo, hi = counts[0], counts[-1]
        rounds = {n: [r for r in results if r["nodes"] == n] for n in (lo, hi)}
        lines.append(
            f"\n{hi}-node re-run / {lo}-node re-run: "
            + ", ".join(f"{names[e]} {ratio(results, e, hi, lo):.2f}x" for e in engines)
            + "".join(f" ({n} nodes: the mean of {len(rounds[n])} rounds' medians, run "
                      "before and after the other count's, so that a drift in this "
                      "machine's speed falls on both sides)"
                      for n in (lo, hi) if len(rounds[n]) > 1)
        )
    RESULTS.write_text(RESULTS.read_text() + "\n".join(lines) + "\n")
    print(f"recorded in {RESULTS.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 10])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engines", nargs="+", choices=sorted(ENGINES),
                        default=["pyinfra", "ansible"])
    parser.add_argument("--lock-held", action="store_true",
                        help=f"the caller already holds the testbed lock {LOCK} "
                             f"(e.g. flock {LOCK} bench/noop_rerun.py --lock-held)")
    opts = parser.parse_args()
    engines = [e for e in ENGINES if e in opts.engines]
    with open(LOCK, "w") as lock:
        if not opts.lock_held:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            results = [bench(n, opts.runs, engines) for n in opts.nodes]
        finally:
            timed([BIN / "aicluster", "testbed", "down"])
    record(results, opts.runs, engines)


if __name__ == "__main__":
    main()
