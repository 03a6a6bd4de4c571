"""aicluster: turn bare-metal machines into an AI cluster from one inventory file."""

from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent


def _project_root() -> Path:
    """Where the project's files are: roles/ (defaults and templates shared by both
    engines), playbooks/, deploy.py, ansible.cfg and the example inventories/.

    An installed wheel carries them inside the package, in ``aicluster/share/`` (setup.py
    copies them there at build time); a clone, or an editable install of one, has them
    at the repository root, two levels above ``src/aicluster/``."""
    shipped = PACKAGE_DIR / "share"
    return shipped if (shipped / "roles").is_dir() else PACKAGE_DIR.parents[1]


# The one lookup: everything below is found from here.
PROJECT_ROOT = _project_root()
ROLES_DIR = PROJECT_ROOT / "roles"
PLAYBOOKS_DIR = PROJECT_ROOT / "playbooks"
INVENTORIES_DIR = PROJECT_ROOT / "inventories"
# pyinfra's entry file: ``pyinfra INVENTORY <DEPLOY_FILE>`` (``aicluster path deploy``).
DEPLOY_FILE = PROJECT_ROOT / "deploy.py"
ANSIBLE_CFG = PROJECT_ROOT / "ansible.cfg"
