"""Both engines write the same text from the same template.

Every template of every role (``roles/*/templates/*.j2``) is rendered for several
hosts of the lab inventory, for each OS family, through ``aicluster.render`` (what
pyinfra uploads), and the text is written where Ansible's own
``ansible.builtin.template`` module then renders the same template with the same
variables (one ``ansible-playbook`` run on localhost for all cases). Ansible must
find nothing to change (changed=0: its text has the same checksum) and every file
must still hold pyinfra's bytes; where Ansible rewrote one, the test shows the diff.
Cases that give a template the same value for every variable it reads render once.
A second test checks that the Ansible inventory hands Ansible the very values pyinfra
renders with.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import pytest

from aicluster import PROJECT_ROOT, ROLES_DIR
from aicluster.common.settings import template_vars
from aicluster.inventory import Cluster, ansible_inventory, load_cluster
from aicluster.render import FILTERS, defaults, os_vars, render

LAB = PROJECT_ROOT / "inventories" / "lab.py"
#: Whether a node is a container decides which files base writes (the chrony drop-in),
#: never a template's variables, so every template is rendered for every case.
FAMILIES = ("Debian", "RedHat")
TEMPLATES = sorted(ROLES_DIR.glob("*/templates/*.j2"))
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOq2fQ1bq8yWc7h0mYk3sJr0a1x5t9Lw2Zp4nVd6eXb{} {}@lab"

#: Data put over a host's own to take the branches the lab inventory does not: no
#: upstream time source (the time server serves its own clock), SSH only from some
#: networks (IPv4 and IPv6), public ports, a dropped and an added sysctl, a numeric
#: memlock limit, several admin users with and without sudo and keys.
VARIANTS: dict[str, dict[str, Any]] = {
    # slurm: the NVIDIA driver loaded (AutoDetect=nvml), nodes without writable cgroups,
    # no pinned version (no apt pin, the distribution's Slurm).
    "slurm": {
        "slurm_gres_autodetect": True,
        "slurm_cgroup_plugins": False,
        "slurm_version": "",
    },
    # nvidia: a branch pin without an exact version, from branch 590 on (NVIDIA's pinning
    # package: the installer's pinning steps), a site mirror's repository layout.
    "nvidia": {
        "nvidia_driver_version": None,
        "nvidia_driver_branch": "590",
        "nvidia_cuda_repo_distro": "ubuntu2404",
        "nvidia_cuda_repo_arch": "sbsa",
    },
    # ray: no dashboard, custom resources on every node (the head too).
    "ray": {
        "ray_dashboard": False,
        "ray_resources": {"nvswitch": 1, "tpu-v5.lite:0": 0.5},
    },
    # k3s: the user's config over the defaults (lists, a boolean, a dropped default),
    # node labels, an address in front of the servers, another readiness timeout.
    "k3s": {
        "k3s_config": {"disable": ["traefik", "servicelb"], "write-kubeconfig-mode": None,
                       "kubelet-arg": ["max-pods=250"], "secrets-encryption": True},
        "k3s_node_labels": ["topology.kubernetes.io/zone=rack1"],
        "k3s_registration_address": "k3s.lab.internal",
        "k3s_ready_timeout": 300,
    },
    # network: bonds of another mode (no LACP rate), every fast NIC tuned (by MAC on
    # the GPU nodes, by name elsewhere) with other ring sizes.
    "network": {
        "network_bond_defaults": {"mode": "active-backup", "hash": "layer2", "miimon": 200,
                                  "lacp_rate": "slow"},
        "network_nic_tuning": True,
        "network_tuning_min_speed_gbps": 25,
        "network_ring_rx": 4096,
        "network_ring_tx": 2048,
    },
    # infiniband: the user's opensm options over the defaults (one dropped).
    "infiniband": {
        "infiniband_opensm_config": {"log_max_size": None, "routing_engine": "ftree"},
    },
    # nvme_cache: no cache directories (no environment), other mount options, FS-Cache.
    # nfs: an export with other options (read-only, all squashed to a uid/gid, a
    # network and a subnet), other server settings (a key dropped, a section added),
    # a chosen mount with its options, NFSv3 and FS-Cache on the clients.
    "nfs": {
        "nfs_exports": [{"path": "/srv/scratch", "networks": ["fabric", "10.99.0.0/16"],
                         "options": ["ro", "all_squash", "anonuid=2000", "anongid=2000"],
                         "export_id": 7}],
        "nfs_server_config": {"nfsd": {"vers3": "n", "threads": None},
                              "mountd": {"manage-gids": True}},
        "nfs_mounts": [{"export": "/srv/models", "path": "/models", "options": ["ro"]}],
        "nfs_version": "3",
        "nfs_fscache": True,
    },
    "nvme_cache": {
        "nvme_cache_directories": [],
        "nvme_cache_mount_options": ["noatime", "discard", "nofail"],
        "nvme_cache_fscache": True,
        "nvme_cache_fscache_dir": "fs/cache",
    },
    # ollama: every interface, a keep-alive in seconds, the user's settings over the
    # defaults (a boolean, a number, one dropped), models elsewhere, a gateway on every
    # interface of another port.
    "ollama": {
        "ollama_host": "0.0.0.0",
        "ollama_keep_alive": -1,
        "ollama_config": {"OLLAMA_FLASH_ATTENTION": True, "OLLAMA_CONTEXT_LENGTH": 8192,
                          "OLLAMA_ORIGINS": None},
        "ollama_models": ["llama3.2:3b"],
        "ollama_models_dir": "/srv/ollama/models",
        "ollama_gateway_listen": "0.0.0.0",
        "ollama_gateway_port": 8080,
    },
    # monitoring: every kind of receiver (a webhook by URL and by secret, e-mail with an
    # SMTP password's secret, none), routes by severity, a size-capped retention, extra
    # probes of each module.
    "monitoring": {
        "monitoring_receivers": [
            {"name": "ops", "type": "webhook", "url": "http://192.0.2.5:8080/alerts",
             "send_resolved": False},
            {"name": "chat", "type": "webhook", "url_key_name": "chat_webhook"},
            {"name": "mail", "type": "email", "to": "ops@example.org",
             "from": "alerts@example.org", "smarthost": "smtp.example.org:587",
             "auth_username": "alerts", "auth_key_name": "smtp_password",
             "require_tls": False},
            {"name": "quiet", "type": "none"},
        ],
        "monitoring_route": {"critical": "mail", "warning": "chat", "none": "quiet",
                             "default": "ops"},
        "monitoring_retention_size_gb": 100,
        "monitoring_blackbox_targets": [
            {"name": "license", "module": "tcp_connect", "target": "192.0.2.7:27000"},
            {"name": "portal", "module": "http_2xx", "target": "https://portal.example.org/"},
            {"name": "gateway", "module": "icmp", "target": "192.0.2.1"},
        ],
    },
    # minio: the user's settings over the defaults (one dropped), another root user.
    "minio": {
        "minio_config": {"MINIO_UPDATE": None, "MINIO_STORAGE_CLASS_STANDARD": "EC:2",
                         "MINIO_BROWSER": False},
        "minio_root_user": "s3-admin",
    },
    "base": {
        "base_chrony_upstream": [],
        "base_firewall_ssh_sources": ["192.0.2.0/24", "2001:db8::/32"],
        "base_firewall_public_ports": [{"port": 443}, {"port": 53, "proto": "udp"}],
        "base_sysctl": {"net.core.somaxconn": None, "vm.max_map_count": 1048576},
        "base_memlock_limit": 65536,
        "base_admin_users": [
            {
                "name": "ops",
                "ssh_keys": [_KEY.format(1, "ops"), _KEY.format(2, "ops")],
                "sudo": True,
                "shell": "/bin/zsh",
            },
            {"name": "viewer", "ssh_keys": [], "sudo": False},
            {"name": "dev", "ssh_keys": [_KEY.format(3, "dev")]},
        ],
    },
}

#: Values a deploy computes on the deploying machine just before it renders, never in the
#: inventory (so not in template_vars): a stand-in for MinIO's root password.
DEPLOY_VALUES: dict[str, dict[str, Any]] = {
    "minio": {"minio_root_password": "parity-stand-in-password"},
    # ceph: the directory of Ceph's repository the node's system reads (its facts).
    "ceph": {"ceph_repo_suite": "jammy"},
}

#: Templates written once per item of a list, with the item in a loop variable
#: (Ansible's ``loop_control.loop_var``): template -> (loop variable, list variable).
LOOP_VARS: dict[tuple[str, str], tuple[str, str]] = {
    ("base", "authorized_keys.j2"): ("base_admin_user", "base_admin_users"),
    ("network", "networkd.network.j2"): ("network_interface", "network_interfaces"),
    ("network", "networkd.netdev.j2"): ("network_interface", "network_interfaces"),
    ("network", "networkmanager.nmconnection.j2"): ("network_interface", "network_interfaces"),
    ("nfs", "fstab.j2"): ("nfs_mount", "nfs_mount_list"),
}


#: Templates written only on the hosts where a variable holds (the role's ``when:``):
#: template -> that variable. Elsewhere the template's values are not computed.
ONLY_WHEN: dict[tuple[str, str], str] = {
    ("monitoring", t): "monitoring_is_server"
    for t in ("prometheus.yml.j2", "alertmanager.yml.j2", "blackbox.yml.j2", "prometheus.j2",
              "prometheus-alertmanager.j2", "prometheus-blackbox-exporter.j2")
}
ONLY_WHEN.update({
    ("monitoring", t): "monitoring_grafana_enabled"
    for t in ("grafana.ini.j2", "grafana-datasources.yaml.j2", "grafana-dashboards.yaml.j2",
              "aicluster-grafana.service.j2")
})


@dataclass(frozen=True)
class Case:
    """One host, one OS family, one set of data: the variables of one component."""

    id: str
    component: str
    host: str
    family: str
    variables: dict[str, Any]


@dataclass(frozen=True)
class Render:
    """One file to write: a template, its variables, and where Ansible writes it."""

    case: Case
    template: str
    variables: dict[str, Any]
    dest: str


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return load_cluster(LAB)


def _hosts_for(cluster: Cluster, component: str) -> list[str]:
    """One host per distinct set of groups among those given the component: for the
    lab, the head (also the time server and package cache), a GPU node, storage."""
    picked: dict[tuple[str, ...], str] = {}
    for name, host in cluster.hosts.items():
        if component in host.components():
            picked.setdefault(tuple(sorted(host.groups)), name)
    return list(picked.values())


def _cases(cluster: Cluster) -> list[Case]:
    cases = []
    for component in sorted({t.parent.parent.name for t in TEMPLATES}):
        for name in _hosts_for(cluster, component):
            data = dict(cluster.hosts[name].data)
            variants = {"lab": data}
            if component in VARIANTS:
                variants["variant"] = {**data, **VARIANTS[component]}
            for family in FAMILIES:
                for label, host_data in variants.items():
                    cases.append(
                        Case(
                            id=f"{component}-{name}-{family}-{label}",
                            component=component,
                            host=name,
                            family=family,
                            variables={
                                **template_vars(component, cluster, name, host_data, family),
                                **DEPLOY_VALUES.get(component, {}),
                            },
                        )
                    )
    return cases


def _variables_read(component: str, template: str) -> frozenset[str] | None:
    """The variables a template reads, or None when it includes other templates
    (then every variable counts)."""
    source = (ROLES_DIR / component / "templates" / template).read_text()
    env = jinja2.Environment()
    env.filters.update(FILTERS)  # the filters templates may use (aicluster.render)
    ast = env.parse(source)
    if any(ast.find_all((jinja2.nodes.Include, jinja2.nodes.Import, jinja2.nodes.Extends))):
        return None
    return frozenset(jinja2.meta.find_undeclared_variables(ast))


def _distinct(renders: list[Render]) -> list[Render]:
    """One render per template and distinct values of the variables it reads."""
    seen: dict[tuple[str, str, str], Render] = {}
    for r in renders:
        names = _variables_read(r.case.component, r.template)
        values = {k: v for k, v in r.variables.items() if names is None or k in names}
        key = (r.case.component, r.template, json.dumps(values, sort_keys=True))
        seen.setdefault(key, r)
    return list(seen.values())


def _renders(cases: list[Case]) -> list[Render]:
    out = []
    for case in cases:
        for path in TEMPLATES:
            if path.parent.parent.name != case.component:
                continue
            when = ONLY_WHEN.get((case.component, path.name))
            if when is not None and not case.variables[when]:
                continue
            loop = LOOP_VARS.get((case.component, path.name))
            if loop is None:
                out.append(Render(case, path.name, case.variables, f"{case.id}/{path.stem}"))
                continue
            loop_var, list_var = loop
            for i, item in enumerate(case.variables[list_var]):
                out.append(
                    Render(
                        case,
                        path.name,
                        {**case.variables, loop_var: item},
                        f"{case.id}/{path.stem}.{i}",
                    )
                )
    return out


def _python_text(r: Render) -> str:
    try:
        return render(r.case.component, r.template, r.variables)
    except jinja2.UndefinedError as exc:
        pytest.fail(
            f"roles/{r.case.component}/templates/{r.template} ({r.case.id}): {exc}. A variable "
            "set per item of a loop belongs in LOOP_VARS of this test."
        )


def _ansible_play(renders: list[Render], out: Path) -> tuple[dict, dict, dict]:
    """An inventory of the cases' hosts (local connection), one task file per host,
    and the extra vars holding every render's variables."""
    hosts = sorted({r.case.host for r in renders})
    inventory = {
        "all": {
            "hosts": {
                h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                for h in hosts
            }
        }
    }
    extra: dict[str, Any] = {"aicluster_parity": {}}
    tasks: dict[str, list[dict[str, Any]]] = {h: [] for h in hosts}
    for i, r in enumerate(renders):
        key = f"r{i}"
        values = {k: v for k, v in r.variables.items() if k != "inventory_hostname"}
        assert r.variables["inventory_hostname"] == r.case.host
        extra["aicluster_parity"][key] = values
        # inventory_hostname is Ansible's own (no variable overrides it): a template that
        # reads it renders on the host of its case, the others on any host, in parallel.
        reads = _variables_read(r.case.component, r.template)
        if reads is None or "inventory_hostname" in reads:
            on = r.case.host
        else:
            on = hosts[i % len(hosts)]
        tasks[on].append(
            {
                "name": f"{r.dest} from {r.template}",
                "ansible.builtin.template": {
                    "src": str(ROLES_DIR / r.case.component / "templates" / r.template),
                    "dest": str(out / r.dest),
                },
                "vars": {k: f"{{{{ aicluster_parity.{key}['{k}'] }}}}" for k in values},
            }
        )
    return inventory, {h: t for h, t in tasks.items() if t}, extra


