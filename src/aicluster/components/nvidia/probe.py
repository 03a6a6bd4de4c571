"""The node's NVIDIA devices and driver: PCI GPUs and NVSwitches, the loaded and the
installed driver, held packages, NVIDIA's pinning package; the command and the parsing of
its lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

NVIDIA_VENDOR = "0x10de"
#: PCI classes: 0x0300xx VGA controller, 0x0302xx 3D controller (data-center GPUs);
#: NVSwitches show as 0x0680xx "bridge, other".
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"
#: The first PCI device id of the Turing generation. NVIDIA numbers its GPUs upwards by
#: generation: Volta GV100 is 0x1db*, Pascal 0x15**/0x1b**-0x1d0*, older lower; Turing
#: starts at 0x1e00 (TU102) and every later chip (Ampere 0x20**/0x22**-0x25**, Hopper
#: 0x23**, Ada 0x26**-0x28**, Blackwell 0x29** and up) has a higher id.
TURING_FIRST_DEVICE = 0x1E00
#: Model names (as the inventory writes them) of Turing and newer data-center GPUs,
#: for when no PCI id is known (before the node was read).
TURING_OR_NEWER_MODEL_RE = re.compile(
    r"(^|[^A-Za-z])(T4|A\d+|H\d+|GH\d+|B\d+|GB\d+|L\d+S?|RTX|Quadro RTX|A\d+X)([^A-Za-z]|$)",
    re.I,
)

FACT_COMMAND = r"""
for d in /sys/bus/pci/devices/*; do
  [ -r "$d/vendor" ] || continue
  pci_vendor=; read -r pci_vendor < "$d/vendor"
  [ "$pci_vendor" = 0x10de ] || continue
  pci_class=; pci_device=; read -r pci_class < "$d/class"; read -r pci_device < "$d/device"
  echo "pci=${d##*/} $pci_class $pci_device"
done 2>/dev/null
if command -v nvidia-smi >/dev/null 2>&1; then
  q=index,name,memory.total,driver_version,persistence_mode,pci.bus_id
  if out=$(nvidia-smi --query-gpu=$q --format=csv,noheader,nounits 2>&1); then
    printf '%s\n' "$out" | sed 's/^/smi=/'
  else
    echo "smi_error=$(printf '%s' "$out" | head -n 1)"
  fi
fi
[ -r /sys/module/nvidia/version ] && echo "loaded=$(cat /sys/module/nvidia/version)"
echo "kernel=$(uname -r)"
sb=/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c
[ -r "$sb" ] && echo "secure_boot=$(od -An -t u1 "$sb" 2>/dev/null | awk '{print $NF}')"
if command -v modinfo >/dev/null 2>&1; then
  v=$(modinfo -F version nvidia 2>/dev/null | head -n 1)
  if [ -n "$v" ]; then
    echo "installed=$v"
    echo "license=$(modinfo -F license nvidia 2>/dev/null | head -n 1)"
  fi
