"""monitoring: the exporters on every node of a monitored cluster, Prometheus,
Alertmanager and the blackbox exporter on the ``monitoring`` hosts, all from the
distribution's packages (Debian 12, Ubuntu).

Defaults: roles/monitoring/defaults/main.yml. Templates: roles/monitoring/templates/.
The rules: roles/monitoring/files/rules/. Every value computed from the inventory
comes from aicluster.components.monitoring.derive (the Ansible role gets the same).

Every node of a cluster with at least one ``monitoring`` host (and no node of a cluster
without one) gets prometheus-node-exporter (pinned by monitoring_node_exporter_version
where set), its command line in /etc/default/prometheus-node-exporter (listening on the
node's monitoring_network address only, the textfile directory, the collectors the
settings name), the inventory's textfile (aicluster_inventory.prom); the Slurm
controllers the Slurm textfile collector (a script and a timer writing
aicluster_slurm.prom every minute, atomically); a node with ``monitoring_ipmi`` the IPMI
exporter; an NVIDIA GPU node dcgm-exporter (NVIDIA's package from the CUDA repository the
nvidia component configures, pinned, our counters file, a drop-in with our command
line); every node the distribution's textfile collectors (prometheus-node-exporter-
collectors and what its scripts need), chrony.py on our own timer writing chrony.prom
every minute, atomically, and, where the node declares NVMe drives, the package's NVMe
timer (nvme.prom every 15 minutes) enabled. A change of a command line or a package
version restarts that exporter alone.

A ``monitoring`` host also gets Prometheus (prometheus.yml, the rules in
/etc/prometheus/rules/aicluster, retention and listen address in /etc/default/prometheus),
Alertmanager (alertmanager.yml; a pair of monitoring hosts gossips), the blackbox
exporter (blackbox.yml), the receivers' secrets and, where MinIO's metrics need one,
MinIO's metrics token (minted on the deploying machine from MinIO's root credentials)
under /etc/prometheus/secrets (mode 0600, never shown). A changed configuration is
checked on the node (promtool check config and check rules, amtool check-config, the
blackbox exporter's --config.check) before the daemon is reloaded; a file that fails its
check fails the deploy, naming it, and nothing is reloaded. A changed command line
restarts the daemon instead.

A monitoring host with ``monitoring_grafana`` (the default) also gets Grafana: the
pinned release (aicluster.artifacts) unpacked in /opt/grafana/<version> with
/opt/grafana/current linked to it, aicluster-grafana.service running it as the system
user ``grafana``, /etc/grafana/grafana.ini (listening on the node's monitoring_network
address, the admin password read from /etc/grafana/admin-password, mode 0600, never
shown), the provisioned data sources (its own Prometheus the default, the other
replica listed) and the dashboards of roles/monitoring/files/dashboards/. A changed
release, configuration, data source or dashboard restarts Grafana alone.

Rocky, Alma and RHEL 9 hosts are refused (no package source verified: roles/monitoring/vars/
RedHat.yml).
"""

from __future__ import annotations

