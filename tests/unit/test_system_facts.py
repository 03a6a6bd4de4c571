"""aicluster.common.facts's commands, run on this machine through /bin/sh, parsed by
the fact classes themselves."""

import subprocess

from aicluster.common.facts import ContainerVirt, CrbEnabled, GlobPaths, NftTable


def _read(fact, **kwargs):
    out = subprocess.run(["sh", "-c", fact.command(**kwargs)], capture_output=True,
                         text=True, check=True).stdout
    return fact.process(out.splitlines())


def test_glob_paths_lists_matches_sorted_and_nothing_for_no_match(tmp_path):
    for name in ("b.conf", "a.conf", "c.txt"):
        (tmp_path / name).write_text("")
    assert _read(GlobPaths(), pattern=f"{tmp_path}/*.conf") == [
        f"{tmp_path}/a.conf", f"{tmp_path}/b.conf"]
    assert _read(GlobPaths(), pattern=f"{tmp_path}/none-*") == []


def test_nft_table_absent_reads_false():
    # A table name nobody loads; without nft at all the answer is False as well.
    assert _read(NftTable(), family="inet", table="aicluster-test-never-loaded") is False


def test_container_virt_none_and_names():
    assert ContainerVirt().process(["none"]) is None
    assert ContainerVirt().process([]) is None
    assert ContainerVirt().process(["systemd-nspawn"]) == "systemd-nspawn"


def test_glob_paths_lists_a_dangling_link_as_ls_does(tmp_path):
    (tmp_path / "a.network").symlink_to(tmp_path / "gone")
    (tmp_path / "b.network").write_text("")
    expected = subprocess.run(["sh", "-c", f"ls -1d {tmp_path}/*.network"], text=True,
                              capture_output=True, check=True).stdout.split()
    assert _read(GlobPaths(), pattern=f"{tmp_path}/*.network") == sorted(expected)


def test_container_virt_reads_systemds_record_first(tmp_path):
    record = tmp_path / "container"
    record.write_text("systemd-nspawn\n")
    command = ContainerVirt().command().replace("/run/systemd/container", str(record))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert ContainerVirt().process(out.stdout.splitlines()) == "systemd-nspawn"


def test_container_virt_without_the_record_asks_systemd_detect_virt(tmp_path):
    command = ContainerVirt().command().replace("/run/systemd/container",
                                                str(tmp_path / "none"))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    asked = subprocess.run(["sh", "-c", "systemd-detect-virt --container || true"],
                           capture_output=True, text=True).stdout
    assert ContainerVirt().process(out.stdout.splitlines()) == ContainerVirt().process(
        asked.splitlines())


# Rocky 9's CRB section as its rocky.repo ships it (URLs left out), off; the debug one
# beside it, and another repository, on.
ROCKY_REPO = """[baseos]
name=Rocky Linux $releasever - BaseOS
gpgcheck=1
enabled=1

[crb]
name=Rocky Linux $releasever - CRB
gpgcheck=1
enabled={crb}
countme=1

[crb-debuginfo]
name=Rocky Linux $releasever - CRB - Debug
enabled=1
"""


def _crb(repos, tmp_path):
    for name, text in repos.items():
        (tmp_path / name).write_text(text)
    command = CrbEnabled().command().replace("/etc/yum.repos.d", str(tmp_path))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return CrbEnabled().process(out.stdout.splitlines())


def test_crb_enabled_reads_the_crb_section_of_the_repo_files(tmp_path):
    assert _crb({"rocky.repo": ROCKY_REPO.format(crb="0")}, tmp_path) is False
    # As dnf config-manager --set-enabled crb leaves it (either spelling).
    assert _crb({"rocky.repo": ROCKY_REPO.format(crb="1")}, tmp_path) is True
    assert _crb({"rocky.repo": ROCKY_REPO.format(crb=" 1")}, tmp_path) is True


