"""aicluster: turn bare-metal machines into an AI cluster from one inventory file."""

from pathlib import Path

__version__ = "0.1.0"

# The repository root holds roles/ (defaults and templates shared by both engines),
# playbooks/ and inventories/. An installed package finds it next to src/.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = PROJECT_ROOT / "roles"
