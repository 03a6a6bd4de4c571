"""Pair tests in rounds: each node meets every other once, and no node is in two tests
of the same round, so a round's tests run side by side without sharing a node's NIC
or HCA, and the wall time grows with the number of rounds (n - 1), not with the
number of pairs (n(n - 1)/2).

The rounds are the circle method's (a round-robin tournament): one node stays, the
others turn one place per round. With an odd count a stand-by slot joins, and the node
paired with it sits that round out. A node whose test failed is re-tested against a
node that passed (:func:`retest_pairs`), as Google's cluster-health-scanner does, to
tell the bad node from the bad partner.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def rounds(nodes: Sequence[str]) -> list[list[tuple[str, str]]]:
    """n - 1 rounds (n even; n rounds for n odd) of disjoint pairs covering every pair
    of ``nodes`` exactly once."""
    names = list(dict.fromkeys(nodes))
    if len(names) < 2:
        return []
    bye = None
    if len(names) % 2:
        names.append(bye)
    n = len(names)
    fixed, rest = names[0], names[1:]
    out: list[list[tuple[str, str]]] = []
    for r in range(n - 1):
        turn = rest[r:] + rest[:r]
        line = [fixed, *turn]
        pairs = []
        for i in range(n // 2):
            a, b = line[i], line[n - 1 - i]
            if a is not bye and b is not bye:
                pairs.append((a, b))
        out.append(pairs)
    return out


def retest_pairs(
    failed_pairs: Iterable[tuple[str, str]], passed_pairs: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """For each node in a failed pair and in no passed pair (a suspect), one test
    against a node that was in a passed pair (known good), the known-good nodes used in
    turn; no suspect gets one when no node passed."""
    good = sorted({n for p in passed_pairs for n in p})
    failed = list(failed_pairs)
    suspects = sorted({n for p in failed for n in p} - set(good))
    if not good:
        return []
    return [(suspect, good[i % len(good)]) for i, suspect in enumerate(suspects)]


def suspects_after_retest(
    retests: Iterable[tuple[tuple[str, str], bool]]
) -> list[str]:
    """The suspects whose re-test against a known-good node failed too: the nodes to
    blame (``retests``: each re-test pair, suspect first, and whether it passed)."""
    return sorted({pair[0] for pair, passed in retests if not passed})
