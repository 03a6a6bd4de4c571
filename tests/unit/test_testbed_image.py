"""Unit tests of aicluster.testbed.image (unit enabling, node files, the base key)."""

from __future__ import annotations

import os

import pytest

from aicluster.testbed import image
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.sources import Mirror

NETWORKD_UNIT = """\
[Unit]
Description=Network Configuration

[Service]
ExecStart=!!/lib/systemd/systemd-networkd

[Install]
WantedBy=multi-user.target
Also=systemd-networkd.socket
Alias=dbus-org.freedesktop.network1.service
# a comment
"""

SOCKET_UNIT = "[Socket]\nListenNetlink=route 1361\n\n[Install]\nWantedBy=sockets.target\n"


def _tree(tmp_path):
    units = tmp_path / "lib/systemd/system"
    units.mkdir(parents=True)
    (units / "systemd-networkd.service").write_text(NETWORKD_UNIT)
    (units / "systemd-networkd.socket").write_text(SOCKET_UNIT)
    return tmp_path


def test_parse_install_section() -> None:
    assert image.parse_install_section(NETWORKD_UNIT) == {
        "WantedBy": ["multi-user.target"],
        "Also": ["systemd-networkd.socket"],
        "Alias": ["dbus-org.freedesktop.network1.service"],
    }
    assert image.parse_install_section("[Install]\nWantedBy=a.target b.target\n") == {
        "WantedBy": ["a.target", "b.target"]
    }


def test_enable_unit_like_systemctl(tmp_path) -> None:
    root = _tree(tmp_path)
    made = image.enable_unit(root, "systemd-networkd.service")
    etc = root / "etc/systemd/system"
    assert os.readlink(etc / "multi-user.target.wants/systemd-networkd.service") == (
        "/lib/systemd/system/systemd-networkd.service"
    )
    assert os.readlink(etc / "dbus-org.freedesktop.network1.service") == (
        "/lib/systemd/system/systemd-networkd.service"
    )
    assert os.readlink(etc / "sockets.target.wants/systemd-networkd.socket") == (
        "/lib/systemd/system/systemd-networkd.socket"
    )
    assert len(made) == 3
    # Enabling again changes nothing.
    assert image.enable_unit(root, "systemd-networkd.service") == []


def test_enable_unit_missing(tmp_path) -> None:
    with pytest.raises(TestbedError, match="not found"):
        image.enable_unit(tmp_path, "nope.service")


def test_write_file_replaces_symlink_and_refuses_escape(tmp_path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    outside = tmp_path / "host-file"
    outside.write_text("host\n")
    (root / "etc/resolv.conf").symlink_to(outside)  # an absolute link means the host's file
    image.write_file(root, "etc/resolv.conf", "x\n")
    assert outside.read_text() == "host\n"
    assert (root / "etc/resolv.conf").read_text() == "x\n"
    (root / "escape").symlink_to(tmp_path)
    with pytest.raises(TestbedError, match="outside"):
        image.write_file(root, "escape/oops", "x\n")
    assert not (tmp_path / "oops").exists()


def test_base_key_follows_ca_certificates(tmp_path) -> None:
    ca = tmp_path / "ca"
    ca.mkdir()
    assert image.host_ca_files(ca) == []
    empty = image.base_key([], ca)
    (ca / "a.crt").write_text("A")
    (ca / "notes.txt").write_text("ignored")
    files = image.host_ca_files(ca)
    assert [f.name for f in files] == ["a.crt"]
    key_a = image.base_key(files, ca)
    (ca / "a.crt").write_text("B")
    assert len({empty, key_a, image.base_key(files, ca)}) == 3
    assert image.tarball_path(tmp_path, key_a).name == f"base-bookworm-{key_a}.tar.zst"


def test_small_node_files() -> None:
    assert image.apt_proxy_conf() == 'Acquire::http::Proxy "http://10.213.0.1:3142";\n'
    assert image.pip_conf() == "[global]\nproxy = http://10.213.0.1:8888\n"
    net = image.host0_network(2)
    assert "Name=host0" in net and "Address=10.213.0.12/24" in net
    assert "Gateway=10.213.0.1" in net
    hosts = image.hosts_file(2, 3)
    assert "10.213.0.11\tnode1\n" in hosts and "10.213.0.13\tnode3\n" in hosts


def test_write_node_config(tmp_path) -> None:
    mirror = Mirror(url="http://mirror.example/debian", components=["main"])
    image.write_node_config(tmp_path, 3, 3, "ssh-ed25519 AAAA test\n", mirror)
    assert (tmp_path / "etc/hostname").read_text() == "node3\n"
    keys = tmp_path / "root/.ssh/authorized_keys"
    assert keys.read_text() == "ssh-ed25519 AAAA test\n"
    assert keys.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "root/.ssh").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "etc/apt/apt.conf.d/01aicluster-proxy").read_text() == (
        'Acquire::http::Proxy "http://10.213.0.1:3142";\n'
    )
    assert (tmp_path / "etc/pip.conf").read_text() == "[global]\nproxy = http://10.213.0.1:8888\n"
    assert "URIs: http://mirror.example/debian\n" in (
        tmp_path / "etc/apt/sources.list.d/debian.sources"
    ).read_text()
    assert (tmp_path / "etc/aicluster-testbed/fabric.env").read_text() == (
        "FABRIC_MAC=02:ac:13:01:00:03\n"
    )
    assert "Address=10.213.0.13/24" in (
        tmp_path / "etc/systemd/network/10-aicluster-host0.network"
    ).read_text()


def test_prepare_base_root(tmp_path) -> None:
    root = _tree(tmp_path / "root")
    units = root / "lib/systemd/system"
    (units / "ssh.service").write_text(
        "[Install]\nWantedBy=multi-user.target\nAlias=sshd.service\n"
    )
    (root / "etc/ssh").mkdir(parents=True)
    (root / "etc/ssh/ssh_host_ed25519_key").write_text("secret")
    (root / "etc/machine-id").write_text("0123456789abcdef\n")
    (root / "var/cache/apt/archives").mkdir(parents=True)
    (root / "var/cache/apt/archives/x.deb").write_text("")
    image.prepare_base_root(root, [])  # no CA files: no chroot needed
    assert not (root / "etc/ssh/ssh_host_ed25519_key").exists()
    assert (root / "etc/machine-id").read_text() == ""
    assert not (root / "var/cache/apt/archives/x.deb").exists()
    wants = root / "etc/systemd/system/multi-user.target.wants"
    assert {p.name for p in wants.iterdir()} == {
        "systemd-networkd.service", "ssh.service", "aicluster-ssh-keygen.service",
        "aicluster-testbed-fabric.service",
    }
    assert (root / "etc/systemd/system/ssh.service.wants/aicluster-ssh-keygen.service").is_symlink()
    assert "ssh-keygen -A" in (
        root / "etc/systemd/system/aicluster-ssh-keygen.service"
    ).read_text()
