"""The whole lab inventory planned on fake hosts, one plan per supported OS, compared
with a golden file a person has read (tests/fixtures/golden/lab-plan/<os>.txt).

The repository's own ``deploy.py`` runs for every host of ``inventories/lab.py`` (as
``pyinfra inventories/lab.py deploy.py`` loads it, group_data included) on fake hosts
(tests/deploys/harness.py): no host is contacted. Each node is bare (nothing installed,
no file of ours; on Rocky, firewalld on, as Rocky installs it) with the hardware the lab
declares: eight H100 SXM5 GPUs (PCI device 0x2330) and four NVSwitches (0x22a3) on each
GPU node, its four InfiniBand HCAs at the PCI addresses the lab names, its NICs by name
or MAC, its NVMe and SATA drives empty.
The release artifacts are STAND-INS (files named by the real pins' sha256, holding a
line of text; pyinfra plans the upload of whatever file it is given) and the secrets
fixed test values, so the plan is the same on every run and machine.

The facts are read once, from the bare node, as the harness answers them: an operation
does not see what an earlier one made (the ``ollama`` user the NVMe cache makes is
planned again by Ollama; on a real run pyinfra reads facts as each operation runs).

Where the lab as written cannot run on an OS, the plan for that OS changes the one
setting an operator would change there (:data:`OVERRIDES`, each with its reason, and
named at the top of the golden file).

Regenerate after an intended change with ``AICLUSTER_UPDATE_GOLDEN=1`` and read the diff.
"""

from __future__ import annotations

import hashlib
import logging
import re
import runpy
import sys
from pathlib import Path

import pytest
from pyinfra.api.exceptions import PyinfraError

from aicluster import DEPLOY_FILE, PROJECT_ROOT, artifacts
from aicluster import render as render_module
from aicluster.components import component_module
from aicluster.components.nvidia.probe import parse as nvidia_node
from aicluster.inventory import COMPONENT_ORDER, load_hosts, validate
from tests.deploys.conftest import DISTRIBUTIONS
from tests.deploys.harness import Plan, plan
from tests.deploys.test_nfs import KERNEL_FULL
from tests.deploys.test_nvidia import node_output
from tests.deploys.test_nvme_cache import _fact as block_devices
from tests.deploys.test_nvme_cache import _record as empty_drive
from tests.golden import GOLDEN_DIR, assert_golden

LAB = PROJECT_ROOT / "inventories" / "lab.py"
GOLDEN = GOLDEN_DIR / "lab-plan"

#: The one setting per OS an operator running the lab there would change, and why.
OVERRIDES: dict[str, dict[str, tuple[str, str]]] = {
    "debian12": {},
    # group_data/all.py pins Slurm 22.05.8, the only Slurm Debian 12 ships. The deploy
    # installs the distribution's Slurm at slurm_version, which must be a version the
    # distribution ships (roles/slurm/defaults/main.yml), and does not refuse another
    # at plan time: the installer fails on the node. An operator pins what the OS has.
    # (Ubuntu's versions as roles/slurm/defaults/main.yml lists them.)
    "ubuntu2204": {
        "slurm_version": ("21.08.5", "Ubuntu 22.04 ships Slurm 21.08.5, not 22.05.8"),
    },
    "ubuntu2404": {
        "slurm_version": ("23.11.4", "Ubuntu 24.04 ships Slurm 23.11.4, not 22.05.8"),
        # Ceph's repository has no tentacle build for noble (ceph_repo_builds): as the
        # lab is written, Ceph refuses every host (all six are Ceph hosts; see
        # test_the_lab_as_written_refuses_ceph_tentacle_on_ubuntu_2404), so nothing is
        # deployed. The refusal's first advice: a release built for noble, from the same
        # mirror of Ceph's repository (docs/components/ceph.md: noble, umbrella only).
        "ceph_release": ("umbrella", "Ceph's repository builds only umbrella for noble"),
    },
    "rocky9": {
        # EPEL 9's Slurm is of the 22.05 line (tests/unit/test_slurm.py reads
        # 22.05.9-1.el9; not checked against EPEL's index here): pinned by its minor
        # version, whatever the point release (dnf installs slurm-22.05*, the installer
        # accepts 22.05.*).
        "slurm_version": ("22.05", "EPEL 9 ships Slurm 22.05.x, not Debian's 22.05.8"),
        # Monitoring refuses every node of a monitored cluster on EL9 (no package source
        # of Prometheus and its exporters verified: docs/components/monitoring.md,
        # "Platforms"; see test_the_lab_as_written_refuses_monitoring_on_rocky_9): an
        # operator deploys the lab there without a monitoring group.
        "groups.monitoring": ([], "no Prometheus packages verified on EL9: monitoring "
                                  "refuses Rocky hosts"),
    },
}

