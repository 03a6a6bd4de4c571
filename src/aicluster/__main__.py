"""``python -m aicluster``: the ``aicluster`` command (Ansible's playbooks/check.yml runs
it with the Python that runs Ansible)."""

from aicluster.cli import main

main(prog_name="aicluster")
