"""What `base` must have done on every testbed node, checked on the nodes themselves
(shared by the pyinfra and the Ansible end-to-end tests)."""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import time

from tests.e2e.conftest import ROOT, Lab, Testbed

#: Whether this host may raise the locked-memory limit at all (a sandboxed host
#: without CAP_SYS_RESOURCE cannot, and its nspawn nodes inherit that).
HOST_CAN_RAISE_MEMLOCK = (
    subprocess.run(
        ["prlimit", "--memlock=unlimited:unlimited", "true"], capture_output=True
    ).returncode
    == 0
)


def assert_base(tb: Testbed) -> None:
    names = [n["name"] for n in tb.nodes]
    for node in tb.nodes:
        name = node["name"]
        assert tb.ssh(name, "hostname").strip() == name
        hosts = tb.ssh(name, "cat /etc/hosts")
        for other in tb.nodes:
            assert f"{other['address']}\t{other['name']}\n" in hosts, (name, other["name"])
        for n in names:
            assert f"\t{n}-fabric\n" in hosts
        assert tb.ssh(name, "systemctl is-active chrony").strip() == "active"
        rules = tb.ssh(name, "nft list table inet aicluster")
        assert "policy drop" in rules and "10.213.0.0/24" in rules
        assert tb.ssh(name, "sysctl -n net.ipv4.tcp_mtu_probing").strip() == "1"
        assert tb.ssh(name, "sysctl -n net.ipv4.tcp_rmem").split() == [
            "4096", "87380", "134217728"
        ]
        proxy = tb.ssh(name, "cat /etc/apt/apt.conf.d/01aicluster-proxy")
        assert f'Acquire::http::Proxy "{tb.state["package_proxy"]}";' in proxy
        manager = tb.ssh(name, "systemctl show -p DefaultLimitMEMLOCK")
        assert "DefaultLimitMEMLOCK=infinity" in manager
        assert "LimitMEMLOCK=infinity" in tb.ssh(name, "systemctl show chrony -p LimitMEMLOCK")
        assert "*\thard\tmemlock\tunlimited" in tb.ssh(
            name, "cat /etc/security/limits.d/90-aicluster-memlock.conf"
        )
        if HOST_CAN_RAISE_MEMLOCK:
            assert tb.ssh(name, "bash -lc 'ulimit -l'").strip() == "unlimited"
        else:
            print(f"{name}: memlock configured; the effective limit is not checked: this host "
                  "cannot raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE), so neither can its nodes")
        # The admin user logs in with its key and has passwordless sudo.
        assert tb.ssh(name, "su - aiops -c 'sudo -n true' && echo sudo-ok").strip() == "sudo-ok"
    # node2 takes its time from node1, the cluster's time server.
    server = tb.nodes[0]["address"]
    sources = tb.ssh(tb.nodes[1]["name"], "chronyc -n sources")
    assert server in sources, sources


#: What the infiniband deploy says on each of the testbed's HCA-less nodes (both
#: engines), and why opensm is not started there: node1, the named subnet manager,
#: has no HCA; node2 is no subnet manager node.
INFINIBAND_NO_HCA = "no InfiniBand/RoCE HCA on this node"
INFINIBAND_SKIPPED = "opensm skipped: "
INFINIBAND_SKIPPED_SM = "opensm skipped: this node has no InfiniBand HCA"


