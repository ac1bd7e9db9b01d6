"""``eaglewatch job`` as the operator runs it (the real CLI in subprocesses): a plain-SSH job with one rank behind the
real test sshd, through a named host of the config file, and one on ``local``; its record, status and restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_support import PYTHON, run_root, wait_for  # noqa: F401  (run_root: fixture)
from sshd import Sshd, sshd_server  # noqa: F401  (sshd_server: fixture)

pytestmark = pytest.mark.ssh

SAYS_ITS_SHARE = "import sys\nprint('share', sys.argv[1:], flush=True)\n"


def job_cli(*words: object, home: Path, server: Sshd, config: Path) -> subprocess.CompletedProcess[str]:
    """The real CLI, with nothing of this machine's user in play: HOME elsewhere, the jobs kept under it, and only
    the test server's ssh config, known hosts and key."""
    env = {**os.environ, "HOME": str(home), "EAGLEWATCH_CONFIG": "", "EAGLEWATCH_JOBS_DIR": str(home / "jobs")}
    env.pop("EAGLEWATCH_REMOTE_PYTHON", None)
    action, *rest = [str(word) for word in words]
    connection = ["--config", str(config), "--ssh-config", str(server.ssh_config), "--known-hosts",
                  str(server.known_hosts), "-i", str(server.client_key), "--no-ssh-agent"]
    return subprocess.run([sys.executable, "-m", "eaglewatch", "job", action, *connection, *rest],
                          capture_output=True, text=True, timeout=120, env=env)


def test_job_launch_puts_one_rank_on_each_host_over_ssh_and_locally(sshd_server: Sshd, run_root: Path,
                                                                    tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.gpu]\ntarget = "testhost"\nrun_root = "{run_root}"\npython = "{PYTHON}"\n\n'
                      f'[hosts.box]\ntarget = "local"\nrun_root = "{run_root}"\n')
    launched = job_cli("launch", "--hosts", "gpu,box", "--name", "share", "--no-tui", "--",
                       PYTHON, "-c", SAYS_ITS_SHARE, home=tmp_path, server=sshd_server, config=config)
    assert launched.returncode == 0, launched.stderr
    job = launched.stdout.strip()
    assert "rank 0 on gpu" in launched.stderr and "rank 1 on box" in launched.stderr

    record = json.loads((tmp_path / "jobs" / f"{job}.json").read_text())
    assert (record["scheduler"], record["target"], record["world_size"], record["name"]) == ("ssh", "gpu,box", 2,
                                                                                          "share")
    assert [(entry["rank"], entry["host"]) for entry in record["ranks"]] == [(0, "gpu"), (1, "box")]
    runs = [entry["run"] for entry in record["ranks"]]
    assert all((run_root / run / "cmd.json").exists() for run in runs)

    def finished() -> dict | None:
        status = job_cli("status", job, "--json", home=tmp_path, server=sshd_server, config=config)
        assert status.returncode == 0, status.stderr
        snapshot = json.loads(status.stdout)
        return snapshot if all(r["summary"]["state"] == "exited" for r in snapshot["ranks"]) else None

    snapshot = wait_for(finished, 60, what="both ranks exited")
    assert [r["exit_code"] for r in snapshot["ranks"]] == [0, 0]
    # Each rank ran the job's command with its share appended.
    for rank, run in enumerate(runs):
        log = (run_root / run / "log").read_text()
        assert f"share ['--rank', '{rank}', '--world-size', '2']" in log, log

    table = job_cli("status", "share", home=tmp_path, server=sshd_server, config=config)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"job {job} (ssh on gpu,box, 2 ranks") and lines[0].endswith("done  name: share")
    assert [line.split()[:4] for line in lines[3:]] == [["0", "gpu", "exited", "done"], ["1", "box", "exited", "done"]]

    # A rank runs again on its own host, as a restart of its run; the record follows it.
    again = job_cli("restart", job[:22], "0", home=tmp_path, server=sshd_server, config=config)
    assert again.returncode == 0, again.stderr
    new_run = again.stdout.strip()
    assert new_run != runs[0] and "runs again" in again.stderr
    record = json.loads((tmp_path / "jobs" / f"{job}.json").read_text())
    assert record["ranks"][0]["run"] == new_run and record["ranks"][1]["run"] == runs[1]
    assert json.loads((run_root / new_run / "cmd.json").read_text())["restart_of"] == runs[0]

    listing = job_cli("list", home=tmp_path, server=sshd_server, config=config)
    assert listing.returncode == 0 and job in listing.stdout and "gpu,box" in listing.stdout


def test_a_slurm_launch_the_agent_cannot_do_is_one_clear_error(tmp_path: Path, run_root: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "EAGLEWATCH_CONFIG": "", "EAGLEWATCH_JOBS_DIR": str(tmp_path / "j")}
    proc = subprocess.run([sys.executable, "-m", "eaglewatch", "job", "launch", "--slurm", "local", "--ranks", "2",
                           "--run-root", str(run_root), "--partition", "nowhere-such", "--no-tui", "--",
                           PYTHON, "-c", "pass"], capture_output=True, text=True, timeout=120, env=env)
    # Whether this agent has no Slurm backend or this machine no Slurm controller: an error, said once, no traceback.
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("eaglewatch job: error: ") and "Traceback" not in proc.stderr
    assert not list((tmp_path / "j").glob("*.json"))