import hashlib
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.context import ctx_state
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FindInFile, Sha1File
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from aicluster import artifacts
from aicluster.common.facts import FileCapabilities, FilesApplied, GlobPaths
from aicluster.common.ops import (
    install_packages,
    owned_directory,
    put_template,
    refuse,
    runs_here,
    system_user,
    this_host,
)
from aicluster.common.settings import NETWORK_ARGS
from aicluster.common.versions import version_matches
from aicluster.components.monitoring.dashboards import DASHBOARDS_SOURCE
from aicluster.components.monitoring.derive import (
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_DEFAULTS,
    ALERTMANAGER_SERVICE,
    BLACKBOX_BIN,
    BLACKBOX_CAPS_REPAIR,
    BLACKBOX_CONFIG,
    BLACKBOX_DEFAULTS,
    BLACKBOX_DROPIN,
    BLACKBOX_DROPIN_DIR,
    BLACKBOX_SERVICE,
    CHRONY_TIMER,
    CHRONY_TIMER_UNIT,
    CHRONY_UNIT,
    DCGM_COUNTERS,
    DCGM_COUNTERS_SOURCE,
    DCGM_EXPORTER_CONFIG_DIR,
    DCGM_EXPORTER_DROPIN,
    DCGM_EXPORTER_DROPIN_DIR,
    DCGM_EXPORTER_PACKAGE,
    DCGM_EXPORTER_PIN,
    DCGM_EXPORTER_SERVICE,
    GRAFANA_CONFIG,
    GRAFANA_CONFIG_DIR,
    GRAFANA_DASHBOARD_PROVIDER,
    GRAFANA_DASHBOARDS_DIR,
    GRAFANA_DATASOURCES,
    GRAFANA_LOG_DIR,
    GRAFANA_PASSWORD_FILE,
    GRAFANA_PROVISIONING,
    GRAFANA_PROVISIONING_DIRS,
    GRAFANA_SERVICE,
    GRAFANA_UNIT,
    GRAFANA_USER,
    IPMI_EXPORTER_DEFAULTS,
    IPMI_EXPORTER_SERVICE,
    MINIO_TOKEN,
    NODE_EXPORTER_DEFAULTS,
    NODE_EXPORTER_PIN,
    NODE_EXPORTER_SERVICE,
    NVME_TIMER_UNIT,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DEFAULTS,
    PROMETHEUS_SERVICE,
    RULES_DIR,
    RULES_SOURCE,
    SECRETS_DIR,
    SLURM_SCRIPT,
    SLURM_TIMER,
    SLURM_TIMER_UNIT,
    SLURM_UNIT,
    STAMP_DIR,
    grafana_admin_password,
    secret_text,
)
from aicluster.render import defaults
from aicluster.secrets import SecretError

#: The account Debian's packages run Prometheus and Alertmanager as.
USER = "prometheus"
#: apt-get moving an exporter's {package} to its pinned version (up or down), keeping our
#: files under /etc (as pyinfra's and Ansible's apt do).
UPGRADE = ("DEBIAN_FRONTEND=noninteractive apt-get install -y --allow-downgrades "
           "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
           "{package}")


class _Secret(StringIO):
    """A secret file's text for ``files.put``: uploaded and hashed as it is; a diff
    (``readlines``) shows a notice instead of its lines."""

    def readlines(self, hint: int = -1) -> list[str]:  # noqa: ARG002 (StringIO's signature)
        return ["(holds a secret: not shown)\n"]


@deploy("monitoring", data_defaults=defaults("monitoring"))
def deploy() -> None:
    if not runs_here("monitoring"):
        return
    cluster, family, v = this_host("monitoring")
    if not v["monitoring_supported"]:
        refuse([f"host {host.name!r}: monitoring: Rocky, Alma and RHEL 9 are not supported: "
                "neither the distribution nor a source aicluster has verified ships "
                "Prometheus and its exporters (docs/components/monitoring.md, "
                "\"Platforms\"); every node of a cluster with a monitoring host runs the "
                "node exporter, so run this node on Debian or Ubuntu, or deploy without a "
                "monitoring group: nothing is changed"])
        return
    secrets: dict[str, str] = {}
    if v["monitoring_is_server"] and v["monitoring_secret_files"]:
        if getattr(ctx_state.get().config, "DIFF", False):
            refuse([f"host {host.name!r}: monitoring: pyinfra's --diff would show the "
                    f"secrets under {SECRETS_DIR} (the receivers', MinIO's metrics token); "
                    "deploy monitoring without --diff"])
            return
        try:
            for entry in v["monitoring_secret_files"]:
                # A receiver's secret as it is; MinIO's metrics token minted from its
                # root credentials (derive.secret_text, as the role's filter does).
                secrets[entry["path"]] = secret_text(entry)
        except (SecretError, UnicodeDecodeError) as exc:
            refuse([f"host {host.name!r}: monitoring: {exc}"])
            return
    grafana_password = _grafana_password(v) if v["monitoring_grafana_enabled"] else None
    if v["monitoring_grafana_enabled"] and grafana_password is None:
        return
    _agents(v, family)
    if v["monitoring_is_server"]:
        _server(v, family, secrets)
    if grafana_password is not None:
        _grafana(v, grafana_password)


# ---------------------------------------------------------------------------
# Every node: the exporters and the textfiles
# ---------------------------------------------------------------------------


