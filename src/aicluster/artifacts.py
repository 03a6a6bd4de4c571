"""Pinned release artifacts (k3s, MinIO, Ollama ...): resolved from the inventory,
downloaded once on the deploying machine, verified by sha256, then pushed to nodes.

A component that installs a vendor release pins it in its defaults
(``roles/<c>/defaults/main.yml``), next to ``<c>_version``::

    minio_version: "2025-04-22T22-12-26Z"
    minio_artifacts:
      minio:                                   # the artifact's name within the component
        url: "https://<vendor>/server/minio/release/linux-{arch}/archive/minio.RELEASE.{version}"
        sha256:                                # pinned per version, then per architecture
          "2025-04-22T22-12-26Z":
            amd64: "<64 hex digits>"
            arm64: "<64 hex digits>"
        groups: [minio]                        # optional: only hosts of these groups need it

A component that ships several vendors' releases gives an artifact its own version
and base URL settings: ``version_setting`` names the setting holding its version (default
``<c>_version``), ``base_url_setting`` the one ``{base_url}`` reads (default
``<c>_release_base_url``); ``enabled_by`` names a boolean setting that must be true on
a host for the host to need the artifact (Grafana: ``monitoring_grafana``).

``url`` is a pattern (or a mapping architecture -> pattern, for vendors whose file
names differ by architecture) with the placeholders ``{version}``, ``{arch}``
(``amd64``/``arm64``), ``{name}``, ``{version_quoted}`` (the version URL-quoted:
``1.31.4+k3s1`` -> ``1.31.4%2Bk3s1``) and ``{base_url}`` (the component's
``<c>_release_base_url`` setting, so that a site points at a mirror of the vendor's
releases without pinning the checksums again). An optional ``filename`` pattern names the file
when the URL's last part does not. A version with no sha256 pinned for an
architecture a host has is refused before anything is downloaded.

For each component a host is given, for each architecture among those hosts
(``hardware.arch``, default ``amd64``), :func:`needed` lists the artifacts with their
URL and checksum; :class:`Store` finds each one

1. in the inventory's ``artifacts_dir`` (a local directory, for sites without
   internet; filled on a connected machine by ``aicluster artifacts fetch``): as
   ``<component>/<version>/<arch>/<file name>`` (the layout ``fetch`` writes), as
   ``<file name>`` or as ``<sha256>``. A file there with another checksum is an error;
2. in the cache (``artifacts_cache_dir``, else ``$AICLUSTER_ARTIFACTS_CACHE``, else
   ``~/.cache/aicluster/artifacts``), stored under its sha256;
3. else downloads it into the cache: to ``<sha256>.part`` first, resumed with an HTTP
   Range request after an interruption, verified, and only then moved into place.
   A wrong checksum deletes the partial file and raises an error naming the artifact,
   the URL and both checksums.

:func:`resolve_cluster` does this for every artifact of the inventory at once, before
any host is touched, and raises one :class:`ArtifactError` listing every artifact that
is missing or wrong (and how to fill an artifact directory). Both engines call it:
pyinfra's ``deploy.py`` first thing, Ansible in the first play of ``site.yml``
(``python -m aicluster.artifacts ensure INVENTORY``). Then :func:`put` (pyinfra) or the
``<c>_artifact_files`` values of :func:`derived_vars` (Ansible's ``copy``) push the very
same file to the nodes; both compare checksums, so an unchanged file is not sent again.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import io
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from aicluster import ROLES_DIR, __version__, dryrun

#: Architectures artifacts are pinned for (Debian's names, as vendors use them).
ARCHES = ("amd64", "arm64")
#: ``uname -m`` (and Ansible's ``ansible_architecture``) -> the architecture's name.
MACHINE_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
CACHE_ENV = "AICLUSTER_ARTIFACTS_CACHE"
#: ``AICLUSTER_PROGRESS=1`` shows download progress when stderr is not a terminal.
PROGRESS_ENV = "AICLUSTER_PROGRESS"
FETCH_HINT = (
    "on a machine with internet access run `aicluster artifacts fetch INVENTORY --dest DIR`, "
    "copy DIR to the deploying machine and name it in the inventory as artifacts_dir"
)
SPEC_KEYS = frozenset({"url", "sha256", "groups", "filename", "version_setting",
                       "base_url_setting", "enabled_by"})
PLACEHOLDERS = ("version", "arch", "name", "version_quoted", "base_url")
CHUNK = 1024 * 1024
HEX = frozenset("0123456789abcdef")


class ArtifactError(Exception):
    """An artifact cannot be had, or its pin is malformed. The message names the
    artifact (component, name, version, architecture) and what to do."""


@dataclass(frozen=True)
class Artifact:
    """One file of one release for one architecture, with its pinned checksum."""

    component: str
    name: str
    version: str
    arch: str
    url: str
    sha256: str
    filename: str
    #: The hosts that need it.
    hosts: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.component, self.name, self.version, self.arch)

    @property
    def label(self) -> str:
        return f"{self.component}/{self.name} {self.version} ({self.arch})"

    @property
    def relpath(self) -> str:
        """Where ``aicluster artifacts fetch`` puts it in an artifact directory."""
        return f"{self.component}/{self.version}/{self.arch}/{self.filename}"


# ---------------------------------------------------------------------------
# What the inventory needs (no I/O but reading the roles' defaults)
# ---------------------------------------------------------------------------

_DEFAULTS: dict[str, dict[str, Any]] = {}


def _defaults(component: str) -> dict[str, Any]:
    """The component's defaults, or {} when the role has none (not built yet)."""
    if component not in _DEFAULTS:
        from aicluster.render import defaults

        path = ROLES_DIR / component / "defaults" / "main.yml"
        _DEFAULTS[component] = defaults(component) if path.exists() else {}
    return _DEFAULTS[component]


