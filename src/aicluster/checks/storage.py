"""Storage: the NVMe cache, NFS, Ceph and MinIO, each checked where the inventory puts it.

quick (mounts, fill level, cluster health; seconds):

- ``storage.nvme_mount``, ``storage.nvme_usage``: the NVMe cache mounted at its path as
  the XFS the nvme_cache component makes, read-write, and how full it is;
- ``storage.nfs_mount``: an NFS client's mounts of the server's exports, read-write and
  answering (SKIP where the kernel has no NFS client: the deploy mounted nothing there);
- ``storage.ceph_health``: ``ceph status`` on the first monitor: the health and its check
  codes, every OSD the inventory declares up and in (the OSD tree names the down ones and
  their hosts), the placement groups active and clean;
- ``storage.cephfs_mount``: a Ceph client's CephFS mount.

standard (data through the storage; a minute or two):

- ``storage.nvme_fio``: fio on a file in the cache (direct I/O): sequential read and
  write bandwidth, the p99 completion latency of 4 KiB random reads;
- ``storage.nfs_shared``, ``storage.cephfs`` (pair tests): a file one node writes to the
  shared filesystem is read on another with the same sha256; for NFS with the MB/s of
  each NFS client's reads and writes. NFS clients whose kernel has no NFS client reach
  the export from user space with libnfs-utils (nfs-cp, nfs-cat) where it is installed;
- ``storage.minio``: the health endpoints of a server, asked from another node, and an
  object PUT through one server and read back through another.

A pair test's second node writes (the runner starts it first, detached, its output
discarded), the first reads: the writer leaves ``<name>.meta`` beside the data (its
checksum, its timing, or its error) once the data is complete, and the reader waits for
it. The secrets a test needs (MinIO's root credentials) are read on the node from the
files the deploy wrote there and handed to the client in its environment only: never on
a command line, never in the output.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass
from functools import partial
from typing import Any

from aicluster.checks.context import Context
from aicluster.checks.result import Action, Result, Status
from aicluster.checks.runner import Completed, PairCheck, Probe
from aicluster.common.settings import layered
from aicluster.components.ceph import derive as ceph_derive
from aicluster.components.minio import derive as minio_derive
from aicluster.components.minio.probe import ALIAS as MINIO_ALIAS
from aicluster.components.minio.probe import MC as MINIO_MC
from aicluster.components.nfs import derive as nfs_derive
from aicluster.components.nvme_cache import derive as nvme_derive

LAYER = "storage"

#: What the nvme_cache component makes its cache filesystem (nvme_cache.derive: mkfs.xfs).
CACHE_FSTYPES = ("xfs",)
#: What findmnt shows at an NFS client's mount point.
NFS_FSTYPES = ("nfs", "nfs4")
#: Where a pair test keeps its files, under the shared directory (made mode 1777).
CHECK_DIR = ".aicluster-check"
#: Seconds a pair test's reader waits for the writer's file (an NFS client may not see a
#: new file another client made before its cached view of the directory expires).
SHARED_WAIT_S = 60
#: Seconds ``ceph`` may take to reach the monitors, per command.
CEPH_CONNECT_TIMEOUT = 15
#: Seconds a mount point may take to answer ``stat -f`` before it counts as hung.
MOUNT_STAT_TIMEOUT = 5
#: Free space kept on the cache beyond fio's test file (KiB).
FIO_MARGIN_KB = 65536
#: The mc alias of the other server in a MinIO round trip (MC_HOST_<alias>: no dashes).
MINIO_PEER_ALIAS = "aiclusterpeer"
#: The root credentials in a URL (mc's errors may show an alias's URL): hidden.
_CREDENTIALS = re.compile(r"://[^/@\s]+@")


# ---------------------------------------------------------------------------
# Reading probe output
# ---------------------------------------------------------------------------


def parse_kv(text: str) -> dict[str, str]:
    """``key=value`` lines (the last of a key wins; other lines are ignored)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and " " not in key:
            out[key.strip()] = value.strip()
    return out


def sections(text: str) -> list[tuple[str, str]]:
    """The ``@@name`` sections of a probe's output, in order: (the marker line's text
    after ``@@``, the lines up to the next marker)."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("@@"):
            out.append((line[2:].strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(name, "\n".join(body)) for name, body in out]


def section_rc(parts: list[tuple[str, str]], name: str) -> str:
    """The exit status a ``@@<name>-rc=N`` marker line gave ("" when there is none)."""
    for marker, _ in parts:
        if marker.startswith(f"{name}-rc="):
            return marker.split("=", 1)[1]
    return ""


def parse_findmnt(text: str) -> dict[str, Any] | None:
    """What ``findmnt --json -M PATH`` shows mounted there: the last filesystem (the one
    on top when several are stacked) as ``{target, source, fstype, options}``, or None."""
    text = text.strip()
    if not text:
        return None
    found = json.loads(text).get("filesystems") or []
    return dict(found[-1]) if found else None


def parse_df(text: str) -> dict[str, Any]:
    """``df -P -k PATH``: size, used and available KiB and the used percent (df's own
    rounding: used / (used + available), rounded up)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        raise ValueError("no df output")
    fields = lines[-1].split()
    size, used, avail, percent = fields[1], fields[2], fields[3], fields[4]
    return {"size_kb": int(size), "used_kb": int(used), "avail_kb": int(avail),
            "percent": int(percent.rstrip("%"))}


def _options(mounted: dict[str, Any]) -> list[str]:
    return str(mounted.get("options") or "").split(",")


def _tail(text: str, n: int = 200) -> str:
    return _CREDENTIALS.sub("://***@", " ".join(text.split()))[-n:]


def mount_command(path: str) -> str:
    """``@@mount`` with findmnt's JSON for what is mounted at ``path`` and, when
    something is, ``responds=<exit status>`` of ``stat -f`` then ``stat`` there (124:
    it did not answer; another non-zero: it failed, as on a CephFS client the MDS
    evicted, whose ``stat -f`` may still succeed)."""
    p = shlex.quote(path)
    stat = f"timeout -k 2 {MOUNT_STAT_TIMEOUT} stat"
    return (f"echo @@mount; findmnt --json -M {p} -o TARGET,SOURCE,FSTYPE,OPTIONS "
            "2>/dev/null; "
            f"if findmnt -rn -M {p} >/dev/null 2>&1; then "
            f"{stat} -f {p} >/dev/null 2>&1 && {stat} {p} >/dev/null 2>&1; "
            'echo "responds=$?"; fi')


def parse_mounts(text: str) -> list[dict[str, Any] | None]:
    """Each ``@@mount`` section: what is mounted (``parse_findmnt``) with ``responds``
    (the exit status of ``stat -f``), or None when nothing is."""
    out = []
    for name, body in sections(text):
        if name != "mount":
            continue
        lines = body.splitlines()
        responds = [ln for ln in lines if ln.startswith("responds=")]
        found = parse_findmnt("\n".join(ln for ln in lines if not ln.startswith("responds=")))
        if found is not None:
            found["responds"] = int(responds[-1].split("=", 1)[1]) if responds else 0
        out.append(found)
    return out


