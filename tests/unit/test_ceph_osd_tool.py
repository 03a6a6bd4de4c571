"""The OSD tool the ceph component writes (roles/ceph/templates/aicluster-ceph-osd.j2),
run here with STAND-IN ``ceph-volume``, ``mountpoint`` and ``systemctl``: at boot
(``activate-all``) it waits for a device udev has not made yet and starts its OSD, and
a device that never appears fails the run, naming it, once every other device's OSD is
started."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from aicluster.render import render

STANDINS = {
    # `ceph-volume raw list DEVICE --format json`: an OSD (id 3) on every device;
    # `raw activate`: noted.
    "ceph-volume": '#!/bin/sh\necho "ceph-volume $*" >> "$LOG"\n'
                   'case "$1 $2" in "raw list") echo \'{"u": {"osd_id": 3}}\' ;; esac\n',
    # The OSD's directory not mounted yet: activated first.
    "mountpoint": "#!/bin/sh\nexit 1\n",
    "systemctl": '#!/bin/sh\necho "systemctl $*" >> "$LOG"\n',
}


@pytest.fixture
def tool(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STANDINS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "aicluster-ceph-osd"
    script.write_text(render("ceph", "aicluster-ceph-osd.j2", {"ceph_osd_mode": "raw"}))
    script.chmod(0o755)
    log = tmp_path / "log"

    def run(devices: list[Path], wait: int) -> tuple[subprocess.CompletedProcess, list[str]]:
        listed = tmp_path / "devices"
        listed.write_text("# the devices\n" + "".join(f"{d}\n" for d in devices))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log),
               "AICLUSTER_OSD_DEVICES": str(listed),
               "AICLUSTER_OSD_DEVICE_WAIT": str(wait)}
        done = subprocess.run([str(script), "activate-all"], env=env, capture_output=True,
                              text=True, timeout=60)
        return done, log.read_text().splitlines() if log.exists() else []

    return run


def test_activate_all_waits_for_a_device_that_appears_late(tool, tmp_path):
    late = tmp_path / "disk-by-id-late"
    timer = threading.Timer(2, late.write_text, args=("",))
    timer.start()
    started = time.monotonic()
    try:
        done, calls = tool([late], wait=30)
    finally:
        timer.cancel()
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started >= 1.5  # it did wait
    assert f"ceph-volume raw activate --device {late} --no-systemd" in calls
    assert "systemctl start ceph-osd@3" in calls


def test_a_device_that_never_appears_fails_after_the_others_started(tool, tmp_path):
    there, gone = tmp_path / "disk-there", tmp_path / "disk-gone"
    there.write_text("")
    done, calls = tool([gone, there], wait=1)
    assert done.returncode == 1
    assert f"aicluster-ceph-osd: {gone} did not appear in 1 s" in done.stderr
    assert f"ceph-volume raw activate --device {there} --no-systemd" in calls
    assert "systemctl start ceph-osd@3" in calls
    assert not any(str(gone) in call for call in calls), calls
