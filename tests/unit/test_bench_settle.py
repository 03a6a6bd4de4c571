"""bench/noop_rerun.py's rule for when the testbed's nodes are at rest after the first
deploy (the re-runs are timed only then)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "noop_rerun", Path(__file__).resolve().parents[2] / "bench" / "noop_rerun.py")
noop_rerun = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(noop_rerun)


@pytest.mark.parametrize(("idle", "rest"), [
    ([], False),
    ([0.95], False),  # one window says nothing about the trend
    ([0.60, 0.75], False),  # still busy
    ([0.80, 0.86], False),  # idle enough, but still getting idler: services starting
    ([0.85, 0.86], True),  # idle enough and steady
    ([0.90, 0.88], True),  # steady within noise, a little busier
    ([0.70, 0.86, 0.87], True),
])
def test_at_rest_means_idle_enough_and_no_longer_getting_idler(idle, rest):
    assert noop_rerun.at_rest(idle) is rest


def test_the_ratio_takes_the_mean_of_rounds_of_one_node_count():
    """``--nodes 2 10 2``: the 2-node figure is the mean of both rounds' medians."""
    results = [{"nodes": 2, "pyinfra": 1.0}, {"nodes": 10, "pyinfra": 1.65},
               {"nodes": 2, "pyinfra": 1.2}]
    assert noop_rerun.ratio(results, "pyinfra", 10, 2) == pytest.approx(1.5)
    assert noop_rerun.ratio(results[:2], "pyinfra", 10, 2) == pytest.approx(1.65)


def test_the_record_names_the_rounds(tmp_path, monkeypatch):
    monkeypatch.setattr(noop_rerun, "RESULTS", tmp_path / "benchmarks.md")
    monkeypatch.setattr(noop_rerun, "ROOT", tmp_path)
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n")
    row = {"up": 30.0, "first": 200.0, "settle": 20.0, "idle": 0.85, "pyinfra_cpu": 1.0}
    results = [{**row, "nodes": 2, "pyinfra": 1.0}, {**row, "nodes": 10, "pyinfra": 1.65},
               {**row, "nodes": 2, "pyinfra": 1.2}]
    noop_rerun.record(results, 5, ["pyinfra"])
    text = (tmp_path / "benchmarks.md").read_text()
    assert text.count("\n| 2 |") == 2 and text.count("\n| 10 |") == 1
    assert "10-node re-run / 2-node re-run: pyinfra 1.50x (2 nodes: the mean of 2 rounds'" in text
