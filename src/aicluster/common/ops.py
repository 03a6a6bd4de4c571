"""pyinfra operations several components' deploys use, written once: a template
rendered and uploaded, an owned directory, a systemd manager drop-in, a system account,
a command on another host, packages installed with bounded time and retries (EL9's
CodeReady Builder enabled before EPEL), the validated cluster of the running inventory,
its hosts by name, whether this host runs a component, a skip said at any verbosity, a
host stopped before any operation runs on it, the repairs of runtime drift (the live
firewall table, applied sysctls, loaded kernel modules: each reads the node when it runs
and changes something only where the node has drifted), and what a host no longer runs
taken away (aicluster.common.absence)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping
from io import StringIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.context import ctx_state
from pyinfra.facts.files import Directory, Link, Sha1File
from pyinfra.facts.server import LinuxDistribution, Mounts
from pyinfra.operations import files, server, systemd

from aicluster.common import drift, epel
from aicluster.common.absence import (
    RECORD,
    RECORD_DIR,
    plan,
    record_text,
    refusals,
    removals,
)
from aicluster.common.facts import (
    CrbEnabled,
    GlobPaths,
    KernelModulesLoaded,
    NftTableDrift,
    RecordedComponents,
    RecordedMounts,
    SysctlValues,
    UnitLoaded,
)
from aicluster.common.mounts import FSTAB, fstab_regexp
from aicluster.common.netconf import (
    NETPLAN_FILE,
    PREFIX,
    apply_commands,
    file_glob,
    render_files,
    rollback_commands,
    sha1_text,
)
from aicluster.common.settings import NETWORK_ARGS, layered, os_family, template_vars
from aicluster.inventory import Cluster
from aicluster.render import render


def put_template(
    component: str,
    template: str,
    dest: str,
    variables: Mapping[str, Any],
    *,
    name: str | None = None,
    mode: str = "644",
    user: str = "root",
    group: str = "root",
):
    """Render ``roles/<component>/templates/<template>`` and upload it (a pyinfra op)."""
    from pyinfra.operations import files

    text = render(component, template, variables)
    return files.put(
        name=name or f"Write {dest}",
        src=StringIO(text),
        dest=dest,
        mode=mode,
        user=user,
        group=group,
    )


def systemd_manager_conf(
    component: str, template: str, dest: str, variables: Mapping[str, Any], *,
    name: str, reload_name: str,
):
    """A drop-in for systemd's own manager (``/etc/systemd/system.conf.d``), rendered
    from the component's template; the manager re-executes only when it changed."""
    from pyinfra.operations import files, server

    files.directory(name="systemd manager drop-in directory", path="/etc/systemd/system.conf.d")
    conf = put_template(component, template, dest, variables, name=name)
    server.shell(name=reload_name, commands=["systemctl daemon-reexec"], _if=conf.did_change)
    return conf


def owned_directory(name: str, path: str, user: str, group: str | None = None,
                    mode: str = "755"):
    """A directory with its owner, group (the owner's own unless given) and mode (a pyinfra op)."""
    return files.directory(name=name, path=path, user=user, group=group or user, mode=mode)


def system_user(
    name: str,
    user: str,
    *,
    group: str | None = None,
    groups: list[str] | None = None,
    append: bool = False,
    home: str | None = None,
    shell: str | None = None,
    system: bool = False,
    create_home: bool = False,
):
    """pyinfra's ``server.user`` (a pyinfra op), without reading every account of the
    node when this one is already as wanted: ``server.user`` reads the ``Users`` fact,
    five commands per account, on every run. When the account exists with this home,
    shell and groups, only its home directory's ownership is ensured (what
    ``server.user`` itself then does); otherwise ``server.user`` makes or mends it."""
    from pyinfra.operations import files, server

    from aicluster.common.facts import UserAccount

    have = host.get_fact(UserAccount, user=user)
    wanted_groups = list(groups or [])
    as_wanted = have is not None and (
        (home is None or have["home"] == home)
        and (shell is None or have["shell"] == shell)
        and (group is None or have["group"] == group)
        and (not wanted_groups or (
            set(wanted_groups) <= set(have["groups"]) if append
            else set(wanted_groups) == set(have["groups"])))
    )
    if as_wanted:
        return files.directory(
            name=f"{name}: home directory",
            path=home or have["home"] or f"/home/{user}",
            user=user,
            group=group or user,
            _no_fail_on_link=True,
        )
    return server.user(
        name=name, user=user, group=group, groups=groups, append=append, home=home,
        shell=shell, system=system, create_home=create_home,
    )


