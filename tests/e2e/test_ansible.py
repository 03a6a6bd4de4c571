"""Ansible end to end: the same inventory file, the same result, changed=0 the second time."""

from __future__ import annotations

from tests.e2e.checks import assert_base
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, ansible_changed, run


def _playbook():
    return run(
        [BIN / "ansible-playbook", "-i", TESTBED_INVENTORY, "playbooks/site.yml"], timeout=1500
    )


def test_playbook_then_rerun_changes_nothing(testbed):
    first = _playbook()
    changed = ansible_changed(first.stdout)
    assert set(changed) >= {"node1", "node2"}
    assert sum(changed.values()) > 0
    assert_base(testbed)
    second = ansible_changed(_playbook().stdout)
    assert second and all(v == 0 for v in second.values()), second
