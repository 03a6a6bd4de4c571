"""Slurm's files rendered for inventories/lab.py against golden files, the values
computed from the inventory, and every bad Slurm input refused by name.

Regenerate the golden files after an intended change:

    AICLUSTER_UPDATE_GOLDEN=1 pytest tests/unit/test_slurm.py
"""

from __future__ import annotations

import pytest

from aicluster import PROJECT_ROOT
from aicluster.common.settings import merge_config as merge
from aicluster.common.settings import template_vars
from aicluster.components.slurm.derive import restart_needed
from aicluster.inventory import InventoryError, load_cluster
from aicluster.render import defaults, render
from tests.golden import GOLDEN_DIR, assert_golden

GOLDEN = GOLDEN_DIR / "slurm"
LAB = PROJECT_ROOT / "inventories" / "lab.py"

#: (golden file, template, host, facts): what the lab's nodes get on Debian with
#: writable cgroups; gpu1 without and with the NVIDIA driver loaded.
FILES = [
    ("slurm.conf", "slurm.conf.j2", "head", {}),
    ("cgroup.conf", "cgroup.conf.j2", "gpu1", {}),
    ("gres.conf.gpu1", "gres.conf.j2", "gpu1", {}),
    ("gres.conf.gpu1-driver", "gres.conf.j2", "gpu1", {"slurm_gres_autodetect_enabled": True}),
    ("gres.conf.head", "gres.conf.j2", "head", {}),
]


@pytest.fixture(scope="module")
def lab():
    return load_cluster(LAB)


@pytest.mark.parametrize("golden,template,host,facts", FILES, ids=[f[0] for f in FILES])
def test_lab_files_match_the_golden_files(lab, golden, template, host, facts):
    v = template_vars("slurm", lab, host, lab.hosts[host].data, "Debian", **facts)
    text = render("slurm", template, v)
    assert_golden(GOLDEN / golden, text)


def test_slurm_conf_is_the_same_on_every_slurm_node(lab):
    texts = {
        render("slurm", "slurm.conf.j2",
               template_vars("slurm", lab, h, lab.hosts[h].data, family))
        for h in ("head", "gpu1", "gpu4")
        for family in ("Debian", "RedHat")
    }
    assert len(texts) == 1


def test_merge_removes_null_keys():
    assert merge({"a": 1, "b": 2}, {"b": None, "c": 3}) == {"a": 1, "c": 3}


def test_defaults_restart_keys_cover_the_node_list():
    keys = defaults("slurm")["slurm_restart_keys"]
    assert restart_needed("NodeName=a CPUs=1\n", "NodeName=a CPUs=2\n", keys)
    assert not restart_needed("MinJobAge=300\n", "MinJobAge=600\n", keys)


# --- bad inputs ----------------------------------------------------------------------


def _bad(spec, changes):
    spec.set("groups.slurm_controller", ["n1"]).set("groups.slurm_workers", ["n1", "n2"])
    for path, value in changes:
        spec.set(path, value)
    with pytest.raises(InventoryError) as exc:
        load_cluster(spec.write())
    return exc.value.errors


