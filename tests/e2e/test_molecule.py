"""molecule's full sequence for the base role on a testbed it creates and destroys
itself (create, converge, idempotence, verify, destroy)."""

from __future__ import annotations

import os

import pytest

from tests.e2e.conftest import BIN, ROOT, run


def test_molecule_base_scenario():
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests need root (the testbed runs systemd-nspawn)")
    from aicluster import testbed as tb

    # create.yml starts a testbed only when none runs, and destroy.yml removes only
    # one it started: start from none so the scenario owns its testbed.
    if tb.state.load_state():
        tb.down()
    try:
        proc = run(
            [BIN / "molecule", "test", "--scenario-name", "default"],
            timeout=1800,
            check=False,
            cwd=ROOT / "roles" / "base",
        )
        assert proc.returncode == 0, "molecule test failed"
        out = proc.stdout + proc.stderr
        assert "idempotence" in out.lower()
    finally:
        if tb.state.load_state():
            tb.down()
    assert tb.state.load_state() is None, "molecule's destroy left the testbed running"


def test_molecule_slurm_scenario():
    """The slurm role's scenario (base, then slurm; srun across both nodes and a job
    on a STAND-IN GPU in verify), on a testbed it creates and destroys itself."""
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests need root (the testbed runs systemd-nspawn)")
    from aicluster import testbed as tb

    if tb.state.load_state():
        tb.down()
    try:
        proc = run(
            [BIN / "molecule", "test", "--scenario-name", "default"],
            timeout=1800,
            check=False,
            cwd=ROOT / "roles" / "slurm",
        )
        assert proc.returncode == 0, "molecule test failed"
    finally:
        if tb.state.load_state():
            tb.down()
    assert tb.state.load_state() is None, "molecule's destroy left the testbed running"


def test_molecule_ray_scenario():
    """The ray role's scenario (head on node1, node2 joins; `ray status` in verify), on a
    testbed it creates and destroys itself."""
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests need root (the testbed runs systemd-nspawn)")
    from aicluster import testbed as tb

    if tb.state.load_state():
        tb.down()
    try:
        proc = run(
            [BIN / "molecule", "test", "--scenario-name", "default"],
            timeout=1800,
            check=False,
            cwd=ROOT / "roles" / "ray",
        )
        assert proc.returncode == 0, "molecule test failed"
        assert "idempotence" in (proc.stdout + proc.stderr).lower()
    finally:
        if tb.state.load_state():
            tb.down()
    assert tb.state.load_state() is None, "molecule's destroy left the testbed running"
