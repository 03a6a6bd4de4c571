"""After `aicluster testbed down`, nothing the testbed made is left on the host.

Runs last: it takes down the testbed tests/e2e/test_nvme_cache.py left up (made with
`aicluster testbed up --nodes 2 --disks 1`, deployed by both engines); alone, it makes
that testbed itself.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import BIN, cli_testbed_up, run


def _sh(cmd: str) -> str:
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout


def test_up_then_down_leaves_nothing():
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests need root")
    from aicluster.testbed import state

    st = state.load_state()
    if not st or len(st.get("disks") or []) != 2:
        # Alone, or after a module that left another testbed: the same one, made here.
        cli_testbed_up("--disks", "1", "--disk-size", "512M")
    else:
        print("taking down the testbed the modules before left up: "
              + ", ".join(d["by_id"] for d in st["disks"]))
    st = state.load_state()
    loops = [d["loop"] for d in st["disks"]]
    assert len(loops) == 2, st["disks"]
    # What deploys and rehearsals leave in the state directory goes too.
    (state.state_dir() / "secrets").mkdir(mode=0o700, exist_ok=True)
    (state.state_dir() / "secrets" / "munge.key").write_bytes(b"x" * 16)
    (state.state_dir() / "overrides.json").write_text("{}")
    pids = [n["pid"] for n in st["nodes"]] + [p["pid"] for p in st["proxies"].values()]
    run([BIN / "aicluster", "testbed", "down"], timeout=300)
    assert state.load_state() is None
    assert not state.state_dir().exists(), list(state.state_dir().iterdir())
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} is still running"
    links = _sh("ip -o link show")
    for name in ("acmgmt0", "acfab0", "vb-node", "vf-node"):
        assert name not in links, f"{name} is still there"
    assert "aicluster" not in _sh("cat /proc/mounts")
    assert _sh("pgrep -x systemd-nspawn").strip() == ""
    for hier in ("systemd", "unified"):
        leftovers = [p.name for p in Path(f"/sys/fs/cgroup/{hier}").glob("aicluster*")]
        assert not leftovers, (hier, leftovers)
    assert "aicluster" not in _sh("losetup -a")
    for loop in loops:
        assert _sh(f"losetup --noheadings -O BACK-FILE {loop} 2>/dev/null").strip() == "", loop
