"""STAND-IN k3s release files for the end-to-end tests (the lab in miniature, whose k3s
checks are tests/e2e/test_lab_k3s.py; the k3s role's molecule scenario).

``build(artifacts_dir)`` writes, per version, ``k3s/<version>/amd64/k3s`` (the stand-in
executable, tests/e2e/standins/k3s_executable.py with its version filled in: not k3s)
and ``k3s/<version>/amd64/k3s-airgap-images-amd64.tar.zst`` (a small file naming itself
a stand-in; the stand-in imports nothing), and returns the inventory overrides that
pin them: ``artifacts_dir``, the whole ``k3s_artifacts`` (both files of every version
built, with their sha256, on a URL nothing is fetched from) and ``k3s_version`` (the
first version). The versions' minor numbers make an upgrade (one minor up) and a bump
the deploy must refuse (two minors up) possible.

With ``$AICLUSTER_E2E_ARTIFACTS_DIR`` (a directory ``aicluster artifacts fetch`` filled),
the real files and the defaults' pins are used instead: ``build`` then returns only
``artifacts_dir``.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.standins import BANNER, UNREACHED_URL, place, real_artifacts_dir

#: The first deploy's version, the upgrade (one minor up), a bump that skips a minor.
VERSIONS = ("1.36.4+standin1", "1.37.0+standin1", "1.39.0+standin1")
EXECUTABLE = Path(__file__).with_name("k3s_executable.py")
IMAGES = "k3s-airgap-images-{arch}.tar.zst"


def banner() -> str:
    return BANNER.format(what="k3s (tests/e2e/standins/k3s_executable.py; not k3s)")


def executable(version: str) -> bytes:
    text = EXECUTABLE.read_text()
    assert text.count('VERSION = "@VERSION@"') == 1
    return text.replace('VERSION = "@VERSION@"', f'VERSION = "{version}"').encode()


def images(version: str) -> bytes:
    return (f"STAND-IN k3s air-gap images for v{version} (aicluster's tests; not k3s's "
            "images, nothing is imported)\n").encode()


def build(artifacts_dir: Path, versions: tuple[str, ...] = VERSIONS) -> dict:
    """Write the stand-in files of ``versions`` and return the overrides that use them
    (``k3s_version``: the first)."""
    artifacts_dir = Path(artifacts_dir)
    real = real_artifacts_dir()
    if real is not None:
        return {"artifacts_dir": str(real)}
    sums: dict[str, dict[str, dict[str, str]]] = {"k3s": {}, "images": {}}
    for version in versions:
        sums["k3s"][version] = {"amd64": place(artifacts_dir, "k3s", version, "k3s",
                                               executable(version))}
        sums["images"][version] = {"amd64": place(
            artifacts_dir, "k3s", version, IMAGES.format(arch="amd64"), images(version),
            mode=0o644)}
    url = UNREACHED_URL.format(component="k3s", version="{version}", arch="{arch}",
                               name="{name}")
    return {
        "artifacts_dir": str(artifacts_dir),
        "k3s_version": versions[0],
        "k3s_artifacts": {
            "k3s": {"url": url.replace("{name}", "k3s"), "sha256": sums["k3s"]},
            "images": {"url": url.replace("{name}", IMAGES), "sha256": sums["images"]},
        },
    }
