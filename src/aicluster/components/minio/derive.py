"""The minio component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Iterable, Mapping
from io import StringIO
from pathlib import Path
from typing import Any

from aicluster import artifacts
from aicluster.common.disks import cache_devices, check_devices, osd_devices
from aicluster.common.disks import command_text as block_command_text
from aicluster.common.disks import parse as block_parse
from aicluster.common.minio_credentials import root_keys_ref
from aicluster.common.mounts import fstab_python_regexp, mount_command
from aicluster.common.networks import (
    host_address,
    network_errors,
    pick_network,
    undeclared_network,
)
from aicluster.common.settings import config_text, differs_from_first, layered, merge_config
from aicluster.components.minio.probe import ALIAS, MC
from aicluster.components.minio.probe import command_text as state_command_text
from aicluster.components.minio.probe import parse as state_parse
from aicluster.inventory import Cluster, majority_first

ENV_FILE = "/etc/default/minio"
UNIT = "/etc/systemd/system/minio.service"
SYSTEM_DIRS = ("/", "/boot", "/etc", "/home", "/usr", "/var", "/tmp", "/root", "/opt",
               "/mnt", "/srv", "/var/lib", "/dev", "/proc", "/sys", "/run")
#: Settings every MinIO host must share (the servers form one cluster).
SHARED = ("minio_version", "minio_network", "minio_port", "minio_console_port",
          "minio_root_user", "minio_root_keys_name", "minio_root_keys_bytes",
          "minio_default_config", "minio_config", "minio_buckets", "minio_certs_dir")
#: MinIO's erasure set sizes (cmd/endpoint-ellipses.go: setSizes).
SET_SIZES = tuple(range(2, 17))
#: A namespace for the UUIDs of the drives' file systems (fixed before they exist).
UUID_NAMESPACE = uuid.UUID("0e6f7d4c-3b7a-4f5e-9a51-8d1c2f6b4a93")
NUMBERED_RE = re.compile(r"^(?P<pre>.*?)(?P<num>[0-9]+)(?P<suf>[^0-9]*)$")


# ---------------------------------------------------------------------------
# Values computed from the whole inventory (both engines use these)
# ---------------------------------------------------------------------------


def minio_hosts(cluster: Cluster) -> list[str]:
    return list(cluster.group("minio"))


def cluster_data(cluster: Cluster, data: Mapping[str, Any]) -> dict[str, Any]:
    """The cluster-wide settings: the first MinIO host's (they must be the same on
    every MinIO host), else the given host's."""
    hosts = minio_hosts(cluster)
    return layered("minio", cluster.hosts[hosts[0]].data if hosts else data)


def minio_network(cluster: Cluster, data: Mapping[str, Any]) -> str:
    """``minio_network``, else storage when every MinIO host has an address there,
    else fabric likewise, else management."""
    return pick_network(cluster, cluster_data(cluster, data)["minio_network"],
                        minio_hosts(cluster), ("storage", "fabric"))


