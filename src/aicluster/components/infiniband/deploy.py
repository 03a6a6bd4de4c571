"""infiniband: the RDMA stack (rdma-core, verbs utilities, diagnostics, perftest), IPoIB
interfaces through the network component's model and renderers, and opensm on the
nodes the inventory names when the fabric has no managed-switch subnet manager.

Defaults: roles/infiniband/defaults/main.yml. Templates: roles/infiniband/templates/
(opensm.conf) and roles/network/templates/ (the IPoIB interfaces, as every interface).

The HCA ports are read from the node (aicluster.components.infiniband.facts). A port the
inventory declares that the node lacks stops the deploy for that host. A node
without an HCA gets the packages and no opensm and no IPoIB, and the output says why.
Locked memory for RDMA users is base's (limits.d and systemd's DefaultLimitMEMLOCK,
``base_memlock_limit``); it is checked here, not written twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, systemd

from aicluster.common import netconf
from aicluster.common.ops import (
    current_cluster,
    install_packages,
    modules_loaded,
    put_template,
    say,
    write_config,
)
from aicluster.common.settings import layered, os_family, template_vars
from aicluster.components.infiniband.derive import (
    IPOIB_MODULES_FILE,
    IPOIB_NETPLAN_FILE,
    IPOIB_PREFIX,
    ipoib_glob,
    missing_ports,
    opensm_decision,
    with_netdevs,
)
from aicluster.components.infiniband.facts import InfinibandPorts
from aicluster.inventory import Cluster
from aicluster.render import defaults, os_vars


@deploy("infiniband", data_defaults=defaults("infiniband"))
def deploy() -> None:
    cluster = current_cluster()
    distribution = host.get_fact(LinuxDistribution)
    family = os_family(distribution)
    data = host.data.dict()
    v = template_vars("infiniband", cluster, host.name, data, family)
    found = host.get_fact(InfinibandPorts) or []
    problem = missing_ports(host.name, v["infiniband_declared_ports"], found)
    if problem:
        raise DeployError(problem)

    install_packages("Install the RDMA stack (rdma-core, verbs, diagnostics, perftest)",
                     v["infiniband_packages"], family)
    if not found:
        say("infiniband: no InfiniBand/RoCE HCA on this node (/sys/class/infiniband is "
            "empty): RDMA packages installed; no opensm, no IPoIB interface")
    else:
        ports = ", ".join(f"{f['device']}/{f['port']} {f['state']} {f['link_layer']}"
                          for f in found)
        host.noop(f"infiniband: ports {ports}")

    run_sm, why = opensm_decision(v, found)
    if run_sm:
        install_packages("Install opensm", [v["infiniband_opensm_package"]], family)
        files.directory(name="opensm configuration directory",
                        path=v["infiniband_opensm_conf"].rsplit("/", 1)[0])
        conf = put_template("infiniband", "opensm.conf.j2", v["infiniband_opensm_conf"], v,
                            name=f"Write opensm.conf ({why})")
        systemd.service(name="Restart opensm (its configuration changed)",
                        service=v["infiniband_opensm_service"], restarted=True,
                        _if=conf.did_change)
        systemd.service(name="opensm running and enabled",
                        service=v["infiniband_opensm_service"], running=True, enabled=True)
    else:
        say(f"opensm skipped: {why}")

    _ipoib(cluster, v, distribution, family, found)


def _ipoib(cluster: Cluster, v: dict[str, Any], distribution: Any, family: str,
           found: list[Mapping[str, Any]]) -> None:
    ports = with_netdevs(v["infiniband_ipoib_ports"], found)
    for p in ports:
        if not p["netdev"] and found:
            say(f"IPoIB on {p['device']} port {p['port']} skipped: the port has no "
                "network interface (is ib_ipoib loaded?)")
    items = netconf.ipoib_interfaces(ports, host.name)
    if not v["infiniband_ipoib_ports"]:
        host.noop("IPoIB: the inventory gives no InfiniBand port an address")
    else:
        put_template("infiniband", "aicluster-ipoib.conf.j2", IPOIB_MODULES_FILE, v,
                     name="Load the IPoIB module at boot")
        # Loaded now and whenever it is found unloaded (modprobe -r, a failed boot load).
        modules_loaded(name="IPoIB modules loaded", modules=v["infiniband_ipoib_modules"])
    nv = {**os_vars("network", family), **layered("network", host.data.dict())}
    chosen = netconf.renderer(nv["network_renderer"], netconf.distribution_name(distribution),
                          nv["network_os_renderer"], nv["network_distribution_renderer"])
    write_config(
        "infiniband", items, {**nv, "inventory_hostname": host.name}, chosen,
        label="IPoIB", netplan_file=IPOIB_NETPLAN_FILE, prefix=IPOIB_PREFIX,
        glob=ipoib_glob(chosen),
    )

