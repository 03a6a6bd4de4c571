#!/usr/bin/env python3
"""Time `aicluster check` (quick and standard tiers) on testbeds of several sizes, and
record the figures in docs/benchmarks.md: the pair tests run in rounds of disjoint
pairs (n - 1 rounds for n nodes), so the standard tier's wall time should grow with
the number of rounds, linearly in n, not with the n(n - 1)/2 pairs.

    .venv/bin/python bench/check_scale.py [--nodes 2 10] [--runs 2]

For each node count: a fresh testbed (`testbed up`), the components that need no disks
or release files taken off (base and network only: the checks then are the nodes and
network layers: SSH, chrony, the deploy record, each NIC, a don't-fragment ping and
iperf3 on the fabric between every two nodes), the first deploy with pyinfra, then
--runs runs of each tier, which must pass (exit 0). Needs root; holds the testbed lock.
Tests never assert timings: speed is measured here.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from noop_rerun import BIN, ENGINES, LOCK, append_section, settle, timed

INVENTORY = "inventories/testbed.py"
#: iperf3's floor on the testbed, a fraction of the declared link speed (see bench()).
IPERF3_FRACTION = 0.25
#: The testbed's groups that need more than base and network (taken off here).
GROUPS = ("gpu_nodes", "ib_nodes", "slurm_controller", "slurm_workers", "ray_head",
          "ray_workers")


def check(tier: str) -> tuple[float, dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        seconds, text = timed([BIN / "aicluster", "check", INVENTORY, f"--{tier}",
                               "--json", out.name])
        document = json.loads(Path(out.name).read_text())
    failed = {k: v for k, v in document["counts"].items()
              if k in ("FAIL", "TIMEOUT", "ERROR") and v}
    if failed:
        sys.exit(f"aicluster check --{tier} did not pass: {failed}\n{text[-4000:]}")
    return seconds, document


def bench(nodes: int, runs: int) -> dict:
    from aicluster.testbed.state import state_dir

    timed([BIN / "aicluster", "testbed", "down"])
    timed([BIN / "aicluster", "testbed", "up", "--nodes", str(nodes)])
    # Every pair of a round runs iperf3 at once, and on the testbed they all share this
    # machine's cores and one bridge (10 nodes: 5 streams of about 5 Gb/s each on 2
    # cores): the floor is a quarter of the declared 10 Gb/s here, not 80 %.
    (state_dir() / "overrides.json").write_text(json.dumps({
        "groups": {g: [] for g in GROUPS},
        "check_thresholds": {"network": {"iperf3_min_fraction": IPERF3_FRACTION}}}))
    first, _ = timed(ENGINES["pyinfra"])
    waited, idle = settle()
    quick, standard, pairs = [], [], 0
    for _ in range(runs):
        seconds, _doc = check("quick")
        quick.append(seconds)
        seconds, doc = check("standard")
        standard.append(seconds)
        pairs = len({tuple(sorted(r["pair"])) for r in doc["results"] if r["pair"]})
    result = {"nodes": nodes, "first": first, "idle": idle, "pairs": pairs,
              "rounds": nodes - 1 if nodes % 2 == 0 else nodes,
              "quick": statistics.median(quick), "standard": statistics.median(standard),
              "quick_all": quick, "standard_all": standard}
    print(f"{nodes} nodes: first deploy {first:.1f}s; check --quick {result['quick']:.1f}s "
          f"(all {quick}), standard {result['standard']:.1f}s (all {standard}); "
          f"{pairs} pairs in {result['rounds']} rounds", flush=True)
    return result


def record(results: list[dict], runs: int) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["", f"### {stamp} ({platform.system()} {platform.machine()}, "
                 f"{len(__import__('os').sched_getaffinity(0))} cores; components: base, "
                 f"network; median of {runs} runs; iperf3 floor {IPERF3_FRACTION:.0%} of the "
                 "declared 10 Gb/s: a round's pairs share this machine)", "",
             "| nodes | node pairs | rounds | `check --quick` (s) | `check` standard (s) | "
             "standard s / round |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['nodes']} | {r['pairs']} | {r['rounds']} | {r['quick']:.1f} | "
                     f"{r['standard']:.1f} | {r['standard'] / max(1, r['rounds']):.1f} |")
    if len(results) >= 2:
        lo, hi = results[0], results[-1]
        lines += ["", f"{hi['nodes']} nodes / {lo['nodes']} nodes: standard tier "
                      f"{hi['standard'] / lo['standard']:.2f}x for "
                      f"{hi['pairs'] / max(1, lo['pairs']):.0f}x the pairs and "
                      f"{hi['rounds'] / lo['rounds']:.0f}x the rounds."]
    append_section("## `aicluster check` at scale (`bench/check_scale.py`)", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 10])
    parser.add_argument("--runs", type=int, default=2)
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
