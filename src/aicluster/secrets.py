"""Secrets named by reference in the inventory, read on the deploying machine.

The inventory's ``secrets`` mapping names where each secret is: ``{"file": PATH}`` (a
file on the deploying machine) or ``{"env": VARIABLE}``. A file reference that does
not exist yet is generated once, with random bytes, mode 0600 (its directory 0700),
so a cluster gets its munge key the first time it is deployed and the same key
every time after. A secret's value is never printed, logged or put in an error.
In a dry run (:mod:`aicluster.dryrun`, ``pyinfra ... --dry``) nothing is written: the
secret that would be generated is named (``would generate ...``) and the plan gets
random bytes held in memory for this run only.

    python -m aicluster.secrets generate PATH [--bytes N]

creates PATH the same way when it does not exist (the Ansible role runs this on the
controller before it copies the file to the nodes).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aicluster import dryrun

#: A dry run's stand-ins for secrets it did not generate: path -> bytes, in memory only.
_DRY_VALUES: dict[Path, bytes] = {}

class SecretError(Exception):
    """A secret cannot be had. The message names the secret and where it was looked
    for, never its value."""


def _ref(secrets: Mapping[str, Any], name: str) -> dict[str, str]:
    ref = secrets.get(name)
    if ref is None:
        raise SecretError(
            f"secrets.{name}: not named in the inventory; add {name!r} to `secrets` "
            f"as {{'file': PATH}} or {{'env': VARIABLE}}"
        )
    if hasattr(ref, "model_dump"):  # aicluster.inventory.SecretRef
        ref = ref.model_dump()
    return {k: v for k, v in dict(ref).items() if v is not None}


def secret_ref(cluster: Any, name: str, file_name: str) -> dict[str, str]:
    """Where a component's secret is: the inventory's ``secrets.<name>``, else a file on
    the deploying machine, ``~/.local/share/aicluster/<cluster_name>/<file_name>``
    (generated once, the first time it is read)."""
    secret = cluster.spec.secrets.get(name)
    if secret is not None:
        return secret.model_dump(exclude_none=True)
    return {"file": f"~/.local/share/aicluster/{cluster.spec.cluster_name}/{file_name}"}


def generate_file(path: str | os.PathLike, size: int = 1024) -> bool:
    """Create ``path`` with ``size`` random bytes, mode 0600, unless it exists.
    Returns whether it was created. Never overwrites."""
    path = Path(path).expanduser()
    if path.exists():
        return False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # made by a concurrent run meanwhile
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(size))
    return True


def read_secret(
    secrets: Mapping[str, Any], name: str, *, generate_bytes: int | None = None,
    dry: bool = False,
) -> bytes:
    """The secret ``name`` of the inventory's ``secrets`` mapping, as bytes.

    With ``generate_bytes``, a file reference that does not exist is generated first,
    unless the run is dry (*dry*, Ansible's check mode, or :func:`aicluster.dryrun.is_dry`,
    pyinfra's ``--dry``): then it is named and a value held in memory is returned.
    An environment reference must be set (and non-empty).
    """
    ref = _ref(secrets, name)
    if "file" in ref:
        path = Path(ref["file"]).expanduser()
        if generate_bytes and not path.exists():
            if dry or dryrun.is_dry():
                dryrun.would(f"generate the secret {name} at {path} ({generate_bytes} "
                             "random bytes, mode 0600); this plan uses a value held in memory")
                return _DRY_VALUES.setdefault(path, os.urandom(generate_bytes))
            generate_file(path, generate_bytes)
        try:
            value = path.read_bytes()
        except OSError as exc:
            raise SecretError(
                f"secrets.{name}: cannot read {path}: {exc.strerror or type(exc).__name__}"
            ) from None
        if not value:
            raise SecretError(f"secrets.{name}: {path} is empty")
        return value
    variable = ref["env"]
    value = os.environ.get(variable, "")
    if not value:
        raise SecretError(f"secrets.{name}: the environment variable {variable} is not set")
    return value.encode()


def password_from_secret(
    ref: Mapping[str, Any], name: str, size: int, *, fits: Callable[[str], bool],
    what: str, context: bytes, length: int, dry: bool = False,
) -> str:
    """A password from the secret ``name`` (``ref``, its reference): the secret itself
    when it is one printable line of text that ``fits``; derived from it (HMAC-SHA256
    keyed by the secret over ``context``, base64url, ``length`` characters) when it is
    random bytes: a file of ``size`` bytes generated on first use (not in a *dry* run).
    A line of text that does not fit is refused, saying it is not ``what``. Raises
    SecretError naming the secret, never its value."""
    secret = read_secret({name: dict(ref)}, name, generate_bytes=int(size), dry=dry)
    try:
        text: str | None = secret.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        line = text.rstrip("\r\n")
        if line.isprintable():
            if fits(line):
                return line
            raise SecretError(
                f"secrets.{name}: is text but not {what}; give such a password, or a file "
                "of random bytes to derive one from")
    raw = hmac.new(secret, context, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")[:length]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aicluster.secrets")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="create a random secret file once (mode 0600)")
    gen.add_argument("path")
    gen.add_argument("--bytes", type=int, default=1024)
    args = parser.parse_args(argv)
    created = generate_file(args.path, args.bytes)
    print(f"{args.path}: {'created' if created else 'exists, left as it is'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
