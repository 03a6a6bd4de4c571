"""The GPU layer of `aicluster check` (src/aicluster/checks/gpu.py): what it plans from the
inventory, and each check judging outputs of the real tools (tests/fixtures/check/gpu,
see its README for where each is shaped from).

The probes' own shell commands run here, through the check runner on this machine, with
STAND-IN nvidia-smi, journalctl, dmesg, systemctl, dcgmi, all_reduce_perf and srun first
on PATH that print those fixtures: no GPU is needed, and the commands, the framing of
their output and the readers are tested together."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

import pytest

from aicluster.checks import gpu
from aicluster.checks.context import Context
from aicluster.checks.result import Action, Result, Status
from aicluster.checks.runner import Completed, Probe, local_transport, run_probe
from aicluster.inventory import Cluster, load_cluster, validate

FIXTURES = Path(__file__).parents[1] / "fixtures" / "check" / "gpu"
NETWORKS = {"management": {"subnet": "192.0.2.0/24"},
            "fabric": {"subnet": "198.51.100.0/24", "mtu": 9000}}
H100 = {"model": "H100-SXM5-80GB", "count": 8, "memory_gb": 80, "nvswitch": True}


@pytest.fixture(scope="module")
def lab() -> Cluster:
    return load_cluster("inventories/lab.py")


@pytest.fixture(autouse=True)
def gpu_lock(tmp_path, monkeypatch) -> Path:
    """The lock the active GPU tests take on the node, here in the test's directory."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setattr(gpu, "GPU_LOCK", str(lock))
    return lock


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def relabel(cluster: Cluster, node: str, **data) -> Cluster:
    """The cluster again, with ``data`` laid over one host's."""
    hosts = {}
    for name, host in cluster.hosts.items():
        merged = copy.deepcopy(dict(host.data))
        if name == node:
            for key, value in data.items():
                if key == "hardware":
                    merged["hardware"] = {**merged.get("hardware", {}), **value}
                else:
                    merged[key] = value
        hosts[name] = (host.groups, merged)
    return validate(hosts, extra_groups={g for h in cluster.hosts.values() for g in h.groups})


def small(**nodes: tuple[list[str], dict]) -> Cluster:
    """A small inventory: name=(groups, hardware.gpus) for each host (192.0.2.N, a
    100 GbE fabric NIC)."""
    hosts = {}
    for n, (name, (groups, gpus)) in enumerate(nodes.items(), start=1):
        hosts[name] = (groups, {
            "cluster_name": "t", "networks": NETWORKS, "ssh_hostname": f"192.0.2.{n}",
            "nvidia_cuda_repo_url": "http://mirror.example/cuda",
            "hardware": {"cpus": 32, "memory_gb": 256, "gpus": gpus, "nics": [
                {"name": "eth1", "network": "fabric", "address": f"198.51.100.{n}",
                 "speed_gbps": 100, "mtu": 9000}]},
        })
    return validate(hosts)


def planned(ctx: Context, node: str, check: str) -> Probe:
    [probe] = [p for p in gpu.probes(ctx) if p.node == node and p.check == check]
    return probe


def run(probe: Probe, tmp_path: Path, **tools: str) -> list[Result]:
    """The probe's command run here by the check runner, ``tools`` (name -> sh body) first
    on PATH; its results as its reader makes them."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in tools.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)

    def transport(node: str, command: str, limit: float) -> Completed:
        return local_transport(node, f'PATH={shlex.quote(str(bindir))}:"$PATH"; export PATH\n'
                                     f"{command}", limit)

    return run_probe(probe, transport)


def cat(name: str, rc: int = 0) -> str:
    return f"cat {shlex.quote(str(FIXTURES / name))}; exit {rc}"


def smi(query: str = "smi-query-gpu-h100x8.csv", remap: str = "smi-remapped-rows-h100x8.csv",
        nvlink: str = "nvlink-s-h100x8.txt", q: str = "smi-q-h100x8.txt",
        query_rc: int = 0) -> str:
    """A stand-in nvidia-smi answering each of the probes' calls with a fixture."""
    return (f'case "$*" in\n'
            f"  *--query-gpu=*) {cat(query, query_rc)} ;;\n"
            f"  *--query-remapped-rows=*) {cat(remap)} ;;\n"
            f'  "nvlink -s") {cat(nvlink)} ;;\n'
            f'  "-q") {cat(q)} ;;\n'
            '  *) echo "unexpected nvidia-smi $*" >&2; exit 2 ;;\n'
            "esac")


