"""The NvidiaNode fact's shell, run here on a STAND-IN PCI tree (a directory laid out as
/sys/bus/pci/devices) with stand-in package tools on PATH: what it prints for GPUs and
NVSwitches, and that with no driver it asks the package tools nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from aicluster.components.nvidia.probe import FACT_COMMAND, parse


def _device(root: Path, slot: str, vendor: str, cls: str, device: str) -> None:
    d = root / slot
    d.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("class", cls), ("device", device)):
        (d / name).write_text(value + "\n")


def _run(tmp_path: Path) -> list[str]:
    pci = tmp_path / "pci"
    _device(pci, "0000:01:00.0", "0x10de", "0x030200", "0x2330")  # H100 SXM
    _device(pci, "0000:02:00.0", "0x8086", "0x020000", "0x1572")  # an Intel NIC
    _device(pci, "0000:03:00.0", "0x10de", "0x068000", "0x22a3")  # NVSwitch
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "awk", "sed", "head", "grep", "cat"):
        (bindir / tool).symlink_to(shutil.which(tool))
    # STAND-IN package tools: they would say a package is held and installed.
    for tool, text in (("apt-mark", "nvidia-driver\n"), ("dpkg-query", "ii nvidia-driver 1\n")):
        (bindir / tool).write_text(f"#!/bin/sh\nprintf '{text}'\n")
        (bindir / tool).chmod(0o755)
    command = FACT_COMMAND.replace("/sys/bus/pci/devices", str(pci))
    proc = subprocess.run([str(bindir / "sh"), "-c", command], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(bindir)}, check=True)
    return proc.stdout.splitlines()


def test_gpus_and_nvswitches_are_listed_and_no_driver_means_no_package_read(tmp_path):
    lines = _run(tmp_path)
    pci = [line for line in lines if line.startswith("pci=")]
    assert pci == ["pci=0000:01:00.0 0x030200 0x2330", "pci=0000:03:00.0 0x068000 0x22a3"]
    # No modinfo and no module: no installed version, so no package or hold is read.
    assert not [line for line in lines if line.startswith(("pkg=", "held=", "installed="))]
    fact = parse(lines)
    assert len(fact["pci_gpus"]) == 1 and len(fact["nvswitches"]) == 1
