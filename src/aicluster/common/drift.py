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
from pathlib import PurePosixPath
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


#: Where the repair records the values the kernel refused (a tmpfs: forgotten at boot).
SYSCTL_REFUSED_FILE = "/run/aicluster/sysctl-refused"


def sysctl_command(keys: Iterable[str], refused_file: str = SYSCTL_REFUSED_FILE) -> str:
    """Print ``key = value`` for each key the kernel has (``-e``: a key this kernel or
    network namespace lacks is left out, as ``sysctl -e -p`` skips it when applying),
    then ``refused key = value`` for each value the last repair found the kernel
    refused."""
    names = sorted(keys)
    read = f"sysctl -e {' '.join(shlex.quote(k) for k in names)} 2>/dev/null; " if names else ""
    return (f"{read}sed 's/^/refused /' {shlex.quote(refused_file)} 2>/dev/null; true")


def sysctl_apply_command(path: str, settings: Mapping[str, Any],
                         refused_file: str = SYSCTL_REFUSED_FILE) -> str:
    """Apply the drop-in ``path`` (``sysctl -e -q -p``), then record in
    ``refused_file`` each value the kernel did not take (a container's network namespace
    may refuse buffer sizes above its host's), so that the next run reports it instead
    of applying it again."""
    tmp = shlex.quote(refused_file + ".tmp")
    checks = "".join(
        f"_v=$(sysctl -n -e {shlex.quote(k)} 2>/dev/null) && [ -n \"$_v\" ] && "
        f"{{ set -f; set -- $_v; set +f; [ \"$*\" = {shlex.quote(' '.join(_words(v)))} ] || "
        f"echo {shlex.quote(f'{k} = ' + ' '.join(_words(v)))} >> {tmp}; }}; "
        for k, v in sorted(settings.items()) if v is not None
    )
    return (
        f"sysctl -e -q -p {shlex.quote(path)}; "
        f"mkdir -p {shlex.quote(str(PurePosixPath(refused_file).parent))} && : > {tmp} && "
        f"{{ {checks}true; }} && mv {tmp} {shlex.quote(refused_file)}"
    )


def parse_sysctl(lines: Iterable[Any]) -> dict[str, str]:
    """``{key: value}`` from ``sysctl`` output (``key = value`` lines)."""
    out = {}
    for line in lines:
        text = str(line)
        if text.startswith("refused "):
            continue
        key, sep, value = text.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_refused(lines: Iterable[Any]) -> dict[str, str]:
    """``{key: value}`` the last repair found refused (``refused key = value`` lines)."""
    return parse_sysctl(str(line).removeprefix("refused ") for line in lines
                        if str(line).startswith("refused "))


def _words(value: Any) -> list[str]:
    return [str(int(w)) if w.lstrip("-").isdigit() else w for w in str(value).split()]


def _differs(wanted: Mapping[str, Any], live: Mapping[str, str]) -> list[str]:
    return sorted(k for k, v in wanted.items()
                  if v is not None and k in live and _words(live[k]) != _words(v))


def sysctl_drift(wanted: Mapping[str, Any], live: Mapping[str, str],
                 refused: Mapping[str, str] | None = None) -> list[str]:
    """The keys whose live value differs from the wanted one, sorted. Values compare
    word by word, numbers as numbers (``4096 87380`` is the kernel's ``4096\\t87380``);
    a key the kernel does not have is no drift (it cannot be applied here), nor is a
    value the kernel refused when the last repair applied it (:func:`sysctl_refused`)."""
    refused = refused or {}
    return [k for k in _differs(wanted, live)
            if k not in refused or _words(refused[k]) != _words(wanted[k])]


def sysctl_refused(wanted: Mapping[str, Any], live: Mapping[str, str],
                   refused: Mapping[str, str] | None = None) -> list[str]:
    """The keys whose wanted value the kernel refused at the last repair and still
    does not have."""
    refused = refused or {}
    return [k for k in _differs(wanted, live)
            if k in refused and _words(refused[k]) == _words(wanted[k])]


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
