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
exporter. A change of a command line or a package version restarts that exporter alone.

A ``monitoring`` host also gets Prometheus (prometheus.yml, the rules in
/etc/prometheus/rules/aicluster, retention and listen address in /etc/default/prometheus),
Alertmanager (alertmanager.yml; a pair of monitoring hosts gossips), the blackbox
exporter (blackbox.yml) and the receivers' secrets under /etc/prometheus/secrets (mode
0600, never shown). A changed configuration is checked on the node (promtool check
config and check rules, amtool check-config, the blackbox exporter's --config.check)
before the daemon is reloaded; a file that fails its check fails the deploy, naming it,
and nothing is reloaded. A changed command line restarts the daemon instead.

Not deployed yet: dcgm-exporter and Grafana (docs/components/monitoring.md). Rocky,
Alma and RHEL 9 hosts are refused (no package source verified: roles/monitoring/vars/
RedHat.yml).
"""

from __future__ import annotations

from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.context import ctx_state
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from aicluster.common.facts import GlobPaths
from aicluster.common.ops import (
    install_packages,
    owned_directory,
    put_template,
    refuse,
    runs_here,
    this_host,
)
from aicluster.common.settings import NETWORK_ARGS
from aicluster.common.versions import version_matches
from aicluster.components.monitoring.derive import (
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_DEFAULTS,
    ALERTMANAGER_SERVICE,
    BLACKBOX_CONFIG,
    BLACKBOX_DEFAULTS,
    BLACKBOX_DROPIN,
    BLACKBOX_DROPIN_DIR,
    BLACKBOX_SERVICE,
    IPMI_EXPORTER_DEFAULTS,
    IPMI_EXPORTER_SERVICE,
    NODE_EXPORTER_DEFAULTS,
    NODE_EXPORTER_PIN,
    NODE_EXPORTER_SERVICE,
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
)
from aicluster.render import defaults
from aicluster.secrets import SecretError, read_secret

#: The account Debian's packages run Prometheus and Alertmanager as.
USER = "prometheus"
#: apt-get moving the node exporter to the pinned version (up or down), keeping our
#: /etc/default file (as pyinfra's and Ansible's apt do).
UPGRADE = ("DEBIAN_FRONTEND=noninteractive apt-get install -y --allow-downgrades "
           "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
           "prometheus-node-exporter")


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
                    f"receivers' secrets under {SECRETS_DIR}; deploy monitoring without "
                    "--diff"])
            return
        try:
            for entry in v["monitoring_secret_files"]:
                secrets[entry["path"]] = read_secret(
                    {entry["secret"]: entry["ref"]}, entry["secret"]).decode()
        except (SecretError, UnicodeDecodeError) as exc:
            refuse([f"host {host.name!r}: monitoring: {exc}"])
            return
    _agents(v, family)
    if v["monitoring_is_server"]:
        _server(v, family, secrets)


# ---------------------------------------------------------------------------
# Every node: the exporters and the textfiles
# ---------------------------------------------------------------------------


def _agents(v: dict[str, Any], family: str) -> None:
    pin = str(v["monitoring_node_exporter_version"] or "")
    if pin:
        put_template("monitoring", "aicluster-monitoring.pref.j2", NODE_EXPORTER_PIN, v,
                     name=f"Pin the node exporter at {pin}")
    else:
        files.file(name="No node exporter version pin", path=NODE_EXPORTER_PIN, present=False)
    ipmi = bool(v["monitoring_ipmi_exporter_enabled"])
    packages = [*v["monitoring_node_packages"], *(v["monitoring_ipmi_packages"] if ipmi else [])]
    installed = sorted((host.get_fact(DebPackages) or {}).get(NODE_EXPORTER_SERVICE) or [])
    install_packages(f"Install {', '.join(packages)}", packages, family)
    upgraded = None
    if installed and not any(version_matches(i, pin) for i in installed):
        upgraded = server.shell(
            name=f"Move the node exporter {installed[-1]} to {pin} "
                 "(monitoring_node_exporter_version)",
            commands=[UPGRADE],
            **NETWORK_ARGS,
        )
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
    if v["monitoring_slurm_textfile"]:
        _slurm_textfile(v)


def _slurm_textfile(v: dict[str, Any]) -> None:
    put_template("monitoring", "aicluster-slurm-textfile.j2", SLURM_SCRIPT, v, mode="755",
                 name="The Slurm textfile collector (aicluster-slurm-textfile)")
    unit = put_template("monitoring", "aicluster-slurm-textfile.service.j2", SLURM_UNIT, v,
                        name="The Slurm textfile collector's unit")
    timer = put_template("monitoring", "aicluster-slurm-textfile.timer.j2", SLURM_TIMER, v,
                         name="The Slurm textfile collector's timer (every minute)")
    systemd.daemon_reload(name="Reload systemd units (the Slurm textfile collector changed)",
                          _if=any_changed(unit, timer))
    systemd.service(name="The Slurm textfile collector's timer running and enabled",
                    service=SLURM_TIMER_UNIT, running=True, enabled=True)


# ---------------------------------------------------------------------------
# monitoring hosts: Prometheus, Alertmanager, the blackbox exporter
# ---------------------------------------------------------------------------


def _server(v: dict[str, Any], family: str, secrets: dict[str, str]) -> None:
    install_packages("Install Prometheus, Alertmanager and the blackbox exporter",
                     v["monitoring_server_packages"], family)
    storage = str(v["monitoring_storage_path"]).rstrip("/")
    for path in (f"{storage}/metrics2", f"{storage}/alertmanager"):
        owned_directory(f"Monitoring data directory {path}", path, USER)
    secret_ops = []
    if secrets:
        files.directory(name=f"The receivers' secrets directory {SECRETS_DIR}", path=SECRETS_DIR,
                        user="root", group=USER, mode="750")
    for path, value in secrets.items():
        secret_ops.append(files.put(
            name=f"Secret {path} (mode 0600, never shown)", src=_Secret(value), dest=path,
            user=USER, group=USER, mode="600"))

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
    prom_config = any_changed(config, *rules, *secret_ops)
    server.shell(
        name="Check Prometheus' configuration and rules (promtool check config, check rules)",
        commands=[f"promtool check config {PROMETHEUS_CONFIG}",
                  f"promtool check rules {' '.join(wanted)}"],
        _if=any_changed(prom_args, config, *rules, *secret_ops),
    )
    _restart_or_reload("Prometheus", PROMETHEUS_SERVICE, prom_args, prom_config)

    # Alertmanager.
    am_args = put_template("monitoring", "prometheus-alertmanager.j2", ALERTMANAGER_DEFAULTS, v,
                           name=f"Alertmanager's command line ({ALERTMANAGER_DEFAULTS})")
    am_config = put_template("monitoring", "alertmanager.yml.j2", ALERTMANAGER_CONFIG, v,
                             name=f"Alertmanager's configuration ({ALERTMANAGER_CONFIG})")
    am_changed = any_changed(am_config, *secret_ops)
    server.shell(name="Check Alertmanager's configuration (amtool check-config)",
                 commands=[f"amtool check-config {ALERTMANAGER_CONFIG}"],
                 _if=any_changed(am_args, am_config, *secret_ops))
    _restart_or_reload("Alertmanager", ALERTMANAGER_SERVICE, am_args, am_changed)

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
    server.shell(
        name="Check the blackbox exporter's modules (--config.check)",
        commands=[f"prometheus-blackbox-exporter --config.check --config.file={BLACKBOX_CONFIG}"],
        _if=any_changed(bb_args, bb_config))
    _restart_or_reload("the blackbox exporter", BLACKBOX_SERVICE, bb_args,
                       any_changed(bb_config), also_restart=(dropin,))


def _restart_or_reload(label: str, service: str, args, config_changed,
                       also_restart=()) -> None:
    """A changed command line (or unit drop-in, ``also_restart``) restarts the daemon; a
    changed configuration (and nothing restarted) reloads it. Both run after the check,
    which stops the host when it fails."""
    restart = any_changed(args, *also_restart)
    systemd.service(name=f"Restart {label} (its command line changed)", service=service,
                    restarted=True, _if=restart)
    systemd.service(name=f"{label[0].upper()}{label[1:]} running and enabled", service=service,
                    running=True, enabled=True)
    systemd.service(name=f"Reload {label} (its configuration changed)", service=service,
                    reloaded=True, _if=[config_changed, lambda: not restart()])
