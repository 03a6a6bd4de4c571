"""Stacks: the schedulers and services the inventory deploys do work on every node it
gives them.

- Slurm (``slurm_controller``, ``slurm_workers``): slurmd active on each worker
  (quick); each worker idle, mixed or allocated in ``sinfo`` on the controller, none
  down, not responding or unknown to Slurm (quick); a one-task job on each worker, and
  on a worker with GPUs a job asking all of them as GRES that sees them (standard).
- Ray (``ray_head``, ``ray_workers``): every node alive in the cluster at its address
  on the Ray network (quick); a task pinned to each node runs (standard).
- k3s (``k3s_servers``, ``k3s_agents``): every node Ready (quick); each NVIDIA GPU node
  offers ``nvidia.com/gpu`` as many as it declares (quick).
- Ollama (``ollama``, ``ollama_gateway``): each node, and each gateway, streams a short
  generation, timed to its first token (standard).

Checks that ask a whole cluster (sinfo, srun, a Ray driver, kubectl) run on the
cluster's controller, head or first server, and name in their results the node each
answer is about. Every command is the vendor's own client (sinfo, srun, Ray's Python
API in the deployed venv, ``k3s kubectl``) or, for Ollama's HTTP API, Python's
``http.client`` on the node; each is bounded by ``timeout`` on the node besides the
runner's own limit.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from functools import partial
from typing import Any

from aicluster.checks.context import Context
from aicluster.checks.result import Action, Result, Status
from aicluster.checks.runner import Completed, Probe
from aicluster.components.k3s.derive import k3s_hosts, servers
from aicluster.components.ollama.derive import (
    gateway_hosts,
    ollama_hosts,
    ollama_network,
    upstreams,
    url_host,
)
from aicluster.components.ray.derive import node_ip, ray_hosts, venv_path
from aicluster.components.slurm.derive import gres_count

LAYER = "stacks"

#: What a probe prints on stderr when a tool it needs is not on the node (exit 127).
MISSING = "aicluster-missing:"
#: Seconds a quick probe may take (the quick tier keeps to a minute per node).
QUICK_LIMIT = 30
#: Seconds a driver or client gets to connect before its command is stopped.
CONNECT_LIMIT = 25


# ---------------------------------------------------------------------------
# Shared
# ---------------------------------------------------------------------------


def need(tool: str) -> str:
    """Shell that exits 127 naming ``tool`` (a command, or an absolute path) when the
    node lacks it."""
    test = f"[ -x {shlex.quote(tool)} ]" if tool.startswith("/") else (
        f"command -v {shlex.quote(tool)} >/dev/null 2>&1")
    return f"{test} || {{ echo {shlex.quote(f'{MISSING} {tool}')} >&2; exit 127; }}; "


def _last_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][-limit:] if lines else ""


def _error_of(done: Completed) -> str:
    return _last_line(done.stderr) or _last_line(done.stdout) or f"exit {done.rc}"


def cannot_run(check: str, vantage: str, done: Completed, what: str) -> Result | None:
    """The ERROR for a probe that could not run at all on ``vantage``: a tool missing
    (exit 127, the tool named), or the node not reached (the SSH client's exit 255 with
    nothing printed); None when the probe ran."""
    if done.rc == 127:
        tool = next((line.split(MISSING, 1)[1].strip() for line in done.stderr.splitlines()
                     if MISSING in line), "") or _error_of(done)
        return Result(check, Status.ERROR, node=vantage, action=Action.REDEPLOY,
                      message=f"{vantage}: {tool} is not installed, and the inventory "
                              f"deploys {what} there: deploy it again",
                      details={"missing": tool})
    if done.rc == 255 and not done.stdout.strip():
        return Result(check, Status.ERROR, node=vantage, action=Action.INVESTIGATE,
                      message=f"{vantage}: could not run the check there: {_error_of(done)}")
    return None


def _marked(text: str, mark: str) -> Any:
    """The JSON value after ``mark`` on the last line that starts with it (tools print
    their own lines around it), or None."""
    found = None
    for line in text.splitlines():
        if line.startswith(mark + " "):
            found = line[len(mark) + 1:]
    return None if found is None else json.loads(found)


def _extra(check: str, vantage: str, names: list[str], what: str) -> Result:
    """Nodes a cluster has that the inventory does not give it: a WARN on the node that
    asked, under its own check name (``stacks.<stack>_extra_nodes``: the node that asked
    may be one of the cluster's, with its own result of ``check``)."""
    return Result(f"{check.rsplit('_', 1)[0]}_extra_nodes", Status.WARN, node=vantage,
                  action=Action.INVESTIGATE,
                  value=len(names), unit="nodes",
                  message=f"{vantage}: {what} lists nodes the inventory does not give it: "
                          f"{', '.join(names)}", details={"extra": names})


# ---------------------------------------------------------------------------
# Slurm
# ---------------------------------------------------------------------------

#: systemd's view of slurmd, key=value per line (order as systemd prints them).
SLURMD_COMMAND = ("systemctl show -p LoadState -p ActiveState -p SubState -p UnitFileState "
                  "slurmd.service")
#: One line per node and partition: name, state (sinfo's long form, lowercase, with its
#: flag: * not responding, ~ powered off ...), who set the reason, when, the reason
#: (last: it may hold any character). Every Slurm release prints these fields so
#: (``scontrol show node --json`` needs the data_parser plugins of newer releases).
SINFO_COMMAND = "sinfo -a -N -h -o '%N|%T|%u|%H|%E'"

#: States in which a node takes jobs (sinfo's long form, its flag stripped).
SLURM_OK = {"idle", "allocated", "mixed", "completing", "reserved", "planned", "perfctrs"}
#: States in which it takes none until someone acts.
SLURM_FAILED = {"down", "fail", "failing", "inval", "unknown", "future", "error", "?"}
SLURM_DRAINED = {"drain", "drained", "draining"}
SLURM_POWER = {"power_down", "power_up", "powering_down", "powered_down", "powering_up",
               "cloud"}
SLURM_REBOOT = {"reboot", "reboot_issued", "cancel_reboot"}
#: The flags sinfo appends to a state (slurm_protocol_defs.c, node_state_string).
SLURM_FLAGS = "*~#%!$@^+-"
_NO_VALUE = {"", "none", "unknown", "(null)", "n/a"}


def judge_slurmd(node: str, done: Completed) -> Result:
    check = "stacks.slurmd"
    props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if done.rc != 0 or "LoadState" not in props:
        failed = cannot_run(check, node, done, "Slurm's slurmd")
        if failed:
            return failed
        raise ValueError(f"systemctl show printed no unit state: {_error_of(done)}")
    load, active = props.get("LoadState", ""), props.get("ActiveState", "")
    sub, enabled = props.get("SubState", ""), props.get("UnitFileState", "")
    if load != "loaded":
        return Result(check, Status.ERROR, node=node, value=load, action=Action.REDEPLOY,
                      message=f"{node}: slurmd is not installed (slurmd.service {load}), "
                              "and the inventory makes it a Slurm worker: deploy it again")
    if active not in ("active", "reloading"):
        return Result(check, Status.FAIL, node=node, value=active, threshold="active",
                      action=Action.RESTART_SERVICE,
                      message=f"{node}: slurmd is {active} ({sub}): no job starts on {node}; "
                              "start it (systemctl start slurmd) and read why it stopped "
                              "(journalctl -u slurmd)")
    if enabled and enabled not in ("enabled", "static", "alias", "indirect"):
        return Result(check, Status.WARN, node=node, value=enabled, threshold="enabled",
                      action=Action.REDEPLOY,
                      message=f"{node}: slurmd runs but is {enabled}: it will not start "
                              "after a reboot; deploy again")
    return Result(check, Status.PASS, node=node, value=active, message="slurmd active")


def parse_sinfo(text: str) -> dict[str, dict[str, str]]:
    """:data:`SINFO_COMMAND`'s output -> node -> ``state``, ``user``, ``time``,
    ``reason`` (empty where Slurm has none); a node listed in several partitions once."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 4)
        if len(parts) != 5 or not parts[0].strip():
            continue
        name, state, user, when, reason = (p.strip() for p in parts)
        out.setdefault(name, {
            "state": state.lower(),
            "user": "" if user.lower() in _NO_VALUE else user,
            "time": "" if when.lower() in _NO_VALUE else when,
            "reason": "" if reason.lower() in _NO_VALUE else reason,
        })
    return out


def slurm_state(state: str) -> tuple[str, str]:
    """``down*`` -> (``down``, ``*``): the base state and its flags."""
    base = state.lower().rstrip(SLURM_FLAGS)
    return base, state.lower()[len(base):]


def judge_slurm_node(node: str, controller: str, entry: Mapping[str, str] | None) -> Result:
    check = "stacks.slurm_nodes"
    expected = "idle, mixed or allocated"
    if entry is None:
        return Result(check, Status.FAIL, node=node, threshold=expected,
                      action=Action.REDEPLOY,
                      message=f"{node}: not in Slurm: sinfo on {controller} does not list it "
                              "(slurm.conf there does not name it, or no partition holds "
                              "it): deploy Slurm again")
    state = entry["state"]
    base, flags = slurm_state(state)
    reason = entry.get("reason", "")
    said = ""
    if reason:
        who = " ".join(x for x in (f"by {entry['user']}" if entry.get("user") else "",
                                   f"at {entry['time']}" if entry.get("time") else "") if x)
        said = f" (reason{' set ' + who if who else ''}: {reason})"

    def result(status: Status, action: Action, text: str) -> Result:
        return Result(check, status, node=node, value=state, threshold=expected,
                      action=action, message=f"{node}: {text}{said}",
                      details={k: v for k, v in entry.items() if v})

    if "*" in flags:
        text = (f"Slurm marks it not responding ({state}): slurmd on {node} does not "
                f"answer slurmctld on {controller}; check slurmd there (systemctl "
                "status slurmd) and the network between them")
        if base == "down":
            # slurmctld stops pinging a node it set down for not answering, and asks it
            # to register only every 20th ping: it can stay down long after it is back.
            text += ("; once they are fine it stays down until slurmd registers again "
                     f"(restart slurmd on {node}, or scontrol update NodeName={node} "
                     "State=RESUME)")
        return result(Status.FAIL, Action.RESTART_SERVICE, text)
    if base in SLURM_FAILED:
        if base == "inval":
            text = (f"registered with less than slurm.conf declares ({state}): its CPUs, "
                    "memory or GPUs differ from the inventory's hardware")
            return result(Status.FAIL, Action.INVESTIGATE, text)
        if base == "unknown":
            return result(Status.FAIL, Action.RESTART_SERVICE,
                          f"slurmd never registered with slurmctld ({state})")
        action = Action.RESTART_SERVICE if "not responding" in reason.lower() else (
            Action.INVESTIGATE)
        return result(Status.FAIL, action, f"Slurm has it {state}: it takes no jobs")
    if base in SLURM_DRAINED:
        return result(Status.WARN, Action.INVESTIGATE,
                      f"drained ({state}): it takes no new jobs until resumed "
                      f"(scontrol update NodeName={node} State=RESUME)")
    if base in SLURM_POWER or set(flags) & set("~#%!"):
        return result(Status.WARN, Action.MONITOR,
                      f"powered down or changing power state ({state}): Slurm's power "
                      "saving")
    if base in SLURM_REBOOT or set(flags) & set("@^"):
        return result(Status.WARN, Action.MONITOR, f"a reboot is pending ({state})")
    if base == "maint" or "$" in flags:
        return result(Status.WARN, Action.MONITOR,
                      f"in a maintenance reservation ({state})")
    if base in SLURM_OK:
        return Result(check, Status.PASS, node=node, value=state, threshold=expected,
                      message=f"{state} in Slurm")
    return result(Status.WARN, Action.INVESTIGATE, f"in a state this check does not know "
                                                   f"({state})")


def judge_slurm_nodes(workers: list[str], controller: str, report_extra: bool,
                      all_workers: list[str], done: Completed) -> list[Result]:
    """sinfo on the controller: one result per worker; nodes Slurm has that the
    inventory does not give Slurm are one WARN on the controller."""
    check = "stacks.slurm_nodes"
    failed = cannot_run(check, controller, done, "Slurm's controller (sinfo)")
    if failed:
        return [failed]
    if done.rc != 0:
        return [Result(check, Status.FAIL, node=controller, action=Action.RESTART_SERVICE,
                       message=f"{controller}: sinfo cannot read the nodes from slurmctld: "
                               f"{_error_of(done)} (systemctl status slurmctld)")]
    nodes = parse_sinfo(done.stdout)
    if not nodes and done.stdout.strip():
        raise ValueError("not the output of " + SINFO_COMMAND)
    results = [judge_slurm_node(w, controller, nodes.get(w)) for w in workers]
    extra = sorted(n for n in nodes if n not in all_workers)
    if report_extra and extra:
        results.append(_extra(check, controller, extra, "Slurm (sinfo)"))
    return results


def _partitions(ctx: Context, controller: str, gpus: int) -> str:
    """The partitions a worker is in (the GPU partition first for a GPU job), as the
    deploy writes them: every worker in the default one, GPU workers in the GPU one."""
    names = [str(ctx.setting(controller, "slurm", key) or "")
             for key in ("slurm_gpu_partition_name", "slurm_partition_name")]
    if not gpus:
        names = names[1:]
    return ",".join(n for n in names if n)


def job_command(node: str, wait_s: int, partitions: str, gpus: int = 0) -> str:
    """On the controller: the node's state, then one task on it (``gpus``: asking that
    many GPUs as GRES), waiting at most ``wait_s`` seconds for it to start; the task
    prints what Slurm gave it."""
    task = ("env | grep -E '^(SLURMD_NODENAME|CUDA_VISIBLE_DEVICES|SLURM_JOB_GPUS|"
            "SLURM_STEP_GPUS)=' | sed 's/^/aicluster-job-/'")
    srun = ["srun", f"--immediate={int(wait_s)}", "--job-name=aicluster-check",
            f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--time=1"]
    if partitions:
        srun.append(f"--partition={partitions}")
    if gpus:
        srun.append(f"--gres=gpu:{int(gpus)}")
    return (
        need("srun")
        + f"sinfo -h -N -n {shlex.quote(node)} -o 'aicluster-state=%T' 2>/dev/null "
          "| head -n 1; "
        + f"timeout -k 5 {int(wait_s) + 20} "
        + " ".join(shlex.quote(a) for a in srun) + f" sh -c {shlex.quote(task)}; "
        + 'echo "aicluster-rc=$?"'
    )


def parse_job(text: str) -> dict[str, str]:
    """:func:`job_command`'s output -> ``state``, ``rc`` and the task's variables."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        for prefix, key in (("aicluster-state=", "state"), ("aicluster-rc=", "rc")):
            if line.startswith(prefix):
                out[key] = line[len(prefix):]
        if line.startswith("aicluster-job-") and "=" in line:
            name, _, value = line[len("aicluster-job-"):].partition("=")
            out[name] = value
    return out