def url_hostname(name: str, network: str) -> str:
    """The name other nodes reach ``name`` by on ``network`` (/etc/hosts, base)."""
    return name if network == "management" else f"{name}-{network}"


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def drives(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The host's drives: ``{"kind": "device"|"directory", "device", "wipe", "path"}``.
    A device without a path is mounted at ``minio_mount_prefix<N>`` (N: its position,
    from 1); no drives at all means the one directory ``minio_data_dir``."""
    v = layered("minio", data)
    entries = v["minio_drives"]
    if not entries:
        return [{"kind": "directory", "device": "", "wipe": False,
                 "path": str(v["minio_data_dir"]).rstrip("/")}]
    out = []
    for i, e in enumerate(entries, start=1):
        if e.get("device"):
            path = e.get("path") or f"{v['minio_mount_prefix']}{i}"
            out.append({"kind": "device", "device": str(e["device"]),
                        "wipe": e.get("wipe") is True, "path": str(path).rstrip("/")})
        else:
            out.append({"kind": "directory", "device": "", "wipe": False,
                        "path": str(e.get("path", "")).rstrip("/")})
    return out


def pools(cluster: Cluster) -> list[list[str]]:
    """The server pools, in pool order, each its hosts in inventory order."""
    by_pool: dict[int, list[str]] = {}
    for name in minio_hosts(cluster):
        number = layered("minio", cluster.hosts[name].data)["minio_pool"]
        by_pool.setdefault(number, []).append(name)
    return [by_pool[k] for k in sorted(by_pool)]


def sequence(values: list[str]) -> str | None:
    """``stor{1...4}-storage`` when the values are ``<pre><number><suf>`` with one
    prefix and suffix and consecutive numbers (zero-padded alike, as MinIO expands
    ``{01...16}``), the value itself when there is one, else None."""
    if len(set(values)) != len(values):
        return None
    if len(values) == 1:
        return values[0]
    matches = [NUMBERED_RE.match(v) for v in values]
    if not all(matches):
        return None
    pres = {m["pre"] for m in matches}  # type: ignore[index]
    sufs = {m["suf"] for m in matches}  # type: ignore[index]
    if len(pres) != 1 or len(sufs) != 1:
        return None
    digits = sorted((m["num"] for m in matches), key=int)  # type: ignore[index]
    numbers = [int(d) for d in digits]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        return None
    padded = any(len(d) > 1 and d.startswith("0") for d in digits)
    if padded and len({len(d) for d in digits}) != 1:
        return None
    if not padded and any(str(n) != d for n, d in zip(numbers, digits, strict=True)):
        return None
    return f"{pres.pop()}{{{digits[0]}...{digits[-1]}}}{sufs.pop()}"


def _common_set_size(total: int, counts: list[int]) -> int:
    """MinIO's commonSetDriveCount: the largest set size giving the fewest sets."""
    if total < counts[-1]:
        return total
    size, prev = 0, total // counts[0]
    for count in counts:
        if total % count == 0:
            d = total // count
            if d <= prev:
                prev, size = d, count
    return size


def erasure_set_size(lengths: list[int], symmetric: bool = True) -> tuple[int, str]:
    """The erasure set size MinIO picks for a pool whose expansion patterns have these
    lengths, in their order in the argument (cmd/endpoint-ellipses.go getSetIndexes),
    or (0, why MinIO refuses it). ``symmetric``: patterns given (False: a plain list)."""
    total = 1
    for n in lengths:
        total *= n
    if total < SET_SIZES[0]:
        return 0, f"{total} drive(s): erasure coding needs at least {SET_SIZES[0]}"
    counts = [s for s in SET_SIZES if total % s == 0]
    if not counts:
        return 0, (f"{total} drives: no erasure set size of {SET_SIZES[0]} to {SET_SIZES[-1]} "
                   "divides it")
    if symmetric and lengths:
        first = lengths[0]  # MinIO's symmetry check ends on the argument's first pattern
        counts = [s for s in counts if (first % s == 0 if first > s else s % first == 0)]
        if not counts:
            return 0, (f"{total} drives cannot be spread symmetrically over {first} "
                       f"host(s) by any erasure set size of {SET_SIZES[0]} to {SET_SIZES[-1]}")
    return _common_set_size(total, counts), ""


def layout(cluster: Cluster) -> dict[str, Any]:
    """MINIO_VOLUMES and what MinIO makes of it: ``{"volumes", "pools": [{"hosts",
    "drives", "arg", "set_size"}], "total_drives", "problems": [(host, field, text)]}``."""
    scheme = "https" if tls_enabled(cluster_data(cluster, {})) else "http"
    network = minio_network(cluster, {})
    port = cluster_data(cluster, {})["minio_port"]
    problems: list[tuple[str, str, str]] = []
    out_pools = []
    groups = pools(cluster)
    total = 0
    single = len(groups) == 1 and len(groups[0]) == 1
    for number, names in enumerate(groups, start=1):
        paths = {n: [d["path"] for d in drives(cluster.hosts[n].data)] for n in names}
        counts = {n: len(p) for n, p in paths.items()}
        total += sum(counts.values())
        # The count most hosts of the pool have is the reference: the odd host is reported.
        common = majority_first(names, counts.__getitem__)
        odd = [n for n in names if counts[n] != counts[common]]
        if odd:
            problems.append((odd[0], "minio_drives", (
                f"has {counts[odd[0]]} drive(s), host {common!r} of the same server pool "
                f"{number} has {counts[common]}; every host of a pool has as many drives "
                "(MinIO spreads its erasure sets evenly)")))
            out_pools.append({"hosts": names, "drives": counts[common], "arg": "",
                              "set_size": 0})
            continue
        first = names[0]
        same_paths = all(paths[n] == paths[first] for n in names)
        path_seq = sequence(paths[first]) if same_paths else None
        hostnames = [url_hostname(n, network) for n in names]
        host_seq = sequence(hostnames)
        lengths = ([len(names)] if len(names) > 1 else []) + (
            [len(paths[first])] if len(paths[first]) > 1 else [])
        if single:
            arg = path_seq or " ".join(paths[first])
            patterned = path_seq is not None and len(paths[first]) > 1
        elif host_seq is not None and path_seq is not None:
            arg = f"{scheme}://{host_seq}:{port}{path_seq}"
            patterned = bool(lengths)
        else:
            arg = " ".join(
                f"{scheme}://{h}:{port}{p}" for h, n in zip(hostnames, names, strict=True)
                for p in paths[n])
            patterned = False
        if patterned:
            size, why = erasure_set_size(lengths)
        elif single and len(paths[first]) == 1:
            size, why = 1, ""  # one drive, no erasure coding
        else:
            size, why = erasure_set_size([sum(counts.values())], symmetric=False)
        if why:
            problems.append((first, "minio_drives", (
                f"server pool {number} ({', '.join(names)}) has {why}; MinIO refuses "
                "that layout")))
        out_pools.append({"hosts": names, "drives": counts[first], "arg": arg,
                          "set_size": size, "patterned": patterned})
    if len(out_pools) > 1:
        for number, p in enumerate(out_pools, start=1):
            if p["arg"] and not p["patterned"]:
                problems.append((p["hosts"][0], "minio_pool", (
                    f"server pool {number} ({', '.join(p['hosts'])}) cannot be written in "
                    "MinIO's expansion notation (host names <prefix><N><suffix> with "
                    "consecutive N, the same drive paths on every host, numbered in "
                    "sequence), which MinIO needs when there are several pools")))
    return {"volumes": " ".join(p["arg"] for p in out_pools if p["arg"]), "pools": out_pools,
            "total_drives": total, "problems": problems}


def tls_enabled(v: Mapping[str, Any]) -> bool:
    return bool(v["minio_tls_cert_file"])


def bucket_list(v: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for b in v["minio_buckets"]:
        out.append({"name": b["name"], "policy": b.get("policy") or "none",
                    "versioning": b.get("versioning")})
    return out


def fs_uuid(cluster: Cluster, host_name: str, device: str) -> str:
    """The UUID a new drive file system is made with (fixed by cluster, host, device)."""
    return str(uuid.uuid5(UUID_NAMESPACE, f"{cluster.spec.cluster_name}/{host_name}/{device}"))


def secret_ref(cluster: Cluster, data: Mapping[str, Any]) -> dict[str, str]:
    """Where the root password's secret is: the inventory's secret, else a file on the
    deploying machine, ``~/.local/share/aicluster/<cluster_name>/minio.secret``."""
    return root_keys_ref(cluster, cluster_data(cluster, data)["minio_root_keys_name"])


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("minio", data)
    c = cluster_data(cluster, data)
    network = minio_network(cluster, data)
    me = cluster.hosts[host_name]
    ip = host_address(cluster, host_name, network) or me.address
    hosts = minio_hosts(cluster)
    first = hosts[0] if hosts else host_name
    lay = layout(cluster)
    tls = tls_enabled(v)
    scheme = "https" if tls else "http"
    url_host = url_hostname(host_name, network)
    port, console = int(c["minio_port"]), int(c["minio_console_port"])
    address = f"{_url_host(ip)}:{port}"
    console_address = f"{_url_host(ip)}:{console}"
    opts = f"--address {address} --console-address {console_address}"
    if tls:
        opts += f" --certs-dir {v['minio_certs_dir']}"
    my_drives = drives(data)
    devices = [d for d in my_drives if d["kind"] == "device"]
    directories = [d["path"] for d in my_drives if d["kind"] == "directory"]
    buckets = bucket_list(c) if host_name == first else []
    cacert = f" --cacert {v['minio_certs_dir']}/CAs/aicluster-ca.crt" if tls else ""
    base_url = f"{scheme}://{url_host}:{port}"
    timeout = int(c["minio_health_timeout"])
    request = {
        "host": host_name,
        "label": str(v["minio_fs_label"]),
        "drives": [{**d, "uuid": fs_uuid(cluster, host_name, d["device"]) if d["device"] else ""}
                   for d in my_drives],
        "multi_drive": lay["total_drives"] > 1,
        "mount_options": mount_options(v),
    }
    out = {
        "minio_cluster_name": cluster.spec.cluster_name,
        "minio_hosts": hosts,
        "minio_first_host": first,
        "minio_network_name": network,
        "minio_node_ip": ip,
        "minio_address": address,
        "minio_console_address": console_address,
        "minio_opts": opts,
        # Each release in a file of its own, the binary a link to it: a new release is
        # written beside the running one (never over a running executable).
        "minio_release_binary": f"{v['minio_binary']}.RELEASE.{c['minio_version']}",
        "minio_volumes": lay["volumes"],
        "minio_tls_enabled": tls,
        "minio_scheme": scheme,
        "minio_url_host": url_host,
        "minio_url": base_url,
        "minio_mc_alias": ALIAS,
        "minio_environment": [
            [str(k), config_text(x, "on", "off")]
            for k, x in merge_config(v["minio_default_config"], v["minio_config"]).items()
        ],
        "minio_drive_list": my_drives,
        "minio_device_list": [d["device"] for d in devices],
        # What the unit waits for (RequiresMountsFor): the drives the deploy mounts.
        "minio_mounted_drives": [d["path"] for d in devices],
        "minio_directory_list": directories,
        "minio_request": request,
        "minio_bucket_list": buckets,
        "minio_keys_ref": secret_ref(cluster, data),
        # What the Ansible role runs to read the node (the pyinfra facts' commands).
        "minio_blockdevices_command": block_command_text(
            [d["device"] for d in devices], [d["path"] for d in devices]),
        "minio_state_command": state_command_text(
            str(v["minio_binary"]), str(v["minio_mc_binary"]), directories,
            [b["name"] for b in buckets] if host_name == first else None),
        "minio_restart_command": restart_command(timeout),
        "minio_live_wait_command": wait_command(f"{base_url}/minio/health/live", cacert,
                                                timeout),
        "minio_cluster_wait_command": wait_command(f"{base_url}/minio/health/cluster",
                                                   cacert, timeout),
    }
    out.update(artifacts.derived_vars(cluster, host_name, "minio", data))
    return out


def mount_options(v: Mapping[str, Any]) -> str:
    options = [str(o) for o in v["minio_mount_options"] or []]
    if "nofail" not in options:
        options.append("nofail")
    return ",".join(options)


def restart_command(timeout: int) -> str:
    """Restart minio.service without waiting for its peers (``--no-block``: a distributed
    server reports ready only once they answer), but wait (bounded) until the running
    server has stopped and the new one is starting: systemd gives each start a new
    InvocationID. Until then the old server may still answer the health checks."""
    show = "systemctl show -p InvocationID --value minio"
    return (f"old=$({show}) && systemctl restart --no-block minio && timeout {int(timeout)} "
            f"sh -c 'while [ \"$({show})\" = \"$0\" ]; do sleep 0.2; done' \"$old\" || "
            f"{{ echo 'minio.service did not stop and start again within {int(timeout)} s "
            "(systemctl status minio)' >&2; exit 1; }")


def wait_command(url: str, cacert: str, timeout: int) -> str:
    """Wait (bounded) until ``url`` answers 200."""
    return (f"timeout {int(timeout)} sh -c 'until curl -fsS -o /dev/null --max-time 5{cacert} "
            f"{url}; do sleep 2; done' || {{ echo 'MinIO did not answer {url} within "
            f"{int(timeout)} s' >&2; exit 1; }}")


# ---------------------------------------------------------------------------
# The root password (deploying machine only; never printed): root_password, from
# aicluster.common.minio_credentials (the monitoring component mints MinIO's metrics
# token from it too)
# ---------------------------------------------------------------------------


class SecretText(StringIO):
    """A file's text for ``files.put`` that uploads and hashes as it is but shows no line
    (``readlines``, what pyinfra prints a diff from, gives a notice instead)."""

    def readlines(self, hint: int = -1) -> list[str]:  # noqa: ARG002 (StringIO's signature)
        return ["(holds secrets: not shown)\n"]


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def validate(cluster: Cluster) -> list[str]:
    """minio's checks of the inventory that need more than one value (the settings
    model, aicluster.components.minio.model, has checked each value): host and field
    named."""
    errors: list[str] = artifacts.validate(cluster, "minio")  # its release pins
    names = minio_hosts(cluster)
    for name, h in cluster.hosts.items():
        if name not in names and h.data.get("minio_drives"):
            errors.append(f"host {name!r}: minio_drives: is set but the host is not in the "
                          "minio group")
    if not names:
        return errors
    first = names[0]
    c = cluster_data(cluster, {})
    where_c = f"host {first!r}"
    errors += differs_from_first("minio", cluster, names, SHARED, "MinIO host")
    undeclared = undeclared_network(cluster, where_c, "minio_network", c["minio_network"])
    if undeclared:
        return errors + undeclared
    chosen = minio_network(cluster, {})
    for name in names:
        errors += network_errors(cluster, name, "minio_network", chosen)
    if c["minio_console_port"] == c["minio_port"]:
        errors.append(f"{where_c}: minio_console_port: {c['minio_port']} is minio_port too; "
                      "the console needs a port of its own")
    errors += _check_buckets(where_c, c["minio_buckets"])
    tls_hosts = [n for n in names if tls_enabled(layered("minio", cluster.hosts[n].data))]
    for name in names:
        errors += _check_host(cluster, name)
        if tls_hosts and name not in tls_hosts:
            errors.append(f"host {name!r}: minio_tls_cert_file: not set, but host "
                          f"{tls_hosts[0]!r} serves TLS; every MinIO host does, or none")
    if errors:
        return errors
    plan = layout(cluster)
    for host_name, fld, text in plan["problems"]:
        errors.append(f"host {host_name!r}: {fld}: {text}")
    if not errors:
        env = merge_config(c["minio_default_config"], c["minio_config"])
        errors += [f"{where_c}: {text}" for text in storage_class_problems(env, plan["pools"])]
    return errors


#: MinIO's storage classes (the erasure-code parity of an object), as it reads them.
STORAGE_CLASSES = {"MINIO_STORAGE_CLASS_STANDARD": "Standard",
                   "MINIO_STORAGE_CLASS_RRS": "Reduced redundancy"}


def storage_class_problems(env: Mapping[str, Any], pools_: list[Mapping[str, Any]]) -> list[str]:
    """What MinIO refuses at start in ``MINIO_STORAGE_CLASS_STANDARD``/``_RRS`` for
    these server pools (internal/config/storageclass: the form ``EC:<parity>``; a parity
    of at most half the erasure set's drives when the set has more than 2; the standard
    parity not below the reduced-redundancy one). Each line names the setting."""
    problems: list[str] = []
    parity: dict[str, int | None] = {}
    for key in STORAGE_CLASSES:
        value = env.get(key)
        if value is None or value == "":
            parity[key] = None
            continue
        m = re.fullmatch(r"EC:([0-9]+)", str(value))
        if not m:
            problems.append(f"minio_config.{key}: {value!r} is not a storage class MinIO "
                            "reads; write EC:<parity drives>, such as EC:2")
            continue
        parity[key] = int(m.group(1))
    if problems:
        return problems
    for number, pool in enumerate(pools_, start=1):
        size = int(pool.get("set_size") or 0)
        if size <= 2:
            continue
        for key, label in STORAGE_CLASSES.items():
            given = parity[key]
            if given is not None and given > size // 2:
                problems.append(
                    f"minio_config.{key}: EC:{given} is more parity than server pool {number} "
                    f"({', '.join(pool['hosts'])}) allows: its erasure sets have {size} "
                    f"drives, so at most EC:{size // 2}; MinIO refuses to start ({label} "
                    "storage class parity)")
    standard = parity["MINIO_STORAGE_CLASS_STANDARD"]
    rrs = parity["MINIO_STORAGE_CLASS_RRS"]
    if standard and rrs and standard < rrs:
        problems.append(
            f"minio_config.MINIO_STORAGE_CLASS_STANDARD: EC:{standard} is less parity than "
            f"MINIO_STORAGE_CLASS_RRS EC:{rrs}; MinIO refuses to start (the standard class "
            "keeps at least the reduced-redundancy parity)")
    return problems


def _check_buckets(where: str, entries: list[Mapping[str, Any]]) -> list[str]:
    errors: list[str] = []
    seen: list[str] = []
    for i, b in enumerate(entries):
        if b["name"] in seen:
            errors.append(f"{where}: minio_buckets[{i}].name: {b['name']} is listed twice")
        seen.append(b["name"])
    return errors


def _check_host(cluster: Cluster, name: str) -> list[str]:
    errors: list[str] = []
    h = cluster.hosts[name]
    where = f"host {name!r}"
    v = layered("minio", h.data)
    errors += _check_drives(cluster, name, v)
    errors += _check_tls(where, v)
    public = layered("base", h.data).get("base_firewall_public_ports") or []
    console = v["minio_console_port"]
    for i, entry in enumerate(public if isinstance(public, list) else []):
        if isinstance(entry, Mapping) and entry.get("port") == console and str(
                entry.get("proto", "tcp")) == "tcp":
            errors.append(f"{where}: base_firewall_public_ports[{i}]: opens the MinIO console "
                          f"port {console} to every network; the console is for the cluster "
                          "networks only (open minio_port for S3 clients outside)")
    return errors


def _check_drives(cluster: Cluster, name: str, v: Mapping[str, Any]) -> list[str]:
    where = f"host {name!r}"
    entries = v["minio_drives"]
    errors: list[str] = []
    others: dict[str, str] = {}
    h = cluster.hosts[name]
    if "nvme_cache" in h.components():
        others.update({d["device"]: "the host's NVMe cache drive (nvme_cache_devices)"
                       for d in cache_devices(cluster, name, h.data)})
    if "ceph" in h.components():
        others.update({d["device"]: "a Ceph OSD device (ceph_osd_devices)"
                       for d in osd_devices(h.data)})
    seen_dev: list[str] = []
    seen_path: list[str] = []
    for i, e in enumerate(entries):
        if e.get("device"):
            at = f"{where}: minio_drives[{i}].device"
            dev = str(e["device"])
            if dev in seen_dev:
                errors.append(f"{at}: {dev} is listed twice")
            elif dev in others:
                errors.append(f"{at}: {dev} is also {others[dev]}; a device has one use")
            seen_dev.append(dev)
    for i, d in enumerate(drives(h.data)):
        path = d["path"]
        at = f"{where}: minio_drives[{i}].path" if entries else f"{where}: minio_data_dir"
        if path in SYSTEM_DIRS:
            errors.append(f"{at}: {path!r} is a system directory")
            continue
        if path in seen_path:
            errors.append(f"{at}: {path} is listed twice")
        for other in seen_path:
            if path.startswith(other + "/") or other.startswith(path + "/"):
                errors.append(f"{at}: {path} and {other} are nested; every drive is a "
                              "directory of its own")
        seen_path.append(path)
    return errors


def _check_tls(where: str, v: Mapping[str, Any]) -> list[str]:
    keys = ("minio_tls_cert_file", "minio_tls_key_file", "minio_tls_ca_file")
    given = [k for k in keys if v[k]]
    if not given:
        return []
    errors = []
    for key in keys:
        if not v[key]:
            errors.append(f"{where}: {key}: not set, but {given[0]} is; TLS needs the "
                          "certificate, its key and the CA that signed them")
        elif not Path(v[key]).expanduser().is_file():
            errors.append(f"{where}: {key}: {v[key]} does not exist on the deploying machine")
    return errors


# ---------------------------------------------------------------------------
# The decision (both engines): what the drives hold, and what to do
# ---------------------------------------------------------------------------


def plan(block: Mapping[str, Any], state: Mapping[str, Any],
         request: Mapping[str, Any]) -> dict[str, Any]:
    """What to do with the host's drives, from its BlockDevices and MinioState facts.

    ``problems`` (lines naming the host and the drive: when any, nothing at all is
    done on the host), ``wipe`` (devices erased first: wipe: true), ``mkfs``
    (``[{device, uuid}]``), ``fstab`` (``[{path, line}]``), ``mount`` (``[{path,
    command}]``: the command mounts the drive and proves it is mounted)."""
    where = f"host {request['host']!r}: minio"
    out: dict[str, Any] = {"problems": [], "wipe": [], "mkfs": [], "fstab": [], "mount": []}
    problems: list[str] = []
    devices = [d for d in request["drives"] if d["kind"] == "device"]
    label = request["label"]
    checked = check_devices(block, devices, [{"type": "xfs", "label": label}])
    problems += [f"{where}: {p}".replace("(hardware.nvme)", "(minio_drives)")
                 for p in checked["problems"]]
    records = block.get("devices") or {}
    mounts = block.get("mounts") or {}
    for d in devices:
        entry = checked["devices"].get(d["device"], {})
        state_ = entry.get("state")
        fs_uuid_ = d["uuid"]
        if state_ == "ours":
            rec = records.get(d["device"]) or {}
            sig = (rec.get("signatures") or [{}])[0]
            fs_uuid_ = sig.get("uuid") or (rec.get("blkid") or {}).get("UUID") or fs_uuid_
        elif state_ in ("empty", "wipe"):
            if state_ == "wipe":
                out["wipe"].append(d["device"])
            out["mkfs"].append({"device": d["device"], "uuid": fs_uuid_})
        out["fstab"].append({
            "path": d["path"],
            "line": f"UUID={fs_uuid_} {d['path']} xfs {request['mount_options']} 0 2",
            "regexp": fstab_python_regexp(d["path"]),
        })
        mounted = mounts.get(d["path"])
        if mounted:
            if mounted.get("source") != entry.get("real") or state_ != "ours":
                problems.append(
                    f"{where}: {d['path']} already has {mounted.get('source') or 'something'} "
                    f"({mounted.get('fstype') or 'unknown type'}) mounted; {d['device']} is "
                    "not mounted over it. Unmount it, or give the drive another path")
        else:
            out["mount"].append({"path": d["path"], "command": mount_command(
                d["path"], ["xfs"], d["device"])})
    if request.get("multi_drive"):
        for d in request["drives"]:
            if d["kind"] == "directory" and (state.get("dirs") or {}).get(d["path"]) == "root":
                problems.append(
                    f"{where}: minio_drives: {d['path']} is on the system disk (the file system "
                    "of /); MinIO refuses such a drive when the cluster has more than one. "
                    "Mount a drive of its own there, or name the device in minio_drives")
    out["problems"] = problems
    if problems:
        out.update(wipe=[], mkfs=[], fstab=[], mount=[])
    return out


def plan_from_output(block_lines: Iterable[str], state_lines: Iterable[str],
                     request: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`plan` from the text the facts' commands printed (the Ansible filter)."""
    return plan(block_parse(block_lines), state_parse(state_lines), request)


def bucket_commands(state: Mapping[str, Any], wanted: Iterable[Mapping[str, Any]]) -> list[str]:
    """The mc commands the first host runs for the buckets that are missing or differ
    (all of them when the running cluster could not be read)."""
    read = state.get("buckets") or {}
    reachable = bool(read.get("reachable"))
    names = set(read.get("names") or [])
    anonymous = read.get("anonymous") or {}
    versioning = read.get("versioning") or {}
    out = []
    for b in wanted:
        target = shlex.quote(f"{ALIAS}/{b['name']}")
        if not reachable or b["name"] not in names:
            out.append(f"{MC} mb --ignore-existing {target}")
        if not reachable or anonymous.get(b["name"]) != b["policy"]:
            out.append(f"{MC} anonymous set {b['policy']} {target}")
        if b["versioning"] is not None:
            want = "Enabled" if b["versioning"] else "Suspended"
            have = versioning.get(b["name"], "")
            if not reachable or (have != want and (b["versioning"] or have)):
                verb = "enable" if b["versioning"] else "suspend"
                out.append(f"{MC} version {verb} {target}")
    return out


def node_current(state: Mapping[str, Any], release_binary: str, sha256: str) -> bool:
    """Whether a node runs (or will start) the pinned release: its binary has the
    pinned checksum and a running server was started from that release's file."""
    exe = str(state.get("exe") or "")
    return state.get("minio") == sha256 and (not exe or exe == release_binary)


def old_releases(state: Mapping[str, Any], release_binary: str) -> list[str]:
    """The release files of other versions on the node (removed once every server
    runs the pinned one)."""
    return [r for r in state.get("releases") or [] if r != release_binary]


def mkfs_command(device: str, label: str, fs_uuid_: str) -> str:
    """mkfs.xfs WITHOUT -f: it refuses a device that holds a signature after all."""
    return (f"mkfs.xfs -q -L {shlex.quote(label)} -m uuid={shlex.quote(fs_uuid_)} "
            f"{shlex.quote(device)}")


#: What a deploy takes off a host the inventory no longer gives MinIO (by role, and
#: the component's own key when the host loses it altogether): services stopped and
#: disabled, configuration files the deploy wrote removed, services reloaded afterwards
#: (aicluster.common.absence). Data stays (the drives, their mounts and fstab lines, the
#: buckets); the minio and mc binaries too, unless the inventory's remove_packages
#: names minio.
REMOVAL = {
    "minio": {"services": ["minio"], "files": [UNIT, ENV_FILE],
              "software": ["{minio_binary}", "{minio_mc_binary}"]},
}