def mount_problem(path: str, mounted: dict[str, Any] | None, fstypes: tuple[str, ...],
                  what: str, source: str = "") -> tuple[str, Action] | None:
    """Why the mount at ``path`` is not what it should be (None: it is): nothing
    there, another filesystem type, another source, read-only, not answering."""
    if mounted is None:
        return f"{path}: {what} is not mounted (nothing is mounted there)", Action.REDEPLOY
    fstype = str(mounted.get("fstype") or "")
    if fstype not in fstypes:
        return (f"{path}: {mounted.get('source') or 'something'} ({fstype or 'unknown type'}) "
                f"is mounted there, not {what} ({'/'.join(fstypes)})", Action.REDEPLOY)
    have = str(mounted.get("source") or "")
    if source and have.replace("[", "").replace("]", "").rstrip("/") != \
            source.replace("[", "").replace("]", "").rstrip("/"):
        return (f"{path}: mounted from {have}, the inventory says {source}",
                Action.REDEPLOY)
    if "ro" in _options(mounted):
        return (f"{path}: {what} is mounted read-only (a filesystem or server error? "
                "see the kernel log)", Action.INVESTIGATE)
    if mounted.get("responds") in (124, 137):
        return (f"{path}: {what} does not answer (stat ran past "
                f"{MOUNT_STAT_TIMEOUT} s: a hung server or client)", Action.INVESTIGATE)
    if mounted.get("responds"):
        if "ceph" in fstype:
            return (f"{path}: {what} is mounted but stat fails there: the MDS evicted "
                    "this client (no word from it for session_autoclose, a network cut?); "
                    "the next deploy unmounts it and mounts it again", Action.REDEPLOY)
        return (f"{path}: {what} is mounted but stat fails there (exit "
                f"{mounted['responds']}: a stale handle? see the kernel log)",
                Action.INVESTIGATE)
    return None


# ---------------------------------------------------------------------------
# The NVMe cache
# ---------------------------------------------------------------------------


def nvme_mount_command(path: str) -> str:
    p = shlex.quote(path)
    return (f"{mount_command(path)}; echo @@df; "
            f"if findmnt -rn -M {p} >/dev/null 2>&1; then df -P -k {p}; fi")


def judge_nvme_mount(node: str, path: str, warn: float, fail: float,
                     done: Completed) -> list[Result]:
    """``storage.nvme_mount`` (the cache is the XFS, read-write) and
    ``storage.nvme_usage`` (its fill level against the thresholds)."""
    mounted = (parse_mounts(done.stdout) or [None])[0]
    problem = mount_problem(path, mounted, CACHE_FSTYPES, "the NVMe cache")
    if problem is not None:
        text, action = problem
        return [
            Result("storage.nvme_mount", Status.FAIL, node=node, action=action,
                   message=f"{node}: {text}", details={"mounted": mounted}),
            Result("storage.nvme_usage", Status.SKIP, node=node,
                   message=f"{node}: the NVMe cache at {path} is not usable "
                           "(storage.nvme_mount says why)"),
        ]
    results = [Result("storage.nvme_mount", Status.PASS, node=node,
                      value=str(mounted["fstype"]),
                      message=f"{path}: {mounted['fstype']} on {mounted['source']}, "
                              "read-write",
                      details={"mounted": mounted})]
    df = parse_df(dict(sections(done.stdout)).get("df", ""))
    percent = df["percent"]
    free = f"{df['avail_kb'] // 1024} MiB free of {df['size_kb'] // 1024} MiB"
    if percent > fail:
        status, action, limit = Status.FAIL, Action.INVESTIGATE, fail
        message = (f"{node}: the NVMe cache {path} is {percent}% full, above {fail:g}% "
                   f"({free}): jobs writing models, datasets or Ray spill there will "
                   "fail; free space on it")
    elif percent > warn:
        status, action, limit = Status.WARN, Action.MONITOR, warn
        message = (f"{node}: the NVMe cache {path} is {percent}% full, above {warn:g}% "
                   f"({free})")
    else:
        status, action, limit = Status.PASS, Action.NONE, warn
        message = f"{path}: {percent}% used ({free})"
    results.append(Result("storage.nvme_usage", status, node=node, value=percent,
                          threshold=limit, unit="%", action=action, message=message,
                          details=df))
    return results


def nvme_fio_command(path: str, size_mb: int, seconds: int) -> str:
    """fio on a file of its own in the cache, removed afterwards (also when the probe is
    stopped): 1 MiB sequential writes then reads (queue depth 16), then 4 KiB random
    reads at queue depth 1 (the latency). Refuses, saying why, when fio is missing,
    the cache is not mounted (the root disk is never tested in its place) or has no room
    for the file."""
    p = shlex.quote(path)
    need = int(size_mb) * 1024 + FIO_MARGIN_KB
    common = (f"--output-format=json --filename=\"$f\" --size={int(size_mb)}M --direct=1 "
              f"--ioengine=libaio --time_based --runtime={int(seconds)}")
    jobs = ("--name=seq-write --rw=write --bs=1M --iodepth=16 "
            "--name=seq-read --stonewall --rw=read --bs=1M --iodepth=16 "
            "--name=rand-read-4k --stonewall --rw=randread --bs=4k --iodepth=1")
    return (
        "command -v fio >/dev/null 2>&1 || { echo missing=fio; exit 0; }; "
        f"findmnt -rn -M {p} >/dev/null 2>&1 || {{ echo notmounted=1; exit 0; }}; "
        f"a=$(df -P -k {p} | awk 'NR == 2 {{print $4}}'); echo \"avail_kb=$a\"; "
        f"echo need_kb={need}; "
        f"[ \"${{a:-0}}\" -ge {need} ] || {{ echo full=1; exit 0; }}; "
        f"f={p}/.aicluster-check-fio.$$; "
        "trap 'rm -f \"$f\"' EXIT; trap 'exit 143' INT TERM; "
        f"echo @@fio; fio {common} {jobs}; echo \"@@fio-rc=$?\""
    )