def component_vars(component: str, data: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(<c>_version, <c>_artifacts)`` for a host: its data over the role's defaults."""
    base = _defaults(component)
    version_key, spec_key = f"{component}_version", f"{component}_artifacts"
    return data.get(version_key, base.get(version_key)), data.get(spec_key, base.get(spec_key))


def release_base_url(component: str, data: Mapping[str, Any], key: str | None = None
                     ) -> str | None:
    """``<c>_release_base_url`` (or the setting ``key`` names) for a host (its data over
    the role's defaults): what a ``{base_url}`` in the component's URL patterns stands
    for; None when not set."""
    key = key or f"{component}_release_base_url"
    value = data.get(key, _defaults(component).get(key))
    return str(value).rstrip("/") if value else None


def _spec_setting(component: str, spec: Any, field_name: str, data: Mapping[str, Any]
                  ) -> tuple[str | None, Any]:
    """The setting a pin's ``version_setting`` / ``enabled_by`` names and its value for a
    host (its data over the role's defaults); (None, None) when the pin names none."""
    key = spec.get(field_name) if isinstance(spec, Mapping) else None
    if not key:
        return None, None
    return str(key), data.get(str(key), _defaults(component).get(str(key)))


def normalize_arch(value: Any) -> str:
    """``x86_64`` -> ``amd64``, ``aarch64`` -> ``arm64``; anything else is an error."""
    arch = MACHINE_ARCH.get(str(value).strip().lower())
    if arch is None:
        raise ArtifactError(
            f"architecture {value!r} is not supported; known: {', '.join(ARCHES)} "
            "(x86_64, aarch64)"
        )
    return arch


def host_arch(cluster: Any, host_name: str) -> str:
    """The host's architecture as the inventory declares it (``hardware.arch``)."""
    return getattr(cluster.hosts[host_name].spec.hardware, "arch", "amd64")


def _format(pattern: str, values: Mapping[str, str], where: str) -> str:
    try:
        return pattern.format_map(values)
    except (KeyError, IndexError, ValueError) as exc:
        raise ArtifactError(
            f"{where}: {pattern!r} is not a pattern with only the placeholders "
            f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} ({type(exc).__name__}: {exc})"
        ) from None


