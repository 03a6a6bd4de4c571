"""The nvidia role's apt pin (roles/nvidia/templates/aicluster-nvidia.pref.j2 with
roles/nvidia/vars/Debian.yml) resolved against a captured excerpt of Debian 12's real
package index (tests/fixtures/nvidia/: source and date in its README).

Debian-style driver packages (Debian's non-free ones, and NVIDIA's CUDA repository for
debian12, which uses the same names) tie each other by exact versions: nvidia-driver
needs nvidia-driver-libs (= V), which needs libgl1-nvidia-glvnd-glx (= V), ...; the
kernel module needs firmware-nvidia-gsp (= V). A package of that family the pin leaves
out gets the newest version of the repository, and apt answers "Depends: libcuda1
(= 570...) but 580... is to be installed". The pin must cover every one.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from pathlib import Path

import pytest

from aicluster.render import defaults, os_vars, render

INDEX = Path(__file__).parent.parent / "fixtures" / "nvidia" / "debian12-driver-535.Packages"
CAPTURED = "535.261.03"
#: NVIDIA's CUDA repository carries several branches side by side: the captured index
#: again, at a newer version, is what apt sees there besides the pinned one.
NEWER = "580.95.05"
#: What the deploy installs with nvidia_source distribution on Debian 12 (vars/Debian.yml),
#: and what nvidia-smi comes with.
ROOTS = ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-open-kernel-dkms", "nvidia-smi")


def _stanzas(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", block, re.M))
        if fields:
            out.append(fields)
    return out


def _family_at(version: str) -> str:
    """The captured index rewritten to driver ``version`` (its branch's other packages,
    nvidia-settings 535.x ..., to that branch)."""
    branch = version.split(".")[0]
    return re.sub(r"(?<![\w.-])535\.", f"{branch}.", INDEX.read_text().replace(CAPTURED, version))


def _index() -> list[dict[str, str]]:
    return _stanzas(INDEX.read_text()) + _stanzas(_family_at(NEWER))


def _pin(version: str | None, branch: str = "535") -> tuple[list[str], re.Pattern]:
    v = {**defaults("nvidia"), **os_vars("nvidia", "Debian"),
         "nvidia_driver_branch": branch, "nvidia_driver_version": version,
         "inventory_hostname": "gpu1"}
    text = render("nvidia", "aicluster-nvidia.pref.j2", v)
    packages = re.search(r"^Package: (.*)$", text, re.M).group(1).split()
    pin = re.search(r"^Pin: version /(.*)/$", text, re.M).group(1)
    assert re.search(r"^Pin-Priority: 1001$", text, re.M)
    return packages, re.compile(pin)


def _matches(pattern: str, name: str, source: str) -> bool:
    """apt_preferences(5): a name, a glob(7), a /regex/, each optionally src: (the source
    package's name)."""
    subject = name
    if pattern.startswith("src:"):
        pattern, subject = pattern[4:], source
    if len(pattern) > 1 and pattern.startswith("/") and pattern.endswith("/"):
        return re.search(pattern[1:-1], subject) is not None
    return fnmatch.fnmatchcase(subject, pattern)


def _covered(patterns: list[str], stanza: dict[str, str]) -> bool:
    source = stanza.get("Source", stanza["Package"]).split()[0]
    return any(_matches(p, stanza["Package"], source) for p in patterns)


def _vkey(version: str) -> tuple[int, ...]:
    # Enough for this index: versions differ in their numbers (535.x against 580.x).
    return tuple(int(n) for n in re.findall(r"\d+", version.split(":")[-1]))


OPS = {"=": operator.eq, ">=": operator.ge, "<=": operator.le, ">>": operator.gt,
       "<<": operator.lt}


def _candidates(patterns, pin, index=None, nvidia_pin=None) -> dict[str, dict[str, str]]:
    """apt's candidate of each package under the pin: priority 1001 where the pin's
    Package line and version match, 500 (a repository's default) otherwise; the highest
    priority, then the highest version. ``nvidia_pin``: NVIDIA's pinning package's
    preferences modelled as a version pattern at priority 1000 for every package."""
    best: dict[str, tuple] = {}
    for stanza in _index() if index is None else index:
        prio = 1001 if _covered(patterns, stanza) and pin.search(stanza["Version"]) else 500
        if prio < 1000 and nvidia_pin is not None and nvidia_pin.search(stanza["Version"]):
            prio = 1000
        key = (prio, _vkey(stanza["Version"]))
        if stanza["Package"] not in best or key > best[stanza["Package"]][0]:
            best[stanza["Package"]] = (key, stanza)
    return {name: s for name, (_, s) in best.items()}


def _relations(stanza: dict[str, str]):
    for field in ("Pre-Depends", "Depends", "Recommends"):
        for group in filter(None, (g.strip() for g in stanza.get(field, "").split(","))):
            alternatives = []
            for alt in group.split("|"):
                m = re.match(r"^\s*([^\s(:]+)(:\S+)?\s*(?:\((<<|<=|=|>=|>>)\s*([^)]+)\))?", alt)
                alternatives.append((m.group(1), m.group(2), m.group(3),
                                     (m.group(4) or "").strip()))
            yield field, group, alternatives


def _unresolved(patterns, pin, roots=ROOTS, index=None, nvidia_pin=None) -> list[str]:
    """The relations of the driver's installation (from ``roots``, through the
    candidates) that the candidates do not satisfy."""
    index = _index() if index is None else index
    cands = _candidates(patterns, pin, index, nvidia_pin)
    known = {s["Package"] for s in index} | {
        re.split(r"[ (]", p.strip())[0] for s in index
        for p in s.get("Provides", "").split(",") if p.strip()}
    problems, seen, todo = [], set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in cands:
            continue
        seen.add(name)
        stanza = cands[name]
        for field, group, alternatives in _relations(stanza):
            ok = False
            for alt, arch, op, version in alternatives:
                if arch or alt not in known:
                    ok = True  # another architecture, or outside the driver's family
                    break
                if alt in cands and (not op or OPS[op](_vkey(cands[alt]["Version"]),
                                                       _vkey(version))):
                    todo.append(alt)
                    ok = True
                    break
                providers = [c for c in cands.values() if any(
                    re.match(rf"^{re.escape(alt)}(\s*\(=\s*([^)]+)\))?$", p.strip())
                    and (not op or OPS[op](_vkey(re.search(r"\(=\s*([^)]+)\)", p).group(1)
                                                 if "(" in p else c["Version"]),
                                           _vkey(version)))
                    for p in c.get("Provides", "").split(","))]
                if providers:
                    todo += [c["Package"] for c in providers]
                    ok = True
                    break
            if not ok:
                got = ", ".join(f"{a} {cands[a]['Version']}" for a, *_ in alternatives
                                if a in cands)
                problems.append(f"{name} {stanza['Version']} {field}: {group} but "
                                f"{got or 'none'} is the candidate")
    return problems


@pytest.mark.parametrize("version", [CAPTURED, None], ids=["exact-version", "branch"])
def test_pin_covers_every_package_of_the_drivers_version(version):
    patterns, pin = _pin(version)
    family = [s for s in _stanzas(INDEX.read_text()) if pin.search(s["Version"])]
    assert len(family) > 40, "the captured index holds the driver's family"
    left_out = sorted(s["Package"] for s in family if not _covered(patterns, s))
    assert left_out == [], f"the pin leaves out {left_out}"
    # unattended-upgrades' blacklist (Python regular expressions, from the name's start)
    # keeps the same family out of unattended upgrades.
    v = {**defaults("nvidia"), **os_vars("nvidia", "Debian"), "inventory_hostname": "gpu1"}
    blacklist = re.findall(r'^\s+"(.*)";$',
                           render("nvidia", "aicluster-nvidia-unattended.conf.j2", v), re.M)
    upgraded = sorted(s["Package"] for s in family
                      if not any(re.match(b, s["Package"]) for b in blacklist))
    assert upgraded == [], f"unattended-upgrades may upgrade {upgraded}"


@pytest.mark.parametrize("version", [CAPTURED, None], ids=["exact-version", "branch"])
def test_pinned_driver_resolves_beside_a_newer_branch(version):
    patterns, pin = _pin(version)
    assert _unresolved(patterns, pin) == []
    cands = _candidates(patterns, pin)
    for name in ("nvidia-driver", "libcuda1", "firmware-nvidia-gsp", "libglx-nvidia0",
                 "nvidia-open-kernel-dkms", "xserver-xorg-video-nvidia"):
        assert cands[name]["Version"].startswith("535."), (name, cands[name]["Version"])


def test_resolution_check_sees_a_package_left_out():
    """The check itself: without libcuda1 and firmware-nvidia-gsp in the pin, apt's
    answer (a Depends on = 535... while 580... is the candidate) is found."""
    patterns, pin = _pin(CAPTURED)
    narrowed = [p for p in patterns if not p.startswith("src:")
                and not fnmatch.fnmatchcase("libcuda1", p)
                and not fnmatch.fnmatchcase("firmware-nvidia-gsp", p)]
    problems = _unresolved(narrowed, pin)
    assert any(p.startswith("nvidia-kernel-dkms 535.261.03-1 Depends: firmware-nvidia-gsp "
                            "(= 535.261.03)") for p in problems), problems


# --- branch 590 and later: NVIDIA's CUDA repository without the branch in the names ----
# From branch 590 on the driver's meta packages carry no branch (nvidia-open, cuda-drivers,
# nvidia-fabricmanager) and depend on the driver with ">=", so without a pin apt takes
# the newest branch of the repository; NVIDIA's pinning package (nvidia-driver-pinning-
# <branch|version>) pins them, and so does this deploy's own pin. The index below is the
# captured Debian 12 family at 580, 590 (two versions) and 595, with the SYNTHETIC metas
# and pinning packages of tests/fixtures/nvidia/SYNTHETIC-cuda-repo-590.Packages: no index
# of NVIDIA's repository at 590 is within reach, so this proves the pin's logic against
# NVIDIA's documented names, not against the real repository.

SYNTHETIC = INDEX.parent / "SYNTHETIC-cuda-repo-590.Packages"
VERSIONS_590 = ("580.95.05", "590.44.01", "590.48.01", "595.45.04")
#: What the deploy installs from branch 590 on (vars/Debian.yml, cuda_repo_pinned).
ROOTS_590 = ("nvidia-open", "cuda-drivers", "nvidia-fabricmanager")


def _metas_at(version: str) -> str:
    branch = version.split(".")[0]
    return (SYNTHETIC.read_text().replace("590.48.01", version)
            .replace("pinning-590", f"pinning-{branch}")
            .replace("Version: 590-1", f"Version: {branch}-1"))


def _index_590() -> list[dict[str, str]]:
    return [s for v in VERSIONS_590 for s in _stanzas(_family_at(v)) + _stanzas(_metas_at(v))]


@pytest.mark.parametrize(("version", "expected"), [
    ("590.48.01", "590.48.01"), (None, "590.48.01"), ("590.44.01", "590.44.01")],
    ids=["exact-version", "branch-newest", "older-exact-version"])
def test_branch_590_pin_resolves_the_unbranched_packages_beside_580_and_595(version,
                                                                            expected):
    index = _index_590()
    patterns, pin = _pin(version, "590")
    assert _unresolved(patterns, pin, ROOTS_590, index) == []
    cands = _candidates(patterns, pin, index)
    for name in (*ROOTS_590, "nvidia-driver", "nvidia-open-kernel-dkms", "nvidia-kernel-dkms",
                 "libcuda1", "firmware-nvidia-gsp", "nvidia-smi"):
        assert cands[name]["Version"].startswith(expected + "-"), (name, cands[name]["Version"])
    # The check itself: without a pin the metas' ">=" takes the newest branch (595).
    assert _candidates([], pin, index)["nvidia-open"]["Version"].startswith("595.")


def test_branch_590_pin_covers_every_package_of_the_drivers_version():
    patterns, pin = _pin("590.48.01", "590")
    family = [s for s in _stanzas(_family_at("590.48.01")) + _stanzas(_metas_at("590.48.01"))
              if pin.search(s["Version"])]
    assert {"nvidia-open", "cuda-drivers", "nvidia-fabricmanager",
            "nvidia-driver-pinning-590.48.01"} <= {s["Package"] for s in family}
    assert sorted(s["Package"] for s in family if not _covered(patterns, s)) == []
    v = {**defaults("nvidia"), **os_vars("nvidia", "Debian"), "inventory_hostname": "gpu1"}
    blacklist = re.findall(r'^\s+"(.*)";$',
                           render("nvidia", "aicluster-nvidia-unattended.conf.j2", v), re.M)
    assert sorted(s["Package"] for s in family
                  if not any(re.match(b, s["Package"]) for b in blacklist)) == []


@pytest.mark.parametrize(("version", "theirs"), [
    ("590.48.01", r"^590\.48\.01-"), (None, r"^590\.")], ids=["exact-version", "branch"])
def test_our_pin_and_nvidias_pinning_package_select_the_same_versions(version, theirs):
    """The deploy keeps its own pin beside NVIDIA's: they must not fight. NVIDIA's pinning
    package ships one preferences file, "Pin-Priority 1000 on version <ver>-*" (or the
    branch's <branch>.*); its Package line is not in the evidence, so it is modelled at its
    widest (every package). For every package of the driver's installation, our pin alone,
    NVIDIA's alone and both together give apt the same candidate. (apt reads
    preferences.d in name order, aicluster-nvidia before nvidia-driver-pin, and ours is the
    higher priority: either rule apt uses picks ours where both match.)"""
    index = _index_590()
    patterns, pin = _pin(version, "590")
    nvidia = re.compile(theirs)
    ours = _candidates(patterns, pin, index)
    only_theirs = _candidates([], re.compile("^$"), index, nvidia)
    both = _candidates(patterns, pin, index, nvidia)
    assert _unresolved(patterns, pin, ROOTS_590, index, nvidia) == []
    family = [n for n, s in ours.items() if pin.search(s["Version"])
              and not n.startswith("nvidia-driver-pinning-")]
    assert len(family) > 40
    for name in family:
        assert ours[name]["Version"] == only_theirs[name]["Version"] == both[name]["Version"], (
            name, ours[name]["Version"], only_theirs[name]["Version"], both[name]["Version"])


#: NVIDIA's driver installation guide, "Recent Updates", table "Ubuntu 590 package renames"
#: (the new names, and those it lists unchanged): the packages of the driver's version on
#: Ubuntu from branch 590 on. libnvsdm (NVLink 5's switch telemetry, "no change") is left
#: out: aicluster installs none of the NVLink 5 stack, and NVIDIA's pinning package pins
#: its own list.
UBUNTU_590_NAMES = (
    "cuda-drivers", "libnvidia-cfg1", "libnvidia-common", "libnvidia-compute",
    "libnvidia-decode", "libnvidia-encode", "libnvidia-extra", "libnvidia-fbc1",
    "libnvidia-gl", "libnvidia-gpucomp", "libnvidia-nscq", "libxnvctrl0", "libxnvctrl-dev",
    "nvidia-dkms", "nvidia-dkms-open", "nvidia-open", "nvidia-driver-open",
    "nvidia-fabricmanager",
)


def test_pin_and_blacklist_name_ubuntus_590_packages():
    patterns, _ = _pin(None, "590")
    left_out = [n for n in UBUNTU_590_NAMES if not _covered(patterns, {"Package": n})]
    assert left_out == []
    v = {**defaults("nvidia"), **os_vars("nvidia", "Debian"), "inventory_hostname": "gpu1"}
    blacklist = re.findall(r'^\s+"(.*)";$',
                           render("nvidia", "aicluster-nvidia-unattended.conf.j2", v), re.M)
    assert [n for n in UBUNTU_590_NAMES if not any(re.match(b, n) for b in blacklist)] == []