def _gpu_count(job: Mapping[str, str]) -> int | None:
    for key in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if key in job:
            return len([x for x in job[key].split(",") if x.strip()])
    return None


def judge_slurm_job(node: str, controller: str, wait_s: int, gpus: int,
                    done: Completed) -> Result:
    """The job on ``node`` (``gpus``: the GRES job) ran there, and saw its GPUs."""
    check = "stacks.slurm_gres" if gpus else "stacks.slurm_job"
    what = f"a job asking {gpus} GPU(s)" if gpus else "a one-task job"
    failed = cannot_run(check, controller, done, "Slurm's controller (srun)")
    if failed:
        failed.message += f" (the job for {node})"
        return failed
    job = parse_job(done.stdout)
    if "rc" not in job:
        raise ValueError(f"no exit status of srun in the output: {_error_of(done)}")
    rc, state = job["rc"], job.get("state", "")
    srun_said = [line.strip() for line in done.stderr.splitlines()
                 if line.strip().startswith("srun:")]
    details: dict[str, Any] = {"state": state, "srun": srun_said[-5:], "rc": rc}
    if rc == "0" and job.get("SLURMD_NODENAME") == node:
        if not gpus:
            return Result(check, Status.PASS, node=node, value=round(done.duration, 1),
                          threshold=wait_s, unit="s", details=details,
                          message=f"{what} ran on {node}")
        seen = _gpu_count(job)
        details.update({k: job[k] for k in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS",
                                            "SLURM_STEP_GPUS") if k in job})
        if seen != gpus:
            return Result(check, Status.FAIL, node=node, value=seen or 0, threshold=gpus,
                          unit="GPUs", action=Action.INVESTIGATE, details=details,
                          message=f"{node}: {what} ran but sees {seen or 0} "
                                  f"(CUDA_VISIBLE_DEVICES={job.get('CUDA_VISIBLE_DEVICES', '')}"
                                  "): check gres.conf and the GPU devices there")
        return Result(check, Status.PASS, node=node, value=seen, threshold=gpus,
                      unit="GPUs", details=details, message=f"{what} ran and sees them")
    if rc == "0":
        return Result(check, Status.FAIL, node=node, action=Action.INVESTIGATE,
                      details=details,
                      message=f"{node}: {what} for {node} ran on "
                              f"{job.get('SLURMD_NODENAME') or 'an unknown node'}")
    said = " ".join(srun_said)
    base, flags = slurm_state(state)
    waited = "queued and waiting" in said or "timed out" in said or rc in ("124", "137")
    busy = base in ("allocated", "mixed", "completing") and not flags.strip("+-")
    if waited and busy and "not available" not in said:
        return Result(check, Status.WARN, node=node, value=state, action=Action.MONITOR,
                      details=details,
                      message=f"{node}: {what} did not start within {wait_s} s: the node is "
                              f"{state} with other jobs (squeue -w {node})")
    if "Invalid generic resource" in said or "configuration is not available" in said:
        action = Action.REDEPLOY
    elif "*" in flags or "not responding" in said.lower():
        action = Action.RESTART_SERVICE
    else:
        action = Action.INVESTIGATE
    why = (srun_said[-1] if srun_said else _error_of(done))
    if rc in ("124", "137"):
        why = f"srun did not end within {wait_s + 20} s; {why}"
    return Result(check, Status.FAIL, node=node, value=state or None, action=action,
                  details=details,
                  message=f"{node}: {what} did not run there (Slurm state "
                          f"{state or 'unknown'}): {why}")


