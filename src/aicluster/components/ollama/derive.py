"""The ollama component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

import re
import shlex
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aicluster import artifacts
from aicluster.common.disks import cache_environment
from aicluster.common.networks import host_address, network_errors, pick_network
from aicluster.common.settings import differs_from_first, layered
from aicluster.components.ollama.probe import INSTALLED_MARKER, command_text
from aicluster.inventory import Cluster

UNIT = "/etc/systemd/system/ollama.service"
DROPIN_DIR = "/etc/systemd/system/ollama.service.d"
DROPIN = f"{DROPIN_DIR}/aicluster.conf"
BIN_LINK = "/usr/local/bin/ollama"
GATEWAY_CONF = "/etc/nginx/conf.d/ollama-gateway.conf"
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
HOST_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?$")
NAME_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,79}$")
#: Ollama's own rule: this many models per GPU (or on a CPU node) when not set.
MODELS_PER_GPU = 3
#: The release archive's formats, by the end of its file name, and the tar option that
#: reads each: up to 0.13.x Ollama published ``ollama-linux-<arch>.tgz``, from 0.14.0 on
#: ``ollama-linux-<arch>.tar.zst`` (GNU tar's ``--zstd`` runs ``zstd -d``; zstd is in
#: ollama_packages).
RELEASE_FORMATS = {
    ".tgz": "--gzip",
    ".tar.gz": "--gzip",
    ".tar.zst": "--zstd",
    ".tzst": "--zstd",
}


# ---------------------------------------------------------------------------
# Values computed from the whole inventory (both engines use these)
# ---------------------------------------------------------------------------


def ollama_hosts(cluster: Cluster) -> list[str]:
    return list(cluster.group("ollama"))


def gateway_hosts(cluster: Cluster) -> list[str]:
    return list(cluster.group("ollama_gateway"))


def _all_hosts(cluster: Cluster) -> list[str]:
    return list(dict.fromkeys([*ollama_hosts(cluster), *gateway_hosts(cluster)]))


def ollama_network(cluster: Cluster, data: Mapping[str, Any]) -> str:
    """The network Ollama and its gateway listen on: ``ollama_network``, or fabric when
    every Ollama and gateway node has an address there, else management."""
    return pick_network(cluster, layered("ollama", data)["ollama_network"], _all_hosts(cluster))


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _loopback_for(bind: str) -> str:
    """Where a client on the node itself reaches a server bound to ``bind``."""
    if bind == "0.0.0.0":
        return "127.0.0.1"
    if bind == "::":
        return "::1"
    return bind


def parse_model(name: str) -> tuple[str, str, str, str] | None:
    """``[host/][namespace/]model[:tag]`` as Ollama reads it -> (host, namespace, model,
    tag), or None when it is not a model name."""
    if not isinstance(name, str) or not name or name != name.strip():
        return None
    parts = name.split("/")
    if len(parts) > 3:
        return None
    last = parts[-1]
    model, sep, tag = last.partition(":")
    if not sep:
        tag = "latest"
    registry = parts[0] if len(parts) == 3 else DEFAULT_REGISTRY
    namespace = parts[-2] if len(parts) >= 2 else DEFAULT_NAMESPACE
    if not (HOST_PART_RE.match(registry) and NAME_PART_RE.match(namespace)
            and NAME_PART_RE.match(model) and TAG_RE.match(tag)):
        return None
    return registry, namespace, model, tag


def manifest_path(name: str) -> str:
    """The manifest of a model under OLLAMA_MODELS/manifests (what the fact lists)."""
    parsed = parse_model(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not an Ollama model name")
    return "/".join(parsed)


def models_location(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> tuple[str, bool]:
    """OLLAMA_MODELS for the host, and whether it is the NVMe cache's directory."""
    v = layered("ollama", data)
    if v["ollama_models_dir"]:
        return str(v["ollama_models_dir"]).rstrip("/"), False
    cached = cache_environment(cluster, host_name, data).get("OLLAMA_MODELS")
    if cached:
        return cached, True
    return f"{str(v['ollama_home']).rstrip('/')}/.ollama/models", False