def run_on_other_host(state, host, other_name: str, command: str) -> bool:
    """A pyinfra FunctionCommand callback: run ``command`` on the inventory host
    ``other_name`` (e.g. cordon a node on a k3s server during this host's turn),
    connecting to it first if needed; True when it succeeded."""
    from pyinfra.api import StringCommand

    other = state.inventory.get_host(other_name)
    if not other.connected:
        other.connect()
    ok, _output = other.run_shell_command(StringCommand(command), print_output=True)
    return bool(ok)


def install_packages(name: str, packages: list[str], family: str):
    """Install distribution packages (a pyinfra op), bounded in time and retries; on
    Debian and Ubuntu the apt index is refreshed when it is over an hour old."""
    from pyinfra.operations import apt, dnf

    if family == "Debian":
        return apt.packages(
            name=name, packages=packages, update=True, cache_time=3600, **NETWORK_ARGS
        )
    return dnf.packages(name=name, packages=packages, **NETWORK_ARGS)


@operation()
def crb_enabled():
    """EL9's CodeReady Builder enabled (:data:`aicluster.common.epel.CRB_ENABLE_COMMAND`),
    read when the operation runs: where an earlier operation of this run (another
    component's EPEL) enabled it, nothing."""
    if host.get_fact(CrbEnabled):
        host.noop("CodeReady Builder (crb) is enabled")
    else:
        yield epel.CRB_ENABLE_COMMAND


def enable_crb_for(packages: list[str], family: str):
    """Before ``packages`` are installed on EL9: where they install EPEL
    (:func:`aicluster.common.epel.needs_crb`), CodeReady Builder enabled first, as EPEL's
    own instructions have it (some EPEL packages need CRB's), only where it is not
    enabled yet (a pyinfra op); on Debian and Ubuntu, or for other packages, nothing."""
    if family != "RedHat" or not epel.needs_crb(packages):
        return None
    return crb_enabled(name="Enable CodeReady Builder (crb) before EPEL (EPEL's packages "
                       "need it)", **NETWORK_ARGS)


_CLUSTERS: dict[int, Cluster] = {}


def current_cluster() -> Cluster:
    """The validated cluster of the inventory pyinfra is running (validated once)."""
    from pyinfra.context import ctx_inventory

    from aicluster.inventory import cluster_from_pyinfra

    inventory = ctx_inventory.get()
    if id(inventory) not in _CLUSTERS:
        _CLUSTERS[id(inventory)] = cluster_from_pyinfra(inventory)
    return _CLUSTERS[id(inventory)]