def slurm_probes(ctx: Context) -> list[Probe]:
    controllers = ctx.cluster.group("slurm_controller")
    workers = ctx.in_groups("slurm_workers")
    out: list[Probe] = []
    for node in workers:
        out.append(Probe("stacks.slurmd", LAYER, SLURMD_COMMAND, partial(judge_slurmd, node),
                         timeout=15, node=node))
    if not controllers or not workers:
        return out
    controller = controllers[0]
    out.append(Probe(
        "stacks.slurm_nodes", LAYER, need("sinfo") + f"timeout -k 5 20 {SINFO_COMMAND}",
        partial(judge_slurm_nodes, workers, controller, controller in ctx.nodes(),
                list(ctx.cluster.group("slurm_workers"))),
        timeout=QUICK_LIMIT, node=controller))
    if not ctx.standard:
        return out
    for node in workers:
        wait_s = int(ctx.threshold(node, "stacks.slurm_job_timeout_s"))
        out.append(Probe(
            "stacks.slurm_job", LAYER, job_command(node, wait_s, _partitions(ctx, controller, 0)),
            partial(judge_slurm_job, node, controller, wait_s, 0),
            timeout=wait_s + 40, node=controller))
        gpus = gres_count(ctx.cluster, node, ctx.host(node).data)
        if gpus:
            out.append(Probe(
                "stacks.slurm_gres", LAYER,
                job_command(node, wait_s, _partitions(ctx, controller, gpus), gpus),
                partial(judge_slurm_job, node, controller, wait_s, gpus),
                timeout=wait_s + 40, node=controller))
    return out


