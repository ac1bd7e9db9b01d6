"""Runs on a compute node, as an agent on a login host tells them: from the run directory, not its process table.

The agent of the Slurm test runs as on a login host: in a UTS and a PID namespace of its own (``unshare``), it has
another host name and sees none of the node's processes, while the run root is the same folder (as a shared file
system makes it). Its ranks run on the real node (tests/slurm_cluster.py). A rank that runs reads ``running`` in
``status``, ``runs`` and a watch; one that ends reads ``exited``; one whose node dies (every process of its task
killed at once, so nothing records an exit) reads ``lost`` once its task has not been heard from for a while.

The first test needs no Slurm: run directories in the layout a rank's launcher writes, on a node that is not this
host, with their ``task.alive`` fresh or stale.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent_support import collect, parent_of, run_root, wait_for  # noqa: F401  (run_root: fixture)
from eaglewatch.pipeline.agent import jobs
from eaglewatch.pipeline.agent.rundir import RunDir, new_run_id, write_json_atomic
from eaglewatch.pipeline.agent.slurm_state import FINISHED_STATES
from eaglewatch.tui.connection import AgentError, Connection
from eaglewatch.tui.connection.links import LocalLink
from slurm_cluster import SlurmCluster

LOGIN_HOST = "login-ewtest"
BEAT_S = 1.0  # the ranks' launchers beat every second: a task silent for 12 s is gone
JOB_WAIT_S = 180.0

# Each rank waits until the test lets it go (a file named after it), then exits 0.
GATED_RANK = """\
import sys, time
from pathlib import Path
rank = int(sys.argv[sys.argv.index("--rank") + 1])
gate = Path(sys.argv[1]) / f"go{rank}"
print(f"rank {rank} waits for {gate}", flush=True)
while not gate.exists():
    time.sleep(0.05)
print(f"rank {rank} goes", flush=True)
"""


# --- without Slurm: the run directory alone -------------------------------------------------------------------

def _node_run(root: Path, *, beat_age_s: float | None, pid: int | None = 4242, started_ago_s: float = 60.0,
              exit_code: int | None = None) -> RunDir:
    """A rank's run directory as its launcher on node gpu07 leaves it: cmd.json with ``host`` and ``slurm``, the
    node's pid, and ``task.alive`` last refreshed ``beat_age_s`` ago (None: no beat yet)."""
    run = RunDir(root / new_run_id("remote-rank1"))
    run.path.mkdir(parents=True)
    jobs.write_command_record(run, ["python", "-c", "pass", "--rank", "1", "--world-size", "2"], None, cwd="/",
                              env={}, name="remote", python=None, installed=False, restart_of=None, host="gpu07",
                              extra={"slurm": {"job": new_run_id("remote"), "rank": 1, "world_size": 2,
                                               "job_id": "8", "array_job_id": "7", "array_task_id": "1",
                                               "node": "gpu07"}})
    cmd = run.cmd()
    cmd["started_at"] = time.time() - started_ago_s
    write_json_atomic(run.cmd_path, cmd)
    if pid is not None:
        (run.path / "pid").write_text(f"{pid}\n")
        (run.path / "pgid").write_text(f"{pid}\n")
        (run.path / "supervisor.pid").write_text(f"{pid - 1}\n")
    if beat_age_s is not None:
        jobs.mark_task_alive(run, "gpu07", BEAT_S)
        then = time.time() - beat_age_s
        os.utime(run.task_alive_path, (then, then))
    if exit_code is not None:
        write_json_atomic(run.exit_path, {"code": exit_code, "signal": None, "signal_name": None,
                                          "ended_at": time.time(), "recorded_by": "supervisor"})
    return run