def assert_network(tb: Testbed, output: str = "") -> None:
    """network: each node's fabric NIC has its address and MTU 9000 from the node's own
    systemd-networkd (our .network file), the management NIC is untouched, and a full
    9000-byte frame crosses the fabric unfragmented while a larger one does not.
    infiniband: the RDMA packages are installed on these HCA-less nodes, no opensm runs,
    and the deploy's output (``output``, when given) says why."""
    from aicluster.testbed.state import fabric_address, node_number

    fabric = {n["name"]: fabric_address(node_number(n["name"])) for n in tb.nodes}
    for node in tb.nodes:
        name, nic = node["name"], node["fabric_nic"]
        addr = tb.ssh(name, f"ip -o -4 addr show dev {nic}")
        assert f"inet {fabric[name]}/24 " in addr, addr
        assert tb.ssh(name, f"cat /sys/class/net/{nic}/mtu").strip() == "9000"
        status = tb.ssh(name, f"networkctl status {nic}")
        assert f"/etc/systemd/network/60-aicluster-{nic}.network" in status, status
        # The management interface keeps the testbed's own configuration.
        host0 = tb.ssh(name, "networkctl status host0")
        assert "/etc/systemd/network/10-aicluster-host0.network" in host0, host0
        assert f"inet {node['address']}/" in tb.ssh(name, "ip -o -4 addr show dev host0")
        packages = tb.ssh(name, "dpkg-query -W -f '${Package} ${Status}\n' rdma-core "
                                "ibverbs-utils infiniband-diags perftest")
        assert packages.count("install ok installed") == 4, packages
        assert tb.ssh(name, "systemctl is-active opensm", check=False).strip() != "active"
    for node in tb.nodes:
        name = node["name"]
        for other, address in fabric.items():
            if other == name:
                continue
            ok = tb.ssh(name, f"ping -c 2 -W 2 -M do -s 8972 {address}", check=False)
            assert " 0% packet loss" in ok, ok
            big = run_ssh_status(tb, name, f"ping -c 1 -W 2 -M do -s 8973 {address}")
            assert big != 0, f"{name}: an 8973-byte ping to {other} crossed a 9000 MTU path"
            print(f"{name} -> {other} ({address}): 8972-byte payload unfragmented, "
                  "8973 refused (path MTU 9000)")
    if output:
        for words in (INFINIBAND_NO_HCA, INFINIBAND_SKIPPED):
            said = output.count(words)
            assert said >= len(tb.nodes), f"{words!r}: said {said} time(s), {len(tb.nodes)} nodes"
        assert INFINIBAND_SKIPPED_SM in output
        print("infiniband said on every HCA-less node why it started no opensm: "
              + "; ".join(line.strip() for line in output.splitlines()
                          if INFINIBAND_SKIPPED in line)[:600])


def assert_nvidia_skipped(tb: Testbed, output: str) -> None:
    """nvidia: the testbed's nodes declare a STAND-IN GPU and have no NVIDIA device, so
    the component skipped them, said why in the deploy's output, and wrote nothing."""
    # One line, however the output was wrapped, and with Ansible's YAML quoting
    # ('' inside a single-quoted string) read back as one quote.
    flat = " ".join(output.split()).replace("''", "'")
    for node in tb.nodes:
        name = node["name"]
        why = f"{name}: skipped: hardware.gpus declares a stand-in (1 x 'standin'"
        assert why in flat, f"no nvidia skip message for {name} in the output"
        assert "NVIDIA GPUs on the PCI bus: 0; nothing installed" in flat
        left = tb.ssh(name, "ls /usr/local/sbin/aicluster-nvidia-driver "
                            "/etc/apt/preferences.d/aicluster-nvidia 2>/dev/null; true")
        assert not left.strip(), f"{name}: nvidia wrote {left} on a skipped node"


def run_ssh_status(tb: Testbed, node: str, command: str) -> int:
    """The exit status of ``command`` on ``node``."""
    out = tb.ssh(node, f"{command} >/dev/null 2>&1; echo status=$?", check=False)
    return int(out.strip().rsplit("status=", 1)[-1])


#: Runs on the head as a Ray driver: one task pinned to each alive node (hard node
#: affinity), each returning the hostname it ran on.
RAY_PROBE = """
import socket, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
ray.init(address="auto", logging_level="ERROR")
@ray.remote(num_cpus=0)
def where():
    return socket.gethostname()
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
print("RAN-ON", " ".join(sorted(ray.get(
    [where.options(scheduling_strategy=On(n, soft=False)).remote() for n in nodes]))))
"""

RAY_UNITS = {"head": "ray-head", "worker": "ray-worker"}
#: The Ray version the inventories pin.
RAY_VERSION = runpy.run_path(str(ROOT / "inventories" / "group_data" / "all.py"))["ray_version"]


def ray_venv(version: str) -> str:
    return f"/opt/aicluster/ray/{version}/venv"


def ray_start_times(tb: Testbed) -> dict[str, str]:
    """When each node's Ray unit last became active (node1 runs the head)."""
    out = {}
    for i, node in enumerate(tb.nodes):
        unit = RAY_UNITS["head" if i == 0 else "worker"]
        out[node["name"]] = tb.ssh(
            node["name"], f"systemctl show -p ActiveEnterTimestampMonotonic {unit}"
        ).strip()
    return out


def ray_live_nodes(status: str) -> list[str]:
    """The nodes `ray status` lists as active or idle (not those of recent failures):
    a manually started cluster names each node ``node_<id>``."""
    live = status.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return re.findall(r"^\s*\d+ (node_[0-9a-f]+)\s*$", live, re.M)