# ---------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------

RAY_MARK = "aicluster-ray"

#: A Ray driver in the deployed venv: every node the cluster knows, with its address
#: and whether it is alive. argv: the head's GCS address, the head's own address on the
#: Ray network (a driver on a host with several networks must name the address its
#: raylet was started with, ``ray start --node-ip-address``; Ray releases before
#: ray-project/ray#37644 do not find it themselves).
RAY_NODES_SCRIPT = """\
import json, sys
import ray
ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], logging_level="ERROR",
         log_to_driver=False)
print("aicluster-ray " + json.dumps([
    {"ip": n.get("NodeManagerAddress"), "hostname": n.get("NodeManagerHostname"),
     "alive": bool(n.get("Alive")), "id": n.get("NodeID")} for n in ray.nodes()]))
"""

#: A Ray driver: one task pinned to each address (Ray's per-node resource
#: ``node:<address>``), each returning the host it ran on, all within the limit.
#: argv: the head's GCS address, the head's address, the addresses as JSON, the limit
#: in seconds.
RAY_TASK_SCRIPT = """\
import json, socket, sys, time
import ray
address, own, wanted, limit = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
ray.init(address=address, _node_ip_address=own, logging_level="ERROR", log_to_driver=False)
alive = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}

@ray.remote(num_cpus=0)
def where():
    return socket.gethostname()

start, refs, out = time.monotonic(), {}, {}
for ip in wanted:
    if ip in alive:
        refs[ip] = where.options(resources={"node:" + ip: 0.001}).remote()
    else:
        out[ip] = {"ok": False, "error": "no alive Ray node has this address"}
for ip, ref in refs.items():
    try:
        host = ray.get(ref, timeout=max(0.1, limit - (time.monotonic() - start)))
        out[ip] = {"ok": True, "hostname": host,
                   "seconds": round(time.monotonic() - start, 3)}
    except Exception as exc:
        out[ip] = {"ok": False, "error": (type(exc).__name__ + ": " + str(exc))[:300]}
print("aicluster-ray " + json.dumps(out))
"""


