"""Every layer's checks for one run: the node probes and the pair checks the inventory
calls for, in layer order."""

from __future__ import annotations

import importlib
from types import ModuleType

from aicluster.checks.context import Context
from aicluster.checks.runner import PairCheck, Probe

#: The layers, in the order their results are planned (and broken ties are listed).
LAYERS = ("nodes", "network", "infiniband", "gpu", "storage", "stacks", "monitoring")


def layer(name: str) -> ModuleType:
    return importlib.import_module(f"aicluster.checks.{name}")


def plan(ctx: Context, layers: tuple[str, ...] = LAYERS) -> tuple[list[Probe], list[PairCheck]]:
    """The node probes and the pair checks of the layers asked for."""
    probes: list[Probe] = []
    pairs: list[PairCheck] = []
    for name in layers:
        module = layer(name)
        probes += module.probes(ctx)
        if hasattr(module, "pair_checks"):
            pairs += [p for p in module.pair_checks(ctx) if len(p.nodes) >= 2]
    return probes, pairs