def artifact_from_spec(
    component: str,
    name: str,
    spec: Any,
    version: Any,
    arch: str,
    *,
    where: str = "",
    hosts: tuple[str, ...] = (),
    base_url: str | None = None,
) -> Artifact:
    """The artifact one pin gives for ``version`` and ``arch`` (``base_url``: what
    ``{base_url}`` stands for); a malformed pin, or a version or architecture with no
    checksum pinned, raises :class:`ArtifactError` naming the field."""
    fld = f"{component}_artifacts.{name}"
    where = f"{where}: {fld}" if where else fld
    if not isinstance(spec, Mapping):
        raise ArtifactError(f"{where}: must be a mapping with url and sha256")
    unknown = sorted(set(map(str, spec)) - SPEC_KEYS)
    if unknown:
        raise ArtifactError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(SPEC_KEYS))}"
        )
    if not version or not isinstance(version, str):
        version_key = spec.get("version_setting") or f"{component}_version"
        raise ArtifactError(f"{where}: {version_key} is not set; pin the version")
    url_spec = spec.get("url")
    if isinstance(url_spec, Mapping):
        if arch not in url_spec:
            raise ArtifactError(f"{where}.url: no URL pattern for {arch}")
        url_spec = url_spec[arch]
    if not isinstance(url_spec, str) or not url_spec.startswith(
            ("https://", "http://", "{base_url}/")):
        raise ArtifactError(
            f"{where}.url: {url_spec!r} is not an http(s) URL pattern (or a mapping "
            "architecture -> pattern)"
        )
    base_key = spec.get("base_url_setting") or f"{component}_release_base_url"
    if "{base_url}" in url_spec and not base_url:
        raise ArtifactError(
            f"{where}.url: {url_spec!r} uses {{base_url}}, but {base_key} "
            "is not set; set it to the URL the vendor's releases are under"
        )
    values = {
        "version": version,
        "arch": arch,
        "name": name,
        "version_quoted": urllib.parse.quote(version, safe=""),
        "base_url": base_url or "",
    }
    url = _format(url_spec, values, f"{where}.url")
    if not url.startswith(("https://", "http://")):
        raise ArtifactError(
            f"{where}.url: {url!r} is not an http(s) URL ({base_key} is {base_url!r})"
        )
    sums = spec.get("sha256")
    if not isinstance(sums, Mapping) or not all(isinstance(v, Mapping) for v in sums.values()):
        raise ArtifactError(
            f"{where}.sha256: must map each pinned version to {{architecture: sha256}}"
        )
    pinned = {str(k): v for k, v in sums.items()}
    if version not in pinned:
        known = ", ".join(sorted(pinned)) or "none"
        raise ArtifactError(
            f"{where}.sha256: no checksum pinned for version {version!r} (pinned: {known}); "
            f"add the vendor's published sha256 for {version} before deploying it"
        )
    digest = pinned[version].get(arch)
    if digest is None:
        raise ArtifactError(
            f"{where}.sha256.{version}: no checksum pinned for {arch}; pinned for: "
            f"{', '.join(sorted(map(str, pinned[version]))) or 'none'}"
        )
    digest = str(digest).strip().lower()
    if len(digest) != 64 or not set(digest) <= HEX:
        raise ArtifactError(f"{where}.sha256.{version}.{arch}: not a sha256 (64 hex digits)")
    filename = spec.get("filename")
    if filename is not None:
        if not isinstance(filename, str):
            raise ArtifactError(f"{where}.filename: must be a file name pattern")
        filename = _format(filename, values, f"{where}.filename")
    else:
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not filename or "/" in filename or filename in (".", ".."):
        raise ArtifactError(
            f"{where}: the URL {url} names no file; give the file name as `filename`"
        )
    return Artifact(component, name, version, arch, url, digest, filename, hosts)


def _groups_of(spec: Any) -> tuple[str, ...] | None:
    groups = spec.get("groups") if isinstance(spec, Mapping) else None
    if groups is None:
        return None
    if isinstance(groups, str):
        return (groups,)
    return tuple(map(str, groups))


