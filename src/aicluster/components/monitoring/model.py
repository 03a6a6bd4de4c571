"""The monitoring component's settings (roles/monitoring/defaults/main.yml holds their
defaults). What depends on more than one value or on the rest of the inventory (a route
naming a receiver that is not declared, retention against the declared disk, a
dcgm-exporter asked on a host without GPUs) is checked by
:func:`aicluster.components.monitoring.derive.validate`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from aicluster.fields import (
    AbsPath,
    ArtifactPins,
    Port,
    SecretName,
    Size,
    Version,
    listed_once,
    matches,
    one_message,
)
from aicluster.inventory import ComponentSettings

#: The kinds of receiver aicluster writes into alertmanager.yml.
RECEIVER_TYPES = ("webhook", "email", "none")
#: The blackbox modules an extra probe may use (blackbox.yml always has them).
PROBE_MODULES = ("http_2xx", "tcp_connect", "icmp")

#: A receiver's (or a probe's) name: Alertmanager accepts any text; these stay readable
#: in a label and a file name.
Name = Annotated[str, matches(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                              "a name (letters, digits, '_', '.', '-'; at most 64)")]
#: A Prometheus duration as Alertmanager's timers take it ("30s", "5m", "4h", "1h30m").
Duration = Annotated[str, matches(r"^([0-9]+(ms|s|m|h|d|w|y))+$",
                                  "a Prometheus duration (like '30s', '5m', '4h')")]
Url = Annotated[str, matches(r"^https?://[^\s\"'\\]+$", "an http(s) URL")]
EmailAddresses = Annotated[str, matches(
    r"^[^@\s,\"]+@[^@\s,\"]+(\s*,\s*[^@\s,\"]+@[^@\s,\"]+)*$",
    "an e-mail address (or several, comma-separated)")]
HostPort = Annotated[str, matches(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):[0-9]{1,5}$",
                                  "host:port (like 'smtp.example.org:587')")]
ReceiverType = Annotated[Literal["webhook", "email", "none"], one_message(
    "{value!r} is not a receiver type (webhook, email or none)")]
ProbeModule = Annotated[Literal["http_2xx", "tcp_connect", "icmp"], one_message(
    "{value!r} is not a probe module (http_2xx, tcp_connect or icmp)")]
Severity = Annotated[str, matches(r"^[a-z][a-z0-9_]{0,31}$",
                                  "a severity (lowercase, like 'critical'; or 'default')")]

#: The fields each receiver type takes (besides name, type and send_resolved).
_TYPE_FIELDS = {
    "webhook": {"url", "url_key_name"},
    "email": {"to", "from_", "smarthost", "auth_username", "auth_key_name", "require_tls"},
    "none": set(),
}


class Receiver(BaseModel):
    """Where Alertmanager sends notifications: a webhook (its URL, or the name of the
    secret holding it), e-mail through a smarthost (the SMTP password by reference
    only), or none."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    name: Name
    type: ReceiverType
    send_resolved: bool | None = None
    url: Url | None = None
    url_key_name: SecretName | None = None
    to: EmailAddresses | None = None
    from_: Annotated[str, matches(r"^[^@\s,\"]+@[^@\s,\"]+$", "an e-mail address")] | None = \
        Field(default=None, alias="from")
    smarthost: HostPort | None = None
    auth_username: Annotated[str, matches(r"^[^\s\"\\]{1,128}$",
                                          "a user name (no spaces or quotes)")] | None = None
    auth_key_name: SecretName | None = None
    require_tls: bool | None = None

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> Receiver:
        given = {f for f in _TYPE_FIELDS["webhook"] | _TYPE_FIELDS["email"]
                 if getattr(self, f) is not None}
        wrong = sorted(given - _TYPE_FIELDS[self.type])
        if wrong:
            names = ", ".join("from" if f == "from_" else f for f in wrong)
            raise ValueError(f"a {self.type} receiver takes no {names}")
        if self.type == "webhook" and (self.url is None) == (self.url_key_name is None):
            raise ValueError("a webhook receiver needs exactly one of url (the URL) and "
                             "url_key_name (the secret holding it)")
        if self.type == "email":
            missing = [f for f, v in (("to", self.to), ("from", self.from_),
                                      ("smarthost", self.smarthost)) if v is None]
            if missing:
                raise ValueError(f"an email receiver needs {', '.join(missing)}")
            if self.auth_key_name is not None and self.auth_username is None:
                raise ValueError("auth_key_name (the SMTP password's secret) needs "
                                 "auth_username")
        return self