def parse_fio(text: str) -> dict[str, dict[str, Any]]:
    """fio's JSON (whatever fio printed before it skipped) as ``{jobname: {error,
    read_mbps, write_mbps, read_p99_ms}}`` (MB/s: 10^6 bytes per second)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no fio JSON in the output")
    data, _ = json.JSONDecoder().raw_decode(text[start:])
    out = {}
    for job in data.get("jobs") or []:
        entry: dict[str, Any] = {"error": int(job.get("error") or 0)}
        for way in ("read", "write"):
            stats = job.get(way) or {}
            bw = stats.get("bw_bytes")
            if bw is None:
                bw = float(stats.get("bw") or 0) * 1024  # KiB/s, fio before 3.0
            entry[f"{way}_mbps"] = round(float(bw) / 1e6, 1)
        p99 = ((job.get("read") or {}).get("clat_ns") or {}).get("percentile", {}).get(
            "99.000000")
        entry["read_p99_ms"] = round(float(p99) / 1e6, 3) if p99 is not None else None
        out[str(job.get("jobname"))] = entry
    return out


def judge_nvme_fio(node: str, path: str, size_mb: int, read_min: float, write_min: float,
                   p99_max: float, done: Completed) -> Result:
    kv = parse_kv(done.stdout.split("@@fio", 1)[0])
    check = "storage.nvme_fio"
    if kv.get("missing") == "fio":
        return Result(check, Status.ERROR, node=node, action=Action.REDEPLOY,
                      message=f"{node}: fio is not installed, though the node has an NVMe "
                              "cache (the nvme_cache deploy installs it): deploy again")
    if kv.get("notmounted"):
        return Result(check, Status.FAIL, node=node, action=Action.REDEPLOY,
                      message=f"{node}: the NVMe cache is not mounted at {path}: nothing "
                              "tested (storage.nvme_mount says more)")
    if kv.get("full"):
        avail = int(kv.get("avail_kb") or 0) // 1024
        return Result(check, Status.FAIL, node=node, value=avail,
                      threshold=int(kv.get("need_kb") or 0) // 1024, unit="MiB",
                      action=Action.INVESTIGATE,
                      message=f"{node}: the NVMe cache {path} is too full for the test: "
                              f"{avail} MiB free, fio's {size_mb} MiB file needs "
                              f"{int(kv.get('need_kb') or 0) // 1024} MiB; free space on it")
    parts = sections(done.stdout)
    rc = section_rc(parts, "fio")
    try:
        jobs = parse_fio(dict(parts).get("fio", ""))
    except ValueError:
        jobs = {}
    if rc != "0" or not jobs or any(j["error"] for j in jobs.values()):
        errors = {n: j["error"] for n, j in jobs.items() if j["error"]}
        return Result(check, Status.FAIL, node=node, action=Action.INVESTIGATE,
                      message=f"{node}: fio failed on the NVMe cache {path} (exit "
                              f"{rc or '?'}{f', job errors {errors}' if errors else ''}): "
                              f"{_tail(done.stderr) or 'no message'}",
                      details={"jobs": jobs})
    figures = [
        ("sequential read", jobs["seq-read"]["read_mbps"], read_min, "MB/s", False),
        ("sequential write", jobs["seq-write"]["write_mbps"], write_min, "MB/s", False),
        ("4k random read p99", jobs["rand-read-4k"]["read_p99_ms"], p99_max, "ms", True),
    ]
    said = []
    bad = []
    for name, value, limit, unit, is_max in figures:
        ok = value is not None and (value <= limit if is_max else value >= limit)
        said.append(f"{name} {value} {unit} ({'<=' if is_max else '>='} {limit:g})")
        if not ok:
            bad.append((name, value, limit, unit, is_max))
    details = {"jobs": jobs, "size_mb": size_mb}
    if bad:
        name, value, limit, unit, is_max = bad[0]
        worse = ", ".join(f"{n} {v} {u} ({'above' if m else 'below'} {lim:g})"
                          for n, v, lim, u, m in bad)
        return Result(check, Status.FAIL, node=node, value=value, threshold=limit,
                      unit=unit, action=Action.INVESTIGATE, details=details,
                      message=f"{node}: the NVMe cache {path} is slow: {worse} (a failed "
                              "or throttled drive, a degraded PCIe link?)")
    first = figures[0]
    return Result(check, Status.PASS, node=node, value=first[1], threshold=first[2],
                  unit="MB/s", details=details, message=f"{path}: " + ", ".join(said))


# ---------------------------------------------------------------------------
# NFS mounts
# ---------------------------------------------------------------------------

#: Why an NFS client's export cannot be reached at all (no kernel client, no libnfs).
NO_CLIENT = ("this node's kernel has no NFS client (the deploy mounted nothing here) and "
             "libnfs-utils (nfs-cp, nfs-cat) is not installed to reach the export from "
             "user space")


def nfs_mount_command(paths: list[str]) -> str:
    from aicluster.components.nfs.probe import KERNEL_COMMAND

    return "; ".join([KERNEL_COMMAND, *(mount_command(p) for p in paths)])


def judge_nfs_mount(node: str, mounts: list[dict[str, str]], done: Completed) -> Result:
    """Every mount of the client as the inventory says; SKIP, with the deploy's own
    reason, where the kernel has no NFS client (the deploy mounted nothing there)."""
    from aicluster.components.nfs.probe import parse as kernel_parse

    check = "storage.nfs_mount"
    head = done.stdout.split("@@", 1)[0]
    kernel = kernel_parse(head.splitlines())
    found = parse_mounts(done.stdout)
    if not kernel["client"] and not any(found):
        reason = nfs_derive.client_skip_reason(kernel)
        return Result(check, Status.SKIP, node=node, message=f"{node}: {reason}")
    problems = []
    actions = []
    for m, mounted in zip(mounts, found + [None] * (len(mounts) - len(found)), strict=False):
        problem = mount_problem(m["path"], mounted, NFS_FSTYPES, f"the NFS export {m['src']}",
                                m["src"])
        if problem is not None:
            problems.append(problem[0])
            actions.append(problem[1])
    good = len(mounts) - len(problems)
    if problems:
        action = Action.INVESTIGATE if Action.INVESTIGATE in actions else Action.REDEPLOY
        return Result(check, Status.FAIL, node=node, value=good, threshold=len(mounts),
                      unit="mounts", action=action,
                      message=f"{node}: " + "; ".join(problems),
                      details={"problems": problems})
    return Result(check, Status.PASS, node=node, value=good, threshold=len(mounts),
                  unit="mounts", message="NFS, read-write, answering: " + ", ".join(
                      f"{m['path']} ({m['src']})" for m in mounts))


# ---------------------------------------------------------------------------
# A file written on one node, read on another (NFS, CephFS)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """How one node of a pair test reaches the shared directory: ``local`` (the NFS
    server's exported directory itself), ``nfs`` (a client's mount point; from user
    space with libnfs where the kernel has no NFS client: ``url``), ``cephfs`` (a
    CephFS mount point of one of ``fstypes``)."""

    node: str
    kind: str
    path: str
    url: str = ""
    fstypes: tuple[str, ...] = ()
    #: ``uid:gid`` the files it writes are given (the NFS server's own writes: the user
    #: a squashed client is, so that the client can remove them from the sticky directory).
    owner: str = ""


def _say(text: str) -> str:
    """``echo`` of a fixed text, quoted for sh."""
    return f"echo {shlex.quote(text)}"


def _resolve(side: Side) -> str:
    """Sets ``mode`` (local, nfs, libnfs, cephfs) or prints ``skip=``/``fail=`` why the
    node cannot reach the directory."""
    p = shlex.quote(side.path)
    if side.kind == "local":
        return (f"if [ -d {p} ]; then mode=local; else "
                f"{_say(f'fail=the exported directory {side.path} does not exist')}; fi")
    probe = f"t=$(findmnt -rn -o FSTYPE -M {p} 2>/dev/null | tail -n 1); "
    shows = f"findmnt shows {'${t:-nothing}'} there"
    if side.kind == "cephfs":
        types = " ".join(side.fstypes)
        return (probe + f"case ' {types} ' in *\" $t \"*) [ -n \"$t\" ] && mode=cephfs ;; "
                "esac; [ -n \"$mode\" ] || echo "
                + shlex.quote(f"fail=CephFS is not mounted at {side.path} (") + f"\"{shows}\""
                + shlex.quote(f", expected {'/'.join(side.fstypes)})"))
    return (probe + "case \"$t\" in nfs|nfs4) mode=nfs ;; *) "
            "if grep -qwE 'nfs|nfs4' /proc/filesystems 2>/dev/null || "
            "modprobe -n -q nfs 2>/dev/null; then echo "
            + shlex.quote(f"fail={side.path} is not mounted (") + f"\"{shows}\""
            + shlex.quote("), though this kernel has an NFS client") + "; "
            "elif command -v nfs-cp >/dev/null 2>&1 && command -v nfs-cat >/dev/null 2>&1; "
            f"then mode=libnfs; else {_say('skip=' + NO_CLIENT)}; fi ;; esac")


def _functions(side: Side, direct: bool) -> str:
    """put SRC NAME (a complete file appears at once: written aside, then renamed),
    get NAME (to stdout), show NAME (a small file, or nothing), drop NAME... ."""
    d = shlex.quote(f"{side.path}/{CHECK_DIR}")
    u = shlex.quote(f"{side.url}/{CHECK_DIR}") if side.url else "''"
    flag = " iflag=direct" if direct else ""
    chown = (f"chown {shlex.quote(side.owner)} \"$d/$2.part\" 2>>\"$e\" && "
             if side.owner else "")
    return (
        f"d={d}; u={u}; "
        "put() { case $mode in "
        "libnfs) nfs-cp \"$1\" \"$u/$2\" >\"$e\" 2>&1 ;; "
        "*) dd if=\"$1\" of=\"$d/$2.part\" bs=1M conv=fsync status=none 2>\"$e\" && "
        f"{chown}mv -f \"$d/$2.part\" \"$d/$2\" 2>>\"$e\" ;; esac; }}; "
        "get() { case $mode in libnfs) nfs-cat \"$u/$1\" 2>\"$e\" ;; "
        f"*) dd if=\"$d/$1\" bs=1M status=none{flag} 2>\"$e\" ;; esac; }}; "
        "show() { case $mode in libnfs) nfs-cat \"$u/$1\" 2>/dev/null ;; "
        "*) ls \"$d\" >/dev/null 2>&1; cat \"$d/$1\" 2>/dev/null ;; esac; }; "
        "drop() { [ \"$mode\" = libnfs ] && return 1; "
        "for n in \"$@\"; do rm -f \"$d/$n\" || return 1; done; }; "
        "err() { tr '\\n' ' ' < \"$e\" | sed 's#://[^/@ ]*@#://***@#g' | cut -c1-300; }"
    )


def _prelude(side: Side, direct: bool) -> str:
    return ("LC_ALL=C; export LC_ALL; umask 022; mode=''; "
            f"{_resolve(side)}; {_functions(side, direct)}")


def _temp_files() -> str:
    return ("tmp=$(mktemp) && e=$(mktemp) || exit 1; "
            "trap 'rm -f \"$tmp\" \"$tmp.m\" \"$e\"' EXIT; trap 'exit 143' INT TERM")


def writer_command(side: Side, name: str, size_bytes: int, direct: bool) -> str:
    """On the pair's second node: clears its check files older than ten minutes (what
    a user-space NFS reader, which cannot remove files, left), writes ``NAME.bin`` of
    random bytes, then ``NAME.meta``: its node, how it reached the directory, the
    checksum, the start and end of the write, any error, and ``done=1``."""
    return "; ".join([
        _prelude(side, direct),
        "[ -n \"$mode\" ] || exit 0",
        _temp_files(),
        "if [ \"$mode\" != libnfs ]; then mkdir -p \"$d\"; chmod 1777 \"$d\" 2>/dev/null; "
        "find \"$d\" -maxdepth 1 -type f -name 'aicluster-check-*' -mmin +10 "
        "-exec rm -f {} + 2>/dev/null; fi",
        f"head -c {int(size_bytes)} /dev/urandom > \"$tmp\"",
        "sum=$(sha256sum < \"$tmp\" | cut -d' ' -f1)",
        "s=$(date +%s.%N)",
        f"if put \"$tmp\" {shlex.quote(name + '.bin')}; then ok=1; else ok=0; fi",
        "t=$(date +%s.%N)",
        "{ " + _say(f"node={side.node}") + "; echo \"mode=$mode\"; "
        "echo \"sha256=$sum\"; echo \"start=$s\"; echo \"end=$t\"; "
        "[ \"$ok\" = 1 ] || echo \"error=$(err)\"; echo done=1; } > \"$tmp.m\"",
        f"put \"$tmp.m\" {shlex.quote(name + '.meta')}",
    ])


def reader_command(side: Side, name: str, size_bytes: int, direct: bool, wait: int,
                   write_too: bool) -> str:
    """On the pair's first node: waits (at most ``wait`` s) for the writer's
    ``NAME.meta``, prints it (``writer.`` before each line), reads ``NAME.bin``
    (``read_sha256``, its start and end), with ``write_too`` writes a file of its own
    (``write_ok``, its start and end), then removes the test's files where it can
    (``cleanup``)."""
    def q(suffix: str) -> str:
        return shlex.quote(name + suffix)

    steps = [
        _prelude(side, direct),
        "echo \"mode=$mode\"",
        "[ -n \"$mode\" ] || exit 0",
        _temp_files(),
        "n=0; m=''",
        f"while :; do m=$(show {q('.meta')}); case \"$m\" in *done=1*) break ;; esac; "
        f"[ \"$n\" -ge {int(wait)} ] && break; n=$((n + 1)); sleep 1; done",
        "echo \"waited=$n\"",
        "printf '%s\\n' \"$m\" | sed -n 's/^\\([a-z0-9_]*=\\)/writer.\\1/p'",
        "case \"$m\" in *done=1*) ;; *) echo missing=1; exit 0 ;; esac",
        "s=$(date +%s.%N)",
        f"sum=$(get {q('.bin')} | sha256sum | cut -d' ' -f1)",
        "t=$(date +%s.%N)",
        "echo \"read_sha256=$sum\"; echo \"read_start=$s\"; echo \"read_end=$t\"; "
        "echo \"read_error=$(err)\"",
    ]
    if write_too:
        steps += [
            f"head -c {int(size_bytes)} /dev/urandom > \"$tmp\"",
            "s=$(date +%s.%N)",
            f"if put \"$tmp\" {q('.back.bin')}; then echo write_ok=1; "
            "else echo write_ok=0; echo \"write_error=$(err)\"; fi",
            "t=$(date +%s.%N); echo \"write_start=$s\"; echo \"write_end=$t\"",
        ]
    steps.append(f"if drop {q('.bin')} {q('.meta')} {q('.back.bin')}; "
                 "then echo cleanup=1; else echo cleanup=0; fi")
    return "; ".join(steps)


def _seconds(kv: dict[str, str], start: str, end: str) -> float | None:
    try:
        return max(float(kv[end]) - float(kv[start]), 1e-6)
    except (KeyError, ValueError):
        return None


def _mbps(size_bytes: int, seconds: float | None) -> float | None:
    return None if seconds is None else round(size_bytes / seconds / 1e6, 1)


#: The ways of reaching an NFS export whose speed is NFS's (not the server's own disk).
_OVER_NFS = ("nfs", "libnfs")


def judge_shared(check: str, what: str, reader: str, writer: str, size_bytes: int,
                 min_mbps: float | None, done: Completed) -> Result:
    """A pair test's result (``reader`` ran the command, ``writer`` the background
    part): the file the writer wrote read back with the same sha256; with ``min_mbps``
    (NFS), each transfer over NFS at least that fast."""
    pair = (reader, writer)
    kv = parse_kv(done.stdout)
    size_mib = size_bytes // 1048576
    if "skip" in kv:
        return Result(check, Status.SKIP, pair=pair, message=f"{reader}: {kv['skip']}")
    if "fail" in kv:
        return Result(check, Status.FAIL, pair=pair, action=Action.REDEPLOY,
                      message=f"{reader}: {kv['fail']}")
    if not kv.get("mode"):
        raise ValueError("the probe printed no mode")
    if kv.get("missing"):
        return Result(check, Status.FAIL, pair=pair, action=Action.INVESTIGATE,
                      value=int(kv.get("waited") or 0), threshold=SHARED_WAIT_S, unit="s",
                      message=f"{reader}: nothing {writer} wrote to {what} appeared within "
                              f"{kv.get('waited', '?')} s: {writer} could not write there "
                              f"(its own mount check says why) or the two nodes do not "
                              "share the same directory")
    if "writer.error" in kv:
        return Result(check, Status.FAIL, pair=pair, action=Action.INVESTIGATE,
                      message=f"{writer}: could not write to {what}: {kv['writer.error']}")
    details: dict[str, Any] = {"reader_mode": kv["mode"], "writer_mode": kv.get("writer.mode"),
                               "size_bytes": size_bytes, "cleanup": kv.get("cleanup") == "1"}
    wrote, read = kv.get("writer.sha256", ""), kv.get("read_sha256", "")
    if not wrote or wrote != read:
        error = kv.get("read_error") or ""
        return Result(check, Status.FAIL, pair=pair, action=Action.INVESTIGATE,
                      details={**details, "written_sha256": wrote, "read_sha256": read},
                      message=f"{reader}: read other bytes than {writer} wrote to {what} "
                              f"(sha256 {read[:12] or 'none'}, written {wrote[:12] or 'none'})"
                              + (f": {error}" if error else ""))
    if kv.get("write_ok") == "0":
        return Result(check, Status.FAIL, pair=pair, action=Action.INVESTIGATE,
                      details=details,
                      message=f"{reader}: read what {writer} wrote, but cannot write to "
                              f"{what} itself: {kv.get('write_error') or 'no message'}")
    rates: list[tuple[str, float]] = []
    if kv.get("writer.mode") in _OVER_NFS:
        rates.append((f"{writer} wrote", _mbps(size_bytes, _seconds(kv, "writer.start",
                                                                    "writer.end"))))
    if kv["mode"] in _OVER_NFS:
        rates.append((f"{reader} read", _mbps(size_bytes, _seconds(kv, "read_start",
                                                                   "read_end"))))
        if kv.get("write_ok") == "1":
            rates.append((f"{reader} wrote", _mbps(size_bytes, _seconds(
                kv, "write_start", "write_end"))))
    rates = [(n, r) for n, r in rates if r is not None]
    details["mbps"] = dict(rates)
    said = ", ".join(f"{n} {r} MB/s" for n, r in rates)
    via = f" ({reader} through {kv['mode']}, {writer} through {kv.get('writer.mode')})"
    if not details["cleanup"]:
        via += ("; the test's files stay until the writer's next run clears them (libnfs-utils "
                "cannot remove files)" if kv["mode"] == "libnfs" else
                "; the test's files could not all be removed")
    if min_mbps is not None and rates:
        slowest = min(rates, key=lambda x: x[1])
        if slowest[1] < min_mbps:
            slow = ", ".join(f"{n} {r} MB/s" for n, r in rates if r < min_mbps)
            return Result(check, Status.FAIL, pair=pair, value=slowest[1],
                          threshold=min_mbps, unit="MB/s", action=Action.INVESTIGATE,
                          details=details,
                          message=f"{slowest[0].split()[0]}: {what} is slow: {slow} "
                                  f"(below {min_mbps:g} MB/s){via}")
        return Result(check, Status.PASS, pair=pair, value=slowest[1], threshold=min_mbps,
                      unit="MB/s", details=details,
                      message=f"{reader} read the {size_mib} MiB {writer} wrote to {what}, "
                              f"sha256 equal; {said}{via}")
    return Result(check, Status.PASS, pair=pair, details=details,
                  message=f"{reader} read the {size_mib} MiB {writer} wrote to {what}, "
                          f"sha256 equal{'; ' + said if said else ''}{via}")


def shared_probe(check: str, what: str, reader: Side, writer: Side, size_bytes: int,
                 min_mbps: float | None, direct: bool, write_too: bool,
                 timeout: float) -> Probe:
    name = f"aicluster-check-{secrets.token_hex(6)}"
    return Probe(
        check, LAYER,
        reader_command(reader, name, size_bytes, direct, SHARED_WAIT_S, write_too),
        partial(judge_shared, check, what, reader.node, writer.node, size_bytes, min_mbps),
        timeout=timeout, pair=(reader.node, writer.node),
        server=writer_command(writer, name, size_bytes, direct))


def judge_no_writable_export(node: str, done: Completed) -> Result:  # noqa: ARG001
    return Result("storage.nfs_shared", Status.SKIP, node=node,
                  message=f"{node}: no export root may write to (every export is read-only, "
                          "or squashes root and its directory is not writable by everyone): "
                          "give one export mode 1777 to test NFS across nodes")


def _writable_export(cluster) -> dict[str, Any] | None:
    """The first export root may write to over NFS: read-write, and root not squashed
    or the directory writable by everyone (mode o+w, such as 1777)."""
    for export in nfs_derive.export_list(cluster):
        if export["access_type"] != "RW":
            continue
        if export["squash"] == "No_Root_Squash" or int(str(export["mode"]), 8) & 0o002:
            return export
    return None


# ---------------------------------------------------------------------------
# Ceph
# ---------------------------------------------------------------------------


def ceph_command() -> str:
    t = CEPH_CONNECT_TIMEOUT
    return ("command -v ceph >/dev/null 2>&1 || { echo missing=ceph; exit 0; }; "
            f"echo @@status; ceph --connect-timeout {t} status -f json; "
            "echo \"@@status-rc=$?\"; "
            f"echo @@tree; ceph --connect-timeout {t} osd tree -f json; "
            "echo \"@@tree-rc=$?\"")


def _ceph_json(parts: list[tuple[str, str]], name: str) -> dict[str, Any] | None:
    """The JSON a ``ceph ... -f json`` section printed, when the command succeeded."""
    text = dict(parts).get(name, "").strip()
    if section_rc(parts, name) != "0" or not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def osd_states(tree: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``ceph osd tree -f json``: each OSD's ``{host, up, in}`` (its CRUSH host; in: a
    reweight above 0)."""
    if not tree:
        return {}
    nodes = {n["id"]: n for n in tree.get("nodes") or []}
    host_of = {}
    for n in nodes.values():
        if n.get("type") == "host":
            for child in n.get("children") or []:
                host_of[child] = n.get("name")
    out = {}
    for n in [*nodes.values(), *(tree.get("stray") or [])]:
        if n.get("type") == "osd":
            out[str(n.get("name"))] = {"host": host_of.get(n["id"], "?"),
                                       "up": n.get("status") == "up",
                                       "in": float(n.get("reweight") or 0) > 0}
    return out