def assert_ray(tb: Testbed, version: str) -> None:
    """`ray status` on the head lists every node; a task runs on each node."""
    names = sorted(n["name"] for n in tb.nodes)
    head = tb.nodes[0]["name"]
    venv = ray_venv(version)
    for i, node in enumerate(tb.nodes):
        unit = RAY_UNITS["head" if i == 0 else "worker"]
        assert tb.ssh(node["name"], f"systemctl is-active {unit}").strip() == "active"
        assert tb.ssh(node["name"], f"{venv}/bin/ray --version").strip().endswith(version)
    # Workers join within seconds; give a slow node a minute.
    status = ""
    for _ in range(30):
        status = tb.ssh(head, f"{venv}/bin/ray status", check=False)
        if len(ray_live_nodes(status)) >= len(names):
            break
        tb.ssh(head, "sleep 2")
    print(status)
    assert len(ray_live_nodes(status)) == len(names), status
    tb.ssh(head, f"cat > /tmp/ray_probe.py <<'EOF'\n{RAY_PROBE}\nEOF")
    out = tb.ssh(head, f"{venv}/bin/python /tmp/ray_probe.py")
    ran = next(line for line in out.splitlines() if line.startswith("RAN-ON"))
    assert ran.split()[1:] == names, out


#: Slurm on the testbed: node1 runs slurmctld and slurmd, node2 slurmd. The testbed
#: has no GPU: each node's gres.conf names a STAND-IN device node, a character device
#: like /dev/null that the testbed makes at each node's boot (a production deploy
#: makes none; real nodes have /dev/nvidiaN).
SLURM_STANDIN_GPU = "/dev/aicluster-standin-gpu0"


def make_standin_gpus(tb: Testbed) -> None:
    """Check every testbed node has its stand-in GPU device node (before the deploy)."""
    for node in tb.nodes:
        tb.ssh(node["name"], f"test -c {SLURM_STANDIN_GPU}")
    print(f"stand-in GPUs: {SLURM_STANDIN_GPU} (a copy of /dev/null, made by the testbed) "
          "on every node")


def slurm_start_times(tb: Testbed) -> dict[str, str]:
    """When munge, slurmctld and slurmd last became active on each node."""
    return {
        node["name"]: tb.ssh(
            node["name"], "systemctl show -p ActiveEnterTimestampMonotonic munge slurmctld slurmd"
        ).strip()
        for node in tb.nodes
    }


def _wait(tb: Testbed, node: str, command: str, done, tries: int = 45) -> str:
    out = ""
    for _ in range(tries):
        out = tb.ssh(node, command, check=False)
        if done(out):
            return out
        tb.ssh(node, "sleep 2")
    return out


def assert_slurm(tb: Testbed) -> None:
    """sinfo shows every node idle; `srun -N2 hostname` runs on both; a job asking a
    (stand-in) GPU is scheduled and sees its allocation; slurmctld only on node1."""
    names = sorted(n["name"] for n in tb.nodes)
    head = tb.nodes[0]["name"]
    for node in tb.nodes[1:]:
        assert tb.ssh(node["name"], "systemctl is-active slurmctld", check=False).strip() in (
            "inactive", "unknown"
        ), f"{node['name']} runs slurmctld"
    for node in tb.nodes:
        assert tb.ssh(node["name"], "stat -c '%U %a' /etc/munge/munge.key").strip() == "munge 400"
    keys = {tb.ssh(n["name"], "sha256sum /etc/munge/munge.key").split()[0] for n in tb.nodes}
    assert len(keys) == 1, "the munge key differs between nodes"
    sinfo = _wait(tb, head, "sinfo -h -N -o '%N %t'",
                  lambda out: sorted({tuple(line.split()) for line in out.splitlines()})
                  == [(n, "idle") for n in names])
    print(sinfo)
    assert sorted({tuple(line.split()) for line in sinfo.splitlines()}) == [
        (n, "idle") for n in names
    ], sinfo
    ran = tb.ssh(head, "timeout 120 srun -N2 hostname")
    assert sorted(ran.split()) == names, ran
    env = tb.ssh(head, "timeout 120 srun -p gpu -N1 --gres=gpu:1 env")
    gpus = sorted(line for line in env.splitlines()
                  if line.startswith(("CUDA_VISIBLE_DEVICES=", "SLURM_STEP_GPUS=",
                                      "SLURM_JOB_GPUS=")))
    print(f"job with --gres=gpu:1 on a STAND-IN GPU ({SLURM_STANDIN_GPU}) sees: {gpus}")
    assert "CUDA_VISIBLE_DEVICES=0" in gpus, env


def slurm_said(tb: Testbed, head: str) -> str:
    """What Slurm says of its jobs and nodes (a failed assertion's message): each job's
    state and reason, and each node's state, reason and who set it when."""
    return "\n".join(tb.ssh(head, command, check=False) for command in (
        "squeue -a -o '%i %j %T %r %N'", "sinfo -N -o '%N %t %E %u %H'"))


