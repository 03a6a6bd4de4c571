"""``--part I/N``: run only the I-th of N parts of the collected test files (1-based),
the files dealt out in turn in sorted order. scripts/test.sh runs the tests without the
testbed as parts side by side, one process per core (pyinfra's gevent and a worker
pool's threads do not mix, so not pytest-xdist)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--part", default=None, metavar="I/N",
                     help="run only the I-th of N parts of the test files (1-based)")


def _part(config) -> tuple[int, int] | None:
    value = config.getoption("--part")
    if not value:
        return None
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--part {value!r}: expected I/N, e.g. 1/2") from None
    if not 1 <= index <= count:
        raise pytest.UsageError(f"--part {value!r}: I must be between 1 and N")
    return index, count


def pytest_collection_modifyitems(config, items):
    part = _part(config)
    if part is None:
        return
    index, count = part
    files = sorted({item.nodeid.split("::")[0] for item in items})
    mine = {f for i, f in enumerate(files) if i % count == index - 1}
    keep = [item for item in items if item.nodeid.split("::")[0] in mine]
    drop = [item for item in items if item.nodeid.split("::")[0] not in mine]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