def by_check(results: list[Result]) -> dict[str, Result]:
    return {r.check: r for r in results}


# ---------------------------------------------------------------------------
# What is planned where
# ---------------------------------------------------------------------------


def test_quick_tier_plans_the_state_the_xids_and_the_fabric_on_gpu_nodes_only(lab):
    probes = gpu.probes(Context(lab, "quick"))
    assert {p.node for p in probes} == {"gpu1", "gpu2", "gpu3", "gpu4"}  # not head, storage1
    for node in ("gpu1", "gpu2", "gpu3", "gpu4"):
        assert sorted(p.check for p in probes if p.node == node) == [
            "gpu.fabric", "gpu.state", "gpu.xid"]
    for node in ("gpu1", "gpu2", "gpu3", "gpu4"):  # the quick tier: a minute a node at most
        assert sum(p.timeout for p in probes if p.node == node) <= 60
    assert gpu.pair_checks(Context(lab, "quick")) == []


def test_standard_adds_dcgm_level_1_and_nccl_on_all_gpus(lab):
    ctx = Context(lab, "standard")
    assert "dcgmi diag -r 1 -j" in planned(ctx, "gpu1", "gpu.dcgm_diag").command
    nccl = planned(ctx, "gpu1", "gpu.nccl").command
    assert "-b 8 -e 8G -f 2 -g 8" in nccl and "/opt/nccl-tests/build/all_reduce_perf" in nccl
    assert '"$i" -lt 3' in nccl  # gpu.nccl_iterations


def test_burn_in_runs_dcgm_level_3_and_nccl_to_16g(lab):
    ctx = Context(lab, "burn-in")
    dcgm = planned(ctx, "gpu2", "gpu.dcgm_diag")
    assert "dcgmi diag -r 3 -j" in dcgm.command and dcgm.timeout >= 3600
    assert "-e 16G" in planned(ctx, "gpu2", "gpu.nccl").command


def test_a_stand_in_gpu_gets_one_skip_saying_why_and_nothing_else(tmp_path):
    cluster = small(node1=(["gpu_nodes", "slurm_controller", "slurm_workers"],
                           {"model": "standin", "count": 1, "vendor": "standin"}),
                    node2=(["gpu_nodes", "slurm_workers"],
                           {"model": "standin", "count": 1, "vendor": "standin"}))
    ctx = Context(cluster, "burn-in")
    probes = gpu.probes(ctx)
    assert [(p.node, p.check) for p in probes] == [("node1", "gpu.count"),
                                                   ("node2", "gpu.count")]
    [result] = run(probes[0], tmp_path)
    assert result.status is Status.SKIP and result.node == "node1"
    assert "stand-in GPU" in result.message and "no NVIDIA GPU" in result.message
    [pairs] = gpu.pair_checks(ctx)
    assert pairs.nodes == []  # nothing to test between stand-ins


def test_nothing_is_planned_for_a_node_outside_gpu_nodes():
    cluster = small(a1=(["gpu_nodes"], {"model": "A100-SXM4-80GB", "count": 4}),
                    cpu1=([], {}),
                    l4=([], {"model": "L4", "count": 1}))  # GPUs, but not a GPU node
    probes = gpu.probes(Context(cluster, "burn-in"))
    assert {p.node for p in probes} == {"a1"}
    # and no NVSwitch declared: no NVLink/Fabric Manager probe
    assert "gpu.fabric" not in [p.check for p in probes]


def test_a_single_gpu_node_skips_the_in_node_nccl_test(tmp_path):
    cluster = small(l4=(["gpu_nodes"], {"model": "L4", "count": 1}))
    [result] = run(planned(Context(cluster, "standard"), "l4", "gpu.nccl"), tmp_path)
    assert result.status is Status.SKIP and "one GPU" in result.message


# ---------------------------------------------------------------------------
# gpu.state: nvidia-smi --query-gpu and --query-remapped-rows
# ---------------------------------------------------------------------------


def test_a_healthy_h100_node_passes_every_state_check(lab, tmp_path):
    results = run(planned(Context(lab, "quick"), "gpu1", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi()})
    assert [r.check for r in results] == list(gpu.STATE_CHECKS)
    assert {r.check: r.status for r in results} == dict.fromkeys(gpu.STATE_CHECKS,
                                                                 Status.PASS)
    r = by_check(results)
    assert (r["gpu.count"].value, r["gpu.count"].threshold) == (8, 8)
    assert (r["gpu.driver"].value, r["gpu.driver"].threshold) == ("570.133.20", "570.133.20")
    assert r["gpu.model"].value == "NVIDIA H100 80GB HBM3"
    assert (r["gpu.pcie_width"].value, r["gpu.pcie_width"].threshold) == (16, 16)
    assert (r["gpu.temperature"].value, r["gpu.temperature"].unit) == (33, "C")
    assert all(x.node == "gpu1" and x.layer == "gpu" for x in results)


