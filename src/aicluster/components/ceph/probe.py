"""Ceph's state on a node, as both engines read it: a small Python program run on the
node (the installed and candidate Ceph release, monitor quorum, OSDs, CRUSH rules,
pools, CephFS, the manager's modules and their options) and the parsing of its JSON answer.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

PROGRAM = r'''
import hashlib, json, os, re, shutil, subprocess, sys
a = json.loads(sys.argv[1])
t = str(a.get("timeout", 60))
def run(argv, timeout=120, env=None):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None
def js(argv, timeout=120, env=None):
    text = run(argv, timeout, env)
    try:
        return json.loads(text) if text and text.strip() else None
    except ValueError:
        return None
out = {"mon": os.path.exists("/var/lib/ceph/mon/ceph-%s/keyring" % a["host"]),
       "osds": {}, "mounted": None, "cluster": None}
have_cv = any(os.access(os.path.join(d, "ceph-volume"), os.X_OK)
              for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"))
lvm = None
if have_cv and a["mode"] == "lvm":
    lvm = js(["ceph-volume", "lvm", "list", "--format", "json"])
for dev in a["devices"]:
    real = os.path.realpath(dev)
    found = None
    if have_cv and os.path.exists(real):
        if a["mode"] == "lvm":
            for osd_id, parts in (lvm or {}).items():
                for part in parts:
                    if real in part.get("devices", []) and part.get("type") == "block":
                        tags = part.get("tags", {})
                        found = {"ceph_fsid": tags.get("ceph.cluster_fsid", ""),
                                 "osd_id": int(osd_id), "osd_uuid": tags.get("ceph.osd_fsid", "")}
        else:
            # ceph-volume skips loop devices unless told (a loop device named in the
            # inventory is a stand-in disk: the testbed's).
            env = dict(os.environ, CEPH_VOLUME_ALLOW_LOOP_DEVICES="1") \
                if real.startswith("/dev/loop") else None
            listed = js(["ceph-volume", "raw", "list", real, "--format", "json"],
                        env=env) or {}
            for osd in listed.values():
                found = {k: osd.get(k) for k in ("ceph_fsid", "osd_id", "osd_uuid")}
    if found is not None:
        unit = "ceph-osd@%s" % found["osd_id"]
        found["running"] = run(["systemctl", "is-active", "--quiet", unit]) is not None
    out["osds"][dev] = found
# The Ceph release: the installed ceph-common (every Ceph host has it) as the package
# manager records it, else `ceph --version`; and the version the package manager would
# install now, from its local index (no network).
rel = {"installed": None, "candidate": None, "unreadable": ""}
if shutil.which("dpkg-query"):
    text = run(["dpkg-query", "-W", "-f=${Status}\t${Version}", "ceph-common"])
    status, _, version = (text or "").partition("\t")
    if status.strip().endswith(" installed"):
        rel["installed"] = version.strip()
        if not version.strip():
            rel["unreadable"] = "dpkg lists ceph-common as installed with no version"
    for line in (run(["apt-cache", "policy", "ceph-common"]) or "").splitlines():
        key, _, value = line.strip().partition(":")
        if key == "Candidate" and value.strip() not in ("", "(none)"):
            rel["candidate"] = value.strip()
elif shutil.which("rpm"):
    text = run(["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", "ceph-common"])
    if text and text.strip():
        rel["installed"] = text.strip()
    if shutil.which("dnf"):
        text = run(["dnf", "-q", "--cacheonly", "repoquery", "--latest-limit=1",
                    "--qf", "%{version}-%{release}", "ceph-common"])
        lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
        rel["candidate"] = lines[-1] if lines else None
if not rel["installed"] and shutil.which("ceph"):
    found = re.search(r"ceph version (\S+)", run(["ceph", "--version"], 30) or "")
    if found:
        rel["installed"] = found.group(1)
    else:
        rel["unreadable"] = "%s is there but `ceph --version` names no version" \
            % shutil.which("ceph")
out["release"] = rel
if a.get("cluster") and os.path.exists("/etc/ceph/ceph.conf") \
        and os.path.exists("/etc/ceph/ceph.client.admin.keyring"):
    ceph = ["ceph", "--connect-timeout", t, "-f", "json"]
    auth = js(ceph + ["auth", "ls"], int(t) + 10)
    if auth is not None:
        pools = js(ceph + ["osd", "pool", "ls", "detail"]) or []
        fs = js(ceph + ["fs", "ls"]) or []
        # Pools name their CRUSH rule by id; the rule dump maps ids to names.
        rules = js(ceph + ["osd", "crush", "rule", "dump"])
        rule_names = {r.get("rule_id"): r.get("rule_name") for r in rules or []}
        # The manager's modules (enabled, and always on: a list for the running release,
        # a map by release in older output) and the prometheus module's options set for
        # the mgr section (only these: other modules keep passwords among their options),
        # as the monitors store them (config/<section>/<name>): with a manager's own name
        # in a localized one (mgr/<module>/<mgr id>/<option>), which `config dump -f
        # json` shows without it in releases older than Ceph's fix for tracker 62379
        # (ceph PR 52906, 2023; backported to pacific in PR 53984).
        mods = js(ceph + ["mgr", "module", "ls"])
        always = (mods.get("always_on_modules") if isinstance(mods, dict) else None) or []
        if isinstance(always, dict):
            always = [m for names in always.values() for m in names]
        conf = js(ceph + ["config-key", "dump", "config/mgr/mgr/prometheus/"])
        out["cluster"] = {
            "reachable": True,
            "auth": {e["entity"]: {"key": hashlib.sha256(e.get("key", "").encode()).hexdigest(),
                                   "caps": e.get("caps", {})}
                     for e in auth.get("auth_dump", [])},
            "crush_rules": sorted(n for n in rule_names.values() if n) if rules is not None
            else None,
            "pools": {p["pool_name"]: {"size": p.get("size"), "min_size": p.get("min_size"),
                                       "pg_num": p.get("pg_num"),
                                       "crush_rule": rule_names.get(p.get("crush_rule")),
                                       "applications": sorted(p.get("application_metadata") or {})}
                      for p in pools},
            "fs": {f["name"]: {"metadata_pool": f.get("metadata_pool"),
                               "data_pools": f.get("data_pools", [])} for f in fs},
            "mgr_modules": {"enabled": sorted(mods.get("enabled_modules") or []),
                            "always_on": sorted(always)} if isinstance(mods, dict) else None,
            "mgr_config": {k[len("config/mgr/"):]: str(value) for k, value in conf.items()
                           if k.startswith("config/mgr/mgr/prometheus/")}
            if isinstance(conf, dict) else None,
        }
    else:
        out["cluster"] = {"reachable": False}
out["targets"] = {t: (run(["systemctl", "is-enabled", t]) or "").strip() == "enabled"
                  for t in a.get("targets", [])}
if a.get("mount"):
    text = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-M", a["mount"]])
    if text and text.strip():
        source, _, fstype = text.strip().partition(" ")
        out["mounted"] = {"source": source, "fstype": fstype.strip()}
        if "ceph" in fstype:
            # A client the MDS evicted (no word from it past session_autoclose, 300 s:
            # a long network cut) keeps its mount, which then answers nothing.
            out["mounted"]["answers"] = run(["stat", "-c", "%i", a["mount"]], 15) is not None
print("@@ceph " + json.dumps(out, sort_keys=True))
'''


def request_text(args: dict[str, Any]) -> str:
    """What to read, as the fact's one (hashable) argument: host, mode, devices,
    cluster (bool), mount, timeout."""
    return json.dumps(args, sort_keys=True)


def command_text(request: str) -> str:
    """The shell that reads the node (root: ceph-volume and the admin keyring)."""
    return f"python3 -c {shlex.quote(PROGRAM)} {shlex.quote(request)}"


def parse(lines) -> dict[str, Any]:
    """The JSON the program printed (the default when nothing could be read)."""
    for line in lines:
        line = str(line)
        if line.startswith("@@ceph "):
            try:
                return json.loads(line[len("@@ceph "):])
            except ValueError:
                break
    return {"mon": False, "osds": {}, "mounted": None, "cluster": None}

