"""What a node holds of Ray: its Python, the Ray in the target venv, the deployed unit.

Both engines run the very same shell (:func:`command_text`): pyinfra through the
:class:`RayNode` fact, Ansible through the ``ray_fact_command`` the inventory hands it.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from aicluster.components.ray.probe import command_text, parse


class RayNode(FactBase):
    """Ray on a node, as :func:`parse` describes it."""

    #: Its command may run in the one-command read's own shell (accel.memo.shares_shell).
    shares_shell = True

    def default(self) -> dict:
        return {"python": None, "ray": None, "deployed": None, "versions": [], "addresses": None}

    def command(self, python: str, venv: str, install_dir: str) -> str:
        return f"AICLUSTER_RAY_PYTHON={shlex.quote(python)}; {command_text(venv, install_dir)}"

    def process(self, output) -> dict:
        return parse(output)
