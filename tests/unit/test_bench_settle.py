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
