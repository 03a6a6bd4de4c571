"""Where the results of an ``aicluster check`` run go for Prometheus: the textfile
(:func:`aicluster.checks.report.prometheus`) written on this machine (``--prometheus
FILE``, e.g. on a node with ``--local``) or on every monitoring host (``--publish``:
``aicluster_check.prom`` in the host's ``monitoring_textfile_dir``, over the SSH
transport the probes use, the text fed to ``cat`` on the host's standard input).

Either way the file is written whole: into a temporary file in the same directory
whose name the node exporter's textfile collector does not read (it reads ``*.prom``),
made readable by the exporter (0644, whatever the umask), then renamed over the last
one, so that the collector never reads half a file.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path

from aicluster.checks.runner import Completed, TimedOut
from aicluster.components.monitoring.derive import CHECK_TEXTFILE, check_textfiles
from aicluster.inventory import Cluster

#: Seconds one monitoring host gets to take the file.
LIMIT = 30.0


class PublishError(Exception):
    """The results cannot be published as asked (said before any probe runs)."""


def targets(cluster: Cluster) -> dict[str, str]:
    """Each monitoring host and the path its results go to; :class:`PublishError` when
    the inventory has none."""
    found = check_textfiles(cluster)
    if not found:
        raise PublishError(
            "--publish: the inventory has no monitoring host (the monitoring group is "
            f"empty), so there is no node exporter to read {CHECK_TEXTFILE}; add a host to "
            "the monitoring group and deploy it, or write the file yourself with "
            "--prometheus FILE")
    return found


def write_command(path: str) -> str:
    """The shell command that writes its standard input to ``path`` whole (a temporary
    file beside it, 0644, renamed over it)."""
    directory, name = path.rsplit("/", 1)
    temp = shlex.quote(f"{directory or '/'}/.{name}.XXXXXX")
    return (f't=$(mktemp {temp}) || exit 1; trap \'rm -f "$t"\' EXIT; '
            f'cat > "$t" && chmod 0644 "$t" && mv -f "$t" {shlex.quote(path)}')


def publish(where: dict[str, str], text: str,
            transport: Callable[..., Completed]) -> list[str]:
    """Write ``text`` to each host's path (``where``, from :func:`targets`) through
    ``transport`` (``transport(host, command, limit, stdin=text)``); what went wrong, one
    line per host that did not take it (empty: every host has the new file)."""
    problems = []
    for host, path in where.items():
        try:
            done = transport(host, write_command(path), LIMIT, stdin=text)
        except (TimedOut, OSError) as exc:
            problems.append(f"--publish: {host}: {path} not written: {exc}")
            continue
        if done.rc != 0:
            why = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.rc}"]
            problems.append(f"--publish: {host}: {path} not written: {why[0]}")
    return problems


def check_local_path(path: str) -> None:
    """Refuse a ``--prometheus`` FILE whose directory does not exist (before any probe
    runs)."""
    parent = Path(path).parent
    if not parent.is_dir():
        raise PublishError(f"--prometheus {path}: the directory {parent} does not exist "
                           "(on a node of a monitored cluster the textfile directory is "
                           "/var/lib/prometheus/node-exporter)")


def write_local(path: str, text: str) -> None:
    """Write ``text`` to ``path`` on this machine, whole and readable by the node
    exporter (0644)."""
    target = Path(path)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