def host_artifacts(
    cluster: Any, host_name: str, component: str, data: Mapping[str, Any] | None = None
) -> dict[str, Artifact]:
    """The artifacts of ``component`` that ``host_name`` needs, by name."""
    host = cluster.hosts[host_name]
    version, specs = component_vars(component, host.data if data is None else data)
    if not specs:
        return {}
    where = f"host {host_name!r}"
    if not isinstance(specs, Mapping):
        raise ArtifactError(f"{where}: {component}_artifacts: must map names to pins")
    arch = host_arch(cluster, host_name)
    values = host.data if data is None else data
    out = {}
    for name, spec in specs.items():
        groups = _groups_of(spec)
        if groups is not None and not set(groups) & set(host.groups):
            continue
        switch, enabled = _spec_setting(component, spec, "enabled_by", values)
        if switch is not None and not enabled:
            continue
        own_key, own_version = _spec_setting(component, spec, "version_setting", values)
        base_key = spec.get("base_url_setting") if isinstance(spec, Mapping) else None
        out[str(name)] = artifact_from_spec(
            component, str(name), spec, own_version if own_key else version, arch,
            where=where, hosts=(host_name,),
            base_url=release_base_url(component, values, str(base_key) if base_key else None),
        )
    return out


def needed(cluster: Any, components: Iterable[str] | None = None) -> list[Artifact]:
    """Every artifact the inventory needs: for each component a host is given, each
    (name, version, architecture) once, with the hosts that need it. Malformed pins
    raise one :class:`ArtifactError` listing every problem."""
    wanted = set(components) if components is not None else None
    found: dict[tuple[str, str, str, str], Artifact] = {}
    errors: list[str] = []
    for host_name, host in cluster.hosts.items():
        for component in host.components():
            if wanted is not None and component not in wanted:
                continue
            try:
                arts = host_artifacts(cluster, host_name, component)
            except ArtifactError as exc:
                errors.append(str(exc))
                continue
            for art in arts.values():
                have = found.get(art.key)
                if have is None:
                    found[art.key] = art
                elif have != art:
                    errors.append(
                        f"host {host_name!r}: {component}_artifacts.{art.name}: pins "
                        f"{art.label} as {art.url} sha256 {art.sha256}, host "
                        f"{have.hosts[0]!r} as {have.url} sha256 {have.sha256}; give one pin"
                    )
                else:
                    found[art.key] = replace(have, hosts=(*have.hosts, host_name))
    if errors:
        raise ArtifactError("\n".join(_unique(errors)))
    return sorted(found.values(), key=lambda a: a.key)


def validate(cluster: Any, component: str | None = None) -> list[str]:
    """The inventory's artifact pins (of one component, or all), checked without any I/O
    (host and field named)."""
    try:
        needed(cluster, None if component is None else [component])
    except ArtifactError as exc:
        return str(exc).splitlines()
    return []


def _unique(lines: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(lines))


# ---------------------------------------------------------------------------
# Where the files are: the artifact directory, the cache, the network
# ---------------------------------------------------------------------------


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "aicluster" / "artifacts"