def _agents(v: dict[str, Any], family: str) -> None:
    ipmi = bool(v["monitoring_ipmi_exporter_enabled"])
    packages = [*v["monitoring_node_packages"], *(v["monitoring_ipmi_packages"] if ipmi else [])]
    upgraded = _pinned_install(v, family, "the node exporter", "node exporter",
                               "monitoring_node_exporter_version", "aicluster-monitoring.pref.j2",
                               NODE_EXPORTER_PIN, NODE_EXPORTER_SERVICE, packages)
    args = put_template("monitoring", "prometheus-node-exporter.j2", NODE_EXPORTER_DEFAULTS, v,
                        name=f"The node exporter's command line ({NODE_EXPORTER_DEFAULTS})")
    files.directory(name=f"The textfile directory {v['monitoring_textfile_dir']}",
                    path=v["monitoring_textfile_dir"])
    put_template("monitoring", "aicluster_inventory.prom.j2",
                 v["monitoring_inventory_textfile"], v,
                 name="What the inventory declares of this node (aicluster_inventory.prom)")
    restart = [args] + ([upgraded] if upgraded is not None else [])
    systemd.service(name="Restart the node exporter (its command line or version changed)",
                    service=NODE_EXPORTER_SERVICE, restarted=True, _if=any_changed(*restart))
    systemd.service(name="The node exporter running and enabled", service=NODE_EXPORTER_SERVICE,
                    running=True, enabled=True)
    if ipmi:
        ipmi_args = put_template(
            "monitoring", "prometheus-ipmi-exporter.j2", IPMI_EXPORTER_DEFAULTS, v,
            name=f"The IPMI exporter's command line ({IPMI_EXPORTER_DEFAULTS})")
        systemd.service(name="Restart the IPMI exporter (its command line changed)",
                        service=IPMI_EXPORTER_SERVICE, restarted=True, _if=ipmi_args.did_change)
        systemd.service(name="The IPMI exporter running and enabled",
                        service=IPMI_EXPORTER_SERVICE, running=True, enabled=True)
    if v["monitoring_dcgm_exporter_enabled"]:
        _dcgm_exporter(v, family)
    if v["monitoring_slurm_textfile"]:
        _slurm_textfile(v)
    _collectors(v, family)


def _pinned_install(v: dict[str, Any], family: str, label: str, bare: str, setting: str,
                    pref_template: str, pin_path: str, package: str, packages: list[str]):
    """An exporter's package at the version ``setting`` pins (an apt preference at
    ``pin_path``; none when the setting is empty), installed with ``packages``; a node
    that has another version is moved to the pin (up or down, keeping our files). The
    move's operation (its restart's cause), or None when there is none."""
    pin = str(v[setting] or "")
    if pin:
        put_template("monitoring", pref_template, pin_path, v, name=f"Pin {label} at {pin}")
    else:
        files.file(name=f"No {bare} version pin", path=pin_path, present=False)
    installed = sorted((host.get_fact(DebPackages) or {}).get(package) or [])
    install_packages(f"Install {', '.join(packages)}", packages, family)
    if not installed or any(version_matches(i, pin) for i in installed):
        return None
    return server.shell(name=f"Move {label} {installed[-1]} to {pin} ({setting})",
                        commands=[UPGRADE.format(package=package)], **NETWORK_ARGS)


def _dcgm_exporter(v: dict[str, Any], family: str) -> None:
    """dcgm-exporter: NVIDIA's package (from the CUDA repository the nvidia component
    configures) at monitoring_dcgm_exporter_version, our counters file, and a drop-in
    giving NVIDIA's unit our command line. A changed command line, counters file or
    version restarts dcgm-exporter alone."""
    upgraded = _pinned_install(v, family, "dcgm-exporter", "dcgm-exporter",
                               "monitoring_dcgm_exporter_version",
                               "aicluster-dcgm-exporter.pref.j2", DCGM_EXPORTER_PIN,
                               DCGM_EXPORTER_PACKAGE, v["monitoring_dcgm_packages"])
    files.directory(name=f"dcgm-exporter's configuration directory {DCGM_EXPORTER_CONFIG_DIR}",
                    path=DCGM_EXPORTER_CONFIG_DIR)
    counters = files.put(name=f"dcgm-exporter's counters ({DCGM_COUNTERS})",
                         src=str(DCGM_COUNTERS_SOURCE), dest=DCGM_COUNTERS, mode="644",
                         user="root", group="root")
    files.directory(name=f"dcgm-exporter's drop-in directory {DCGM_EXPORTER_DROPIN_DIR}",
                    path=DCGM_EXPORTER_DROPIN_DIR)
    dropin = put_template("monitoring", "aicluster-dcgm-exporter.conf.j2", DCGM_EXPORTER_DROPIN,
                          v, name=f"dcgm-exporter's command line ({DCGM_EXPORTER_DROPIN})")
    systemd.daemon_reload(name="Reload systemd units (dcgm-exporter's drop-in changed)",
                          _if=dropin.did_change)
    restart = [dropin, counters] + ([upgraded] if upgraded is not None else [])
    systemd.service(name="Restart dcgm-exporter (its command line, counters or version "
                         "changed)",
                    service=DCGM_EXPORTER_SERVICE, restarted=True, _if=any_changed(*restart))
    systemd.service(name="dcgm-exporter running and enabled", service=DCGM_EXPORTER_SERVICE,
                    running=True, enabled=True)


