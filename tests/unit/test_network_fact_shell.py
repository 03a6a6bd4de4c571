"""The management-interface fact's shell (aicluster.components.network.facts.management_command),
run here with a STAND-IN ``ip`` (a script printing what ``ip -o addr show`` prints) and
a stand-in /sys/class/net, with nothing else on PATH: which interface holds the
address, and its MAC, read by the shell itself."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from aicluster.components.network.probe import management_command, parse_management

IP_OUTPUT = r"""1: lo    inet 127.0.0.1/8 scope host lo\       valid_lft forever
2: host0@if5    inet 10.213.0.120/24 brd 10.213.0.255 scope global host0\       valid_lft forever
3: fabric0@if9    inet 10.213.0.12/24 brd 10.213.0.255 scope global fabric0\       valid_lft forever
3: fabric0@if9    inet6 fd00::12/64 scope global \       valid_lft forever preferred_lft forever
4: ib0    inet 10.50.0.12/24 scope global ib0\       valid_lft forever preferred_lft forever
"""


def _read(tmp_path: Path, address: str) -> dict | None:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "ip").write_text(  # shell builtins only: nothing else is on PATH
        f"#!/bin/sh\nwhile IFS= read -r l; do printf '%s\\n' \"$l\"; done <<'OUT'\n"
        f"{IP_OUTPUT}OUT\n")
    (bindir / "ip").chmod(0o755)
    net = tmp_path / "net"
    for name, mac in (("host0", "02:00:00:00:00:0a"), ("fabric0", "02:AC:13:01:00:01")):
        (net / name).mkdir(parents=True, exist_ok=True)
        (net / name / "address").write_text(mac + "\n")
    command = management_command(address).replace("/sys/class/net", str(net))
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                         env={**os.environ, "PATH": str(bindir)}, check=True).stdout
    return parse_management(out.splitlines())


@pytest.mark.parametrize(("address", "expected"), [
    ("10.213.0.12", {"name": "fabric0", "mac": "02:ac:13:01:00:01"}),  # not 10.213.0.120
    ("10.213.0.120", {"name": "host0", "mac": "02:00:00:00:00:0a"}),
    ("fd00::12", {"name": "fabric0", "mac": "02:ac:13:01:00:01"}),
    ("10.50.0.12", {"name": "ib0", "mac": None}),  # no MAC to read: "-"
    ("10.99.0.1", None),  # no interface holds it
])
def test_the_interface_holding_the_address_and_its_mac(tmp_path, address, expected):
    assert _read(tmp_path, address) == expected
