"""pyinfra end to end: deploy the testbed, check the nodes, deploy again: no change."""

from __future__ import annotations

from tests.e2e.checks import assert_base
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, pyinfra_results, run


def _deploy():
    return run([BIN / "pyinfra", "-y", TESTBED_INVENTORY, "deploy.py"], timeout=1500)


def _output(proc):
    # pyinfra writes its progress and results table to stderr.
    return proc.stdout + proc.stderr


def test_deploy_then_redeploy_changes_nothing(testbed):
    first = pyinfra_results(_output(_deploy()))
    assert first["changed"] > 0 and first["errors"] == 0, first
    assert_base(testbed)
    second = pyinfra_results(_output(_deploy()))
    assert second["changed"] == 0 and second["errors"] == 0, second
    assert second["no_change"] > 0, second
