"""Ray upgrade by version bump (pyinfra), on a fresh two-node testbed: deploy the
previous Ray version, bump to the pinned one, deploy again. Workers stop, the head
switches and restarts, workers switch and rejoin; both nodes then run the new version
and a task still runs on each node.

The previous version comes from <testbed state dir>/overrides.json, which
inventories/testbed.py lays over every host, so no repository file is edited.
"""

from __future__ import annotations

import json

from tests.e2e.checks import RAY_VERSION, assert_ray, ray_venv
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, pyinfra_results, run

#: The Ray release before the pinned one.
PREVIOUS = "2.59.0"


def _deploy():
    proc = run([BIN / "pyinfra", "-y", TESTBED_INVENTORY, "deploy.py"], timeout=1500)
    return proc.stdout + proc.stderr


def test_ray_version_bump_upgrades_head_then_workers(testbed):
    from aicluster.testbed.state import state_dir

    overrides = state_dir() / "overrides.json"
    overrides.write_text(json.dumps({"ray_version": PREVIOUS}))
    try:
        first = pyinfra_results(_deploy())
        assert first["errors"] == 0, first
        assert_ray(testbed, PREVIOUS)
    finally:
        overrides.unlink()

    output = _deploy()
    result = pyinfra_results(output)
    assert result["errors"] == 0, result
    # The order pyinfra ran the steps in (each on every node before the next).
    steps = [
        f"Install Ray {RAY_VERSION}",
        f"Stop the Ray worker while the head upgrades to {RAY_VERSION}",
        "Restart the Ray head (its unit changed)",
        "Wait until the Ray head answers",
        "Write the Ray worker unit",
        "Restart the Ray worker (its unit changed)",
        f"Remove Ray {PREVIOUS} (the nodes run {RAY_VERSION})",
    ]
    positions = [output.find(f"Starting operation: ray | {step}") for step in steps]
    assert all(p >= 0 for p in positions), dict(zip(steps, positions, strict=True))
    assert positions == sorted(positions), dict(zip(steps, positions, strict=True))
    assert_ray(testbed, RAY_VERSION)
    for node in testbed.nodes:
        assert testbed.ssh(node["name"], f"test -e {ray_venv(PREVIOUS)} || echo gone").strip() \
            == "gone"