def test_a_lost_gpu_ecc_errors_a_narrow_link_persistence_off_and_heat_fail(lab, tmp_path):
    r = by_check(run(planned(Context(lab, "quick"), "gpu3", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi(query="smi-query-gpu-h100x8-bad.csv")}))
    assert r["gpu.count"].status is Status.FAIL
    assert (r["gpu.count"].value, r["gpu.count"].action) == (7, Action.REBOOT)
    assert "Unable to determine the device handle for GPU0000:AB:00.0" in r["gpu.count"].message
    assert r["gpu.persistence"].status is Status.FAIL
    assert "GPU 2 (00000000:3A:00.0)" in r["gpu.persistence"].message
    assert r["gpu.persistence"].action is Action.RESTART_SERVICE
    assert r["gpu.ecc"].status is Status.FAIL and r["gpu.ecc"].value == 2
    assert r["gpu.ecc"].action is Action.RESET_GPU and "GPU 3" in r["gpu.ecc"].message
    assert r["gpu.pcie_width"].status is Status.FAIL and r["gpu.pcie_width"].value == 8
    assert "GPU 6 (00000000:BA:00.0) x8 of x16" in r["gpu.pcie_width"].message
    assert r["gpu.temperature"].status is Status.FAIL and r["gpu.temperature"].value == 93
    # what is right stays right
    assert r["gpu.model"].status is Status.PASS and r["gpu.driver"].status is Status.PASS


def test_a_warm_gpu_and_old_ecc_errors_are_warnings(lab, tmp_path):
    r = by_check(run(planned(Context(lab, "quick"), "gpu1", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi(query="smi-query-gpu-h100x8-warm.csv")}))
    assert (r["gpu.temperature"].status, r["gpu.temperature"].value) == (Status.WARN, 87)
    assert r["gpu.temperature"].threshold == 85
    assert r["gpu.ecc"].status is Status.WARN and r["gpu.ecc"].action is Action.MONITOR


@pytest.mark.parametrize("pin,status", [
    ({"nvidia_driver_version": "570.133.20"}, Status.PASS),
    ({"nvidia_driver_version": None, "nvidia_driver_branch": "570"}, Status.PASS),
    ({"nvidia_driver_version": "570.124.06"}, Status.FAIL),
    ({"nvidia_driver_version": None, "nvidia_driver_branch": "575"}, Status.FAIL),
])
def test_the_driver_is_compared_with_the_pin_as_the_component_verifies_it(lab, tmp_path, pin,
                                                                          status):
    cluster = relabel(lab, "gpu2", **pin)
    r = by_check(run(planned(Context(cluster, "quick"), "gpu2", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi()}))
    assert r["gpu.driver"].status is status
    if status is Status.FAIL:
        assert r["gpu.driver"].action is Action.REDEPLOY
        assert "570.133.20 is loaded" in r["gpu.driver"].message


def test_another_model_than_declared_fails(lab, tmp_path):
    cluster = relabel(lab, "gpu1", hardware={"gpus": {**H100, "model": "A100-SXM4-80GB"}})
    r = by_check(run(planned(Context(cluster, "quick"), "gpu1", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi()}))
    assert r["gpu.model"].status is Status.FAIL
    assert "GPU 0 (00000000:18:00.0) is a NVIDIA H100 80GB HBM3" in r["gpu.model"].message


def test_another_memory_size_than_declared_fails(lab, tmp_path):
    cluster = relabel(lab, "gpu1", hardware={"gpus": {**H100, "memory_gb": 94}})
    r = by_check(run(planned(Context(cluster, "quick"), "gpu1", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi()}))
    assert r["gpu.model"].status is Status.FAIL and "80 GiB" in r["gpu.model"].message


def test_persistence_is_not_asked_where_the_inventory_turns_persistenced_off(lab, tmp_path):
    cluster = relabel(lab, "gpu1", nvidia_persistenced=False)
    r = by_check(run(planned(Context(cluster, "quick"), "gpu1", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi(query="smi-query-gpu-h100x8-bad.csv")}))
    assert r["gpu.persistence"].status is Status.SKIP
    assert "nvidia_persistenced is false" in r["gpu.persistence"].message