def _bind_address(cluster: Cluster, name: str, network: str) -> str:
    v = layered("ollama", cluster.hosts[name].data)
    return str(v["ollama_host"] or host_address(cluster, name, network)
               or cluster.hosts[name].address)


def upstreams(cluster: Cluster, network: str) -> list[str]:
    """Every Ollama node as ``address:port`` for the gateway: its listen address (its
    address on the Ollama network when it listens on every interface)."""
    out = []
    for name in ollama_hosts(cluster):
        v = layered("ollama", cluster.hosts[name].data)
        bind = _bind_address(cluster, name, network)
        if bind in ("0.0.0.0", "::"):
            bind = host_address(cluster, name, network) or cluster.hosts[name].address
        out.append(f"{url_host(bind)}:{int(v['ollama_port'])}")
    return out


def environment(v: Mapping[str, Any], bind: str, models: str, gpus: int) -> list[list[str]]:
    """The service's environment as ``[name, value]`` pairs: the settings of their own
    fields, then ``ollama_config`` over them (a null value drops a setting)."""
    loaded = int(v["ollama_max_loaded_models"]) or MODELS_PER_GPU * max(gpus, 1)
    env: dict[str, str] = {
        "OLLAMA_HOST": f"{url_host(bind)}:{int(v['ollama_port'])}",
        "OLLAMA_MODELS": models,
        "OLLAMA_KEEP_ALIVE": str(v["ollama_keep_alive"]),
        "OLLAMA_NUM_PARALLEL": str(int(v["ollama_num_parallel"])),
        "OLLAMA_MAX_LOADED_MODELS": str(loaded),
        "OLLAMA_MAX_QUEUE": str(int(v["ollama_max_queue"])),
    }
    for key, value in (v["ollama_config"] or {}).items():
        if value is None:
            env.pop(str(key), None)
        elif isinstance(value, bool):
            env[str(key)] = "1" if value else "0"
        else:
            env[str(key)] = str(value)
    return [[k, val] for k, val in env.items()]