#: Where each GPU sits (distinct from the HCAs' buses 1a, 3c, 4d, 5e the lab names).
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
#: Each GPU node's four HCAs, as the lab's hardware.ib_ports names them.
IB_BUSES = ("1a", "3c", "4d", "5e")

#: Fixed test values of the lab's secrets (never a real one).
MUNGE_KEY = bytes(range(256)) * 4
CEPH_SECRET = b"lab-plan-test-ceph-secret-".ljust(64, b".")
K3S_TOKEN = "lab-plan-test-k3s-token-0123456789abcdef"
MINIO_PASSWORD = "lab-plan-test-minio-password-0123456789"
GRAFANA_PASSWORD = b"lab-plan-test-grafana-admin-password\n"


# ---------------------------------------------------------------------------
# The lab on fake hosts
# ---------------------------------------------------------------------------


def _nics(pairs) -> list[dict]:
    """A NetworkInterfaces fact (as tests/deploys/test_network.py's): name, MAC, Mb/s."""
    return [{"name": n, "mac": m, "mtu": 1500, "state": "up", "speed_mbps": speed,
             "type": "ether", "kind": None} for n, m, speed in pairs]


def _node_nics(name: str) -> list[dict]:
    """The management NIC eno1, then the cluster NICs the lab declares (by name on the
    head and storage1, by MAC on the GPU nodes)."""
    if name == "head":
        return _nics([("eno1", "3c:ec:ef:00:00:10", 1000),
                      ("ens1f0", "3c:ec:ef:10:00:01", 25000),
                      ("ens1f1", "3c:ec:ef:10:00:02", 25000)])
    if name == "storage1":
        return _nics([("eno1", "3c:ec:ef:00:00:40", 1000),
                      ("ens2f0", "3c:ec:ef:40:00:01", 100000),
                      ("ens2f1", "3c:ec:ef:40:00:02", 100000)])
    n = int(name.removeprefix("gpu"))
    return _nics([("eno1", f"3c:ec:ef:00:00:{20 + n:02x}", 1000),
                  ("enp12s0np0", f"b8:3f:d2:00:{n:02x}:01", 100000),
                  ("enp13s0np0", f"b8:3f:d2:00:{n:02x}:02", 100000)])


def _ib_ports(n: int) -> list[dict]:
    """An InfinibandPorts fact (as tests/deploys/test_infiniband.py's): a bare node's HCAs
    under the kernel's names, found by the PCI addresses the lab names."""
    return [{"device": f"mlx5_{i}", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
             "link_layer": "InfiniBand", "netdev": f"ibp{int(bus, 16)}s0",
             "pci": f"0000:{bus}:00.0", "node_guid": f"b8ce:f603:00{n:02x}:{i:04x}",
             "port_guid": f"b8ce:f603:00{n:02x}:{i:04x}"} for i, bus in enumerate(IB_BUSES)]


def _gpu_node() -> dict:
    """A bare HGX H100 node (tests/deploys/test_nvidia.py's fact output), its GPUs moved
    off the HCAs' buses, its four HCAs seen as RDMA devices."""
    lines = node_output(rdma=[f"mlx5_{i}" for i in range(len(IB_BUSES))])
    gpus = iter(GPU_BUSES)
    lines = [f"pci=0000:{next(gpus):02x}:00.0 {line.split(' ', 1)[1]}"
             if line.startswith("pci=") and " 0x0302" in line else line for line in lines]
    return nvidia_node(lines)


