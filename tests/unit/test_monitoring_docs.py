"""docs/components/monitoring.md lists every alert of the pack with its severity and
``for`` as the rule files have them, and no alert the pack does not have."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "roles" / "monitoring" / "files" / "rules"
DOC = ROOT / "docs" / "components" / "monitoring.md"


def _pack() -> dict[str, tuple[str, str]]:
    out = {}
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = (rule["labels"]["severity"], rule.get("for", "0s"))
    return out


def _documented() -> dict[str, tuple[str, str]]:
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| (\w+) \|", DOC.read_text(), re.M)
    return {name: (severity, held) for name, severity, held in rows}


def test_every_alert_is_documented_as_the_rules_have_it():
    pack, documented = _pack(), _documented()
    assert len(pack) > 50
    assert documented == pack, {k: (pack.get(k), documented.get(k))
                                for k in set(pack) | set(documented)
                                if pack.get(k) != documented.get(k)}