def wait_command(client_env: str, timeout: int) -> str:
    """Wait (bounded) until the node's Ollama answers."""
    tries = max(1, int(timeout) // 2)
    return (
        f"for i in $(seq {tries}); do {client_env} {BIN_LINK} list >/dev/null 2>&1 && exit 0; "
        f"sleep 2; done; echo 'Ollama did not answer at {client_env.split('=', 1)[1]} within "
        f"{int(timeout)} s (journalctl -u ollama)' >&2; exit 1"
    )


def pull_command(client_env: str, name: str, timeout: int) -> str:
    return f"{client_env} timeout {int(timeout)} {BIN_LINK} pull {shlex.quote(name)}"


def release_format(filename: str) -> str | None:
    """The tar option that reads the release archive ``filename`` (by its ending), or
    None for a format the deploy does not unpack."""
    for ending, option in RELEASE_FORMATS.items():
        if filename.endswith(ending):
            return option
    return None


def unpack_command(release_dir: str, filename: str, sha256: str) -> str:
    """Unpack the release archive in ``release_dir`` (its format chosen by the pinned
    file name), then record the complete unpack: the one command both engines run."""
    option = release_format(filename)
    if option is None:
        raise ValueError(f"{filename!r} is not an Ollama release archive "
                         f"({', '.join(RELEASE_FORMATS)})")
    archive = f"{release_dir}/{filename}"
    return (
        f"tar {option} -xf {shlex.quote(archive)} -C {shlex.quote(release_dir)} "
        f"--no-same-owner && echo {sha256} > "
        f"{shlex.quote(release_dir + '/' + INSTALLED_MARKER)}"
    )


def archive_path(cluster: Cluster, data: Mapping[str, Any]) -> str:
    """The offline models archive on the deploying machine ('' when none is named)."""
    v = layered("ollama", data)
    rel = v["ollama_models_archive"]
    base = getattr(cluster.spec, "artifacts_dir", None)
    if not rel or not base:
        return ""
    return str(Path(base).expanduser() / str(rel))


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("ollama", data)
    host_ = cluster.hosts[host_name]
    first = (_all_hosts(cluster) or [host_name])[0]
    network = ollama_network(cluster, cluster.hosts[first].data)
    node_address = host_address(cluster, host_name, network) or host_.address
    bind = str(v["ollama_host"] or node_address)
    models, on_cache = models_location(cluster, host_name, data)
    client_env = f"OLLAMA_HOST={url_host(_loopback_for(bind))}:{int(v['ollama_port'])}"
    install = f"{str(v['ollama_install_dir']).rstrip('/')}/{v['ollama_version']}"
    listen = str(v["ollama_gateway_listen"] or node_address)
    model_list = []
    for name in v["ollama_models"] or []:
        model_list.append({
            "name": name,
            "manifest": manifest_path(name),
            "pull_command": pull_command(client_env, name, v["ollama_pull_timeout"]),
        })
    is_gateway = host_name in gateway_hosts(cluster)
    out = {
        "ollama_is_server": host_name in ollama_hosts(cluster),
        "ollama_is_gateway": is_gateway,
        "ollama_network_name": network,
        "ollama_node_address": node_address,
        "ollama_bind_address": bind,
        "ollama_client_env": client_env,
        "ollama_models_path": models,
        "ollama_models_on_cache": on_cache,
        "ollama_environment": environment(v, bind, models, host_.spec.hardware.gpus.count),
        "ollama_release_dir": install,
        "ollama_bin": BIN_LINK,
        "ollama_model_list": model_list,
        "ollama_models_archive_path": archive_path(cluster, data),
        "ollama_wait_command": wait_command(client_env, v["ollama_start_timeout"]),
        "ollama_gateway_upstreams": upstreams(cluster, network),
        "ollama_gateway_listen_ip": listen,
        "ollama_gateway_listen_address": f"{url_host(listen)}:{int(v['ollama_gateway_port'])}",
        "ollama_fact_command": command_text(
            str(v["ollama_install_dir"]), BIN_LINK, models,
            int(v["ollama_gateway_port"]) if is_gateway else 0,
        ),
    }
    out.update(artifacts.derived_vars(cluster, host_name, "ollama", data))
    # "" where there is nothing to unpack (a gateway only; validate() refuses a release
    # file of another format).
    release = out["ollama_artifact_files"].get("ollama")
    out["ollama_unpack_command"] = (
        unpack_command(install, release["filename"], release["sha256"])
        if out["ollama_is_server"] and release and release_format(release["filename"])
        else ""
    )
    return out


# ---------------------------------------------------------------------------
# Validation (no I/O): each error names the host and the field
# ---------------------------------------------------------------------------


def validate(cluster: Cluster) -> list[str]:
    """ollama's checks of the inventory that need more than one value (the settings
    model, aicluster.components.ollama.model, has checked each value): host and field
    named."""
    errors: list[str] = artifacts.validate(cluster, "ollama")  # its release pins
    servers, gateways = ollama_hosts(cluster), gateway_hosts(cluster)
    names = _all_hosts(cluster)
    if gateways and not servers:
        errors.append(
            f"host {gateways[0]!r}: groups: is in ollama_gateway, which balances across the "
            "hosts of the ollama group; the inventory has none"
        )
    if not names:
        return errors
    errors += differs_from_first(
        "ollama", cluster, names, ("ollama_network", "ollama_version", "ollama_install_dir"),
        "Ollama and gateway node")
    network = ollama_network(cluster, cluster.hosts[names[0]].data)
    for name in names:
        h = cluster.hosts[name]
        v = layered("ollama", h.data)
        where = f"host {name!r}"
        problems: list[str] = []
        problems += network_errors(cluster, name, "ollama_network", v["ollama_network"] or network)
        problems += _check_archive(cluster, where, v)
        if name in servers:
            problems += _check_release_format(cluster, name, where)
        errors += problems
        if name in servers and name in gateways and not problems:
            bind = _bind_address(cluster, name, network)
            listen = str(v["ollama_gateway_listen"] or host_address(cluster, name, network))
            if v["ollama_port"] == v["ollama_gateway_port"] and (
                bind == listen or "0.0.0.0" in (bind, listen) or "::" in (bind, listen)
            ):
                errors.append(
                    f"{where}: ollama_gateway_port: the host runs Ollama and the gateway, both "
                    f"on {listen}:{v['ollama_port']}; give the gateway another port (e.g. "
                    f"ollama_gateway_port: {v['ollama_port'] + 1}) or another address"
                )
    return errors


def _check_release_format(cluster: Cluster, name: str, where: str) -> list[str]:
    """The pinned release must be an archive the deploy can unpack (.tgz or .tar.zst)."""
    try:
        release = artifacts.host_artifacts(cluster, name, "ollama").get("ollama")
    except artifacts.ArtifactError:
        return []  # a malformed pin: artifacts.validate has named it
    if release is None or release_format(release.filename):
        return []
    return [f"{where}: ollama_artifacts.ollama: the release file {release.filename!r} is not "
            f"an archive the deploy unpacks; pin the release's "
            f"{' or '.join(RELEASE_FORMATS)} (its URL or `filename` ends so)"]


def _check_archive(cluster: Cluster, where: str, v: Mapping[str, Any]) -> list[str]:
    archive, digest = v["ollama_models_archive"], v["ollama_models_archive_sha256"]
    errors = []
    if archive and not digest:
        errors.append(f"{where}: ollama_models_archive_sha256: not set, but "
                      "ollama_models_archive is; pin the archive's sha256")
    if digest and not archive:
        errors.append(f"{where}: ollama_models_archive: not set, but "
                      "ollama_models_archive_sha256 is; name the archive")
    elif archive and not getattr(cluster.spec, "artifacts_dir", None):
        errors.append(f"{where}: ollama_models_archive: needs artifacts_dir, the directory "
                      "on the deploying machine the archive is in")
    return errors


# ---------------------------------------------------------------------------
# The offline models archive, checked on the deploying machine
# ---------------------------------------------------------------------------

_ARCHIVES: dict[tuple[str, int, int], set[str]] = {}


def archive_manifests(path: str) -> set[str]:
    """The manifest paths (``registry.ollama.ai/library/x/tag``) an archive holds."""
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _ARCHIVES:
        found = set()
        with tarfile.open(path) as tar:
            for member in tar:
                parts = [p for p in member.name.split("/") if p not in ("", ".")]
                if member.isfile() and len(parts) == 5 and parts[0] == "manifests":
                    found.add("/".join(parts[1:]))
        _ARCHIVES[key] = found
    return _ARCHIVES[key]


def check_archive(v: Mapping[str, Any], wanted: list[dict[str, str]]) -> str | None:
    """Why the offline archive cannot give the host its models, or None."""
    path = v["ollama_models_archive_path"]
    where = f"host {v['inventory_hostname']!r}: ollama_models_archive"
    if not Path(path).is_file():
        return f"{where}: {path} does not exist on the deploying machine"
    actual = artifacts.file_sha256(path)
    if actual != v["ollama_models_archive_sha256"]:
        return (f"{where}: {path} has sha256 {actual}, not the pinned "
                f"{v['ollama_models_archive_sha256']} (ollama_models_archive_sha256)")
    try:
        held = archive_manifests(path)
    except (tarfile.TarError, OSError) as exc:
        return f"{where}: {path} is not a tar archive ({exc})"
    missing = [m["name"] for m in wanted if m["manifest"] not in held]
    if missing:
        return (f"{where}: {path} holds no {', '.join(missing)} (no manifests/<registry>/"
                "<namespace>/<model>/<tag> for it); make the archive from an OLLAMA_MODELS "
                "tree that has every model of ollama_models")
    return None


#: What a deploy takes off a host the inventory no longer gives Ollama or its gateway (by role, and
#: the component's own key when the host loses it altogether): services stopped and
#: disabled, configuration files the deploy wrote removed, services reloaded afterwards
#: (aicluster.common.absence). Data stays (the models); Ollama's releases and the
#: gateway's nginx too, unless the inventory's remove_packages names ollama.
REMOVAL = {
    "ollama": {"services": ["ollama"], "files": [DROPIN, UNIT],
               "software": [BIN_LINK, "{ollama_install_dir}"]},
    "ollama_gateway": {"files": [GATEWAY_CONF], "reload": ["nginx"],
                       "packages": ["ollama_gateway_packages"]},
}
