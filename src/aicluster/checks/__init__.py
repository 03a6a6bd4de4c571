"""``aicluster check``: prove a deployed cluster is fit for AI work.

One module per layer (``nodes``, ``network``, ``infiniband``, ``gpu``, ``storage``,
``stacks``), each with the same two entry points, planned from a
:class:`~aicluster.checks.context.Context` (the inventory, the tier, the thresholds):

- ``probes(ctx) -> list[Probe]``: checks on one node each (a shell command run on the
  node under a hard limit, and the function that reads its output into results);
- ``pair_checks(ctx) -> list[PairCheck]``: tests between two nodes, run in rounds of
  disjoint pairs, with re-tests of suspects against nodes that passed.

A layer plans only what the inventory puts on a node (the component's group, the
declared hardware), reads only what the deploy installed, and turns every output into
PASS, WARN, FAIL, SKIP (with the reason) or ERROR; the runner adds TIMEOUT. Check
names are ``<layer>.<what>`` and stable: Slurm drain reasons and the monitoring
component's alerts name them. :mod:`aicluster.checks.plan` gathers the layers;
:mod:`aicluster.checks.runner` runs them; :mod:`aicluster.checks.report` writes the
table, JSON, JUnit XML and the Prometheus textfile.
"""
