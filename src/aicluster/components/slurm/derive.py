"""The slurm component's values computed from the inventory, its checks of the inventory and
its decisions: engine-free (no pyinfra), used by the pyinfra deploy and the Ansible role.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import hostlist

from aicluster.common.absence import keep_one
from aicluster.common.settings import config_text, layered, merge_config, setting
from aicluster.common.versions import version_matches
from aicluster.components.slurm.probe import (
    CGROUP_COMMAND,
    NVIDIA_COMMAND,
    NVML_COMMAND,
    parse_nvml,
)
from aicluster.inventory import Cluster
from aicluster.secrets import secret_ref as _secret_ref

CONF_DIR = "/etc/slurm"
SLURM_CONF = f"{CONF_DIR}/slurm.conf"
GRES_CONF = f"{CONF_DIR}/gres.conf"
CGROUP_CONF = f"{CONF_DIR}/cgroup.conf"
DBD_CONF = f"{CONF_DIR}/slurmdbd.conf"
MUNGE_KEY = "/etc/munge/munge.key"
APT_PIN = "/etc/apt/preferences.d/aicluster-slurm"
INSTALLER = "/usr/local/sbin/aicluster-slurm-install"

#: Keys computed from the inventory: slurm_config may not set them.
DERIVED_KEYS = (
    "ClusterName",
    "SlurmctldHost",
    "NodeName",
    "PartitionName",
    "AccountingStorageType",
    "AccountingStorageHost",
    "AccountingStoragePort",
)
#: The plugins chosen by whether the nodes can write their cgroups.
PLUGINS = {
    True: {
        "ProctrackType": "proctrack/cgroup",
        "TaskPlugin": "task/cgroup,task/affinity",
        "JobAcctGatherType": "jobacct_gather/cgroup",
    },
    False: {
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/linux",
    },
}


# ---------------------------------------------------------------------------
# Values computed from the whole inventory (both engines use these)
# ---------------------------------------------------------------------------


def gres_count(cluster: Cluster, name: str, data: Mapping[str, Any]) -> int:
    wanted = setting("slurm", data, "slurm_gres_gpus")
    return cluster.hosts[name].spec.hardware.gpus.count if wanted is None else int(wanted)


def node_lines(cluster: Cluster) -> list[list[str]]:
    """NodeName lines: the workers grouped by identical hardware, as hostlist ranges."""
    groups: dict[tuple[str, int, int], list[str]] = {}
    for name in cluster.group("slurm_workers"):
        h = cluster.hosts[name]
        hw = h.spec.hardware
        percent = int(setting("slurm", h.data, "slurm_memory_percent"))
        memory = int(hw.memory_gb * 1024 * percent / 100)
        cpus = f"CPUs={hw.cpus}"
        if hw.sockets is not None:  # the CPU layout (lscpu), when the inventory gives it
            cpus += (f" Sockets={hw.sockets} CoresPerSocket={hw.cores_per_socket} "
                     f"ThreadsPerCore={hw.threads_per_core}")
        groups.setdefault((cpus, memory, gres_count(cluster, name, h.data)), []).append(name)
    lines = []
    for (cpus, memory, gpus), names in groups.items():
        text = f"{hostlist.collect_hostlist(names)} {cpus} RealMemory={memory}"
        if gpus:
            text += f" Gres=gpu:{gpus}"
        lines.append(["NodeName", f"{text} State=UNKNOWN"])
    return lines


def partition_lines(cluster: Cluster, v: Mapping[str, Any]) -> list[list[str]]:
    workers = list(cluster.group("slurm_workers"))
    if not workers:
        return []
    options = " ".join(
        f"{k}={config_text(o)}" for k, o in (v["slurm_partition_options"] or {}).items())
    options = f" {options}" if options else ""
    lines = []
    if v["slurm_partition_name"]:
        nodes = hostlist.collect_hostlist(workers)
        lines.append(
            ["PartitionName", f"{v['slurm_partition_name']} Nodes={nodes} Default=YES{options}"]
        )
    gpus = [w for w in workers if gres_count(cluster, w, cluster.hosts[w].data) > 0]
    if gpus and v["slurm_gpu_partition_name"]:
        nodes = hostlist.collect_hostlist(gpus)
        default = "NO" if v["slurm_partition_name"] else "YES"
        lines.append(
            ["PartitionName", f"{v['slurm_gpu_partition_name']} Nodes={nodes} "
             f"Default={default}{options}"]
        )
    return lines


def slurm_conf(cluster: Cluster, data: Mapping[str, Any], cgroup: bool) -> list[list[str]]:
    """slurm.conf as [key, value] pairs, in order (keys may repeat)."""
    v = layered("slurm", data)
    config = merge_config(v["slurm_default_config"], v["slurm_config"])
    pairs: list[list[str]] = [["ClusterName", cluster.spec.cluster_name]]
    for name in cluster.group("slurm_controller"):
        pairs.append(["SlurmctldHost", f"{name}({cluster.hosts[name].address})"])
    dbd = cluster.group("slurm_dbd")
    if dbd:
        pairs += [
            ["AccountingStorageType", "accounting_storage/slurmdbd"],
            ["AccountingStorageHost", dbd[0]],
            ["AccountingStoragePort", config_text(v["slurm_dbd_port"])],
        ]
    for key, value in config.items():
        pairs.append([key, config_text(value)])
    user = v["slurm_config"] or {}
    for key, value in PLUGINS[cgroup].items():
        if key not in user and key not in (v["slurm_default_config"] or {}):
            pairs.append([key, value])
    return pairs + node_lines(cluster) + partition_lines(cluster, v)


def dbd_settings(cluster: Cluster, data: Mapping[str, Any]) -> list[list[str]]:
    v = layered("slurm", data)
    dbd = cluster.group("slurm_dbd")
    return [
        ["AuthType", "auth/munge"],
        ["DbdHost", dbd[0] if dbd else "localhost"],
        ["DbdPort", config_text(v["slurm_dbd_port"])],
        ["SlurmUser", "slurm"],
        ["LogFile", "/var/log/slurm/slurmdbd.log"],
        ["PidFile", "/run/slurmdbd.pid"],
        ["StorageType", "accounting_storage/mysql"],
        ["StorageHost", "localhost"],
        ["StorageUser", "slurm"],
        ["StorageLoc", config_text(v["slurm_dbd_database"])],
    ]


def derived_vars(cluster: Cluster, host_name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    v = layered("slurm", data)
    controllers = list(cluster.group("slurm_controller"))
    count = gres_count(cluster, host_name, data)
    pattern = str(v["slurm_gpu_device_pattern"])
    choice = v["slurm_cgroup_plugins"]
    autodetect = v["slurm_gres_autodetect"]
    return {
        "slurm_conf": {
            "cgroup": slurm_conf(cluster, data, True),
            "nocgroup": slurm_conf(cluster, data, False),
        },
        # The deploys replace these two with what they read on the nodes when the
        # inventory leaves them to detection (null).
        "slurm_cgroup_enabled": True if choice is None else bool(choice),
        "slurm_gres_autodetect_enabled": False if autodetect is None else bool(autodetect),
        "slurm_cgroup_settings": [
            [k, config_text(x)]
            for k, x in merge_config(v["slurm_default_cgroup_config"],
                                     v["slurm_cgroup_config"]).items()
        ],
        "slurm_dbd_settings": dbd_settings(cluster, data),
        "slurm_gres_count": count,
        "slurm_gres_devices": [pattern.replace("{index}", str(i)) for i in range(count)],
        "slurm_is_controller": host_name in controllers,
        "slurm_is_primary_controller": bool(controllers) and host_name == controllers[0],
        "slurm_is_worker": host_name in cluster.group("slurm_workers"),
        "slurm_is_dbd": host_name in cluster.group("slurm_dbd"),
        "slurm_primary_controller": controllers[0] if controllers else "",
        "slurm_cluster_hosts": sorted(
            {*controllers, *cluster.group("slurm_workers"), *cluster.group("slurm_dbd")}
        ),
        # What the Ansible role runs to read the nodes (the pyinfra facts' commands).
        "slurm_probe_commands": {"cgroup": CGROUP_COMMAND, "nvidia": NVIDIA_COMMAND,
                                 "nvml": NVML_COMMAND},
        # Where the munge key is (a reference, never the key).
        "slurm_munge_key_ref": munge_key_ref(cluster, data),
    }


def gres_autodetect(choice: bool | None, gpus: int, driver: bool,
                    nvml: Mapping[str, Any] | None, slurm_version: str = "") -> tuple[bool, str]:
    """Whether gres.conf says ``AutoDetect=nvml`` (True) or names each GPU's device
    (False), and why not when the node's NVIDIA driver is loaded ("" otherwise).

    ``choice`` is ``slurm_gres_autodetect`` (True/False decide; None detects), ``gpus``
    the node's GRES count (none: nothing to detect), ``driver`` whether the NVIDIA driver
    is loaded, ``nvml`` what :func:`aicluster.components.slurm.probe.parse_nvml` read,
    ``slurm_version`` the pinned version. NVML autodetection needs
    Slurm's gpu/nvml plugin (``gpu_nvml.so``), which Debian and Ubuntu ship apart from
    slurmd (``slurm-wlm-nvml-plugin``, built against one Slurm version) and EPEL not at
    all. Without it, or with a plugin from another version than the installed slurmd, or
    with a slurmd this run upgrades, slurmd would find no GPU and Slurm would mark the node
    INVAL ("gres/gpu count reported lower than configured"): the explicit lines are
    written instead."""
    if choice is not None:
        return bool(choice), ""
    if not gpus or not driver:
        return False, ""
    nvml = nvml or {}
    plugin, package, version = nvml.get("plugin"), nvml.get("package"), nvml.get("version")
    slurmd = nvml.get("slurmd")
    lead = "the NVIDIA driver is loaded, but "
    if not plugin:
        return False, (lead + "Slurm's NVML plugin (gpu_nvml.so) is not installed: "
                       "gres.conf names each GPU (Name=gpu File=)")
    if not package or not version:
        return False, (lead + f"{plugin} belongs to no package, so its Slurm version is "
                       "unknown: gres.conf names each GPU (set slurm_gres_autodetect: true "
                       "if it was built for this slurmd)")
    if not slurmd:
        return False, (lead + "slurmd is not installed yet: gres.conf names each GPU "
                       "(NVML is checked again on the next run)")
    if version != slurmd:
        return False, (lead + f"Slurm's NVML plugin ({package} {version}) is not slurmd's "
                       f"version ({slurmd}): gres.conf names each GPU (Name=gpu File=)")
    if not version_matches(slurmd, slurm_version):
        return False, (lead + f"slurmd {slurmd} is upgraded to {slurm_version} in this run: "
                       "gres.conf names each GPU (NVML is checked again on the next run)")
    return True, ""


def gres_autodetect_probed(choice: bool | None, gpus: int, nvidia_output: str,
                           nvml_lines: Iterable[str], slurm_version: str = "") -> dict[str, Any]:
    """:func:`gres_autodetect` from the probes' raw output (what the Ansible role
    registers): ``{"enabled": bool, "why": str}``. A choice Ansible passes as text reads
    as its ``bool`` filter does."""
    if isinstance(choice, str):
        text = choice.strip().lower()
        choice = None if text in ("", "none", "null") else text in ("true", "yes", "on", "1")
    enabled, why = gres_autodetect(choice, int(gpus or 0), str(nvidia_output).strip() == "yes",
                                   parse_nvml(list(nvml_lines or [])), slurm_version or "")
    return {"enabled": enabled, "why": why}


def munge_key_ref(cluster: Cluster, data: Mapping[str, Any]) -> dict[str, str]:
    """Where the munge key is: the inventory's secret, else a file on the deploying
    machine, ``~/.local/share/aicluster/<cluster_name>/munge.key`` (made once)."""
    return _secret_ref(cluster, layered("slurm", data)["slurm_munge_key_name"], "munge.key")


def node_packages(v: Mapping[str, Any]) -> list[str]:
    """The Slurm packages of this node's roles (OS vars and derived values in ``v``)."""
    out = list(v["slurm_common_packages"])
    if v["slurm_is_controller"]:
        out += v["slurm_controller_packages"]
    if v["slurm_is_worker"]:
        out += v["slurm_worker_packages"]
    if v["slurm_is_dbd"]:
        out += v["slurm_dbd_packages"]
    return out