def _facts(distro: str, hosts: list[tuple[str, dict]]) -> dict:
    """Each lab host's facts: a bare machine of ``distro`` with the lab's hardware."""
    out = {}
    for name, data in hosts:
        hardware = data.get("hardware", {})
        facts = {
            "LinuxDistribution": DISTRIBUTIONS[distro],
            "Os": "Linux",
            "Arch": "x86_64",
            "Which": lambda command, **kw: f"/usr/bin/{command}",
            "NetworkInterfaces": _node_nics(name),
            "NfsKernel": KERNEL_FULL,
            # A machine, not a container: Slurm's cgroup plugins.
            "CgroupWritable": True,
        }
        if DISTRIBUTIONS[distro]["release_meta"]["ID"] == "rocky":
            # Rocky installs firewalld and turns it on by default (its unit "loaded").
            facts["UnitLoaded"] = lambda unit, **kw: unit == "firewalld.service"
        facts["ManagementInterface"] = {"name": "eno1", "mac": facts["NetworkInterfaces"][0]["mac"]}
        if hardware.get("gpus"):
            facts["NvidiaNode"] = _gpu_node()
        if hardware.get("ib_ports"):
            facts["InfinibandPorts"] = _ib_ports(int(name.removeprefix("gpu")))
        drives = {}
        nvme = [d["device"] for d in data.get("ceph_osd_devices") or hardware.get("nvme") or []]
        drives.update({d: empty_drive(f"/dev/nvme{i}n1") for i, d in enumerate(nvme, 1)})
        sata = [d["device"] for d in data.get("minio_drives") or []]
        drives.update({d: empty_drive(f"/dev/sd{'abcd'[i]}") for i, d in enumerate(sata)})
        if drives:
            mounts = {f"/mnt/minio{i}": None for i in range(1, len(sata) + 1)} if sata else None
            facts["BlockDevices"] = block_devices(drives, mounts=mounts)
        out[name] = facts
    return out


def _lab(distro: str, secrets_dir: Path, overrides: dict | None = None):
    """The lab's hosts (pyinfra's merged data), groups and validated cluster."""
    loaded = load_hosts(LAB)
    hosts, groups = [], {}
    if overrides is None:
        overrides = {k: v for k, (v, _why) in OVERRIDES[distro].items()}
    # "groups.<group>": the group's hosts, in place of the lab's.
    group_overrides = {k.removeprefix("groups."): v for k, v in overrides.items()
                       if k.startswith("groups.")}
    overrides = {k: v for k, v in overrides.items() if not k.startswith("groups.")}
    for name, (host_groups, data) in loaded.items():
        data = {**data, **overrides}
        # The munge key's file on this (deploying) machine: a test file, not the lab's
        # /etc/aicluster/secrets/munge.key. The plan never names the file.
        data["secrets"] = {**data["secrets"], "munge_key": {"file": str(secrets_dir / "munge.key")}}
        hosts.append((name, data))
        for group in host_groups:
            groups.setdefault(group, []).append(name)
    for group, members in group_overrides.items():
        groups[group] = list(members)
    groups = {g: m for g, m in groups.items() if m}
    cluster = validate({n: (tuple(g for g, m in groups.items() if n in m), d) for n, d in hosts},
                       extra_groups=["lab"])
    return hosts, groups, cluster


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """The deploying machine: the lab's secrets at fixed test values, pyinfra's command
    line, and a directory for the STAND-IN artifacts (:func:`_resolve_standins`)."""
    monkeypatch.setenv("AICLUSTER_ACCEL", "0")  # the fake hosts answer facts; stock pyinfra
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AICLUSTER_K3S_TOKEN", K3S_TOKEN)
    monkeypatch.setenv("AICLUSTER_MINIO_ROOT_PASSWORD", MINIO_PASSWORD)
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inventories/lab.py", "deploy.py", "-y"])
    monkeypatch.setattr(artifacts, "_RESOLVED", {})
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "munge.key").write_bytes(MUNGE_KEY)
    # Not named in the lab's secrets: the default file, ~/.local/share/aicluster/lab/.
    ceph_secret = tmp_path / "home" / ".local" / "share" / "aicluster" / "lab" / "ceph.secret"
    ceph_secret.parent.mkdir(parents=True)
    ceph_secret.write_bytes(CEPH_SECRET)
    (ceph_secret.parent / "grafana-admin.secret").write_bytes(GRAFANA_PASSWORD)
    standins = tmp_path / "artifacts"
    standins.mkdir()
    return {"tmp": tmp_path, "secrets": secrets_dir, "standins": standins}


