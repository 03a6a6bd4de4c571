"""k3s: a Kubernetes cluster from k3s's pinned release binary, servers and agents.

Defaults: roles/k3s/defaults/main.yml. Templates: roles/k3s/templates/.

Servers (``k3s_servers``): with three or more, the first starts embedded etcd
(``cluster-init: true``) and the others join it (``server:``); one server keeps its
state in SQLite. Agents (``k3s_agents``) join the first server, or
``k3s_registration_address``. Every node authenticates with the cluster token: a
secret generated once on the deploying machine (``secrets.k3s_token`` in the
inventory, else ``~/.local/share/aicluster/<cluster_name>/k3s-token``), written to
the node as a file of mode 0600 that config.yaml names (``token-file``), never shown.

The binary and the air-gap images come from the deploying machine
(:mod:`aicluster.artifacts`): the binary is staged beside the running one and put in
place by the rollout, so a version bump never replaces a running binary behind the
cluster's back.

The rollout. Servers one at a time (the first first: a fresh cluster-init server
before those that join it), then agents: a fresh agent starts (all together), a node
whose binary changes is cordoned and drained on a server, gets the new binary, is
restarted, waits until it reports Ready and is uncordoned; a node whose config, unit
or token file changed is restarted and waited for, one at a time. A node that fails
stops the rollout: no later node is touched. Nothing restarts when nothing changed.
What to do on a node is decided by :func:`decide` from the inventory and the node's
:class:`~aicluster.components.k3s.facts.K3sNode` fact; the Ansible role calls the same function
through its filter plugin.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from aicluster import artifacts
from aicluster.common.ops import (
    Rollout,
    install_packages,
    put_template,
    refuse,
    run_on_other_host,
    runs_here,
    this_host,
)
from aicluster.components.k3s.derive import (
    CONFIG_DIR,
    CONFIG_FILE,
    IMAGES_DIR,
    MANIFESTS,
    MANIFESTS_DIR,
    RETIRED_MANIFESTS,
    STAGED_BINARY,
    TOOL,
    UNIT_DIR,
    cluster_token,
    decide,
    token_digest,
    token_file_text,
)
from aicluster.components.k3s.facts import K3sNode
from aicluster.components.k3s.probe import TOKEN_FILE
from aicluster.render import defaults
from aicluster.secrets import SecretError

#: Which nodes began their turn in this run's k3s rollout, and which ended it well.
_ROLLOUT = Rollout("k3s")


@operation(is_idempotent=False)
def rollout(step: str, admin: str = "", drain: str = "", uncordon: str = "",
            order: tuple[str, ...] = ()):
    """One node's turn: (drain on ``admin``), ``aicluster-k3s <step>`` on the node
    (swap the binary in, (re)start, wait until Ready), (uncordon on ``admin``). Run with
    ``_serial=True`` it goes one node at a time, and no node starts after a node
    earlier in ``order`` failed."""

    if not step:
        return
    yield _ROLLOUT.begin(
        lambda state, host: set(order[: order.index(host.name)]) if host.name in order else set(),
        "not touching this node: {failed} failed earlier in the rollout (see above)")
    if drain:
        yield FunctionCommand(run_on_other_host, (admin, drain), {})
    yield StringCommand(TOOL, step)
    if uncordon:
        yield FunctionCommand(run_on_other_host, (admin, uncordon), {})
    yield _ROLLOUT.end()


@deploy("k3s", data_defaults=defaults("k3s"))
def deploy() -> None:
    if not runs_here("k3s"):
        return
    cluster, family, v = this_host("k3s")
    node = host.get_fact(K3sNode, unit=v["k3s_unit"], node_ip=v["k3s_node_ip"])
    try:
        token = cluster_token(v["k3s_token_ref"], v["k3s_token_bytes"])
    except SecretError as exc:
        refuse([f"host {host.name!r}: k3s: {exc}"])
        return
    plan = decide(v, node, token_digest(token))
    if plan["problems"]:
        refuse(plan["problems"])
        return
    if plan["iface"] and "flannel-iface" not in v["k3s_node_config"]:
        v["k3s_node_config"] = {**v["k3s_node_config"], "flannel-iface": plan["iface"]}
    server = v["k3s_role"] == "server"

    if v["k3s_packages"]:
        install_packages("Packages k3s needs", v["k3s_packages"], family)
    for path in (CONFIG_DIR, STAGED_BINARY.rsplit("/", 1)[0], IMAGES_DIR):
        files.directory(name=f"k3s directory {path}", path=path, mode="755")
    artifacts.put("k3s", "k3s", STAGED_BINARY, mode="755",
                  op_name=f"Stage the k3s {v['k3s_version']} binary")
    if "images" in v["k3s_artifact_files"]:
        art = v["k3s_artifact_files"]["images"]
        artifacts.put("k3s", "images", f"{IMAGES_DIR}/{art['filename']}", mode="644",
                      op_name=f"k3s {v['k3s_version']} air-gap images")
    put_template("k3s", "aicluster-k3s.j2", TOOL, v, mode="755",
                 name="The k3s rollout helper (swap the binary, restart, wait until Ready)")
    token_file = files.put(
        name="k3s cluster token (mode 0600, never shown)",
        src=StringIO(token_file_text(token)),
        dest=TOKEN_FILE, mode="600", user="root", group="root",
    )
    config = put_template("k3s", "config.yaml.j2", CONFIG_FILE, v, mode="600",
                          name=f"k3s {v['k3s_role']} config.yaml")
    unit = put_template("k3s", f"{v['k3s_unit']}.service.j2",
                        f"{UNIT_DIR}/{v['k3s_unit']}.service", v,
                        name=f"The {v['k3s_unit']} unit")
    systemd.daemon_reload(name="Reload systemd units (k3s unit changed)", _if=unit.did_change)
    if server:
        files.directory(name=f"k3s auto-deploy manifests {MANIFESTS_DIR}", path=MANIFESTS_DIR,
                        mode="700")
        for dest, template in host.loop(MANIFESTS.items()):
            if v["k3s_gpu_cluster"]:
                put_template("k3s", template, f"{MANIFESTS_DIR}/{dest}", v, mode="600",
                             name=f"GPU manifest {dest} (k3s applies it)")
            else:
                files.file(name=f"No GPU manifest {dest} (no k3s node has GPUs)",
                           path=f"{MANIFESTS_DIR}/{dest}", present=False)
        for dest in host.loop(RETIRED_MANIFESTS):
            files.file(name=f"No {dest} (k3s ships the RuntimeClass nvidia itself)",
                       path=f"{MANIFESTS_DIR}/{dest}", present=False)

    # The rollout, in three turns every k3s node takes part in (pyinfra orders the
    # operations of all hosts as one graph of each host's own sequence, so a turn all
    # nodes call comes after everything any node did before it): the servers, one at a
    # time (the first first); fresh agents, together; agents that change, one at a time.
    order = tuple(v["k3s_rollout_order"])
    action = plan["action"]
    role = "servers" if server else "agents"
    turn: dict[str, Any] = {"step": action, "order": order}
    if action == "upgrade":
        turn.update(admin=v["k3s_admin_server"], drain=v["k3s_drain_command"],
                    uncordon=v["k3s_uncordon_command"])
        name = (f"k3s {role}: upgrade one node at a time (drain, new binary, restart, "
                "Ready, uncordon)")
    elif action == "restart":
        turn["_if"] = any_changed(config, unit, token_file)
        name = f"k3s {role}: restart one node at a time (its config, unit or token changed)"
    else:
        name = f"k3s {role}: start one node at a time (Ready before the next)"
    idle: dict[str, Any] = {"step": "", "order": order}
    fresh_agent = not server and action == "start"
    changing_agent = not server and not fresh_agent
    # One call per turn (the same operation on every node), each with this node's part.
    rollout(name=name if server else "k3s servers' turn (agents wait)", _serial=True,
            **(turn if server else idle))
    rollout(name="k3s agents: start (Ready)" if fresh_agent else "k3s agents: start (none here)",
            **(turn if fresh_agent else idle))
    rollout(name=name if changing_agent else "k3s agents' turn (servers are done)",
            _serial=True, **(turn if changing_agent else idle))
    systemd.service(name=f"{v['k3s_unit']} running and enabled", service=v["k3s_unit"],
                    running=True, enabled=True)
