#!/usr/bin/env python3
"""Time the no-op re-run of the whole deploy on the testbed, pyinfra and Ansible side
by side, and record the figures in docs/benchmarks.md.

    .venv/bin/python bench/noop_rerun.py [--nodes 2 10] [--runs 3]

For each node count: a fresh testbed (`testbed up`, warm image cache), the first
deploy with pyinfra (timed), then --runs no-op re-runs of each engine, alternating.
Both engines leave the same files (tests/unit/test_template_parity.py), so Ansible's
re-run after pyinfra's deploy is a true no-op; the script checks each re-run changed
nothing. Needs root; holds the testbed lock. Tests never assert timings: speed is
measured here.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import os
import platform
import re
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


def timed(args: list) -> tuple[float, str]:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    start = time.monotonic()
    proc = subprocess.run([str(a) for a in args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} failed:\n{out[-4000:]}")
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


def bench(nodes: int, runs: int) -> dict:
    timed([BIN / "aicluster", "testbed", "down"])
    up, _ = timed([BIN / "aicluster", "testbed", "up", "--nodes", str(nodes)])
    first, _ = timed(ENGINES["pyinfra"])
    reruns: dict[str, list[float]] = {e: [] for e in ENGINES}
    for _ in range(runs):
        for engine, command in ENGINES.items():
            seconds, out = timed(command)
            if changed(engine, out):
                sys.exit(f"{engine}'s re-run on {nodes} nodes changed something:\n{out[-4000:]}")
            reruns[engine].append(seconds)
    result = {"nodes": nodes, "up": up, "first": first,
              **{e: statistics.median(v) for e, v in reruns.items()},
              **{f"{e}_all": v for e, v in reruns.items()}}
    print(f"{nodes} nodes: up {up:.1f}s, first pyinfra deploy {first:.1f}s, no-op re-run "
          f"median pyinfra {result['pyinfra']:.1f}s, ansible {result['ansible']:.1f}s",
          flush=True)
    return result


def record(results: list[dict], runs: int) -> None:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"
    components = sorted({p.stem for p in (ROOT / "src/aicluster/deploys").glob("*.py")}
                        - {"__init__"})
    lines = [
        f"\n### {when} ({machine}; components: {', '.join(components)}; "
        f"median of {runs} re-runs)\n",
        "| nodes | testbed up (s) | first deploy, pyinfra (s) | no-op re-run, pyinfra (s) "
        "| no-op re-run, Ansible (s) | Ansible / pyinfra |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['nodes']} | {r['up']:.1f} | {r['first']:.1f} | {r['pyinfra']:.1f} "
            f"| {r['ansible']:.1f} | {r['ansible'] / r['pyinfra']:.1f}x |"
        )
    if len(results) > 1:
        lo, hi = results[0], results[-1]
        lines.append(
            f"\n{hi['nodes']}-node re-run / {lo['nodes']}-node re-run: pyinfra "
            f"{hi['pyinfra'] / lo['pyinfra']:.2f}x, Ansible {hi['ansible'] / lo['ansible']:.2f}x"
        )
    RESULTS.write_text(RESULTS.read_text() + "\n".join(lines) + "\n")
    print(f"recorded in {RESULTS.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 10])
    parser.add_argument("--runs", type=int, default=3)
    opts = parser.parse_args()
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            results = [bench(n, opts.runs) for n in opts.nodes]
        finally:
            timed([BIN / "aicluster", "testbed", "down"])
    record(results, opts.runs)


if __name__ == "__main__":
    main()
