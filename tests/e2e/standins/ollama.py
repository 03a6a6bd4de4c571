"""STAND-IN Ollama release for the end-to-end tests: "stand-in ollama (not Ollama)".

Ollama's release tarball cannot be downloaded on the machines the tests run on. This
builds ``ollama-linux-amd64.tgz`` laid out as Ollama's own (``bin/ollama``,
``lib/ollama/``), where ``bin/ollama`` is the standard-library script
``ollama_bin.py`` beside this file with its version set, once per version in
``VERSIONS`` (two, for the version bump), places them in an artifact directory as
``aicluster artifacts fetch`` lays out the real ones, and returns the inventory
overrides that use them: ``artifacts_dir``, an ``ollama_artifacts`` pinning every
stand-in version by its sha256 (its URL is never fetched), ``ollama_version`` (the
first) and ``ollama_models``. The tarballs are byte-for-byte reproducible.

With ``$AICLUSTER_E2E_ARTIFACTS_DIR`` (a real artifact directory, filled by ``aicluster
artifacts fetch``), ``build`` returns that directory and the versions pinned in the
role's defaults instead, and no models (the testbed cannot reach Ollama's registry).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

from tests.e2e.standins import BANNER, UNREACHED_URL, place, real_artifacts_dir

WHAT = "stand-in ollama (not Ollama)"
#: The stand-in releases: the first is deployed, the second is the version bump.
VERSIONS = ("9.9.0-standin", "9.9.1-standin")
#: The real release pinned in roles/ollama/defaults/main.yml (one: the version bump
#: needs two, so it runs with the stand-in only).
REAL_VERSIONS = ("0.32.7",)
#: The model every node pulls (from the stand-in's /api/pull: it writes a manifest and
#: a blob where Ollama would).
MODELS = ["tiny:1b"]
FILENAME = "ollama-linux-{arch}.tgz"
SCRIPT = Path(__file__).with_name("ollama_bin.py")
#: Fixed file times in the tarballs, so the same version gives the same sha256.
MTIME = 1_700_000_000


def banner() -> str:
    if real_artifacts_dir():
        return f"REAL Ollama release files from {real_artifacts_dir()} (not a stand-in)"
    return BANNER.format(what=WHAT)


def versions() -> tuple[str, str | None]:
    """The release deployed first and the one the bump moves to (None: no second)."""
    return (REAL_VERSIONS[0], None) if real_artifacts_dir() else VERSIONS


def is_standin() -> bool:
    return real_artifacts_dir() is None


def script(version: str) -> bytes:
    text = SCRIPT.read_text()
    text, n = re.subn(r'^VERSION = "unset"$', f"VERSION = {json.dumps(version)}", text,
                      count=1, flags=re.M)
    assert n == 1, f"{SCRIPT} has no VERSION line to set"
    return text.encode()


def _tar(members: list[tuple[str, bytes | None, int]], owner: str | None = None) -> bytes:
    """A tar of (name, data or None for a directory, mode), with fixed times (and
    owner names, when given): the same members give the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = MTIME, mode
            if owner:
                info.uname = info.gname = owner
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def _tgz(members: list[tuple[str, bytes | None, int]]) -> bytes:
    """:func:`_tar`, root-owned, gzip'd with a fixed time."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(_tar(members, owner="root"))
    return out.getvalue()


def release(version: str) -> bytes:
    """The stand-in ``ollama-linux-amd64.tgz`` of one version."""
    readme = (f"{WHAT} {version}: a STAND-IN for Ollama's release, made by "
              "tests/e2e/standins/ollama.py for the end-to-end tests. bin/ollama is a "
              "small Python HTTP server, not Ollama; this directory holds no runners.\n")
    return _tgz([
        ("bin", None, 0o755),
        ("bin/ollama", script(version), 0o755),
        ("lib", None, 0o755),
        ("lib/ollama", None, 0o755),
        ("lib/ollama/README-stand-in", readme.encode(), 0o644),
    ])


def build(artifacts_dir: Path, versions: tuple[str, ...] = VERSIONS) -> dict:
    """Place the stand-in release of every version in ``artifacts_dir`` and return the
    inventory overrides that deploy the first one (see the module's docstring)."""
    real = real_artifacts_dir()
    if real:
        return {"artifacts_dir": str(real), "ollama_version": REAL_VERSIONS[0],
                "ollama_models": []}
    pins = {}
    for version in versions:
        name = FILENAME.format(arch="amd64")
        pins[version] = {"amd64": place(Path(artifacts_dir), "ollama", version, name,
                                        release(version), mode=0o644)}
    return {
        "artifacts_dir": str(artifacts_dir),
        "ollama_artifacts": {
            "ollama": {
                "url": UNREACHED_URL.replace("{component}", "ollama").replace(
                    "{name}", FILENAME),
                "filename": FILENAME,
                "sha256": pins,
                "groups": ["ollama"],
            },
        },
        "ollama_version": versions[0],
        "ollama_models": list(MODELS),
    }


def models_archive(artifacts_dir: Path, models: list[str]) -> dict:
    """An offline models archive (``manifests/`` and ``blobs/`` of an OLLAMA_MODELS
    tree, as docs/components/ollama.md has one made) holding a stand-in manifest and
    blob of each model, placed in ``artifacts_dir``; returns the overrides naming it."""
    from aicluster.components.ollama.derive import parse_model

    members: dict[str, tuple[bytes | None, int]] = {"manifests": (None, 0o755),
                                                    "blobs": (None, 0o755)}
    for model in models:
        parts = parse_model(model)
        assert parts, model
        blob = f"{WHAT}: model weights of {'/'.join(parts)} from the offline archive; " \
               "not a model\n"
        digest = hashlib.sha256(blob.encode()).hexdigest()
        manifest = json.dumps({
            "schemaVersion": 2, "stand_in": WHAT,
            "layers": [{"mediaType": "application/vnd.ollama.image.model",
                        "digest": f"sha256:{digest}", "size": len(blob)}],
        }).encode()
        for i in range(1, len(parts)):
            members["manifests/" + "/".join(parts[:i])] = (None, 0o755)
        members["manifests/" + "/".join(parts)] = (manifest, 0o644)
        members[f"blobs/sha256-{digest}"] = (blob.encode(), 0o644)
    data = _tar([(name, *members[name]) for name in sorted(members)])
    rel = "ollama/models/stand-in-models.tar"
    path = Path(artifacts_dir) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"ollama_models": list(models), "ollama_models_archive": rel,
            "ollama_models_archive_sha256": hashlib.sha256(data).hexdigest()}
