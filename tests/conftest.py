"""``--part I/N``: run only the I-th of N parts of the collected test files (1-based).
scripts/test.sh runs the tests without the testbed as parts side by side, one process
per core (pyinfra's gevent and a worker pool's threads do not mix, so not pytest-xdist).
The files are dealt out so that the parts take about as long: the longest first, each
to the part with the least so far, a file weighing what :data:`SECONDS` says it took
(else :data:`PER_TEST` a test). Every process computes the same split."""

from __future__ import annotations

import pytest

#: Files far slower than their count of tests says: seconds measured on the 2-core CI
#: machine (2026-12-02, `pytest --durations`). Only the split uses them; a wrong figure
#: makes one part longer, never a test fail.
SECONDS = {
    "tests/unit/test_template_parity.py": 205,
    "tests/unit/test_lint.py": 105,
    "tests/unit/test_inventory_refusals.py": 100,
    "tests/unit/test_inventory_errors.py": 30,
    "tests/unit/test_packaging.py": 20,
    "tests/deploys/test_slurm.py": 20,
    "tests/deploys/test_base.py": 20,
    "tests/unit/test_standin_minio.py": 20,
    "tests/unit/test_absence.py": 15,
    # The whole lab planned for four OSes (measured 85-125 s here, 2026-12-03).
    "tests/deploys/test_lab_plan.py": 110,
}
#: What any other test takes, about.
PER_TEST = 0.3


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
    tests: dict[str, int] = {}
    for item in items:
        name = item.nodeid.split("::")[0]
        tests[name] = tests.get(name, 0) + 1
    weight = {f: SECONDS.get(f, PER_TEST * n) for f, n in tests.items()}
    loads = [0.0] * count
    parts: list[set[str]] = [set() for _ in range(count)]
    for name in sorted(tests, key=lambda f: (-weight[f], f)):
        lightest = loads.index(min(loads))
        parts[lightest].add(name)
        loads[lightest] += weight[name]
    mine = parts[index - 1]
    keep = [item for item in items if item.nodeid.split("::")[0] in mine]
    drop = [item for item in items if item.nodeid.split("::")[0] not in mine]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