def ray_command(python: str, user: str, script: str, args: list[str], limit: int) -> str:
    """``script`` run by the venv's Python as Ray's own user (so that what the driver
    writes in Ray's session directory stays Ray's), bounded by ``limit`` seconds."""
    argv = " ".join(shlex.quote(a) for a in args)
    return (need(python) + "cd / && "
            f"timeout -k 5 {int(limit)} runuser -u {shlex.quote(user)} -- "
            f"env HOME={shlex.quote('/var/lib/' + user)} RAY_USAGE_STATS_ENABLED=0 "
            f"{shlex.quote(python)} -c {shlex.quote(script)} {argv}")


def _ray_unit(node: str, head: str) -> str:
    return "ray-head" if node == head else "ray-worker"


def _ray_driver_failed(check: str, head: str, address: str, limit: int,
                       done: Completed) -> Result | None:
    failed = cannot_run(check, head, done, "Ray's head (its venv's Python)")
    if failed:
        return failed
    if done.rc in (124, 137):
        return Result(check, Status.FAIL, node=head, threshold=limit, unit="s",
                      action=Action.RESTART_SERVICE,
                      message=f"{head}: a Ray driver could not finish against the head at "
                              f"{address} within {limit} s (systemctl status ray-head)")
    if _marked(done.stdout, RAY_MARK) is None:
        return Result(check, Status.FAIL, node=head, action=Action.RESTART_SERVICE,
                      message=f"{head}: a Ray driver could not connect to the head at "
                              f"{address}: {_error_of(done)} (systemctl status ray-head)")
    return None


def judge_ray_nodes(addresses: dict[str, str], head: str, gcs: str, limit: int,
                    report_extra: bool, done: Completed) -> list[Result]:
    """Every Ray node of the inventory (``addresses``: node -> its address on the Ray
    network) alive in the cluster; alive nodes the inventory does not have, one WARN on
    the head."""
    check = "stacks.ray_nodes"
    failed = _ray_driver_failed(check, head, gcs, limit, done)
    if failed:
        return [failed]
    known = _marked(done.stdout, RAY_MARK)
    results = []
    for node, ip in addresses.items():
        entries = [n for n in known if n.get("ip") == ip]
        alive = [n for n in entries if n.get("alive")]
        unit = _ray_unit(node, head)
        if alive:
            results.append(Result(check, Status.PASS, node=node, value=ip,
                                  details={"ray_node_id": alive[0].get("id")},
                                  message=f"alive in the Ray cluster at {ip}"))
        elif entries:
            results.append(Result(check, Status.FAIL, node=node, value="dead", threshold="alive",
                                  action=Action.RESTART_SERVICE,
                                  message=f"{node}: dead in the Ray cluster (its raylet at {ip} "
                                          f"stopped): systemctl status {unit} on {node}"))
        else:
            results.append(Result(check, Status.FAIL, node=node, value="absent",
                                  threshold="alive", action=Action.RESTART_SERVICE,
                                  message=f"{node}: not in the Ray cluster: no Ray node at "
                                          f"{ip} joined the head at {gcs} (systemctl status "
                                          f"{unit} on {node})"))
    extra = sorted({str(n.get("ip")) for n in known if n.get("alive")} - set(addresses.values()))
    if report_extra and extra:
        results.append(_extra(check, head, extra, "the Ray cluster"))
    return results


def judge_ray_task(addresses: dict[str, str], head: str, gcs: str, limit: int,
                   done: Completed) -> list[Result]:
    """A task pinned to each Ray node ran there within ``limit`` seconds."""
    check = "stacks.ray_task"
    failed = _ray_driver_failed(check, head, gcs, limit + CONNECT_LIMIT, done)
    if failed:
        return [failed]
    ran = _marked(done.stdout, RAY_MARK)
    results = []
    for node, ip in addresses.items():
        got = ran.get(ip) or {"ok": False, "error": "the driver did not report this node"}
        if got.get("ok"):
            results.append(Result(check, Status.PASS, node=node, value=got.get("seconds"),
                                  threshold=limit, unit="s",
                                  details={"hostname": got.get("hostname")},
                                  message=f"a task pinned to {ip} ran on "
                                          f"{got.get('hostname')}"))
        else:
            results.append(Result(check, Status.FAIL, node=node, threshold=limit, unit="s",
                                  action=Action.INVESTIGATE, details=got,
                                  message=f"{node}: a Ray task pinned to it ({ip}) did not "
                                          f"run: {got.get('error')}"))
    return results


def ray_probes(ctx: Context) -> list[Probe]:
    cluster = ctx.cluster
    heads = cluster.group("ray_head")
    nodes = [n for n in ray_hosts(cluster) if n in ctx.nodes()]
    if not heads or not nodes:
        return []
    head = heads[0]
    addresses = {n: node_ip(cluster, n) for n in nodes}
    own = node_ip(cluster, head)
    gcs = f"{url_host(own)}:{int(ctx.setting(head, 'ray', 'ray_port'))}"
    python = venv_path({key: ctx.setting(head, "ray", key)
                        for key in ("ray_install_dir", "ray_version")}) + "/bin/python"
    user = str(ctx.setting(head, "ray", "ray_user"))
    out = [Probe(
        "stacks.ray_nodes", LAYER, ray_command(python, user, RAY_NODES_SCRIPT, [gcs, own],
                                               CONNECT_LIMIT),
        partial(judge_ray_nodes, addresses, head, gcs, CONNECT_LIMIT, head in ctx.nodes()),
        timeout=QUICK_LIMIT + 10, node=head)]
    if ctx.standard:
        limit = int(max(ctx.threshold(n, "stacks.ray_task_timeout_s") for n in nodes))
        out.append(Probe(
            "stacks.ray_task", LAYER,
            ray_command(python, user, RAY_TASK_SCRIPT,
                        [gcs, own, json.dumps(list(addresses.values())), str(limit)],
                        limit + CONNECT_LIMIT),
            partial(judge_ray_task, addresses, head, gcs, limit),
            timeout=limit + CONNECT_LIMIT + 20, node=head))
    return out


