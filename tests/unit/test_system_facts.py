"""aicluster.facts.system's commands, run on this machine through /bin/sh, parsed by
the fact classes themselves."""

import subprocess

from aicluster.facts.system import ContainerVirt, GlobPaths, NftTable


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
