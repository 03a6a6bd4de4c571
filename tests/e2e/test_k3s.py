"""k3s end to end with pyinfra on a fresh two-node testbed, through STAND-IN release
files (the k3s role's molecule scenario does the same with Ansible).

STAND-IN k3s: the real k3s release cannot be downloaded on these machines, so
tests/e2e/standins/k3s.py builds a stand-in executable (stdlib Python: an HTTP server
for the few API calls the deploy and these checks make, "kubectl" for the commands the
rollout runs; not k3s, and it says so in --version and its log) in three versions and
lays them out in an artifact directory as `aicluster artifacts fetch` would. The deploy
takes them through the same verified artifact path as the real files. With
$AICLUSTER_E2E_ARTIFACTS_DIR naming a real artifact directory, the real binary and the
defaults' pins are used, and the checks that need a second release are skipped.

node1 is the server, node2 an agent, on the management network:

- both units active and enabled, every node Ready (read from the server with the admin
  kubeconfig, and by each node with its own credentials: `aicluster-k3s wait`);
- k3s listens only on the node's cluster address (`bind-address`): no listening
  socket of the unit's process on a wildcard or another address;
- the token file, config.yaml and the kubeconfigs are 0600 root; the token is in no
  deploy output and no journal line, and reached every node (the server refuses a
  node without it);
- a second deploy changes and restarts nothing;
- a version bump replaces the binary on both nodes and restarts both services, node1
  first: each cordoned and drained, restarted, Ready with the new version, uncordoned
  (the stand-in server's event log), then a third deploy changes nothing;
- a bump that skips a minor version is refused on both nodes, nothing changed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aicluster.components.k3s.derive import token_digest, token_text
from tests.e2e import conftest
from tests.e2e.conftest import BIN, TESTBED_INVENTORY, pyinfra_results, run
from tests.e2e.standins import k3s as standin
from tests.e2e.standins import real_artifacts_dir

DEPLOY = Path(__file__).with_name("deploy_k3s.py")
UNITS = {"node1": "k3s", "node2": "k3s-agent"}
STATE = "/var/lib/rancher/k3s/server/standin-state.json"
KUBELET_KUBECONFIG = "/var/lib/rancher/k3s/agent/kubelet.kubeconfig"
READY = ("jsonpath={range .items[*]}{.metadata.name}="
         '{.status.conditions[?(@.type=="Ready")].status} '
         '{.status.nodeInfo.kubeletVersion}{"\\n"}{end}')
STANDIN = real_artifacts_dir() is None


@pytest.fixture(scope="module")
def k3s_bed(testbed, tmp_path_factory):
    """The testbed, the overrides that name the stand-in (or real) release files, and
    a function that writes them with a given k3s_version."""
    from aicluster.testbed.state import state_dir

    base = standin.build(tmp_path_factory.mktemp("k3s") / "artifacts")
    if STANDIN:
        print(standin.banner())
    else:
        print(f"real k3s release files from {base['artifacts_dir']}")
    path = state_dir() / "overrides.json"

    def use(version: str | None = None) -> None:
        path.write_text(json.dumps({**base, **({"k3s_version": version} if version else {})}))

    use()
    yield testbed, base, use
    path.unlink(missing_ok=True)


def _deploy() -> tuple[int, str, dict]:
    proc = run([BIN / "pyinfra", "-y", TESTBED_INVENTORY, DEPLOY], timeout=900, check=False)
    output = proc.stdout + proc.stderr
    # A run whose every host was refused before any operation prints no results table.
    results = pyinfra_results(output) if "Grand total" in output else {}
    return proc.returncode, output, results


def _ip(tb: conftest.Testbed, node: str) -> str:
    return next(n["address"] for n in tb.nodes if n["name"] == node)


def _unit(tb: conftest.Testbed, node: str) -> dict[str, str]:
    out = tb.ssh(node, f"systemctl show -p MainPID -p ExecMainStartTimestampMonotonic "
                       f"-p ActiveState {UNITS[node]}")
    return dict(line.split("=", 1) for line in out.split())


def _version(tb: conftest.Testbed, node: str) -> str:
    return tb.ssh(node, "/usr/local/bin/k3s --version").splitlines()[0]


def _token(tb: conftest.Testbed) -> str:
    from aicluster.testbed.state import state_dir

    return token_text((state_dir() / "secrets" / "k3s-token").read_bytes())


def _assert_running(tb: conftest.Testbed, version: str) -> None:
    for node, unit in UNITS.items():
        assert tb.ssh(node, f"systemctl is-active {unit}; systemctl is-enabled {unit}"
                      ).split() == ["active", "enabled"], node
        assert f"k3s version v{version} " in _version(tb, node) + " "
        # Each node reads its own Node object with its own credentials (the rollout's
        # readiness check): Ready, with the version the inventory pins.
        tb.ssh(node, "/usr/local/sbin/aicluster-k3s wait")
    nodes = tb.ssh("node1", f"k3s kubectl get nodes -o '{READY}'")
    assert sorted(nodes.split("\n")[:-1]) == [f"node1=True v{version}",
                                             f"node2=True v{version}"], nodes


def _assert_bound_to_cluster_address(tb: conftest.Testbed) -> None:
    """Every TCP port the unit's main process listens on is on the node's cluster
    address (or loopback); the API on node1's, the kubelet port on each node's."""
    found = {}
    for node, unit in UNITS.items():
        ip = _ip(tb, node)
        pid = _unit(tb, node)["MainPID"]
        sockets = [line.split()[3] for line in tb.ssh(node, "ss -ltnpH").splitlines()
                   if f"pid={pid}," in line]
        print(f"{node} ({ip}): {unit} listens on {sockets}")
        assert sockets, f"{node}: {unit} listens on nothing"
        for address in sockets:
            host = address.rsplit(":", 1)[0].strip("[]")
            assert host == ip or host.startswith("127.") or host == "::1", \
                f"{node}: {unit} listens on {address}, not only on {ip}"
        found[node] = {a for a in sockets if a.startswith(f"{ip}:")}
    assert f"{_ip(tb, 'node1')}:6443" in found["node1"], found
    assert f"{_ip(tb, 'node2')}:10250" in found["node2"], found
    if STANDIN:  # the stand-in has exactly these (real k3s has loopback ones besides)
        assert found == {"node1": {f"{_ip(tb, 'node1')}:6443", f"{_ip(tb, 'node1')}:10250"},
                         "node2": {f"{_ip(tb, 'node2')}:10250"}}, found
    # The admin kubeconfig names the API at that address, as k3s writes it.
    assert f"server: https://{_ip(tb, 'node1')}:6443" in tb.ssh(
        "node1", "grep server: /etc/rancher/k3s/k3s.yaml")


def _assert_secrets(tb: conftest.Testbed, outputs: list[str]) -> None:
    token = _token(tb)
    for node, unit in UNITS.items():
        paths = ["/etc/rancher/k3s/aicluster-token", "/etc/rancher/k3s/config.yaml",
                 KUBELET_KUBECONFIG]
        if node == "node1":
            paths.append("/etc/rancher/k3s/k3s.yaml")
        for path in paths:
            assert tb.ssh(node, f"stat -c '%a %U %G' {path}").strip() == "600 root root", \
                (node, path)
        # The node holds the cluster's token (compared as a digest, never shown).
        assert tb.ssh(node, "sha256sum /etc/rancher/k3s/aicluster-token").split()[0] \
            == token_digest(token)
        journal = tb.ssh(node, f"journalctl -u {unit} --no-pager -o cat")
        assert "STAND-IN" in journal or not STANDIN
        assert token not in journal, f"{node}: the token is in the journal of {unit}"
        assert token not in tb.ssh(node, "cat /etc/rancher/k3s/config.yaml")
    for output in outputs:
        assert token not in output, "the cluster token appears in a deploy's output"


def test_deploy_binds_cluster_address_keeps_token_secret_and_changes_nothing_twice(k3s_bed):
    tb, base, _ = k3s_bed
    version = base.get("k3s_version") or _default_version()
    rc, first, result = _deploy()
    assert rc == 0 and result["errors"] == 0 and result["changed"] > 0, result
    _assert_running(tb, version)
    _assert_bound_to_cluster_address(tb)
    before = {node: _unit(tb, node) for node in UNITS}

    rc, second, result = _deploy()
    assert rc == 0 and result["changed"] == 0 and result["errors"] == 0, result
    assert {node: _unit(tb, node) for node in UNITS} == before, "a no-op deploy restarted k3s"
    _assert_secrets(tb, [first, second])


@pytest.mark.skipif(not STANDIN, reason="needs two pinned k3s releases one minor apart "
                                        "(the STAND-IN builds them)")
def test_version_bump_drains_restarts_and_uncordons_node1_then_node2(k3s_bed):
    tb, base, use = k3s_bed
    new = standin.VERSIONS[1]
    before = {node: _unit(tb, node) for node in UNITS}
    seq = json.loads(tb.ssh("node1", f"cat {STATE}"))["seq"]
    use(new)
    rc, bump, result = _deploy()
    assert rc == 0 and result["errors"] == 0, result
    _assert_running(tb, new)
    pins = base["k3s_artifacts"]["k3s"]["sha256"][new]["amd64"]
    for node in UNITS:
        after = _unit(tb, node)
        assert after["MainPID"] != before[node]["MainPID"], f"{node}: not restarted"
        assert int(after["ExecMainStartTimestampMonotonic"]) > int(
            before[node]["ExecMainStartTimestampMonotonic"])
        assert tb.ssh(node, "sha256sum /usr/local/bin/k3s").split()[0] == pins

    events = [e for e in json.loads(tb.ssh("node1", f"cat {STATE}"))["events"]
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
    nodes = json.loads(tb.ssh("node1", f"cat {STATE}"))["nodes"]
    assert all(not n["unschedulable"] and not n["annotations"] for n in nodes.values()), nodes

    before = {node: _unit(tb, node) for node in UNITS}
    rc, third, result = _deploy()
    assert rc == 0 and result["changed"] == 0 and result["errors"] == 0, result
    assert {node: _unit(tb, node) for node in UNITS} == before
    _assert_secrets(tb, [bump, third])


@pytest.mark.skipif(not STANDIN, reason="needs a pinned k3s release two minors up "
                                        "(the STAND-IN builds one)")
def test_a_bump_that_skips_a_minor_version_is_refused_on_both_nodes(k3s_bed):
    tb, base, use = k3s_bed
    running, skipping = standin.VERSIONS[1], standin.VERSIONS[2]
    files = "/usr/local/bin/k3s /usr/local/lib/aicluster/k3s/k3s /etc/rancher/k3s/*"
    before = {node: (tb.ssh(node, f"sha256sum {files}"), _unit(tb, node)) for node in UNITS}
    use(skipping)
    rc, output, _ = _deploy()
    assert rc != 0
    for node in UNITS:
        assert re.search(rf"host '{node}': k3s_version: {re.escape(skipping)} skips a minor "
                         rf"version after the {re.escape(running)} the node runs", output), node
        assert (tb.ssh(node, f"sha256sum {files}"), _unit(tb, node)) == before[node], node
    use(running)


def _default_version() -> str:
    from aicluster.render import defaults

    return defaults("k3s")["k3s_version"]