# ---------------------------------------------------------------------------
# k3s
# ---------------------------------------------------------------------------

K3S = "/usr/local/bin/k3s"
#: One line per node: name, the Ready condition's status and reason, whether it is
#: cordoned, its allocatable nvidia.com/gpu (empty where none). kubectl's JSONPath.
K3S_JSONPATH = (
    r'{range .items[*]}{.metadata.name}{"\t"}'
    r'{.status.conditions[?(@.type=="Ready")].status}{"\t"}'
    r'{.status.conditions[?(@.type=="Ready")].reason}{"\t"}'
    r'{.spec.unschedulable}{"\t"}'
    r'{.status.allocatable.nvidia\.com/gpu}{"\n"}{end}'
)
K3S_COMMAND = (need(K3S) + f"timeout -k 5 20 {K3S} kubectl get nodes -o "
               + shlex.quote(f"jsonpath={K3S_JSONPATH}"))


def parse_k3s_nodes(text: str) -> dict[str, dict[str, str]]:
    """:data:`K3S_COMMAND`'s output -> node -> ``ready``, ``reason``,
    ``unschedulable``, ``gpus``."""
    out = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 5 or not parts[0].strip():
            continue
        name, ready, reason, unschedulable, gpus = (p.strip() for p in parts)
        out[name] = {"ready": ready, "reason": reason,
                     "unschedulable": unschedulable, "gpus": gpus}
    return out


def _k3s_read(check: str, server: str, done: Completed) -> dict | Result:
    failed = cannot_run(check, server, done, "a k3s server")
    if failed:
        return failed
    if done.rc != 0:
        return Result(check, Status.FAIL, node=server, action=Action.RESTART_SERVICE,
                      message=f"{server}: k3s kubectl cannot read the nodes from the API "
                              f"server: {_error_of(done)} (systemctl status k3s)")
    nodes = parse_k3s_nodes(done.stdout)
    if not nodes and done.stdout.strip():
        raise ValueError("not the nodes' JSONPath lines")
    return nodes


def judge_k3s_nodes(units: dict[str, str], server: str, report_extra: bool,
                    done: Completed) -> list[Result]:
    """Every k3s node of the inventory (``units``: node -> its k3s unit) Ready."""
    check = "stacks.k3s_nodes"
    nodes = _k3s_read(check, server, done)
    if isinstance(nodes, Result):
        return [nodes]
    results = []
    for node, unit in units.items():
        entry = nodes.get(node)
        if entry is None:
            results.append(Result(check, Status.FAIL, node=node, value="absent",
                                  threshold="Ready", action=Action.RESTART_SERVICE,
                                  message=f"{node}: not a node of the k3s cluster: it never "
                                          f"registered with the servers (systemctl status "
                                          f"{unit} on {node})"))
        elif entry["ready"] != "True":
            why = f"{entry['ready'] or 'no'} Ready condition" + (
                f", {entry['reason']}" if entry["reason"] else "")
            results.append(Result(check, Status.FAIL, node=node, value="NotReady",
                                  threshold="Ready", action=Action.RESTART_SERVICE,
                                  details=entry,
                                  message=f"{node}: NotReady in k3s ({why}): systemctl status "
                                          f"{unit} on {node}"))
        elif entry["unschedulable"] == "true":
            results.append(Result(check, Status.WARN, node=node, value="Ready,SchedulingDisabled",
                                  threshold="Ready", action=Action.INVESTIGATE, details=entry,
                                  message=f"{node}: Ready but cordoned: no new pods start "
                                          f"there (kubectl uncordon {node})"))
        else:
            results.append(Result(check, Status.PASS, node=node, value="Ready",
                                  threshold="Ready", message="Ready in k3s"))
    extra = sorted(set(nodes) - set(units))
    if report_extra and extra:
        results.append(_extra(check, server, extra, "k3s (kubectl get nodes)"))
    return results


def judge_k3s_gpu(declared: dict[str, tuple[int, str]], server: str,
                  done: Completed) -> list[Result]:
    """Each GPU node's allocatable nvidia.com/gpu against its declared count
    (``declared``: node -> (count, vendor)); a stand-in GPU is skipped."""
    check = "stacks.k3s_gpu"
    results = [Result(check, Status.SKIP, node=node, threshold=count, unit="GPUs",
                      message=f"stand-in GPU ({vendor}): no NVIDIA GPU on this node, so "
                              "k3s offers no nvidia.com/gpu")
               for node, (count, vendor) in declared.items() if vendor != "nvidia"]
    nvidia = {n: c for n, (c, vendor) in declared.items() if vendor == "nvidia"}
    if not nvidia:
        return results
    nodes = _k3s_read(check, server, done)
    if isinstance(nodes, Result):
        return [*results, nodes]
    for node, count in nvidia.items():
        entry = nodes.get(node)
        text = (entry or {}).get("gpus", "")
        have = int(text) if text.isdigit() else 0
        if entry is None:
            status, action = Status.FAIL, Action.RESTART_SERVICE
            message = f"{node}: not a node of the k3s cluster, so it offers no GPU"
        elif have < count:
            status, action = Status.FAIL, Action.INVESTIGATE
            message = (f"{node}: k3s offers {have} nvidia.com/gpu, the inventory declares "
                       f"{count}: NVIDIA's device plugin does not run there or sees fewer "
                       "GPUs (its DaemonSet's pod on the node, nvidia-smi)")
        elif have > count:
            status, action = Status.WARN, Action.INVESTIGATE
            message = (f"{node}: k3s offers {have} nvidia.com/gpu, more than the "
                       f"{count} the inventory declares: correct hardware.gpus.count")
        else:
            status, action, message = Status.PASS, Action.NONE, "nvidia.com/gpu allocatable"
        results.append(Result(check, status, node=node, value=have, threshold=count,
                              unit="GPUs", action=action, message=message))
    return results