#: A facet of Ceph's state: its status, the action it asks for, what to say (None: all
#: is well there) and its figures.
Facet = tuple[Status, Action, str, dict[str, Any]]

#: Worst first, for putting the facets of one result in order.
_ORDER = {Status.FAIL: 0, Status.WARN: 1, Status.PASS: 2}


def judge_ceph(node: str, expected_osds: int, done: Completed) -> Result:
    """``storage.ceph_health``, the worst of three facets: Ceph's own health
    (HEALTH_OK; WARN listing every check code, which of them only say the cluster is
    small being the operator's call; ERR), the OSDs (every one the inventory declares
    up and in, FAIL otherwise whatever the health says, naming the down ones and their
    hosts from the OSD tree), the placement groups (inactive: FAIL; not clean: WARN).
    Its value is the OSDs up against those declared."""
    check = "storage.ceph_health"
    if parse_kv(done.stdout).get("missing") == "ceph":
        return Result(check, Status.ERROR, node=node, action=Action.REDEPLOY,
                      message=f"{node}: the ceph command is not installed, though the node "
                              "is a Ceph monitor: deploy again")
    parts = sections(done.stdout)
    status = _ceph_json(parts, "status")
    if status is None:
        return Result(check, Status.FAIL, node=node, action=Action.INVESTIGATE,
                      message=f"{node}: `ceph status` got no answer from the monitors within "
                              f"{CEPH_CONNECT_TIMEOUT} s (no quorum? monitors down?): "
                              f"{_tail(done.stderr) or 'no message'}")
    facets = {"osds": _ceph_osds(expected_osds, status,
                                 osd_states(_ceph_json(parts, "tree"))),
              "health": _ceph_health(status), "pgs": _ceph_pgs(status)}
    worst = sorted(facets.values(), key=lambda f: _ORDER[f[0]])
    osds = facets["osds"][3]
    details = {name: f[3] for name, f in facets.items()}
    result = Result(check, worst[0][0], node=node, action=worst[0][1],
                    value=min(osds["num_up_osds"], osds["num_in_osds"]),
                    threshold=expected_osds, unit="OSDs", details=details,
                    message="; ".join(f[2] for f in worst))
    if result.status is not Status.PASS:
        result.message = f"{node}: " + "; ".join(f[2] for f in worst if f[0] is not
                                                 Status.PASS)
    return result


