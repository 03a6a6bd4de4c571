"""aicluster.common.facts's commands, run on this machine through /bin/sh, parsed by
the fact classes themselves."""

import subprocess

from aicluster.common.facts import ContainerVirt, GlobPaths, NftTable


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
