"""What a node holds of Ollama: the releases unpacked, the one linked, the models
present, its addresses, and (on a gateway) SELinux's settings for nginx.

Both engines run the very same shell (:func:`command_text`): pyinfra through the
:class:`OllamaNode` fact, Ansible through the ``ollama_fact_command`` the inventory
hands it. Models are read from the manifests in OLLAMA_MODELS, so the answer does not
depend on the service running.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from aicluster.components.ollama.probe import command_text, parse


class OllamaNode(FactBase):
    """Ollama on a node, as :func:`parse` describes it."""

    def default(self) -> dict:
        return parse([])

    def command(self, install_dir: str, bin_link: str, models_dir: str,
                gateway_port: int = 0) -> str:
        return command_text(install_dir, bin_link, models_dir, gateway_port)

    def process(self, output) -> dict:
        return parse(output)
