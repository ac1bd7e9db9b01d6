"""The agent's environment on the host (``--agent-env NAME=VALUE``, a named host's ``agent_env``): how a Slurm login
host whose SSH session does not set ``SLURM_CONF`` is used. Run for real: ``job launch --slurm`` against the test
cluster (tests/slurm_cluster.py) from a shell that has no ``SLURM_CONF``, with and without the option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_support import run_root, wait_for  # noqa: F401  (run_root: fixture)
from eaglewatch.errors import UserError
from eaglewatch.pipeline.agent import slurm
from eaglewatch.pipeline.agent.slurm_state import FINISHED_STATES
from eaglewatch.tui import config
from eaglewatch.tui.connection.links import agent_argv, remote_command
from slurm_cluster import SlurmCluster


def test_a_named_hosts_agent_env_is_read_and_checked(tmp_path: Path) -> None:
    good = config.parse('[hosts.login]\ntarget = "me@login"\nagent_env = { SLURM_CONF = "/etc/slurm/a b.conf" }\n',
                        tmp_path / "c.toml")
    assert good.hosts["login"].agent_env == {"SLURM_CONF": "/etc/slurm/a b.conf"}
    with pytest.raises(UserError, match="agent_env"):
        config.parse('[hosts.login]\ntarget = "x"\nagent_env = { "A=B" = "c" }\n', tmp_path / "c.toml")


def test_the_agent_env_reaches_the_remote_command_quoted() -> None:
    argv = agent_argv("python3", [".eaglewatch/agent/a.pyz"], None, None, (("SLURM_CONF", "/etc/slurm/a b;rm x"),))
    assert argv[:2] == ["env", "SLURM_CONF=/etc/slurm/a b;rm x"]
    assert remote_command(argv).startswith("env 'SLURM_CONF=/etc/slurm/a b;rm x' python3 ")


@pytest.mark.parametrize("word", ["NOEQUALS", "=x", "1A=x", "A B=x", "A\0=x"])
def test_a_bad_agent_env_word_is_one_line(word: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "eaglewatch", "runs", "local", "--agent-env", word],
                          capture_output=True, text=True, timeout=60) if "\0" not in word else None
    if proc is None:
        return  # a NUL cannot be passed in argv at all
    assert proc.returncode == 2 and "--agent-env" in proc.stderr and "Traceback" not in proc.stderr


def _launch(tmp_path: Path, run_root: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eaglewatch", "job", "launch", "--slurm", "local", "--ranks", "1",
                           "--cpus-per-task", "1", "--run-root", str(run_root), "--no-tui", *extra, "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slurm
def test_slurm_conf_reaches_sbatch_through_the_agents_environment(slurm_cluster: SlurmCluster, run_root: Path,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bare = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    bare.update(HOME=str(tmp_path), EAGLEWATCH_CONFIG="", EAGLEWATCH_JOBS_DIR=str(tmp_path / "j"))
    without = _launch(tmp_path, run_root, bare)
    assert without.returncode != 0 and "Traceback" not in without.stderr
    assert "configuration" in without.stderr, without.stderr  # sbatch: fatal: Could not establish a configuration source
    conf = slurm_cluster.env["SLURM_CONF"]
    given = _launch(tmp_path, run_root, bare, "--agent-env", f"SLURM_CONF={conf}")
    assert given.returncode == 0, given.stdout + given.stderr
    job = given.stdout.strip()
    monkeypatch.setenv("SLURM_CONF", conf)  # for this process's own squeue, below

    def finished() -> bool:
        return all(r["sched_state"] in FINISHED_STATES for r in slurm.status(run_root, job)["ranks"])

    wait_for(finished, 120, 0.2, f"job {job} to finish")
    assert slurm.status(run_root, job)["ranks"][0]["sched_state"] == "COMPLETED"
