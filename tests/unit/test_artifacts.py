"""Release artifacts (aicluster.artifacts): pins read from the inventory, the download
cache, resume, checksums, the offline artifact directory and `aicluster artifacts`.

Every download comes from a local HTTP server in a thread on 127.0.0.1 (never an
outside host); the pins below are test fixtures for files these tests make, not the
checksums of any real release.
"""

from __future__ import annotations

import hashlib
import io
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from aicluster import artifacts
from aicluster.artifacts import Artifact, ArtifactError, Store, needed, resolve_cluster
from aicluster.cli import main
from aicluster.inventory import InventoryError, load_cluster

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB
OTHER = b"not the pinned release\n" * 100


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Server:
    """Serves ``files`` (path -> bytes), honours ``Range: bytes=N-``, and can drop the
    connection halfway through the first response for a path (``drop_once``)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.drop_once: set[str] = set()
        #: Paths answered once with 503 Service Unavailable.
        self.unavailable_once: set[str] = set()
        #: Paths served whole (200) even when a Range is asked for.
        self.ignore_range: set[str] = set()
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                data = server.files.get(self.path)
                if self.path in server.unavailable_once:
                    server.unavailable_once.discard(self.path)
                    self.send_error(503, "Service Unavailable")
                    return
                if data is None:
                    self.send_error(404, "Not Found")
                    return
                start = 0
                if rng and self.path not in server.ignore_range:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_error(416, "Range Not Satisfiable")
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.path in server.drop_once:
                    server.drop_once.discard(self.path)
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture
def closed_url() -> str:
    """An URL on 127.0.0.1 where nothing listens (a machine without network)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/minio/minio.1.0.0"


def art(url: str, data: bytes = PAYLOAD, **kw) -> Artifact:
    fields = dict(
        component="minio", name="minio", version="1.0.0", arch="amd64", url=url,
        sha256=sha(data), filename=url.rsplit("/", 1)[-1], hosts=("n1",),
    )
    fields.update(kw)
    return Artifact(**fields)


def store(tmp_path: Path, **kw) -> Store:
    kw.setdefault("progress", False)
    return Store(cache_dir=tmp_path / "cache", backoff=0, timeout=10, **kw)


# ---------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------


def test_good_checksum_is_cached_by_sha256_and_downloaded_once(server, tmp_path):
    server.files["/minio.1.0.0"] = PAYLOAD
    a = art(server.url("/minio.1.0.0"))
    path = store(tmp_path).ensure(a)
    assert path == tmp_path / "cache" / a.sha256
    assert path.read_bytes() == PAYLOAD
    assert store(tmp_path).ensure(a) == path
    assert server.requests == [("/minio.1.0.0", None)], "the second run downloaded again"


def test_wrong_checksum_is_an_error_and_leaves_nothing(server, tmp_path):
    server.files["/minio.1.0.0"] = OTHER
    a = art(server.url("/minio.1.0.0"), data=PAYLOAD)
    with pytest.raises(ArtifactError) as err:
        store(tmp_path).ensure(a)
    msg = str(err.value)
    assert "minio/minio 1.0.0 (amd64)" in msg
    assert a.url in msg
    assert f"expected sha256 {sha(PAYLOAD)}, got {sha(OTHER)}" in msg
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".lock"]


def test_interrupted_download_resumes_with_range(server, tmp_path):
    server.files["/minio.1.0.0"] = PAYLOAD
    server.drop_once.add("/minio.1.0.0")
    a = art(server.url("/minio.1.0.0"))
    path = store(tmp_path, attempts=2).ensure(a)
    assert path.read_bytes() == PAYLOAD
    half = len(PAYLOAD) // 2
    assert server.requests == [("/minio.1.0.0", None), ("/minio.1.0.0", f"bytes={half}-")]


def test_interrupted_download_is_kept_and_resumed_by_the_next_run(server, tmp_path):
    server.files["/minio.1.0.0"] = PAYLOAD
    server.drop_once.add("/minio.1.0.0")
    a = art(server.url("/minio.1.0.0"))
    with pytest.raises(ArtifactError, match="partial download is kept"):
        store(tmp_path, attempts=1).ensure(a)
    half = len(PAYLOAD) // 2
    part = tmp_path / "cache" / f"{a.sha256}.part"
    assert part.stat().st_size == half
    assert not (tmp_path / "cache" / a.sha256).exists()

    assert store(tmp_path, attempts=1).ensure(a).read_bytes() == PAYLOAD
    assert server.requests[-1] == ("/minio.1.0.0", f"bytes={half}-")
    assert not part.exists()


