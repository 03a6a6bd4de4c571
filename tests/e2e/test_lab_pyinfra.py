"""pyinfra end to end on the lab in miniature (tests/e2e/test_lab.py deploys it first):
a re-run uses one OpenSSH master per node and restarts nothing, a Slurm setting change
reconfigures keeping a running job, and a re-run on stock pyinfra (the accelerator off,
or stepping aside) and from a wheel installed outside the clone changes nothing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tests.e2e.checks import (
    assert_slurm_reconfigures_keeping_jobs,
    ray_start_times,
    slurm_start_times,
)
from tests.e2e.conftest import Deploy, Lab, env, run

# An ``ssh`` first on PATH that notes each OpenSSH client started, and whether its
# host's master was there and answering when it started (``ssh -O check`` with the
# client's own options), then runs the real one.
LOGGING_SSH = """#!{python}
import json, os, subprocess, sys
argv = sys.argv[1:]
master = None
if "-O" not in argv and "--" in argv:
    check = [{ssh!r}, "-O", "check", *argv[:argv.index("--") + 2]]
    master = subprocess.run(check, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL).returncode == 0
with open({log!r}, "a") as out:
    out.write(json.dumps({{"argv": argv, "master": master}}) + "\\n")
os.execv({ssh!r}, [{ssh!r}] + argv)
"""


def _with(**variables: str) -> dict[str, str]:
    """The tests' environment (conftest's env()) with *variables* set for pyinfra."""
    return {**env(), **variables}


def _deploy_counting_ssh_clients(lab: Lab, tmp: Path) -> tuple[Deploy, list[dict]]:
    """A deploy, and each OpenSSH client it started: its arguments, and whether its
    host's master answered when it started (None: a ``-O`` control command)."""
    bin_dir, log = tmp / "bin", tmp / "ssh.log"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(LOGGING_SSH.format(
        python=sys.executable, log=str(log), ssh=shutil.which("ssh")))
    (bin_dir / "ssh").chmod(0o755)
    deploy = lab.read_deploy(environ=_with(PATH=f"{bin_dir}:{env()['PATH']}"))
    lines = log.read_text().splitlines() if log.exists() else []
    return deploy, [json.loads(line) for line in lines]


def test_rerun_uses_one_openssh_master_per_node_and_restarts_nothing(lab, tmp_path):
    Deploy.read(lab.first_deploy()).succeeded()
    _converged(lab)
    ray_started = ray_start_times(lab.testbed)
    slurm_started = slurm_start_times(lab.testbed)
    deploy, clients = _deploy_counting_ssh_clients(lab, tmp_path)
    second = deploy.succeeded().results
    assert second["changed"] == 0, second
    assert second["no_change"] > 0, second
    # Every command is an OpenSSH client, and they share one master per node: a new
    # SSH connection is made only where a node's master had expired (by connect's
    # ``true``), at most once per node, never per command.
    # (A no-op re-run may be one command per node: the fact reads prefetched at once.)
    commands = [c for c in clients if c["master"] is not None]
    new = [c["argv"][-1] for c in commands if not c["master"]]
    assert len([c for c in commands if c["argv"][-1] != "true"]) >= len(lab.nodes), clients
    assert set(new) <= {"true"} and len(new) <= len(lab.nodes), new
    print(f"re-run: {len(commands)} OpenSSH client(s) started, {len(new)} of them "
          "made a master")
    # Nothing restarted: the Ray units became active when they did before.
    assert ray_start_times(lab.testbed) == ray_started
    # ... nor did munge, slurmctld or slurmd.
    assert slurm_start_times(lab.testbed) == slurm_started


def test_slurm_config_change_reconfigures_keeping_a_running_job(lab):
    def deploy():
        result = lab.read_deploy().succeeded().results
        assert result["changed"] > 0, result

    assert_slurm_reconfigures_keeping_jobs(lab, deploy)


# --- the pyinfra accelerator off, or stepping aside (aicluster.accel) ---------------

# A pyinfra that renamed a private function the accelerator uses: on PYTHONPATH, this
# sitecustomize compiles pyinfra.api.facts with ``_make_command`` renamed (its own calls
# too), so pyinfra works and the accelerator finds the name missing.
PYINFRA_WITHOUT_MAKE_COMMAND = '''
import importlib.abc
import importlib.machinery
import sys


class _Renamed(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        source = self.get_source(fullname).replace("_make_command", "_make_command_renamed")
        return compile(source, self.path, "exec")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "pyinfra.api.facts":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _Renamed(spec.loader.name, spec.loader.path)
        return spec


sys.meta_path.insert(0, _Finder())
'''


def _converged(lab: Lab) -> None:
    """A deploy with the accelerator on, so that the next starts from a converged
    testbed whatever the tests before left (the Slurm test's setting change)."""
    lab.read_deploy().succeeded()


def _stock_rerun(lab: Lab, environ: dict[str, str]) -> str:
    """A re-run on stock pyinfra: it succeeds, changes nothing, and says once why."""
    deploy = lab.read_deploy(environ=environ).succeeded()
    result = deploy.results
    assert result["changed"] == 0, result
    assert result["no_change"] > 0, result
    lines = [line.strip() for line in deploy.output.splitlines()
             if "running on stock pyinfra" in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_rerun_with_the_accelerator_switched_off_changes_nothing(lab):
    _converged(lab)
    line = _stock_rerun(lab, _with(AICLUSTER_ACCEL="0"))
    assert "off by AICLUSTER_ACCEL=0" in line, line
    print(f"re-run on stock pyinfra: 0 changes; {line}")


def test_rerun_on_a_pyinfra_lacking_a_private_name_steps_aside(lab, tmp_path):
    _converged(lab)
    (tmp_path / "sitecustomize.py").write_text(PYINFRA_WITHOUT_MAKE_COMMAND)
    # (conftest's env() drops PYTHONPATH; set here for pyinfra alone)
    line = _stock_rerun(lab, _with(PYTHONPATH=str(tmp_path)))
    assert "stepped aside (pyinfra.api.facts has no _make_command)" in line, line
    print(f"re-run on a pyinfra without _make_command: 0 changes; {line}")


def test_a_wheel_installed_outside_the_clone_deploys_the_testbed(lab, tmp_path_factory):
    """``pip wheel .``, installed into a fresh venv outside the clone: its deploy file and
    its copy of the testbed inventory deploy the testbed (a re-run: no change, no error),
    importing nothing from the clone."""
    from tests.wheel import run as run_checked
    from tests.wheel import wheel_venv

    _converged(lab)
    venv, wheel_env, work = wheel_venv(tmp_path_factory.mktemp("wheel"))
    aicluster = venv / "bin" / "aicluster"
    deploy = run_checked(aicluster, "path", "deploy", cwd=work, env=wheel_env).strip()
    inventories = run_checked(aicluster, "path", "inventories", cwd=work, env=wheel_env).strip()
    assert Path(deploy).is_relative_to(venv) and Path(inventories).is_relative_to(venv)
    shutil.copytree(inventories, work / "inventories")
    # The testbed's state and cache directories, as the clone's inventory reads them.
    wheel_env.update({k: v for k, v in env().items() if k.startswith("AICLUSTER_")})
    proc = run([venv / "bin" / "python", "-m", "pyinfra", "-y", "inventories/testbed.py",
                deploy], cwd=work, timeout=1500, check=False, environ=wheel_env)
    result = Deploy.read(proc).succeeded().results
    assert result["changed"] == 0 and result["no_change"] > 0, result
    print(f"the wheel's deploy on the testbed: {result}")