def k3s_probes(ctx: Context) -> list[Probe]:
    cluster = ctx.cluster
    srv = servers(cluster)
    nodes = [n for n in k3s_hosts(cluster) if n in ctx.nodes()]
    if not srv or not nodes:
        return []
    server = srv[0]
    units = {n: "k3s" if n in srv else "k3s-agent" for n in nodes}
    out = [Probe("stacks.k3s_nodes", LAYER, K3S_COMMAND,
                 partial(judge_k3s_nodes, units, server, server in ctx.nodes()),
                 timeout=QUICK_LIMIT, node=server)]
    gpus = {n: (ctx.host(n).spec.hardware.gpus.count, ctx.host(n).spec.hardware.gpus.vendor)
            for n in nodes if ctx.host(n).spec.hardware.gpus.count}
    if gpus:
        # Stand-in GPUs only (the testbed): nothing to ask k3s, each one a SKIP.
        command = K3S_COMMAND if any(v == "nvidia" for _, v in gpus.values()) else "true"
        out.append(Probe("stacks.k3s_gpu", LAYER, command,
                         partial(judge_k3s_gpu, gpus, server), timeout=QUICK_LIMIT,
                         node=server))
    return out


# ---------------------------------------------------------------------------
# Ollama
# ---------------------------------------------------------------------------

OLLAMA_MARK = "aicluster-ollama"
#: Tokens the test generation asks for (options.num_predict).
OLLAMA_TOKENS = 8
OLLAMA_PROMPT = "Reply with one word: ready."

#: The client, run with the node's python3 (standard library only): a streamed
#: POST /api/generate, timed from the request to the first chunk that carries a token
#: (``response`` or a thinking model's ``thinking``), read to the end. With no model
#: given, the first model GET /api/tags lists. argv: host:port, model ("" for the
#: first listed), num_predict, the socket timeout (seconds), the prompt. Prints one
#: JSON line after :data:`OLLAMA_MARK`.
OLLAMA_CLIENT = """\
import http.client, json, sys, time
url, model, tokens, wait, prompt = sys.argv[1:6]
tokens, wait = int(tokens), float(wait)
host, _, port = url.rpartition(":")
host = host.strip("[]")
out = {"url": url, "model": model}

def finish(**kw):
    out.update(kw)
    print("aicluster-ollama " + json.dumps(out))
    sys.exit(0)

def send(method, path, body=None):
    conn = http.client.HTTPConnection(host, int(port), timeout=wait)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()

def error_of(resp):
    text = resp.read(4000).decode("utf-8", "replace")
    try:
        return str(json.loads(text).get("error") or text)[:300]
    except ValueError:
        return text.strip()[:300]

start = time.monotonic()
try:
    if not model:
        conn, resp = send("GET", "/api/tags")
        if resp.status != 200:
            finish(status=resp.status, error=error_of(resp))
        listed = json.loads(resp.read()).get("models") or []
        names = [m.get("name") or m.get("model") for m in listed]
        conn.close()
        if not names:
            finish(skip="no model on it: ollama_models is empty and GET /api/tags lists none")
        model = out["model"] = names[0]
        out["model_from"] = "/api/tags"
    start = time.monotonic()
    conn, resp = send("POST", "/api/generate", {"model": model, "prompt": prompt, "stream": True,
                      "options": {"num_predict": tokens, "temperature": 0}})
    out["status"] = resp.status
    out["upstream"] = resp.getheader("X-Ollama-Upstream") or ""
    if resp.status != 200:
        finish(error=error_of(resp))
    out.update(ttft=None, chunks=0)
    last = {}
    for raw in resp:
        if not raw.strip():
            continue
        item = json.loads(raw)
        if item.get("error"):
            finish(error=str(item["error"])[:300])
        out["chunks"] += 1
        if out["ttft"] is None and (item.get("response") or item.get("thinking")):
            out["ttft"], out["ttft_chunk"] = round(time.monotonic() - start, 3), out["chunks"]
        last = item
        if item.get("done"):
            break
    conn.close()
    finish(total=round(time.monotonic() - start, 3), done=bool(last.get("done")),
           done_reason=last.get("done_reason"), eval_count=last.get("eval_count"),
           load_s=(last.get("load_duration") or 0) / 1e9 or None,
           served_by=last.get("served_by"))
except (OSError, http.client.HTTPException, ValueError) as exc:
    finish(error=type(exc).__name__ + ": " + str(exc)[:300],
           after=round(time.monotonic() - start, 3))
"""


def ollama_command(url: str, model: str, wait_s: float, limit: int) -> str:
    args = [url, model, str(OLLAMA_TOKENS), f"{wait_s:g}", OLLAMA_PROMPT]
    return (need("python3") + f"timeout -k 5 {int(limit)} python3 -c "
            + shlex.quote(OLLAMA_CLIENT) + " " + " ".join(shlex.quote(a) for a in args))