def inventory_hosts(names: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """``(name, pyinfra host)`` for each of ``names`` the inventory pyinfra runs has (a
    name it lacks is passed over)."""
    from pyinfra.context import ctx_inventory

    inventory = ctx_inventory.get()
    for name in names:
        other = inventory.get_host(name, None)
        if other is not None:
            yield name, other


def runs_here(component: str) -> bool:
    """Whether the host pyinfra is deploying now runs ``component`` (by the inventory's
    groups)."""
    return component in current_cluster().hosts[host.name].components()


def pyinfra_dry(argv: list[str] | None = None) -> bool:
    """Whether this pyinfra run was started with ``--dry`` (plan only). pyinfra 3 keeps
    that flag to its command line (not in its config or state), so the command line is
    read with pyinfra's own ``click`` command, as pyinfra read it; outside pyinfra's
    command (an API run, a test) it is False."""
    import sys

    if argv is None:
        if "pyinfra_cli" not in sys.modules:
            return False
        argv = sys.argv[1:]
    try:
        from pyinfra_cli.cli import cli

        context = cli.make_context("pyinfra", list(argv), resilient_parsing=True)
    except Exception:  # a pyinfra whose command changed: its one flag, by hand
        return "--dry" in argv
    return bool(context.params.get("dry"))


def this_host(component: str) -> tuple[Cluster, str, dict[str, Any]]:
    """For the host pyinfra is deploying now: the validated cluster, the host's OS family
    and the component's template variables (:func:`aicluster.common.settings.template_vars`)."""
    cluster = current_cluster()
    family = os_family(host.get_fact(LinuxDistribution))
    return cluster, family, template_vars(component, cluster, host.name, host.data.dict(), family)


def say(message: str) -> None:
    """What the deploy skipped and why, shown in the output at any verbosity."""
    host.noop(message)
    logger.warning(f"[{host.name}] {message}")


def refuse(problems: list[str]) -> None:
    """Stop this host before any operation runs on it: log every problem and mark it
    failed (pyinfra runs nothing on a failed host; the run exits non-zero)."""
    for line in problems:
        logger.error(f"{host.print_prefix}{line}")
    ctx_state.get().fail_hosts({host})


def write_config(
    component: str,
    items: list[dict],
    v: Mapping[str, Any],
    renderer_name: str,
    *,
    label: str,
    netplan_file: str = NETPLAN_FILE,
    prefix: str = PREFIX,
    glob: str | None = None,
    keep: Iterable[str] = (),
    mgmt: Mapping[str, Any] | None = None,
    drift: Iterable[str] = (),
) -> None:
    """Write ``items`` in ``renderer_name``'s format, remove our files the model no
    longer has, apply only when something changed, or when the live state drifted from
    the files (``drift``: what differs, e.g. an MTU set by hand). ``mgmt`` set: the change
    touches the management interface and is applied under a rollback timer."""
    drift = list(drift)
    wanted = []
    for f in render_files(items, renderer_name, netplan_file, prefix):
        text = render("network", f["template"], {**v, "network_render_interfaces": items,
                                                 "network_interface": f["interface"]})
        wanted.append((f, text))
    pattern = glob or file_glob(renderer_name)
    present = host.get_fact(GlobPaths, pattern=pattern) or []
    keep = set(keep) | {f["dest"] for f, _ in wanted}
    stale = [p for p in present if p not in keep]
    differs = [
        f["dest"] for f, text in wanted
        if host.get_fact(Sha1File, path=f["dest"]) != sha1_text(text)
    ]
    if not differs and not stale and not drift:
        host.noop(f"{label}: the configuration is as wanted ({renderer_name})")
        return
    confirm = None
    if mgmt is not None:
        arm, confirm = rollback_commands(
            renderer_name, [f["dest"] for f, _ in wanted] + stale, items,
            v["network_rollback_seconds"],
        )
        server.shell(
            name=f"Arm the network rollback ({v['network_rollback_seconds']} s): the "
            f"management interface {mgmt['name']} changes",
            commands=arm,
        )
    for f, text in wanted:
        files.put(
            name=f"{label}: write {f['dest']}",
            src=StringIO(text),
            dest=f["dest"],
            mode=f["mode"],
            user="root",
            group="root",
        )
    for path in stale:
        files.file(name=f"{label}: remove {path} (no longer in the inventory)", path=path,
                   present=False)
    why = "" if differs or stale else f": the live state drifted ({'; '.join(drift)})"
    server.shell(
        name=f"{label}: apply the changed configuration ({renderer_name}){why}",
        commands=apply_commands(renderer_name, items),
    )
    if confirm:
        server.shell(
            name="The node answers after the change: confirm it (disarm the rollback)",
            commands=[confirm],
        )



class Rollout:
    """A batched rollout's record, per pyinfra state: the nodes that began their turn
    (drain -> change -> verify -> resume) and those that ended it well, so that no node
    starts after an earlier node failed (its batch, or the nodes before it in order)."""

    def __init__(self, component: str):
        self.component = component
        self.started: dict[int, set[str]] = {}
        self.done: dict[int, set[str]] = {}

    def begin(self, earlier: Callable[[Any, Any], set[str]], refusal: str) -> FunctionCommand:
        """The command that starts a node's turn, or fails the node with ``refusal``
        (``{failed}`` in it names the nodes) when a node of ``earlier(state, host)``
        began and did not end well."""

        def _begin(state, host):
            failed = sorted((self.started.get(id(state), set()) & earlier(state, host))
                            - self.done.get(id(state), set()))
            if failed:
                host.log_styled(f"{self.component}: " + refusal.format(failed=", ".join(failed)),
                                fg="red", log_func=logger.error)
                return False
            self.started.setdefault(id(state), set()).add(host.name)
            return True

        return FunctionCommand(_begin, (), {})

    def end(self) -> FunctionCommand:
        """The command that records a node's turn as ended well."""

        def _end(state, host):
            self.done.setdefault(id(state), set()).add(host.name)
            return True

        return FunctionCommand(_end, (), {})


# ---------------------------------------------------------------------------
# Runtime drift: read when the operation runs (after the files it depends on were
# written and applied), repaired only where the node differs. Nothing is restarted.
# ---------------------------------------------------------------------------


@operation()
def nft_rules_loaded(rules_file: str, family: str = "inet", table: str = "aicluster"):
    """Load ``rules_file`` (``nft -f``) when the live table ``family table`` is missing
    or differs from what nft makes of the file. Only that table is replaced (the file
    deletes and recreates it); other tables are left alone."""
    state = host.get_fact(NftTableDrift, rules_file=rules_file, family=family, table=table)
    if drift.nft_needs_load(state):
        yield f"nft -f {shlex.quote(rules_file)}"
    elif state == "unknown":
        host.noop(f"table {family} {table} loaded; it cannot be compared with {rules_file} "
                  "here (nft could not load the file in a scratch network namespace)")
    else:
        host.noop(f"table {family} {table} is what {rules_file} makes")


@operation()
def sysctls_applied(path: str, settings: Mapping[str, Any]):
    """Apply the drop-in ``path`` (``sysctl -e -q -p``) when a live value differs from
    ``settings``, and record the values the kernel refuses; a value it refused before
    is reported by name, not applied again on every run."""
    read = host.get_fact(SysctlValues, keys=sorted(settings))
    live, refused = read["live"], read["refused"]
    changed = drift.sysctl_drift(settings, live, refused)
    if changed:
        # The keys that differ, in the command pyinfra shows with -v (a comment).
        yield (f"{drift.sysctl_apply_command(path, settings)}  # differs: {' '.join(changed)}")
        return
    kept = drift.sysctl_refused(settings, live, refused)
    if kept:
        host.noop("the kernel refuses " + ", ".join(
            f"{k} = {settings[k]} (kept at {live[k]})" for k in kept) + " here")
    else:
        host.noop(f"the live sysctl values are {path}'s")


@operation()
def modules_loaded(modules: list[str]):
    """modprobe each of ``modules`` the kernel does not have. In a container (which
    cannot load modules) a missing one is reported by name, changing nothing."""
    state = host.get_fact(KernelModulesLoaded, modules=sorted(modules))
    missing = drift.missing_modules(modules, state)
    if not missing:
        host.noop(f"kernel modules loaded: {', '.join(modules)}")
    elif state.get("container"):
        host.log_styled(
            f"kernel modules not loaded: {', '.join(missing)}; this node is a container "
            f"({state['container']}) and cannot load them: load them on its host",
            fg="yellow", log_func=logger.warning)
        host.noop(f"kernel modules {', '.join(missing)} cannot be loaded in a container")
    else:
        for module in missing:
            yield f"modprobe {shlex.quote(module)}"


def remove_absent(wanted: Mapping[str, Iterable[str]], cluster: Cluster) -> None:
    """Take off this host what its record says it ran and *wanted* (the inventory's
    component -> roles for it now) no longer gives it, in this order: each component's
    ``derive.REMOVAL`` checks and commands run (one that fails stops the host before
    anything is taken away), services stopped and disabled, the commands for after
    them, its recorded mounts unmounted and their fstab lines removed, its files
    removed, units reloaded; then, for the components the inventory's
    ``remove_packages`` names, their packages and software removed. Data stays. What
    has no removal built is named in a warning (its services keep running)."""
    recorded = host.get_fact(RecordedComponents) or {}
    if not removals(recorded, wanted):
        return
    uninstall = list(cluster.spec.remove_packages)
    data = cluster.hosts[host.name].data
    family = os_family(host.get_fact(LinuxDistribution)) if uninstall else None
    todo = plan(recorded, wanted, host.get_fact(RecordedMounts) or {}, host=host.name,
                remove_packages=uninstall, family=family,
                settings_of=lambda component: layered(component, data))
    gone = ", ".join(f"{c} ({'all' if w['whole'] else ', '.join(w['roles'])})"
                     for c, w in todo["components"].items())
    logger.info(f"{host.print_prefix}no longer given here: {gone}")
    for component in todo["unbuilt"]:
        logger.warning(f"{host.print_prefix}{component} is no longer given to this host, but "
                       "its removal is not built: its services keep running")
    for command in todo["commands"]:
        server.shell(name=f"Before taking away what is no longer given here: "
                          f"{command.splitlines()[0]}", commands=[command])
    for service in todo["services"]:
        if host.get_fact(UnitLoaded, unit=f"{service}.service"):
            systemd.service(name=f"Stop and disable {service} (no longer given here)",
                            service=service, running=False, enabled=False)
    for command in todo["after"]:
        server.shell(name=f"Once stopped: {command.splitlines()[0]}", commands=[command])
    mounted = (host.get_fact(Mounts) or {}) if todo["unmount"] else {}
    for path in todo["unmount"]:
        if path in mounted:
            server.shell(name=f"Unmount {path} (no longer given here)",
                         commands=[f"umount {shlex.quote(path)}"])
        files.line(name=f"Remove {path} from fstab (no longer given here)", path=FSTAB,
                   line=fstab_regexp(path), present=False, extended_regex=True)
    removed = [(path, files.file(name=f"Remove {path} (no longer given here)", path=path,
                                 present=False))
               for path in todo["files"]]
    units = [op for path, op in removed if path.startswith("/etc/systemd/")]
    if units:
        systemd.daemon_reload(name="Reload systemd units (units removed)",
                              _if=lambda: any(op.did_change() for op in units))
    for service in todo["reload"]:
        if host.get_fact(UnitLoaded, unit=f"{service}.service"):
            systemd.service(name=f"Reload {service} (its configuration for this host removed)",
                            service=service, reloaded=True,
                            _if=lambda: any(op.did_change() for _, op in removed))
    if todo["packages"]:
        _remove_packages(todo["packages"], family)
    for path in todo["software"]:
        if host.get_fact(Link, path=path):
            files.link(name=f"Remove {path} (remove_packages)", path=path, present=False)
        elif host.get_fact(Directory, path=path):
            files.directory(name=f"Remove {path} (remove_packages)", path=path, present=False)
        else:
            files.file(name=f"Remove {path} (remove_packages)", path=path, present=False)


def _remove_packages(packages: list[str], family: str | None) -> None:
    """Remove the packages of what this host no longer runs (remove_packages)."""
    from pyinfra.operations import apt, dnf

    name = f"Remove {', '.join(packages)} (remove_packages)"
    if family == "Debian":
        apt.packages(name=name, packages=packages, present=False)
    else:
        dnf.packages(name=name, packages=packages, present=False)


def record_components(wanted: Mapping[str, Iterable[str]],
                      mounts: Mapping[str, Iterable[str]] | None = None) -> None:
    """Write on this host what the inventory gives it (aicluster.common.absence.RECORD):
    its components and roles, and their network mounts (*mounts*,
    aicluster.common.absence.host_mounts); the last operation of its deploy, read back
    by the next one."""
    files.directory(name=f"aicluster's directory {RECORD_DIR}", path=RECORD_DIR)
    files.put(name=f"Record the components this host runs ({RECORD})",
              src=StringIO(record_text(wanted, mounts)), dest=RECORD, mode="644")


_CHECKED: set[int] = set()


def refuse_breaking_removals(cluster: Cluster) -> None:
    """Stop the whole run, before any host is changed, when taking away what the
    inventory no longer gives would break the cluster (each component's
    ``derive.removal_refusals``). Every host's record is read once, by the first host
    that asks (pyinfra runs deploy.py once per host)."""
    inventory = host.state.inventory
    if id(inventory) in _CHECKED:
        return
    recorded = {h.name: h.get_fact(RecordedComponents) or {}
                for h in inventory.get_active_hosts()}
    wanted = {name: h.roles() for name, h in cluster.hosts.items()}
    problems = refusals(recorded, wanted)
    if problems:
        raise SystemExit("aicluster: " + "\naicluster: ".join(problems))
    _CHECKED.add(id(inventory))
