"""The driver installer's `verify` (roles/nvidia/templates/aicluster-nvidia-driver.j2), run
here with STAND-IN nvidia-smi, systemctl and sleep on PATH and a stand-in
/sys/module/nvidia/version: on NVSwitch nodes (`verify --fabric-manager`) it also needs
Fabric Manager active and every GPU's fabric state "Completed" (nvidia-smi -q's
"Fabric" section), and keeps the node drained otherwise."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from aicluster.render import defaults, os_vars, render

VERSION = "570.133.20"


def _gpu_q(bus: str, state: str) -> str:
    # The layout of `nvidia-smi -q` on an HGX H100 (one block per GPU).
    return (f"GPU 00000000:{bus}:00.0\n"
            "    Product Name                          : NVIDIA H100 80GB HBM3\n"
            "    Fabric\n"
            f"        State                             : {state}\n"
            "        Status                            : Success\n"
            "    Processes                             : None\n")


def _verify(tmp_path: Path, states: list[str], active: str = "active",
            *args: str) -> subprocess.CompletedProcess:
    v = {**defaults("nvidia"), **os_vars("nvidia", "Debian"), "inventory_hostname": "gpu1",
         "nvidia_driver_version": VERSION, "nvidia_expected_gpus": len(states)}
    module = tmp_path / "nvidia-version"
    module.write_text(VERSION + "\n")
    script = tmp_path / "aicluster-nvidia-driver"
    script.write_text(render("nvidia", "aicluster-nvidia-driver.j2", v)
                      .replace("/sys/module/nvidia/version", str(module)))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "awk", "sed", "head", "grep", "cat", "printf"):
        if shutil.which(tool):
            (bindir / tool).symlink_to(shutil.which(tool))
    smi_q = "".join(_gpu_q(f"{0x18 + i:02X}", s) for i, s in enumerate(states))
    (tmp_path / "smi-q").write_text(smi_q)
    (tmp_path / "smi-query").write_text(f"{VERSION}\n" * len(states))
    stubs = {
        "nvidia-smi": f'if [ "$1" = -q ]; then cat {tmp_path}/smi-q; '
                      f'else cat {tmp_path}/smi-query; fi',
        "systemctl": f'[ "$1" = is-active ] && echo {active} && [ {active} = active ]',
        "sleep": "true",
    }
    for tool, body in stubs.items():
        (bindir / tool).write_text(f"#!{shutil.which('sh')}\n{body}\n")
        (bindir / tool).chmod(0o755)
    return subprocess.run([str(bindir / "sh"), str(script), "verify", *args],
                          capture_output=True, text=True, env={"PATH": str(bindir)},
                          timeout=60)


def test_fabric_completed_on_every_gpu_passes(tmp_path):
    proc = _verify(tmp_path, ["Completed"] * 8, "active", "--fabric-manager")
    assert proc.returncode == 0, proc.stderr
    assert "gpu1: Fabric Manager active, fabric state Completed on 8 GPU(s)" in proc.stdout


def test_fabric_not_completed_keeps_the_node_drained(tmp_path):
    proc = _verify(tmp_path, ["Completed"] * 7 + ["In Progress"], "active", "--fabric-manager")
    assert proc.returncode == 1
    assert ("gpu1: Fabric Manager is active and 7 of 8 GPU(s) report fabric state Completed"
            in proc.stderr)
    assert "the node stays drained" in proc.stderr


def test_fabric_manager_not_running_keeps_the_node_drained(tmp_path):
    proc = _verify(tmp_path, ["Completed"] * 8, "failed", "--fabric-manager")
    assert proc.returncode == 1
    assert "gpu1: Fabric Manager is failed and 8 of 8 GPU(s)" in proc.stderr


def test_without_nvswitches_the_fabric_is_not_asked(tmp_path):
    proc = _verify(tmp_path, ["Not Supported"] * 2, "inactive")
    assert proc.returncode == 0, proc.stderr
    assert "Fabric Manager" not in proc.stdout + proc.stderr
