"""The `aicluster` command."""

from __future__ import annotations

import sys

import click

from aicluster import __version__


@click.group()
@click.version_option(__version__, prog_name="aicluster")
def main() -> None:
    """Turn bare-metal machines into an AI cluster from one inventory file."""


@main.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
def validate(inventory: str) -> None:
    """Check INVENTORY without contacting any host (exit 2 on bad input)."""
    from aicluster.inventory import InventoryError, load_cluster

    try:
        cluster = load_cluster(inventory)
    except InventoryError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    for warning in cluster.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(
        f"{inventory}: {len(cluster.hosts)} hosts, "
        f"groups: {', '.join(sorted(g for g, m in cluster.groups.items() if m))}: OK"
    )


def _add_testbed() -> None:
    from aicluster.testbed.cli import testbed

    main.add_command(testbed)


_add_testbed()

if __name__ == "__main__":
    main()
