"""What a node knows of its Ceph cluster, read with one command for both engines.

:func:`command_text` is a small Python program run with the node's ``python3`` (every
node has one: pyinfra and Ansible need it). It prints one JSON object:

* ``mon``: this host's monitor exists (``/var/lib/ceph/mon/ceph-HOST/keyring``);
* ``osds``: per OSD device the inventory names, the OSD ceph-volume finds on it
  (``ceph_fsid``, ``osd_id``, ``osd_uuid``) or none, and whether that OSD is running;
* ``release``: the installed ceph-common's version (dpkg, rpm; else ``ceph --version``),
  the version the package manager would install from its local index (apt-cache
  policy's Candidate, ``dnf --cacheonly repoquery``), and why an installed Ceph's
  version could not be read, if it could not;
* with ``cluster`` (asked on the first monitor only): ``cluster.reachable``, the auth
  entities (each key as a sha256 digest, never the key), the CRUSH rules' names, the
  pools (size, min_size, CRUSH rule by name, applications), the CephFS file systems,
  the manager's modules (``mgr_modules``: enabled and always on, from ``ceph mgr module
  ls``) and the prometheus module's options of the ``mgr`` section (``mgr_config``: name
  to value, as the monitors store them: ``ceph config-key dump
  config/mgr/mgr/prometheus/``; no other module's, which may hold passwords), read with
  the admin keyring (either null when unreadable);
* ``mounted``: what is mounted at the CephFS mount point (a client), or null;
* ``targets``: whether each of Ceph's systemd targets the host needs is enabled.

Nothing secret is printed: keys are hashed on the node before anything is printed.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from aicluster.components.ceph.probe import command_text, parse


class CephState(FactBase):
    """This host's monitor, its OSD devices' OSDs, the cluster as the first monitor
    sees it, and its CephFS mount (see the module's text)."""

    def default(self) -> dict:
        return {"mon": False, "osds": {}, "mounted": None, "cluster": None}

    def requires_command(self, *args, **kwargs) -> str:
        return "python3"

    def command(self, request: str) -> str:
        return command_text(request)

    def process(self, output) -> dict:
        return parse(output)
