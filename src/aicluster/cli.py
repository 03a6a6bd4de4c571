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
    from aicluster.inventory import InventoryError, load_cluster, warning_lines

    try:
        cluster = load_cluster(inventory)
    except InventoryError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    # The same lines pyinfra prints once when it loads the inventory.
    for line in warning_lines(cluster):
        click.echo(line, err=True)
    click.echo(
        f"{inventory}: {len(cluster.hosts)} hosts, "
        f"groups: {', '.join(sorted(g for g, m in cluster.groups.items() if m))}: OK"
    )


_PATHS = {
    "deploy": "DEPLOY_FILE",
    "roles": "ROLES_DIR",
    "playbooks": "PLAYBOOKS_DIR",
    "inventories": "INVENTORIES_DIR",
    "ansible-cfg": "ANSIBLE_CFG",
}


@main.command()
@click.argument("what", type=click.Choice(sorted(_PATHS)))
def path(what: str) -> None:
    """Print where the project's deploy.py, roles, playbooks, example inventories or
    ansible.cfg are: in the installed package, or in the clone it runs from.

    \b
      pyinfra my-cluster.py "$(aicluster path deploy)"
      ANSIBLE_CONFIG="$(aicluster path ansible-cfg)" \\
        ansible-playbook -i my-cluster.py "$(aicluster path playbooks)/site.yml"
    """
    import aicluster

    click.echo(str(getattr(aicluster, _PATHS[what])))


@main.group()
def artifacts() -> None:
    """Pinned release artifacts (k3s, MinIO, Ollama ...): list, fetch for offline sites."""


def _artifacts_of(inventory: str):
    from aicluster.artifacts import ArtifactError, needed
    from aicluster.inventory import InventoryError, load_cluster

    try:
        cluster = load_cluster(inventory)
        return cluster, needed(cluster)
    except (InventoryError, ArtifactError) as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)


@artifacts.command("list")
@click.argument("inventory", type=click.Path(dir_okay=False))
def artifacts_list(inventory: str) -> None:
    """The artifacts INVENTORY needs: name, version, arch, where it is, url, sha256."""
    from aicluster.artifacts import Store

    cluster, arts = _artifacts_of(inventory)
    store = Store.from_cluster(cluster)
    if not arts:
        click.echo(f"{inventory}: no component of this inventory installs a release artifact")
        return
    rows = [("ARTIFACT", "VERSION", "ARCH", "HAVE", "URL", "SHA256")]
    rows += [
        (f"{a.component}/{a.name}", a.version, a.arch, store.status(a), a.url, a.sha256)
        for a in arts
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row[:4], widths, strict=True)]
        click.echo("  ".join([*cells, *row[4:]]))


@artifacts.command("fetch")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option(
    "--dest",
    type=click.Path(file_okay=False),
    help="Fill this directory for offline sites (default: the inventory's artifacts_dir; "
    "neither: the download cache only).",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show download progress (default: when stderr is a terminal).",
)
def artifacts_fetch(inventory: str, dest: str | None, progress: bool | None) -> None:
    """Download and verify every artifact INVENTORY needs (once, into the cache), and
    copy them into an artifact directory for sites without internet."""
    from pathlib import Path

    from aicluster.artifacts import ArtifactError, Store, fetch

    cluster, arts = _artifacts_of(inventory)
    target = dest or cluster.spec.artifacts_dir
    # The directory being filled is not where files are looked for (a wrong file
    # there is replaced, not an error).
    store = Store.from_cluster(cluster, progress=progress, artifacts_dir=None)
    try:
        fetch(arts, store, Path(target) if target else None, echo=click.echo)
    except ArtifactError as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    where = f" into {target}" if target else f" in {store.cache_dir}"
    click.echo(f"{len(arts)} artifact(s) verified{where}")


def _add_testbed() -> None:
    from aicluster.testbed.cli import testbed

    main.add_command(testbed)


_add_testbed()

if __name__ == "__main__":
    main()