@pytest.mark.parametrize("remap,status,action", [
    ("smi-remapped-rows-pending.csv", Status.FAIL, Action.RESET_GPU),
    ("smi-remapped-rows-failure.csv", Status.FAIL, Action.ISOLATE),
])
def test_row_remapping_pending_or_failed_fails(lab, tmp_path, remap, status, action):
    r = by_check(run(planned(Context(lab, "quick"), "gpu4", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi(remap=remap)}))["gpu.row_remap"]
    assert (r.status, r.action) == (status, action)
    assert "GPU 3 (00000000:5D:00.0)" in r.message


def test_a_gpu_without_row_remapping_skips_that_check(lab, tmp_path):
    (tmp_path / "na.csv").write_text("00000000:18:00.0, [N/A], [N/A], [N/A], [N/A]\n")
    stub = smi().replace(str(FIXTURES / "smi-remapped-rows-h100x8.csv"),
                         str(tmp_path / "na.csv"))
    r = by_check(run(planned(Context(lab, "quick"), "gpu1", "gpu.state"), tmp_path, **{
        "nvidia-smi": stub}))["gpu.row_remap"]
    assert r.status is Status.SKIP and "not supported" in r.message


@pytest.mark.parametrize("output,action,cause", [
    ("smi-driver-mismatch.txt", Action.REBOOT, "upgraded without a reboot"),
    ("smi-no-driver.txt", Action.REDEPLOY, "no NVIDIA kernel module is loaded"),
])
def test_nvidia_smi_failing_fails_the_count_with_its_cause(lab, tmp_path, output, action,
                                                           cause):
    results = run(planned(Context(lab, "quick"), "gpu1", "gpu.state"), tmp_path, **{
        "nvidia-smi": smi(query=output, query_rc=18)})
    first, *others = results
    assert (first.check, first.status, first.action) == ("gpu.count", Status.FAIL, action)
    assert cause in first.message
    assert [r.check for r in others] == list(gpu.STATE_CHECKS[1:])
    assert all(r.status is Status.ERROR and "see gpu.count" in r.message for r in others)


def test_nvidia_smi_missing_where_the_driver_is_deployed_is_an_error(lab, tmp_path):
    probe = planned(Context(lab, "quick"), "gpu1", "gpu.state")
    probe.command = "PATH=/nonexistent\n" + probe.command  # no nvidia-smi anywhere
    results = run(probe, tmp_path)
    assert len(results) == len(gpu.STATE_CHECKS)
    assert all(r.status is Status.ERROR and "nvidia-smi is not installed" in r.message
               for r in results)


# ---------------------------------------------------------------------------
# gpu.xid
# ---------------------------------------------------------------------------


def _journal(log: str) -> str:
    """A stand-in journalctl printing ``log`` as the kernel log since boot."""
    return cat(log)


def test_no_xid_since_boot_passes(lab, tmp_path):
    [r] = run(planned(Context(lab, "quick"), "gpu1", "gpu.xid"), tmp_path,
              journalctl=_journal("kern-clean.log"))
    assert (r.status, r.value, r.details["source"]) == (Status.PASS, 0, "journal")


def test_application_xids_are_a_warning_to_monitor(lab, tmp_path):
    [r] = run(planned(Context(lab, "quick"), "gpu2", "gpu.xid"), tmp_path,
              journalctl=_journal("kern-xid-app.log"))
    assert (r.status, r.action, r.value) == (Status.WARN, Action.MONITOR, 3)
    assert "Xid 31 (GPU memory page fault) x1 on 0000:3a:00" in r.message
    assert r.details["xids"]["43"]["action"] == "none"  # the catalog ignores 43


def test_a_gpu_fallen_off_the_bus_fails_asking_for_a_reboot(lab, tmp_path):
    [r] = run(planned(Context(lab, "quick"), "gpu3", "gpu.xid"), tmp_path,
              journalctl=_journal("kern-xid-79.log"))
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT)
    assert r.message.startswith("gpu3: since boot: Xid 79 (GPU has fallen off the bus) x1 "
                                "on 0000:ab:00")
    assert r.details["xids"]["154"]["action"] == "reboot"