def _pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            out.append((key.strip(), value.strip()))
    return out


def restart_needed(old: str, new: str, keys: Iterable[str]) -> bool:
    """Whether going from slurm.conf ``old`` to ``new`` needs the daemons restarted
    (a key of ``keys`` or the node list changed) or ``scontrol reconfigure`` suffices.
    No old file (first deploy) counts as a restart: the daemons start anyway."""
    if not (old or "").strip():
        return True
    keys = set(keys) | {"NodeName"}
    before = [p for p in _pairs(old) if p[0] in keys]
    after = [p for p in _pairs(new) if p[0] in keys]
    return sorted(before) != sorted(after)


def validate(cluster: Cluster) -> list[str]:
    """slurm's own checks of the inventory (host and field named)."""
    errors = []
    slurm_hosts = {
        *cluster.group("slurm_controller"),
        *cluster.group("slurm_workers"),
        *cluster.group("slurm_dbd"),
    }
    if len(cluster.group("slurm_dbd")) > 1:
        errors.append(
            f"host {cluster.group('slurm_dbd')[1]!r}: groups: slurm_dbd allows at most 1 "
            f"host; the inventory has {len(cluster.group('slurm_dbd'))}"
        )
    if slurm_hosts and not cluster.group("slurm_controller"):
        first = sorted(slurm_hosts)[0]
        errors.append(f"host {first!r}: groups: Slurm needs a slurm_controller host")
    for name in sorted(slurm_hosts, key=list(cluster.hosts).index):
        h = cluster.hosts[name]
        v = layered("slurm", h.data)
        where = f"host {name!r}"
        gpus = h.spec.hardware.gpus.count
        wanted = v["slurm_gres_gpus"]  # a count >= 0 or None (the model)
        if wanted is not None and wanted > gpus:
            errors.append(
                f"{where}: slurm_gres_gpus: {wanted} GPUs as GRES, but "
                f"hardware.gpus.count is {gpus}"
            )
        for key in sorted(set(v["slurm_config"] or {}) & set(DERIVED_KEYS)):
            errors.append(
                f"{where}: slurm_config.{key}: computed from the inventory; "
                "set the groups or hardware instead"
            )
    return errors


