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
    from aicluster.checks.context import check_thresholds
    from aicluster.inventory import InventoryError, load_cluster, warning_lines

    try:
        cluster = load_cluster(inventory)
        # aicluster check's thresholds too, so a typo there is found before a deploy.
        errors = check_thresholds(cluster)
        if errors:
            raise InventoryError(errors, inventory)
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


@main.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--quick", "tier", flag_value="quick",
              help="Inventory against reality, services, ports, MTU, time: <= 60 s a node.")
@click.option("--standard", "tier", flag_value="standard", default=True,
              help="The default: adds bandwidth, storage and stack smoke tests.")
@click.option("--burn-in", "tier", flag_value="burn-in",
              help="Adds the long GPU and NCCL runs (dcgmi diag level 3).")
@click.option("--limit", default="", metavar="NODE[,NODE...]",
              help="Check only these nodes (pair tests among them).")
@click.option("--layer", "layers", multiple=True,
              type=click.Choice(["nodes", "network", "infiniband", "gpu", "storage", "stacks",
                                 "monitoring"]),
              help="Only these layers (repeat the option); SSH reachability always runs.")
@click.option("--json", "json_out", metavar="FILE", help="Write the results as JSON "
              "(result.schema.json) to FILE; - for standard output instead of the table.")
@click.option("--junit", metavar="FILE", help="Write the results as JUnit XML to FILE.")
@click.option("--prometheus", metavar="FILE", help="Write a textfile for node_exporter's "
              "textfile collector (aicluster_check_*) to FILE, whole and mode 0644 (with "
              "--local, on the node: /var/lib/prometheus/node-exporter/aicluster_check.prom).")
@click.option("--publish", is_flag=True, help="Write that textfile as aicluster_check.prom "
              "into the textfile directory of every monitoring host, over SSH, for the "
              "alert pack (an error, before any probe, without a monitoring host).")
@click.option("--baseline", metavar="FILE", help="Record the fleet's figures in FILE when "
              "it does not exist; otherwise warn about a node more than "
              "--baseline-tolerance below the recorded fleet median.")
@click.option("--baseline-tolerance", default=5.0, show_default=True, metavar="PERCENT",
              type=click.FloatRange(0, 100))
@click.option("--drain", is_flag=True, help="Drain failed Slurm nodes (reason "
              "'aicluster: <check>'); resume nodes drained so that pass now.")
@click.option("--local", metavar="NODE", help="Run NODE's own probes on this machine, "
              "without SSH (Slurm's HealthCheckProgram on the node); no pair tests.")
@click.option("--workers", default=16, show_default=True, type=click.IntRange(1, 256),
              help="Probes run at once.")
def check(inventory: str, tier: str, limit: str, layers: tuple[str, ...],
          json_out: str | None, junit: str | None, prometheus: str | None,
          publish: bool, baseline: str | None, baseline_tolerance: float, drain: bool,
          local: str | None, workers: int) -> None:
    """Prove the deployed cluster of INVENTORY is fit for AI work: every check as PASS,
    WARN, FAIL, TIMEOUT, SKIP (with the reason) or ERROR, its value beside its threshold.

    Exit status: 0 nothing failed, 1 a check failed or timed out, 2 bad input (nothing
    run), 3 a check could not run (or --publish could not write a monitoring host's
    file). See docs/check.md.
    """
    from pathlib import Path

    from aicluster.checks import baseline as baselines
    from aicluster.checks import drain as drains
    from aicluster.checks import publish as publishing
    from aicluster.checks import report
    from aicluster.checks.context import Context, ThresholdError, check_thresholds
    from aicluster.checks.plan import LAYERS
    from aicluster.checks.result import exit_code
    from aicluster.checks.runner import local_transport
    from aicluster.checks.session import Progress, run, transport_for
    from aicluster.inventory import InventoryError, load_cluster

    try:
        cluster = load_cluster(inventory)
        errors = check_thresholds(cluster)
        if errors:
            raise InventoryError(errors, inventory)
        nodes = tuple(n for n in (local or limit).split(",") if n)
        ctx = Context(cluster, tier, nodes)
        if publish and local:
            raise publishing.PublishError(
                "--publish and --local: --publish writes the monitoring hosts' file over "
                "SSH from the admin machine; on a node, write the textfile with "
                "--prometheus FILE")
        published = publishing.targets(cluster) if publish else {}
        if prometheus:
            publishing.check_local_path(prometheus)
    except (InventoryError, ThresholdError, publishing.PublishError) as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    transport = local_transport if local else transport_for(cluster)
    chosen = tuple(layers) or LAYERS
    results = run(ctx, transport, workers=workers, layers=chosen,
                  progress=Progress(), pairs=not local, local=local)
    if baseline:
        path = Path(baseline)
        if path.exists():
            results += baselines.compare(path, results, baseline_tolerance / 100)
        else:
            kept = baselines.record(path, results)
            click.echo(f"baseline: {kept} figures recorded in {path}", err=True)
    if json_out == "-":
        click.echo(report.to_json(results))
    else:
        click.echo(report.table(results))
        counts = report.counts(results)
        click.echo(" ".join(f"{k}={v}" for k, v in counts.items() if v) +
                   f"  ({len(ctx.nodes())} nodes, {ctx.tier.value} tier)")
        if json_out:
            Path(json_out).write_text(report.to_json(results) + "\n")
    if junit:
        Path(junit).write_text(report.junit(results) + "\n")
    code = exit_code(results)
    if prometheus or published:
        text = report.prometheus(results)
        if prometheus:  # whole (renamed into place): node_exporter never reads half a file
            publishing.write_local(prometheus, text)
        problems = publishing.publish(published, text, transport) if published else []
        for line in problems:
            click.echo(line, err=True)
        if problems and code == 0:
            code = 3  # the checks passed, but their results did not reach Prometheus
    if drain:
        for line in drains.apply(ctx, results, transport):
            click.echo(line, err=json_out == "-")
    sys.exit(code)


def _add_testbed() -> None:
    from aicluster.testbed.cli import testbed

    main.add_command(testbed)


_add_testbed()

if __name__ == "__main__":
    main()
