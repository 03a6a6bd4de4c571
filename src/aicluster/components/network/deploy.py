"""network: the cluster NICs, LACP bonds, VLANs (and, for infiniband, IPoIB) from one
data model, rendered for netplan (Ubuntu), systemd-networkd (Debian) or
NetworkManager keyfiles (Rocky/RHEL).

Defaults: roles/network/defaults/main.yml. Templates: roles/network/templates/.

The model (:func:`interfaces`) is computed once from the inventory: each NIC of
``hardware.nics`` (matched by MAC or name) with its static address on its network and
its MTU, the bonds of ``network_bonds`` and the VLANs of ``network_vlans``. The
renderers (:func:`render_files`) turn it into files; the Ansible role reaches the same
functions through its filter plugin. The management interface (the one holding the
address the deploy connects to) is never changed unless the inventory says
``network_allow_management_change: true``; then the change is applied under a
rollback timer that restores the previous configuration unless the deploy reaches
the node again and confirms.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, systemd

from aicluster.common.netconf import distribution_name, renderer
from aicluster.common.ops import current_cluster, install_packages, put_template, write_config
from aicluster.common.settings import layered, os_family
from aicluster.components.network.derive import (
    TUNING_SCRIPT,
    TUNING_UNIT,
    derived_vars,
    management_refusal,
    missing_nics,
    mtu_drift,
    touches,
)
from aicluster.components.network.facts import ManagementInterface, NetworkInterfaces
from aicluster.render import defaults, os_vars


@deploy("network", data_defaults=defaults("network"))
def deploy() -> None:
    cluster = current_cluster()
    distribution = host.get_fact(LinuxDistribution)
    family = os_family(distribution)
    data = host.data.dict()
    v = {**layered("network", data), **os_vars("network", family),
         **derived_vars(cluster, host.name, data)}
    v["inventory_hostname"] = host.name
    items = v["network_interfaces"]
    chosen = renderer(v["network_renderer"], distribution_name(distribution),
                      v["network_os_renderer"], v["network_distribution_renderer"])

    found = host.get_fact(NetworkInterfaces) or []
    declared = [n.model_dump(include={"name", "mac"})
                for n in cluster.hosts[host.name].spec.hardware.nics]
    problem = missing_nics(declared, host.name, found)
    if problem:
        raise DeployError(problem)
    mgmt = host.get_fact(ManagementInterface, address=v["network_ssh_address"])
    hit = touches(items, mgmt)
    if hit and not v["network_allow_management_change"]:
        raise DeployError(management_refusal(host.name, mgmt, hit))

    install_packages(f"Install the network tools ({chosen})",
                     v["network_packages"][chosen], family)
    service = {"networkd": "systemd-networkd", "netplan": None,
               "networkmanager": "NetworkManager"}[chosen]
    if service and items:
        systemd.service(name=f"{service} running and enabled", service=service,
                        running=True, enabled=True)
    if not items:
        host.noop("network: the inventory declares no cluster NIC, bond or VLAN for this host")
    write_config("network", items, v, chosen, label="Cluster network",
                 mgmt=mgmt if hit else None, drift=mtu_drift(items, found))
    _tuning(v)


def _tuning(v: dict[str, Any]) -> None:
    if not v["network_tuning_interfaces"]:
        files.file(name="No NIC tuning unit", path=TUNING_UNIT, present=False)
        files.file(name="No NIC tuning script", path=TUNING_SCRIPT, present=False)
        return
    script = put_template("network", "aicluster-nic-tuning.j2", TUNING_SCRIPT, v,
                          name="NIC tuning script (ring buffers)", mode="755")
    unit = put_template("network", "aicluster-nic-tuning.service.j2", TUNING_UNIT, v,
                        name="NIC tuning unit")
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    systemd.service(name="Apply the NIC tuning now (it changed)",
                    service="aicluster-nic-tuning", restarted=True,
                    _if=lambda: script.did_change() or unit.did_change())
    systemd.service(name="NIC tuning enabled", service="aicluster-nic-tuning", enabled=True)
