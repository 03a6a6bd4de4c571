#!/usr/bin/env python3
"""What monitoring costs the cluster: the node exporter's CPU and memory on a node,
the scrape's duration and size, and Prometheus' memory and series per monitored node;
recorded in docs/benchmarks.md.

    .venv/bin/python bench/monitoring_cost.py --running           # the testbed up now
    .venv/bin/python bench/monitoring_cost.py --nodes 2 5         # fresh testbeds

``--running`` measures the testbed as it is deployed (the e2e lab in miniature: every
component, so every exporter and endpoint the stack has). ``--nodes`` makes a fresh
testbed of each size with base, network and monitoring only (node1 the monitoring
host), deploys it with pyinfra, and measures; Prometheus' memory per monitored node
is then the slope between the sizes, which takes out its fixed cost.

Each measurement waits ``--window`` seconds (default 300) after the targets are up, so
the rates span several scrapes, then reads Prometheus' own view through its API:
``rate(process_cpu_seconds_total)`` and ``process_resident_memory_bytes`` of each
exporter and of Prometheus, ``scrape_duration_seconds`` and
``scrape_samples_scraped`` of each target, ``prometheus_tsdb_head_series``. Needs root
and the testbed lock. Tests never assert timings: speed is measured here.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import platform
import statistics
import sys
import time
import urllib.parse
import urllib.request

from noop_rerun import BIN, ENGINES, LOCK, ROOT, append_section, timed

sys.path.insert(0, str(ROOT / "src"))

#: The testbed's groups a --nodes run takes off (only base, network and monitoring stay).
GROUPS = ("gpu_nodes", "ib_nodes", "slurm_controller", "slurm_workers", "ray_head",
          "ray_workers", "nfs_server", "nfs_clients")


def _prometheus() -> tuple[str, int]:
    from aicluster.components.monitoring import derive
    from aicluster.inventory import load_cluster

    cluster = load_cluster(ROOT / "inventories" / "testbed.py")
    node = derive.monitoring_hosts(cluster)[0]
    return f"http://{derive.node_address(cluster, node)}:9090", len(cluster.hosts)


def _query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)["data"]["result"]


def _values(base: str, expr: str) -> list[float]:
    return [float(r["value"][1]) for r in _query(base, expr)]


def measure(window: int) -> dict:
    base, nodes = _prometheus()
    deadline = time.time() + 300
    while time.time() < deadline:
        down = _query(base, "up == 0")
        if not down and _query(base, "up"):
            break
        time.sleep(10)
    print(f"targets up; measuring over {window} s", flush=True)
    time.sleep(window)
    w = f"{window}s"
    cpu = _values(base, f'rate(process_cpu_seconds_total{{job="node"}}[{w}])')
    rss = _values(base, 'process_resident_memory_bytes{job="node"}')
    scrape = _values(base, f'avg_over_time(scrape_duration_seconds{{job="node"}}[{w}])')
    samples = _values(base, 'scrape_samples_scraped{job="node"}')
    all_samples = sum(_values(base, "scrape_samples_scraped"))
    prom_rss = _values(base, 'process_resident_memory_bytes{job="prometheus"}')
    prom_cpu = _values(base, f'rate(process_cpu_seconds_total{{job="prometheus"}}[{w}])')
    series = _values(base, "prometheus_tsdb_head_series")
    targets = len(_query(base, "up"))
    result = {
        "nodes": nodes, "targets": targets,
        "node_cpu": statistics.median(cpu), "node_rss": statistics.median(rss),
        "node_scrape": statistics.median(scrape), "node_samples": statistics.median(samples),
        "samples": all_samples, "prom_rss": prom_rss[0], "prom_cpu": prom_cpu[0],
        "series": series[0], "window": window,
    }
    print(json.dumps(result), flush=True)
    return result


def fresh(nodes: int, window: int) -> dict:
    from aicluster.testbed.state import state_dir

    timed([BIN / "aicluster", "testbed", "down"])
    timed([BIN / "aicluster", "testbed", "up", "--nodes", str(nodes)])
    (state_dir() / "overrides.json").write_text(json.dumps(
        {"groups": {g: [] for g in GROUPS}}))
    timed(ENGINES["pyinfra"])
    return measure(window)


def record(results: list[dict], what: str) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    mib = 1024 * 1024
    lines = ["", f"### {stamp} ({platform.system()} {platform.machine()}, "
                 f"{len(os.sched_getaffinity(0))} cores; {what}; rates over "
                 f"{results[0]['window']} s)", "",
             "| nodes | targets | node exporter CPU (% of a core) | node exporter RSS (MiB) "
             "| its scrape (ms) | its samples | all samples a round | head series "
             "| Prometheus RSS (MiB) | Prometheus CPU (% of a core) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(
            f"| {r['nodes']} | {r['targets']} | {100 * r['node_cpu']:.2f} | "
            f"{r['node_rss'] / mib:.1f} | {1000 * r['node_scrape']:.1f} | "
            f"{r['node_samples']:.0f} | {r['samples']:.0f} | {r['series']:.0f} | "
            f"{r['prom_rss'] / mib:.1f} | {100 * r['prom_cpu']:.2f} |")
    if len(results) >= 2:
        lo, hi = results[0], results[-1]
        per_node = (hi["prom_rss"] - lo["prom_rss"]) / (hi["nodes"] - lo["nodes"])
        per_series = (hi["series"] - lo["series"]) / (hi["nodes"] - lo["nodes"])
        lines += ["", f"Prometheus per monitored node (slope {lo['nodes']} -> {hi['nodes']} "
                      f"nodes): {per_node / mib:.1f} MiB of memory, {per_series:.0f} series."]
    else:
        r = results[0]
        lines += ["", f"Prometheus per monitored node (its whole memory over the nodes, "
                      f"fixed cost included): {r['prom_rss'] / r['nodes'] / mib:.1f} MiB, "
                      f"{r['series'] / r['nodes']:.0f} series."]
    append_section("## What monitoring costs (`bench/monitoring_cost.py`)", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", action="store_true")
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 5])
    parser.add_argument("--window", type=int, default=300)
    opts = parser.parse_args()
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if opts.running:
            record([measure(opts.window)], "the running testbed as deployed")
            return
        try:
            results = [fresh(n, opts.window) for n in opts.nodes]
        finally:
            timed([BIN / "aicluster", "testbed", "down"])
    record(results, "base, network and monitoring only, node1 the monitoring host")


if __name__ == "__main__":
    main()
