"""The ceph component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import shlex
import struct
import uuid
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from aicluster.common.disks import cache_devices, check_devices, describe, osd_devices
from aicluster.common.disks import command_text as block_command_text
from aicluster.common.disks import parse as block_parse
from aicluster.common.mounts import fstab_python_regexp, mount_command
from aicluster.common.networks import host_address, pick_network
from aicluster.common.settings import config_text, differs_from_first, layered, merge_config
from aicluster.components.ceph.probe import command_text as ceph_command_text
from aicluster.components.ceph.probe import parse as ceph_parse
from aicluster.components.ceph.probe import request_text
from aicluster.inventory import Cluster
from aicluster.secrets import read_secret
from aicluster.secrets import secret_ref as _secret_ref

CONF = "/etc/ceph/ceph.conf"
ADMIN_KEYRING = "/etc/ceph/ceph.client.admin.keyring"
#: mon. and every entity: what the monitors are made with (ceph-mon --mkfs).
MON_KEYRING = "/etc/ceph/aicluster-mon.keyring"
#: Every entity but mon.: what the first monitor registers (ceph auth import).
AUTH_KEYRING = "/etc/ceph/aicluster-auth.keyring"
BOOTSTRAP_OSD_KEYRING = "/var/lib/ceph/bootstrap-osd/ceph.keyring"
MONMAP = "/var/lib/ceph/tmp/aicluster-monmap"
OSD_TOOL = "/usr/local/sbin/aicluster-ceph-osd"
OSD_DEVICES_FILE = "/etc/ceph/aicluster-osd-devices"
OSD_UNIT = "aicluster-ceph-osds.service"
#: What findmnt shows at the mount point once CephFS is mounted, by client.
MOUNT_TYPES = {"fuse": ["fuse.ceph-fuse", "fuse.ceph"], "kernel": ["ceph"]}
#: Keys of ceph.conf computed from the inventory: ceph_config may not set them.
DERIVED_KEYS = ("fsid", "mon_initial_members", "mon_host", "public_network",
                "cluster_network", "osd_pool_default_size", "osd_pool_default_min_size",
                "osd_crush_chooseleaf_type", "mon_allow_pool_size_one")
#: The namespace the keys and the fsid are derived in (from the cluster's secret).
KEY_CONTEXT = b"aicluster-ceph/"
#: Ceph's CryptoKey header: type AES (1), created (seconds, nanoseconds), length 16.
KEY_HEADER = struct.pack("<HIIH", 1, 0, 0, 16)
#: Ceph's stable releases aicluster knows (ceph_release), by codename: each one's major
#: version (what `ceph --version` and the packages' versions begin with). Ceph's release
#: index: docs.ceph.com/en/latest/releases/.
RELEASES = {"pacific": 16, "quincy": 17, "reef": 18, "squid": 19, "tentacle": 20,
            "umbrella": 21}
#: Debian's and Ubuntu's suite (codename) by os-release ID and VERSION_ID, for an
#: os-release that does not give VERSION_CODENAME.
SUITES = {("debian", "12"): "bookworm", ("debian", "13"): "trixie",
          ("ubuntu", "22.04"): "jammy", ("ubuntu", "24.04"): "noble"}
#: The CRUSH rules the deploy makes (one per failure domain in use) are named so.
CRUSH_RULE_PREFIX = "aicluster-"
#: The manager module that serves the cluster's metrics to Prometheus.
MGR_PROMETHEUS = "prometheus"


# ---------------------------------------------------------------------------
# Values computed from the whole inventory (both engines use these)
# ---------------------------------------------------------------------------


def ceph_hosts(cluster: Cluster) -> list[str]:
    """Every host given the component, in inventory order."""
    return [n for n, h in cluster.hosts.items() if "ceph" in h.components()]


def first_mon(cluster: Cluster) -> str | None:
    mons = cluster.group("ceph_mons")
    return mons[0] if mons else None


def cluster_data(cluster: Cluster, data: Mapping[str, Any]) -> dict[str, Any]:
    """The cluster-wide settings: the first monitor's (set them for every Ceph host,
    e.g. in group_data), else the given host's."""
    mon = first_mon(cluster)
    return layered("ceph", cluster.hosts[mon].data if mon else data)


def ceph_network(cluster: Cluster, data: Mapping[str, Any]) -> str:
    """The public network: ``ceph_network``, else storage when every Ceph host has an
    address there, else fabric likewise, else management."""
    return pick_network(cluster, cluster_data(cluster, data)["ceph_network"],
                        ceph_hosts(cluster), ("storage", "fabric"))


def osd_hosts(cluster: Cluster) -> list[str]:
    return list(cluster.group("ceph_osds"))


def osd_count(cluster: Cluster) -> int:
    """The OSDs the inventory names (ceph_osd_devices of the ceph_osds hosts)."""
    return sum(len(osd_devices(cluster.hosts[n].data)) for n in osd_hosts(cluster))


def default_size(cluster: Cluster, v: Mapping[str, Any]) -> int:
    """Replicas of a pool: ``ceph_pool_default_size``, else one per OSD up to 3."""
    if v["ceph_pool_default_size"] is not None:
        return int(v["ceph_pool_default_size"])
    return max(1, min(3, osd_count(cluster)))


def failure_domain(cluster: Cluster, v: Mapping[str, Any]) -> str:
    """``ceph_failure_domain``, else host when there are as many OSD hosts as replicas,
    else osd (a single storage host keeps its replicas on different OSDs)."""
    if v["ceph_failure_domain"]:
        return str(v["ceph_failure_domain"])
    return "host" if len(osd_hosts(cluster)) >= default_size(cluster, v) else "osd"


def min_size(size: int) -> int:
    """Ceph's own rule for min_size: size - size // 2."""
    return size - size // 2


def crush_rule(cluster: Cluster, v: Mapping[str, Any]) -> str:
    """The replicated CRUSH rule every pool of the deploy uses: ``aicluster-host`` or
    ``aicluster-osd`` (:func:`failure_domain`), made by the deploy on the ``default``
    root. A cluster that grows from one OSD host to as many as its replicas switches
    its pools to ``aicluster-host`` at the next deploy."""
    return CRUSH_RULE_PREFIX + failure_domain(cluster, v)


def version_major(version: str | None) -> int | None:
    """The major version of a Ceph package or ``ceph --version`` version
    ("2:18.2.4-1jammy", "16.2.15+ds-0+deb12u1", "20.2.5"), None when there is none."""
    match = re.match(r"^(?:\d+:)?(\d+)\.", str(version or "").strip())
    return int(match.group(1)) if match else None


def release_name(major: int | None) -> str:
    """"tentacle 20", or the bare major version for a release aicluster does not know."""
    names = {m: n for n, m in RELEASES.items()}
    return f"{names[major]} {major}" if major in names else str(major)


def repo_suite(family: str, distro_id: str, version: str, codename: str = "") -> str:
    """The directory of Ceph's repository a system reads: the Debian or Ubuntu suite
    (``debian-<release>/dists/<suite>``: bookworm, jammy, noble), ``el<major>`` on Red
    Hat's family (``rpm-<release>/el9``); "" when it cannot be told."""
    distro_id = str(distro_id or "").lower()
    version = str(version or "")
    if family == "RedHat":
        major = version.split(".")[0]
        return f"el{major}" if major.isdigit() else ""
    if codename:
        return str(codename).lower()
    return SUITES.get((distro_id, version)) or SUITES.get((distro_id, version.split(".")[0]),
                                                           "")