def test_crb_enabled_reads_rhels_codeready_builder_and_no_files_as_off(tmp_path):
    rhel = "[codeready-builder-for-rhel-9-x86_64-rpms]\nname=CRB\nenabled = 1\n"
    assert _crb({"rocky.repo": ROCKY_REPO.format(crb="0"), "redhat.repo": rhel},
                tmp_path) is True
    # A section's name is read per file: [crb] of one file is not another's.
    (tmp_path / "split").mkdir()
    split = {"a.repo": "[crb]\nname=CRB\n", "b.repo": "enabled=1\n"}
    assert _crb(split, tmp_path / "split") is False
    assert _crb({}, tmp_path / "none") is False


# --- drift reads (aicluster.common.drift through the facts) ---------------------------


def test_sysctl_values_read_live_keys_and_leave_out_unknown_ones():
    from aicluster.common.facts import SysctlValues

    read = _read(SysctlValues(), keys=["kernel.ostype", "net.aicluster.never_a_key"])
    assert read["live"] == {"kernel.ostype": "Linux"}


def test_sysctl_drift_compares_words_and_numbers_and_skips_absent_keys():
    from aicluster.common.drift import parse_sysctl, sysctl_drift

    live = parse_sysctl(["net.ipv4.tcp_rmem = 4096\t87380\t134217728",
                         "net.ipv4.tcp_mtu_probing = 0", "net.core.somaxconn = 4096"])
    wanted = {"net.ipv4.tcp_rmem": "4096 87380 134217728", "net.ipv4.tcp_mtu_probing": 1,
              "net.core.somaxconn": 4096, "net.core.rmem_max": 268435456}
    assert sysctl_drift(wanted, live) == ["net.ipv4.tcp_mtu_probing"]


def test_sysctl_apply_records_what_the_kernel_refuses_and_the_read_sees_it(tmp_path):
    from aicluster.common.drift import (
        parse_refused,
        parse_sysctl,
        sysctl_apply_command,
        sysctl_command,
        sysctl_drift,
        sysctl_refused,
    )

    # A STAND-IN drop-in the kernel is asked nothing new by (kernel.ostype is read-only,
    # as a refused key is): wanted values this kernel does not have.
    dropin = tmp_path / "none.conf"
    dropin.write_text("")
    refused_file = str(tmp_path / "run" / "refused")
    wanted = {"kernel.ostype": "NotLinux", "net.aicluster.never_a_key": 1}
    subprocess.run(["sh", "-c", sysctl_apply_command(str(dropin), wanted, refused_file)],
                   check=True)
    out = subprocess.run(["sh", "-c", sysctl_command(sorted(wanted), refused_file)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    live, refused = parse_sysctl(out), parse_refused(out)
    assert refused == {"kernel.ostype": "NotLinux"}
    assert sysctl_drift(wanted, live, refused) == []
    assert sysctl_refused(wanted, live, refused) == ["kernel.ostype"]


def test_nft_table_drift_without_nft_reads_no_nft_and_states_parse():
    import shutil

    from aicluster.common.drift import nft_needs_load, nft_table_state
    from aicluster.common.facts import NftTableDrift
    if shutil.which("nft") is None:
        assert _read(NftTableDrift(), rules_file="/nonexistent") == "no-nft"
    assert nft_table_state(["absent"]) == "absent"
    assert nft_table_state(["garbage"]) == "unknown"
    assert [s for s in ("no-nft", "absent", "same", "different", "unknown")
            if nft_needs_load(s)] == ["absent", "different"]


def test_kernel_modules_loaded_reads_sys_module(tmp_path):
    from aicluster.common.drift import missing_modules
    from aicluster.common.facts import KernelModulesLoaded

    # A module every Linux kernel has under /sys/module (built in or loaded), and one none has.
    state = _read(KernelModulesLoaded(), modules=["printk", "aicluster-never-a-module"])
    assert state["loaded"] == ["printk"]
    assert missing_modules(["printk", "aicluster-never-a-module"], state) == [
        "aicluster-never-a-module"]
