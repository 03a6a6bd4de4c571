"""k3s end to end with pyinfra on the lab in miniature (every component together, deployed
by the whole-stack deploy.py, shared with the other ``test_lab*.py`` modules), through
STAND-IN release files (the k3s role's molecule scenario does the same with Ansible).

STAND-IN k3s: the real k3s release cannot be downloaded on these machines, so
tests/e2e/standins/k3s.py builds a stand-in executable (stdlib Python: an HTTPS server,
with self-signed certificates as k3s's, for the few API calls the deploy and these
checks make, "kubectl" for the commands the rollout runs; not k3s, and it says so in
--version and its log) in three versions and lays them out in an artifact directory as
`aicluster artifacts fetch` would (the lab's overrides name them). The deploy takes them
through the same verified artifact path as the real files. With
$AICLUSTER_E2E_ARTIFACTS_DIR naming a real artifact directory, the real binary and the
defaults' pins are used, and the checks that need a second release are skipped.

node1 is the server, node2 an agent, on the management network. On the lab in
miniature:

- both units active and enabled, every node Ready (read from the server with the admin
  kubeconfig, and by each node with its own credentials: `aicluster-k3s wait`);
- k3s listens only on the node's cluster address (`bind-address`): no listening
  socket of the unit's process on a wildcard or another address;
- the token file, config.yaml and the kubeconfigs are 0600 root; the token is in no
  deploy output (the lab's first deploy's included) and no journal line, and reached
  every node (the server refuses a node without it);
- a whole-stack re-run changes nothing and restarts no k3s unit;
- base's firewall lets pod-network sources (a network namespace on node1 with a pod
  address, as a pod is joined to its node) reach the API server and the kubelet, and
  still drops a source from no cluster network;
- a version bump replaces the binary on both nodes and restarts both services, node1
  first: each cordoned and drained, restarted, Ready with the new version, uncordoned
  (the stand-in server's event log), then a whole-stack re-run changes nothing (the lab
  stays on the new version, its override kept in ``lab.overrides``);
- a bump that skips a minor version is refused on both nodes, nothing changed; the
  lab's k3s_version is set back to the running one whatever happens, which leaves the
  lab converged.
"""

from __future__ import annotations

import json
import re

import pytest

from aicluster.components.k3s.derive import token_digest, token_text
from tests.e2e.conftest import Deploy, Lab
from tests.e2e.standins import k3s as standin
from tests.e2e.standins import real_artifacts_dir

UNITS = {"node1": "k3s", "node2": "k3s-agent"}
STATE = "/var/lib/rancher/k3s/server/standin-state.json"
KUBELET_KUBECONFIG = "/var/lib/rancher/k3s/agent/kubelet.kubeconfig"
READY = ("jsonpath={range .items[*]}{.metadata.name}="
         '{.status.conditions[?(@.type=="Ready")].status} '
         '{.status.nodeInfo.kubeletVersion}{"\\n"}{end}')
STANDIN = real_artifacts_dir() is None


@pytest.fixture
def lab(lab):
    """The lab in miniature (tests/e2e/conftest.py), deployed; says which k3s release
    files it runs (the STAND-IN's, or the real ones)."""
    if STANDIN:
        print(standin.banner())
    else:
        print(f"real k3s release files from {lab.overrides['artifacts_dir']}")
    return lab.deployed()


def _ip(lab: Lab, node: str) -> str:
    return next(n["address"] for n in lab.nodes if n["name"] == node)


def _unit(lab: Lab, node: str) -> dict[str, str]:
    out = lab.ssh(node, f"systemctl show -p MainPID -p ExecMainStartTimestampMonotonic "
                        f"-p ActiveState {UNITS[node]}")
    return dict(line.split("=", 1) for line in out.split())


def _version(lab: Lab, node: str) -> str:
    return lab.ssh(node, "/usr/local/bin/k3s --version").splitlines()[0]


def _token() -> str:
    from aicluster.testbed.state import state_dir

    return token_text((state_dir() / "secrets" / "k3s-token").read_bytes())


def _pinned_version(lab: Lab) -> str:
    """The k3s_version the lab's inventory pins now (its override, else the default)."""
    return lab.overrides.get("k3s_version") or _default_version()


def _assert_running(lab: Lab, version: str) -> None:
    for node, unit in UNITS.items():
        assert lab.ssh(node, f"systemctl is-active {unit}; systemctl is-enabled {unit}"
                       ).split() == ["active", "enabled"], node
        assert f"k3s version v{version} " in _version(lab, node) + " "
        # Each node reads its own Node object with its own credentials (the rollout's
        # readiness check): Ready, with the version the inventory pins.
        lab.ssh(node, "/usr/local/sbin/aicluster-k3s wait")
    nodes = lab.ssh("node1", f"k3s kubectl get nodes -o '{READY}'")
    assert sorted(nodes.split("\n")[:-1]) == [f"node1=True v{version}",
                                             f"node2=True v{version}"], nodes


