"""The InfiniBand layer of ``aicluster check`` (src/aicluster/checks/infiniband.py):
each check's probe, planned from a real inventory (inventories/lab.py: four NDR ports
per GPU node, named by PCI address; or a small testbed-like one: ib_nodes without an
HCA), read through its own ``read`` on outputs kept under
tests/fixtures/check/infiniband/ (their sources in the README there), and the probes'
shell run on a STAND-IN sysfs tree."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from aicluster import PROJECT_ROOT
from aicluster.checks import infiniband
from aicluster.checks.context import Context
from aicluster.checks.result import Action, Status
from aicluster.checks.runner import Completed, PairCheck, Probe
from aicluster.inventory import load_cluster, validate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "check" / "infiniband"
LAB = load_cluster(PROJECT_ROOT / "inventories" / "lab.py")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def done(stdout: str, rc: int = 0) -> Completed:
    return Completed(rc, stdout, "", 0.1)


def small_cluster(ports: list[dict] | None = None, *, ib_nodes=("node1", "node2"),
                  over: dict | None = None):
    """Two nodes; ``ports`` (hardware.ib_ports) on each of ``ib_nodes``, none when None
    (the testbed: ib_nodes without an HCA); a third node outside ib_nodes."""
    cluster = {"cluster_name": "small",
               "networks": {"management": {"subnet": "10.213.0.0/24"}}}
    hosts = {}
    for n in (1, 2, 3):
        name = f"node{n}"
        hw = {"cpus": 1, "memory_gb": 2}
        if ports is not None and name in ib_nodes:
            hw["ib_ports"] = ports
        data = {**cluster, "ssh_hostname": f"10.213.0.{10 + n}", "hardware": hw,
                **((over or {}) if n == 1 else {})}
        if name in ib_nodes and n == 1 and ports:
            data["infiniband_opensm_priority"] = 15
        hosts[name] = (("ib_nodes",) if name in ib_nodes else (), data)
    return validate(hosts)


def node_probe(ctx: Context, check: str, node: str) -> Probe:
    [probe] = [p for p in infiniband.probes(ctx) if p.check == check and p.node == node]
    return probe


def write_bw(ctx: Context, index: int = 0) -> PairCheck:
    return infiniband.pair_checks(ctx)[index]


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------


def test_the_lab_plans_ports_sm_and_one_write_bw_per_port_index():
    ctx = Context(LAB, tier="standard")
    planned = [(p.check, p.node) for p in infiniband.probes(ctx)]
    assert planned == [(c, f"gpu{n}") for n in range(1, 5)
                       for c in ("infiniband.port", "infiniband.sm")]
    pairs = infiniband.pair_checks(ctx)
    assert [(pc.check, pc.nodes) for pc in pairs] == [
        ("infiniband.write_bw", ["gpu1", "gpu2", "gpu3", "gpu4"])] * 4
    assert infiniband.pair_checks(Context(LAB, tier="quick")) == []


def test_nothing_is_planned_outside_ib_nodes_and_one_skip_probe_without_ports():
    ctx = Context(small_cluster(None), tier="standard")
    planned = [(p.check, p.node) for p in infiniband.probes(ctx)]
    assert planned == [("infiniband.port", "node1"), ("infiniband.port", "node2")]
    assert all(pc.nodes == [] for pc in infiniband.pair_checks(ctx))
    ports = [{"device": "mlx5_0", "port": 1, "rate_gbps": 200}]
    ctx = Context(small_cluster(ports, ib_nodes=("node1", "node2")), tier="standard")
    assert "node3" not in {p.node for p in infiniband.probes(ctx)}
    assert [pc.nodes for pc in infiniband.pair_checks(ctx)] == [["node1", "node2"]]


# ---------------------------------------------------------------------------
# infiniband.port
# ---------------------------------------------------------------------------


def test_ports_pass_active_linkup_at_their_declared_rate():
    results = node_probe(Context(LAB), "infiniband.port", "gpu1").read(
        done(fixture("ports-gpu1.txt")))
    assert [(r.status, r.value, r.threshold, r.unit) for r in results] == [
        (Status.PASS, 400.0, 400, "Gb/s")] * 4
    # Declared by PCI address, found on the HCAs rdma-core renamed.
    assert [r.details["device"] for r in results] == ["ibp26s0", "ibp60s0", "ibp77s0",
                                                      "ibp94s0"]
    assert results[0].details["subject"] == "pci 0000:1a:00.0 port 1"
    assert results[0].details["width"] == "4X"


def test_a_port_down_downtrained_or_unmanaged_fails_with_its_cause():
    ok, down, narrow, init = node_probe(Context(LAB), "infiniband.port", "gpu1").read(
        done(fixture("ports-gpu1-degraded.txt")))
    assert ok.status is Status.PASS
    assert down.status is Status.FAIL and down.action is Action.INVESTIGATE
    assert "gpu1: pci 0000:3c:00.0 port 1 (ibp60s0 port 1): state DOWN" in down.message
    assert "physical state Polling (no cable or no peer)" in down.message
    assert narrow.status is Status.FAIL and narrow.value == 200.0
    assert "link at 200 Gb/sec (2X NDR), declared 400 Gb/s" in narrow.message
    assert init.status is Status.FAIL
    assert "state INIT: no subnet manager has configured it" in init.message


def test_a_node_without_any_hca_fails_every_declared_port():
    results = node_probe(Context(LAB), "infiniband.port", "gpu2").read(
        done(fixture("ports-none.txt")))
    assert [r.status for r in results] == [Status.FAIL] * 4
    assert "the node has no InfiniBand HCA at all" in results[0].message


def test_a_declared_port_the_node_lacks_fails_naming_what_it_has():
    ports = [{"pci": "0000:99:00.0", "port": 1, "rate_gbps": 400}]
    ctx = Context(small_cluster(ports))
    [result] = node_probe(ctx, "infiniband.port", "node1").read(done(fixture("ports-gpu1.txt")))
    assert result.status is Status.FAIL
    assert "pci 0000:99:00.0 port 1 not found" in result.message
    assert "ibp26s0 port 1 (pci 0000:1a:00.0)" in result.message


def test_a_port_declared_by_name_or_guid_is_found_too():
    ports = [{"device": "ibp77s0", "port": 1, "rate_gbps": 400},
             {"guid": "0xb8cef60300a12b6c", "port": 1, "rate_gbps": 400}]
    results = node_probe(Context(small_cluster(ports)), "infiniband.port", "node1").read(
        done(fixture("ports-gpu1.txt")))
    assert [(r.status, r.details["device"]) for r in results] == [
        (Status.PASS, "ibp77s0"), (Status.PASS, "ibp94s0")]


def test_an_ib_node_without_ports_or_hca_is_a_skip_and_with_an_hca_a_warn():
    probe = node_probe(Context(small_cluster(None)), "infiniband.port", "node1")
    skip = probe.read(done(fixture("ports-none.txt")))
    assert skip.status is Status.SKIP
    assert "declares no InfiniBand port (hardware.ib_ports) and has no HCA" in skip.message
    warn = probe.read(done(fixture("ports-gpu1.txt")))
    assert warn.status is Status.WARN and "declares none" in warn.message


# ---------------------------------------------------------------------------
# infiniband.sm
# ---------------------------------------------------------------------------


def _sm(ports: str, sminfo: str, opensm: str | None = None) -> str:
    out = fixture(ports) + infiniband.SMINFO_MARK + "\n" + sminfo
    if opensm is not None:
        out += f"{infiniband.OPENSM_MARK} {opensm}\n"
    return out


def test_the_sm_passes_when_ports_know_it_and_sminfo_finds_the_master():
    probe = node_probe(Context(LAB), "infiniband.sm", "gpu3")
    assert "systemctl is-active opensm" in probe.command  # gpu3 runs the standby
    result = probe.read(done(_sm("ports-gpu1.txt", fixture("sminfo-master.txt"), "active")))
    assert result.status is Status.PASS and result.value == 1
    assert "guid 0xb8cef60300a12b3c, priority 15, SMINFO_MASTER" in result.message
    assert "systemctl" not in node_probe(Context(LAB), "infiniband.sm", "gpu2").command


def test_no_subnet_manager_fails():
    result = node_probe(Context(LAB), "infiniband.sm", "gpu2").read(
        done(_sm("ports-gpu1-no-sm.txt", fixture("sminfo-failed.txt"))))
    assert result.status is Status.FAIL and result.action is Action.INVESTIGATE
    assert "no subnet manager known to ibp26s0 port 1" in result.message
    assert "no subnet manager answers sminfo (sminfo: iberror: failed: query)" in result.message


def test_opensm_down_where_the_inventory_runs_it():
    probe = node_probe(Context(LAB), "infiniband.sm", "gpu1")
    standby = probe.read(done(_sm("ports-gpu1.txt", fixture("sminfo-master.txt"),
                                  "inactive")))
    assert standby.status is Status.WARN and standby.action is Action.RESTART_SERVICE
    assert "opensm is inactive here" in standby.message
    alone = probe.read(done(_sm("ports-gpu1-no-sm.txt", fixture("sminfo-failed.txt"),
                                "failed")))
    assert alone.status is Status.FAIL


def test_sminfo_missing_is_a_warn_judged_by_sm_lid():
    result = node_probe(Context(LAB), "infiniband.sm", "gpu2").read(
        done(_sm("ports-gpu1.txt", "notool\n")))
    assert result.status is Status.WARN and result.action is Action.REDEPLOY
    assert "sminfo is not installed" in result.message


def test_roce_ports_need_no_subnet_manager():
    roce = fixture("ports-gpu1.txt").replace(" InfiniBand ", " Ethernet ")
    result = node_probe(Context(LAB), "infiniband.sm", "gpu3").read(
        done(roce + infiniband.SMINFO_MARK + "\n"))
    assert result.status is Status.SKIP and "RoCE" in result.message


# ---------------------------------------------------------------------------
# infiniband.write_bw
# ---------------------------------------------------------------------------

_COUNTERS = ("symbol_error=0 link_error_recovery=0 link_downed=0 port_rcv_errors=0 "
             "local_link_integrity_errors=0 excessive_buffer_overrun_errors=0")


def _client_output(report: str, after: str = _COUNTERS, rc: int = 0) -> str:
    return (f"#dev ibp26s0\n#before {_COUNTERS}\n{report}#rc {rc}\n#after {after}\n")


def test_write_bw_is_planned_port_by_port_with_the_server_on_the_peer():
    probe = write_bw(Context(LAB, tier="standard"), 1).make("gpu1", "gpu2")
    assert probe.pair == ("gpu1", "gpu2")
    # Port 2 of each node (pci 0000:3c:00.0), found by PCI whatever the HCA is called.
    assert '[ "${f##*/}" = 0000:3c:00.0 ]' in probe.server
    assert "ib_write_bw -d \"$dev\" -i 1 -p 18515 -F --report_gbits -D 5" in probe.server
    assert "-D 5 10.10.0.22 2>&1" in probe.command  # the peer's management address
    assert "symbol_error" in probe.command and "port_rcv_errors" in probe.command


def test_write_bw_passes_above_the_ndr_floor():
    probe = write_bw(Context(LAB)).make("gpu1", "gpu2")
    result = probe.read(done(_client_output(fixture("ib_write_bw-ndr.txt"))))
    assert result.status is Status.PASS
    assert (result.value, result.threshold, result.unit) == (389.27, 380.0, "Gb/s")
    assert result.details["subject"] == "pci 0000:1a:00.0 port 1"


def test_write_bw_below_the_floor_fails():
    probe = write_bw(Context(LAB)).make("gpu1", "gpu2")
    result = probe.read(done(_client_output(fixture("ib_write_bw-ndr-slow.txt"))))
    assert result.status is Status.FAIL and result.action is Action.INVESTIGATE
    assert "212.58 Gb/s, below 380 Gb/s for a 400 Gb/s link" in result.message


def test_write_bw_fails_when_an_error_counter_grows_during_the_test():
    probe = write_bw(Context(LAB)).make("gpu1", "gpu2")
    after = _COUNTERS.replace("symbol_error=0", "symbol_error=17")
    result = probe.read(done(_client_output(fixture("ib_write_bw-ndr.txt"), after)))
    assert result.status is Status.FAIL and result.value == 389.27
    assert "error counters grew during the test: symbol_error +17" in result.message


def test_write_bw_without_an_answering_server_fails_with_perftests_words():
    probe = write_bw(Context(LAB)).make("gpu1", "gpu2")
    result = probe.read(done(_client_output(fixture("ib_write_bw-no-server.txt"), rc=1)))
    assert result.status is Status.FAIL
    assert "ib_write_bw gave no result (Couldn't connect to 10.10.0.22:18515)" in result.message


def test_write_bw_missing_tool_or_port():
    probe = write_bw(Context(LAB)).make("gpu1", "gpu2")
    tool = probe.read(done("#notool\n"))
    assert tool.status is Status.ERROR and "ib_write_bw is not installed (perftest" in tool.message
    port = probe.read(done("#nodev\n"))
    assert port.status is Status.FAIL and "pci 0000:1a:00.0 port 1 not found" in port.message


def test_write_bw_floor_follows_the_rate_and_the_inventorys_thresholds():
    hdr = [{"device": "mlx5_0", "port": 1, "rate_gbps": 200}]
    probe = write_bw(Context(small_cluster(hdr))).make("node1", "node2")
    report = fixture("ib_write_bw-ndr-slow.txt")  # 212.58 Gb/s: fine for HDR200
    result = probe.read(done(_client_output(report)))
    assert result.status is Status.PASS and result.threshold == 180.0
    over = {"check_thresholds": {"infiniband": {"ib_write_bw_min_gbps": {200: 190}}}}
    probe = write_bw(Context(small_cluster(hdr, over=over))).make("node1", "node2")
    assert probe.read(done(_client_output(report))).threshold == 190.0


def test_a_rate_without_a_floor_is_a_warn_saying_which_threshold_to_add():
    odd = [{"device": "mlx5_0", "port": 1, "rate_gbps": 300}]
    probe = write_bw(Context(small_cluster(odd))).make("node1", "node2")
    result = probe.read(done(_client_output(fixture("ib_write_bw-ndr.txt"))))
    assert result.status is Status.WARN
    assert "ib_write_bw_min_gbps.300" in result.message


# ---------------------------------------------------------------------------
# The probes' shell on a STAND-IN sysfs tree
# ---------------------------------------------------------------------------


def _hca(root: Path, name: str, pci: str, guid: str, *, state="4: ACTIVE",
         phys="5: LinkUp", rate="400 Gb/sec (4X NDR)", sm_lid="0x1") -> Path:
    """A STAND-IN HCA laid out as the kernel's: /sys/class/infiniband/<name> a link into
    /sys/devices, ``device`` a link to its PCI function, port 1 with its counters."""
    function = root / "devices" / "pci0000:00" / pci
    hca = function / "infiniband" / name
    port = hca / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "counters").mkdir()
    for field, value in (("state", state), ("phys_state", phys), ("rate", rate),
                         ("sm_lid", sm_lid), ("lid", "0x11"), ("link_layer", "InfiniBand")):
        (port / field).write_text(value + "\n")
    (port / "gids" / "0").write_text(f"fe80:0000:0000:0000:{guid}\n")
    for counter in ("symbol_error", "port_rcv_errors"):
        (port / "counters" / counter).write_text("0\n")
    (hca / "node_guid").write_text(f"{guid}\n")
    os.symlink(function, hca / "device")
    (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    os.symlink(hca, root / "class" / "infiniband" / name)
    return port


def _on(root: Path, command: str) -> str:
    return command.replace(infiniband.SYSFS, str(root / "class" / "infiniband"))


def test_the_port_probe_reads_phys_state_rate_and_sm_lid(tmp_path):
    _hca(tmp_path, "ibp26s0", "0000:1a:00.0", "b8ce:f603:00a1:2b3c")
    _hca(tmp_path, "ibp60s0", "0000:3c:00.0", "b8ce:f603:00a1:2b4c", state="1: DOWN",
         phys="2: Polling", rate="10 Gb/sec (4X SDR)", sm_lid="0x0")
    out = subprocess.run(["sh", "-c", _on(tmp_path, infiniband.PORTS_PROBE)],
                         capture_output=True, text=True, check=True).stdout
    ports = {p["device"]: p for p in infiniband.parse_ports(out)}
    assert ports["ibp26s0"]["pci"] == "0000:1a:00.0"
    assert (ports["ibp26s0"]["phys_state"], ports["ibp26s0"]["rate"],
            ports["ibp26s0"]["sm_lid"]) == ("LinkUp", "400 Gb/sec (4X NDR)", 1)
    assert (ports["ibp60s0"]["state"], ports["ibp60s0"]["phys_state"],
            ports["ibp60s0"]["sm_lid"]) == ("DOWN", "Polling", 0)


def test_the_write_bw_client_finds_a_renamed_hca_and_reads_counters_around_the_test(
        tmp_path):
    """The client's own shell: the port declared by PCI on an HCA rdma-core renamed,
    ib_write_bw a STAND-IN that prints a captured-shape report and bumps a counter."""
    _hca(tmp_path, "ibp26s0", "0000:1a:00.0", "b8ce:f603:00a1:2b3c")
    counter = (tmp_path / "class" / "infiniband" / "ibp26s0" / "ports" / "1" / "counters"
               / "symbol_error")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "ib_write_bw"
    tool.write_text(f'#!/bin/sh\necho "$*" > {tmp_path}/args\ncat {FIXTURES}/ib_write_bw-ndr.txt\n'
                    f"echo 3 > {counter}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    probe = write_bw(Context(LAB)).make("gpu1", "gpu2")
    out = subprocess.run(["sh", "-c", _on(tmp_path, probe.command)], capture_output=True,
                         text=True, env=env, check=True).stdout
    assert (tmp_path / "args").read_text().split()[:2] == ["-d", "ibp26s0"]
    result = probe.read(done(out))
    assert result.value == 389.27 and result.details["device"] == "ibp26s0"
    assert result.status is Status.FAIL and "symbol_error +3" in result.message


def test_find_device_by_guid_and_by_name(tmp_path):
    _hca(tmp_path, "mlx5_0", "0000:1a:00.0", "b8ce:f603:00a1:2b3c")
    _hca(tmp_path, "mlx5_1", "0000:3c:00.0", "b8ce:f603:00a1:2b4c")
    sysfs = str(tmp_path / "class" / "infiniband")
    for declared, want in (({"guid": "b8ce:f603:00a1:2b4c", "port": 1}, "mlx5_1"),
                           ({"device": "mlx5_0", "port": 1}, "mlx5_0"),
                           ({"pci": "0000:99:00.0", "port": 1}, "")):
        shell = infiniband.find_device(declared, sysfs) + '; echo "[$dev]"'
        out = subprocess.run(["sh", "-c", shell], capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out == f"[{want}]", declared


def test_the_write_bw_client_tries_again_while_the_server_comes_up(tmp_path):
    """The client's own shell, with a STAND-IN ib_write_bw that finds no server twice."""
    _hca(tmp_path, "ibp26s0", "0000:1a:00.0", "b8ce:f603:00a1:2b3c")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "ib_write_bw"
    count = tmp_path / "count"
    tool.write_text(f'#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0); '
                    f'echo $((n + 1)) > {count}\n'
                    f'if [ "$n" -lt 2 ]; then cat {FIXTURES}/ib_write_bw-no-server.txt >&2; '
                    f'exit 1; fi\ncat {FIXTURES}/ib_write_bw-ndr.txt\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    probe = write_bw(Context(LAB)).make("gpu1", "gpu2")
    out = subprocess.run(["sh", "-c", _on(tmp_path, probe.command)], capture_output=True,
                         text=True, env=env, check=True).stdout
    assert count.read_text().strip() == "3"
    assert probe.read(done(out)).status is Status.PASS