# ---------------------------------------------------------------------------
# The pyinfra deploy
# ---------------------------------------------------------------------------



def _render_conf(v: Mapping[str, Any]) -> str:
    from aicluster.render import render

    return render("slurm", "slurm.conf.j2", v)


#: What a deploy takes off a host the inventory no longer gives a Slurm role (by role, and
#: the component's own key when the host loses it altogether): services stopped and
#: disabled, configuration files the deploy wrote removed, services reloaded afterwards
#: (aicluster.common.absence). Data stays (/var/lib/slurm, /var/log/slurm; MariaDB and
#: its databases); the packages too, unless the inventory's remove_packages names slurm
#: (then the Slurm and munge packages go; MariaDB stays).
REMOVAL = {
    "slurm_workers": {"services": ["slurmd"], "packages": ["slurm_worker_packages"]},
    "slurm_controller": {"services": ["slurmctld"], "packages": ["slurm_controller_packages"]},
    "slurm_dbd": {"services": ["slurmdbd"], "files": [DBD_CONF],
                  "packages": ["slurm_dbd_packages"]},
    "slurm": {"services": ["slurmd", "slurmctld", "munge"],
              "files": [SLURM_CONF, GRES_CONF, CGROUP_CONF, MUNGE_KEY, APT_PIN, INSTALLER],
              "packages": ["slurm_worker_packages", "slurm_controller_packages",
                           "slurm_dbd_packages", "slurm_common_packages",
                           "slurm_munge_packages"]},
}


def removal_refusals(recorded, wanted) -> list[str]:
    """The last Slurm controller is not taken away while Slurm stays on other hosts:
    slurmctld's state (/var/lib/slurm/slurmctld) is on it."""
    return keep_one(recorded, wanted, "slurm", "slurm_controller", "the Slurm controller")
