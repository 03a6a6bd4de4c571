"""The digest of the files a daemon runs with, recorded once it took them up, and the
command that compares them (read by :class:`aicluster.common.facts.FilesApplied` in
pyinfra, by a shell task in Ansible: the same text, so either engine may follow the
other). No pyinfra here: the Ansible side imports it.
"""

from __future__ import annotations

import shlex


def stamp_command(paths: list[str]) -> str:
    """The digest :class:`aicluster.common.facts.FilesApplied` compares: the files'
    contents, one stream."""
    return f"cat {' '.join(shlex.quote(p) for p in paths)} 2>/dev/null | sha256sum"


def applied_command(paths: list[str], stamp: str) -> str:
    """What :class:`aicluster.common.facts.FilesApplied` runs (Ansible runs the same):
    ``yes`` when the files' digest is the one recorded in *stamp*, else ``no``."""
    return (f'if [ "$({stamp_command(paths)})" = "$(cat {shlex.quote(stamp)} 2>/dev/null)" ]; '
            "then echo yes; else echo no; fi")
