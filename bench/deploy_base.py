#!/usr/bin/env python3
"""Time the testbed and the base deploy on it, with both engines, and record the
figures in docs/benchmarks.md.

    .venv/bin/python bench/deploy_base.py [--nodes 2] [--runs 3]

For each engine: a fresh testbed (`testbed up`, warm image cache), the first deploy,
then the no-op re-run (median of --runs). Needs root. Tests never assert timings;
this script is where speed is measured.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = ROOT / "docs" / "benchmarks.md"
MARK = "<!-- bench/deploy_base.py appends below -->"


def timed(args: list[str]) -> float:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    start = time.monotonic()
    proc = subprocess.run([str(a) for a in args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    opts = parser.parse_args()

    inventory = "inventories/testbed.py"
    engines = {
        "pyinfra": [BIN / "pyinfra", "-y", inventory, "deploy.py"],
        "ansible": [BIN / "ansible-playbook", "-i", inventory, "playbooks/site.yml"],
    }
    rows = []
    for engine, command in engines.items():
        timed([BIN / "aicluster", "testbed", "down"])
        up = timed([BIN / "aicluster", "testbed", "up", "--nodes", str(opts.nodes)])
        first = timed(command)
        reruns = [timed(command) for _ in range(opts.runs)]
        rows.append((engine, up, first, statistics.median(reruns), min(reruns), max(reruns)))
        print(f"{engine}: up {up:.1f}s, first deploy {first:.1f}s, "
              f"no-op re-run median {statistics.median(reruns):.1f}s", flush=True)
    timed([BIN / "aicluster", "testbed", "down"])

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"
    lines = [
        f"\n### {when}: base on {opts.nodes} testbed nodes ({machine})\n",
        "| engine | testbed up (s) | first deploy (s) | no-op re-run median (s) | min-max (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for engine, up, first, med, lo, hi in rows:
        lines.append(f"| {engine} | {up:.1f} | {first:.1f} | {med:.1f} | {lo:.1f}-{hi:.1f} |")
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if MARK not in text:
        text += f"\n## Base deploy on the testbed\n\n{MARK}\n"
    RESULTS.write_text(text + "\n".join(lines) + "\n")
    print(f"recorded in {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