def repo_origin(url: str) -> str:
    """The site apt names a repository's packages by (``Pin: origin``): the URL's host
    name alone, without user, port or path (apt 2.6 matches ``origin "host"`` for
    ``http://host:8080/...``, never ``"host:8080"``; "" for a file: URL)."""
    return urlsplit(url).hostname or ""


def release_request(v: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`decide` checks a host's Ceph against: the pinned release, its major
    version, where the packages come from and the systems Ceph's repository builds it
    for (``ceph_repo_builds``)."""
    release = str(v["ceph_release"])
    return {"name": release, "major": RELEASES.get(release), "source": str(v["ceph_source"]),
            "builds": [str(s) for s in (v["ceph_repo_builds"] or {}).get(release) or []]}


def release_check_command(v: Mapping[str, Any], host_name: str) -> str:
    """Run after Ceph's packages were installed or changed: the installed Ceph is the
    pinned release (``ceph --version``), else the deploy stops on this host, naming both.
    Before the install, :func:`decide` checked what the host had and, where it could
    be read, what it would get; this catches a repository that served another release."""
    release = str(v["ceph_release"])
    major = RELEASES.get(release)
    where = (f"check ceph_repo_url and its debian-{release}/ or rpm-{release}/ directory"
             if v["ceph_source"] == "ceph_repo" else
             "the distribution gave another release: pin the one it ships")
    return (
        "v=$(ceph --version 2>/dev/null | sed -n 's/^ceph version \\([0-9]*\\)\\..*/\\1/p'); "
        f'if [ "$v" != {major} ]; then echo "aicluster: host {host_name}: the installed Ceph '
        f'is ${{v:-unreadable}}, not ceph_release {release} ({major}): {where}" >&2; exit 1; fi'
    )


def pools(cluster: Cluster, v: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pools to have: ``ceph_pools`` with their defaults filled in, then the CephFS
    pools when ceph_mds has hosts (their application is set by ``ceph fs new``); every
    one on the deploy's CRUSH rule (:func:`crush_rule`)."""
    size = default_size(cluster, v)
    rule = crush_rule(cluster, v)
    out = []
    for p in v["ceph_pools"] or []:
        s = int(p.get("size") or size)
        out.append({
            "name": str(p["name"]),
            "pg_num": int(p.get("pg_num") or v["ceph_pool_default_pg_num"]),
            "size": s,
            "min_size": int(p.get("min_size") or min_size(s)),
            "application": str(p.get("application") or "rbd"),
            "crush_rule": rule,
        })
    if cluster.group("ceph_mds"):
        for key, pg in (("ceph_cephfs_metadata_pool", "ceph_cephfs_metadata_pg_num"),
                        ("ceph_cephfs_data_pool", "ceph_cephfs_data_pg_num")):
            out.append({"name": str(v[key]), "pg_num": int(v[pg]), "size": size,
                        "min_size": min_size(size), "application": "", "crush_rule": rule})
    return out


def client_caps(v: Mapping[str, Any], cephfs: bool) -> dict[str, str]:
    """client.<ceph_client_name>: read the cluster maps, use CephFS, read and write
    its data pool and ceph_client_pools, nothing else."""
    pool_names = ([str(v["ceph_cephfs_data_pool"])] if cephfs else []) + [
        str(p) for p in v["ceph_client_pools"] or []
    ]
    caps = {"mon": "allow r"}
    if cephfs:
        caps["mds"] = "allow rw"
    if pool_names:
        caps["osd"] = ", ".join(f"allow rw pool={p}" for p in pool_names)
    return caps


def entities(cluster: Cluster, v: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cephx entities of the cluster and their caps (no keys: see :func:`keys`)."""
    out = [
        {"entity": "client.admin", "caps": {"mds": "allow *", "mgr": "allow *",
                                            "mon": "allow *", "osd": "allow *"}},
        {"entity": "client.bootstrap-osd", "caps": {"mgr": "allow r",
                                                    "mon": "profile bootstrap-osd"}},
    ]
    for name in cluster.group("ceph_mons"):
        out.append({"entity": f"mgr.{name}", "caps": {"mds": "allow *",
                                                      "mon": "allow profile mgr",
                                                      "osd": "allow *"}})
    for name in cluster.group("ceph_mds"):
        out.append({"entity": f"mds.{name}", "caps": {"mds": "allow", "mgr": "allow profile mds",
                                                      "mon": "allow profile mds",
                                                      "osd": "allow rwx"}})
    if cluster.group("ceph_clients"):
        out.append({"entity": f"client.{v['ceph_client_name']}",
                    "caps": client_caps(v, bool(cluster.group("ceph_mds")))})
    return out


def mon_addrs(cluster: Cluster, v: Mapping[str, Any], network: str) -> list[dict[str, str]]:
    """Each monitor's name, address and address vector (msgr2 beside v1)."""
    out = []
    for name in cluster.group("ceph_mons"):
        ip = host_address(cluster, name, network) or cluster.hosts[name].address
        host_ip = f"[{ip}]" if ":" in ip else ip
        vector = f"[v2:{host_ip}:3300,v1:{host_ip}:6789]" if v["ceph_msgr2"] else \
            f"v1:{host_ip}:6789"
        out.append({"name": name, "address": ip, "vector": vector})
    return out


def mgr_module_config(cluster: Cluster, c: Mapping[str, Any],
                      mons: list[dict[str, str]]) -> tuple[list[str], dict[str, str]]:
    """The manager modules the deploy enables and the module options it sets (``ceph
    config set mgr NAME VALUE``), as Ceph shows them in ``ceph config dump``.

    With ``ceph_mgr_prometheus``: the ``prometheus`` module, its port
    (``mgr/prometheus/server_port``, ``ceph_mgr_prometheus_port``) and, for each manager
    (one per monitor host, ``ceph-mgr@<host>``: its id is the host's name), the address
    it listens on: the host's own address on Ceph's public network, as the localized
    option ``mgr/prometheus/<mgr id>/server_addr``. Ceph's documentation, verified
    2026 (docs.ceph.com/en/squid/mgr/prometheus/ "Prometheus Module": ``ceph mgr module
    enable prometheus``; options ``server_addr``, default ``::`` (every address) and
    ``server_port``, default 9283; "must be restarted to apply configuration changes";
    doc/mgr/modules.rst "Configuration options": options are named
    ``mgr/<module name>/<option>``, and an option that differs by the node a manager
    runs on, such as the address to listen on, is set as ``mgr/<module name>/<mgr
    id>/<option>``; the module reads ``server_addr`` with
    ``get_localized_module_option``, which takes the manager's own key first). One
    address per manager keeps each listening on the cluster network alone, never on
    every address of the host."""
    if not c["ceph_mgr_prometheus"] or not mons:
        return [], {}
    options = {f"mgr/{MGR_PROMETHEUS}/server_port": str(int(c["ceph_mgr_prometheus_port"]))}
    for m in mons:
        options[f"mgr/{MGR_PROMETHEUS}/{m['name']}/server_addr"] = m["address"]
    return [MGR_PROMETHEUS], options


def merge_sections(default: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, dict]:
    """``ceph_config`` over ``ceph_default_config``, section by section; a key set to
    null is removed."""
    return {section: merge_config((default or {}).get(section), (user or {}).get(section))
            for section in {**(default or {}), **(user or {})}}


def ceph_conf(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> list[dict]:
    """ceph.conf as ``[{"name": section, "options": [[key, value], ...]}]``."""
    v = layered("ceph", data)
    c = cluster_data(cluster, data)
    network = ceph_network(cluster, data)
    mons = mon_addrs(cluster, c, network)
    size = default_size(cluster, c)
    derived: list[list[str]] = [
        ["mon_initial_members", ", ".join(m["name"] for m in mons)],
        ["mon_host", ",".join(m["vector"] for m in mons)],
        ["public_network", str(cluster.spec.networks[network].subnet)],
    ]
    if c["ceph_cluster_network"]:
        derived.append(
            ["cluster_network", str(cluster.spec.networks[c["ceph_cluster_network"]].subnet)]
        )
    derived += [["osd_pool_default_size", str(size)],
                ["osd_pool_default_min_size", str(min_size(size))],
                ["osd_crush_chooseleaf_type",
                 "1" if failure_domain(cluster, c) == "host" else "0"]]
    if size == 1:
        derived.append(["mon_allow_pool_size_one", "true"])
    config = merge_sections(v["ceph_default_config"], v["ceph_config"])
    sections = [{"name": "global", "options": derived + [
        [k, config_text(o, "true", "false")] for k, o in config.pop("global", {}).items()
    ]}]
    for name, options in config.items():
        if options:
            sections.append({"name": name, "options": [
                [k, config_text(o, "true", "false")] for k, o in options.items()]})
    return sections


def roles(cluster: Cluster, host_name: str) -> dict[str, bool]:
    groups = cluster.hosts[host_name].groups
    return {
        "mon": "ceph_mons" in groups,
        "osd": "ceph_osds" in groups,
        "mds": "ceph_mds" in groups,
        "client": "ceph_clients" in groups,
        "first_mon": host_name == first_mon(cluster),
    }


def secret_ref(cluster: Cluster, data: Mapping[str, Any]) -> dict[str, str]:
    """Where the cluster's Ceph secret is: the inventory's secret, else a file on the
    deploying machine, ``~/.local/share/aicluster/<cluster_name>/ceph.secret``."""
    return _secret_ref(cluster, cluster_data(cluster, data)["ceph_keys_name"], "ceph.secret")


def cephfs_mount(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> str:
    """Where this host mounts CephFS ("" when it does not: not a client, no MDS, or no
    mount point set)."""
    v = layered("ceph", data)
    if roles(cluster, host_name)["client"] and cluster.group("ceph_mds") \
            and v["ceph_cephfs_mount"]:
        return str(v["ceph_cephfs_mount"]).rstrip("/")
    return ""


def mounts(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> list[str]:
    """The network mounts this host gets (recorded; unmounted when it leaves
    ``ceph_clients``, :data:`REMOVAL`)."""
    mount = cephfs_mount(cluster, host_name, data)
    return [mount] if mount else []


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("ceph", data)
    c = cluster_data(cluster, data)
    network = ceph_network(cluster, data)
    r = roles(cluster, host_name)
    devices = osd_devices(data) if r["osd"] else []
    mount = cephfs_mount(cluster, host_name, data)
    mons = mon_addrs(cluster, c, network)
    fs = None
    if cluster.group("ceph_mds"):
        fs = {"name": str(c["ceph_cephfs_name"]), "metadata": str(c["ceph_cephfs_metadata_pool"]),
              "data": str(c["ceph_cephfs_data_pool"])}
    mgr_modules, mgr_config = mgr_module_config(cluster, c, mons)
    targets = []
    if r["mon"] or r["osd"] or r["mds"]:
        targets.append("ceph.target")
    targets += [t for t, role in (("ceph-mon.target", "mon"), ("ceph-mgr.target", "mon"),
                                  ("ceph-mds.target", "mds"), ("ceph-osd.target", "osd"))
                if r[role]]
    fact = {
        "host": host_name,
        "targets": targets,
        "mode": str(v["ceph_osd_mode"]),
        "devices": [d["device"] for d in devices],
        "cluster": r["first_mon"],
        "mount": mount,
        "timeout": int(c["ceph_command_timeout"]),
    }
    request = {
        "host": host_name,
        "roles": r,
        "devices": devices,
        "mode": str(v["ceph_osd_mode"]),
        "entities": entities(cluster, c),
        "pools": pools(cluster, c) if r["first_mon"] else [],
        "crush_rules": ([{"name": crush_rule(cluster, c), "domain": failure_domain(cluster, c)}]
                        if r["first_mon"] and pools(cluster, c) else []),
        "fs": fs if r["first_mon"] else None,
        "mgr_modules": mgr_modules if r["first_mon"] else [],
        "mgr_config": mgr_config if r["first_mon"] else {},
        "mount": mount,
        "targets": targets,
        "release": release_request(v),
    }
    return {
        "ceph_roles": r,
        "ceph_first_mon": first_mon(cluster) or "",
        "ceph_public_network_name": network,
        "ceph_mon_addrs": mons,
        "ceph_conf_sections": ceph_conf(cluster, host_name, data),
        "ceph_entities": entities(cluster, c),
        "ceph_osd_device_list": [d["device"] for d in devices],
        "ceph_request": request,
        "ceph_fact_request": request_text(fact),
        # What the Ansible role runs to read the node (the pyinfra facts' commands).
        "ceph_fact_command": ceph_command_text(request_text(fact)),
        "ceph_blockdevices_command": block_command_text([d["device"] for d in devices]),
        "ceph_keys_ref": secret_ref(cluster, data),
        "ceph_cephfs_mount_path": mount,
        "ceph_cephfs": fs,
        "ceph_fstab_line": fstab_line(v, mount, mons) if mount else "",
        # Mounts CephFS and proves it is mounted (aicluster.common.mounts).
        "ceph_mount_command": mount_command(
            mount, MOUNT_TYPES[v["ceph_cephfs_mount_type"]],
            f"CephFS {c['ceph_cephfs_name']} ({v['ceph_cephfs_mount_type']} client)",
        ) if mount else "",
        "ceph_fstab_regexp": fstab_python_regexp(mount) if mount else "",
        "ceph_quorum_wait_command": quorum_wait_command(c),
        "ceph_auth_import_command": f"{_ceph(c)} auth import -i {AUTH_KEYRING}",
        "ceph_fs_commands": [fs_command(c, fs), mds_wait_command(c)] if fs else [],
        "ceph_fsid_setting": str(c["ceph_fsid"] or ""),
        # Ceph's repository (ceph_source ceph_repo): its URL without a trailing /, the
        # site apt pins Ceph's packages to, the pinned release's major version, and the
        # check run after the packages changed.
        "ceph_repo_base": str(v["ceph_repo_url"]).rstrip("/"),
        "ceph_repo_origin": repo_origin(str(v["ceph_repo_url"])),
        "ceph_release_major": RELEASES.get(str(v["ceph_release"])),
        "ceph_release_check_command": release_check_command(v, host_name),
    }


#: At boot: a mount that fails does not fail the boot (nofail), and waits as long as
#: the client waits for the monitors (client_mount_timeout, 300 s) rather than systemd's
#: 90 s: after a cold start of the whole cluster the monitors come up with the nodes.
BOOT_OPTIONS = "_netdev,nofail,x-systemd.mount-timeout=5min"


def fstab_line(v: Mapping[str, Any], mount: str, mons: list[dict[str, str]]) -> str:
    """The client's CephFS line: ceph-fuse, or the kernel client."""
    name = v["ceph_client_name"]
    if v["ceph_cephfs_mount_type"] == "kernel":
        return (f":/ {mount} ceph name={name},secretfile=/etc/ceph/ceph.client.{name}.secret,"
                f"{BOOT_OPTIONS},noatime 0 0")
    return (f"none {mount} fuse.ceph ceph.id={name},ceph.conf={CONF},{BOOT_OPTIONS},"
            "defaults 0 0")


# ---------------------------------------------------------------------------
# Secrets: the fsid and every key, from the one secret (deploying machine only)
# ---------------------------------------------------------------------------


def derive_key(secret: bytes, entity: str) -> str:
    """The cephx key of ``entity`` (Ceph's base64 CryptoKey: an AES key of 16 bytes)."""
    raw = hmac.new(secret, KEY_CONTEXT + b"key/" + entity.encode(), hashlib.sha256).digest()
    return base64.b64encode(KEY_HEADER + raw[:16]).decode()


def derive_fsid(secret: bytes) -> str:
    raw = hmac.new(secret, KEY_CONTEXT + b"fsid", hashlib.sha256).digest()
    return str(uuid.UUID(bytes=raw[:16], version=4))


def key_digest(key: str) -> str:
    """What the node's fact prints for a key (never the key)."""
    return hashlib.sha256(key.encode()).hexdigest()


def keyring(entries: Iterable[Mapping[str, Any]]) -> str:
    """A keyring file, as ceph-authtool writes it."""
    lines = []
    for e in entries:
        lines.append(f"[{e['entity']}]")
        lines.append(f"\tkey = {e['key']}")
        for kind in sorted(e.get("caps") or {}):
            lines.append(f'\tcaps {kind} = "{e["caps"][kind]}"')
    return "\n".join(lines) + "\n"


def secrets(ref: Mapping[str, Any], name: str, size: int, fsid: str,
            wanted: Iterable[Mapping[str, Any]], host_name: str,
            host_roles: Mapping[str, bool], client_name: str,
            dry: bool = False) -> dict[str, Any]:
    """The fsid, this host's keyrings (text) and the key digests, from the cluster's
    secret (generated once when the inventory names a file that does not exist; not in
    a *dry* run). Raises SecretError (naming the secret, never its value)."""
    secret = read_secret({name: dict(ref)}, name, generate_bytes=int(size), dry=dry)
    listed = [{**e, "key": derive_key(secret, e["entity"])} for e in wanted]
    by_name = {e["entity"]: e for e in listed}
    mon = {"entity": "mon.", "key": derive_key(secret, "mon."), "caps": {"mon": "allow *"}}
    out: dict[str, Any] = {
        "fsid": fsid or derive_fsid(secret),
        "digests": {e["entity"]: key_digest(e["key"]) for e in listed},
        "keyrings": {},
    }
    rings = out["keyrings"]
    if host_roles.get("mon"):
        rings[ADMIN_KEYRING] = keyring([by_name["client.admin"]])
        rings[MON_KEYRING] = keyring([mon, *listed])
        rings[AUTH_KEYRING] = keyring(listed)
        rings[f"/var/lib/ceph/mgr/ceph-{host_name}/keyring"] = keyring(
            [by_name[f"mgr.{host_name}"]])
    if host_roles.get("osd"):
        rings[BOOTSTRAP_OSD_KEYRING] = keyring([by_name["client.bootstrap-osd"]])
    if host_roles.get("mds"):
        rings[f"/var/lib/ceph/mds/ceph-{host_name}/keyring"] = keyring(
            [by_name[f"mds.{host_name}"]])
    if host_roles.get("client"):
        entry = by_name[f"client.{client_name}"]
        rings[f"/etc/ceph/ceph.client.{client_name}.keyring"] = keyring([entry])
        rings[f"/etc/ceph/ceph.client.{client_name}.secret"] = entry["key"] + "\n"
    return out


# ---------------------------------------------------------------------------
# The decision (both engines): what the node and the cluster have, and what to do
# ---------------------------------------------------------------------------


UPGRADE_DOC = "docs/components/ceph.md#upgrading"


def release_problems(where: str, wanted: Mapping[str, Any], have: Mapping[str, Any],
                     suite: str) -> list[str]:
    """Why this host may not go on with the pinned Ceph release (``wanted``, from
    :func:`release_request`), from what the node's fact read (``have``: the installed
    ceph-common or ``ceph --version``, the package manager's candidate) and the system's
    suite (:func:`repo_suite`). Every Ceph host runs one release: OSDs of an older release
    cannot join, and Ceph moves between releases one at a time, daemon type by daemon
    type, which the deploy does not do."""
    name, major = wanted["name"], wanted["major"]
    pinned = f"ceph_release {name} ({major})"
    out = []
    if have.get("unreadable"):
        out.append(f"{where}: {have['unreadable']}; the installed Ceph release must be "
                   f"known to be {pinned}: nothing is changed")
    installed = have.get("installed")
    if installed:
        have_major = version_major(installed)
        if have_major is None:
            out.append(f"{where}: cannot read the release of the installed Ceph "
                       f"({installed!r}); it must be {pinned}: nothing is changed")
        elif have_major != major:
            out.append(
                f"{where}: Ceph {installed} ({release_name(have_major)}) is installed, but "
                f"the cluster's {pinned}; every Ceph host runs the one pinned release "
                "(OSDs of another release cannot join) and the deploy does not move a host "
                "between releases: nothing is changed. Upgrade Ceph one release at a time, "
                f"outside the deploy ({UPGRADE_DOC}), or set ceph_release to the release "
                "the cluster runs")
    if wanted["source"] == "ceph_repo":
        if not suite:
            out.append(f"{where}: cannot tell which of Ceph's repository's directories "
                       "this system reads (its os-release names no suite aicluster "
                       "knows): nothing is changed; use ceph_source 'distribution'")
        elif suite not in wanted["builds"]:
            builds = ", ".join(wanted["builds"]) or "nothing aicluster knows"
            out.append(
                f"{where}: Ceph's repository has no {name} build for {suite} "
                f"(ceph_repo_builds.{name}: {builds}): nothing is changed. Pin a release "
                f"built for {suite}, add {suite} to ceph_repo_builds.{name} if your mirror "
                "has it, or use ceph_source 'distribution' with the release it ships")
        return out
    candidate = have.get("candidate")
    candidate_major = version_major(candidate)
    if candidate and candidate_major != major:
        out.append(
            f"{where}: the distribution's Ceph here is {candidate} "
            f"({release_name(candidate_major)}), not the cluster's {pinned}: nothing is "
            "changed. Set ceph_source 'ceph_repo' (Ceph's own repository, with "
            f"ceph_repo_url) to install {name} here, or pin the release every host's "
            "distribution ships")
    return out


def decide(blockdevices: Mapping[str, Any], state: Mapping[str, Any],
           request: Mapping[str, Any], fsid: str,
           digests: Mapping[str, str], suite: str = "") -> dict[str, Any]:
    """What to do on one host, from its BlockDevices and CephState facts and its
    system's suite of Ceph's repository (:func:`repo_suite`).

    ``problems`` (lines naming the host, the device and what is on it, or the Ceph
    release it has or would get against the pinned one: when any, nothing at all is
    done on the host), ``mon_mkfs``, ``osd_wipe``, ``osd_create``, ``osd_activate``
    (devices), and on the first monitor ``auth_import``, ``crush_rules_create``
    ([rule, failure domain]), ``pools_create`` (pools), ``pools_set`` ([pool, key,
    value]), ``pools_rule`` ([pool, rule]), ``pools_app`` ([pool, application]),
    ``fs_create``, ``mgr_config_set`` ([option, value] the cluster's configuration
    lacks or has otherwise), ``mgr_modules_enable`` and ``mgr_modules_restart``
    (modules already enabled whose options change: a module reads them when it
    starts); on a client, ``mount``, and ``remount`` where CephFS is mounted but does
    not answer (an evicted client: unmounted first); ``repo_suite``, the suite the
    repository's source names."""
    where = f"host {request['host']!r}: ceph"
    r = request["roles"]
    out: dict[str, Any] = {
        "problems": [], "mon_mkfs": False, "osd_wipe": [], "osd_create": [],
        "osd_activate": [], "auth_import": False, "crush_rules_create": [],
        "pools_create": [], "pools_set": [], "pools_rule": [], "pools_app": [],
        "fs_create": False, "mgr_config_set": [], "mgr_modules_enable": [],
        "mgr_modules_restart": [], "mount": False, "remount": False, "targets_enable": [],
        "repo_suite": suite,
    }
    problems: list[str] = []
    if request.get("release"):
        problems += release_problems(where, request["release"], state.get("release") or {},
                                     suite)
    out["mon_mkfs"] = bool(r["mon"]) and not state.get("mon")
    if r["osd"] and request["devices"]:
        kind = "LVM2_member" if request["mode"] == "lvm" else "ceph_bluestore"
        checked = check_devices(blockdevices, request["devices"], [{"type": kind}])
        problems += [f"{where}: {p}" for p in checked["problems"]]
        osds = state.get("osds") or {}
        for item in request["devices"]:
            device = item["device"]
            entry = checked["devices"][device]
            if entry["state"] == "empty" and osds.get(device):
                # ceph-volume finds an OSD that wipefs did not name: never "empty".
                entry["state"] = "ours"
            if entry["state"] == "empty":
                out["osd_create"].append(device)
            elif entry["state"] == "wipe":
                out["osd_wipe"].append(device)
                out["osd_create"].append(device)
            elif entry["state"] == "ours":
                osd = osds.get(device)
                if osd and osd.get("ceph_fsid") == fsid:
                    if not osd.get("running"):
                        out["osd_activate"].append(device)
                    continue
                what = (f"an OSD of another Ceph cluster (fsid {osd.get('ceph_fsid')})"
                        if osd else f"{describe([{'type': kind}])} that ceph-volume does not "
                        "show as an OSD of this cluster (is ceph-volume installed?)")
                if item.get("wipe"):
                    out["osd_wipe"].append(device)
                    out["osd_create"].append(device)
                else:
                    problems.append(
                        f"{where}: {device} holds {what}; nothing is changed. If that data "
                        "may be destroyed, set wipe: true on this device (ceph_osd_devices)"
                    )
    cluster = state.get("cluster") or {}
    reachable = bool(cluster.get("reachable"))
    if r["first_mon"]:
        auth = cluster.get("auth") or {}
        for e in request["entities"]:
            have = auth.get(e["entity"])
            if not reachable or not have or have.get("key") != digests.get(e["entity"]) \
                    or dict(have.get("caps") or {}) != dict(e["caps"]):
                out["auth_import"] = True
        have_rules = (cluster.get("crush_rules") or []) if reachable else []
        out["crush_rules_create"] = [[rule["name"], rule["domain"]]
                                     for rule in request.get("crush_rules") or []
                                     if rule["name"] not in have_rules]
        have_pools = cluster.get("pools") or {}
        for p in request["pools"]:
            have = have_pools.get(p["name"]) if reachable else None
            if have is None:
                out["pools_create"].append(p)
                continue
            for key in ("size", "min_size"):
                if have.get(key) != p[key]:
                    out["pools_set"].append([p["name"], key, p[key]])
            if p.get("crush_rule") and have.get("crush_rule") != p["crush_rule"]:
                out["pools_rule"].append([p["name"], p["crush_rule"]])
            if p["application"] and p["application"] not in (have.get("applications") or []):
                out["pools_app"].append([p["name"], p["application"]])
        fs = request.get("fs")
        out["fs_create"] = bool(fs) and (not reachable or fs["name"] not in (
            cluster.get("fs") or {}))
        out.update(_decide_mgr(request, cluster, reachable))
    if request.get("mount"):
        mounted = state.get("mounted")
        if not mounted:
            out["mount"] = True
        elif "ceph" in (mounted.get("fstype") or "") and mounted.get("answers") is False:
            out["mount"] = out["remount"] = True
        elif "ceph" not in (mounted.get("fstype") or ""):
            problems.append(
                f"{where}: {request['mount']} already has {mounted.get('source') or 'something'}"
                f" ({mounted.get('fstype') or 'unknown type'}) mounted; CephFS is not mounted "
                "over it. Unmount it, or set ceph_cephfs_mount elsewhere"
            )
    out["targets_enable"] = [t for t in request.get("targets", [])
                             if not (state.get("targets") or {}).get(t)]
    out["problems"] = problems
    if problems:
        out.update(mon_mkfs=False, osd_wipe=[], osd_create=[], osd_activate=[],
                   auth_import=False, crush_rules_create=[], pools_create=[], pools_set=[],
                   pools_rule=[], pools_app=[], fs_create=False, mgr_config_set=[],
                   mgr_modules_enable=[], mgr_modules_restart=[], mount=False,
                   remount=False, targets_enable=[])
    return out


def _decide_mgr(request: Mapping[str, Any], cluster: Mapping[str, Any],
                reachable: bool) -> dict[str, list]:
    """The manager modules and options (first monitor), as the pools: what the cluster
    shows (``ceph mgr module ls``: enabled or always on; ``ceph config dump``: the
    ``mgr`` section's options) against the request. What cannot be read is done (each
    command is harmless when repeated); a module known to be enabled is restarted
    (disabled and enabled again) when one of its options changes, since it reads its
    address and port when it starts."""
    modules = cluster.get("mgr_modules") if reachable else None
    config = cluster.get("mgr_config") if reachable else None
    wanted = dict(request.get("mgr_config") or {})
    out: dict[str, list] = {"mgr_config_set": [], "mgr_modules_enable": [],
                            "mgr_modules_restart": []}
    out["mgr_config_set"] = [[k, str(value)] for k, value in sorted(wanted.items())
                             if config is None or str(config.get(k)) != str(value)]
    changed = {k.split("/")[1] for k, _ in out["mgr_config_set"]}
    for module in request.get("mgr_modules") or []:
        if modules is None:
            enabled = None
        else:
            enabled = module in (modules.get("enabled") or []) \
                or module in (modules.get("always_on") or [])
        if enabled is not True:
            out["mgr_modules_enable"].append(module)
        if module in changed and enabled is not False and reachable:
            # Enabled, or perhaps (its list unreadable): restart it.
            out["mgr_modules_restart"].append(module)
    return out


def decide_from_output(block_lines: Iterable[str], ceph_lines: Iterable[str],
                       request: Mapping[str, Any], fsid: str,
                       digests: Mapping[str, str], suite: str = "") -> dict[str, Any]:
    """:func:`decide` from the text the facts' commands printed (the Ansible filter)."""
    return decide(block_parse(block_lines), ceph_parse(ceph_lines), request, fsid, digests,
                  suite)


# ---------------------------------------------------------------------------
# Commands (both engines run these texts)
# ---------------------------------------------------------------------------


def _ceph(v: Mapping[str, Any]) -> str:
    return f"ceph --connect-timeout {int(v['ceph_command_timeout'])}"


def mon_mkfs_command(fsid: str, name: str, mons: Iterable[Mapping[str, str]],
                     msgr2: bool) -> str:
    """The monitor's store: the running cluster's monmap when there is one (a monitor
    added later), else a new one of every ceph_mons host; then ceph-mon --mkfs."""
    add = " ".join(
        (f"--addv {shlex.quote(m['name'])} {shlex.quote(m['vector'])}" if msgr2
         else f"--add {shlex.quote(m['name'])} {shlex.quote(m['address'])}")
        for m in mons
    )
    return " && ".join([
        f"install -d -o ceph -g ceph -m 750 /var/lib/ceph/tmp /var/lib/ceph/mon/ceph-{name}",
        f"( timeout 20 ceph --connect-timeout 10 mon getmap -o {MONMAP} 2>/dev/null"
        f" || monmaptool --create --clobber --fsid {shlex.quote(fsid)} {add} {MONMAP} )",
        f"chown ceph:ceph {MONMAP}",
        f"runuser -u ceph -- ceph-mon --mkfs -i {shlex.quote(name)} --monmap {MONMAP} "
        f"--keyring {MON_KEYRING}",
        f"rm -f {MONMAP}",
    ])


def quorum_wait_command(v: Mapping[str, Any]) -> str:
    t = int(v["ceph_command_timeout"])
    return (f"timeout {t * 3} sh -c 'until ceph --connect-timeout 5 quorum_status "
            ">/dev/null 2>&1; do sleep 2; done'")


def mds_wait_command(v: Mapping[str, Any]) -> str:
    t = int(v["ceph_command_timeout"])
    fs = shlex.quote(str(v["ceph_cephfs_name"]))
    return (f"timeout {t * 3} sh -c 'until ceph --connect-timeout 5 fs status {fs} 2>/dev/null "
            "| grep -q active; do sleep 2; done'")


def pool_commands(decided: Mapping[str, Any], timeout: int) -> list[str]:
    """The commands that make the CRUSH rules and the pools the first monitor lacks
    and set what differs (a pool's rule included: a cluster grown to as many OSD hosts
    as replicas moves its pools to the host rule)."""
    ceph = f"ceph --connect-timeout {int(timeout)}"
    out = []
    for rule, domain in decided.get("crush_rules_create") or []:
        out.append(f"{ceph} osd crush rule create-replicated {shlex.quote(rule)} default "
                   f"{shlex.quote(domain)}")
    for p in decided["pools_create"]:
        name = shlex.quote(p["name"])
        sure = " --yes-i-really-mean-it" if p["size"] == 1 else ""
        rule = f" {shlex.quote(p['crush_rule'])}" if p.get("crush_rule") else ""
        out += [
            f"{ceph} osd pool create {name} {int(p['pg_num'])} {int(p['pg_num'])} "
            f"replicated{rule}",
            f"{ceph} osd pool set {name} size {int(p['size'])}{sure}",
            f"{ceph} osd pool set {name} min_size {int(p['min_size'])}",
        ]
        if p["application"]:
            out.append(f"{ceph} osd pool application enable {name} "
                       f"{shlex.quote(p['application'])}")
    for name, key, value in decided["pools_set"]:
        sure = " --yes-i-really-mean-it" if key == "size" and int(value) == 1 else ""
        out.append(f"{ceph} osd pool set {shlex.quote(name)} {key} {int(value)}{sure}")
    for name, rule in decided.get("pools_rule") or []:
        out.append(f"{ceph} osd pool set {shlex.quote(name)} crush_rule {shlex.quote(rule)}")
    for name, app in decided["pools_app"]:
        out.append(f"{ceph} osd pool application enable {shlex.quote(name)} {shlex.quote(app)}")
    return out


def mgr_commands(decided: Mapping[str, Any], timeout: int) -> list[str]:
    """The manager's module options and modules (first monitor), where they differ:
    wait until a manager is available (a manager that has not reported its modules
    yet makes Ceph refuse both their options and their enabling), set the options,
    then enable each module the cluster lacks, or restart (disable, enable) one that
    runs with other options. Enabling comes after the options, so a module starts
    with its address and port."""
    config = decided.get("mgr_config_set") or []
    enable = decided.get("mgr_modules_enable") or []
    restart = decided.get("mgr_modules_restart") or []
    if not (config or enable or restart):
        return []
    t = int(timeout)
    ceph = f"ceph --connect-timeout {t}"
    out = [f"timeout {t * 3} sh -c 'until ceph --connect-timeout 5 mgr stat -f json "
           "2>/dev/null | grep -Eq \"\\\"available\\\": ?true\"; do sleep 2; done'"]
    out += [f"{ceph} config set mgr {shlex.quote(k)} {shlex.quote(str(value))}"
            for k, value in config]
    for module in restart:
        out.append(f"{ceph} mgr module disable {shlex.quote(module)}")
    for module in dict.fromkeys([*restart, *enable]):
        out.append(f"{ceph} mgr module enable {shlex.quote(module)}")
    return out


def fs_command(v: Mapping[str, Any], fs: Mapping[str, str]) -> str:
    ceph = _ceph(v)
    return (f"{ceph} fs get {shlex.quote(fs['name'])} >/dev/null 2>&1 || {ceph} fs new "
            f"{shlex.quote(fs['name'])} {shlex.quote(fs['metadata'])} {shlex.quote(fs['data'])}")


def osd_wipe_command(device: str) -> str:
    q = shlex.quote(device)
    return (f"wipefs -a {q} && dd if=/dev/zero of={q} bs=1M count=10 oflag=direct "
            "conv=fsync status=none")


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def validate(cluster: Cluster) -> list[str]:
    """ceph's checks that need the whole inventory (host and field named): monitors,
    declared networks and the hosts' addresses on them, pool sizes against the OSDs, the
    MDS, devices against the NVMe cache. The settings' own types and shapes are checked
    by aicluster.components.ceph.model."""
    errors: list[str] = []
    names = ceph_hosts(cluster)
    if not names:
        return errors
    mons = cluster.group("ceph_mons")
    first = names[0]
    if not mons:
        return [f"host {first!r}: groups: is in a ceph group, which needs at least one "
                "ceph_mons host; the inventory has 0"]
    c = cluster_data(cluster, {})
    where_c = f"host {mons[0]!r}"
    network = c["ceph_network"]
    if network and network not in cluster.spec.networks:
        errors.append(f"{where_c}: ceph_network: {network!r} is not a declared network "
                      f"({', '.join(cluster.spec.networks)})")
        return errors
    public = ceph_network(cluster, {})
    for name in names:
        if public != "management" and not host_address(cluster, name, public):
            errors.append(f"host {name!r}: ceph_network: has no address on the {public} "
                          "network (hardware.nics, network_bonds or network_vlans)")
    cnet = c["ceph_cluster_network"]
    if cnet:
        if cnet not in cluster.spec.networks:
            errors.append(f"{where_c}: ceph_cluster_network: {cnet!r} is not a declared "
                          f"network ({', '.join(cluster.spec.networks)})")
        else:
            for name in osd_hosts(cluster):
                if not host_address(cluster, name, cnet):
                    errors.append(f"host {name!r}: ceph_cluster_network: has no address on "
                                  f"the {cnet} network")
    count = osd_count(cluster)
    size = c["ceph_pool_default_size"]
    if size is not None and size > count:
        errors.append(f"{where_c}: ceph_pool_default_size: {size} replicas need {size} OSDs; "
                      f"the ceph_osd_devices of ceph_osds name {count}")
    elif c["ceph_failure_domain"] == "host" and len(osd_hosts(cluster)) < default_size(
        cluster, c
    ):
        errors.append(f"{where_c}: ceph_failure_domain: host needs {default_size(cluster, c)} "
                      f"OSD hosts for {default_size(cluster, c)} replicas; ceph_osds has "
                      f"{len(osd_hosts(cluster))}")
    errors += _check_pools(cluster, c, where_c, count)
    if cluster.group("ceph_mds") and c["ceph_cephfs_data_pool"] == c["ceph_cephfs_metadata_pool"]:
        errors.append(f"{where_c}: ceph_cephfs_data_pool: is the metadata pool too; "
                      "CephFS needs two pools")
    for name in names:
        errors += _check_host(cluster, name)
    # One Ceph release on every Ceph host: OSDs of an older release cannot join.
    errors += differs_from_first("ceph", cluster, names, ["ceph_release"], "Ceph host")
    return errors


def _check_pools(cluster: Cluster, c: Mapping[str, Any], where: str, count: int) -> list[str]:
    errors: list[str] = []
    reserved = [c["ceph_cephfs_data_pool"], c["ceph_cephfs_metadata_pool"]] if cluster.group(
        "ceph_mds") else []
    for i, p in enumerate(c["ceph_pools"]):
        at = f"{where}: ceph_pools[{i}]"
        if p["name"] in reserved:
            errors.append(f"{at}.name: {p['name']} is the CephFS pool (ceph_cephfs_*_pool)")
        if p.get("size", 0) > count:
            errors.append(f"{at}.size: {p['size']} replicas need {p['size']} OSDs; the "
                          f"ceph_osd_devices of ceph_osds name {count}")
    if errors:
        return errors
    size = default_size(cluster, c)
    hosts = len(osd_hosts(cluster))
    domain = failure_domain(cluster, c)
    for i, p in enumerate(c["ceph_pools"]):
        at = f"{where}: ceph_pools[{i}]"
        if "min_size" in p and "size" not in p and p["min_size"] > size:
            errors.append(f"{at}.min_size: {p['min_size']} is more than the pool's size {size} "
                          "(ceph_pool_default_size, else one replica per OSD up to 3); Ceph "
                          "refuses a min_size above the size")
        if domain == "host" and p.get("size", 0) > hosts:
            errors.append(f"{at}.size: {p['size']} replicas on different hosts (failure domain "
                          f"host) need {p['size']} OSD hosts; ceph_osds has {hosts}: its "
                          "placement groups could never be complete")
    if errors:
        return errors
    # Ceph refuses to create a pool whose placement groups would take the cluster over
    # mon_max_pg_per_osd per OSD (counting the pools made before it).
    limit = _max_pg_per_osd(c) * count
    total = 0
    for p in pools(cluster, c):
        total += p["pg_num"] * p["size"]
        if count and total > limit:
            errors.append(
                f"{where}: ceph_pools: pool {p['name']} (pg_num {p['pg_num']}, size {p['size']}) "
                f"brings the cluster to {total} placement group replicas, more than "
                f"mon_max_pg_per_osd {_max_pg_per_osd(c)} x {count} OSDs = {limit}; Ceph "
                "refuses to create it: lower pg_num (ceph_pools, ceph_pool_default_pg_num, "
                "ceph_cephfs_*_pg_num) or add OSDs")
            break
    return errors


def _max_pg_per_osd(c: Mapping[str, Any]) -> int:
    """mon_max_pg_per_osd: ceph_config's, else Ceph's default (250)."""
    for section in ("global", "mon"):
        options = (c["ceph_config"] or {}).get(section) or {}
        value = options.get("mon_max_pg_per_osd", options.get("mon max pg per osd"))
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 250


def _check_host(cluster: Cluster, name: str) -> list[str]:
    errors: list[str] = []
    h = cluster.hosts[name]
    where = f"host {name!r}"
    v = layered("ceph", h.data)
    r = roles(cluster, name)
    devices = osd_devices(h.data)
    if devices and not r["osd"]:
        errors.append(f"{where}: ceph_osd_devices: is set but the host is not in ceph_osds")
    if r["osd"] and not devices:
        errors.append(f"{where}: ceph_osd_devices: the host is in ceph_osds but names no "
                      "device (give [{device: /dev/disk/by-id/..., wipe: false}])")
    cache = set()
    if "nvme_cache" in h.components():
        cache = {d["device"] for d in cache_devices(cluster, name, h.data)}
    for i, e in enumerate(devices):
        if e["device"] in cache:
            errors.append(f"{where}: ceph_osd_devices[{i}].device: {e['device']} is also the "
                          "host's NVMe cache drive (nvme_cache_devices); a device has one use")
    if v["ceph_source"] == "ceph_repo" and not v["ceph_repo_url"]:
        errors.append(f"{where}: ceph_repo_url: not set; with ceph_source 'ceph_repo' give "
                      "the URL of Ceph's repository or of your site's mirror of it (the "
                      "directory holding debian-<release>/, rpm-<release>/ and keys/), or "
                      "set ceph_source 'distribution'")
    if r["client"] and v["ceph_cephfs_mount"] and not cluster.group("ceph_mds"):
        errors.append(f"{where}: ceph_cephfs_mount: CephFS needs an MDS (a ceph_mds host); "
                      "add one, or set ceph_cephfs_mount to \"\"")
    return errors


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


def packages(v: Mapping[str, Any], distribution: Mapping[str, Any] | None) -> list[str]:
    """What this host installs: the common tools, and each of its roles' daemons."""
    r = v["ceph_roles"]
    out = list(v["ceph_common_packages"])
    if r["mon"]:
        out += v["ceph_mon_packages"]
    if r["osd"]:
        out += v["ceph_osd_packages"]
        if str((distribution or {}).get("name", "")).lower() == "ubuntu" \
                or v["ceph_source"] == "ceph_repo":
            out += v["ceph_osd_ubuntu_packages"]
        if v["ceph_osd_mode"] == "lvm":
            out += v["ceph_osd_lvm_packages"]
    if r["mds"]:
        out += v["ceph_mds_packages"]
    if r["client"] and v["ceph_cephfs_mount_path"] and v["ceph_cephfs_mount_type"] == "fuse":
        out += v["ceph_fuse_packages"]
    return list(dict.fromkeys(out))


def release_packages(v: Mapping[str, Any]) -> list[str]:
    """What is installed before Ceph: with ceph_source distribution, the distribution's
    release package of ``ceph_release`` (EL9: the CentOS Storage SIG's
    centos-release-ceph-<release>); with ceph_repo, what Ceph's own packages need
    beside the distribution (EL9: EPEL)."""
    key = "ceph_repo_prepare_packages" if v["ceph_source"] == "ceph_repo" \
        else "ceph_release_packages"
    return [str(p).replace("{release}", str(v["ceph_release"])) for p in v[key] or []]


def cluster_key_commands(v: Mapping[str, Any], decided: Mapping[str, Any]) -> list[str]:
    """On the first monitor: wait for quorum after the monitors were made, and register
    the keys the cluster lacks (ceph auth import)."""
    out = []
    if decided["mon_mkfs"]:
        out.append(v["ceph_quorum_wait_command"])
    if decided["auth_import"]:
        out.append(v["ceph_auth_import_command"])
    return out


#: A host leaving ``ceph_osds``: nothing is taken away while the cluster still maps an
#: OSD on it (read with the bootstrap-osd key, which may read the OSD map). Moving an
#: OSD's data away takes hours and is the operator's (the message says how); once its
#: OSDs are purged, the OSD units are stopped and their configuration removed. The key
#: gone means an earlier run passed this check.
OSD_REMOVAL_CHECK = f"""K={BOOTSTRAP_OSD_KEYRING}
if [ -e "$K" ]; then
    # The OSD ids on stdout; ceph's messages (warnings too) on stderr, kept apart.
    err=$(mktemp)
    if ! ids=$(timeout 120 ceph --connect-timeout 30 -n client.bootstrap-osd -k "$K" \
            osd ls-tree {{host}} 2>"$err"); then
        case "$(cat "$err")" in
        *ENOENT*) ids= ;;
        *) echo "aicluster: cannot read the OSDs of {{host}}: $(cat "$err")" >&2
           rm -f "$err"; exit 1 ;;
        esac
    fi
    rm -f "$err"
    if [ -n "$ids" ]; then
        ids=$(echo $ids)
        echo "aicluster: {{host}} leaves ceph_osds, but the cluster still has its OSDs" \
            "($ids), and the deploy does not move their data: nothing is changed." \
            "On a monitor: ceph osd out $ids; wait until ceph osd safe-to-destroy $ids" \
            "says they are safe; ceph osd purge ID --yes-i-really-mean-it for each;" \
            "then deploy again, which stops the OSD units and removes their" \
            "configuration (the disks are left as they are)." >&2
        exit 1
    fi
fi
systemctl stop 'ceph-osd@*.service'"""
#: A monitor that was stopped (a host leaving ``ceph_mons``) leaves the monitor map,
#: through the quorum of the others (the admin key is still on the host).
MON_REMOVAL = r"""if ! out=$(timeout 120 ceph --connect-timeout 30 mon dump 2>&1); then
    echo "aicluster: cannot read the monitor map to remove mon.{host}: $out" >&2
    exit 1
fi
if printf '%s\n' "$out" | grep -q ' mon\.{host}$'; then
    timeout 120 ceph --connect-timeout 30 mon remove {host}
fi"""

#: What a deploy takes off a host that leaves a Ceph role (aicluster.common.absence):
#: a client's CephFS mount (unmounted, its fstab line removed: the files stay on the
#: cluster) and keyring; a monitor's and manager's daemons, the monitor taken out of the
#: monitor map, their keys; an MDS's daemon and key; an OSD host's units and
#: configuration, once the operator has moved its data off and purged its OSDs
#: (:data:`OSD_REMOVAL_CHECK`). The data (disks, the monitor's store, pools, files)
#: stays; the packages too, unless the inventory's remove_packages names ceph.
REMOVAL = {
    "ceph_clients": {"unmount": True,
                     "files": ["/etc/ceph/ceph.client.{ceph_client_name}.keyring",
                               "/etc/ceph/ceph.client.{ceph_client_name}.secret"],
                     "packages": ["ceph_fuse_packages"]},
    "ceph_mons": {"services": ["ceph-mon@{host}", "ceph-mgr@{host}"],
                  "after": [MON_REMOVAL],
                  "files": [ADMIN_KEYRING, MON_KEYRING, AUTH_KEYRING,
                            "/var/lib/ceph/mgr/ceph-{host}/keyring"],
                  "packages": ["ceph_mon_packages"]},
    "ceph_osds": {"commands": [OSD_REMOVAL_CHECK],
                  "services": [OSD_UNIT.removesuffix(".service")],
                  "files": [f"/etc/systemd/system/{OSD_UNIT}", OSD_TOOL, OSD_DEVICES_FILE,
                            BOOTSTRAP_OSD_KEYRING],
                  "packages": ["ceph-osd", "ceph-volume"]},
    "ceph_mds": {"services": ["ceph-mds@{host}"],
                 "files": ["/var/lib/ceph/mds/ceph-{host}/keyring"],
                 "packages": ["ceph_mds_packages"]},
    "ceph": {"files": [CONF], "packages": ["ceph_common_packages"]},
}


def _role_stays(recorded, wanted, role: str, what: str, why: str) -> list[str]:
    """A refusal when every host that had *role* loses it and no host takes it."""
    before = sorted(h for h, roles in recorded.items() if role in (roles.get("ceph") or ()))
    if not before or any(role in (roles.get("ceph") or ()) for roles in wanted.values()):
        return []
    return [f"refusing to remove {what} from {', '.join(before)}: no host would have "
            f"{role} while Ceph stays in the cluster, and {why}. Give {role} to another "
            f"host first, or take ceph off every host."]


def removal_refusals(recorded, wanted) -> list[str]:
    """A Ceph monitor quorum is kept: of the monitors the nodes recorded, a majority
    must stay monitors (fewer, and the cluster stops answering until the ones taken
    away come back). While Ceph stays, so do some of its OSDs (the pools are on them)
    and, while hosts mount CephFS, a metadata server."""
    if not any("ceph" in roles for roles in wanted.values()):
        return []
    out = _role_stays(recorded, wanted, "ceph_osds", "the OSDs",
                      "the pools' data is on them")
    if any("ceph_clients" in (roles.get("ceph") or ()) for roles in wanted.values()):
        out += _role_stays(recorded, wanted, "ceph_mds", "the CephFS metadata server",
                           "hosts still mount CephFS")
    before = [h for h, roles in recorded.items() if "ceph_mons" in (roles.get("ceph") or ())]
    if not before:
        return out
    kept = [h for h in before if "ceph_mons" in (wanted.get(h, {}).get("ceph") or ())]
    if len(kept) > len(before) // 2:
        return out
    gone = sorted(set(before) - set(kept))
    return out + [
        f"refusing to remove the Ceph monitor from {', '.join(gone)}: {len(kept)} of the "
        f"{len(before)} recorded monitors ({', '.join(sorted(before))}) would stay, fewer "
        f"than a majority, and the cluster would lose its quorum. Take monitors away one "
        f"at a time, adding new ones first."
    ]