def slurm_nodes_back(tb: Testbed, head: str) -> None:
    """Each node Slurm set down for not responding (a link cut longer than SlurmdTimeout)
    resumed, as an operator would once the link is back: slurmctld stops pinging such a
    node and only asks it to register about every 20 ping intervals (over half an hour
    at SlurmdTimeout 300), so it would stay down for the modules after."""
    out = tb.ssh(head, "sinfo -h -N -o '%N|%t|%E'", check=False)
    for line in sorted(set(out.splitlines())):  # sinfo -N: a line per partition
        name, state, reason = (line.split("|") + ["", ""])[:3]
        if state.startswith("down") and "not responding" in reason.lower():
            print(f"Slurm set {name} {state} ({reason}) while its link was cut: resumed")
            tb.ssh(head, f"scontrol update nodename={name} state=resume", check=False)


def assert_slurm_reconfigures_keeping_jobs(lab: Lab, deploy) -> None:
    """A slurm.conf change (through the lab's overrides) is applied by the deploy
    ``deploy()`` with `scontrol reconfigure`: a running job keeps running and no Slurm
    daemon restarts."""
    tb = lab.testbed
    head = tb.nodes[0]["name"]
    # The job must outlast the deploy (an Ansible run takes minutes on the testbed); it
    # is cancelled at the end.
    worker = tb.nodes[-1]["name"]
    # The worker must be able to take the job: idle (a module before may have left it
    # down, see slurm_nodes_back), and if not, say what Slurm says of it.
    state = _wait(tb, head, f"sinfo -h -n {worker} -o %t",  # a line per partition
                  lambda out: set(out.split()) == {"idle"})
    assert set(state.split()) == {"idle"}, slurm_said(tb, head)
    job = tb.ssh(head, f"sbatch --parsable -w {worker} --wrap 'sleep 1800'").strip()
    try:  # the job holds the whole worker (CR_Core_Memory): cancelled whatever happens
        state = _wait(tb, head, f"squeue -h -j {job} -o %T",
                      lambda out: out.strip() == "RUNNING")
        assert state.strip() == "RUNNING", slurm_said(tb, head)
        started = slurm_start_times(tb)
        with lab.overridden(slurm_config={**lab.overrides.get("slurm_config", {}),
                                          "MinJobAge": 600}):
            deploy()
        config = tb.ssh(head, "scontrol show config")
        assert re.search(r"^MinJobAge\s+= 600 sec", config, re.M), config
        assert tb.ssh(head, f"squeue -h -j {job} -o %T").strip() == "RUNNING"
        assert slurm_start_times(tb) == started, "a Slurm daemon restarted for a reconfigure"
        print(f"job {job} kept RUNNING across the reconfiguring deploy; no daemon restarted")
    finally:
        tb.ssh(head, f"scancel {job}", check=False)


#: NFS on the testbed: node1 serves NFS_EXPORT (on its NVMe cache, a STAND-IN loop
#: device) with nfs-ganesha; node2 is a client whose kernel has no NFS client, so the
#: deploy mounts nothing there and says why, and the data path is proven from user
#: space with libnfs (nfs-cp, nfs-cat), a test tool installed by the check.
NFS_EXPORT = "/mnt/nvme-cache/shared"
NFS_CLIENT_SKIPPED = "mounts skipped: this node's kernel has no NFS client"