def test_an_uncontained_ecc_error_fails_asking_for_a_gpu_reset(lab, tmp_path):
    [r] = run(planned(Context(lab, "quick"), "gpu4", "gpu.xid"), tmp_path,
              journalctl=_journal("kern-xid-ecc.log"))
    assert (r.status, r.action) == (Status.FAIL, Action.RESET_GPU)
    assert r.details["xids"]["94"]["action"] == "monitor"
    assert "Xid 95 (uncontained ECC error)" in r.message


def test_without_a_journal_the_kernel_ring_buffer_is_read(lab, tmp_path):
    [r] = run(planned(Context(lab, "quick"), "gpu3", "gpu.xid"), tmp_path,
              journalctl="exit 1", dmesg=cat("kern-xid-79.log"))
    assert (r.status, r.details["source"]) == (Status.FAIL, "dmesg")


def test_an_unreadable_kernel_log_is_an_error_not_a_pass(lab, tmp_path):
    [r] = run(planned(Context(lab, "quick"), "gpu1", "gpu.xid"), tmp_path,
              journalctl="exit 1", dmesg="echo 'dmesg: read kernel buffer failed' >&2; exit 1")
    assert r.status is Status.ERROR and "could not read the kernel log" in r.message


@pytest.mark.parametrize("code,text,action", [
    (13, "Graphics Exception", Action.MONITOR),
    (43, "", Action.NONE),
    (48, "", Action.RESET_GPU),
    (64, "Row Remapper: failed to remap", Action.ISOLATE),
    (74, "", Action.RESET_GPU),
    (79, "GPU has fallen off the bus.", Action.REBOOT),
    (119, "Timeout after 45s of waiting for RPC response", Action.RESET_GPU),
    (154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     Action.RESET_GPU),
    (154, "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
     Action.NONE),
    (57, "", Action.INVESTIGATE),  # the catalog says to report it
    (999, "", Action.INVESTIGATE),  # newer than this table
])
def test_xids_map_to_the_catalogs_action(code, text, action):
    assert gpu.xid_action(code, text) is action


# ---------------------------------------------------------------------------
# NVSwitch nodes: gpu.nvlink, gpu.fabric_manager
# ---------------------------------------------------------------------------


def test_an_nvswitch_node_with_links_up_and_its_fabric_trained_passes(lab, tmp_path):
    r = by_check(run(planned(Context(lab, "quick"), "gpu1", "gpu.fabric"), tmp_path, **{
        "nvidia-smi": smi(), "systemctl": "echo active"}))
    assert (r["gpu.nvlink"].status, r["gpu.nvlink"].value) == (Status.PASS, 18)
    assert r["gpu.nvlink"].threshold == 18
    assert (r["gpu.fabric_manager"].status, r["gpu.fabric_manager"].value) == (Status.PASS, 8)


def test_inactive_nvlinks_fail(lab, tmp_path):
    r = by_check(run(planned(Context(lab, "quick"), "gpu2", "gpu.fabric"), tmp_path, **{
        "nvidia-smi": smi(nvlink="nvlink-s-inactive.txt"), "systemctl": "echo active"}))
    nvlink = r["gpu.nvlink"]
    assert (nvlink.status, nvlink.value, nvlink.action) == (Status.FAIL, 0, Action.REBOOT)
    assert "GPU 4: 16 of 18 up (links 3, 11 inactive)" in nvlink.message
    assert "GPU 6: 0 of 18 up (NVML: Unable to retrieve NVLink information" in nvlink.message


def test_a_gpu_whose_fabric_is_not_trained_fails_fabric_manager(lab, tmp_path):
    r = by_check(run(planned(Context(lab, "quick"), "gpu1", "gpu.fabric"), tmp_path, **{
        "nvidia-smi": smi(q="smi-q-fabric-in-progress.txt"), "systemctl": "echo active"}))
    fm = r["gpu.fabric_manager"]
    assert (fm.status, fm.value, fm.action) == (Status.FAIL, 7, Action.RESTART_SERVICE)
    assert "00000000:DB:00.0: fabric state In Progress" in fm.message


def test_fabric_manager_not_running_fails(lab, tmp_path):
    r = by_check(run(planned(Context(lab, "quick"), "gpu1", "gpu.fabric"), tmp_path, **{
        "nvidia-smi": smi(), "systemctl": "echo failed; exit 3"}))
    assert r["gpu.fabric_manager"].status is Status.FAIL
    assert "nvidia-fabricmanager is failed" in r["gpu.fabric_manager"].message


# ---------------------------------------------------------------------------
# gpu.dcgm_diag
# ---------------------------------------------------------------------------


