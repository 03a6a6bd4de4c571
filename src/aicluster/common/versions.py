"""Package and driver versions compared with what the inventory pins, written once."""

from __future__ import annotations

import re


def version_matches(installed: str, wanted: str) -> bool:
    """Whether an installed version is the pinned one, or a release of it: an optional
    epoch (``1:``), the pin, then the end or a separator (``570`` matches ``570.133.20``,
    ``22.05.8`` matches ``22.05.8-4+deb12u3``, ``570.13`` does not match ``570.133.20``).
    An empty pin matches anything."""
    if not wanted:
        return True
    return bool(re.match(rf"^(\d+:)?{re.escape(wanted)}([-+~.]|$)", installed or ""))
