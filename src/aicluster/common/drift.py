"""Runtime state the deploy owns beyond its files, read from the node and compared with
what the deploy wants: the live nftables table, applied sysctl values, loaded kernel
modules. Engine-free: the pyinfra facts (:mod:`aicluster.common.facts`) run these
commands and parse with these functions, and the Ansible roles run the same commands
and call the same functions through their filter plugins, so both engines see the
same drift.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from typing import Any

# ---------------------------------------------------------------------------
# The live nftables table
# ---------------------------------------------------------------------------

#: What :func:`nft_table_command` prints: nft is not installed; the table is not loaded;
#: the live table is what nft makes of the rules file; it differs; or it cannot be told
#: (nft could not load the file in a scratch network namespace).
NFT_STATES = ("no-nft", "absent", "same", "different", "unknown")


def nft_table_command(rules_file: str, family: str = "inet", table: str = "aicluster") -> str:
    """A shell command printing one of :data:`NFT_STATES` for the live table.

    The rules file is loaded by nft into a scratch network namespace (``unshare
    --net``), where it replaces nothing, and that table's listing is compared with the
    live one: both in nft's own canonical form, so a different spelling of the same rule
    (a ``/32``, a compressed IPv6 address, ``priority 0``) is no drift. Nothing changes
    on the node."""
    f = shlex.quote(rules_file)
    t = f"{shlex.quote(family)} {shlex.quote(table)}"
    scratch = shlex.quote(f'nft -f "$0" >/dev/null 2>&1 && nft list table {t}')
    return (
        "if ! command -v nft >/dev/null 2>&1; then echo no-nft; "
        f"elif ! _live=$(nft list table {t} 2>/dev/null); then echo absent; "
        f"elif ! _want=$(unshare --net sh -c {scratch} {f} 2>/dev/null); then echo unknown; "
        'elif [ "$_live" = "$_want" ]; then echo same; else echo different; fi'
    )


def nft_table_state(lines: Iterable[Any]) -> str:
    """The state :func:`nft_table_command` printed ("no-nft" for no output)."""
    words = [str(line).strip() for line in lines if str(line).strip()]
    state = words[-1] if words else "no-nft"
    return state if state in NFT_STATES else "unknown"


def nft_needs_load(state: str) -> bool:
    """The live table is missing or differs from the rules: load the rules again."""
    return state in ("absent", "different")


# ---------------------------------------------------------------------------
# Applied sysctl values
# ---------------------------------------------------------------------------


def sysctl_command(keys: Iterable[str]) -> str:
    """Print ``key = value`` for each key the kernel has (``-e``: a key this kernel or
    network namespace lacks is left out, as ``sysctl -e -p`` skips it when applying)."""
    names = sorted(keys)
    if not names:
        return "true"
    return f"sysctl -e {' '.join(shlex.quote(k) for k in names)} 2>/dev/null; true"


def parse_sysctl(lines: Iterable[Any]) -> dict[str, str]:
    """``{key: value}`` from ``sysctl`` output (``key = value`` lines)."""
    out = {}
    for line in lines:
        key, sep, value = str(line).partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _words(value: Any) -> list[str]:
    return [str(int(w)) if w.lstrip("-").isdigit() else w for w in str(value).split()]


def sysctl_drift(wanted: Mapping[str, Any], live: Mapping[str, str]) -> list[str]:
    """The keys whose live value differs from the wanted one, sorted. Values compare
    word by word, numbers as numbers (``4096 87380`` is the kernel's ``4096\\t87380``);
    a key the kernel does not have is no drift (it cannot be applied here)."""
    return sorted(k for k, v in wanted.items()
                  if v is not None and k in live and _words(live[k]) != _words(v))


# ---------------------------------------------------------------------------
# Loaded kernel modules
# ---------------------------------------------------------------------------


def _module_dir(name: str) -> str:
    return name.replace("-", "_")


def modules_command(modules: Iterable[str]) -> str:
    """Print ``loaded=NAME`` for each module the kernel has (loaded, or built in and
    present under /sys/module), and ``container=...`` where the node is a container (it
    cannot load modules)."""
    names = sorted(set(modules))
    checks = "".join(
        f"[ -d /sys/module/{shlex.quote(_module_dir(m))} ] && echo loaded={shlex.quote(m)}; "
        for m in names
    )
    return (
        checks
        + "{ read -r c < /run/systemd/container && [ -n \"$c\" ] && echo \"container=$c\"; } "
        "2>/dev/null; true"
    )


def parse_modules(lines: Iterable[Any]) -> dict[str, Any]:
    """``{"loaded": [names], "container": name or None}``."""
    loaded, container = [], None
    for line in lines:
        key, _, value = str(line).strip().partition("=")
        if key == "loaded" and value:
            loaded.append(value)
        elif key == "container" and value:
            container = value
    return {"loaded": sorted(loaded), "container": container}


def missing_modules(wanted: Iterable[str], state: Mapping[str, Any]) -> list[str]:
    """The wanted modules the kernel does not have, in the order given."""
    loaded = {_module_dir(m) for m in state.get("loaded", [])}
    return [m for m in wanted if _module_dir(m) not in loaded]