def _ceph_health(status: dict[str, Any]) -> Facet:
    health = status.get("health") or {}
    word = str(health.get("status") or health.get("overall_status") or "")
    checks = health.get("checks") or {}
    listed = "; ".join(f"{code} ({((c or {}).get('summary') or {}).get('message', '')})"
                       for code, c in sorted(checks.items()))
    details = {"status": word, "checks": sorted(checks)}
    if word == "HEALTH_OK":
        return Status.PASS, Action.NONE, "HEALTH_OK", details
    if word == "HEALTH_WARN":
        return Status.WARN, Action.MONITOR, f"Ceph reports HEALTH_WARN: {listed}", details
    if word == "HEALTH_ERR":
        return (Status.FAIL, Action.INVESTIGATE, f"Ceph reports HEALTH_ERR: {listed}",
                details)
    raise ValueError(f"unknown Ceph health {word!r}")


def _ceph_osds(expected: int, status: dict[str, Any],
               states: dict[str, dict[str, Any]]) -> Facet:
    osdmap = status.get("osdmap") or {}
    osdmap = osdmap.get("osdmap", osdmap)  # nested before Octopus
    total = int(osdmap.get("num_osds") or 0)
    up = int(osdmap.get("num_up_osds") or 0)
    inside = int(osdmap.get("num_in_osds") or 0)
    details = {"num_osds": total, "num_up_osds": up, "num_in_osds": inside,
               "declared": expected, "osds": states}
    down = [f"{name} on {s['host']}" for name, s in sorted(states.items()) if not s["up"]]
    out = [f"{name} on {s['host']}" for name, s in sorted(states.items()) if not s["in"]]
    if up < expected or inside < expected:
        said = []
        if total < expected:
            said.append(f"only {total} of the {expected} declared OSDs exist "
                        "(ceph_osd_devices of ceph_osds): deploy again")
        if up < total:
            said.append(f"{total - up} of {total} OSDs down"
                        + (f" ({', '.join(down)})" if down else "")
                        + ": a stopped OSD is marked down within about 30 s; "
                          "systemctl status ceph-osd@<id> on its host")
        if inside < total:
            said.append(f"{total - inside} of {total} OSDs out of the data placement"
                        + (f" ({', '.join(out)})" if out else ""))
        action = Action.REDEPLOY if total < expected else Action.RESTART_SERVICE
        return Status.FAIL, action, "; ".join(said), details
    if total > expected:
        return (Status.WARN, Action.INVESTIGATE,
                f"{total} OSDs in the cluster, the inventory declares {expected} "
                "(ceph_osd_devices of ceph_osds)", details)
    return Status.PASS, Action.NONE, f"{up} of {expected} declared OSDs up and in", details