def _timer(v: dict[str, Any], what: str, unit_path: str, timer_path: str, timer_unit: str,
           unit_note: str = "") -> None:
    """A textfile collector's service and its timer (every minute), from the templates
    named after them; systemd reloaded when either changed, the timer running."""
    unit = put_template("monitoring", f"{unit_path.rsplit('/', 1)[1]}.j2", unit_path, v,
                        name=f"The {what} textfile collector's unit{unit_note}")
    timer = put_template("monitoring", f"{timer_path.rsplit('/', 1)[1]}.j2", timer_path, v,
                         name=f"The {what} textfile collector's timer (every minute)")
    systemd.daemon_reload(name=f"Reload systemd units (the {what} textfile collector changed)",
                          _if=any_changed(unit, timer))
    systemd.service(name=f"The {what} textfile collector's timer running and enabled",
                    service=timer_unit, running=True, enabled=True)


def _slurm_textfile(v: dict[str, Any]) -> None:
    put_template("monitoring", "aicluster-slurm-textfile.j2", SLURM_SCRIPT, v, mode="755",
                 name="The Slurm textfile collector (aicluster-slurm-textfile)")
    _timer(v, "Slurm", SLURM_UNIT, SLURM_TIMER, SLURM_TIMER_UNIT)


def _collectors(v: dict[str, Any], family: str) -> None:
    """The distribution's textfile collectors: chrony.py on our own timer (every node:
    base runs chrony on each), the package's NVMe timer where the node declares NVMe
    drives. The package's postinst enables and starts its timers; the NVMe timer's
    Condition (/dev/nvme*) keeps it idle on a node without one, so it is enabled here,
    and started only when that enabling changed something (a timer whose Condition fails
    never reads as running: asking for it would start it again on every run)."""
    install_packages(f"Install the textfile collectors "
                     f"({', '.join(v['monitoring_collector_packages'])})",
                     v["monitoring_collector_packages"], family)
    _timer(v, "chrony", CHRONY_UNIT, CHRONY_TIMER, CHRONY_TIMER_UNIT,
           unit_note=" (chrony.py to chrony.prom)")
    if v["monitoring_nvme_textfile"]:
        enabled = systemd.service(name="The NVMe textfile collector's timer enabled "
                                       f"({NVME_TIMER_UNIT}, every 15 minutes)",
                                  service=NVME_TIMER_UNIT, running=None, enabled=True)
        systemd.service(name="Start the NVMe textfile collector's timer (it was not enabled)",
                        service=NVME_TIMER_UNIT, running=True, _if=enabled.did_change)


# ---------------------------------------------------------------------------
# monitoring hosts: Prometheus, Alertmanager, the blackbox exporter
# ---------------------------------------------------------------------------


