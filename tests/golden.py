"""Golden files: rendered text compared with a file kept under tests/fixtures/golden/.

Regenerate them after an intended change with ``AICLUSTER_UPDATE_GOLDEN=1 pytest ...``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent / "fixtures" / "golden"
UPDATE = os.environ.get("AICLUSTER_UPDATE_GOLDEN") == "1"


def assert_golden(path: Path, text: str) -> None:
    """``text`` must equal the golden file ``path`` (written instead when updating)."""
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with AICLUSTER_UPDATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"{path} differs from what the templates render now; if intended, regenerate "
        "with AICLUSTER_UPDATE_GOLDEN=1 and review the diff"
    )