# fmt: off
CASES = [
    ("gres-above-gpus",
     [("n2.hardware.gpus", {"model": "L40S", "count": 2}), ("n2.slurm_gres_gpus", 4)],
     "host 'n2': slurm_gres_gpus: 4 GPUs as GRES, but hardware.gpus.count is 2"),
    ("gres-without-gpus", [("n1.slurm_gres_gpus", 1)],
     "host 'n1': slurm_gres_gpus: 1 GPUs as GRES, but hardware.gpus.count is 0"),
    ("gres-not-a-count", [("n1.slurm_gres_gpus", "two")],
     "host 'n1': slurm_gres_gpus: Input should be a valid integer (got 'two')"),
    ("config-not-a-mapping", [("n1.slurm_config", ["SelectType=x"])],
     "host 'n1': slurm_config: Input should be a valid dictionary"),
    ("config-derived-key", [("n1.slurm_config", {"NodeName": "n[1-2]"})],
     "host 'n1': slurm_config.NodeName: computed from the inventory"),
    ("config-bad-key", [("n1.slurm_config", {"Select Type": "x"})],
     "host 'n1': slurm_config: 'Select Type' is not a Slurm key"),
    ("config-newline", [("n1.slurm_config", {"SelectType": "x\nAuthType=none"})],
     "host 'n1': slurm_config: SelectType: a value may not hold a newline or '#'"),
    ("cgroup-choice", [("n1.slurm_cgroup_plugins", "maybe")],
     "host 'n1': slurm_cgroup_plugins: Input should be a valid boolean (got 'maybe')"),
    ("memory-percent", [("n2.slurm_memory_percent", 150)],
     "host 'n2': slurm_memory_percent: Input should be less than or equal to 100 (got 150)"),
    ("batch-size", [("n1.slurm_upgrade_batch_size", 0)],
     "host 'n1': slurm_upgrade_batch_size: Input should be greater than or equal to 1 (got 0)"),
    ("two-dbd", [("groups.slurm_dbd", ["n1", "n2"])],
     "host 'n2': groups: slurm_dbd allows at most 1 host; the inventory has 2"),
    ("dbd-without-controller", [("groups.slurm_controller", []), ("groups.slurm_workers", []),
                                ("groups.slurm_dbd", ["n1"])],
     "host 'n1': groups: Slurm needs a slurm_controller host"),
    ("unknown-key", [("n1.slurm_gres_gpu", 2)],
     "host 'n1': slurm_gres_gpu: not a slurm setting; did you mean slurm_gres_gpus?"),
    ("quoted-number", [("n1.slurm_memory_percent", "95")],
     "host 'n1': slurm_memory_percent: Input should be a valid integer (got '95')"),
    ("version-not-pinned", [("all.slurm_version", "latest")],
     "host 'n1': slurm_version: 'latest' is not a version"),
]
# fmt: on


@pytest.mark.parametrize("changes,wanted", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_slurm_input_is_refused_naming_host_and_field(spec, changes, wanted):
    errors = _bad(spec, changes)
    assert len(errors) == 1, errors
    assert errors[0].startswith(wanted), errors[0]


# --- Slurm's NVML plugin: the fact's shell and the decision both engines take ---------


def _nvml_shell(tmp_path, tool: str, script: str, plugin_dir: str | None) -> list[str]:
    """NVML_COMMAND run here with its plugin paths moved under ``tmp_path`` (a STAND-IN
    plugin file where ``plugin_dir`` names one) and a STAND-IN ``tool`` (dpkg-query or
    rpm) on PATH that answers as ``script`` says."""
    import os
    import shutil
    import subprocess

    from aicluster.components.slurm.probe import NVML_COMMAND, NVML_PLUGIN_PATHS

    command = NVML_COMMAND
    for path in NVML_PLUGIN_PATHS:
        command = command.replace(path, f"{tmp_path}{path}")
    if plugin_dir:
        (tmp_path / plugin_dir.lstrip("/")).mkdir(parents=True)
        (tmp_path / plugin_dir.lstrip("/") / "gpu_nvml.so").write_bytes(b"\x7fELF")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("sh", "sed", "grep", "head"):
        (bindir / name).symlink_to(shutil.which(name))
    (bindir / tool).write_text(f"#!/bin/sh\n{script}\n")
    (bindir / tool).chmod(0o755)
    proc = subprocess.run([str(bindir / "sh"), "-c", command], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(bindir)}, check=True)
    return proc.stdout.splitlines()


