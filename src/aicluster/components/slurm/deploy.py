"""slurm: munge, slurmctld (and a backup), slurmd with GPU GRES, optional slurmdbd.

Defaults: roles/slurm/defaults/main.yml. Templates: roles/slurm/templates/.
What is computed from the whole inventory (the slurm.conf lines, NodeName ranges,
partitions, gres devices) is computed here, once, for both engines; the Ansible role
reaches :func:`restart_needed` through its filter plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from io import BytesIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.rpm import RpmPackages
from pyinfra.operations import apt, dnf, files, server, systemd

from aicluster.common.facts import UnitLoaded
from aicluster.common.ops import (
    enable_crb_for,
    install_packages,
    put_template,
    say,
    this_host,
)
from aicluster.common.settings import NETWORK_ARGS
from aicluster.common.versions import version_matches
from aicluster.components.slurm.derive import (
    APT_PIN,
    CGROUP_CONF,
    CONF_DIR,
    DBD_CONF,
    GRES_CONF,
    INSTALLER,
    MUNGE_KEY,
    SLURM_CONF,
    _render_conf,
    gres_autodetect,
    node_packages,
    restart_needed,
)
from aicluster.components.slurm.facts import (
    CgroupWritable,
    MariadbUser,
    NvidiaDriver,
    NvmlPlugin,
    SlurmConf,
)
from aicluster.inventory import Cluster
from aicluster.render import defaults
from aicluster.secrets import SecretError, read_secret


def _installed_version(family: str, v: Mapping[str, Any]) -> str | None:
    """The installed version of the package every Slurm node has, or None."""
    packages = host.get_fact(DebPackages if family == "Debian" else RpmPackages) or {}
    versions = packages.get(v["slurm_common_packages"][0])
    return sorted(versions)[-1] if versions else None


def _cluster_cgroup(cluster: Cluster, v: Mapping[str, Any]) -> bool:
    """cgroup plugins for the whole cluster: the inventory's choice, else whether every
    Slurm node can write its cgroups (slurm.conf must be the same on every node)."""
    if v["slurm_cgroup_plugins"] is not None:
        return bool(v["slurm_cgroup_plugins"])
    from pyinfra.context import ctx_inventory

    inventory = ctx_inventory.get()
    for name in v["slurm_cluster_hosts"]:
        other = inventory.get_host(name)
        if other is not None and not other.get_fact(CgroupWritable):
            return False
    return True


@deploy("slurm", data_defaults=defaults("slurm"))
def deploy() -> None:
    cluster, family, v = this_host("slurm")
    v["slurm_cgroup_enabled"] = _cluster_cgroup(cluster, v)
    _gres_autodetect(v)

    upgrading = _packages(v, family)
    _munge(cluster, v)
    confs = _config(v)
    _daemons(v, confs, upgrading)


def _gres_autodetect(v: dict[str, Any]) -> None:
    """AutoDetect=nvml only where the driver is loaded and Slurm's NVML plugin is the
    installed slurmd's (aicluster.components.slurm.derive.gres_autodetect); the facts are
    read only where they decide."""
    choice, gpus = v["slurm_gres_autodetect"], int(v["slurm_gres_count"])
    driver = choice is None and gpus > 0 and bool(host.get_fact(NvidiaDriver))
    nvml = host.get_fact(NvmlPlugin) if driver else None
    enabled, why = gres_autodetect(choice, gpus, driver, nvml, v["slurm_version"])
    v["slurm_gres_autodetect_enabled"] = enabled
    if why:
        say(f"slurm: {why}")


def _packages(v: dict[str, Any], family: str) -> bool:
    """Install Slurm at the pinned version; True when this run upgrades it."""
    net = NETWORK_ARGS
    if v["slurm_apt_pin"] and v["slurm_version"]:
        put_template("slurm", "aicluster-slurm.pref.j2", APT_PIN, v,
                     name=f"Pin Slurm's packages at {v['slurm_version']}")
    elif v["slurm_apt_pin"]:
        files.file(name="No Slurm version pin", path=APT_PIN, present=False)
    # EL9: Slurm is EPEL's (CodeReady Builder enabled first).
    before = list(v["slurm_prepare_packages"] or [])
    if before:
        enable_crb_for(before, family)
        install_packages(f"Before Slurm: {', '.join(before)}", before, family)
    put_template("slurm", "aicluster-slurm-install.j2", INSTALLER, v,
                 name="Slurm installer (drain, upgrade, resume)", mode="755")

    installed = _installed_version(family, v)
    have = host.get_fact(DebPackages if family == "Debian" else RpmPackages) or {}
    wanted = [*v["slurm_munge_packages"], *node_packages(v)]
    missing = [p for p in wanted if p not in have]
    upgrading = installed is not None and not version_matches(installed, v["slurm_version"])
    what = f"Slurm {installed} to {v['slurm_version']}"
    control = v["slurm_is_controller"] or v["slurm_is_dbd"]
    # pyinfra runs operations in the order of these lines on every host: slurmdbd and
    # the controllers are upgraded before any worker.
    if upgrading and control:
        server.shell(
            name=f"Upgrade {what} (slurmdbd and controllers first)",
            commands=[f"{INSTALLER} upgrade"],
            **net,
        )
    if upgrading and not control:
        server.shell(
            name=f"Upgrade {what} (drain, upgrade, resume; a batch at a time)",
            commands=[f"{INSTALLER} upgrade"],
            _parallel=int(v["slurm_upgrade_batch_size"]),
            **net,
        )
    if not upgrading and missing:
        server.shell(
            name=f"Install Slurm {v['slurm_version'] or ''}".rstrip(),
            commands=[f"{INSTALLER} install"],
            **net,
        )
    if not upgrading and not missing:
        host.noop(f"Slurm {installed} installed")
    if v["slurm_is_dbd"]:
        pkgs = v["slurm_mariadb_packages"]
        if family == "Debian":
            apt.packages(name="Install MariaDB for slurmdbd", packages=pkgs, **net)
        else:
            dnf.packages(name="Install MariaDB for slurmdbd", packages=pkgs, **net)
    return upgrading


def _munge(cluster: Cluster, v: dict[str, Any]):
    try:
        secret = read_secret(
            {v["slurm_munge_key_name"]: v["slurm_munge_key_ref"]},
            v["slurm_munge_key_name"],
            generate_bytes=int(v["slurm_munge_key_bytes"]),
        )
    except SecretError as exc:
        raise SystemExit(f"aicluster: {exc}") from None
    key = files.put(
        name="munge key (the cluster's one key)",
        src=BytesIO(secret),
        dest=MUNGE_KEY,
        user="munge",
        group="munge",
        mode="400",
    )
    systemd.service(name="Restart munge (new key)", service="munge", restarted=True,
                    _if=key.did_change)
    systemd.service(name="munge running and enabled", service="munge", running=True,
                    enabled=True)
    return key


def _config(v: dict[str, Any]) -> dict[str, Any]:
    for path in ("/var/log/slurm", "/var/lib/slurm"):
        files.directory(name=f"Slurm directory {path}", path=path, user="slurm",
                        group="slurm", mode="755")
    if v["slurm_is_controller"]:
        files.directory(name="slurmctld state directory", path="/var/lib/slurm/slurmctld",
                        user="slurm", group="slurm", mode="755")
    if v["slurm_is_worker"]:
        files.directory(name="slurmd spool directory", path="/var/lib/slurm/slurmd",
                        user="root", group="root", mode="755")
    files.directory(name="Slurm configuration directory", path=CONF_DIR)
    new = _render_conf(v)
    old = host.get_fact(SlurmConf) or ""
    restart = restart_needed(old, new, v["slurm_restart_keys"])
    conf = put_template("slurm", "slurm.conf.j2", SLURM_CONF, v, name="Write slurm.conf")
    gres = put_template("slurm", "gres.conf.j2", GRES_CONF, v, name="Write gres.conf")
    cgroup = put_template("slurm", "cgroup.conf.j2", CGROUP_CONF, v, name="Write cgroup.conf")
    dbd = None
    if v["slurm_is_dbd"]:
        dbd = put_template("slurm", "slurmdbd.conf.j2", DBD_CONF, v, name="Write slurmdbd.conf",
                           user="slurm", group="slurm", mode="600")
    return {"conf": conf, "gres": gres, "cgroup": cgroup, "dbd": dbd, "restart": restart}


def _daemons(v: dict[str, Any], confs: dict[str, Any], upgrading: bool) -> None:
    conf, gres, cgroup = confs["conf"], confs["gres"], confs["cgroup"]
    restart = confs["restart"]
    if v["slurm_is_dbd"]:
        service = v["slurm_mariadb_service"]
        systemd.service(name="MariaDB running and enabled", service=service, running=True,
                        enabled=True)
        if host.get_fact(MariadbUser, database=v["slurm_dbd_database"]):
            host.noop("slurmdbd's database and user exist")
        else:
            database = v["slurm_dbd_database"]
            server.shell(
                name="slurmdbd's database, and its user (unix socket login, no password)",
                commands=[
                    "mysql -e \"CREATE DATABASE IF NOT EXISTS " + database + "; "
                    "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED VIA unix_socket; "
                    "GRANT ALL ON " + database + ".* TO 'slurm'@'localhost';\""
                ],
            )
        systemd.service(name="Restart slurmdbd (configuration or key changed)",
                        service="slurmdbd", restarted=True, _if=confs["dbd"].did_change)
        systemd.service(name="slurmdbd running and enabled", service="slurmdbd", running=True,
                        enabled=True)
    if v["slurm_is_controller"]:
        systemd.service(
            name="Restart slurmctld (a change reconfigure cannot apply)",
            service="slurmctld",
            restarted=True,
            _if=(lambda: restart and conf.did_change()),
        )
        systemd.service(name="slurmctld running and enabled", service="slurmctld",
                        running=True, enabled=True)
    elif host.get_fact(UnitLoaded, unit="slurmctld.service"):
        # Debian's packages enable slurmctld wherever they are installed.
        systemd.service(name="No slurmctld on this node", service="slurmctld",
                        running=False, enabled=False)
    if v["slurm_is_worker"]:
        systemd.service(
            name="Restart slurmd (a change reconfigure cannot apply)",
            service="slurmd",
            restarted=True,
            _if=(
                lambda: gres.did_change() or cgroup.did_change() or (restart and conf.did_change())
            ),
        )
        systemd.service(name="slurmd running and enabled", service="slurmd", running=True,
                        enabled=True)
    if v["slurm_is_primary_controller"]:
        server.shell(
            name="scontrol reconfigure (slurm.conf changed; running jobs keep running)",
            commands=["scontrol reconfigure"],
            _if=(lambda: conf.did_change() and not restart and not upgrading),
        )
    if not v["slurm_is_controller"] and not v["slurm_is_worker"]:
        host.noop("no Slurm daemon here besides slurmdbd")
