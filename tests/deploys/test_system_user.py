"""aicluster.deploys.system_user on fake hosts: an account already as wanted costs one
small read (no Users fact, no useradd/usermod); anything else goes to server.user."""

from __future__ import annotations

import subprocess

import pytest

from aicluster.common.facts import UserAccount
from aicluster.common.ops import system_user
from tests.deploys.harness import plan

RAY = {"home": "/var/lib/ray", "comment": None, "shell": "/usr/sbin/nologin", "uid": 999,
       "gid": 999, "group": "ray", "groups": ["video"]}


def _deploy():
    system_user("Ray user ray", "ray", group="ray", groups=["video"], append=True,
                home="/var/lib/ray", shell="/usr/sbin/nologin", system=True, create_home=True)


def _plan(account):
    facts = {"n1": {"UserAccount": account, "Users": {"ray": account} if account else {},
                    "Os": "Linux", "Which": "/usr/sbin/useradd", "Groups": ["ray", "video"],
                    "Directory": {"mode": 755, "user": "ray", "group": "ray"}}}
    return plan([("n1", {})], {}, {}, facts, _deploy)


def test_an_account_as_wanted_only_keeps_its_home_owned():
    p = _plan(RAY)
    assert p.names("n1") == ["Ray user ray: home directory"]
    assert "useradd" not in p.commands("n1") and "usermod" not in p.commands("n1")


def test_a_missing_account_is_made_by_server_user():
    p = _plan(None)
    assert p.names("n1") == ["Ray user ray"]
    assert "useradd -d /var/lib/ray -s /usr/sbin/nologin -g ray -G video -r -m ray" in (
        p.commands("n1"))


@pytest.mark.parametrize("change", [{"shell": "/bin/bash"}, {"home": "/home/ray"},
                                    {"group": "users"}, {"groups": []}])
def test_an_account_that_differs_is_mended_by_server_user(change):
    p = _plan({**RAY, **change})
    assert p.names("n1") == ["Ray user ray"]
    assert "usermod" in p.commands("n1")


def test_user_account_reads_like_users():
    fact = UserAccount()
    assert fact.command(user="ray") == "getent passwd ray && id -Gn ray || true"
    assert fact.process(["ray:x:999:999::/var/lib/ray:/usr/sbin/nologin",
                         "ray video"]) == RAY
    assert fact.process([]) is None


def test_user_account_names_the_group_id_gn_names():
    """Run here for root: the primary group is the one `id -gn` prints."""
    out = subprocess.run(["sh", "-c", UserAccount().command(user="root")],
                         capture_output=True, text=True, check=True).stdout
    account = UserAccount().process(out.splitlines())
    primary = subprocess.run(["id", "-gn", "root"], capture_output=True, text=True,
                             check=True).stdout.strip()
    others = subprocess.run(["id", "-Gn", "root"], capture_output=True, text=True,
                            check=True).stdout.split()
    assert account["group"] == primary and account["uid"] == 0
    assert account["groups"] == [g for g in others if g != primary]