def test_a_transient_server_error_is_retried_a_bounded_number_of_times(server, tmp_path):
    server.files["/minio.1.0.0"] = PAYLOAD
    server.unavailable_once.add("/minio.1.0.0")
    a = art(server.url("/minio.1.0.0"))
    assert store(tmp_path, attempts=2).ensure(a).read_bytes() == PAYLOAD
    server.unavailable_once.add("/other")
    server.files["/other"] = PAYLOAD
    with pytest.raises(ArtifactError, match=r"failed after 1 attempt\(s\): HTTP 503"):
        store(tmp_path / "again", attempts=1).ensure(art(server.url("/other")))


def test_a_server_that_ignores_range_sends_the_whole_file_again(server, tmp_path):
    server.files["/minio.1.0.0"] = PAYLOAD
    server.ignore_range.add("/minio.1.0.0")
    a = art(server.url("/minio.1.0.0"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / f"{a.sha256}.part").write_bytes(PAYLOAD[:1000])
    assert store(tmp_path).ensure(a).read_bytes() == PAYLOAD
    assert server.requests == [("/minio.1.0.0", "bytes=1000-")]


def test_a_stale_partial_download_that_does_not_verify_starts_once_from_zero(server, tmp_path):
    server.files["/minio.1.0.0"] = PAYLOAD
    a = art(server.url("/minio.1.0.0"))
    (tmp_path / "cache").mkdir()
    # Left by an earlier run of another file: resuming it gives a wrong checksum.
    (tmp_path / "cache" / f"{a.sha256}.part").write_bytes(OTHER[:1000])
    assert store(tmp_path).ensure(a).read_bytes() == PAYLOAD
    assert server.requests == [("/minio.1.0.0", "bytes=1000-"), ("/minio.1.0.0", None)]


def test_a_damaged_cache_file_is_fetched_again(server, tmp_path):
    server.files["/minio.1.0.0"] = PAYLOAD
    a = art(server.url("/minio.1.0.0"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / a.sha256).write_bytes(b"bit rot")
    assert store(tmp_path).ensure(a).read_bytes() == PAYLOAD
    assert len(server.requests) == 1


def test_http_error_names_the_artifact_and_url(server, tmp_path):
    a = art(server.url("/nope"))
    with pytest.raises(ArtifactError, match=r"minio/minio 1\.0\.0 \(amd64\): download from "
                       r"http://127\.0\.0\.1:\d+/nope failed: HTTP 404"):
        store(tmp_path).ensure(a)


# ---------------------------------------------------------------------------
# The offline artifact directory
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["relpath", "filename", "sha256"])
def test_offline_directory_is_used_without_network(tmp_path, closed_url, layout):
    a = art(closed_url)
    offline = tmp_path / "offline"
    name = {"relpath": a.relpath, "filename": a.filename, "sha256": a.sha256}[layout]
    (offline / name).parent.mkdir(parents=True)
    (offline / name).write_bytes(PAYLOAD)
    s = store(tmp_path, artifacts_dir=offline)
    assert s.ensure(a) == offline / name
    assert s.status(a) == "artifacts_dir"
    assert not (tmp_path / "cache").exists(), "nothing was downloaded or cached"


def test_wrong_checksum_in_the_offline_directory_is_an_error(tmp_path, closed_url):
    a = art(closed_url)
    offline = tmp_path / "offline"
    offline.mkdir()
    (offline / a.filename).write_bytes(OTHER)
    with pytest.raises(ArtifactError) as err:
        store(tmp_path, artifacts_dir=offline).ensure(a)
    msg = str(err.value)
    assert f"{offline / a.filename} has sha256 {sha(OTHER)}" in msg
    assert f"expected sha256 {a.sha256}" in msg
    assert store(tmp_path, artifacts_dir=offline).status(a) == (
        f"wrong checksum ({offline / a.filename} has sha256 {sha(OTHER)})"
    )
    assert not (tmp_path / "cache").exists(), "no download was tried"


def test_missing_artifacts_are_listed_with_how_to_fill_the_directory(tmp_path, closed_url):
    a = art(closed_url)
    b = art(closed_url.replace("minio.1.0.0", "mc.1.0.0"), data=OTHER, name="mc",
            filename="mc.1.0.0", hosts=("n1", "n2"))
    offline = tmp_path / "offline"
    offline.mkdir()
    with pytest.raises(ArtifactError) as err:
        store(tmp_path, artifacts_dir=offline).resolve([a, b])
    msg = str(err.value)
    assert msg.startswith("2 release artifact(s) cannot be had; nothing was installed:")
    assert "minio/minio 1.0.0 (amd64): not downloaded: cannot reach 127.0.0.1:" in msg
    assert "minio/mc 1.0.0 (amd64): not downloaded" in msg
    assert "needed by host(s) 'n1', 'n2'" in msg
    assert f"{a.url} sha256 {a.sha256}" in msg
    assert f"Looked in the artifact directory {offline} and the cache" in msg
    assert "aicluster artifacts fetch INVENTORY --dest DIR" in msg


# ---------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------


def test_progress_is_shown_when_asked(server, tmp_path):
    server.files["/minio.1.0.0"] = PAYLOAD
    out = io.StringIO()
    store(tmp_path, progress=True, stream=out).ensure(art(server.url("/minio.1.0.0")))
    lines = out.getvalue().splitlines()
    assert lines, "no progress shown"
    assert lines[-1] == "downloading minio/minio 1.0.0 (amd64): 100% 1.0 MiB of 1.0 MiB"


def test_progress_is_silent_when_stderr_is_not_a_terminal(server, tmp_path, capsys,
                                                           monkeypatch):
    monkeypatch.delenv(artifacts.PROGRESS_ENV, raising=False)
    server.files["/minio.1.0.0"] = PAYLOAD
    store(tmp_path, progress=None).ensure(art(server.url("/minio.1.0.0")))
    assert capsys.readouterr().err == ""


def test_progress_on_request_by_environment(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(artifacts.PROGRESS_ENV, "1")
    server.files["/minio.1.0.0"] = PAYLOAD
    store(tmp_path, progress=None).ensure(art(server.url("/minio.1.0.0")))
    assert "downloading minio/minio 1.0.0 (amd64): 100%" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Pins read from the inventory
# ---------------------------------------------------------------------------


def pin(url: str, version: str = "1.0.0", **sums: str) -> dict:
    return {"minio": {"url": url, "sha256": {version: sums or {"amd64": sha(PAYLOAD)}}}}


@pytest.fixture
def minio_spec(spec):
    """The conftest inventory with n1 and n2 in the minio group."""
    spec.set("groups.minio", ["n1", "n2"])
    spec.set("all.minio_version", "1.0.0")
    return spec


def test_needed_lists_each_artifact_once_per_architecture(minio_spec):
    url = "http://127.0.0.1:9/minio/linux-{arch}/minio.RELEASE.{version}"
    minio_spec.set("all.minio_artifacts", pin(url, amd64=sha(PAYLOAD), arm64=sha(OTHER)))
    minio_spec.hosts["n3"] = minio_spec.node(3)
    minio_spec.set("n3.hardware.arch", "aarch64")
    minio_spec.set("groups.minio", ["n1", "n2", "n3"])
    arts = needed(load_cluster(minio_spec.write()))
    assert [(a.label, a.url, a.sha256, a.hosts) for a in arts] == [
        ("minio/minio 1.0.0 (amd64)", "http://127.0.0.1:9/minio/linux-amd64/minio.RELEASE.1.0.0",
         sha(PAYLOAD), ("n1", "n2")),
        ("minio/minio 1.0.0 (arm64)", "http://127.0.0.1:9/minio/linux-arm64/minio.RELEASE.1.0.0",
         sha(OTHER), ("n3",)),
    ]
    assert arts[0].relpath == "minio/1.0.0/amd64/minio.RELEASE.1.0.0"


def test_per_architecture_urls_quoted_versions_and_groups(minio_spec):
    minio_spec.set("all.minio_version", "1.31.4+k3s1")
    minio_spec.set("all.minio_artifacts", {
        "server": {
            "url": {"amd64": "http://127.0.0.1:9/v{version_quoted}/k3s",
                    "arm64": "http://127.0.0.1:9/v{version_quoted}/k3s-arm64"},
            "sha256": {"1.31.4+k3s1": {"amd64": sha(PAYLOAD)}},
            "groups": ["minio"],
        },
        "images": {
            "url": "http://127.0.0.1:9/v{version_quoted}/images-{arch}.tar",
            "filename": "{name}-{version}-{arch}.tar",
            "sha256": {"1.31.4+k3s1": {"amd64": sha(OTHER)}},
            "groups": ["gpu_nodes"],
        },
    })
    arts = needed(load_cluster(minio_spec.write()))
    assert [(a.name, a.url, a.filename) for a in arts] == [
        ("server", "http://127.0.0.1:9/v1.31.4%2Bk3s1/k3s", "k3s"),
    ], "the images pin is only for gpu_nodes hosts, and there are none"


@pytest.mark.parametrize(
    "artifacts_value, field, wording",
    [
        (pin("http://127.0.0.1:9/minio.{version}", version="0.9.0"),
         "minio_artifacts.minio.sha256",
         "no checksum pinned for version '1.0.0' (pinned: 0.9.0); add the vendor's"),
        (pin("http://127.0.0.1:9/minio.{version}", arm64=sha(PAYLOAD)),
         "minio_artifacts.minio.sha256.1.0.0", "no checksum pinned for amd64; pinned for: arm64"),
        (pin("http://127.0.0.1:9/minio.{version}", amd64="abc"),
         "minio_artifacts.minio.sha256.1.0.0.amd64",
         "String should match pattern '^[0-9a-f]{64}$' (got 'abc')"),
        (pin("http://127.0.0.1:9/minio.{release}"),
         "minio_artifacts.minio.url", "is not a pattern with only the placeholders"),
        (pin("ftp://127.0.0.1/minio"), "minio_artifacts.minio.url",
         "'ftp://127.0.0.1/minio' is not an http(s) URL pattern"),
        (pin("http://127.0.0.1:9/dir/"), "minio_artifacts.minio",
         "names no file; give the file name as `filename`"),
        ({"minio": {"url": "http://127.0.0.1:9/m", "sha256": {}, "sha": 1}},
         "minio_artifacts.minio.sha", "Extra inputs are not permitted"),
    ],
    ids=["version-unpinned", "arch-unpinned", "not-hex", "bad-placeholder", "not-http",
         "no-filename", "unknown-key"],
)
def test_bad_pins_are_refused_naming_host_and_field(minio_spec, artifacts_value, field,
                                                     wording):
    minio_spec.set("all.minio_artifacts", artifacts_value)
    with pytest.raises(InventoryError) as err:
        load_cluster(minio_spec.write())
    assert len(err.value.errors) == 1, err.value.errors
    line = err.value.errors[0]
    assert line.startswith(f"host 'n1': {field}: "), line
    assert wording in line
    assert "(and on 1 more host(s): 'n2')" in line


@pytest.mark.parametrize(
    "path, value, field, wording",
    [
        ("all.artifacts_dir", "relative/dir", "artifacts_dir",
         "'relative/dir' is not an absolute path (a directory on the deploying machine)"),
        ("all.artifacts_cache_dir", "cache", "artifacts_cache_dir", "'cache' is not an absolute"),
        ("all.artifacts_dir", "FILE", "artifacts_dir", "exists and is not a directory"),
        ("n1.hardware.arch", "ppc64le", "hardware.arch", "Input should be 'amd64' or 'arm64'"),
    ],
)
def test_artifact_fields_are_validated(spec, tmp_path, path, value, field, wording):
    if value == "FILE":
        value = str(tmp_path / "a-file")
        Path(value).write_text("")
    spec.set(path, value)
    with pytest.raises(InventoryError) as err:
        load_cluster(spec.write())
    assert err.value.errors[0].startswith(f"host 'n1': {field}: "), err.value.errors
    assert wording in err.value.errors[0]


def test_a_missing_artifacts_dir_is_allowed_until_something_is_needed_from_it(spec, tmp_path):
    spec.set("all.artifacts_dir", str(tmp_path / "not-yet"))
    cluster = load_cluster(spec.write())
    assert cluster.spec.artifacts_dir == str(tmp_path / "not-yet")
    assert needed(cluster) == []


def test_derived_vars_give_ansible_the_path_of_the_same_file(minio_spec, tmp_path):
    minio_spec.set("all.minio_artifacts", pin("http://127.0.0.1:9/minio.{version}"))
    minio_spec.set("all.artifacts_cache_dir", str(tmp_path / "cache"))
    cluster = load_cluster(minio_spec.write())
    files = artifacts.derived_vars(cluster, "n2", "minio")["minio_artifact_files"]
    assert files == {"minio": {
        "path": str(tmp_path / "cache" / sha(PAYLOAD)), "sha256": sha(PAYLOAD),
        "url": "http://127.0.0.1:9/minio.1.0.0", "version": "1.0.0", "arch": "amd64",
        "filename": "minio.1.0.0",
    }}

    # With an artifact directory holding the right file, Ansible copies that one; a
    # file of the same name with another checksum is not chosen (ensure reports it).
    offline = tmp_path / "offline"
    (offline / "minio/1.0.0/amd64").mkdir(parents=True)
    (offline / "minio.1.0.0").write_bytes(OTHER)
    (offline / "minio/1.0.0/amd64/minio.1.0.0").write_bytes(PAYLOAD)
    minio_spec.set("all.artifacts_dir", str(offline))
    cluster = load_cluster(minio_spec.write())
    files = artifacts.derived_vars(cluster, "n1", "minio")["minio_artifact_files"]
    assert files["minio"]["path"] == str(offline / "minio/1.0.0/amd64/minio.1.0.0")
    (offline / "minio/1.0.0/amd64/minio.1.0.0").unlink()
    files = artifacts.derived_vars(cluster, "n1", "minio")["minio_artifact_files"]
    assert files["minio"]["path"] == str(tmp_path / "cache" / sha(PAYLOAD))


# ---------------------------------------------------------------------------
# `aicluster artifacts fetch|list` and an offline deploy from what fetch made
# ---------------------------------------------------------------------------


def test_fetch_fills_an_artifact_directory_an_offline_site_deploys_from(
    minio_spec, server, tmp_path, monkeypatch
):
    monkeypatch.setenv(artifacts.CACHE_ENV, str(tmp_path / "cache"))
    server.files["/minio.1.0.0"] = PAYLOAD
    minio_spec.set("all.minio_artifacts", pin(server.url("/minio.{version}")))
    inventory = str(minio_spec.write())
    dest = tmp_path / "offline"

    runner = CliRunner()
    result = runner.invoke(main, ["artifacts", "fetch", inventory, "--dest", str(dest)])
    assert result.exit_code == 0, result.output
    assert (dest / "minio/1.0.0/amd64/minio.1.0.0").read_bytes() == PAYLOAD
    assert (dest / "SHA256SUMS").read_text() == (
        f"{sha(PAYLOAD)}  minio/1.0.0/amd64/minio.1.0.0\n"
    )
    assert f"1 artifact(s) verified into {dest}" in result.output

    again = runner.invoke(main, ["artifacts", "fetch", inventory, "--dest", str(dest)])
    assert again.exit_code == 0, again.output
    assert "(already there)" in again.output
    assert len(server.requests) == 1

    # The offline site: no server, an empty cache, the inventory names the directory.
    server.close()
    monkeypatch.setenv(artifacts.CACHE_ENV, str(tmp_path / "other-cache"))
    minio_spec.set("all.artifacts_dir", str(dest))
    cluster = load_cluster(minio_spec.write())
    paths = resolve_cluster(cluster)
    assert list(paths.values()) == [dest / "minio/1.0.0/amd64/minio.1.0.0"]

    listing = runner.invoke(main, ["artifacts", "list", inventory])
    assert listing.exit_code == 0, listing.output
    header, row = listing.output.splitlines()
    assert header.split() == ["ARTIFACT", "VERSION", "ARCH", "HAVE", "URL", "SHA256"]
    assert row.split() == ["minio/minio", "1.0.0", "amd64", "artifacts_dir",
                           server.url("/minio.1.0.0"), sha(PAYLOAD)]


def test_fetch_reports_what_cannot_be_had(minio_spec, tmp_path, closed_url, monkeypatch):
    monkeypatch.setenv(artifacts.CACHE_ENV, str(tmp_path / "cache"))
    minio_spec.set("all.minio_artifacts", pin(closed_url.replace("1.0.0", "{version}")))
    result = CliRunner().invoke(
        main, ["artifacts", "fetch", str(minio_spec.write()), "--dest", str(tmp_path / "d")]
    )
    assert result.exit_code == 1
    assert "1 release artifact(s) cannot be had; nothing was installed" in result.output
    assert not (tmp_path / "d").exists()


def test_ensure_is_what_ansible_runs_first(minio_spec, tmp_path, closed_url, monkeypatch,
                                           capsys):
    monkeypatch.setenv(artifacts.CACHE_ENV, str(tmp_path / "cache"))
    minio_spec.set("all.minio_artifacts", pin(closed_url.replace("1.0.0", "{version}")))
    assert artifacts.main(["ensure", str(minio_spec.write())]) == 2
    assert "cannot be had; nothing was installed" in capsys.readouterr().err


def test_ensure_dry_is_what_ansibles_check_mode_runs(minio_spec, server, tmp_path,
                                                     monkeypatch, capsys):
    """``ensure --dry`` (site.yml in check mode) downloads nothing, leaves the cache as it
    was, says what it would download, and exits 0."""
    from aicluster import dryrun

    monkeypatch.setattr(dryrun, "_DRY", [False])
    monkeypatch.setattr(dryrun, "_SAID", set())
    monkeypatch.setattr(artifacts, "_RESOLVED", {})
    cache = tmp_path / "cache"
    monkeypatch.setenv(artifacts.CACHE_ENV, str(cache))
    server.files["/minio.1.0.0"] = PAYLOAD
    minio_spec.set("all.minio_artifacts", pin(server.url("/minio.{version}")))
    assert artifacts.main(["ensure", "--dry", str(minio_spec.write())]) == 0
    out, err = capsys.readouterr()
    assert server.requests == [] and not cache.exists()
    assert (f"aicluster: --dry: would download minio/minio 1.0.0 (amd64) from "
            f"{server.url('/minio.1.0.0')} (sha256 {sha(PAYLOAD)}) into {cache / sha(PAYLOAD)}"
            ) in err
    assert "0 release artifact(s) verified, 1 not downloaded (--dry)" in out


def test_list_without_artifacts(spec):
    result = CliRunner().invoke(main, ["artifacts", "list", str(spec.write())])
    assert result.exit_code == 0
    assert "no component of this inventory installs a release artifact" in result.output


# ---------------------------------------------------------------------------
# {base_url}: <c>_release_base_url, where a vendor's releases are (a mirror of them)
# ---------------------------------------------------------------------------


def test_fetch_downloads_under_the_release_base_url_into_the_pinned_file_name(
    minio_spec, server, tmp_path, monkeypatch
):
    """MinIO's pins say {base_url}/minio/releases/download/...; the file keeps the
    `filename` of the pin in the artifact directory, whatever the URL calls it."""
    monkeypatch.setenv(artifacts.CACHE_ENV, str(tmp_path / "cache"))
    server.files["/mirror/minio/releases/download/RELEASE.1.0.0/minio.linux-amd64.RELEASE.1.0.0"] \
        = PAYLOAD
    minio_spec.set("all.minio_release_base_url", server.url("/mirror"))
    minio_spec.set("all.minio_artifacts", {"minio": {
        "url": "{base_url}/minio/releases/download/RELEASE.{version}/"
               "minio.linux-{arch}.RELEASE.{version}",
        "filename": "minio.RELEASE.{version}",
        "sha256": {"1.0.0": {"amd64": sha(PAYLOAD)}}}})
    dest = tmp_path / "offline"
    result = CliRunner().invoke(main, ["artifacts", "fetch", str(minio_spec.write()),
                                       "--dest", str(dest)])
    assert result.exit_code == 0, result.output
    assert (dest / "minio/1.0.0/amd64/minio.RELEASE.1.0.0").read_bytes() == PAYLOAD
    assert len(server.requests) == 1


def test_a_base_url_pattern_needs_the_release_base_url():
    pin_ = {"url": "{base_url}/minio/minio.RELEASE.{version}",
            "sha256": {"1.0.0": {"amd64": sha(PAYLOAD)}}}
    with pytest.raises(ArtifactError, match=r"minio_artifacts.minio.url: .* uses \{base_url\}, "
                                            r"but minio_release_base_url is not set"):
        artifacts.artifact_from_spec("minio", "minio", pin_, "1.0.0", "amd64")
    art_ = artifacts.artifact_from_spec("minio", "minio", pin_, "1.0.0", "amd64",
                                        base_url="https://mirror.example.org/m")
    assert art_.url == "https://mirror.example.org/m/minio/minio.RELEASE.1.0.0"
    assert art_.filename == "minio.RELEASE.1.0.0"
