"""ceph: a Ceph cluster at one pinned release, bootstrapped by hand.

Packages: ``ceph_release`` from Ceph's own repository (``ceph_source: ceph_repo``: its
key, an apt source with signed-by and an apt pin, or a dnf .repo) or from the
distribution. Before anything changes on a host, :func:`decide` refuses one whose
installed Ceph (or, from the distribution, the Ceph it would get) is another release,
or whose system Ceph's repository does not build the release for.

Monitors (``ceph_mons``) are made from a generated monmap with managers beside them;
OSDs (``ceph_osds``) on the devices each host's ``ceph_osd_devices`` names, with
``ceph-volume`` (``raw`` mode, which needs no device-mapper, or ``lvm``); pools from
``ceph_pools``; CephFS with an MDS on ``ceph_mds`` hosts; clients (``ceph_clients``)
get ceph.conf, a restricted keyring and CephFS mounted.

Defaults: roles/ceph/defaults/main.yml. Templates: roles/ceph/templates/.

Secrets. The cluster's fsid and every cephx key (the monitors', client.admin's,
client.bootstrap-osd's, each manager's and MDS's, the clients') are derived from ONE
random secret generated once on the deploying machine (``secrets.ceph`` in the
inventory, else ``~/.local/share/aicluster/<cluster_name>/ceph.secret``, mode 0600),
as the munge key is: both engines compute the same keys with no state on the nodes,
and no key is ever printed (keyrings are written mode 0600, owned by ceph).

No data is lost: a device becomes an OSD only when the disk-safety rule allows it
(:func:`aicluster.common.disks.check_devices`); a device already holding an OSD of
THIS cluster (its bluestore label names our fsid, read with ``ceph-volume ... list``)
is ours and left as it is. A host whose devices hold anything else is stopped before
any operation runs on it. The Ansible role reaches the same decision (:func:`decide`)
through its filter plugin.

Order. Cluster-wide commands (``ceph auth import``, pools, ``ceph fs new``) run on the
first monitor. pyinfra runs each operation on every host before the next one, as
Ansible's linear strategy runs each task, so the operations are written in the order
the cluster needs them: monitors, then keys, managers and MDS daemons, then OSDs, then
pools and CephFS, then the managers' modules (``prometheus``, each manager bound to its
host's address on the public network), then client mounts.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from io import BytesIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from aicluster.common.facts import BlockDevices
from aicluster.common.mounts import FSTAB, fstab_regexp
from aicluster.common.ops import (
    enable_crb_for,
    install_packages,
    put_template,
    refuse,
    runs_here,
    this_host,
)
from aicluster.common.settings import NETWORK_ARGS
from aicluster.components.ceph.derive import (
    CONF,
    OSD_DEVICES_FILE,
    OSD_TOOL,
    OSD_UNIT,
    cluster_key_commands,
    decide,
    mgr_commands,
    mon_mkfs_command,
    osd_wipe_command,
    packages,
    pool_commands,
    release_packages,
    repo_suite,
    secrets,
)
from aicluster.components.ceph.facts import CephState
from aicluster.render import defaults
from aicluster.secrets import SecretError


@deploy("ceph", data_defaults=defaults("ceph"))
def deploy() -> None:
    if not runs_here("ceph"):
        return
    cluster, family, v = this_host("ceph")
    distribution = host.get_fact(LinuxDistribution)
    r = v["ceph_roles"]
    try:
        keys = secrets(v["ceph_keys_ref"], v["ceph_keys_name"], v["ceph_keys_bytes"],
                       v["ceph_fsid_setting"], v["ceph_entities"],
                       host.name, r, v["ceph_client_name"])
    except SecretError as exc:
        refuse([f"host {host.name!r}: ceph: {exc}"])
        return
    v["ceph_fsid"] = keys["fsid"]
    block = host.get_fact(BlockDevices, devices=v["ceph_osd_device_list"], paths=[]) \
        if v["ceph_osd_device_list"] else {"lsblk": [], "devices": {}, "mounts": {}}
    state = host.get_fact(CephState, request=v["ceph_fact_request"])
    meta = (distribution or {}).get("release_meta") or {}
    suite = repo_suite(family, str(meta.get("ID", "")), str(meta.get("VERSION_ID", "")),
                       str(meta.get("VERSION_CODENAME", "")))
    decided = decide(block, state, v["ceph_request"], keys["fsid"], keys["digests"], suite)
    if decided["problems"]:
        refuse(decided["problems"])
        return
    v["ceph_repo_suite"] = decided["repo_suite"]

    before = release_packages(v)
    if before:
        enable_crb_for(before, family)
        install_packages(f"Before Ceph: {', '.join(before)}", before, family)
    _repository(v, family)
    install = install_packages("Install Ceph", packages(v, distribution), family)
    # Installed or changed: the installed Ceph is the pinned release.
    server.shell(name=f"Check the installed Ceph is {v['ceph_release']} "
                 f"({v['ceph_release_major']})",
                 commands=[v["ceph_release_check_command"]], _if=install.did_change)
    files.directory(name="Ceph's configuration directory", path="/etc/ceph")
    # A changed ceph.conf restarts nothing: the daemons take the monitor map from the
    # monitors, and read other settings when they are next restarted, one at a time
    # (docs/components/ceph.md).
    put_template("ceph", "ceph.conf.j2", CONF, v, name="ceph.conf")
    for path, text in host.loop(keys["keyrings"].items()):
        parent = path.rsplit("/", 1)[0]
        if parent != "/etc/ceph":
            files.directory(name=f"{parent} (owned by ceph)", path=parent, user="ceph",
                            group="ceph", mode="750")
        files.put(name=f"Keyring {path} (mode 0600, never shown)", src=BytesIO(text.encode()),
                  dest=path, user="ceph", group="ceph", mode="600", create_remote_dir=False)

    # pyinfra orders operations as a graph of each host's own sequence. The three
    # cluster-wide steps below are each ONE operation called on every Ceph host (with
    # commands on the first monitor only), so everything any host does before such a
    # step comes before it, and everything after it after it: monitors before keys,
    # keys before OSDs, OSDs before pools, CephFS before client mounts.
    first = r["first_mon"]

    # Monitors: made once from a generated monmap, then running (quorum forms when the
    # ceph_mons hosts, made together, start together).
    if r["mon"]:
        if decided["mon_mkfs"]:
            server.shell(name="Make this host's monitor (monmap, ceph-mon --mkfs)",
                         commands=[mon_mkfs_command(keys["fsid"], host.name,
                                                    v["ceph_mon_addrs"], v["ceph_msgr2"])])
        systemd.service(name=f"ceph-mon@{host.name} running and enabled",
                        service=f"ceph-mon@{host.name}", running=True, enabled=True)
    server.shell(
        name="Monitors in quorum, the cluster's keys registered (first monitor)",
        commands=cluster_key_commands(v, decided) if first else [],
    )
    if r["mon"]:
        systemd.service(name=f"ceph-mgr@{host.name} running and enabled",
                        service=f"ceph-mgr@{host.name}", running=True, enabled=True)
    if r["mds"]:
        systemd.service(name=f"ceph-mds@{host.name} running and enabled",
                        service=f"ceph-mds@{host.name}", running=True, enabled=True)
    if r["osd"]:
        _osds(v, decided)
    if decided["targets_enable"]:
        server.shell(name="Ceph's systemd targets enabled (daemons start at boot)",
                     commands=[f"systemctl enable {' '.join(decided['targets_enable'])}"])

    # Pools and CephFS, on the first monitor, once every host's OSDs exist.
    server.shell(name="Pools (ceph_pools and CephFS's; first monitor)",
                 commands=pool_commands(decided, v["ceph_command_timeout"]) if first else [])
    server.shell(name="CephFS (ceph fs new, an MDS active; first monitor)",
                 commands=v["ceph_fs_commands"] if first and decided["fs_create"] else [])
    # The managers' prometheus module, each manager on its own address on the public
    # network (ceph_mgr_prometheus), where the cluster lacks it or has it otherwise.
    server.shell(name="Manager modules and their options (prometheus; first monitor)",
                 commands=mgr_commands(decided, v["ceph_command_timeout"]) if first else [])
    if v["ceph_cephfs_mount_path"]:
        _mount(v, decided)


def _repository(v: dict[str, Any], family: str) -> None:
    """Ceph's own repository (ceph_source ceph_repo): its key, the apt source naming it
    and the apt pin (Debian, Ubuntu), or the dnf .repo (EL9); the apt index read again
    when any of them changed. With ceph_source distribution, none of them."""
    files_made = [v["ceph_repo_file"], v["ceph_repo_keyring"], v["ceph_repo_pin_file"]]
    if v["ceph_source"] != "ceph_repo":
        for path in host.loop([f for f in files_made if f]):
            files.file(name=f"No {path} (ceph_source distribution)", path=path, present=False)
        return
    changed = []
    if family == "Debian":
        files.directory(name="apt keyrings directory", path="/etc/apt/keyrings", mode="755")
        changed.append(files.download(
            name="Ceph repository key",
            src=f"{v['ceph_repo_base']}/{v['ceph_repo_key']}",
            dest=v["ceph_repo_keyring"],
            mode="644",
            **NETWORK_ARGS,
        ))
        changed.append(put_template(
            "ceph", "aicluster-ceph.pref.j2", v["ceph_repo_pin_file"], v,
            name=f"Pin Ceph's packages to Ceph's repository ({v['ceph_repo_origin']})"))
    changed.append(put_template(
        "ceph", v["ceph_repo_template"], v["ceph_repo_file"], v,
        name=f"Ceph repository ({v['ceph_release']}, {v['ceph_repo_suite']})"))
    if family == "Debian":
        apt.update(name="Read Ceph's repository's index (it was just added or changed)",
                   _if=any_changed(*changed), **NETWORK_ARGS)


def _osds(v: dict[str, Any], decided: Mapping[str, Any]) -> None:
    put_template("ceph", "aicluster-ceph-osd.j2", OSD_TOOL, v,
                 name="The OSD tool (create and activate OSDs)", mode="755")
    put_template("ceph", "aicluster-osd-devices.j2", OSD_DEVICES_FILE, v,
                 name="This host's OSD devices")
    unit = put_template("ceph", "aicluster-ceph-osds.service.j2", f"/etc/systemd/system/{OSD_UNIT}",
                        v, name="Start the OSDs at boot (unit)")
    systemd.daemon_reload(name="Reload systemd units (OSD unit changed)", _if=unit.did_change)
    for device in host.loop(decided["osd_wipe"]):
        server.shell(name=f"Wipe {device} (wipe: true in the inventory)",
                     commands=[osd_wipe_command(device)])
    for device in host.loop(decided["osd_create"]):
        server.shell(name=f"Make an OSD on {device} (ceph-volume {v['ceph_osd_mode']})",
                     commands=[f"{OSD_TOOL} create {shlex.quote(device)}"])
    for device in host.loop(decided["osd_activate"]):
        server.shell(name=f"Start the OSD on {device}",
                     commands=[f"{OSD_TOOL} activate {shlex.quote(device)}"])
    # Enabled (and so started: it activates every listed device) once the OSDs exist.
    systemd.service(name=f"{OSD_UNIT} enabled", service=OSD_UNIT, running=True, enabled=True)



def _mount(v: dict[str, Any], decided: Mapping[str, Any]) -> None:
    path = v["ceph_cephfs_mount_path"]
    fstab = files.line(
        name=f"Mount CephFS at {path} at boot (fstab, _netdev, nofail)",
        path=FSTAB,
        line=fstab_regexp(path),
        replace=v["ceph_fstab_line"],
        extended_regex=True,
    )
    systemd.daemon_reload(name="Reload systemd units (fstab changed)", _if=fstab.did_change)
    if decided["remount"]:
        # The mount point is a directory under the dead mount (which no stat can read).
        server.shell(name=f"Unmount the dead CephFS at {path} (mounted but it answers "
                     "nothing: the MDS evicted this client; mounted again below)",
                     commands=[f"umount -l {shlex.quote(path)}"])
    else:
        files.directory(name=f"Mount point {path}", path=path)
    if decided["mount"]:
        server.shell(name=f"Mount CephFS at {path}", commands=[v["ceph_mount_command"]])
