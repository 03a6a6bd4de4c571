"""ollama: Ollama servers from the pinned release, and nginx as one gateway in front.

Defaults: roles/ollama/defaults/main.yml. Templates: roles/ollama/templates/.

An `ollama` host gets the release tarball (aicluster.artifacts: verified on the
deploying machine, copied once), unpacked into ``<ollama_install_dir>/<version>`` with
/usr/local/bin/ollama linked to it; the ``ollama`` system user (render and video
groups); ``ollama.service`` with every setting in the drop-in
``ollama.service.d/aicluster.conf`` (listen address on the cluster network, models on
the NVMe cache, keep-alive and parallelism from the inventory). The service restarts
only when the link, the unit or the drop-in changed. The inventory's models are then
pulled, only those a node lacks (read from the manifests on disk), or unpacked from a
pinned archive in the artifact directory for sites without internet.

An `ollama_gateway` host runs nginx with one upstream of every Ollama node
(least_conn, passive health checks, long timeouts, no buffering), because one Ollama
serves only its own GPUs: the gateway turns the nodes into one endpoint.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from aicluster import artifacts
from aicluster.common.ops import install_packages as _install_packages
from aicluster.common.ops import owned_directory, put_template, system_user, this_host
from aicluster.common.settings import NETWORK_ARGS
from aicluster.components.ollama.derive import (
    BIN_LINK,
    DROPIN,
    DROPIN_DIR,
    GATEWAY_CONF,
    UNIT,
    check_archive,
)
from aicluster.components.ollama.facts import OllamaNode
from aicluster.render import defaults

# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------


@deploy("ollama", data_defaults=defaults("ollama"))
def deploy() -> None:
    cluster, family, v = this_host("ollama")
    me = host.get_fact(
        OllamaNode,
        install_dir=str(v["ollama_install_dir"]),
        bin_link=BIN_LINK,
        models_dir=v["ollama_models_path"],
        gateway_port=int(v["ollama_gateway_port"]) if v["ollama_is_gateway"] else 0,
    )
    have = me.get("addresses")
    for role, address in (("ollama", v["ollama_bind_address"]),
                          ("ollama_gateway", v["ollama_gateway_listen_ip"])):
        wanted_here = v["ollama_is_server"] if role == "ollama" else v["ollama_is_gateway"]
        if wanted_here and have is not None and address and address not in ("0.0.0.0", "::") \
                and address not in have:
            raise DeployError(
                f"ollama: host {host.name!r} does not have the address {role} listens on, "
                f"{address}; it has {', '.join(have)}. Configure the {v['ollama_network_name']}"
                " network on the node first, or set ollama_network."
            )
    missing = [m for m in v["ollama_model_list"] if m["manifest"] not in me["models"]]
    if v["ollama_is_server"] and missing and v["ollama_models_archive_path"]:
        problem = check_archive(v, missing)
        if problem:
            raise DeployError(f"ollama: {problem}")
    if v["ollama_is_server"]:
        _server(v, family, me, missing)
    if v["ollama_is_gateway"]:
        _gateway(v, family, me)


def _server(v: dict[str, Any], family: str, me: Mapping[str, Any], missing: list[dict]) -> None:
    version, release = v["ollama_version"], v["ollama_release_dir"]
    art = v["ollama_artifact_files"]["ollama"]
    _install_packages("Install tar, gzip and zstd (to unpack the Ollama release)",
                      v["ollama_packages"], family)
    for group in v["ollama_extra_groups"]:
        server.group(name=f"Group {group}", group=group, system=True)
    server.group(name=f"Group {v['ollama_user']}", group=v["ollama_user"], system=True)
    system_user(
        name=f"Ollama user {v['ollama_user']}",
        user=v["ollama_user"],
        group=v["ollama_user"],
        groups=list(v["ollama_extra_groups"]),
        append=True,
        system=True,
        home=v["ollama_home"],
        create_home=True,
        shell="/usr/sbin/nologin",
    )
    files.directory(name=f"Ollama {version} directory", path=release)
    archive = artifacts.put(
        "ollama", "ollama", f"{release}/{art['filename']}", mode="644",
        op_name=f"Ollama {version} release archive",
    )
    # .tgz or .tar.zst, by the pinned file name (derive.unpack_command; Ansible runs the same).
    unpack = v["ollama_unpack_command"]
    if me["installed"].get(version) == art["sha256"]:
        host.noop(f"Ollama {version} is unpacked in {release}")
        unpacked = server.shell(name=f"Unpack Ollama {version} (its archive changed)",
                                commands=[unpack], _if=archive.did_change)
    else:
        unpacked = server.shell(name=f"Unpack Ollama {version}", commands=[unpack])
    link = files.link(
        name=f"{BIN_LINK} runs Ollama {version}",
        path=BIN_LINK,
        target=f"{release}/bin/ollama",
    )
    if not v["ollama_models_on_cache"]:
        owned_directory(f"Models directory {v['ollama_models_path']}", v["ollama_models_path"],
                        v["ollama_user"])
    unit = put_template("ollama", "ollama.service.j2", UNIT, v, name="Write the Ollama unit")
    files.directory(name="Ollama unit drop-in directory", path=DROPIN_DIR)
    dropin = put_template("ollama", "aicluster.conf.j2", DROPIN, v,
                          name="Write Ollama's settings (drop-in aicluster.conf)")
    systemd.daemon_reload(name="Reload systemd units", _if=any_changed(unit, dropin))
    systemd.service(
        name="Restart Ollama (its release, unit or settings changed)",
        service="ollama",
        restarted=True,
        _if=any_changed(unpacked, link, unit, dropin),
    )
    systemd.service(name="Ollama running and enabled", service="ollama", running=True,
                    enabled=True)
    _models(v, missing)
    for old in me["versions"]:
        if old != version:
            files.directory(
                name=f"Remove Ollama {old} (the node runs {version})",
                path=f"{str(v['ollama_install_dir']).rstrip('/')}/{old}",
                present=False,
            )


def _models(v: dict[str, Any], missing: list[dict]) -> None:
    if not v["ollama_model_list"]:
        return
    if not missing:
        host.noop(f"Ollama has its models: {', '.join(m['name'] for m in v['ollama_model_list'])}")
        return
    if v["ollama_models_archive_path"]:
        models = v["ollama_models_path"]
        dest = f"{models}/.aicluster-models-archive"
        files.put(
            name=f"Copy the models archive {v['ollama_models_archive']}",
            src=v["ollama_models_archive_path"],
            dest=dest,
            mode="600",
        )
        q_models, q_dest, q_user = (shlex.quote(models), shlex.quote(dest),
                                    shlex.quote(v["ollama_user"]))
        server.shell(
            name=f"Unpack {', '.join(m['name'] for m in missing)} from the models archive",
            commands=[
                f"tar -xf {q_dest} -C {q_models} --no-same-owner manifests blobs",
                f"chown -R {q_user}:{q_user} {q_models}/manifests {q_models}/blobs",
                f"rm -f {q_dest}",
            ],
        )
        return
    server.shell(name="Wait until Ollama answers", commands=[v["ollama_wait_command"]])
    for m in missing:
        server.shell(
            name=f"Pull the model {m['name']}",
            commands=[m["pull_command"]],
            _timeout=int(v["ollama_pull_timeout"]) + 60,
            _retries=NETWORK_ARGS["_retries"],
        )


def _gateway(v: dict[str, Any], family: str, me: Mapping[str, Any]) -> None:
    _install_packages("Install nginx (the Ollama gateway)", v["ollama_gateway_packages"], family)
    port = int(v["ollama_gateway_port"])
    if v["ollama_gateway_selinux"] and me.get("selinux") in ("Enforcing", "Permissive"):
        if me.get("selinux_connect") != "on":
            server.shell(name="SELinux: let nginx connect to the Ollama nodes",
                         commands=["setsebool -P httpd_can_network_connect 1"])
        if not me.get("selinux_port"):
            server.shell(
                name=f"SELinux: let nginx listen on port {port}",
                commands=[f"semanage port -a -t http_port_t -p tcp {port} || "
                          f"semanage port -m -t http_port_t -p tcp {port}"],
            )
    conf = put_template("ollama", "ollama-gateway.conf.j2", GATEWAY_CONF, v,
                        name="Write the Ollama gateway (nginx)")
    changed = [conf]
    default_site = v["ollama_gateway_default_site"]
    if default_site and not v["ollama_gateway_keep_default_site"]:
        # Debian's and Ubuntu's default site listens on port 80 of every address.
        site = files.link(name="Remove the distribution's default nginx site",
                          path=default_site, present=False, force=True, force_backup=False)
        changed.append(site)
    gateway_changed = any_changed(*changed)
    server.shell(name="Check nginx's configuration", commands=["nginx -t -q"],
                 _if=gateway_changed)
    systemd.service(name="nginx running and enabled", service="nginx", running=True,
                    enabled=True)
    server.shell(name="Reload nginx (the gateway changed)",
                 commands=["systemctl reload-or-restart nginx.service"], _if=gateway_changed)
