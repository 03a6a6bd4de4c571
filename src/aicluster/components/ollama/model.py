"""The ollama component's settings (roles/ollama/defaults/main.yml holds their defaults)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator

from aicluster.components.ollama.derive import parse_model
from aicluster.fields import (
    AbsPath,
    AccountName,
    ArtifactPins,
    Count,
    EnvName,
    IPAddressText,
    NetworkChoice,
    Port,
    RelPath,
    Sha256,
    Size,
    Version,
    matches,
    or_empty,
)
from aicluster.inventory import ComponentSettings

#: Settings with a field of their own (ollama_config may not set them).
OWN_FIELDS = {
    "OLLAMA_HOST": "ollama_host / ollama_network / ollama_port",
    "OLLAMA_MODELS": "ollama_models_dir",
    "OLLAMA_KEEP_ALIVE": "ollama_keep_alive",
    "OLLAMA_NUM_PARALLEL": "ollama_num_parallel",
    "OLLAMA_MAX_LOADED_MODELS": "ollama_max_loaded_models",
    "OLLAMA_MAX_QUEUE": "ollama_max_queue",
}
#: A Go duration ("5m", "1h30m", "-1s") or whole seconds ("300", "-1", "0").
DURATION_RE = re.compile(r"^-?([0-9]+|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$")


def _set(version: str) -> str:
    if not version:
        raise ValueError("not set; pin the Ollama release")
    return version


def _keep_alive(value: Any) -> Any:
    if isinstance(value, bool) or not (
        (isinstance(value, int) and value >= -1)
        or (isinstance(value, str) and DURATION_RE.match(value))
    ):
        raise ValueError(f"{value!r} is not a duration (like '5m', '1h30m', '-1' for ever, "
                         "'0', or whole seconds)")
    return value


def _env_key(name: str) -> str:
    if name in OWN_FIELDS:
        raise ValueError(f"set by {OWN_FIELDS[name]}; use that")
    return name


def _env_value(value: Any) -> Any:
    if isinstance(value, (dict, list)) or (
            isinstance(value, str) and re.search(r'["\\\n\r%$]', value)):
        raise ValueError(f"{value!r} may hold no quote, backslash, '%', '$' or line break")
    return value


def _model_name(name: str) -> str:
    if parse_model(name) is None:
        raise ValueError(f"{name!r} is not an Ollama model name ([registry/][namespace/]"
                         "model[:tag], such as 'llama3.2:3b')")
    return name


class Settings(ComponentSettings):
    ollama_version: Annotated[Version, AfterValidator(_set)]
    ollama_artifacts: ArtifactPins
    ollama_install_dir: AbsPath
    ollama_user: AccountName
    ollama_home: AbsPath
    ollama_extra_groups: list[AccountName]
    ollama_network: NetworkChoice
    #: "": the node's address on the Ollama network.
    ollama_host: or_empty(IPAddressText)
    ollama_port: Port
    #: "": the NVMe cache's directory, else <ollama_home>/.ollama/models.
    ollama_models_dir: or_empty(AbsPath)
    #: A duration ("5m", "-1") or whole seconds (a number).
    ollama_keep_alive: Annotated[Any, AfterValidator(_keep_alive)]
    ollama_num_parallel: Count
    #: 0: 3 per GPU.
    ollama_max_loaded_models: Size
    ollama_max_queue: Count
    ollama_config: dict[Annotated[EnvName, AfterValidator(_env_key)],
                        Annotated[Any, AfterValidator(_env_value)]]
    ollama_models: list[Annotated[str, AfterValidator(_model_name)]]
    #: "": none (relative to artifacts_dir).
    ollama_models_archive: or_empty(RelPath)
    ollama_models_archive_sha256: or_empty(Sha256)
    ollama_pull_timeout: Count
    ollama_start_timeout: Count
    #: "": the gateway host's address on the Ollama network.
    ollama_gateway_listen: or_empty(IPAddressText)
    ollama_gateway_keep_default_site: bool
    ollama_gateway_port: Port
    ollama_gateway_max_fails: Size
    ollama_gateway_fail_timeout: Count
    ollama_gateway_connect_timeout: Count
    ollama_gateway_proxy_timeout: Count
    ollama_gateway_keepalive: Count
    ollama_gateway_client_max_body_size: Annotated[str, matches(
        r"^[0-9]+[kKmMgG]?$", "an nginx size (like '0' for no limit, '100m', '1g')")]