def assert_nfs(tb: Testbed, output: str) -> None:
    """ganesha runs on node1 and exports NFS_EXPORT on its XFS cache; node2 mounted
    nothing and the deploy said why; node2 writes a file through ganesha with nfs-cp
    (retried through ganesha's grace period, about 90 s after it starts) and reads it
    back with nfs-cat, with the same checksum, and root was squashed on the server."""
    import time

    from aicluster.components.nfs.derive import server_address
    from aicluster.inventory import load_cluster
    from tests.e2e.conftest import TESTBED_INVENTORY

    server, client = tb.nodes[0]["name"], tb.nodes[1]["name"]
    assert tb.ssh(server, "systemctl is-active nfs-ganesha rpcbind").split() == [
        "active", "active"]
    assert f'Path = "{NFS_EXPORT}";' in tb.ssh(server, "cat /etc/ganesha/ganesha.conf")
    assert tb.ssh(server, f"findmnt -n -o FSTYPE --target {NFS_EXPORT}").strip() == "xfs"
    flat = " ".join(output.split()).replace("''", "'")
    assert NFS_CLIENT_SKIPPED in flat, "the deploy did not say why node2 mounts nothing"
    assert " nfs " not in tb.ssh(client, "cat /etc/fstab")
    address = server_address(load_cluster(TESTBED_INVENTORY))
    tb.ssh(client, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q libnfs-utils")
    print("test tool: libnfs-utils (NFS from user space; node2's kernel has no NFS client)")
    tb.ssh(client, "head -c 1048576 /dev/urandom > /tmp/e2e-probe.bin")
    local = tb.ssh(client, "sha256sum < /tmp/e2e-probe.bin").split()[0]
    deadline = time.monotonic() + 150
    attempt = 0
    while True:
        # A new name each try: a create refused in the grace period may leave the file
        # behind, and nfs-cp will not overwrite it (libnfs-utils has no nfs-rm).
        attempt += 1
        name = f"e2e-probe-{attempt}.bin"
        url = f"nfs://{address}{NFS_EXPORT}/{name}"
        # In the grace period nfs-cp may also exit 0 with the file short: read it back.
        status = run_ssh_status(tb, client, f"timeout 15 nfs-cp /tmp/e2e-probe.bin {url}")
        remote = tb.ssh(client, f"set -o pipefail; timeout 30 nfs-cat {url} | sha256sum",
                        check=False).split()[:1]
        if status == 0 and remote == [local]:
            break
        assert time.monotonic() < deadline, (
            f"{url}: nfs-cp status {status}, read back {remote}, wrote {local}")
        print(f"{url}: nfs-cp status {status}, read back {remote} (ganesha's grace "
              "period?), retrying")
        time.sleep(5)
    on_disk = tb.ssh(server, f"stat -c %U {NFS_EXPORT}/{name}; "
                             f"sha256sum < {NFS_EXPORT}/{name}").split()
    assert on_disk[0] == "nobody" and on_disk[1] == local, on_disk
    print(f"{client} wrote 1 MiB through nfs-ganesha on {server} ({url}) and read it back: "
          f"sha256 {local} on both sides and on the server's XFS, owned by nobody "
          "(root_squash)")


#: Warnings a two-node test cluster may show that say only that it is small.
SIZE_WARNINGS = {"MDS_INSUFFICIENT_STANDBY", "MON_DISK_LOW", "TOO_FEW_OSDS",
                 "POOL_NO_REDUNDANCY"}


def ceph_status(tb: Testbed) -> dict:
    return json.loads(tb.ssh("node1", "ceph --connect-timeout 30 status -f json"))


def assert_ceph_healthy(tb: Testbed) -> None:
    """Two OSDs up and in, a manager, every placement group active+clean, health OK or
    only the warnings of a small cluster."""
    status = {}
    for _ in range(90):
        status = ceph_status(tb)
        pgs = status["pgmap"]
        clean = sum(s["count"] for s in pgs.get("pgs_by_state", [])
                    if s["state_name"] == "active+clean")
        if status["osdmap"]["num_up_osds"] == 2 and pgs["num_pgs"] and clean == pgs["num_pgs"]:
            break
        time.sleep(2)
    print("ceph status:", json.dumps(status["health"], indent=1))
    assert status["osdmap"]["num_up_osds"] == 2 and status["osdmap"]["num_in_osds"] == 2
    assert status["mgrmap"]["available"]
    pgs = status["pgmap"]
    assert pgs["num_pgs"] > 0 and all(
        s["state_name"] == "active+clean" for s in pgs["pgs_by_state"]), pgs
    health = status["health"]
    assert health["status"] in ("HEALTH_OK", "HEALTH_WARN"), health
    assert set(health.get("checks") or {}) <= SIZE_WARNINGS, health


#: Where each node records the components (and roles) the deploy gave it.
COMPONENTS_RECORD = "/etc/aicluster/components"


def recorded_components(tb: Testbed, node: str) -> dict:
    """What *node* recorded it runs: ``{component: [its groups]}``."""
    return json.loads(tb.ssh(node, f"cat {COMPONENTS_RECORD}"))["components"]


def recorded_mounts(tb: Testbed, node: str) -> dict:
    """The network mounts *node* recorded: ``{component: [mount points]}``."""
    return json.loads(tb.ssh(node, f"cat {COMPONENTS_RECORD}")).get("mounts", {})


def sinfo_nodes(tb: Testbed, head: str, want: list[str]) -> list[str]:
    """The nodes sinfo on *head* lists, once they are *want* (or when waiting ends)."""
    out = _wait(tb, head, "sinfo -h -N -o %N", lambda o: sorted(set(o.split())) == want)
    return sorted(set(out.split()))
