"""The stacks layer of `aicluster check`: Slurm, Ray, k3s and Ollama do work on every
node the inventory gives them. Each check's reader is fed outputs of the real tools
(tests/fixtures/check/stacks/README.md says where each comes from) through the probe
``probes(ctx)`` plans from a real inventory: the lab (inventories/lab.py) for the real
hardware's paths, a two-node cluster shaped like the testbed (stand-in GPUs) for the
testbed's. The shell the probes run is run here too where it needs no cluster: the
Slurm job plumbing against a fake srun, the Ollama client against a local HTTP server
streaming captured answers, k3s's JSONPath through the e2e tests' STAND-IN kubectl."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from aicluster.checks import stacks
from aicluster.checks.context import Context
from aicluster.checks.result import Action, Result, Status
from aicluster.checks.runner import Completed, Probe, local_transport, run_probes
from aicluster.inventory import load_cluster, validate

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "check" / "stacks"
STANDIN_K3S = ROOT / "tests" / "e2e" / "standins" / "k3s_executable.py"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def done(stdout: str = "", rc: int = 0, stderr: str = "") -> Completed:
    return Completed(rc, stdout, stderr, 0.5)


def read(probe: Probe, completed: Completed) -> list[Result]:
    out = probe.read(completed)
    return [out] if isinstance(out, Result) else list(out)


def by_node(results: list[Result]) -> dict[str, Result]:
    """Results by node; the nodes a cluster has beyond the inventory's, under ``+`` and
    the node that asked."""
    out = {}
    for r in results:
        key = f"+{r.node}" if r.check.endswith("_extra_nodes") else r.node
        assert key not in out, f"two results for {key}"
        out[key] = r
    return out


def the(probes: list[Probe], check: str, subject: str | None = None) -> Probe:
    """The probe of ``check``; for the per-node ones run elsewhere (the Slurm jobs),
    the one about ``subject`` (its command names it)."""
    def about(p: Probe) -> bool:
        if "--nodelist=" in p.command:
            return f"--nodelist={subject} " in p.command
        return p.node == subject

    found = [p for p in probes if p.check == check and (subject is None or about(p))]
    assert len(found) == 1, [(p.check, p.node) for p in found]
    return found[0]


@pytest.fixture(scope="module")
def lab():
    return load_cluster(ROOT / "inventories" / "lab.py")


@pytest.fixture(scope="module")
def lab_probes(lab):
    return stacks.probes(Context(lab))


def like_testbed(**data) -> object:
    """Two nodes as inventories/testbed.py makes them: node1 Slurm controller and worker,
    Ray head, k3s server, Ollama and its gateway; node2 worker, Ray worker, k3s agent,
    Ollama; one STAND-IN GPU each; everything on the management network."""
    common = {
        "cluster_name": "testbed",
        "networks": {"management": {"subnet": "10.213.0.0/24"}},
        "slurm_version": "22.05.8", "ray_version": "2.60.0",
        "slurm_gpu_device_pattern": "/dev/aicluster-standin-gpu{index}",
        "ray_network": "management", "k3s_network": "management",
        "ollama_network": "management", "ollama_gateway_port": 11435,
        "ollama_models": ["tiny:1b"],
        **data,
    }

    def host(n: int) -> dict:
        return {**common, "ssh_hostname": f"10.213.0.{10 + n}", "hardware": {
            "cpus": 1, "memory_gb": 2,
            "gpus": {"model": "standin", "count": 1, "vendor": "standin"}}}

    return validate({
        "node1": (("slurm_controller", "slurm_workers", "ray_head", "k3s_servers", "ollama",
                   "ollama_gateway", "gpu_nodes"), host(1)),
        "node2": (("slurm_workers", "ray_workers", "k3s_agents", "ollama", "gpu_nodes"),
                  host(2)),
    })


# ---------------------------------------------------------------------------
# What is planned where
# ---------------------------------------------------------------------------


def test_the_lab_plans_each_stack_on_its_nodes(lab_probes):
    planned = sorted({(p.check, p.node) for p in lab_probes})
    assert planned == sorted({
        *(("stacks.slurmd", f"gpu{i}") for i in range(1, 5)),
        ("stacks.slurm_nodes", "head"), ("stacks.slurm_job", "head"),
        ("stacks.slurm_gres", "head"),
        ("stacks.ray_nodes", "head"), ("stacks.ray_task", "head"),
        ("stacks.k3s_nodes", "head"), ("stacks.k3s_gpu", "head"),
        # Each Ollama node asked from the gateway (head), the gateway from an Ollama node.
        ("stacks.ollama", "head"), ("stacks.ollama_gateway", "gpu3"),
    })
    # One job, and one GPU job, per worker.
    assert sum(p.check == "stacks.slurm_job" for p in lab_probes) == 4
    assert sum(p.check == "stacks.slurm_gres" for p in lab_probes) == 4


def test_the_quick_tier_plans_no_job_task_or_generation(lab):
    quick = {p.check for p in stacks.probes(Context(lab, "quick"))}
    assert quick == {"stacks.slurmd", "stacks.slurm_nodes", "stacks.ray_nodes",
                     "stacks.k3s_nodes", "stacks.k3s_gpu"}
    for p in stacks.probes(Context(lab, "quick")):
        assert p.timeout <= 60, (p.check, p.timeout)


def test_nothing_is_planned_for_a_node_without_a_stack(lab):
    # storage1 runs none of Slurm, Ray or Ollama; it is a k3s server only.
    probes = stacks.probes(Context(lab, limit=("storage1",)))
    assert {p.check for p in probes} == {"stacks.k3s_nodes"}
    results = read(probes[0], done(fixture("k3s-nodes-lab.txt")))
    assert [r.node for r in results] == ["storage1"]
    bare = validate({"n1": ((), {"ssh_hostname": "10.0.0.1",
                                 "networks": {"management": {"subnet": "10.0.0.0/24"}}})})
    assert stacks.probes(Context(bare)) == []


def test_every_command_is_posix_sh(lab_probes):
    for p in [*lab_probes, *stacks.probes(Context(like_testbed()))]:
        check = subprocess.run([shutil.which("dash") or "sh", "-n", "-c", p.command],
                               capture_output=True, text=True)
        assert check.returncode == 0, (p.check, check.stderr)


# ---------------------------------------------------------------------------
# Slurm
# ---------------------------------------------------------------------------


def test_slurmd_active_passes_stopped_fails_naming_the_node(lab_probes):
    probe = the(lab_probes, "stacks.slurmd", "gpu2")
    assert probe.command == stacks.SLURMD_COMMAND
    [ok] = read(probe, done(fixture("systemctl-slurmd-active.txt")))
    assert ok.status is Status.PASS and ok.node == "gpu2"
    [stopped] = read(probe, done(fixture("systemctl-slurmd-stopped.txt")))
    assert stopped.status is Status.FAIL and stopped.node == "gpu2"
    assert stopped.action is Action.RESTART_SERVICE
    assert stopped.message.startswith("gpu2: slurmd is inactive (dead)")
    [disabled] = read(probe, done(fixture("systemctl-slurmd-disabled.txt")))
    assert disabled.status is Status.WARN and "after a reboot" in disabled.message
    [missing] = read(probe, done(fixture("systemctl-slurmd-not-found.txt")))
    assert missing.status is Status.ERROR and "not installed" in missing.message


def test_sinfo_every_worker_idle_mixed_or_allocated_passes(lab_probes):
    probe = the(lab_probes, "stacks.slurm_nodes")
    assert probe.node == "head" and stacks.SINFO_COMMAND in probe.command
    results = by_node(read(probe, done(fixture("sinfo-lab-healthy.txt"))))
    assert sorted(results) == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert {r.status for r in results.values()} == {Status.PASS}
    assert results["gpu3"].value == "allocated"


def test_sinfo_names_each_broken_worker_and_the_nodes_slurm_has_extra(lab_probes):
    probe = the(lab_probes, "stacks.slurm_nodes")
    results = by_node(read(probe, done(fixture("sinfo-lab-broken.txt"))))
    # Just stopped: not responding (*), before slurmctld sets it down.
    assert results["gpu1"].status is Status.FAIL
    assert results["gpu1"].action is Action.RESTART_SERVICE
    assert "not responding (idle*)" in results["gpu1"].message
    down = results["gpu2"]
    assert down.status is Status.FAIL and down.value == "down*"
    assert "set by slurm at 2026-09-12T15:02:40: Not responding" in down.message
    # Set down, slurmctld no longer pings it: back only when slurmd registers again.
    assert "stays down until slurmd registers again (restart slurmd on gpu2" in down.message
    assert "registers again" not in results["gpu1"].message
    drained = results["gpu3"]
    assert drained.status is Status.WARN and drained.action is Action.INVESTIGATE
    assert "by root at 2024-01-25T15:12:23: Kill task failed" in drained.message
    assert results["gpu4"].status is Status.FAIL and "not in Slurm" in results["gpu4"].message
    extra = results["+head"]
    assert (extra.check, extra.status, extra.details) == (
        "stacks.slurm_extra_nodes", Status.WARN, {"extra": ["gpu9"]})


@pytest.mark.parametrize("node,status,words", [
    ("n1", Status.FAIL, "registered with less than slurm.conf declares"),
    ("n2", Status.FAIL, "never registered"),
    ("n3", Status.WARN, "drained (draining)"),
    ("n4", Status.WARN, "power"),
    ("n5", Status.PASS, "mixed-"),
    ("n6", Status.PASS, "allocated+"),
    ("n7", Status.WARN, "maintenance"),
    ("n8", Status.WARN, "reboot is pending"),
    ("n9", Status.FAIL, "Slurm has it down"),
])
def test_each_slurm_state(node, status, words):
    entry = stacks.parse_sinfo(fixture("sinfo-states.txt"))[node]
    result = stacks.judge_slurm_node(node, "ctl", entry)
    assert result.status is status and words in result.message, result.message
    if status is not Status.PASS:
        assert result.action is not Action.NONE and result.message.startswith(f"{node}: ")


def test_sinfo_without_slurmctld_fails_on_the_controller(lab_probes):
    probe = the(lab_probes, "stacks.slurm_nodes")
    [result] = read(probe, done(rc=1, stderr=fixture("sinfo-no-controller.stderr")))
    assert result.status is Status.FAIL and result.node == "head"
    assert "Unable to contact slurm controller" in result.message
    [missing] = read(probe, done(rc=127, stderr="aicluster-missing: sinfo\n"))
    assert missing.status is Status.ERROR and missing.details == {"missing": "sinfo"}


def test_testbed_slurmd_stopped_on_node2_fails_naming_node2():
    """What the e2e test's `systemctl stop slurmd` on node2 shows: slurmd inactive at
    once, and as soon as slurmctld's ping misses it, node2 not responding in sinfo."""
    probes = stacks.probes(Context(like_testbed(), "quick"))
    [stopped] = read(the(probes, "stacks.slurmd", "node2"),
                     done(fixture("systemctl-slurmd-stopped.txt")))
    assert (stopped.status, stopped.node) == (Status.FAIL, "node2")
    sinfo = "node1|idle|Unknown|Unknown|none\nnode2|idle*|Unknown|Unknown|none\n" * 2
    results = by_node(read(the(probes, "stacks.slurm_nodes"), done(sinfo)))
    assert results["node1"].status is Status.PASS
    assert results["node2"].status is Status.FAIL and results["node2"].node == "node2"


