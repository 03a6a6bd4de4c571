"""STAND-IN release files for the minio component: ``minio.RELEASE.<version>`` and ``mc``.

The stand-in server and client are tests/e2e/standins/minio_standin.py (Python 3
standard library: the testbed's nodes have python3). It is a small S3 server of our own
rather than an S3 server from PyPI because it VERIFIES every request's AWS Signature
Version 4 against MINIO_ROOT_USER / MINIO_ROOT_PASSWORD from /etc/default/minio (an S3
mock accepts any credentials, which would prove nothing about them) and because the
nodes then need nothing installed from a package index.

``minio.RELEASE.<version>`` is a compiled launcher (minio_launcher.c, built here with the
machine's C compiler, statically) with the server appended as a zip archive: the
deploy tells which release a server runs from ``/proc/<MainPID>/exe``, so the unit's
main process must be the release file itself, as the real MinIO's is, not a script's
interpreter. ``mc`` is the same Python file as a script.

:func:`build` lays them out as ``aicluster artifacts fetch`` would (for two versions, so
a test can bump from one to the other) and returns the inventory overrides that use
them; with ``$AICLUSTER_E2E_ARTIFACTS_DIR`` set, the real files there and the defaults'
pins instead.
"""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from tests.e2e.standins import BANNER, UNREACHED_URL, place, real_artifacts_dir

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "minio_standin.py"
LAUNCHER = HERE / "minio_launcher.c"
#: The stand-in versions: the first is deployed, the second is the bump.
VERSIONS = ("1.0.0-standin", "2.0.0-standin")
WHAT = ("minio and mc (our own S3 server and client, tests/e2e/standins/minio_standin.py; "
        "every request's SigV4 signature verified against the root credentials)")
MARKER = "STAND-IN"


def banner() -> str:
    if real_artifacts_dir():
        return f"minio: the REAL release files from {real_artifacts_dir()} (not stand-ins)"
    return BANNER.format(what=WHAT)


def source(program: str, version: str) -> str:
    """minio_standin.py as ``program`` (minio or mc) of ``version``."""
    text = SOURCE.read_text()
    text, n = re.subn(r'^PROGRAM = ""$', f"PROGRAM = {program!r}", text, flags=re.M)
    text, m = re.subn(r'^VERSION = "dev"$', f"VERSION = {version!r}", text, flags=re.M)
    assert n == 1 and m == 1, "minio_standin.py lost its PROGRAM/VERSION lines"
    return text


def launcher(workdir: Path) -> bytes:
    """minio_launcher.c, compiled statically (the nodes need no library for it)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("stand-in minio: a C compiler (gcc) is needed to build the "
                           "launcher (scripts/setup.sh installs it)")
    out = workdir / "minio-launcher"
    proc = subprocess.run(
        [cc, "-static", "-Os", "-s", "-Wall", "-Werror", "-o", str(out), str(LAUNCHER)],
        capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"stand-in minio: compiling {LAUNCHER.name} failed "
                           f"(static glibc: libc6-dev):\n{proc.stdout}{proc.stderr}")
    return out.read_bytes()


def server_file(elf: bytes, version: str) -> bytes:
    """The launcher with the server appended as a zip archive (``__main__.py``)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        info = zipfile.ZipInfo("__main__.py", date_time=(2020, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, source("minio", version))
    return elf + buf.getvalue()


def mc_file() -> bytes:
    return ("#!/usr/bin/python3\n" + source("mc", VERSIONS[0])).encode()


def build(artifacts_dir: Path, versions: tuple[str, ...] = VERSIONS) -> dict:
    """Place the stand-in minio (every version in ``versions``) and mc in
    ``artifacts_dir``; return the overrides that deploy ``versions[0]`` from there.
    Every version is pinned in ``minio_artifacts``, so setting ``minio_version`` to
    another is a version bump."""
    real = real_artifacts_dir()
    if real:
        from aicluster.render import defaults

        pinned = sorted(defaults("minio")["minio_artifacts"]["minio"]["sha256"])
        return {"artifacts_dir": str(real), "minio_version": pinned[0]}
    artifacts_dir = Path(artifacts_dir)
    with tempfile.TemporaryDirectory() as tmp:
        elf = launcher(Path(tmp))
    mc = mc_file()
    minio_sums: dict[str, dict[str, str]] = {}
    mc_sums: dict[str, dict[str, str]] = {}
    for version in versions:
        name = f"minio.RELEASE.{version}"
        minio_sums[version] = {"amd64": place(artifacts_dir, "minio", version, name,
                                              server_file(elf, version))}
        mc_sums[version] = {"amd64": place(artifacts_dir, "minio", version, "mc", mc)}
    assert len({s["amd64"] for s in minio_sums.values()}) == len(versions)
    return {
        "artifacts_dir": str(artifacts_dir),
        "minio_version": versions[0],
        "minio_artifacts": {
            "minio": {
                "url": UNREACHED_URL.format(component="minio", version="{version}",
                                            arch="{arch}", name="minio.RELEASE.{version}"),
                "sha256": minio_sums,
                "groups": ["minio"],
            },
            "mc": {
                "url": UNREACHED_URL.format(component="minio", version="{version}",
                                            arch="{arch}", name="mc"),
                "sha256": mc_sums,
                "groups": ["minio"],
            },
        },
    }


def pinned_versions(overrides: dict) -> list[str]:
    """The versions the overrides (or, without their own pins, the defaults) pin, the
    deployed one first."""
    spec = overrides.get("minio_artifacts")
    if spec is None:
        from aicluster.render import defaults

        spec = defaults("minio")["minio_artifacts"]
    versions = sorted(spec["minio"]["sha256"])
    first = overrides["minio_version"]
    return [first] + [v for v in versions if v != first]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