def _server(v: dict[str, Any], family: str, secrets: dict[str, str]) -> None:
    caps = host.get_fact(FileCapabilities, path=BLACKBOX_BIN)
    installed = install_packages("Install Prometheus, Alertmanager and the blackbox exporter",
                                 v["monitoring_server_packages"], family)
    storage = str(v["monitoring_storage_path"]).rstrip("/")
    for path in (f"{storage}/metrics2", f"{storage}/alertmanager"):
        owned_directory(f"Monitoring data directory {path}", path, USER)
    secret_ops = []
    am_secret_ops = []  # the receivers' (MinIO's metrics token is Prometheus' alone)
    if secrets:
        files.directory(name=f"The receivers' secrets directory {SECRETS_DIR}", path=SECRETS_DIR,
                        user="root", group=USER, mode="750")
    for path, value in secrets.items():
        secret_ops.append(files.put(
            name=f"Secret {path} (mode 0600, never shown)", src=_Secret(value), dest=path,
            user=USER, group=USER, mode="600"))
        if path != MINIO_TOKEN:
            am_secret_ops.append(secret_ops[-1])

    # Prometheus: its configuration and the rules, checked on the node before a reload.
    prom_args = put_template("monitoring", "prometheus.j2", PROMETHEUS_DEFAULTS, v,
                             name=f"Prometheus' command line ({PROMETHEUS_DEFAULTS})")
    config = put_template("monitoring", "prometheus.yml.j2", PROMETHEUS_CONFIG, v,
                          name=f"Prometheus' configuration ({PROMETHEUS_CONFIG})")
    files.directory(name=f"The rules directory {RULES_DIR}", path=RULES_DIR)
    wanted = [f"{RULES_DIR}/{name}" for name in v["monitoring_rule_files"]]
    rules = [files.put(name=f"Rules {path}", src=str(RULES_SOURCE / path.rsplit("/", 1)[1]),
                       dest=path, mode="644", user="root", group="root") for path in wanted]
    present = host.get_fact(GlobPaths, pattern=f"{RULES_DIR}/*.yml") or []
    rules += [files.file(name=f"Remove {path} (no longer in the alert pack)", path=path,
                         present=False) for path in present if path not in wanted]
    _take_up(v, "prometheus", "Prometheus", PROMETHEUS_SERVICE, prom_args,
             [config, *rules, *secret_ops],
             "Check Prometheus' configuration and rules (promtool check config, check rules)",
             [f"promtool check config {PROMETHEUS_CONFIG}",
              f"promtool check rules {' '.join(wanted)}"])

    # Alertmanager.
    am_args = put_template("monitoring", "prometheus-alertmanager.j2", ALERTMANAGER_DEFAULTS, v,
                           name=f"Alertmanager's command line ({ALERTMANAGER_DEFAULTS})")
    am_config = put_template("monitoring", "alertmanager.yml.j2", ALERTMANAGER_CONFIG, v,
                             name=f"Alertmanager's configuration ({ALERTMANAGER_CONFIG})")
    _take_up(v, "alertmanager", "Alertmanager", ALERTMANAGER_SERVICE, am_args,
             [am_config, *am_secret_ops],
             "Check Alertmanager's configuration (amtool check-config)",
             [f"amtool check-config {ALERTMANAGER_CONFIG}"])

    # The blackbox exporter.
    bb_args = put_template("monitoring", "prometheus-blackbox-exporter.j2", BLACKBOX_DEFAULTS, v,
                           name=f"The blackbox exporter's command line ({BLACKBOX_DEFAULTS})")
    bb_config = put_template("monitoring", "blackbox.yml.j2", BLACKBOX_CONFIG, v,
                             name=f"The blackbox exporter's modules ({BLACKBOX_CONFIG})")
    files.directory(name=f"The blackbox exporter's drop-in directory {BLACKBOX_DROPIN_DIR}",
                    path=BLACKBOX_DROPIN_DIR)
    dropin = put_template("monitoring", "aicluster-icmp.conf.j2", BLACKBOX_DROPIN, v,
                          name="The blackbox exporter may send ICMP (CAP_NET_RAW, "
                               f"{BLACKBOX_DROPIN})")
    systemd.daemon_reload(name="Reload systemd units (the blackbox exporter's drop-in "
                               "changed)", _if=dropin.did_change)
    # Read before the install: checked again whenever the package was (re)installed.
    empty_caps = caps is not None and "cap_net_raw" not in caps
    repaired = server.shell(
        name=f"No empty file capability on {BLACKBOX_BIN} (it would void the drop-in's "
             "CAP_NET_RAW)",
        commands=[BLACKBOX_CAPS_REPAIR],
        _if=lambda: empty_caps or installed.did_change())
    _take_up(v, "blackbox", "the blackbox exporter", BLACKBOX_SERVICE, bb_args, [bb_config],
             "Check the blackbox exporter's modules (--config.check)",
             [f"prometheus-blackbox-exporter --config.check --config.file={BLACKBOX_CONFIG}"],
             also_restart=(dropin, repaired))


