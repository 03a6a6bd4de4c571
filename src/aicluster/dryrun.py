"""A dry run: plan everything, change nothing anywhere, the deploying machine included.

``pyinfra INVENTORY deploy.py --dry`` plans every operation and runs none on the
nodes. The deploy also does work on the deploying machine before any operation:
release artifacts are downloaded into the cache (:mod:`aicluster.artifacts`) and
missing secrets generated (:mod:`aicluster.secrets`). In a dry run, set by
``deploy.py`` from pyinfra's ``--dry`` (:func:`set_dry`), neither happens: each says
what it would do in one line on stderr (:func:`would`), once per run, and the plan goes
on with what it would have had (a secret's value held in memory only, for this run; an
artifact not yet downloaded uploaded as a placeholder that is never sent).
"""

from __future__ import annotations

import sys

_DRY = [False]
_SAID: set[str] = set()


def set_dry(on: bool) -> None:
    """Make this process's run dry (or not)."""
    _DRY[0] = bool(on)


def is_dry() -> bool:
    """Whether this process's run is dry: nothing may change on the deploying machine."""
    return _DRY[0]


def would(what: str) -> None:
    """Say, once per run, what a dry run leaves undone: ``aicluster: --dry: would ...``."""
    line = f"aicluster: --dry: would {what}"
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)