def _ceph_pgs(status: dict[str, Any]) -> Facet:
    pgmap = status.get("pgmap") or {}
    total = int(pgmap.get("num_pgs") or 0)
    by_state = {str(s.get("state_name")): int(s.get("count") or 0)
                for s in pgmap.get("pgs_by_state") or []}
    inactive = {s: c for s, c in by_state.items() if "active" not in s.split("+")}
    unclean = {s: c for s, c in by_state.items()
               if "active" in s.split("+") and "clean" not in s.split("+")}
    details = {"num_pgs": total, "by_state": by_state}

    def listing(states: dict[str, int]) -> str:
        return ", ".join(f"{c} {s}" for s, c in sorted(states.items()))

    if inactive:
        return (Status.FAIL, Action.INVESTIGATE,
                f"{sum(inactive.values())} of {total} placement groups are not active, I/O "
                f"to them blocks: {listing(inactive)}", details)
    if unclean:
        return (Status.WARN, Action.MONITOR,
                f"{sum(unclean.values())} of {total} placement groups active but not clean "
                f"(recovering or degraded): {listing(unclean)}", details)
    return Status.PASS, Action.NONE, f"{total} placement groups active+clean", details


def judge_cephfs_mount(node: str, path: str, fstypes: tuple[str, ...],
                       done: Completed) -> Result:
    mounted = (parse_mounts(done.stdout) or [None])[0]
    problem = mount_problem(path, mounted, fstypes, "CephFS")
    if problem is not None:
        return Result("storage.cephfs_mount", Status.FAIL, node=node, action=problem[1],
                      message=f"{node}: {problem[0]}", details={"mounted": mounted})
    return Result("storage.cephfs_mount", Status.PASS, node=node, value=str(mounted["fstype"]),
                  message=f"{path}: CephFS ({mounted['fstype']}), read-write, answering")


