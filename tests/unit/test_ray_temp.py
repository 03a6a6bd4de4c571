"""Ray's temporary directory: one path for the whole Ray cluster, since worker nodes
take the head's and fail to start where they cannot create it (found on the testbed:
a head with its temporary directory on its NVMe cache, a worker without a cache)."""

from __future__ import annotations

import dataclasses

import pytest

from aicluster import PROJECT_ROOT
from aicluster.components.ray.derive import RAY_DEFAULT_TEMP, derived_vars, temp_path
from aicluster.inventory import InventoryError, load_cluster, validate

LAB = load_cluster(PROJECT_ROOT / "inventories" / "lab.py")


def _with_ray_head(name):
    groups = {**LAB.groups, "ray_head": (name,),
              "ray_workers": tuple(h for h in LAB.group("ray_workers") if h != name)}
    return dataclasses.replace(LAB, groups=groups)


def test_a_head_without_the_nvme_cache_keeps_rays_default_everywhere():
    # The lab's head has no NVMe drive; its GPU workers have the cache.
    assert "nvme_cache" not in LAB.hosts["head"].components()
    for host in LAB.group("ray_head") + LAB.group("ray_workers"):
        assert derived_vars(LAB, host, LAB.hosts[host].data)["ray_temp_path"] == (
            RAY_DEFAULT_TEMP)


def test_every_ray_node_with_the_cache_uses_the_caches_ray_directory():
    cluster = _with_ray_head("gpu1")
    head_v = {"ray_temp_dir": ""}
    assert temp_path(cluster, head_v) == "/mnt/nvme-cache/ray"


def test_the_inventory_names_it():
    assert temp_path(LAB, {"ray_temp_dir": "/srv/ray-tmp/"}) == "/srv/ray-tmp"


def test_a_relative_temp_dir_is_refused_naming_host_and_field():
    """The ray settings model refuses it when the inventory is loaded."""
    hosts = {name: (h.groups, {**h.data, **({"ray_temp_dir": "tmp/ray"} if name == "gpu1"
                                            else {})})
             for name, h in LAB.hosts.items()}
    with pytest.raises(InventoryError) as caught:
        validate(hosts)
    assert [e for e in caught.value.errors if e.startswith(
        "host 'gpu1': ray_temp_dir: String should match pattern")], caught.value.errors
