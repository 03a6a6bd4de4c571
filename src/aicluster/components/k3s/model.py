"""The k3s component's settings (roles/k3s/defaults/main.yml holds their defaults)."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from aicluster.fields import ArtifactPins, Count, NetworkChoice, Port, Version, or_empty
from aicluster.inventory import ComponentSettings

#: config.yaml keys aicluster computes (the inventory sets them another way).
COMPUTED_KEYS = {
    "node-name": "the inventory host name",
    "node-ip": "k3s_network",
    "flannel-iface": "k3s_network (the interface holding the node address)",
    "server": "k3s_servers and k3s_registration_address",
    "cluster-init": "the number of k3s_servers (three or more: embedded etcd)",
    "token": "secrets.k3s_token",
    "token-file": "secrets.k3s_token",
    "agent-token": "secrets.k3s_token",
    "agent-token-file": "secrets.k3s_token",
    "node-label": "k3s_node_labels",
    "https-listen-port": "k3s_api_port",
}
#: The config.yaml key of the address k3s listens on (default: the node's address).
BIND_KEY = "bind-address"
LABEL_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
    r"=([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
)
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _set(version: str) -> str:
    if not version:
        raise ValueError("not set; pin the k3s release (like '1.36.4+k3s1', without the "
                         "leading v) in group_data")
    return version


def _config_key(name: str) -> str:
    if not re.match(r"^[a-z0-9][a-z0-9-]*$", name):
        raise ValueError(f"{name!r} is not a k3s setting name (lowercase letters, digits and "
                         "'-', as in 'disable')")
    if name in COMPUTED_KEYS:
        raise ValueError(f"aicluster sets {name} itself (from {COMPUTED_KEYS[name]}); "
                         "remove it here")
    return name


def _value(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)) or (
            isinstance(value, list) and all(isinstance(x, (str, int, float)) for x in value)):
        return value
    raise ValueError(f"{value!r} is not a string, number, boolean or list of strings")


def _bind_address(config: dict[str, Any]) -> dict[str, Any]:
    value = config.get(BIND_KEY)
    if value is not None and not (isinstance(value, str) and _is_ip(value)):
        raise ValueError(f"{BIND_KEY}: {value!r} is not an IP address (k3s listens on one "
                         "address, or on every address with 0.0.0.0 or ::)")
    return config


def _label(label: str) -> str:
    if not LABEL_RE.match(label):
        raise ValueError(f"{label!r} is not a 'key=value' node label (such as "
                         "'topology.kubernetes.io/zone=rack1')")
    return label


def _address_or_name(value: str) -> str:
    if not (_is_ip(value) or HOST_RE.match(value)):
        raise ValueError(f"{value!r} is not an IP address or a DNS name")
    return value


#: config.yaml settings: a k3s flag name to a value (null: drop the key).
K3sConfig = Annotated[
    dict[Annotated[str, AfterValidator(_config_key)], Annotated[Any, AfterValidator(_value)]],
    AfterValidator(_bind_address),
]


class Settings(ComponentSettings):
    k3s_version: Annotated[Version, AfterValidator(_set)]
    k3s_artifacts: ArtifactPins
    k3s_network: NetworkChoice
    #: "": the first server's address on k3s_network.
    k3s_registration_address: or_empty(Annotated[str, AfterValidator(_address_or_name)])
    k3s_api_port: Port
    k3s_default_config: K3sConfig
    k3s_server_default_config: K3sConfig
    k3s_config: K3sConfig
    k3s_node_labels: list[Annotated[str, AfterValidator(_label)]]
    #: "": none (required when a k3s node has GPUs).
    k3s_nvidia_device_plugin_image: or_empty(Annotated[
        str, StringConstraints(pattern=r"^[a-z0-9][A-Za-z0-9._/:@-]*$")])
    k3s_ready_timeout: Count
    k3s_drain_timeout: Count
    k3s_token_bytes: Annotated[int, Field(ge=16)]
