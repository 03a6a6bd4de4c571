"""What a node holds of MinIO, read with one shell for both engines.

:func:`command_text` prints ``key=value`` lines:

* ``minio=SHA256`` and ``mc=SHA256``: the installed binaries (empty: none);
* ``active=``, ``enabled=``: what systemd says of minio.service;
* ``exe=PATH``: the executable the running server was started from (the release file
  the ``minio`` link named then; ``... (deleted)`` when it is gone);
* ``release=PATH``: each release file ``<binary>.RELEASE.<version>`` on the node;
* ``dir=PATH root|other``: for each directory drive, whether it is on the file system
  of ``/`` (MinIO refuses such a drive when the cluster has more than one);
* with buckets asked (the first MinIO host, while the server runs): ``mc-rc=N`` (the
  exit status of listing the buckets), ``bucket=JSON`` per bucket (``mc ls --json``),
  ``anonymous=NAME JSON`` and ``versioning=NAME JSON`` per bucket the inventory names
  (mc's "private", a bucket without a policy, is read as the inventory's "none").

Nothing secret is printed: mc gets the root credentials from /etc/default/minio
through aicluster-minio-mc, in its environment only.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from aicluster.components.minio.probe import command_text, parse


class MinioState(FactBase):
    """MinIO on a node, as :func:`parse` describes it."""

    def default(self) -> dict:
        return parse([])

    def command(self, binary: str, mc_binary: str, directories: list[str] | None = None,
                buckets: list[str] | None = None, timeout: int = 20) -> str:
        return command_text(binary, mc_binary, directories or (), buckets, timeout)

    def process(self, output) -> dict:
        return parse(output)