def test_a_run_on_another_node_is_told_by_its_task_alive_file_not_by_this_hosts_processes(run_root: Path) -> None:
    assert socket.gethostname() != "gpu07"
    beating = _node_run(run_root, beat_age_s=0.5)
    starting = _node_run(run_root, beat_age_s=0.5, pid=None)
    silent = _node_run(run_root, beat_age_s=BEAT_S * jobs.LOST_AFTER_BEATS + 5)
    ended = _node_run(run_root, beat_age_s=BEAT_S * jobs.LOST_AFTER_BEATS + 5, exit_code=0)
    unbeaten = _node_run(run_root, beat_age_s=None, started_ago_s=jobs.TASK_ALIVE_S * jobs.LOST_AFTER_BEATS + 5)
    just_started = _node_run(run_root, beat_age_s=None, pid=None, started_ago_s=1.0)
    # Pid 4242 means nothing here: none of these runs has a process on this host.
    expected = {beating: "running", starting: "starting", silent: "lost", ended: "exited", unbeaten: "lost",
                just_started: "starting"}
    assert {run: jobs.run_state(run) for run in expected} == expected
    assert {s["run"]: s["state"] for s in jobs.list_runs(run_root)} == {r.run_id: s for r, s in expected.items()}
    assert jobs.job_pids(run_root) == []

    # Stop and restart would act on this host: refused, and nothing is recorded in the node's stead.
    for refused in (lambda: jobs.stop(beating, grace_s=1.0), lambda: jobs.restart(run_root, beating)):
        with pytest.raises(jobs.Refused, match=r"rank 1 of Slurm job .* \(task 7_1\) on node gpu07: this host "
                                               r"cannot signal it"):
            refused()
    assert not beating.exit_path.exists() and jobs.run_state(beating) == "running"
    assert jobs.stop(ended)["state"] == "exited"  # nothing left to stop: the summary, as for any ended run


# --- on the Slurm cluster, through an agent on a "login host" -------------------------------------------------

class LoginHostConnection(Connection):
    """A local agent started through ``python`` (a wrapper that gives it the login host's namespaces)."""

    def __init__(self, python: str, **kwargs: Any) -> None:
        super().__init__("local", **kwargs)
        self.python = python

    def _open_link(self) -> Any:
        return LocalLink(self.run_root, self.idle_exit_s, python=self.python)


def _login_python(folder: Path) -> Path:
    """An interpreter wrapper: the agent gets a host name of its own and a process table that holds only itself
    and its children (pid and mount namespaces, /proc mounted again)."""
    wrapper = folder / "login-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec unshare --uts --pid --fork --kill-child --mount-proc -- sh -c 'hostname \"$0\" && exec \"$@\"' "
        f"{LOGIN_HOST} {sys.executable} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def login_agent(slurm_cluster: SlurmCluster, run_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare cannot make UTS and PID namespaces here (needs root, or user namespaces)")
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    # sbatch passes the agent's environment on to the batch script: the ranks' launchers beat every second.
    monkeypatch.setenv(jobs.TASK_ALIVE_ENV, str(BEAT_S))
    connection = LoginHostConnection(str(_login_python(tmp_path)), run_root=str(run_root))
    connection.connect()
    yield connection
    try:
        _cancel_jobs_of(slurm_cluster, run_root)
    finally:
        connection.close()


def _cancel_jobs_of(cluster: SlurmCluster, root: Path) -> None:
    """What a failed test left in the queue: its arrays cancelled and waited out."""
    arrays = {int(rank["scheduler_job_id"].split("_")[0]) for path in (root / "jobs").glob("*.json")
              for rank in json.loads(path.read_text())["ranks"] if rank.get("scheduler_job_id")}
    if arrays:
        cluster.run("scancel", *map(str, sorted(arrays)))
        wait_for(lambda: not [job for job in cluster.jobs() if job["array_job_id"] in arrays
                              and job["job_state"] not in FINISHED_STATES], 60.0, 0.2, "the test's jobs to end")


def _kill_task(run_dir: Path) -> None:
    """The node dies under the rank: its launcher (the task's main process), supervisor and command, SIGKILLed one
    right after the other, so that nothing writes exit.json."""
    supervisor = int((run_dir / "supervisor.pid").read_text())
    launcher = parent_of(supervisor)
    with open(f"/proc/{launcher}/cmdline", "rb") as fh:
        assert b"eaglewatch.pipeline.agent.slurm_task" in fh.read(), "the supervisor's parent is the rank launcher"
    job = int((run_dir / "pgid").read_text())
    os.kill(launcher, signal.SIGKILL)
    os.kill(supervisor, signal.SIGKILL)
    os.killpg(job, signal.SIGKILL)