RECAP_RE = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


def _run_ansible(renders: list[Render], work: Path) -> tuple[Path, int, int, str]:
    """Run every render through Ansible into work/ansible. Returns the directory, the
    number of ok and of changed template tasks, and Ansible's output."""
    out = work / "ansible"
    inventory, tasks, extra = _ansible_play(renders, out)
    (work / "inventory.json").write_text(json.dumps(inventory))
    for host, host_tasks in tasks.items():
        (work / f"tasks-{host}.json").write_text(json.dumps(host_tasks))
    playbook = [
        {
            "name": "Render every template through Ansible",
            "hosts": ",".join(tasks),
            "gather_facts": False,
            "strategy": "free",
            "tasks": [
                {
                    "name": "This host's renders",
                    "ansible.builtin.include_tasks": str(
                        work / "tasks-{{ inventory_hostname }}.json"
                    ),
                }
            ],
        }
    ]
    (work / "playbook.json").write_text(json.dumps(playbook))
    (work / "vars.json").write_text(json.dumps(extra))
    (work / "ansible.cfg").write_text("[defaults]\n")
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.fail(f"ansible-playbook is not installed beside {sys.executable}")
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(work / "ansible.cfg"),
        "ANSIBLE_HOME": str(work / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
        "ANSIBLE_REMOTE_TMP": str(work / "ansible-remote-tmp"),
        "ANSIBLE_FORKS": str(len(tasks)),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_PIPELINING": "1",
    }
    proc = subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            str(work / "inventory.json"),
            "-e",
            f"@{work / 'vars.json'}",
            str(work / "playbook.json"),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"ansible-playbook failed:\n{output}"
    recap = [m.groups() for m in map(RECAP_RE.match, proc.stdout.splitlines()) if m]
    assert {h for h, *_ in recap} == set(tasks), f"no recap for every host:\n{output}"
    # Each host's include_tasks counts as one ok task too.
    ok = sum(int(o) for _, o, *_ in recap) - len(tasks)
    changed = sum(int(c) for _, _, c, *_ in recap)
    return out, ok, changed, output