#: A STAND-IN dpkg-query answering as Debian 12's does (formats of dpkg-query 1.21):
#: ``-S`` prints "package: path", ``-W -f`` the format asked for.
DPKG = r"""
case "$1 $2" in
  "-S "*) case "$2" in */slurm-wlm/gpu_nvml.so) echo "slurm-wlm-nvml-plugin: $2";;
          *) echo "dpkg-query: no path found matching pattern $2" >&2; exit 1;; esac;;
  "-W -f") case "$3 $4" in
     '${Version} slurm-wlm-nvml-plugin') printf '22.05.8-4+deb12u2';;
     '${Status} ${Version} slurmd') printf 'install ok installed 22.05.8-4+deb12u3';;
     *) exit 1;; esac;;
esac
"""


def test_nvml_probe_reads_a_debian_plugin_and_slurmds_version(tmp_path):
    from aicluster.components.slurm.probe import parse_nvml

    lines = _nvml_shell(tmp_path, "dpkg-query", DPKG, "/usr/lib/x86_64-linux-gnu/slurm-wlm")
    assert parse_nvml(lines) == {
        "plugin": f"{tmp_path}/usr/lib/x86_64-linux-gnu/slurm-wlm/gpu_nvml.so",
        "package": "slurm-wlm-nvml-plugin", "version": "22.05.8-4+deb12u2",
        "slurmd": "22.05.8-4+deb12u3"}


def test_nvml_probe_without_the_plugin_reads_only_slurmd(tmp_path):
    from aicluster.components.slurm.probe import parse_nvml

    lines = _nvml_shell(tmp_path, "dpkg-query", DPKG, None)
    assert lines == ["slurmd 22.05.8-4+deb12u3"]
    assert parse_nvml(lines)["plugin"] is None and parse_nvml([])["slurmd"] is None


def test_nvml_probe_reads_an_el_plugin_with_rpm(tmp_path):
    from aicluster.components.slurm.probe import parse_nvml

    rpm = r"""
case "$1" in
  -qf) printf 'package slurm 22.05.9-1.el9\n';;
  -q) printf 'slurmd 22.05.9-1.el9\n';;
esac
"""
    lines = _nvml_shell(tmp_path, "rpm", rpm, "/usr/lib64/slurm")
    fact = parse_nvml(lines)
    assert fact["package"] == "slurm" and fact["version"] == fact["slurmd"] == "22.05.9-1.el9"


def test_both_engines_take_the_gres_decision_from_the_same_code():
    """The Ansible role's filter is derive's, fed the probes' raw output; the pyinfra
    deploy calls derive.gres_autodetect with the parsed facts."""
    import importlib.util

    from aicluster.components.slurm import derive

    spec = importlib.util.spec_from_file_location(
        "aicluster_slurm_filters", PROJECT_ROOT / "roles/slurm/filter_plugins/aicluster_slurm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    decide = module.FilterModule().filters()["aicluster_slurm_gres_autodetect"]
    assert decide is derive.gres_autodetect_probed
    older = ["plugin /usr/lib/x86_64-linux-gnu/slurm-wlm/gpu_nvml.so",
             "package slurm-wlm-nvml-plugin 22.05.8-4+deb12u2", "slurmd 22.05.8-4+deb12u3"]
    same = [*older[:1], "package slurm-wlm-nvml-plugin 22.05.8-4+deb12u3", older[2]]
    assert decide(None, 8, "yes\n", same, "22.05.8") == {"enabled": True, "why": ""}
    result = decide(None, 8, "yes\n", older, "22.05.8")
    assert not result["enabled"] and "is not slurmd's version" in result["why"]
    assert not decide(None, 8, "yes", older[2:], "")["enabled"]       # no plugin
    assert decide(None, 8, "no", same, "") == {"enabled": False, "why": ""}  # no driver
    assert decide(None, 0, "yes", same, "")["enabled"] is False        # no GPUs
    assert decide(True, 8, "no", [], "")["enabled"] is True             # the setting decides
    assert decide(False, 8, "yes", same, "")["enabled"] is False