def _resolve_standins(cluster, standins: Path) -> dict[str, artifacts.Artifact]:
    """Every release artifact the lab pins, resolved (as deploy.py resolves them first)
    to a STAND-IN file named by its pinned sha256; returns that file -> its artifact."""
    arts = artifacts.needed(cluster)
    store = artifacts.Store.from_cluster(cluster)
    found, by_path = {}, {}
    for art in arts:
        path = standins / art.sha256
        path.write_bytes(f"STAND-IN for {art.label}\n".encode())
        found[art.key] = path
        by_path[str(path)] = art
    artifacts._RESOLVED[(tuple(arts), str(store.cache_dir), str(store.artifacts_dir))] = found
    return by_path


def _rendered_templates(monkeypatch) -> dict[str, str]:
    """sha256 of each text a role template rendered -> ``roles/<c>/templates/<t>``, for
    every module that bound ``aicluster.render.render``."""
    seen: dict[str, str] = {}
    real = render_module.render
    for component in COMPONENT_ORDER:  # every deploy module imported, then patched
        component_module(component)

    def render(component, template, variables, *args, **kwargs):
        text = real(component, template, variables, *args, **kwargs)
        seen.setdefault(hashlib.sha256(text.encode()).hexdigest(),
                        f"roles/{component}/templates/{template}")
        return text

    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "") or "").startswith("aicluster") \
                and getattr(module, "render", None) is real:
            monkeypatch.setattr(module, "render", render)
    return seen


# ---------------------------------------------------------------------------
# The plan as text
# ---------------------------------------------------------------------------

_PUT = re.compile(r"^FileUploadCommand\((?P<src>.*), (?P<dest>[^,]*)\)$")
#: A command longer than this is shown cut, with its length and digest.
LONG = 600


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def _upload_of(command: str) -> str | None:
    """The destination of an upload (of text or bytes, or of a local file)."""
    if command.startswith("upload "):
        return command.removeprefix("upload ").partition("\n")[0]
    put = _PUT.match(command)
    return put["dest"] if put else None