# ---------------------------------------------------------------------------
# MinIO
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MinioTarget:
    """How a node reaches one MinIO server (its URL, the CA it needs) and the mc binary."""

    url: str
    cacert: str
    mc: str
    #: The deploy's mc with the root credentials (alias aicluster: this node's server),
    #: and the file holding those credentials.
    wrapper: str = MINIO_MC
    env_file: str = minio_derive.ENV_FILE


def minio_command(peer: MinioTarget, bucket: str, key: str, size_bytes: int) -> str:
    """Run on a MinIO server (its mc and /etc/default/minio): the peer's health
    endpoints; the bucket made if missing; an object PUT through this server (the
    deploy's aicluster-minio-mc), then read through the peer with the root credentials
    from /etc/default/minio in mc's environment only (MC_HOST_<alias>), then removed.
    Prints key=value lines; never a credential (mc's errors are stripped of any)."""
    mc, wrapper = shlex.quote(peer.mc), shlex.quote(peer.wrapper)
    env = shlex.quote(peer.env_file)
    cacert = f" --cacert {shlex.quote(peer.cacert)}" if peer.cacert else ""
    scheme, _, rest = peer.url.partition("://")
    target = shlex.quote(f"{MINIO_ALIAS}/{bucket}/{key}")
    ssl = (f"SSL_CERT_FILE={shlex.quote(peer.cacert)}; export SSL_CERT_FILE; "
           if peer.cacert else "")
    peer_get = (
        f"( . {env}; MC_HOST_{MINIO_PEER_ALIAS}=\"{scheme}://${{MINIO_ROOT_USER}}:"
        f"${{MINIO_ROOT_PASSWORD}}@{rest}\"; export MC_HOST_{MINIO_PEER_ALIAS}; {ssl}"
        f"exec {mc} --config-dir /root/.mc --quiet cat "
        f"{shlex.quote(f'{MINIO_PEER_ALIAS}/{bucket}/{key}')} )"
    )
    health = "; ".join(
        f"echo \"health_{name}=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 5"
        f"{cacert} {shlex.quote(f'{peer.url}/minio/health/{name}')})\""
        for name in ("live", "cluster"))
    return "; ".join([
        "LC_ALL=C; export LC_ALL",
        f"[ -r {env} ] || {{ echo missing={env}; exit 0; }}",
        f"for t in curl {wrapper} {mc}; do command -v \"$t\" >/dev/null 2>&1 || "
        "{ echo \"missing=$t\"; exit 0; }; done",
        health,
        "tmp=$(mktemp) && e=$(mktemp) || exit 1",
        "trap 'rm -f \"$tmp\" \"$e\"' EXIT; trap 'exit 143' INT TERM",
        "err() { tr '\\n' ' ' < \"$e\" | sed 's#://[^/@ ]*@#://***@#g' | cut -c1-300; }",
        f"head -c {int(size_bytes)} /dev/urandom > \"$tmp\"",
        "echo \"sha256=$(sha256sum < \"$tmp\" | cut -d' ' -f1)\"",
        f"{wrapper} mb --ignore-existing {shlex.quote(f'{MINIO_ALIAS}/{bucket}')} "
        ">/dev/null 2>\"$e\"; echo \"mb_rc=$?\"; echo \"mb_error=$(err)\"",
        f"{wrapper} cp \"$tmp\" {target} >/dev/null 2>\"$e\"; echo \"put_rc=$?\"; "
        "echo \"put_error=$(err)\"",
        f"echo \"get_sha256=$( {peer_get} 2>\"$e\" | sha256sum | cut -d' ' -f1)\"; "
        "echo \"get_error=$(err)\"",
        f"{wrapper} rm {target} >/dev/null 2>\"$e\"; echo \"rm_rc=$?\"; echo \"rm_error=$(err)\"",
    ])


def judge_minio(node: str, peer: str, bucket: str, key: str, done: Completed) -> Result:
    """``storage.minio``: the peer live and with write quorum, asked from ``node``; the
    object PUT through ``node`` read back through ``peer`` with the same bytes."""
    kv = parse_kv(done.stdout)
    check = "storage.minio"
    where = {"node": node} if node == peer else {"pair": (node, peer)}
    if "missing" in kv:
        return Result(check, Status.ERROR, action=Action.REDEPLOY, **where,
                      message=f"{node}: {kv['missing']} is missing, though the node is a "
                              "MinIO server (the minio deploy puts it there): deploy again")
    for name, meaning in (("live", "is not up"), ("cluster", "has no write quorum")):
        code = kv.get(f"health_{name}", "")
        if code != "200":
            got = "no answer" if code in ("", "000") else f"HTTP {code}"
            return Result(check, Status.FAIL, action=Action.RESTART_SERVICE, **where,
                          value=code, threshold="200",
                          message=f"{peer}: MinIO {meaning}: /minio/health/{name} gave "
                                  f"{got}, asked from {node} (systemctl status minio)")
    details = {"bucket": bucket, "key": key}
    if kv.get("mb_rc") != "0":
        return Result(check, Status.FAIL, action=Action.INVESTIGATE, details=details,
                      **where, message=f"{node}: cannot make or reach the bucket {bucket}: "
                                       f"{_tail(kv.get('mb_error', '')) or 'no message'}")
    if kv.get("put_rc") != "0":
        return Result(check, Status.FAIL, action=Action.INVESTIGATE, details=details,
                      **where, message=f"{node}: PUT of {bucket}/{key} failed: "
                                       f"{_tail(kv.get('put_error', '')) or 'no message'}")
    if not kv.get("sha256") or kv.get("get_sha256") != kv.get("sha256"):
        return Result(check, Status.FAIL, action=Action.INVESTIGATE, details=details,
                      **where,
                      message=f"{peer}: GET of {bucket}/{key} (put through {node}) returned "
                              f"other bytes or none: "
                              f"{_tail(kv.get('get_error', '')) or 'sha256 differs'}")
    details["removed"] = kv.get("rm_rc") == "0"
    left = "" if details["removed"] else (
        f"; the test object is left in {bucket} (mc rm: "
        f"{_tail(kv.get('rm_error', '')) or 'failed'}), overwritten by the next run")
    through = f"PUT through {node}, read through {peer}" if node != peer else \
        f"PUT and read through {node} (the only server)"
    return Result(check, Status.PASS, details=details, **where,
                  message=f"healthy (live, write quorum); {bucket}/{key}: {through}, "
                          f"sha256 equal{left}")


def _minio_target(ctx: Context, node: str) -> MinioTarget:
    cluster = ctx.cluster
    network = minio_derive.minio_network(cluster, {})
    v = layered("minio", ctx.host(node).data)
    c = minio_derive.cluster_data(cluster, {})
    scheme = "https" if minio_derive.tls_enabled(v) else "http"
    url = f"{scheme}://{minio_derive.url_hostname(node, network)}:{int(c['minio_port'])}"
    cacert = f"{v['minio_certs_dir']}/CAs/aicluster-ca.crt" if scheme == "https" else ""
    return MinioTarget(url=url, cacert=cacert, mc=str(v["minio_mc_binary"]))