def _dcgmi(output: str, rc: int, tmp_path: Path) -> str:
    return f'echo "$*" > {tmp_path}/dcgmi.args; {cat(output, rc)}'


def test_dcgm_level_1_passing_passes(lab, tmp_path):
    [r] = run(planned(Context(lab, "standard"), "gpu1", "gpu.dcgm_diag"), tmp_path,
              dcgmi=_dcgmi("dcgmi-diag-r1-pass.json", 0, tmp_path))
    assert (r.status, r.value) == (Status.PASS, 0)
    assert (tmp_path / "dcgmi.args").read_text().strip() == "diag -r 1 -j"
    assert r.details["dcgm"] == "4.2.3"


def test_dcgm_failing_a_deployment_test_fails_naming_test_and_gpu(lab, tmp_path):
    [r] = run(planned(Context(lab, "standard"), "gpu1", "gpu.dcgm_diag"), tmp_path,
              dcgmi=_dcgmi("dcgmi-diag-r1-software-fail.json", 226, tmp_path))
    assert (r.status, r.action) == (Status.FAIL, Action.INVESTIGATE)
    assert "software on GPU 2 (Persistence mode for GPU 2 is disabled" in r.message


def test_dcgm_failing_a_hardware_test_at_burn_in_isolates_the_node(lab, tmp_path):
    [r] = run(planned(Context(lab, "burn-in"), "gpu3", "gpu.dcgm_diag"), tmp_path,
              dcgmi=_dcgmi("dcgmi-diag-r3-memory-fail.json", 226, tmp_path))
    assert (r.status, r.action, r.value) == (Status.FAIL, Action.ISOLATE, 1)
    assert "level 3 failed: memory on GPU 3 (Detected 2 volatile double-bit ECC" in r.message
    assert (tmp_path / "dcgmi.args").read_text().strip() == "diag -r 3 -j"
    assert r.details["tests"]["targeted_stress"] == "Pass"


def test_dcgm_host_engine_down_fails_asking_for_a_restart(lab, tmp_path):
    [r] = run(planned(Context(lab, "standard"), "gpu1", "gpu.dcgm_diag"), tmp_path,
              dcgmi="echo 'Error: unable to establish a connection to the specified host: "
                    "localhost'; exit 255")
    assert (r.status, r.action) == (Status.FAIL, Action.RESTART_SERVICE)


def test_dcgm_runtime_error_is_an_error(lab, tmp_path):
    (tmp_path / "rt.json").write_text(
        '{"DCGM Diagnostic": {"runtime_error": "The GPU(s) are in use by other processes"}}')
    [r] = run(planned(Context(lab, "standard"), "gpu1", "gpu.dcgm_diag"), tmp_path,
              dcgmi=f"cat {tmp_path}/rt.json; exit 1")
    assert r.status is Status.ERROR and "in use by other processes" in r.message


def test_dcgmi_missing_is_an_error_naming_it(lab, tmp_path):
    probe = planned(Context(lab, "standard"), "gpu1", "gpu.dcgm_diag")
    probe.command = "PATH=/nonexistent\n" + probe.command
    [r] = run(probe, tmp_path)
    assert r.status is Status.ERROR and "dcgmi is not installed" in r.message


def test_dcgm_is_skipped_where_the_inventory_installs_none(lab, tmp_path):
    cluster = relabel(lab, "gpu1", nvidia_dcgm=False)
    [r] = run(planned(Context(cluster, "standard"), "gpu1", "gpu.dcgm_diag"), tmp_path)
    assert r.status is Status.SKIP and "nvidia_dcgm is false" in r.message


# ---------------------------------------------------------------------------
# The active tests of one node never share its GPUs
# ---------------------------------------------------------------------------


def test_dcgm_and_nccl_of_a_node_take_one_lock_and_wait_for_each_other(lab, gpu_lock):
    ctx = Context(lab, "standard")
    dcgm, nccl = planned(ctx, "gpu1", "gpu.dcgm_diag"), planned(ctx, "gpu1", "gpu.nccl")
    assert str(gpu_lock) in dcgm.command and str(gpu_lock) in nccl.command
    # each may wait the other's whole limit for the GPUs, within its own
    assert "flock -w 1200 9" in dcgm.command and dcgm.timeout == 300 + 1200
    assert "flock -w 300 9" in nccl.command and nccl.timeout == 1200 + 300


