"""What a k3s node has: the binary's version, the token file's digest, the unit's state
and whether the node is Ready, read by one shell command and parsed.
"""

from __future__ import annotations

import shlex

BINARY = "/usr/local/bin/k3s"
TOKEN_FILE = "/etc/rancher/k3s/aicluster-token"
NVIDIA_RUNTIME = "/usr/bin/nvidia-container-runtime"


def command_text(unit: str, node_ip: str) -> str:
    """The shell that reads a node. Prints ``binary=SHA256`` and ``version=V`` (the
    k3s binary, when there is one), ``active=STATE`` (``systemctl is-active`` of
    ``unit``), ``token=SHA256`` (of the token file, when there is one),
    ``iface=NAME`` (the interface holding ``node_ip``) and ``nvidia=yes`` where the
    NVIDIA container runtime is installed (k3s then gives containerd its runtime)."""
    q_ip = shlex.quote(node_ip)
    return (
        f"if [ -x {BINARY} ]; then "
        f"echo \"binary=$(sha256sum {BINARY} | cut -d' ' -f1)\"; "
        f"{BINARY} --version 2>/dev/null | sed -n 's/^k3s version v\\([^ ]*\\).*/version=\\1/p'; "
        "fi; "
        f"echo \"active=$(systemctl is-active {shlex.quote(unit)} 2>/dev/null)\"; "
        f"if [ -f {TOKEN_FILE} ]; then "
        f"echo \"token=$(sha256sum {TOKEN_FILE} | cut -d' ' -f1)\"; fi; "
        f"ip -o addr show to {q_ip} 2>/dev/null | awk '{{print \"iface=\" $2; exit}}'; "
        f"if [ -x {NVIDIA_RUNTIME} ]; then echo nvidia=yes; fi; "
        "true"
    )


def parse(lines) -> dict:
    """``binary``: the installed binary's sha256 (None: none); ``version``: what it
    says it is (None); ``active``: the unit's state (``active``, ``inactive``,
    ``failed`` ...; None: unknown); ``token``: the token file's sha256 (None: none);
    ``iface``: the interface holding the node address (None: no such address);
    ``nvidia``: whether the NVIDIA container runtime is installed."""
    out: dict = {"binary": None, "version": None, "active": None, "token": None,
                 "iface": None, "nvidia": False}
    for line in lines:
        key, _, value = str(line).strip().partition("=")
        value = value.strip()
        if key == "nvidia":
            out["nvidia"] = value == "yes"
        elif key in out and value:
            out[key] = value
    return out

