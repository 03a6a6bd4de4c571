"""The batched rollout's Kubernetes side, written once for every component that takes a
k3s node out of service for a change (a k3s upgrade, a driver change): the commands a k3s
server runs to cordon and drain a node, and to give it back. An annotation marks a cordon
as aicluster's, so a node an administrator cordoned stays cordoned."""

from __future__ import annotations

import shlex

_KUBECTL = "k3s kubectl"


def drain_command(node: str, timeout: int, annotation: str, value: str) -> str:
    """Run on a server: cordon and drain ``node`` (marked ``annotation=value``) unless an
    administrator cordoned it; a node not registered yet has nothing to drain."""
    k, q = _KUBECTL, shlex.quote(node)
    path = annotation.replace(".", "\\.")
    return (
        f"if ! {k} get node {q} >/dev/null 2>&1; then echo '{node}: not registered yet; "
        "nothing to drain'; "
        f"elif [ \"$({k} get node {q} -o jsonpath='{{.spec.unschedulable}}')\" = true ] && "
        f"[ -z \"$({k} get node {q} -o jsonpath='{{.metadata.annotations.{path}}}')\" ]; "
        f"then echo '{node}: cordoned by an administrator; it stays cordoned'; "
        f"else {k} annotate --overwrite node {q} {annotation}={value} && "
        f"{k} cordon {q} && {k} drain {q} --ignore-daemonsets --delete-emptydir-data "
        f"--timeout={int(timeout)}s; fi"
    )


def uncordon_command(node: str, annotation: str) -> str:
    """Run on a server: give ``node`` back, only if aicluster's cordon is on it."""
    k, q = _KUBECTL, shlex.quote(node)
    path = annotation.replace(".", "\\.")
    return (
        f"if [ -n \"$({k} get node {q} -o jsonpath='{{.metadata.annotations.{path}}}' "
        f"2>/dev/null)\" ]; then {k} uncordon {q} && {k} annotate node {q} {annotation}-; "
        f"else echo '{node}: not cordoned by aicluster; left as it is'; fi"
    )
