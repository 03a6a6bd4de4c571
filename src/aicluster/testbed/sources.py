"""The Debian mirror, read from the host's own apt configuration at run time.

Both formats are understood: one-line ``*.list`` files (``deb [opts] URI SUITE
COMPONENT...``) and deb822 ``*.sources`` files. No mirror host name is written
anywhere in this project: nodes and the base image use whatever the host uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from aicluster.testbed.errors import TestbedError

#: The Debian release the nodes run.
SUITE = "bookworm"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass
class SourceEntry:
    """One apt source: types (deb, deb-src), URIs, suites and components."""

    types: list[str]
    uris: list[str]
    suites: list[str]
    components: list[str] = field(default_factory=list)


@dataclass
class Mirror:
    """The mirrors nodes use: the main archive and (if the host has one) the security one."""

    url: str
    components: list[str]
    security_url: str | None = None

    @property
    def repositories(self) -> list[str]:
        """Every distinct repository URL (main first)."""
        urls = [self.url]
        if self.security_url and self.security_url not in urls:
            urls.append(self.security_url)
        return urls


def parse_one_line(text: str) -> list[SourceEntry]:
    """Parse the one-line format of ``sources.list`` / ``*.list``."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        rest = rest.strip()
        if rest.startswith("["):  # options: deb [arch=amd64 signed-by=...] URI ...
            rest = rest.partition("]")[2]
        words = [kind, *rest.split()]
        if len(words) < 3 or words[0] not in ("deb", "deb-src"):
            continue
        entries.append(SourceEntry([words[0]], [words[1]], [words[2]], words[3:]))
    return entries


def parse_deb822(text: str) -> list[SourceEntry]:
    """Parse the deb822 format of ``*.sources`` (stanzas separated by blank lines)."""
    entries = []
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last_key: str | None = None
    for raw in text.splitlines() + [""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if current:
                stanzas.append(current)
            current, last_key = {}, None
            continue
        if raw[0] in " \t":  # continuation line (multi-line fields such as Signed-By)
            if last_key is not None:
                current[last_key] += "\n" + raw.strip()
            continue
        key, sep, value = raw.partition(":")
        if not sep:
            continue
        last_key = key.strip().lower()
        current[last_key] = value.strip()
    for stanza in stanzas:
        if stanza.get("enabled", "yes").strip().lower() == "no":
            continue
        types, uris, suites = (stanza.get(k, "").split() for k in ("types", "uris", "suites"))
        if types and uris and suites:
            entries.append(SourceEntry(types, uris, suites, stanza.get("components", "").split()))
    return entries


def read_host_sources(root: Path = Path("/")) -> list[SourceEntry]:
    """All apt sources of the host under *root*: sources.list, then sources.list.d/*.list
    and *.sources in name order (files with other suffixes are ignored, as apt does)."""
    etc = root / "etc" / "apt"
    entries: list[SourceEntry] = []
    main = etc / "sources.list"
    if main.is_file():
        entries += parse_one_line(main.read_text(errors="replace"))
    parts = etc / "sources.list.d"
    if parts.is_dir():
        for path in sorted(parts.iterdir()):
            if path.suffix == ".list" and path.is_file():
                entries += parse_one_line(path.read_text(errors="replace"))
            elif path.suffix == ".sources" and path.is_file():
                entries += parse_deb822(path.read_text(errors="replace"))
    return entries


def _usable(uri: str) -> bool:
    return urlsplit(uri).scheme in ("http", "https")


def find_mirror(entries: list[SourceEntry], suite: str = SUITE) -> Mirror:
    """Pick the Debian mirror for *suite* (and its ``-security`` one) from *entries*.

    The main mirror is the first binary (``deb``) source whose suites include
    *suite*; failing that, the first one carrying a plain release suite (no ``-``).
    """
    debs = [e for e in entries if "deb" in e.types and any(_usable(u) for u in e.uris)]
    main = next((e for e in debs if suite in e.suites), None)
    if main is None:
        main = next((e for e in debs if any("-" not in s for s in e.suites)), None)
    if main is None:
        raise TestbedError(
            "cannot find a Debian mirror in the host's apt sources "
            "(/etc/apt/sources.list, /etc/apt/sources.list.d/*.list and *.sources)"
        )
    url = next(u for u in main.uris if _usable(u)).rstrip("/")
    security = next((e for e in debs if any(s.endswith("-security") for s in e.suites)), None)
    security_url = None
    if security is not None:
        security_url = next(u for u in security.uris if _usable(u)).rstrip("/")
    return Mirror(url=url, components=main.components or ["main"], security_url=security_url)


def host_mirror(root: Path = Path("/")) -> Mirror:
    """The mirror the host's own apt configuration uses."""
    return find_mirror(read_host_sources(root))


def node_url(url: str) -> str:
    """The URL a node puts in its sources: plain http (its apt goes through our proxy,
    which fetches from the original URL, https included)."""
    parts = urlsplit(url)
    return urlunsplit(("http", parts.netloc, parts.path.rstrip("/"), "", ""))


def node_sources(mirror: Mirror, suite: str = SUITE) -> str:
    """The deb822 ``debian.sources`` a node gets: the host's mirror, over http."""
    comps = " ".join(mirror.components)
    text = (
        f"Types: deb\nURIs: {node_url(mirror.url)}\nSuites: {suite} {suite}-updates\n"
        f"Components: {comps}\nSigned-By: {KEYRING}\n"
    )
    if mirror.security_url:
        text += (
            f"\nTypes: deb\nURIs: {node_url(mirror.security_url)}\nSuites: {suite}-security\n"
            f"Components: {comps}\nSigned-By: {KEYRING}\n"
        )
    return text
