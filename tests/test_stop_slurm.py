"""The operator's stop on a real Slurm (tests/slurm_cluster.py: one node, 2 CPUs): before the agent scancels a
rank for ``job_cancel`` or ``job_restart_rank``, it leaves ``stop.json`` in the rank's run directory (the run root is
shared with the node), and the rank's supervisor records ``stopped: true``. A scancel by hand, which nobody asked the
agent for, is still a kill."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_support import run_root, wait_for  # noqa: F401  (run_root: fixture)
from eaglewatch import protocol
from eaglewatch.pipeline.agent.slurm_state import CANCELLED, FAILED, state_from_exit
from eaglewatch.tui.connection import Connection
from eaglewatch.tui.runend import run_end
from slurm_cluster import SlurmCluster
from test_slurm_jobs import ONE_THREAD, _launch, _wait_job, agent  # noqa: F401  (agent: fixture)

pytestmark = pytest.mark.slurm

TICKING_RANK = """\
import sys, time
rank = int(sys.argv[sys.argv.index("--rank") + 1])
print(f"rank {rank} starts", flush=True)
while True:
    print("tick", flush=True)
    time.sleep(0.1)
"""


def _ticking(snapshot: dict[str, Any], rank: int, not_run: str | None = None) -> bool:
    entry = snapshot["ranks"][rank]
    if entry["sched_state"] != "RUNNING" or not entry["run_dir"] or entry["run"] == not_run:
        return False
    log = Path(entry["run_dir"]) / "log"
    return log.exists() and b"tick" in log.read_bytes()


def _ended(snapshot: dict[str, Any], rank: int, run: str) -> bool:
    entry = snapshot["ranks"][rank]
    return entry["run"] == run and bool(entry["summary"]) and entry["summary"]["state"] == "exited"


def _end_of(agent: Connection, run: str) -> tuple[dict[str, Any], Any]:
    exit_info = agent.status(run)["exit"]
    return exit_info, run_end("exited", exit_info)


def test_the_agents_scancel_is_a_stop_and_a_hand_scancel_a_kill(agent: Connection, slurm_cluster: SlurmCluster,
                                                                 run_root: Path, tmp_path: Path) -> None:
    job = _launch(agent, 2, [sys.executable, "-u", "-c", TICKING_RANK], tmp_path, env=ONE_THREAD)["job"]
    both = _wait_job(agent, job, lambda s: _ticking(s, 0) and _ticking(s, 1), "both ranks ticking")
    first0, first1 = both["ranks"][0], both["ranks"][1]

    # Rank 1's task scancelled by hand: nobody asked the agent, so it reads as the kill it is.
    assert slurm_cluster.run("scancel", first1["scheduler_job_id"]).returncode == 0
    _wait_job(agent, job, lambda s: _ended(s, 1, first1["run"]), "rank 1 ended")
    exit_info, end = _end_of(agent, first1["run"])
    assert exit_info["signal_name"] == "SIGTERM" and "stopped" not in exit_info
    assert not (run_root / first1["run"] / "stop.json").exists()
    assert (end.text, end.failed, end.stopped) == ("killed by SIGTERM", True, False)

    # Rank 0 restarted while it runs: the agent's scancel of its task is the operator's stop.
    agent.request(protocol.OP_JOB_RESTART_RANK, job=job, rank=0)
    again = _wait_job(agent, job, lambda s: _ticking(s, 0, not_run=first0["run"]), "rank 0's new run ticking")
    exit_info, end = _end_of(agent, first0["run"])
    assert exit_info["signal_name"] == "SIGTERM" and exit_info["stopped"] is True
    assert exit_info["stop"]["via"] == "job_restart_rank" and exit_info["stop"]["by"] == "operator"
    request = json.loads((run_root / first0["run"] / "stop.json").read_text())
    assert request["via"] == "job_restart_rank"
    assert (end.text, end.failed, end.stopped) == ("stopped by the operator (SIGTERM)", False, True)

    # The job cancelled: its running rank is stopped, not failed.
    second0 = again["ranks"][0]["run"]
    cancelled = agent.request(protocol.OP_JOB_CANCEL, job=job)
    assert cancelled["ranks"][0]["sched_state"] == CANCELLED
    _wait_job(agent, job, lambda s: _ended(s, 0, second0), "rank 0's new run ended")
    exit_info, end = _end_of(agent, second0)
    assert exit_info["stopped"] is True and exit_info["stop"]["via"] == "job_cancel"
    assert end.text == "stopped by the operator (SIGTERM)" and not end.failed


def test_a_rank_slurm_forgot_reads_cancelled_when_its_exit_says_stopped() -> None:
    """What is left once Slurm has forgotten the task and its batch output names no cause: the rank's exit.json."""
    assert state_from_exit({"signal": 15, "signal_name": "SIGTERM", "stopped": True}) == CANCELLED
    assert state_from_exit({"signal": 15, "signal_name": "SIGTERM"}) == FAILED
    assert state_from_exit({"code": 0, "stopped": True}) == CANCELLED
