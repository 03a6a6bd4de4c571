"""Settings shared by every inventory in this directory (lab.py, testbed.py).

Component versions are pinned here as components land: bump one and deploy again to
upgrade. Settings of one cluster (networks, secrets, the package cache, admin users)
live in the group named after its inventory file (``group_data/lab.py`` for
``lab.py``); values here override the inventory file's own ``all`` data.
"""

# Ray, from the Python package index, into a venv per version (docs/components/ray.md).
# Ray 2.60.0 has wheels for Python 3.10-3.13 (Debian 12 runs 3.11).
ray_version = "2.60.0"

# Slurm from the distribution's packages (Debian 12 ships 22.05.8 only).
slurm_version = "22.05.8"
