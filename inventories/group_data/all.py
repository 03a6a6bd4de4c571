"""Cluster-wide settings shared by every inventory in this directory.

Component versions are pinned here; bump one and deploy again to upgrade.
Per-cluster settings (networks, secrets, the package cache) live in the group named
after the inventory file (``group_data/lab.py`` for ``lab.py``).
"""

# Admin users created on every node, with their public SSH keys (not secrets).
base_admin_users = []
