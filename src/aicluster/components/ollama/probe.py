"""What an Ollama node has: the installed release, the models on disk and the gateway's
state, read by one shell command and parsed.
"""

from __future__ import annotations

import shlex

#: The file a complete unpack leaves in a release directory: the archive's sha256.
INSTALLED_MARKER = ".aicluster-installed"


def command_text(install_dir: str, bin_link: str, models_dir: str, gateway_port: int = 0) -> str:
    """The shell that reads a node. Prints ``linked=PATH`` (where ``bin_link`` points),
    ``version=V`` per directory under ``install_dir``, ``installed=V SHA256`` per
    complete unpack, ``model=HOST/NAMESPACE/MODEL/TAG`` per manifest in
    ``models_dir``, ``addresses=A B ...`` and, with ``gateway_port``, ``selinux=``,
    ``selinux_connect=`` (httpd_can_network_connect) and ``selinux_port=yes|no``
    (whether the port is an http_port_t port)."""
    q_dir, q_link = shlex.quote(install_dir), shlex.quote(bin_link)
    q_manifests = shlex.quote(f"{models_dir.rstrip('/')}/manifests")
    text = (
        f"echo \"linked=$(readlink {q_link} 2>/dev/null)\"; "
        f"for d in $(ls -1 {q_dir} 2>/dev/null); do "
        "case \"$d\" in [0-9]*) echo \"version=$d\"; "
        f"test -f {q_dir}/\"$d\"/bin/ollama && test -f {q_dir}/\"$d\"/{INSTALLED_MARKER} && "
        f"echo \"installed=$d $(cat {q_dir}/\"$d\"/{INSTALLED_MARKER})\";; esac; done; "
        f"(cd {q_manifests} 2>/dev/null && find . -mindepth 4 -maxdepth 4 -type f "
        "| sed 's#^\\./#model=#'); "
        'echo "addresses=$(hostname -I 2>/dev/null)"; '
    )
    if gateway_port:
        text += (
            'echo "selinux=$(getenforce 2>/dev/null)"; '
            "echo \"selinux_connect=$(getsebool httpd_can_network_connect 2>/dev/null "
            "| awk '{print $3}')\"; "
            "if semanage port -l 2>/dev/null | awk '$1 == \"http_port_t\" && $2 == \"tcp\"' "
            f"| tr -s ', ' '\\n\\n' | grep -qx {int(gateway_port)}; "
            'then echo selinux_port=yes; else echo selinux_port=no; fi; '
        )
    return text + "true"


def parse(lines) -> dict:
    """``linked``: where /usr/local/bin/ollama points (None: no link); ``versions``: the
    release directories; ``installed``: version -> the sha256 of the archive completely
    unpacked there; ``models``: manifest paths (``registry.ollama.ai/library/x/latest``);
    ``addresses``: the node's IP addresses (None: unknown); ``selinux``,
    ``selinux_connect``, ``selinux_port``: SELinux's mode, whether nginx may connect out,
    whether the gateway port is labeled (None: not read)."""
    out: dict = {
        "linked": None, "versions": [], "installed": {}, "models": [], "addresses": None,
        "selinux": None, "selinux_connect": None, "selinux_port": None,
    }
    for line in lines:
        key, _, value = str(line).strip().partition("=")
        if key == "version" and value:
            out["versions"].append(value)
        elif key == "installed":
            version, _, digest = value.partition(" ")
            if version and digest.strip():
                out["installed"][version] = digest.strip()
        elif key == "model" and value:
            out["models"].append(value)
        elif key == "addresses":
            out["addresses"] = value.split() or None
        elif key == "selinux_port":
            out["selinux_port"] = value == "yes"
        elif key in out and value:
            out[key] = value
    return out