fi
[ -d /sys/module/nvidia_peermem ] && echo "peermem=loaded"
command -v ofed_info >/dev/null 2>&1 && echo "ofed=$(ofed_info -s 2>/dev/null | head -n 1)"
grep -qsw ib_register_peer_memory_client /proc/kallsyms && echo "peer_memory=ib_core"
for d in /sys/class/infiniband/*; do [ -e "$d" ] && echo "rdma=${d##*/}"; done
if command -v containerd >/dev/null 2>&1; then
  echo "runtime=containerd"
  grep -qs nvidia /etc/containerd/config.toml /etc/containerd/conf.d/*.toml \
    && echo "runtime_nvidia=containerd"
fi
if command -v dockerd >/dev/null 2>&1; then
  echo "runtime=docker"
  grep -qs nvidia /etc/docker/daemon.json && echo "runtime_nvidia=docker"
fi
if [ -n "${v:-}" ]; then
  if command -v dpkg-query >/dev/null 2>&1; then
    dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\n' 2>/dev/null \
      | awk -v v="$v" '$1 == "ii" { sub(/^[0-9]+:/, "", $3); if (index($3, v) == 1) \
          print "pkg=" $2 }'
    apt-mark showhold 2>/dev/null | sed 's/^/held=/'
    dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' 'nvidia-driver-pinning-*' 2>/dev/null \
      | awk '$1 == "ii" { print "pinning=" $2 }'
  elif command -v rpm >/dev/null 2>&1; then
    rpm -qa --qf '%{NAME} %{VERSION}\n' 2>/dev/null | awk -v v="$v" '$2 == v { print "pkg=" $1 }'
    dnf -q versionlock list 2>/dev/null | sed 's/^/held=/'
  fi
fi
true
""".strip()


def _device_id(text: str) -> int | None:
    try:
        return int(text, 16)
    except ValueError:
        return None


def _held_names(entries: Iterable[str]) -> set[str]:
    """Package names from ``apt-mark showhold`` (names) or ``dnf versionlock list``
    (``name-[epoch:]version-release.*``) lines."""
    out = set()
    for entry in entries:
        entry = entry.strip()
        m = re.match(r"^(.+?)-(\d+:)?\d[^-]*-[^-]+$", entry)
        out.add(m.group(1) if m and ("*" in entry or ":" in entry) else entry)
    return out


def parse(lines: Iterable[str]) -> dict[str, Any]:
    """The fact command's output as a mapping (empty values where nothing was found)."""
    out: dict[str, Any] = {
        "pci_gpus": [],
        "nvswitches": [],
        "smi": [],
        "smi_error": "",
        "loaded": "",
        "installed": "",
        "open_modules": False,
        "peermem_loaded": False,
        "ofed": "",
        "peer_memory_api": False,
        "kernel": "",
        "secure_boot": False,
        "rdma": [],
        "runtimes": [],
        "runtimes_configured": [],
        "driver_packages": [],
        "unheld": [],
        # NVIDIA's pinning packages installed (nvidia-driver-pinning-<branch|version>).
        "pinning": [],
    }
    held: list[str] = []
    for line in lines:
        key, sep, value = str(line).rstrip("\n").partition("=")
        if not sep:
            continue
        value = value.strip()
        if key == "pci":
            parts = value.split()
            if len(parts) != 3:
                continue
            address, klass, device = parts
            entry = {"address": address, "device": device.lower()}
            if klass.startswith(GPU_CLASSES):
                out["pci_gpus"].append(entry)
            elif klass.startswith(NVSWITCH_CLASS):
                out["nvswitches"].append(entry)
        elif key == "smi":
            fields = [f.strip() for f in value.split(",")]
            if len(fields) != 6:
                continue
            index, name, memory, driver, persistence, bus = fields
            out["smi"].append(
                {
                    "index": int(index) if index.isdigit() else index,
                    "name": name,
                    "memory_mib": int(memory) if memory.isdigit() else 0,
                    "driver": driver,
                    "persistence": persistence.lower() == "enabled",
                    "bus_id": bus,
                }
            )
        elif key == "smi_error":
            out["smi_error"] = value
        elif key == "loaded":
            out["loaded"] = value
        elif key == "installed":
            out["installed"] = value
        elif key == "license":
            # The open kernel modules are "Dual MIT/GPL", the proprietary ones "NVIDIA".
            out["open_modules"] = "GPL" in value
        elif key == "peermem":
            out["peermem_loaded"] = True
        elif key == "ofed":
            # MLNX_OFED or DOCA-OFED (ofed_info -s: "MLNX_OFED_LINUX-24.10-...",
            # "OFED-internal-25.01-..."): its ib_core has the peer-memory API.
            out["ofed"] = value or "installed"
        elif key == "peer_memory":
            # The running ib_core exports ib_register_peer_memory_client (MLNX_OFED's
            # and DOCA-OFED's do; the kernel's own inbox one does not).
            out["peer_memory_api"] = True
        elif key == "kernel":
            out["kernel"] = value
        elif key == "secure_boot":
            # The UEFI variable's last byte: 1 when Secure Boot is on (what mokutil
            # --sb-state reads); a node booted without UEFI has no such variable.
            out["secure_boot"] = value == "1"
        elif key == "rdma":
            out["rdma"].append(value)
        elif key == "runtime":
            out["runtimes"].append(value)
        elif key == "runtime_nvidia":
            out["runtimes_configured"].append(value)
        elif key == "pkg":
            out["driver_packages"].append(value)
        elif key == "held":
            held.append(value)
        elif key == "pinning":
            out["pinning"].append(value)
    names = _held_names(held)
    out["unheld"] = sorted(p for p in out["driver_packages"] if p not in names)
    return out


def turing_or_newer(device_ids: Iterable[str], model: str = "") -> bool | None:
    """Whether the GPUs are Turing or newer (they can run, and from Blackwell on need,
    the open kernel modules): from the PCI device ids when there are any, else from
    the inventory's model name; None when neither tells."""
    ids = [i for i in (_device_id(d) for d in device_ids) if i is not None]
    if ids:
        return all(i >= TURING_FIRST_DEVICE for i in ids)
    if model and TURING_OR_NEWER_MODEL_RE.search(model):
        return True
    return None

