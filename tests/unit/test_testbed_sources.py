"""Unit tests of aicluster.testbed.sources (the host's apt sources, both formats)."""

from __future__ import annotations

import pytest

from aicluster.testbed.errors import TestbedError
from aicluster.testbed.proxy import acng_config, tinyproxy_config
from aicluster.testbed.sources import (
    Mirror,
    find_mirror,
    host_mirror,
    node_sources,
    node_url,
    parse_deb822,
    parse_one_line,
    read_host_sources,
)

# Invented host names only: the project never names a real registry host.
ONE_LINE = """\
# comment
deb http://mirror.example/debian bookworm main contrib
deb-src http://mirror.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] https://secure.example/debian-security bookworm-security main #
deb http://mirror.example/debian bookworm-updates main

deb cdrom:[Debian]/ bookworm main
"""

DEB822 = """\
Types: deb deb-src
# a comment inside a stanza
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main non-free-firmware
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 abc
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Enabled: no
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
"""


def test_parse_one_line() -> None:
    entries = parse_one_line(ONE_LINE)
    assert [(e.types, e.uris, e.suites, e.components) for e in entries] == [
        (["deb"], ["http://mirror.example/debian"], ["bookworm"], ["main", "contrib"]),
        (["deb-src"], ["http://mirror.example/debian"], ["bookworm"], ["main"]),
        (["deb"], ["https://secure.example/debian-security"], ["bookworm-security"], ["main"]),
        (["deb"], ["http://mirror.example/debian"], ["bookworm-updates"], ["main"]),
        (["deb"], ["cdrom:[Debian]/"], ["bookworm"], ["main"]),
    ]


def test_parse_deb822() -> None:
    entries = parse_deb822(DEB822)
    assert len(entries) == 2  # the disabled stanza is skipped
    assert entries[0].types == ["deb", "deb-src"]
    assert entries[0].suites == ["bookworm", "bookworm-updates"]
    assert entries[0].components == ["main", "non-free-firmware"]
    assert entries[1].uris == ["http://mirror.example/debian-security"]


def test_find_mirror_one_line() -> None:
    mirror = find_mirror(parse_one_line(ONE_LINE))
    assert mirror.url == "http://mirror.example/debian"
    assert mirror.components == ["main", "contrib"]
    assert mirror.security_url == "https://secure.example/debian-security"
    assert mirror.repositories == [mirror.url, mirror.security_url]


def test_find_mirror_deb822() -> None:
    mirror = find_mirror(parse_deb822(DEB822))
    assert mirror == Mirror(
        url="http://mirror.example/debian",
        components=["main", "non-free-firmware"],
        security_url="http://mirror.example/debian-security",
    )


def test_find_mirror_other_release_falls_back() -> None:
    entries = parse_one_line("deb http://m.example/debian/ trixie main\n")
    mirror = find_mirror(entries)
    assert mirror.url == "http://m.example/debian"
    assert mirror.security_url is None


def test_find_mirror_none() -> None:
    with pytest.raises(TestbedError, match="cannot find a Debian mirror"):
        find_mirror(parse_one_line("deb cdrom:[x]/ bookworm main\n"))


def test_read_host_sources(tmp_path) -> None:
    apt = tmp_path / "etc/apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text("# nothing here\n")
    (apt / "sources.list.d/debian.sources").write_text(DEB822)
    (apt / "sources.list.d/extra.list").write_text("deb https://other.example/apt stable main\n")
    (apt / "sources.list.d/old.list.disabled-by-farm").write_text("deb http://no.example/ x y\n")
    (apt / "sources.list.d/gone.sources.bak").write_text("Types: deb\nURIs: http://no.example\n")
    entries = read_host_sources(tmp_path)
    uris = [u for e in entries for u in e.uris]
    assert uris == [
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
        "https://other.example/apt",
    ]
    assert host_mirror(tmp_path).url == "http://mirror.example/debian"


def test_node_url_and_sources() -> None:
    assert node_url("https://secure.example/debian-security/") == (
        "http://secure.example/debian-security"
    )
    mirror = find_mirror(parse_one_line(ONE_LINE))
    text = node_sources(mirror)
    assert "URIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n" in text
    assert "URIs: http://secure.example/debian-security\nSuites: bookworm-security\n" in text
    assert text.count("Components: main contrib\n") == 2
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in text


def test_acng_config_uses_host_mirror(tmp_path) -> None:
    mirror = find_mirror(parse_one_line(ONE_LINE))
    conf = acng_config(mirror, tmp_path / "cache", tmp_path / "run")
    assert "BindAddress: 10.213.0.1\n" in conf
    assert "Port: 3142\n" in conf
    assert f"CacheDir: {tmp_path / 'cache'}\n" in conf
    assert "Remap-aicl0: mirror.example/debian ; http://mirror.example/debian/\n" in conf
    # A node asks for the http URL; the backend keeps the host's https.
    assert ("Remap-aicl1: secure.example/debian-security ; "
            "https://secure.example/debian-security/\n") in conf


def test_tinyproxy_config() -> None:
    conf = tinyproxy_config()
    assert "Listen 10.213.0.1\n" in conf
    assert "Port 8888\n" in conf
    assert "Allow 10.213.0.0/24\n" in conf
    assert "ConnectPort 443\n" in conf
