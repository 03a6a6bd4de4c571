"""The one build step pyproject.toml cannot say: the wheel carries the project's files.

roles/, playbooks/, deploy.py, ansible.cfg and the example inventories/ stay at the
repository root (one copy, where Ansible and pyinfra users of a clone find them). A
wheel gets them copied into ``aicluster/share/``, where ``aicluster.PROJECT_ROOT``
looks first; an editable install gets nothing copied and uses the clone's own.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHARED = ("roles", "playbooks", "inventories", "deploy.py", "ansible.cfg")
# Test scenarios and caches are not part of what a user deploys with.
LEFT_OUT = shutil.ignore_patterns("molecule", "__pycache__", "*.pyc", "*.retry")


class BuildPyWithShare(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        share = Path(self.build_lib) / "aicluster" / "share"
        if share.exists():
            shutil.rmtree(share)  # nothing left over from an earlier build
        share.mkdir(parents=True)
        for name in SHARED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, share / name, ignore=LEFT_OUT)
            else:
                shutil.copy2(source, share / name)


setup(cmdclass={"build_py": BuildPyWithShare})
