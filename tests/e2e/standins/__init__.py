"""STAND-IN release artifacts for the end-to-end tests (k3s, Ollama, MinIO).

The vendors' release files cannot be downloaded on the machines these tests run on,
so each component's module here (``tests/e2e/standins/<component>.py``) builds small
executables that answer the few commands and APIs the deploy and the checks use, and
lays them out in an artifact directory exactly as ``aicluster artifacts fetch`` would
lay out the real files. Its ``build(artifacts_dir)`` returns the inventory overrides
that use them (``artifacts_dir``, the stand-ins' own pins, the version), so the
deploy takes them through the same verified artifact path as the real binaries.

They are named STAND-IN in every file they write, in ``--version`` and in the tests'
output. Nothing here is used outside tests.

Where a real artifact directory is supplied (``$AICLUSTER_E2E_ARTIFACTS_DIR``, filled by
``aicluster artifacts fetch``), the tests use it and the pinned defaults instead.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: Said once by every test that uses a stand-in, so its output says what ran.
BANNER = "STAND-IN {what}: the vendor's release files cannot be fetched on this machine"

#: An address no stand-in URL is ever fetched from: the artifact directory holds the
#: files, so the download path is never taken (a test that reached it would fail).
UNREACHED_URL = "http://127.0.0.1:9/aicluster-stand-in/{component}/{version}/{arch}/{name}"


def real_artifacts_dir() -> Path | None:
    """The real artifact directory the caller supplied, if any."""
    value = os.environ.get("AICLUSTER_E2E_ARTIFACTS_DIR")
    return Path(value) if value else None


def place(
    artifacts_dir: Path, component: str, version: str, filename: str, data: bytes,
    arch: str = "amd64", mode: int = 0o755,
) -> str:
    """Write one stand-in file where ``aicluster artifacts`` looks for it
    (``<component>/<version>/<arch>/<filename>``) and return its sha256."""
    path = Path(artifacts_dir) / component / version / arch / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return hashlib.sha256(data).hexdigest()