def test_a_job_runs_on_each_worker(lab_probes):
    probe = the(lab_probes, "stacks.slurm_job", "gpu1")
    assert probe.node == "head"
    assert "--immediate=30 " in probe.command and "--partition=batch " in probe.command
    assert "--gres" not in probe.command
    [ok] = read(probe, done(fixture("srun-job-ok.txt")))
    assert (ok.status, ok.node, ok.threshold, ok.unit) == (Status.PASS, "gpu1", 30, "s")
    other = fixture("srun-job-ok.txt").replace("=gpu1", "=gpu2")
    [wrong] = read(probe, done(other))
    assert wrong.status is Status.FAIL and "ran on gpu2" in wrong.message


def test_a_job_on_a_down_worker_fails_naming_it_and_on_a_busy_one_warns(lab_probes):
    probe = the(lab_probes, "stacks.slurm_job", "gpu2")
    [down] = read(probe, done(fixture("srun-node-down.txt"),
                              stderr=fixture("srun-node-down.stderr")))
    assert down.status is Status.FAIL and down.node == "gpu2"
    assert down.action is Action.RESTART_SERVICE
    assert "gpu2: a one-task job did not run there (Slurm state down*)" in down.message
    assert "Connection timed out" in down.message
    [busy] = read(probe, done(fixture("srun-busy.txt"), stderr=fixture("srun-busy.stderr")))
    assert busy.status is Status.WARN and "allocated with other jobs" in busy.message
    [killed] = read(probe, done("aicluster-state=idle\naicluster-rc=124\n"))
    assert killed.status is Status.FAIL and "did not end within 50 s" in killed.message