@pytest.mark.slurm
def test_a_login_host_agent_tells_ranks_on_the_node_running_exited_and_lost(
        login_agent: Connection, slurm_cluster: SlurmCluster, run_root: Path, tmp_path: Path) -> None:
    # The agent is pid 1 of its own process table, on a host of another name than the node's.
    assert login_agent.hello["host"] == LOGIN_HOST != slurm_cluster.node and login_agent.hello["pid"] == 1
    gates = tmp_path / "gates"
    gates.mkdir()
    job = login_agent.job_launch([sys.executable, "-c", GATED_RANK, str(gates)], ranks=2, cwd=str(tmp_path),
                                 slurm={"cpus_per_task": 1})
    # The record names each rank's run from the submission on; the snapshot only once its directory exists.
    runs = [rank["run"] for rank in json.loads((run_root / "jobs" / f"{job['job']}.json").read_text())["ranks"]]
    dirs = [run_root / run for run in runs]
    wait_for(lambda: all((d / "pid").exists() for d in dirs), JOB_WAIT_S, 0.1, "both ranks' commands to start")

    # Both commands run on the node, where the agent sees no process of theirs.
    for run in runs:
        summary = login_agent.status(run)
        assert summary["state"] == "running", summary
        assert json.loads((run_root / run / "cmd.json").read_text())["host"] == slurm_cluster.node
    assert {s["run"]: s["state"] for s in login_agent.runs()} == {run: "running" for run in runs}
    snapshot = login_agent.job_status(job["job"])
    assert [(r["sched_state"], r["summary"]["state"]) for r in snapshot["ranks"]] == [("RUNNING", "running")] * 2

    # Stopping a rank from here would signal this host's processes: refused, and the rank runs on.
    with pytest.raises(AgentError, match=f"on node {slurm_cluster.node}: this host cannot signal it") as refused:
        login_agent.stop(runs[1], grace_s=1.0)
    assert refused.value.code == "refused"
    assert not (dirs[1] / "exit.json").exists() and login_agent.status(runs[1])["state"] == "running"

    # Rank 0 is let go: its watch says running, then exited with its code.
    watch = login_agent.watch(runs[0])
    seen = collect(watch, 60.0, until=lambda got: any(s.state == "running" for s in got.states))
    (gates / "go0").touch()
    seen = collect(watch, 60.0, until=lambda got: any(s.state == "exited" for s in got.states), into=seen)
    ended = next(s for s in seen.states if s.state == "exited")
    assert ended.exit is not None and ended.exit["code"] == 0
    assert [s.state for s in seen.states if s.state != "running"] == ["exited"]  # never lost on the way
    assert b"rank 0 goes" in seen.log
    assert login_agent.status(runs[0])["state"] == "exited"

    # Rank 1's node dies: no exit record; its task stops beating and, after twelve beats of silence, it is lost.
    _kill_task(dirs[1])
    lost = wait_for(lambda: login_agent.status(runs[1])["state"] == "lost", 60.0, 0.2, "rank 1 to read lost")
    assert lost and not (dirs[1] / "exit.json").exists()
    done = wait_for(lambda: (s := login_agent.job_status(job["job"])) and all(
        r["sched_state"] in FINISHED_STATES for r in s["ranks"]) and s, JOB_WAIT_S, 0.2, "both tasks to end")
    first, second = done["ranks"]
    assert (first["sched_state"], first["summary"]["state"], first["exit_code"]) == ("COMPLETED", "exited", 0)
    # Slurm saw its task's main process killed; the run itself has no status to give.
    assert second["sched_state"] != "COMPLETED" and second["summary"]["state"] == "lost"
    login_agent.unwatch(watch)