def _pending(v: dict[str, Any], name: str) -> bool:
    """Whether the daemon *name* has not taken up its files as they are on the node
    (derive.stamps): a run that wrote them stopped before (a check that failed, a lost
    connection), so this run must check them and restart it, though nothing it writes
    changes."""
    stamp = v["monitoring_stamps"][name]
    return not host.get_fact(FilesApplied, paths=stamp["files"], stamp=stamp["path"])


def _either(pending: bool, changed):
    """An ``_if`` that holds when the daemon's files are *pending* or *changed* now."""
    return lambda: pending or changed()


def _take_up(v: dict[str, Any], name: str, label: str, service: str, args, config: list,
             check_name: str, check: list[str], also_restart=()) -> None:
    """A daemon takes up its files: whatever changed (its command line ``args``, its
    ``config`` operations) is checked on the node first (the ``check`` commands, which
    stop the host when they fail); then a changed command line (or unit drop-in,
    ``also_restart``) restarts the daemon and a changed configuration (and nothing
    restarted) reloads it. A daemon whose files a stopped run left unapplied (its stamp,
    derive.stamps, :func:`_pending`) is checked and restarted, and once it has taken its
    files up the stamp records them."""
    stamp, pending = v["monitoring_stamps"][name], _pending(v, name)
    config_changed = any_changed(*config)
    server.shell(name=check_name, commands=check, _if=_either(pending, any_changed(args, *config)))
    restart = _either(pending, any_changed(args, *also_restart))
    systemd.service(name=f"Restart {label} (its command line changed, or a run stopped "
                         "before it took its files up)", service=service,
                    restarted=True, _if=restart)
    systemd.service(name=f"{label[0].upper()}{label[1:]} running and enabled", service=service,
                    running=True, enabled=True)
    systemd.service(name=f"Reload {label} (its configuration changed)", service=service,
                    reloaded=True, _if=[config_changed, lambda: not restart()])
    server.shell(name=f"Record the files {label} runs with ({stamp['path']})",
                 commands=[f"mkdir -p {STAMP_DIR} && {stamp['digest']} > {stamp['path']}"],
                 _if=_either(pending, lambda: restart() or config_changed()))


# ---------------------------------------------------------------------------
# monitoring hosts: Grafana
# ---------------------------------------------------------------------------


def _grafana_password(v: dict[str, Any]) -> str | None:
    """Grafana's admin password, read on the deploying machine (the secret file made
    once where the inventory names none); None, the host refused, when it cannot be
    had, or when pyinfra's --diff would show the node's old one."""
    name = v["monitoring_grafana_admin_keys_name"]
    try:
        password = grafana_admin_password(v["monitoring_grafana_admin_ref"], name,
                                          int(v["monitoring_grafana_admin_keys_bytes"]))
    except SecretError as exc:
        refuse([f"host {host.name!r}: monitoring: {exc}"])
        return None
    if getattr(ctx_state.get().config, "DIFF", False):
        have = host.get_fact(Sha1File, path=GRAFANA_PASSWORD_FILE)
        if have is not None and have != hashlib.sha1(password.encode()).hexdigest():
            refuse([f"host {host.name!r}: monitoring: pyinfra's --diff would show Grafana's "
                    f"old admin password ({GRAFANA_PASSWORD_FILE}, secrets.{name} changed); "
                    "deploy monitoring without --diff"])
            return None
    return password