def _op_lines(op, templates: dict[str, str], standins: dict[str, artifacts.Artifact]):
    """An operation's commands, one line each; an upload with pyinfra's own steps around
    it (``mkdir -p`` and ``chown`` of its directory, ``chown`` and ``chmod`` of the file)
    as one line saying what is uploaded, from where, its owner and mode."""
    commands = list(op.commands)
    out: list[str] = []
    i = 0
    while i < len(commands):
        command = commands[i]
        dest = _upload_of(command)
        if dest is None:
            if len(command) > LONG:
                command = (command[:LONG // 2] + f" ... [{len(command)} chars, sha256 "
                           f"{_digest(command.encode())}]")
            lines = command.splitlines() or [""]
            out += [f"$ {lines[0]}", *(f"  {line}" for line in lines[1:])]
            i += 1
            continue
        parent = str(Path(dest).parent)
        # pyinfra's files.put makes the directory first: folded into the upload.
        made = re.compile(rf"\$ (mkdir -p|chown \S+) {re.escape(parent)}")
        while out and made.fullmatch(out[-1]):
            out.pop()
        if command.startswith("upload "):
            data = op.uploads[dest]
            source = templates.get(hashlib.sha256(data).hexdigest())
            what = f"{len(data)} bytes, sha256 {_digest(data)}"
            what += f", from {source}" if source else ""
        else:
            src = _PUT.match(command)["src"]
            art = standins.get(src)
            what = (f"artifact {art.label}, pinned sha256 {art.sha256[:12]}" if art
                    else f"local file {Path(src).name}")
        i += 1
        owner = mode = None
        while i < len(commands) and commands[i].split()[-1:] == [dest] \
                and commands[i].split()[0] in ("chown", "chmod") and len(commands[i].split()) == 3:
            word, value, _ = commands[i].split()
            owner, mode = (value, mode) if word == "chown" else (owner, value)
            i += 1
        extra = "".join([f", owner {owner}" if owner else "", f", mode {mode}" if mode else ""])
        out.append(f"upload {dest} ({what}{extra})")
    return out


def plan_text(distro: str, p: Plan, cluster, templates: dict[str, str],
              standins: dict[str, artifacts.Artifact], overrides: dict) -> str:
    """Per host, in order: each operation's name, and what it runs (commands; uploads
    by destination, size, digest, the template they were rendered from, owner and mode;
    artifacts by their pin). Its condition where it has one (``if: true``, or ``if:
    false, skipped``), ``no change`` where it has nothing to do."""
    out = [f"# The lab inventory planned on bare fake hosts: {distro}",
           "# (tests/deploys/test_lab_plan.py: per host, its operations in order)",
           "# Release artifacts: STAND-IN files uploaded under the real pins (names,",
           "# versions and sha256 are the lab's; the bytes are not the vendor's)."]
    for key, (value, why) in overrides.items():
        out.append(f"# override: {key} = {value!r} ({why})")
    for name, ops in p.ops.items():
        out += ["", f"== {name}: {', '.join(cluster.hosts[name].components())}"]
        for op in ops:
            flags = []
            if op.serial:
                flags.append("one host at a time")
            if op.conditional:
                flags.append("if: false, skipped" if op.skipped else "if: true")
            if not op.commands and not op.skipped:
                flags.append("no change")
            out.append(f"* {op.name}" + (f"  [{'; '.join(flags)}]" if flags else ""))
            out += [f"    {line}" for line in _op_lines(op, templates, standins)]
    return "\n".join(out) + "\n"


def _check_clean(text: str, machine: dict) -> None:
    """Nothing of this machine, and no secret, in the plan."""
    assert str(machine["tmp"]) not in text
    for secret in (K3S_TOKEN, MINIO_PASSWORD, CEPH_SECRET.decode(), MUNGE_KEY.hex()):
        assert secret not in text


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("distro", sorted(DISTRIBUTIONS))
def test_the_whole_lab_plans_on_bare_fake_hosts_with_standin_artifacts_golden(
        distro, machine, monkeypatch):
    hosts, groups, cluster = _lab(distro, machine["secrets"])
    standins = _resolve_standins(cluster, machine["standins"])
    templates = _rendered_templates(monkeypatch)
    p = plan(hosts, groups, {}, _facts(distro, hosts), lambda: runpy.run_path(str(DEPLOY_FILE)))
    # Every host planned to its end: deploy.py's last operation, after every component.
    for name, _ in hosts:
        assert p.names(name)[-1] == "Record the components this host runs " \
            "(/etc/aicluster/components)", (name, p.names(name)[-5:])
    text = plan_text(distro, p, cluster, templates, standins, OVERRIDES[distro])
    _check_clean(text, machine)
    assert_golden(GOLDEN / f"{distro}.txt", text)


#: What the lab as written is refused for on an OS, without the override its golden
#: names: (the OS, the override left out, the component refusing, its message per host).
REFUSALS = [
    # Ceph on every host (all are Ceph hosts), naming the setting.
    ("ubuntu2404", "ceph_release", "ceph",
     "host '{}': ceph: Ceph's repository has no tentacle build for noble "
     "(ceph_repo_builds.tentacle: bookworm, jammy, el9): nothing is changed"),
    # Monitoring on every host (every node of a monitored cluster runs the node exporter).
    ("rocky9", "groups.monitoring", "monitoring",
     "host '{}': monitoring: Rocky, Alma and RHEL 9 are not supported"),
]


@pytest.mark.parametrize("distro,override,component,message", REFUSALS,
                         ids=[f"{r[2]}-{r[0]}" for r in REFUSALS])
def test_the_lab_as_written_is_refused_by_host_before_anything_changes(
        distro, override, component, message, machine, caplog):
    deploy = component_module(component)
    overrides = {k: v for k, (v, _why) in OVERRIDES[distro].items() if k != override}
    hosts, groups, cluster = _lab(distro, machine["secrets"], overrides)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        plan(hosts, groups, {}, _facts(distro, hosts), deploy.deploy)
    errors = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    for name, _ in hosts:
        assert message.format(name) in errors, errors