def test_every_template_renders_the_same_through_both_engines(cluster, tmp_path):
    assert TEMPLATES, "no role templates found under roles/*/templates"
    cases = _cases(cluster)
    hosts = {c.host for c in cases}
    assert {"head", "gpu1"} <= hosts, (
        f"the cases should cover the time server and a GPU node: {hosts}"
    )
    renders = _renders(cases)
    never = {
        f"roles/{p.parent.parent.name}/templates/{p.name}"
        for p in TEMPLATES
        if not any(
            r.case.component == p.parent.parent.name and r.template == p.name for r in renders
        )
    }
    assert not never, f"templates no case renders (add a VARIANTS entry): {sorted(never)}"

    total = len(renders)
    renders = _distinct(renders)
    out = tmp_path / "ansible"
    expected = {}
    for r in renders:
        expected[r.dest] = _python_text(r).encode()
        (out / r.dest).parent.mkdir(parents=True, exist_ok=True)
        (out / r.dest).write_bytes(expected[r.dest])

    out, ok, changed, output = _run_ansible(renders, tmp_path)
    assert ok == len(renders), f"Ansible ran {ok} of {len(renders)} template tasks:\n{output}"

    problems = []
    for r in renders:
        got = (out / r.dest).read_bytes()
        if got != expected[r.dest]:
            diff = difflib.unified_diff(
                expected[r.dest].decode().splitlines(keepends=True),
                got.decode().splitlines(keepends=True),
                fromfile=f"aicluster.render: {r.dest}",
                tofile=f"ansible: {r.dest}",
            )
            problems.append("".join(diff) or f"{r.dest}: differ in bytes only: {got!r}")
    assert not problems, f"{len(problems)} of {len(renders)} renders differ:\n" + "\n".join(
        problems
    )
    assert changed == 0, f"Ansible rewrote {changed} file(s) with the same bytes:\n{output}"
    print(
        f"{len(TEMPLATES)} templates, {len(cases)} cases, {total} renders "
        f"({len(renders)} distinct): identical through both engines"
    )


def _ansible_view(component: str, hostvars: Mapping[str, Any], family: str) -> dict[str, Any]:
    """What Ansible sees in a role: defaults < inventory host vars < vars/<family>.yml."""
    return {**defaults(component), **hostvars, **os_vars(component, family)}


def test_the_ansible_inventory_hands_over_the_values_pyinfra_renders_with(cluster):
    hostvars = ansible_inventory(LAB, cluster)["_meta"]["hostvars"]
    components = sorted({t.parent.parent.name for t in TEMPLATES})
    differences = []
    for name, host in cluster.hosts.items():
        for component in components:
            if component not in host.components():
                continue
            for family in FAMILIES:
                want = template_vars(component, cluster, name, host.data, family)
                seen = _ansible_view(component, hostvars[name], family)
                for key, value in want.items():
                    if key == "inventory_hostname":
                        continue
                    if key not in seen:
                        differences.append(f"{name}/{family}: {key} is missing for Ansible")
                    elif seen[key] != value or type(seen[key]) is not type(value):
                        differences.append(
                            f"{name}/{family}: {key}: pyinfra {value!r}, Ansible {seen[key]!r}"
                        )
    assert not differences, "\n".join(differences)
