"""Ray upgrade by version bump (pyinfra), on the lab in miniature: the lab starts on the
previous Ray release (tests/e2e/conftest.py RAY_PREVIOUS, in the lab's overrides), then
the version goes up to the pinned one and the whole stack is deployed. Workers stop,
the head switches and restarts, workers switch and rejoin; both nodes then run the new
version and a task still runs on each node; the previous release's venv is gone; the
next whole-stack re-run changes nothing.

A lab already on the pinned version (a module run before this one moved it) is set
back to the previous release first. Versions are laid over the inventory through the
lab's overrides (<testbed state dir>/overrides.json, which inventories/testbed.py
reads), so no repository file is edited. The lab is left on the pinned version,
converged.
"""

from __future__ import annotations

from tests.e2e.checks import RAY_VERSION, assert_ray, ray_venv
from tests.e2e.conftest import RAY_PREVIOUS as PREVIOUS
from tests.e2e.conftest import Lab


def test_ray_version_bump_upgrades_head_then_workers(lab: Lab):
    lab.deployed()
    try:
        if lab.ray_version != PREVIOUS:
            lab.set_overrides(ray_version=PREVIOUS)
            lab.read_deploy().succeeded()
        assert_ray(lab.testbed, PREVIOUS)
    finally:
        lab.set_overrides(ray_version=None)

    output = lab.read_deploy().succeeded().output
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
    assert_ray(lab.testbed, RAY_VERSION)
    for node in lab.nodes:
        assert lab.ssh(node["name"], f"test -e {ray_venv(PREVIOUS)} || echo gone").strip() \
            == "gone"
    again = lab.read_deploy().succeeded().results
    assert again["changed"] == 0, again
