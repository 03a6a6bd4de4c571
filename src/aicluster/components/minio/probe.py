"""What a MinIO server has: the binary's and mc's versions, the mounted drives and, from
the first server, the buckets; one shell command and its key=value answer.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from typing import Any

MC = "/usr/local/sbin/aicluster-minio-mc"
ALIAS = "aicluster"


def command_text(binary: str, mc_binary: str, directories: Iterable[str] = (),
                 buckets: Iterable[str] | None = None, timeout: int = 20) -> str:
    """The shell that reads a node (root). ``buckets``: the bucket names to read (on
    the first MinIO host), or None to read none."""
    b, m = shlex.quote(binary), shlex.quote(mc_binary)
    lines = [
        f"echo \"minio=$(sha256sum {b} 2>/dev/null | cut -d' ' -f1)\"",
        f"echo \"mc=$(sha256sum {m} 2>/dev/null | cut -d' ' -f1)\"",
        'echo "active=$(systemctl is-active minio 2>/dev/null)"',
        'echo "enabled=$(systemctl is-enabled minio 2>/dev/null)"',
        "p=$(systemctl show -p MainPID --value minio 2>/dev/null)",
        'if [ -n "$p" ] && [ "$p" != 0 ]; then echo "exe=$(readlink /proc/$p/exe 2>/dev/null)"; fi',
        "r=$(stat -c %d / 2>/dev/null)",
        f"for f in {b}.RELEASE.*; do if [ -f \"$f\" ]; then echo \"release=$f\"; fi; done",
    ]
    for path in directories:
        q = shlex.quote(path)
        lines.append(
            f"d={q}; while [ ! -e \"$d\" ]; do d=$(dirname \"$d\"); done; "
            f"if [ \"$(stat -c %d \"$d\" 2>/dev/null)\" = \"$r\" ]; then echo 'dir='{q}' root'; "
            f"else echo 'dir='{q}' other'; fi"
        )
    if buckets is not None:
        t = int(timeout)
        body = [
            f"o=$(timeout {t} {MC} ls --json {ALIAS}/ 2>/dev/null)",
            'echo "mc-rc=$?"',
            "printf '%s\\n' \"$o\" | sed -n 's/^{/bucket={/p'",
        ]
        for name in buckets:
            q = shlex.quote(f"{ALIAS}/{name}")
            n = shlex.quote(name)
            body.append(f"echo anonymous={n} \"$(timeout {t} {MC} anonymous get --json {q} "
                        "2>/dev/null | tr -d '\\n')\"")
            body.append(f"echo versioning={n} \"$(timeout {t} {MC} version info --json {q} "
                        "2>/dev/null | tr -d '\\n')\"")
        lines.append(
            f"if [ -x {MC} ] && [ \"$(systemctl is-active minio 2>/dev/null)\" = active ]; "
            f"then {'; '.join(body)}; fi"
        )
    lines.append("true")
    return "; ".join(lines)


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def parse(lines: Iterable[str]) -> dict[str, Any]:
    """``{"minio", "mc", "active", "enabled", "exe", "releases": [paths], "dirs": {path:
    "root"|"other"},
    "buckets": None (not read) | {"reachable": bool, "names": [...], "anonymous":
    {name: permission}, "versioning": {name: status}}}``."""
    out: dict[str, Any] = {"minio": "", "mc": "", "active": "", "enabled": "", "exe": "",
                           "releases": [], "dirs": {}, "buckets": None}
    buckets: dict[str, Any] = {"reachable": False, "names": [], "anonymous": {},
                               "versioning": {}}
    for raw in lines:
        line = str(raw).rstrip("\n")
        key, _, value = line.partition("=")
        if key in ("minio", "mc", "active", "enabled", "exe"):
            out[key] = value.strip()
        elif key == "release":
            out["releases"].append(value.strip())
        elif key == "dir":
            path, _, where = value.rpartition(" ")
            out["dirs"][path] = where
        elif key == "mc-rc":
            out["buckets"] = buckets
            buckets["reachable"] = value.strip() == "0"
        elif key == "bucket":
            entry = _json(value)
            name = str(entry.get("key", "")).rstrip("/")
            if name and entry.get("type", "folder") == "folder":
                buckets["names"].append(name)
        elif key in ("anonymous", "versioning"):
            name, _, text = value.partition(" ")
            entry = _json(text)
            if key == "anonymous" and entry.get("status") == "success":
                permission = str(entry.get("permission", ""))
                # mc calls a bucket without a policy "private" (its stringToAccessPerm);
                # the inventory, like `mc anonymous set`, says "none".
                buckets["anonymous"][name] = "none" if permission == "private" else permission
            elif key == "versioning" and entry.get("status") == "success":
                status = (entry.get("versioning") or {}).get("status", "")
                buckets["versioning"][name] = str(status or "")
    return out