def _assert_bound_to_cluster_address(lab: Lab) -> None:
    """Every TCP port the unit's main process listens on is on the node's cluster
    address (or loopback); the API on node1's, the kubelet port on each node's."""
    found = {}
    for node, unit in UNITS.items():
        ip = _ip(lab, node)
        pid = _unit(lab, node)["MainPID"]
        sockets = [line.split()[3] for line in lab.ssh(node, "ss -ltnpH").splitlines()
                   if f"pid={pid}," in line]
        print(f"{node} ({ip}): {unit} listens on {sockets}")
        assert sockets, f"{node}: {unit} listens on nothing"
        for address in sockets:
            host = address.rsplit(":", 1)[0].strip("[]")
            assert host == ip or host.startswith("127.") or host == "::1", \
                f"{node}: {unit} listens on {address}, not only on {ip}"
        found[node] = {a for a in sockets if a.startswith(f"{ip}:")}
    assert f"{_ip(lab, 'node1')}:6443" in found["node1"], found
    assert f"{_ip(lab, 'node2')}:10250" in found["node2"], found
    if STANDIN:  # the stand-in has exactly these (real k3s has loopback ones besides)
        assert found == {"node1": {f"{_ip(lab, 'node1')}:6443", f"{_ip(lab, 'node1')}:10250"},
                         "node2": {f"{_ip(lab, 'node2')}:10250"}}, found
    # The admin kubeconfig names the API at that address, as k3s writes it.
    assert f"server: https://{_ip(lab, 'node1')}:6443" in lab.ssh(
        "node1", "grep server: /etc/rancher/k3s/k3s.yaml")


def _assert_secrets(lab: Lab, outputs: list[str]) -> None:
    token = _token()
    for node, unit in UNITS.items():
        paths = ["/etc/rancher/k3s/aicluster-token", "/etc/rancher/k3s/config.yaml",
                 KUBELET_KUBECONFIG]
        if node == "node1":
            paths.append("/etc/rancher/k3s/k3s.yaml")
        for path in paths:
            assert lab.ssh(node, f"stat -c '%a %U %G' {path}").strip() == "600 root root", \
                (node, path)
        # The node holds the cluster's token (compared as a digest, never shown).
        assert lab.ssh(node, "sha256sum /etc/rancher/k3s/aicluster-token").split()[0] \
            == token_digest(token)
        journal = lab.ssh(node, f"journalctl -u {unit} --no-pager -o cat")
        assert "STAND-IN" in journal or not STANDIN
        assert token not in journal, f"{node}: the token is in the journal of {unit}"
        assert token not in lab.ssh(node, "cat /etc/rancher/k3s/config.yaml")
    for output in outputs:
        assert token not in output, "the cluster token appears in a deploy's output"


def test_deploy_binds_cluster_address_keeps_token_secret_and_a_rerun_changes_nothing(lab):
    first = Deploy.read(lab.first).succeeded()
    assert first.results["changed"] > 0, first.results
    _assert_running(lab, _pinned_version(lab))
    _assert_bound_to_cluster_address(lab)
    before = {node: _unit(lab, node) for node in UNITS}

    rerun = lab.read_deploy().succeeded()
    assert rerun.results["changed"] == 0, rerun.results
    assert {node: _unit(lab, node) for node in UNITS} == before, "a no-op deploy restarted k3s"
    _assert_secrets(lab, [first.output, rerun.output])


#: A pod's address (k3s's default pod network, 10.42.0.0/16) and one from no network the
#: cluster knows (TEST-NET-3), each given to a process in a network namespace on a node.
POD_SOURCE, STRANGER = "10.42.250.2", "203.0.113.2"


def _reach_from(lab: Lab, node: str, source: str, target: str, ports: list[int]) -> dict:
    """Whether a TCP connection from *source*, a network namespace on *node* joined to
    the node by a veth pair (as a pod is to its node), reaches *target*'s *ports* there:
    through base's firewall (table inet aicluster), like CoreDNS or metrics-server
    reaching the API server and the kubelet."""
    gateway = source.rsplit(".", 1)[0] + ".1"
    ns = "aicluster-e2e-" + source.replace(".", "-")
    setup = (f"ip netns add {ns} && ip link add aic-e2e-h type veth peer name aic-e2e-p "
             f"&& ip link set aic-e2e-p netns {ns} "
             f"&& ip addr add {gateway}/24 dev aic-e2e-h && ip link set aic-e2e-h up "
             f"&& ip -n {ns} addr add {source}/24 dev aic-e2e-p "
             f"&& ip -n {ns} link set aic-e2e-p up && ip -n {ns} link set lo up "
             f"&& ip -n {ns} route add default via {gateway}")
    lab.ssh(node, setup)
    try:
        return {port: lab.ssh(node, f"ip netns exec {ns} timeout 5 bash -c "
                                    f"'exec 3<>/dev/tcp/{target}/{port}' && echo open "
                                    "|| echo closed").strip() == "open"
                for port in ports}
    finally:
        lab.ssh(node, f"ip link del aic-e2e-h; ip netns del {ns}", check=False)