def judge_ollama(check: str, node: str, client: str, what: str, ttft_max: float,
                 done: Completed) -> Result:
    """One streamed generation (``what``: the Ollama node or the gateway, and its
    address) answered, with its first token within ``ttft_max`` seconds."""
    failed = cannot_run(check, client, done, "Ollama's check client (python3)")
    if failed:
        failed.message += f" (the generation on {node})"
        return failed
    if done.rc in (124, 137):
        return Result(check, Status.FAIL, node=node, threshold=ttft_max, unit="s",
                      action=Action.INVESTIGATE,
                      message=f"{node}: {what} did not finish a {OLLAMA_TOKENS}-token "
                              f"generation in time (asked from {client})")
    got = _marked(done.stdout, OLLAMA_MARK)
    if got is None:
        raise ValueError(f"the client printed no result: {_error_of(done)}")
    details = {k: v for k, v in got.items() if v is not None and k != "skip"}
    details["client"] = client
    model = got.get("model") or "?"
    if got.get("skip"):
        return Result(check, Status.SKIP, node=node, details=details,
                      message=f"{node}: {got['skip']}: nothing to generate with "
                              "(set ollama_models to test generation)")
    error = got.get("error")
    if error:
        code = got.get("status")
        if code == 404:
            action = Action.REDEPLOY
            text = f"has no model {model} ({error}): the deploy pulls ollama_models"
        elif "timed out" in error or "TimeoutError" in error:
            action = Action.INVESTIGATE
            text = (f"gave no token of {model} within {ttft_max:g} s" if got.get("ttft") is None
                    else f"stalled in the middle of a generation with {model}") + f" ({error})"
        elif code is None:
            action = Action.RESTART_SERVICE
            text = f"does not answer ({error})"
        elif code == 200:
            action = Action.INVESTIGATE
            text = f"broke off a generation with {model} ({error})"
        else:
            action = Action.INVESTIGATE
            text = f"answered {code} to a generation with {model} ({error})"
        return Result(check, Status.FAIL, node=node, action=action, details=details,
                      value=code, message=f"{node}: {what} {text}; asked from {client}")
    ttft = got.get("ttft")
    if ttft is None or not got.get("done"):
        why = "ended before its last chunk" if not got.get("done") else "carried no token"
        return Result(check, Status.FAIL, node=node, threshold=ttft_max, unit="s",
                      action=Action.INVESTIGATE, details=details,
                      message=f"{node}: {what}: the generation with {model} {why} "
                              f"({got.get('chunks', 0)} chunks)")
    ttft = round(float(ttft), 3)
    if ttft > ttft_max:
        load = got.get("load_s")
        loaded = f"; loading the model took {load:.1f} s" if load else ""
        return Result(check, Status.FAIL, node=node, value=ttft, threshold=ttft_max, unit="s",
                      action=Action.INVESTIGATE, details=details,
                      message=f"{node}: {what}: first token of {model} after {ttft:g} s, "
                              f"over {ttft_max:g} s{loaded} (is it running on its GPUs?)")
    served = f", served by {got['upstream']}" if got.get("upstream") else ""
    return Result(check, Status.PASS, node=node, value=ttft, threshold=ttft_max, unit="s",
                  details=details,
                  message=f"time to first token of {model} ({got.get('chunks')} chunks"
                          f"{served}, asked from {client})")


def ollama_probes(ctx: Context) -> list[Probe]:
    if not ctx.standard:
        return []
    cluster = ctx.cluster
    all_servers, all_gateways = ollama_hosts(cluster), gateway_hosts(cluster)
    everyone = list(dict.fromkeys([*all_servers, *all_gateways]))
    if not everyone:
        return []
    network = ollama_network(cluster, cluster.hosts[everyone[0]].data)
    addresses = dict(zip(all_servers, upstreams(cluster, network), strict=True))
    out = []
    for node in ctx.in_groups("ollama"):
        # Asked from the gateway, where there is one: the path its requests take.
        client = all_gateways[0] if all_gateways else node
        models = ctx.setting(node, "ollama", "ollama_models") or []
        ttft_max = float(ctx.threshold(node, "stacks.ollama_ttft_max_s"))
        url = addresses[node]
        out.append(Probe(
            "stacks.ollama", LAYER, ollama_command(url, models[0] if models else "",
                                                   ttft_max + 5, int(2 * ttft_max) + 60),
            partial(judge_ollama, "stacks.ollama", node, client, f"Ollama at {url}",
                    ttft_max),
            timeout=2 * ttft_max + 80, node=client))
    for gateway in ctx.in_groups("ollama_gateway"):
        listen = str(ctx.setting(gateway, "ollama", "ollama_gateway_listen") or "")
        if listen in ("", "0.0.0.0", "::"):
            listen = ctx.address(gateway, network) or ctx.host(gateway).address
        url = f"{url_host(listen)}:{int(ctx.setting(gateway, 'ollama', 'ollama_gateway_port'))}"
        # Asked from an Ollama node, where one is not the gateway itself.
        client = next((n for n in all_servers if n != gateway), gateway)
        models = (ctx.setting(all_servers[0], "ollama", "ollama_models") or []) if (
            all_servers) else []
        ttft_max = float(ctx.threshold(gateway, "stacks.ollama_ttft_max_s"))
        out.append(Probe(
            "stacks.ollama_gateway", LAYER,
            ollama_command(url, models[0] if models else "", ttft_max + 5,
                           int(2 * ttft_max) + 60),
            partial(judge_ollama, "stacks.ollama_gateway", gateway, client,
                    f"the Ollama gateway at {url}", ttft_max),
            timeout=2 * ttft_max + 80, node=client))
    return out


# ---------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------


def probes(ctx: Context) -> list[Probe]:
    return [*slurm_probes(ctx), *ray_probes(ctx), *k3s_probes(ctx), *ollama_probes(ctx)]
