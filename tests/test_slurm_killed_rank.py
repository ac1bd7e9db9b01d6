"""A rank killed by SIGKILL on a real Slurm: the task ends by the same signal, Slurm records it, the batch output
holds no traceback, and the fleet's root-cause column says ``killed by SIGKILL``, not ``FAILED``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent_support import run_root  # noqa: F401  (fixture)
from eaglewatch import protocol
from eaglewatch.tui.runstate.fleet import FleetModel
from slurm_cluster import SlurmCluster
from test_slurm_jobs import _all_finished, _launch, _wait_job, agent  # noqa: F401  (agent: fixture)

pytestmark = pytest.mark.slurm


def test_a_rank_killed_by_sigkill_is_told_as_killed(agent, slurm_cluster: SlurmCluster,  # noqa: F811
                                                    run_root: Path, tmp_path: Path) -> None:
    code = ("import os, signal, sys; rank = int(sys.argv[2]); print('rank', rank, flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL) if rank == 1 else sys.exit(0)")
    job = _launch(agent, 2, [sys.executable, "-c", code], tmp_path)
    done = _wait_job(agent, job["job"], _all_finished, "both ranks to finish")
    killed = done["ranks"][1]
    # Slurm's own record of the task: the signal, not an exit code after a Python traceback.
    assert killed["sched_state"] != "COMPLETED" and killed["exit_code"] is None, killed
    outputs = list((run_root / "jobs").rglob("slurm-*_1.out"))
    assert outputs and all("Traceback" not in path.read_text() for path in outputs)

    fleet = FleetModel()
    fleet.set_snapshot(agent.request(protocol.OP_JOB_STATUS, job=job["job"]))
    rows = {row.rank: row for row in fleet.snapshot().rows}
    assert rows[0].outcome == "done"
    assert rows[1].outcome == "failed" and rows[1].root_cause == "killed by SIGKILL", rows[1]