_SUMS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """The file's sha256, computed once per (path, size, mtime)."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SUMS:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                digest.update(chunk)
        _SUMS[key] = digest.hexdigest()
    return _SUMS[key]


def _mib(n: int) -> str:
    return f"{n / 1024**2:.1f} MiB"


class Progress:
    """A download's progress on stderr: one line, rewritten in place on a terminal, at
    most every ``interval`` seconds (and once at the end)."""

    def __init__(
        self,
        label: str,
        total: int | None,
        done: int,
        stream: IO[str],
        interval: float = 0.5,
    ):
        self.label, self.total, self.done = label, total, done
        self.stream, self.interval = stream, interval
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last = 0.0

    def _line(self) -> str:
        if self.total:
            pct = 100 * self.done // self.total
            return f"{self.label}: {pct:3d}% {_mib(self.done)} of {_mib(self.total)}"
        return f"{self.label}: {_mib(self.done)}"

    def _emit(self) -> None:
        end = "" if self.tty else "\n"
        start = "\r\x1b[K" if self.tty else ""
        self.stream.write(f"{start}{self._line()}{end}")
        self.stream.flush()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._emit()

    def finish(self) -> None:
        self._emit()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class _Retry(Exception):
    """A transient failure: try again, resuming."""


@dataclass
class Store:
    """Finds, downloads and verifies artifacts on the deploying machine."""

    cache_dir: Path = field(default_factory=default_cache_dir)
    artifacts_dir: Path | None = None
    #: True/False shows/hides progress; None: when stderr is a terminal or
    #: AICLUSTER_PROGRESS=1.
    progress: bool | None = None
    stream: IO[str] | None = None
    #: Seconds a connection or a read may wait; attempts per download (each resuming).
    timeout: float = 60.0
    attempts: int = 4
    backoff: float = 2.0
    #: Whether downloads are allowed at all.
    download: bool = True
    opener: Callable[..., Any] = field(default=urllib.request.urlopen)

    def __post_init__(self) -> None:
        self.cache_dir = Path(self.cache_dir).expanduser()
        if self.artifacts_dir is not None:
            self.artifacts_dir = Path(self.artifacts_dir).expanduser()
        #: Set after a download failed to connect at all: others are not tried.
        self.offline_reason: str | None = None

    @classmethod
    def from_cluster(cls, cluster: Any, **kwargs: Any) -> Store:
        """The store the inventory names (``artifacts_dir``, ``artifacts_cache_dir``)."""
        spec = cluster.spec
        cache = getattr(spec, "artifacts_cache_dir", None)
        directory = getattr(spec, "artifacts_dir", None)
        kwargs.setdefault("cache_dir", Path(cache) if cache else default_cache_dir())
        kwargs.setdefault("artifacts_dir", Path(directory) if directory else None)
        return cls(**kwargs)

    # -- looking -------------------------------------------------------------

    def cache_path(self, art: Artifact) -> Path:
        return self.cache_dir / art.sha256

    def local_candidates(self, art: Artifact) -> list[Path]:
        if self.artifacts_dir is None:
            return []
        d = self.artifacts_dir
        return [d / art.relpath, d / art.filename, d / art.sha256]

    def expected_path(self, art: Artifact) -> Path:
        """Where the verified file is, or will be once :meth:`ensure` has run: the
        artifact directory's file with the right checksum, else the cache's. Never
        raises (a wrong file is :meth:`ensure`'s error to report)."""
        try:
            path, _where = self.find(art)
        except ArtifactError:
            path = None
        return path or self.cache_path(art)

    def find(self, art: Artifact) -> tuple[Path | None, str]:
        """The verified local file (and where it was found: ``artifacts_dir`` or
        ``cache``), or (None, ""). A file in the artifact directory with another
        checksum, and none with the right one, is an error."""
        wrong = []
        for path in self.local_candidates(art):
            if path.is_file():
                actual = file_sha256(path)
                if actual == art.sha256:
                    return path, "artifacts_dir"
                wrong.append(f"{path} has sha256 {actual}")
        if wrong:
            raise ArtifactError(
                f"{art.label}: wrong checksum in the artifact directory: {'; '.join(wrong)}; "
                f"expected sha256 {art.sha256} ({art.url}). Replace the file with the "
                "pinned release (aicluster artifacts fetch INVENTORY --dest DIR)"
            )
        cached = self.cache_path(art)
        if cached.is_file():
            if file_sha256(cached) == art.sha256:
                return cached, "cache"
            if not dryrun.is_dry():  # (a dry run leaves it for the real one)
                cached.unlink()  # damaged in the cache: fetched again
        return None, ""

    def status(self, art: Artifact) -> str:
        """``artifacts_dir``, ``cache``, ``missing`` or what is wrong (for listing)."""
        try:
            path, where = self.find(art)
        except ArtifactError as exc:
            return f"wrong checksum ({str(exc).split(': ', 2)[-1].split(';')[0]})"
        return where if path else "missing"

    # -- getting -------------------------------------------------------------

    def ensure(self, art: Artifact) -> Path:
        """The verified local file of ``art``: found, or downloaded into the cache."""
        path, _where = self.find(art)
        if path is not None:
            return path
        if dryrun.is_dry():
            dryrun.would(f"download {art.label} from {art.url} (sha256 {art.sha256}) into "
                         f"{self.cache_path(art)}")
            return self.cache_path(art)
        if not self.download:
            raise ArtifactError(f"{art.label}: not found locally and downloads are off")
        if self.offline_reason:
            raise ArtifactError(f"{art.label}: not downloaded: {self.offline_reason}")
        return self._download(art)

    def resolve(self, artifacts: Iterable[Artifact]) -> dict[tuple[str, str, str, str], Path]:
        """Every artifact's verified local file, or one error listing all that cannot
        be had (nothing is half done: resolution comes before any host is touched)."""
        out, problems = {}, []
        for art in artifacts:
            try:
                out[art.key] = self.ensure(art)
            except ArtifactError as exc:
                problems.append((art, str(exc)))
        if problems:
            raise ArtifactError(self._report(problems))
        return out

    def _report(self, problems: list[tuple[Artifact, str]]) -> str:
        lines = [f"{len(problems)} release artifact(s) cannot be had; nothing was installed:"]
        for art, why in problems:
            hosts = ", ".join(repr(h) for h in art.hosts)
            lines.append(f"  - {why}" + (f" (needed by host(s) {hosts})" if hosts else ""))
            lines.append(f"    {art.url} sha256 {art.sha256}")
        where = [f"the artifact directory {self.artifacts_dir}"] if self.artifacts_dir else []
        where.append(f"the cache {self.cache_dir}")
        lines.append(f"Looked in {' and '.join(where)}. To fill an artifact directory: "
                     f"{FETCH_HINT}.")
        return "\n".join(lines)

    def _show_progress(self) -> bool:
        if self.progress is not None:
            return self.progress
        if os.environ.get(PROGRESS_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
            return True
        return bool(getattr(sys.stderr, "isatty", lambda: False)())

    @contextmanager
    def _lock(self, art: Artifact):
        import fcntl

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # One lock for the cache: concurrent deploys download one file at a time.
        with open(self.cache_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _download(self, art: Artifact) -> Path:
        final = self.cache_path(art)
        part = self.cache_dir / f"{art.sha256}.part"
        with self._lock(art):
            if final.is_file() and file_sha256(final) == art.sha256:  # another process
                return final
            resumed = part.exists() and part.stat().st_size > 0
            self._transfer(art, part)
            actual = file_sha256(part)
            if actual != art.sha256 and resumed:
                # The partial file came from an earlier run: start once from zero.
                part.unlink()
                self._transfer(art, part)
                actual = file_sha256(part)
            if actual != art.sha256:
                part.unlink()
                raise ArtifactError(
                    f"{art.label}: wrong checksum for {art.url}: expected sha256 "
                    f"{art.sha256}, got {actual}; the download was deleted. If the vendor "
                    f"republished {art.version}, check and pin its published checksum"
                )
            os.replace(part, final)
        return final

    def _transfer(self, art: Artifact, part: Path) -> None:
        """Download into ``part``, resuming what is there; bounded attempts."""
        last = ""
        for attempt in range(max(1, self.attempts)):
            if attempt:
                time.sleep(self.backoff * attempt)
            try:
                self._once(art, part)
                return
            except _Retry as exc:
                last = str(exc)
        raise ArtifactError(
            f"{art.label}: download from {art.url} failed after {max(1, self.attempts)} "
            f"attempt(s): {last}; the partial download is kept in {part} and resumed next time"
        )

    def _once(self, art: Artifact, part: Path) -> None:
        have = part.stat().st_size if part.exists() else 0
        request = urllib.request.Request(
            art.url, headers={"User-Agent": f"aicluster/{__version__}"}
        )
        if have:
            request.add_header("Range", f"bytes={have}-")
        try:
            response = self.opener(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 416 and have:  # the partial file is already whole (or longer)
                return
            if exc.code in (408, 429) or exc.code >= 500:
                raise _Retry(f"HTTP {exc.code} {exc.reason}") from None
            raise ArtifactError(
                f"{art.label}: download from {art.url} failed: HTTP {exc.code} {exc.reason}"
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            if have == 0 and isinstance(exc, urllib.error.URLError):
                # No connection at all: the deploying machine is offline.
                netloc = urllib.parse.urlsplit(art.url).netloc
                self.offline_reason = f"cannot reach {netloc} ({reason})"
                raise ArtifactError(
                    f"{art.label}: not downloaded: {self.offline_reason}"
                ) from None
            raise _Retry(f"{type(exc).__name__}: {reason}") from None
        with response:
            status = getattr(response, "status", 200)
            length = response.headers.get("Content-Length")
            if have and status == 206:
                start = _range_start(response.headers.get("Content-Range"))
                if start != have:
                    part.unlink()
                    raise _Retry(f"the server resumed at byte {start}, not {have}")
                mode = "ab"
            else:
                have, mode = 0, "wb"
            total = have + int(length) if length and length.isdigit() else None
            progress = None
            if self._show_progress():
                progress = Progress(f"downloading {art.label}", total, have,
                                    self.stream or sys.stderr)
            try:
                with open(part, mode) as out:
                    while True:
                        chunk = response.read(CHUNK)
                        if not chunk:
                            break
                        out.write(chunk)
                        if progress:
                            progress.update(len(chunk))
            except (OSError, http.client.HTTPException) as exc:
                raise _Retry(f"interrupted: {type(exc).__name__}: {exc}") from None
            finally:
                if progress:
                    progress.finish()
            size = part.stat().st_size
            if total is not None and size < total:
                raise _Retry(f"the connection closed at byte {size} of {total}")


def _range_start(content_range: str | None) -> int | None:
    # "bytes 100-199/200"
    try:
        return int(str(content_range).split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


# ---------------------------------------------------------------------------
# Both engines: resolve up front, then push
# ---------------------------------------------------------------------------

_RESOLVED: dict[tuple[Any, ...], dict[tuple[str, str, str, str], Path]] = {}


def resolve_cluster(cluster: Any, store: Store | None = None) -> dict[tuple, Path]:
    """Every artifact the inventory needs, verified on the deploying machine (found or
    downloaded once); raises :class:`ArtifactError` listing all that cannot be had.
    Remembered for the process, so each host of a deploy does not check again."""
    arts = needed(cluster)
    store = store or Store.from_cluster(cluster)
    key = (tuple(arts), str(store.cache_dir), str(store.artifacts_dir))
    if key not in _RESOLVED:
        _RESOLVED[key] = store.resolve(arts)
    return _RESOLVED[key]


def derived_vars(
    cluster: Any, host_name: str, component: str, data: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``<c>_artifact_files``: name -> {path, sha256, url, version, arch, filename}, the
    local file on the deploying machine each of the host's artifacts is (or, once
    ``ensure`` has run, will be) at, for a component's ``derived_vars`` (Ansible copies
    ``path`` to the node). Nothing is downloaded here."""
    store = Store.from_cluster(cluster)
    return {
        f"{component}_artifact_files": {
            name: {
                "path": str(store.expected_path(art)),
                "sha256": art.sha256,
                "url": art.url,
                "version": art.version,
                "arch": art.arch,
                "filename": art.filename,
            }
            for name, art in host_artifacts(cluster, host_name, component, data).items()
        }
    }


def put(
    component: str,
    name: str,
    dest: str,
    *,
    mode: str = "755",
    user: str = "root",
    group: str = "root",
    op_name: str | None = None,
):
    """Upload the artifact ``name`` of ``component`` to the current pyinfra host (a
    pyinfra op). pyinfra's ``files.put`` compares the node's file checksum with the
    local one, so an unchanged file is not sent again (the op then changes nothing).
    The node's ``uname -m`` must match the inventory's ``hardware.arch``."""
    from pyinfra import host
    from pyinfra.api.exceptions import DeployError
    from pyinfra.facts.server import Arch
    from pyinfra.operations import files

    from aicluster.common.ops import current_cluster

    cluster = current_cluster()
    arts = host_artifacts(cluster, host.name, component, host.data.dict())
    if name not in arts:
        raise DeployError(f"{component}: host {host.name!r} needs no artifact {name!r}")
    art = arts[name]
    machine = host.get_fact(Arch)
    try:
        actual = normalize_arch(machine)
    except ArtifactError:
        actual = str(machine)
    if actual != art.arch:
        raise DeployError(
            f"{component}: host {host.name!r} is {machine} but hardware.arch says {art.arch}; "
            "correct hardware.arch in the inventory"
        )
    try:
        path = resolve_cluster(cluster)[art.key]
    except ArtifactError as exc:
        raise DeployError(str(exc)) from None
    if dryrun.is_dry() and not path.is_file():
        # Not downloaded (a dry run): planned as an upload of a placeholder, never sent.
        return files.put(
            name=(op_name or f"Install {art.label} at {dest}") + " (--dry: not downloaded)",
            src=io.BytesIO(f"aicluster --dry: {art.label} not downloaded\n".encode()),
            dest=dest,
            mode=mode,
            user=user,
            group=group,
        )
    return files.put(
        name=op_name or f"Install {art.label} at {dest}",
        src=str(path),
        dest=dest,
        mode=mode,
        user=user,
        group=group,
    )


def fetch(
    artifacts: Iterable[Artifact], store: Store, dest: Path | None = None,
    echo: Callable[[str], Any] = print,
) -> list[Path]:
    """Have every artifact in the store (downloading what is missing) and, with
    ``dest``, copy each into ``dest/<component>/<version>/<arch>/<file>`` and list it
    in ``dest/SHA256SUMS``; ``dest`` is then an artifact directory for offline sites."""
    arts = list(artifacts)
    if dest is None:
        paths = store.resolve(arts)
        for art in arts:
            echo(f"{art.label}: {paths[art.key]}")
        return [paths[a.key] for a in arts]
    dest = Path(dest).expanduser()
    there = {
        a.key for a in arts
        if (dest / a.relpath).is_file() and file_sha256(dest / a.relpath) == a.sha256
    }
    paths = store.resolve(a for a in arts if a.key not in there)
    out = []
    sums: dict[str, str] = {}
    sums_file = dest / "SHA256SUMS"
    if sums_file.is_file():
        for line in sums_file.read_text().splitlines():
            digest, _, rel = line.partition("  ")
            if rel:
                sums[rel] = digest
    for art in arts:
        target = dest / art.relpath
        if art.key in there:
            echo(f"{art.label}: {target} (already there)")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".part")
            shutil.copyfile(paths[art.key], tmp)
            os.replace(tmp, target)
            echo(f"{art.label}: {target}")
        sums[art.relpath] = art.sha256
        out.append(target)
    if arts:
        dest.mkdir(parents=True, exist_ok=True)
        sums_file.write_text("".join(f"{d}  {r}\n" for r, d in sorted(sums.items())))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m aicluster.artifacts ensure INVENTORY``: what Ansible runs first."""
    from aicluster.inventory import InventoryError, load_cluster

    parser = argparse.ArgumentParser(prog="python -m aicluster.artifacts")
    sub = parser.add_subparsers(dest="command", required=True)
    ens = sub.add_parser("ensure", help="have every artifact of INVENTORY, verified")
    ens.add_argument("--dry", action=argparse.BooleanOptionalAction, default=False,
                     help="download nothing; name what would be downloaded (Ansible's "
                          "check mode)")
    ens.add_argument("inventory")
    args = parser.parse_args(argv)
    dryrun.set_dry(args.dry)
    try:
        cluster = load_cluster(args.inventory)
        paths = resolve_cluster(cluster)
    except (InventoryError, ArtifactError) as exc:
        print(f"aicluster: {exc}", file=sys.stderr)
        return 2
    missing = sum(1 for path in paths.values() if not path.is_file())
    if missing:
        print(f"{len(paths) - missing} release artifact(s) verified, {missing} not downloaded "
              "(--dry)")
    else:
        print(f"{len(paths)} release artifact(s) verified")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
