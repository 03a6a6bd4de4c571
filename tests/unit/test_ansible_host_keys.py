"""Ansible checks SSH host keys by default; only the testbed's own nodes are exempt.

The repository's ansible.cfg must not turn the check off for every run (the lab's
deploy would then accept whatever answers at a node's address); the testbed
inventory turns it off per host, for its nodes only (their keys change on each build).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aicluster.testbed import state as tb_state

REPO = Path(__file__).resolve().parents[2]


def _ansible_env() -> dict[str, str]:
    """The environment without anything that would override ansible.cfg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def test_ansible_config_from_the_repository_checks_host_keys():
    ansible_config = shutil.which("ansible-config", path=str(Path(sys.executable).parent))
    assert ansible_config, "ansible-config is installed with ansible-core"
    result = subprocess.run(
        [ansible_config, "dump"], cwd=REPO, env=_ansible_env(),
        capture_output=True, text=True, timeout=120, check=True,
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("HOST_KEY_CHECKING"))
    # "HOST_KEY_CHECKING(default) = True": on, and not set by ansible.cfg to anything.
    assert line.endswith("= True"), line
    assert f"CONFIG_FILE() = {REPO / 'ansible.cfg'}" in result.stdout


def test_ansible_cfg_does_not_turn_host_key_checking_off():
    text = (REPO / "ansible.cfg").read_text()
    settings = [x.split("=")[0].strip() for x in text.splitlines() if not x.startswith("#")]
    assert "host_key_checking" not in settings


@pytest.fixture
def testbed_state(tmp_path, monkeypatch):
    """A two-node testbed's state file (nothing running: the inventory only reads it)."""
    key = tmp_path / "id_ed25519"
    key.write_text("not a key\n")
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAA test@testbed\n")
    nodes = [{"name": f"node{n}", "address": tb_state.management_address(n),
              "fabric_nic": tb_state.FABRIC_NIC} for n in (1, 2)]
    tb_state.save_state({
        "nodes": nodes, "ssh_key": str(key),
        "management": {"subnet": tb_state.MGMT_SUBNET},
        "fabric": {"subnet": tb_state.FABRIC_SUBNET},
        "package_proxy": tb_state.PACKAGE_PROXY,
    }, tmp_path)
    monkeypatch.setenv(tb_state.STATE_DIR_ENV, str(tmp_path))
    return tmp_path


def test_the_testbed_inventory_turns_the_check_off_for_its_own_nodes_only(testbed_state):
    result = subprocess.run(
        [sys.executable, REPO / "inventories" / "testbed.py", "--list"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    hostvars = json.loads(result.stdout)["_meta"]["hostvars"]
    assert set(hostvars) == {"node1", "node2"}
    for name, hv in hostvars.items():
        assert hv["ansible_host_key_checking"] is False, name
        assert "StrictHostKeyChecking=no" in hv["ansible_ssh_common_args"], name
    # The lab's hosts keep Ansible's check.
    lab = subprocess.run(
        [sys.executable, REPO / "inventories" / "lab.py", "--list"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )
    for name, hv in json.loads(lab.stdout)["_meta"]["hostvars"].items():
        assert "ansible_host_key_checking" not in hv, name
        assert "StrictHostKeyChecking" not in hv.get("ansible_ssh_common_args", ""), name
