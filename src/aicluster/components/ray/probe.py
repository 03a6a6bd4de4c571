"""What a Ray node has: the venv's Ray version, its units and the node's address, read
by one shell command and parsed.
"""

from __future__ import annotations

import shlex

UNITS = ("/etc/systemd/system/ray-head.service", "/etc/systemd/system/ray-worker.service")


def command_text(venv: str, install_dir: str) -> str:
    """The shell that reads a node, Python interpreter from ``$AICLUSTER_RAY_PYTHON``.
    Prints ``python=X.Y.Z``, ``ray=VERSION`` (Ray in ``venv``), ``deployed=VERSION``
    (the version the systemd unit runs), ``version=V`` per venv under install_dir and
    ``addresses=A B ...``, the node's own IP addresses."""
    q_venv, q_dir = shlex.quote(venv), shlex.quote(install_dir)
    return (
        # `-V` prints "Python X.Y.Z[suffix]" before the interpreter starts (a tenth of
        # the time of running code in it); X.Y.Z is sys.version_info[:3].
        'pyv=$("$AICLUSTER_RAY_PYTHON" -V 2>&1) && case $pyv in "Python "[0-9]*) '
        'pyv=${pyv#Python }; echo "python=${pyv%%[!0-9.]*}";; esac; '
        # Ray's version from its installed metadata (what importlib.metadata reads),
        # without starting the venv's Python.
        f"for d in {q_venv}/lib/python*/site-packages/ray-*.dist-info; do "
        '[ -e "$d/METADATA" ] && d=${d##*/ray-} && echo "ray=${d%.dist-info}"; done; '
        # (a glob that matched nothing leaves $d without METADATA: nothing printed)
        # The version in the unit's "ExecStart=<install_dir>/<version>/venv/bin/ray
        # start ...", and the versions installed (names starting with a digit), read by
        # the shell itself rather than by sed and ls.
        f"p=ExecStart={q_dir}/; for f in {' '.join(UNITS)}; do [ -r \"$f\" ] || continue; "
        'while IFS= read -r l || [ -n "$l" ]; do case $l in "$p"*) r=${l#"$p"}; x=${r%%/*}; '
        'case ${r#"$x"} in "/venv/bin/ray start"*) echo "deployed=$x";; esac;; esac; '
        'done < "$f"; done; '
        f"for d in {q_dir}/*; do d=${{d##*/}}; case $d in [0-9]*) "
        'case $d in *[!0-9A-Za-z.+~-]*) ;; *) echo "version=$d";; esac;; esac; done; '
        'echo "addresses=$(hostname -I 2>/dev/null)"; '
        "true"
    )


def parse(lines) -> dict:
    """``python``: the interpreter's version (None: missing); ``ray``: Ray's version in
    the target venv (None: not installed); ``deployed``: the version the systemd unit
    runs (None: no unit); ``versions``: the versions installed under install_dir;
    ``addresses``: the node's IP addresses (None: unknown)."""
    out: dict = {"python": None, "ray": None, "deployed": None, "versions": [], "addresses": None}
    for line in lines:
        key, _, value = str(line).strip().partition("=")
        if key == "version":
            out["versions"].append(value)
        elif key == "addresses":
            out["addresses"] = value.split() or None
        elif key in out and value:
            out[key] = value
    return out