def test_pods_reach_the_api_and_kubelet_through_base_firewall_and_strangers_do_not(lab):
    """The lab runs base's firewall with k3s (both deployed by deploy.py): a k3s node
    accepts the pod and service networks (k3s's documentation asks a firewall to trust
    them), so a pod-network source reaches the API server (6443) and the kubelet
    (10250); a source from no cluster network is still dropped."""
    rules = lab.ssh("node1", "nft list table inet aicluster")
    assert "ip saddr 10.42.0.0/16 accept" in rules and "ip saddr 10.43.0.0/16 accept" in rules
    target = _ip(lab, "node1")
    pod = _reach_from(lab, "node1", POD_SOURCE, target, [6443, 10250])
    stranger = _reach_from(lab, "node1", STRANGER, target, [6443, 10250])
    print(f"from the pod network {POD_SOURCE}: {pod}; from {STRANGER}: {stranger}")
    assert pod == {6443: True, 10250: True}, pod
    assert stranger == {6443: False, 10250: False}, stranger


@pytest.mark.skipif(not STANDIN, reason="needs two pinned k3s releases one minor apart "
                                        "(the STAND-IN builds them)")
def test_version_bump_drains_restarts_and_uncordons_node1_then_node2(lab):
    new = standin.VERSIONS[1]
    before = {node: _unit(lab, node) for node in UNITS}
    seq = json.loads(lab.ssh("node1", f"cat {STATE}"))["seq"]
    # Kept afterwards: the lab stays on the new version (the next modules re-run it).
    lab.set_overrides(k3s_version=new)
    bump = lab.read_deploy().succeeded()
    _assert_running(lab, new)
    pins = lab.overrides["k3s_artifacts"]["k3s"]["sha256"][new]["amd64"]
    for node in UNITS:
        after = _unit(lab, node)
        assert after["MainPID"] != before[node]["MainPID"], f"{node}: not restarted"
        assert int(after["ExecMainStartTimestampMonotonic"]) > int(
            before[node]["ExecMainStartTimestampMonotonic"])
        assert lab.ssh(node, "sha256sum /usr/local/bin/k3s").split()[0] == pins

    events = [e for e in json.loads(lab.ssh("node1", f"cat {STATE}"))["events"]
              if e["seq"] > seq]
    print("stand-in server's events:", *(f"{e['node']} {e['event']} {e.get('version', '')}"
                                         for e in events), sep="\n  ")

    def first(node: str, kind: str, after: int) -> int:
        for i, e in enumerate(events):
            if i > after and e["node"] == node and e["event"] == kind and (
                    kind != "register" or e["version"] == new):
                return i
        raise AssertionError(f"no {kind} of {node} after event {after}: {events}")

    d1 = first("node1", "drain", -1)
    r1 = first("node1", "register", d1)
    u1 = first("node1", "uncordon", r1)
    d2 = first("node2", "drain", u1)
    r2 = first("node2", "register", d2)
    first("node2", "uncordon", r2)
    # Neither node ran the new release before its drain.
    assert not any(e["event"] == "register" and e.get("version") == new
                   for e in events[:d1] + [e for e in events[:d2] if e["node"] == "node2"])
    nodes = json.loads(lab.ssh("node1", f"cat {STATE}"))["nodes"]
    assert all(not n["unschedulable"] and not n["annotations"] for n in nodes.values()), nodes

    before = {node: _unit(lab, node) for node in UNITS}
    rerun = lab.read_deploy().succeeded()
    assert rerun.results["changed"] == 0, rerun.results
    assert {node: _unit(lab, node) for node in UNITS} == before
    _assert_secrets(lab, [bump.output, rerun.output])


@pytest.mark.skipif(not STANDIN, reason="needs a pinned k3s release two minors up "
                                        "(the STAND-IN builds one)")
def test_a_bump_that_skips_a_minor_version_is_refused_on_both_nodes(lab):
    running, skipping = standin.VERSIONS[1], standin.VERSIONS[2]
    files = "/usr/local/bin/k3s /usr/local/lib/aicluster/k3s/k3s /etc/rancher/k3s/*"
    before = {node: (lab.ssh(node, f"sha256sum {files}"), _unit(lab, node)) for node in UNITS}
    # The version the lab pins and runs: `running`, after the bump test above.
    pinned = lab.overrides.get("k3s_version")
    try:
        lab.set_overrides(k3s_version=skipping)
        refused = lab.read_deploy()
        assert refused.rc != 0
        for node in UNITS:
            assert re.search(rf"host '{node}': k3s_version: {re.escape(skipping)} skips a "
                             rf"minor version after the {re.escape(running)} the node runs",
                             refused.output), node
            assert (lab.ssh(node, f"sha256sum {files}"), _unit(lab, node)) == before[node], \
                node
    finally:
        # Back to the version the nodes run: the next whole-stack re-run changes nothing.
        lab.set_overrides(k3s_version=pinned)


def _default_version() -> str:
    from aicluster.render import defaults

    return defaults("k3s")["k3s_version"]
