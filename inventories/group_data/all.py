"""Settings shared by every inventory in this directory (lab.py, testbed.py).

Component versions are pinned here as components land: bump one and deploy again to
upgrade. Settings of one cluster (networks, secrets, the package cache, admin users)
live in the group named after its inventory file (``group_data/lab.py`` for
``lab.py``); values here override the inventory file's own ``all`` data.
"""