def test_a_gres_job_sees_every_gpu_the_worker_declares(lab_probes):
    probe = the(lab_probes, "stacks.slurm_gres", "gpu1")
    assert "--gres=gpu:8" in probe.command and "--partition=gpu,batch " in probe.command
    [ok] = read(probe, done(fixture("srun-gres-ok.txt")))
    assert (ok.status, ok.value, ok.threshold, ok.unit) == (Status.PASS, 8, 8, "GPUs")
    [short] = read(probe, done(fixture("srun-gres-short.txt")))
    assert (short.status, short.value, short.threshold) == (Status.FAIL, 4, 8)
    assert "sees 4" in short.message and short.node == "gpu1"
    [invalid] = read(probe, done(fixture("srun-gres-invalid.txt"),
                                 stderr=fixture("srun-gres-invalid.stderr")))
    assert invalid.status is Status.FAIL and invalid.action is Action.REDEPLOY
    assert "Invalid generic resource" in invalid.message


def test_the_testbeds_standin_gpu_is_offered_as_gres():
    probes = stacks.probes(Context(like_testbed()))
    probe = the(probes, "stacks.slurm_gres", "node2")
    assert probe.node == "node1" and "--gres=gpu:1" in probe.command
    [ok] = read(probe, done(fixture("srun-testbed-standin-gpu.txt")))
    assert (ok.status, ok.node, ok.value) == (Status.PASS, "node2", 1)


