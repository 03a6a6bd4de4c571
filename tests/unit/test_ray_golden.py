"""The Ray units rendered for inventories/lab.py, compared with golden files.

tests/fixtures/golden/ray/<host>/<unit> holds what each Ray node of the lab gets.
After an intended change, regenerate them and review the diff:

    AICLUSTER_UPDATE_GOLDEN=1 pytest tests/unit/test_ray_golden.py
"""

from __future__ import annotations

import pytest

from aicluster import PROJECT_ROOT
from aicluster.common.settings import template_vars
from aicluster.components.ray.derive import ray_hosts
from aicluster.inventory import load_cluster
from aicluster.render import render
from tests.golden import GOLDEN_DIR, assert_golden

LAB = PROJECT_ROOT / "inventories" / "lab.py"
GOLDEN = GOLDEN_DIR / "ray"

_CLUSTER = load_cluster(LAB)
HOSTS = ray_hosts(_CLUSTER)


@pytest.mark.parametrize("host", HOSTS)
def test_ray_unit_matches_golden_file(host):
    v = template_vars("ray", _CLUSTER, host, _CLUSTER.hosts[host].data, "Debian")
    unit = f"ray-{v['ray_node_role']}.service"
    text = render("ray", f"{unit}.j2", v)
    # The unit does not depend on the distribution.
    assert text == render(
        "ray", f"{unit}.j2", template_vars("ray", _CLUSTER, host, _CLUSTER.hosts[host].data,
                                           "RedHat")
    )
    assert_golden(GOLDEN / host / unit, text)


def test_every_golden_file_belongs_to_a_ray_node():
    if not GOLDEN.exists():
        pytest.skip("no golden files yet")
    on_disk = {p.parent.name for p in GOLDEN.glob("*/*.service")}
    assert on_disk <= set(HOSTS), on_disk - set(HOSTS)