def test_a_gpu_test_waiting_out_the_lock_is_an_error_not_a_failure(lab, tmp_path, gpu_lock):
    import fcntl

    probe = planned(Context(lab, "standard"), "gpu1", "gpu.nccl")
    probe.command = probe.command.replace("flock -w 300 9", "flock -w 1 9")
    with open(gpu_lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another GPU test has the GPUs
        [r] = run(probe, tmp_path,
                  all_reduce_perf=_all_reduce("all_reduce_perf-h100x8.txt", tmp_path))
    assert r.status is Status.ERROR
    assert "another GPU test of aicluster check held the GPUs" in r.message
    assert not (tmp_path / "nccl.args").exists()  # all_reduce_perf never ran


# ---------------------------------------------------------------------------
# gpu.nccl: all_reduce_perf in the node
# ---------------------------------------------------------------------------


def _all_reduce(output: str, tmp_path: Path) -> str:
    """A stand-in all_reduce_perf on PATH (none is in gpu.nccl_tests_dir here): records
    its arguments, prints ``output``."""
    return f'echo "$*" >> {tmp_path}/nccl.args; {cat(output)}'


def test_in_node_nccl_at_full_bandwidth_passes(lab, tmp_path):
    [r] = run(planned(Context(lab, "standard"), "gpu1", "gpu.nccl"), tmp_path,
              all_reduce_perf=_all_reduce("all_reduce_perf-h100x8.txt", tmp_path))
    assert (r.status, r.value, r.threshold, r.unit) == (Status.PASS, 474.97, 460.0, "GB/s")
    assert r.details["runs"] == 3 and r.details["size"] == 8589934592
    assert (tmp_path / "nccl.args").read_text().splitlines() == ["-b 8 -e 8G -f 2 -g 8"] * 3


def test_in_node_nccl_below_the_model_floor_fails(lab, tmp_path):
    [r] = run(planned(Context(lab, "standard"), "gpu3", "gpu.nccl"), tmp_path,
              all_reduce_perf=_all_reduce("all_reduce_perf-h100x8-slow.txt", tmp_path))
    assert (r.status, r.threshold, r.action) == (Status.FAIL, 460.0, Action.INVESTIGATE)
    assert r.value < 460 and "below 460.0 GB/s" in r.message


def test_in_node_nccl_with_wrong_results_fails_and_isolates(lab, tmp_path):
    [r] = run(planned(Context(lab, "standard"), "gpu4", "gpu.nccl"), tmp_path,
              all_reduce_perf=_all_reduce("all_reduce_perf-h100x8-wrong.txt", tmp_path)
              + "; exit 1")
    assert (r.status, r.action) == (Status.FAIL, Action.ISOLATE)
    assert "#wrong > 0, first at 2 GiB" in r.message


def test_the_median_of_the_runs_counts(lab):
    probe = planned(Context(lab, "standard"), "gpu1", "gpu.nccl")
    good, slow = fixture("all_reduce_perf-h100x8.txt"), fixture("all_reduce_perf-h100x8-slow.txt")
    one_slow = probe.read(Completed(0, good + slow + good, "", 60.0))
    assert one_slow.status is Status.PASS and one_slow.value == 474.97
    two_slow = probe.read(Completed(0, slow + good + slow, "", 60.0))
    assert two_slow.status is Status.FAIL


def test_all_reduce_perf_missing_is_an_error_saying_where_it_looked(lab, tmp_path):
    [r] = run(planned(Context(lab, "standard"), "gpu1", "gpu.nccl"), tmp_path)
    assert r.status is Status.ERROR
    assert "all_reduce_perf: not found in /opt/nccl-tests/build or on PATH" in r.message
    assert "nccl-tests" in r.message and "gpu.nccl_tests_dir" in r.message


def test_the_nccl_tests_directory_is_a_threshold(lab, tmp_path):
    (tmp_path / "nccl").mkdir()
    (tmp_path / "nccl" / "all_reduce_perf").write_text(
        f"#!/bin/sh\n{cat('all_reduce_perf-h100x8.txt')}\n")
    (tmp_path / "nccl" / "all_reduce_perf").chmod(0o755)
    cluster = relabel(lab, "gpu1",
                      check_thresholds={"gpu": {"nccl_tests_dir": str(tmp_path / "nccl")}})
    [r] = run(planned(Context(cluster, "standard"), "gpu1", "gpu.nccl"), tmp_path)
    assert r.status is Status.PASS


@pytest.mark.parametrize("gpus,floor", [(8, 460.0), (4, 394.3), (2, 262.9), (1, 0.0)])
def test_the_floor_is_scaled_for_another_gpu_count(gpus, floor):
    assert gpu.nccl_floor({"nccl_busbw_gbps": 460, "nccl_gpus": 8}, gpus) == floor
    assert gpu.nccl_floor({"nccl_busbw_gbps": 0, "nccl_gpus": 0}, gpus) == 0.0


# ---------------------------------------------------------------------------
# gpu.nccl_pair: one GPU on each of two Slurm workers
# ---------------------------------------------------------------------------


def _srun(output: str, tmp_path: Path) -> dict[str, str]:
    """A stand-in srun that records its arguments and prints ``output``, and the
    all_reduce_perf it is handed (on PATH: the probe looks for it on the first node)."""
    return {"srun": f'echo "$*" >> {tmp_path}/srun.args; {cat(output)}',
            "all_reduce_perf": "echo 'run through srun only' >&2; exit 99"}


def test_the_pair_test_runs_between_gpu_slurm_workers_through_srun(lab, tmp_path):
    [pairs] = gpu.pair_checks(Context(lab, "standard"))
    assert pairs.nodes == ["gpu1", "gpu2", "gpu3", "gpu4"]
    probe = pairs.make("gpu1", "gpu2")
    assert probe.pair == ("gpu1", "gpu2") and probe.server is None
    [r] = run(probe, tmp_path, **_srun("all_reduce_perf-pair.txt", tmp_path))
    # 0.7 of one 400 Gb/s InfiniBand port = 35 GB/s
    assert (r.status, r.pair, r.value, r.threshold) == (Status.PASS, ("gpu1", "gpu2"), 46.74,
                                                        35.0)
    assert "InfiniBand port" in r.details["floor"]
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert len(args) == 3
    assert args[0].startswith("-p gpu -w gpu1,gpu2 -N 2 --ntasks-per-node=1 "
                              "--gpus-per-node=1 --mpi=pmix --immediate=30")
    assert args[0].endswith("all_reduce_perf -b 8 -e 8G -f 2 -g 1")


def test_the_pair_test_below_the_link_floor_fails(lab, tmp_path):
    [pairs] = gpu.pair_checks(Context(lab, "standard"))
    [r] = run(pairs.make("gpu3", "gpu4"), tmp_path,
              **_srun("all_reduce_perf-pair-slow.txt", tmp_path))
    assert (r.status, r.value, r.threshold) == (Status.FAIL, 11.11, 35.0)
    assert r.where == "gpu3<->gpu4"


def test_nccl_tests_built_without_mpi_is_an_error_saying_so(lab, tmp_path):
    [pairs] = gpu.pair_checks(Context(lab, "standard"))
    [r] = run(pairs.make("gpu1", "gpu2"), tmp_path,
              **_srun("all_reduce_perf-pair-nompi.txt", tmp_path))
    assert r.status is Status.ERROR and "build nccl-tests with MPI=1" in r.message


def test_slurm_refusing_the_pair_is_an_error_not_a_slow_fabric(lab, tmp_path):
    [pairs] = gpu.pair_checks(Context(lab, "standard"))
    [r] = run(pairs.make("gpu1", "gpu2"), tmp_path, **{
        "srun": "echo 'srun: error: Unable to allocate resources: Requested nodes are busy'"
                " >&2; exit 1", "all_reduce_perf": "exit 99"})
    assert r.status is Status.ERROR and "Requested nodes are busy" in r.message


def test_the_pair_floor_is_the_fabric_nic_without_infiniband():
    cluster = small(a1=(["gpu_nodes", "slurm_controller", "slurm_workers"],
                        {"model": "A100-SXM4-80GB", "count": 4}),
                    a2=(["gpu_nodes", "slurm_workers"], {"model": "A100-SXM4-80GB",
                                                         "count": 4}),
                    a3=(["gpu_nodes"], {"model": "A100-SXM4-80GB", "count": 4}))
    ctx = Context(cluster, "standard")
    [pairs] = gpu.pair_checks(ctx)
    assert pairs.nodes == ["a1", "a2"]  # a3 is no Slurm worker
    assert gpu.pair_floor(ctx, "a1", "a2") == (8.75, "0.7 x 100 Gb/s (fabric NIC)")


def test_no_pair_test_without_slurm():
    cluster = small(a1=(["gpu_nodes"], {"model": "A100", "count": 4}),
                    a2=(["gpu_nodes"], {"model": "A100", "count": 4}))
    assert gpu.pair_checks(Context(cluster, "standard")) == []
