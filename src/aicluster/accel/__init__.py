"""The pyinfra accelerator: the same deploy, with fewer round trips and less work on
the deploying machine. Optional: the deploy is correct without it.

It is everything aicluster changes in pyinfra's own behaviour, and the only code that
touches pyinfra's private internals:

* :mod:`aicluster.accel.memo`: each fact read once per host until something changes,
  and the reads of the previous run fetched in one command per host;
* :mod:`aicluster.accel.speed`: pyinfra's bookkeeping for each operation (operation
  order, global arguments, signatures, command templates) made cheap;
* :mod:`aicluster.accel.connect_once`: one connection per host when several hosts'
  deploys read a host ``--limit`` left out.

:func:`enable` is the one entry point (``deploy.py`` calls it for each host). It turns
the accelerator on only for the pyinfra versions it was tested with
(:data:`TESTED_PYINFRA`), and not at all with ``AICLUSTER_ACCEL=0`` in the environment
or ``pyinfra_accelerator = False`` in the inventory. Before installing anything it
looks up every pyinfra name it uses (:mod:`aicluster.accel.guard`); a name missing, a
signature changed or any error while installing makes it undo what it installed and
step aside. Either way the deploy runs on stock pyinfra, and says so in one line.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from aicluster.accel.guard import PATCHES, StepAside, check_pyinfra

#: The pyinfra releases the accelerator was tested with: 3.10.x only. Widen it only
#: after the unit tests and the end-to-end re-run pass on the new release.
TESTED_PYINFRA = SpecifierSet("==3.10.*")
#: The environment variable that turns the accelerator off (``0``, ``false``, ``no``,
#: ``off``).
ENV_SWITCH = "AICLUSTER_ACCEL"
_OFF_VALUES = frozenset({"0", "false", "no", "off"})

#: pyinfra's logger (``pyinfra.logger``), by its name: nothing to import.
logger = logging.getLogger("pyinfra")
_LOCK = threading.Lock()
#: ``None`` until decided (once per process), then whether it is on.
_DECISION: list[bool | None] = [None]


def pyinfra_version() -> str:
    """The installed pyinfra's version."""
    return importlib.metadata.version("pyinfra")


def _why_off(wanted: bool) -> tuple[bool, str] | None:
    """``(asked for, why)`` the accelerator stays off before looking at pyinfra's
    insides (asked for: by a switch), or None."""
    value = os.environ.get(ENV_SWITCH, "").strip()
    if value.lower() in _OFF_VALUES:
        return True, f"off by {ENV_SWITCH}={value}"
    if not wanted:
        return True, "off by pyinfra_accelerator = False in the inventory"
    try:
        version = pyinfra_version()
        tested = TESTED_PYINFRA.contains(Version(version), prereleases=False)
    except (importlib.metadata.PackageNotFoundError, InvalidVersion) as exc:
        return False, f"off: the pyinfra version cannot be read ({exc})"
    if not tested:
        return False, (f"off: pyinfra {version} is not a version it was tested with "
                       f"({TESTED_PYINFRA})")
    return None


def _install() -> None:
    from aicluster.accel.connect_once import connect_once
    from aicluster.accel.memo import memoize_facts
    from aicluster.accel.speed import speed_up_pyinfra

    check_pyinfra()
    speed_up_pyinfra()
    connect_once()
    memoize_facts()


def _decide(wanted: bool) -> bool:
    off = _why_off(wanted)
    if off is not None:
        asked, why = off
        # (a switch the user set is news, not a warning; a pyinfra not tested is)
        say = logger.info if asked else logger.warning
        say(f"aicluster: pyinfra accelerator {why}; running on stock pyinfra")
        return False
    try:
        _install()
    except Exception as exc:  # StepAside, or pyinfra changed in a way not checked
        _undo()
        reason = str(exc) if isinstance(exc, StepAside) else f"{type(exc).__name__}: {exc}"
        logger.warning(f"aicluster: pyinfra accelerator stepped aside ({reason}); "
                       "running on stock pyinfra")
        return False
    return True


def enable(host: Any, state: Any, wanted: bool = True) -> bool:
    """Turn the accelerator on for this run, if it may be (once per process: the first
    call decides, and says in one line when it stays off), and prefetch *host*'s facts.
    *wanted* is the inventory's ``pyinfra_accelerator``. Returns whether it is on."""
    with _LOCK:
        if _DECISION[0] is None:
            _DECISION[0] = _decide(wanted)
    if not _DECISION[0]:
        return False
    from aicluster.accel.memo import prefetch_facts, remember_reads
    from aicluster.connectors.openssh import HostLost

    try:
        # (pyinfra runs deploy.py for all hosts at once: their reads run in parallel)
        logger.debug("%s: %d facts prefetched", host.name, prefetch_facts(host))
        remember_reads(state)
    except HostLost:  # the host is out of this run (deploy.py stops planning for it)
        raise
    except Exception as exc:  # facts are then read one by one, as pyinfra does
        logger.warning(f"aicluster: {host.name}: fact prefetch failed "
                       f"({type(exc).__name__}: {exc}); its facts are read one by one")
    return True


def _undo() -> None:
    from aicluster.accel import connect_once, speed

    PATCHES.undo()
    speed._INSTALLED.clear()
    connect_once._INSTALLED.clear()


def disable() -> None:
    """Undo everything :func:`enable` installed, and forget its decision (tests)."""
    with _LOCK:
        _undo()
        _DECISION[0] = None


def is_enabled() -> bool:
    """Whether the accelerator is on in this process."""
    return bool(_DECISION[0])
