"""``aicluster testbed up|down|status|ssh``."""

from __future__ import annotations

import json
import os

import click

from aicluster.testbed import state as st
from aicluster.testbed.errors import TestbedError


@click.group()
def testbed() -> None:
    """A local N-node test cluster of systemd-nspawn machines (needs root)."""


@testbed.command()
@click.option("--nodes", "-n", type=click.IntRange(1, st.MAX_NODES), default=2, show_default=True,
              help="How many nodes (node1..nodeN) the testbed should have.")
@click.option("--disks", type=click.IntRange(0, 8), default=0, show_default=True,
              help="Disks each node has (disk1..diskK: loop devices, "
                   "/dev/disk/by-id/aicluster-testbed-NODE-diskK in the node).")
@click.option("--disk-size", default="1G", show_default=True,
              help="Size of each new disk (sparse), e.g. 512M or 2G.")
def up(nodes: int, disks: int, disk_size: str) -> None:
    """Create the testbed, or add the missing nodes to it (running nodes stay as they are)."""
    from aicluster.testbed.core import up as do_up

    data = do_up(nodes, disks=disks, disk_size=disk_size)
    for node in data["nodes"]:
        click.echo(f"{node['name']}\t{node['address']}")
    for disk in data.get("disks") or []:
        click.echo(f"{disk['node']}\t{disk['by_id']}\t{disk['loop']}")
    click.echo(f"ssh key: {data['ssh_key']}  (aicluster testbed ssh NODE)")


@testbed.command()
def down() -> None:
    """Stop all nodes and proxies and remove everything the testbed made (keeps the cache)."""
    from aicluster.testbed.core import down as do_down

    do_down()


@testbed.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(as_json: bool) -> None:
    """Show nodes (address, running, SSH) and proxies."""
    from aicluster.testbed.core import status as do_status

    data = do_status()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if not data["exists"]:
        click.echo("no testbed (run: aicluster testbed up)")
        return
    click.echo(f"{'NODE':<8} {'ADDRESS':<13} {'SUPERVISOR':<11} {'NSPAWN':<8} {'SSH':<4} STATE")
    for node in data["nodes"]:
        click.echo(
            f"{node['name']:<8} {node['address']:<13} "
            f"{node['pid'] if node['supervisor_alive'] else 'exited':<11} "
            f"{node['nspawn_pid'] or '-':<8} {'yes' if node['ssh'] else 'no':<4} "
            f"{'running' if node['running'] else 'NOT RUNNING'}"
        )
    for name, proxy in data["proxies"].items():
        click.echo(
            f"{name}: {proxy.get('address', '?')} pid {proxy.get('pid')} "
            f"{'running' if proxy['running'] else 'NOT RUNNING'}"
        )


@testbed.command(context_settings={"ignore_unknown_options": True,
                                   "allow_interspersed_args": False})
@click.argument("node")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(node: str, command: tuple[str, ...]) -> None:
    """SSH into NODE as root (optionally running COMMAND) with the testbed key."""
    from aicluster.testbed.node import ssh_command

    data = st.load_state()
    if data is None:
        raise TestbedError("no testbed (run: aicluster testbed up)")
    entry = next((n for n in data["nodes"] if n["name"] == node), None)
    if entry is None:
        names = ", ".join(n["name"] for n in data["nodes"]) or "none"
        raise TestbedError(f"no node {node!r} in the testbed (nodes: {names})")
    argv = ssh_command(data["ssh_key"], entry["address"], list(command))
    os.execvp(argv[0], argv)


@testbed.group()
def disk() -> None:
    """Disks of testbed nodes (loop devices on the host)."""


@disk.command("add")
@click.argument("node")
@click.argument("name")
@click.option("--size", default="1G", show_default=True, help="Size (sparse), e.g. 512M or 2G.")
def disk_add(node: str, name: str, size: str) -> None:
    """Give running NODE a disk NAME: /dev/disk/by-id/aicluster-testbed-NODE-NAME."""
    from aicluster.testbed.core import disk_add as do_disk_add

    record = do_disk_add(node, name, size)
    click.echo(f"{record['node']}\t{record['by_id']}\t{record['loop']}")