class Probe(BaseModel):
    """A further blackbox probe: its name (the ``probe`` label), module and target."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Name
    module: ProbeModule
    target: Annotated[str, matches(r"^[^\s\"'\\]+$", "a probe target (no spaces or quotes)")]

    @model_validator(mode="after")
    def _target_fits(self) -> Probe:
        url = self.target.startswith(("http://", "https://"))
        if self.module == "http_2xx" and not url:
            raise ValueError(f"target: {self.target!r}: an http_2xx probe's target is an "
                             "http(s) URL")
        if self.module == "tcp_connect" and (url or ":" not in self.target):
            raise ValueError(f"target: {self.target!r}: a tcp_connect probe's target is "
                             "host:port")
        if self.module == "icmp" and (url or "/" in self.target):
            raise ValueError(f"target: {self.target!r}: an icmp probe's target is a host "
                             "name or an address")
        return self


class Settings(ComponentSettings):
    monitoring_network: Literal["management", "fabric", "storage", "ib"]
    monitoring_node_exporter_port: Port
    monitoring_dcgm_exporter_port: Port
    monitoring_ipmi_exporter_port: Port
    monitoring_blackbox_port: Port
    monitoring_prometheus_port: Port
    monitoring_alertmanager_port: Port
    monitoring_alertmanager_cluster_port: Port
    monitoring_grafana_port: Port
    #: Seconds.
    monitoring_scrape_interval: Annotated[int, Field(ge=1, le=3600)]
    monitoring_evaluation_interval: Annotated[int, Field(ge=1, le=3600)]
    monitoring_retention_days: Annotated[int, Field(ge=1, le=36500)]
    #: 0: no size limit.
    monitoring_retention_size_gb: Size
    monitoring_storage_path: AbsPath
    #: 0: not stated (refused on a monitoring host).
    monitoring_storage_gb: Size
    monitoring_receivers: Annotated[list[Receiver], listed_once(lambda r: r.name)]
    monitoring_route: dict[Severity, Name]
    monitoring_alert_group_wait: Duration
    monitoring_alert_group_interval: Duration
    monitoring_alert_repeat_interval: Duration
    monitoring_ipmi: bool
    #: None: on every NVIDIA GPU node.
    monitoring_dcgm_exporter: bool | None
    #: "": the repository's newest, not pinned.
    monitoring_dcgm_exporter_version: Version
    #: "": the distribution's.
    monitoring_node_exporter_version: Version
    monitoring_node_exporter_collectors: Annotated[
        list[Annotated[str, matches(r"^[a-z][a-z0-9_]*$",
                                    "a node exporter collector name (like 'mountstats')")]],
        listed_once()]
    monitoring_textfile_dir: AbsPath
    monitoring_grafana_admin_keys_name: SecretName
    #: Grafana on this host (a monitoring host).
    monitoring_grafana: bool
    monitoring_grafana_version: Version
    monitoring_grafana_release_base_url: Annotated[str, matches(
        r"^https?://[^\s{}]*[^\s{}/]$",
        "an http(s) URL with no trailing '/' (where Grafana's release files are)")]
    monitoring_grafana_install_dir: AbsPath
    monitoring_grafana_data_dir: AbsPath
    monitoring_grafana_admin_user: Annotated[str, matches(
        r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$",
        "a Grafana login (letters, digits, '_', '.', '@', '-'; at most 64)")]
    monitoring_grafana_admin_keys_bytes: Annotated[int, Field(ge=16, le=4096)]
    monitoring_artifacts: ArtifactPins
    monitoring_blackbox_targets: Annotated[list[Probe], listed_once(lambda p: p.name)]