def _grafana(v: dict[str, Any], password: str) -> None:
    """Grafana from its pinned release: unpacked beside the one running, the ``current``
    link moved to it; the unit, grafana.ini, the admin password (0600, never shown), the
    provisioned data sources and dashboards. Any of them changed restarts Grafana alone."""
    version, release = v["monitoring_grafana_version"], v["monitoring_grafana_release_dir"]
    art = v["monitoring_artifact_files"]["grafana"]
    server.group(name=f"Group {GRAFANA_USER}", group=GRAFANA_USER, system=True)
    system_user(name=f"Grafana user {GRAFANA_USER}", user=GRAFANA_USER, group=GRAFANA_USER,
                system=True, home=v["monitoring_grafana_data_dir"], shell="/usr/sbin/nologin")
    files.directory(name=f"Grafana {version} directory", path=release)
    archive = artifacts.put("monitoring", "grafana", f"{release}/{art['filename']}", mode="644",
                            op_name=f"Grafana {version} release archive")
    # The same command as Ansible's (derive.grafana_unpack_command); the marker, written
    # last, holds the archive's sha256 once the unpack is complete.
    unpack = v["monitoring_grafana_unpack_command"]
    if host.get_fact(FindInFile, path=v["monitoring_grafana_marker"], pattern=art["sha256"]):
        host.noop(f"Grafana {version} is unpacked in {release}")
        unpacked = server.shell(name=f"Unpack Grafana {version} (its archive changed)",
                                commands=[unpack], _if=archive.did_change)
    else:
        unpacked = server.shell(name=f"Unpack Grafana {version}", commands=[unpack])
    link = files.link(name=f"{v['monitoring_grafana_current']} is Grafana {version}",
                      path=v["monitoring_grafana_current"], target=release)
    owned_directory(f"Grafana's data directory {v['monitoring_grafana_data_dir']}",
                    v["monitoring_grafana_data_dir"], GRAFANA_USER, mode="750")
    owned_directory(f"Grafana's log directory {GRAFANA_LOG_DIR}", GRAFANA_LOG_DIR,
                    GRAFANA_USER, mode="750")
    for path in (GRAFANA_CONFIG_DIR, GRAFANA_PROVISIONING, *GRAFANA_PROVISIONING_DIRS,
                 GRAFANA_DASHBOARDS_DIR.rsplit("/", 1)[0], GRAFANA_DASHBOARDS_DIR):
        files.directory(name=f"Grafana's directory {path}", path=path, user="root",
                        group=GRAFANA_USER, mode="750")
    secret = files.put(name=f"Grafana's admin password {GRAFANA_PASSWORD_FILE} (mode 0600, "
                            "never shown)", src=_Secret(password), dest=GRAFANA_PASSWORD_FILE,
                       user=GRAFANA_USER, group=GRAFANA_USER, mode="600")
    config = [
        put_template("monitoring", "grafana.ini.j2", GRAFANA_CONFIG, v, mode="640",
                     group=GRAFANA_USER, name=f"Grafana's configuration ({GRAFANA_CONFIG})"),
        put_template("monitoring", "grafana-datasources.yaml.j2", GRAFANA_DATASOURCES, v,
                     mode="640", group=GRAFANA_USER,
                     name=f"Grafana's data sources ({GRAFANA_DATASOURCES})"),
        put_template("monitoring", "grafana-dashboards.yaml.j2", GRAFANA_DASHBOARD_PROVIDER, v,
                     mode="640", group=GRAFANA_USER,
                     name=f"Grafana's dashboard provider ({GRAFANA_DASHBOARD_PROVIDER})"),
    ]
    wanted = [f"{GRAFANA_DASHBOARDS_DIR}/{n}" for n in v["monitoring_grafana_dashboard_files"]]
    boards = [files.put(name=f"Dashboard {path}",
                        src=str(DASHBOARDS_SOURCE / path.rsplit("/", 1)[1]), dest=path,
                        mode="644", user="root", group="root") for path in wanted]
    present = host.get_fact(GlobPaths, pattern=f"{GRAFANA_DASHBOARDS_DIR}/*.json") or []
    boards += [files.file(name=f"Remove the dashboard {path} (no longer shipped)", path=path,
                          present=False) for path in present if path not in wanted]
    unit = put_template("monitoring", "aicluster-grafana.service.j2", GRAFANA_UNIT, v,
                        name=f"Grafana's unit ({GRAFANA_UNIT})")
    systemd.daemon_reload(name="Reload systemd units (Grafana's unit changed)",
                          _if=unit.did_change)
    systemd.service(name="Restart Grafana (its release, configuration, data sources or "
                         "dashboards changed)", service=GRAFANA_SERVICE, restarted=True,
                    _if=any_changed(unpacked, link, unit, secret, *config, *boards))
    systemd.service(name="Grafana running and enabled", service=GRAFANA_SERVICE, running=True,
                    enabled=True)
