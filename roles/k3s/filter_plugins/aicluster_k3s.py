"""Filters the k3s role uses: the very Python the pyinfra deploy runs
(aicluster.components.k3s.deploy), so both engines derive the same token and decide alike what
each node's turn in the rollout is. Filters run on the deploying machine: the
cluster's secret is read there; the token reaches a node only as its token file
(copied with no_log)."""

from __future__ import annotations

from aicluster.components.k3s.derive import cluster_token, decide, token_digest
from aicluster.components.k3s.probe import parse


def aicluster_k3s_token(ref, size, check_mode=False):
    """The cluster token (aicluster.components.k3s.deploy.cluster_token); in check mode
    a missing secret file is not generated."""
    return cluster_token(ref, int(size), dry=bool(check_mode))


def aicluster_k3s_decide(fact_lines, token, host_name, version, artifact_files, iface):
    """What to do on one node (aicluster.components.k3s.deploy.decide) from the lines the fact
    command printed; the token is only compared as a digest."""
    v = {"inventory_hostname": host_name, "k3s_version": version,
         "k3s_artifact_files": artifact_files, "k3s_flannel_iface": iface}
    return decide(v, parse(fact_lines), token_digest(token))


class FilterModule:
    def filters(self):
        return {
            "aicluster_k3s_token": aicluster_k3s_token,
            "aicluster_k3s_decide": aicluster_k3s_decide,
        }
