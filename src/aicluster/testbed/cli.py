"""`aicluster testbed ...` (placeholder replaced by the testbed implementation)."""

import click


@click.group()
def testbed() -> None:
    """A local N-node test cluster of systemd-nspawn machines."""