def minio_probe(ctx: Context, node: str, peer: str) -> Probe:
    bucket = str(ctx.threshold(node, "storage.minio_bucket"))
    key = f"{node}-to-{peer}.bin"
    size = int(ctx.threshold(node, "storage.minio_object_kb")) * 1024
    pair = None if node == peer else (node, peer)
    return Probe("storage.minio", LAYER, minio_command(_minio_target(ctx, peer), bucket, key,
                                                       size),
                 partial(judge_minio, node, peer, bucket, key), timeout=90,
                 node=node if pair is None else None, pair=pair)


# ---------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------


def _cache_path(ctx: Context, node: str) -> str | None:
    """The NVMe cache's mount point, where the node is given the cache and has a drive
    for it (a gpu_nodes host without drives gets no cache)."""
    if "nvme_cache" not in ctx.host(node).components():
        return None
    paths = nvme_derive.mounts(ctx.cluster, node, ctx.host(node).data)
    return paths[0] if paths else None


def _cephfs_mount(ctx: Context, node: str) -> tuple[str, tuple[str, ...]] | None:
    path = ceph_derive.cephfs_mount(ctx.cluster, node, ctx.host(node).data)
    if not path:
        return None
    kind = str(ctx.setting(node, "ceph", "ceph_cephfs_mount_type"))
    return path, tuple(ceph_derive.MOUNT_TYPES[kind])


def _nfs_sides(ctx: Context) -> tuple[dict[str, Any] | None, dict[str, Side]]:
    """The export the pair test writes to and how each node reaches it: the server
    (its directory) and every client that mounts that export."""
    export = _writable_export(ctx.cluster)
    server = nfs_derive.server_host(ctx.cluster)
    address = nfs_derive.server_address(ctx.cluster)
    if export is None or server is None or address is None:
        return export, {}
    host = f"[{address}]" if ":" in address else address
    sides: dict[str, Side] = {}
    for node in ctx.nodes():
        if node == server:
            owner = "" if export["squash"] == "No_Root_Squash" else \
                f"{export['anonuid']}:{export['anongid']}"
            sides[node] = Side(node, "local", export["path"], owner=owner)
        elif node in ctx.cluster.group("nfs_clients"):
            for m in nfs_derive.mount_list(ctx.cluster, node, ctx.host(node).data):
                if m["export"] == export["path"]:
                    sides[node] = Side(node, "nfs", m["path"],
                                       url=f"nfs://{host}{export['path']}")
                    break
    return export, sides


def probes(ctx: Context) -> list[Probe]:
    out: list[Probe] = []
    for node in ctx.nodes():
        path = _cache_path(ctx, node)
        if path is None:
            continue
        out.append(Probe(
            "storage.nvme_mount", LAYER, nvme_mount_command(path),
            partial(judge_nvme_mount, node, path,
                    ctx.threshold(node, "storage.nvme_used_warn_percent"),
                    ctx.threshold(node, "storage.nvme_used_fail_percent")),
            timeout=20, node=node))
        if ctx.standard:
            size = int(ctx.threshold(node, "storage.nvme_fio_size_mb"))
            seconds = int(ctx.threshold(node, "storage.nvme_fio_seconds"))
            out.append(Probe(
                "storage.nvme_fio", LAYER, nvme_fio_command(path, size, seconds),
                partial(judge_nvme_fio, node, path, size,
                        ctx.threshold(node, "storage.nvme_read_min_mbps"),
                        ctx.threshold(node, "storage.nvme_write_min_mbps"),
                        ctx.threshold(node, "storage.nvme_p99_read_max_ms")),
                timeout=3 * seconds + 90, node=node))
    for node in ctx.in_groups("nfs_clients"):
        mounts = nfs_derive.mount_list(ctx.cluster, node, ctx.host(node).data)
        if mounts:
            out.append(Probe("storage.nfs_mount", LAYER,
                             nfs_mount_command([m["path"] for m in mounts]),
                             partial(judge_nfs_mount, node, mounts),
                             timeout=15 + (MOUNT_STAT_TIMEOUT + 2) * len(mounts), node=node))
    if ctx.standard:
        export, sides = _nfs_sides(ctx)
        server = nfs_derive.server_host(ctx.cluster)
        if export is None and server in ctx.nodes() and ctx.cluster.group("nfs_clients"):
            out.append(Probe("storage.nfs_shared", LAYER, "true",
                             partial(judge_no_writable_export, server), timeout=10,
                             node=server))
    mons = ctx.in_groups("ceph_mons")
    if mons:
        out.append(Probe("storage.ceph_health", LAYER, ceph_command(),
                         partial(judge_ceph, mons[0], ceph_derive.osd_count(ctx.cluster)),
                         timeout=2 * CEPH_CONNECT_TIMEOUT + 15, node=mons[0]))
    for node in ctx.in_groups("ceph_clients"):
        found = _cephfs_mount(ctx, node)
        if found is not None:
            out.append(Probe("storage.cephfs_mount", LAYER, mount_command(found[0]),
                             partial(judge_cephfs_mount, node, found[0], found[1]),
                             timeout=15, node=node))
    if ctx.standard:
        servers = ctx.in_groups("minio")
        if len(servers) == 1:
            out.append(minio_probe(ctx, servers[0], servers[0]))
    return out


def pair_checks(ctx: Context) -> list[PairCheck]:
    if not ctx.standard:
        return []
    out: list[PairCheck] = []
    export, sides = _nfs_sides(ctx)
    if export is not None and len(sides) >= 2:
        server = nfs_derive.server_host(ctx.cluster)

        def nfs_pair(a: str, b: str) -> Probe:
            if a == server:  # the server writes, a client reads (over NFS)
                a, b = b, a
            size = int(ctx.threshold(a, "storage.nfs_size_mb")) * 1048576
            return shared_probe("storage.nfs_shared", f"the NFS export {export['path']}",
                                sides[a], sides[b], size,
                                ctx.threshold(a, "storage.nfs_min_mbps"), direct=True,
                                write_too=True, timeout=SHARED_WAIT_S + 180)

        out.append(PairCheck("storage.nfs_shared", LAYER, list(sides), nfs_pair))
    cephfs = {n: found for n in ctx.in_groups("ceph_clients")
              if (found := _cephfs_mount(ctx, n)) is not None}
    if len(cephfs) >= 2:
        def cephfs_pair(a: str, b: str) -> Probe:
            size = int(ctx.threshold(a, "storage.cephfs_size_mb")) * 1048576
            side = {n: Side(n, "cephfs", cephfs[n][0], fstypes=cephfs[n][1]) for n in (a, b)}
            return shared_probe("storage.cephfs", "CephFS", side[a], side[b], size, None,
                                direct=False, write_too=False, timeout=SHARED_WAIT_S + 120)

        out.append(PairCheck("storage.cephfs", LAYER, list(cephfs), cephfs_pair))
    servers = ctx.in_groups("minio")
    if len(servers) >= 2:
        out.append(PairCheck("storage.minio", LAYER, servers,
                             lambda a, b: minio_probe(ctx, a, b)))
    return out