def test_the_job_wait_is_the_inventorys_threshold():
    probes = stacks.probes(Context(like_testbed(check_thresholds={
        "stacks": {"slurm_job_timeout_s": 5}})))
    probe = the(probes, "stacks.slurm_job", "node1")
    assert "--immediate=5 " in probe.command and "timeout -k 5 25 srun" in probe.command
    assert probe.timeout == 45


def _fake_bin(tmp_path: Path, name: str, body: str) -> None:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_the_job_command_runs_the_task_through_srun(tmp_path, monkeypatch):
    """The probe's own shell, with a fake sinfo and an srun that runs the task as
    slurmd would (its options dropped, SLURMD_NODENAME and the GPUs set)."""
    _fake_bin(tmp_path, "sinfo", "echo aicluster-state=idle\n")
    _fake_bin(tmp_path, "srun", 'for a; do case $a in --*) shift;; *) break;; esac; done\n'
                                'SLURMD_NODENAME=gpu1 CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 '
                                'exec "$@"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    lab = load_cluster(ROOT / "inventories" / "lab.py")
    probe = the(stacks.probes(Context(lab)), "stacks.slurm_gres", "gpu1")
    [result] = run_probes([probe], local_transport)
    assert result.status is Status.PASS and result.value == 8, result.message
    _fake_bin(tmp_path, "srun", "echo 'srun: error: Unable to allocate resources: Invalid "
                                "generic resource (gres) specification' >&2; exit 1\n")
    [failed] = run_probes([probe], local_transport)
    assert failed.status is Status.FAIL and "Invalid generic resource" in failed.message


# ---------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------


def test_ray_probes_run_the_venvs_python_as_rays_user(lab_probes):
    probe = the(lab_probes, "stacks.ray_nodes")
    assert probe.node == "head"
    assert "runuser -u ray -- env HOME=/var/lib/ray" in probe.command
    assert "/opt/aicluster/ray/2.60.0/venv/bin/python -c" in probe.command
    assert probe.command.endswith(" 10.20.0.10:6379 10.20.0.10")
    task = the(lab_probes, "stacks.ray_task")
    assert "10.20.0.24" in task.command and task.command.endswith(" 60")
    for script in (stacks.RAY_NODES_SCRIPT, stacks.RAY_TASK_SCRIPT):
        compile(script, "<ray driver>", "exec")


def test_every_ray_node_alive_passes(lab_probes):
    results = by_node(read(the(lab_probes, "stacks.ray_nodes"),
                           done(fixture("ray-nodes-lab.txt"))))
    assert sorted(results) == ["gpu1", "gpu2", "gpu3", "gpu4", "head"]
    assert {r.status for r in results.values()} == {Status.PASS}
    assert results["gpu2"].value == "10.20.0.22"


def test_a_dead_or_missing_ray_node_fails_naming_it(lab_probes):
    results = by_node(read(the(lab_probes, "stacks.ray_nodes"),
                           done(fixture("ray-nodes-lab-broken.txt"))))
    # gpu1 rejoined: its old, dead entry is beside the live one.
    assert results["gpu1"].status is Status.PASS
    assert results["gpu2"].status is Status.FAIL and "dead in the Ray cluster" in (
        results["gpu2"].message)
    assert results["gpu4"].status is Status.FAIL
    assert results["gpu4"].message.startswith("gpu4: not in the Ray cluster")
    assert "systemctl status ray-worker on gpu4" in results["gpu4"].message
    assert results["head"].status is Status.PASS
    extra = results["+head"]
    assert (extra.check, extra.status, extra.details) == (
        "stacks.ray_extra_nodes", Status.WARN, {"extra": ["10.20.0.99"]})


def test_a_ray_head_that_does_not_answer_fails_on_the_head(lab_probes):
    probe = the(lab_probes, "stacks.ray_nodes")
    [down] = read(probe, done(rc=1, stderr=fixture("ray-head-down.stderr")))
    assert down.status is Status.FAIL and down.node == "head"
    assert "Unable to connect to GCS at 10.20.0.10:6379" in down.message
    [hung] = read(probe, done(rc=124))
    assert hung.status is Status.FAIL and "within 25 s" in hung.message
    [missing] = read(probe, done(rc=127, stderr=(
        "aicluster-missing: /opt/aicluster/ray/2.60.0/venv/bin/python\n")))
    assert missing.status is Status.ERROR
    assert "/opt/aicluster/ray/2.60.0/venv/bin/python is not installed" in missing.message


def test_a_task_pinned_to_each_ray_node(lab_probes):
    probe = the(lab_probes, "stacks.ray_task")
    results = by_node(read(probe, done(fixture("ray-task-lab.txt"))))
    assert {r.status for r in results.values()} == {Status.PASS}
    assert results["gpu4"].value == 1.37 and results["gpu4"].threshold == 60
    broken = by_node(read(probe, done(fixture("ray-task-lab-broken.txt"))))
    assert [n for n, r in broken.items() if r.status is Status.FAIL] == ["gpu2", "gpu3"]
    assert "GetTimeoutError" in broken["gpu3"].message
    assert broken["gpu3"].message.startswith("gpu3: a Ray task pinned to it (10.20.0.23)")


def test_the_testbeds_ray_runs_on_the_management_network():
    probe = the(stacks.probes(Context(like_testbed())), "stacks.ray_task")
    assert probe.node == "node1" and "10.213.0.11:6379" in probe.command
    assert '["10.213.0.11", "10.213.0.12"]' in probe.command


# ---------------------------------------------------------------------------
# k3s
# ---------------------------------------------------------------------------


def _standin_kubectl_jsonpath(template: str, document: dict) -> str:
    spec = importlib.util.spec_from_file_location("k3s_standin_for_check", STANDIN_K3S)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.jsonpath(template, document)


@pytest.mark.parametrize("name", ["k3s-nodes-lab", "k3s-nodes-lab-broken"])
def test_the_jsonpath_reads_the_node_list(name):
    """The STAND-IN kubectl (what the e2e tests run this check against) answers the
    check's JSONPath on the NodeList fixtures with the lines the readers are fed."""
    document = json.loads(fixture(f"{name}.json"))
    assert _standin_kubectl_jsonpath(stacks.K3S_JSONPATH, document) == fixture(f"{name}.txt")
    assert "jsonpath=" in stacks.K3S_COMMAND and " -o json" not in stacks.K3S_COMMAND


def test_every_k3s_node_ready_and_every_gpu_allocatable_passes(lab_probes):
    results = by_node(read(the(lab_probes, "stacks.k3s_nodes"),
                           done(fixture("k3s-nodes-lab.txt"))))
    assert sorted(results) == ["gpu1", "gpu2", "gpu3", "gpu4", "head", "storage1"]
    assert {r.status for r in results.values()} == {Status.PASS}
    gpus = by_node(read(the(lab_probes, "stacks.k3s_gpu"), done(fixture("k3s-nodes-lab.txt"))))
    assert sorted(gpus) == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert {(r.status, r.value, r.threshold) for r in gpus.values()} == {(Status.PASS, 8, 8)}


def test_k3s_names_the_node_not_ready_missing_cordoned_or_without_gpus(lab_probes):
    results = by_node(read(the(lab_probes, "stacks.k3s_nodes"),
                           done(fixture("k3s-nodes-lab-broken.txt"))))
    assert results["gpu2"].status is Status.FAIL
    assert results["gpu2"].message == ("gpu2: NotReady in k3s (Unknown Ready condition, "
                                       "NodeStatusUnknown): systemctl status k3s-agent on gpu2")
    assert results["storage1"].status is Status.FAIL
    assert "systemctl status k3s on storage1" in results["storage1"].message
    assert results["gpu4"].status is Status.WARN and "cordoned" in results["gpu4"].message
    assert results["gpu1"].status is Status.PASS
    assert results["head"].status is Status.PASS
    extra = results["+head"]
    assert (extra.check, extra.status, extra.details) == (
        "stacks.k3s_extra_nodes", Status.WARN, {"extra": ["old-gpu0"]})
    gpus = by_node(read(the(lab_probes, "stacks.k3s_gpu"),
                        done(fixture("k3s-nodes-lab-broken.txt"))))
    assert (gpus["gpu3"].status, gpus["gpu3"].value, gpus["gpu3"].threshold) == (
        Status.FAIL, 0, 8)
    assert "device plugin" in gpus["gpu3"].message
    assert gpus["gpu4"].status is Status.PASS


def test_k3s_api_down_fails_on_the_server(lab_probes):
    stderr = ("The connection to the server 10.20.0.10:6443 was refused - did you specify "
              "the right host or port?\n")
    [result] = read(the(lab_probes, "stacks.k3s_nodes"), done(rc=1, stderr=stderr))
    assert result.status is Status.FAIL and result.node == "head"
    assert "was refused" in result.message
    [missing] = read(the(lab_probes, "stacks.k3s_gpu"),
                     done(rc=127, stderr="aicluster-missing: /usr/local/bin/k3s\n"))
    assert missing.status is Status.ERROR


def test_the_testbeds_standin_gpus_are_skipped_by_k3s():
    probes = stacks.probes(Context(like_testbed()))
    text = "node1\tTrue\tKubeletReady\t\t\nnode2\tTrue\tKubeletReady\t\t\n"
    assert {r.status for r in read(the(probes, "stacks.k3s_nodes"), done(text))} == {
        Status.PASS}
    gpu = the(probes, "stacks.k3s_gpu")
    assert gpu.command == "true"  # nothing to ask k3s about stand-ins
    skipped = by_node(read(gpu, done(rc=1, stderr="would not be read")))
    assert {r.status for r in skipped.values()} == {Status.SKIP}
    assert "stand-in GPU (standin): no NVIDIA GPU on this node" in skipped["node2"].message


# ---------------------------------------------------------------------------
# Ollama
# ---------------------------------------------------------------------------


class _Ollama:
    """A local HTTP server answering as Ollama with the fixtures: GET /api/tags,
    POST /api/generate streamed as NDJSON (or an error status)."""

    def __init__(self, generate: str = "ollama-generate-stream.ndjson", status: int = 200,
                 tags: str = "ollama-tags.json", upstream: str = ""):
        self.requests: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                data = fixture(tags).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                outer.requests.append(json.loads(self.rfile.read(length)))
                if status != 200:
                    data = fixture(generate).encode()
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                if upstream:
                    self.send_header("X-Ollama-Upstream", upstream)
                self.end_headers()
                for line in fixture(generate).splitlines(keepends=True):
                    data = line.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _local_ollama(port: int, **data):
    """The testbed's shape, Ollama (and the gateway) on this machine's loopback."""
    return like_testbed(ollama_host="127.0.0.1", ollama_port=port,
                        ollama_gateway_listen="127.0.0.1", **data)


@pytest.fixture
def ollama_server(request):
    server = _Ollama(**getattr(request, "param", {}))
    yield server
    server.close()


def _ollama_result(cluster, check: str = "stacks.ollama", node: str = "node2") -> Result:
    probe = next(p for p in stacks.probes(Context(cluster))
                 if p.check == check and p.read.args[1] == node)
    [result] = run_probes([probe], local_transport)
    return result


def test_a_generation_streams_and_is_timed_to_its_first_token(ollama_server):
    result = _ollama_result(_local_ollama(ollama_server.port, ollama_gateway_port=1))
    assert result.status is Status.PASS, result.message
    assert result.node == "node2" and result.unit == "s" and result.threshold == 30
    assert isinstance(result.value, float) and isinstance(result.details["total"], float)
    assert result.details["chunks"] == 3 and result.details["ttft_chunk"] == 1
    assert result.details["model"] == "tiny:1b" and result.details["client"] == "node1"
    [asked] = ollama_server.requests
    assert asked["model"] == "tiny:1b" and asked["stream"] is True
    assert asked["options"]["num_predict"] == stacks.OLLAMA_TOKENS


@pytest.mark.parametrize("ollama_server", [{"generate": "ollama-generate-thinking.ndjson"}],
                         indirect=True)
def test_a_thinking_models_first_token_is_its_first_thought(ollama_server):
    result = _ollama_result(_local_ollama(ollama_server.port, ollama_gateway_port=1))
    assert result.status is Status.PASS
    # The first chunk carries nothing; the second the first thinking token.
    assert result.details["ttft_chunk"] == 2 and result.details["eval_count"] == 8


@pytest.mark.parametrize("ollama_server", [{"generate": "ollama-generate-404.json",
                                            "status": 404}], indirect=True)
def test_a_node_without_the_model_fails_naming_it(ollama_server):
    result = _ollama_result(_local_ollama(ollama_server.port, ollama_gateway_port=1))
    assert result.status is Status.FAIL and result.action is Action.REDEPLOY
    assert result.message.startswith("node2: Ollama at 127.0.0.1:")
    assert 'has no model tiny:1b (model "llama3.2:3b" not found' in result.message


@pytest.mark.parametrize("ollama_server", [{"generate": "ollama-generate-cut.ndjson"}],
                         indirect=True)
def test_a_stream_cut_short_fails(ollama_server):
    result = _ollama_result(_local_ollama(ollama_server.port, ollama_gateway_port=1))
    assert result.status is Status.FAIL and "ended before its last chunk" in result.message


@pytest.mark.parametrize("ollama_server", [{"tags": "ollama-tags-empty.json"}], indirect=True)
def test_no_model_anywhere_is_a_skip_with_the_reason(ollama_server):
    result = _ollama_result(_local_ollama(ollama_server.port, ollama_gateway_port=1,
                                          ollama_models=[]))
    assert result.status is Status.SKIP and "GET /api/tags lists none" in result.message
    assert ollama_server.requests == []


def test_without_ollama_models_the_first_listed_model_is_used(ollama_server):
    result = _ollama_result(_local_ollama(ollama_server.port, ollama_gateway_port=1,
                                          ollama_models=[]))
    assert result.status is Status.PASS
    assert result.details["model"] == "llama3.2:3b"
    assert result.details["model_from"] == "/api/tags"


def test_an_ollama_that_does_not_answer_fails_naming_the_node():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = _ollama_result(_local_ollama(port, ollama_gateway_port=1))
    assert result.status is Status.FAIL and result.action is Action.RESTART_SERVICE
    assert result.message.startswith(f"node2: Ollama at 127.0.0.1:{port} does not answer")


@pytest.mark.parametrize("ollama_server", [{"upstream": "10.213.0.12:11434"}], indirect=True)
def test_the_gateway_answers_a_generation_asked_from_an_ollama_node(ollama_server):
    cluster = _local_ollama(1, ollama_gateway_port=ollama_server.port)
    probe = the(stacks.probes(Context(cluster)), "stacks.ollama_gateway")
    assert probe.node == "node2"  # the client: an Ollama node other than the gateway
    [result] = run_probes([probe], local_transport)
    assert result.status is Status.PASS and result.node == "node1"
    assert "served by 10.213.0.12:11434" in result.message


def test_a_slow_first_token_fails_against_the_threshold():
    got = {"url": "10.20.0.23:11434", "model": "llama3.1:70b", "status": 200, "ttft": 41.5,
           "ttft_chunk": 1, "chunks": 9, "done": True, "load_s": 38.2, "total": 43.0}
    out = done(f"{stacks.OLLAMA_MARK} {json.dumps(got)}\n")
    slow = stacks.judge_ollama("stacks.ollama", "gpu3", "head", "Ollama at 10.20.0.23:11434",
                               30.0, out)
    assert (slow.status, slow.value, slow.threshold) == (Status.FAIL, 41.5, 30.0)
    assert "loading the model took 38.2 s" in slow.message
    fine = stacks.judge_ollama("stacks.ollama", "gpu3", "head", "Ollama", 60.0, out)
    assert fine.status is Status.PASS
    timed_out = done(f"{stacks.OLLAMA_MARK} " + json.dumps(
        {"model": "m", "status": 200, "ttft": None, "chunks": 0,
         "error": "TimeoutError: timed out"}) + "\n")
    result = stacks.judge_ollama("stacks.ollama", "gpu3", "head", "Ollama", 30.0, timed_out)
    assert result.status is Status.FAIL and "gave no token of m within 30 s" in result.message


def test_the_lab_asks_each_ollama_node_from_the_gateway(lab_probes):
    probes = [p for p in lab_probes if p.check == "stacks.ollama"]
    assert [p.node for p in probes] == ["head", "head"]
    assert "10.20.0.23:11434" in probes[0].command and "10.20.0.24:11434" in probes[1].command
    gateway = the(lab_probes, "stacks.ollama_gateway")
    assert "10.20.0.10:11434" in gateway.command
    # No model in the lab's inventory: the client takes the first one the node lists.
    assert " '' 8 35 " in probes[0].command


def test_the_e2e_standin_ollama_answers_the_check(tmp_path):
    """The STAND-IN Ollama the e2e tests deploy (tests/e2e/standins/ollama_bin.py:
    not Ollama) serves the check's generation: the client's request is one it knows."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OLLAMA_HOST": f"127.0.0.1:{port}",
           "OLLAMA_MODELS": str(tmp_path / "models")}
    standin = ROOT / "tests" / "e2e" / "standins" / "ollama_bin.py"
    server = subprocess.Popen(["python3", str(standin), "serve"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if subprocess.run(["python3", str(standin), "list"], env=env,
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        subprocess.run(["python3", str(standin), "pull", "tiny:1b"], env=env, check=True,
                       capture_output=True, timeout=30)
        result = _ollama_result(_local_ollama(port, ollama_gateway_port=1))
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert result.status is Status.PASS, result.message
    assert result.details["chunks"] == stacks.OLLAMA_TOKENS + 1
    assert result.details["done"] is True and result.details["ttft_chunk"] == 1
