"""The fleet view on real Slurm jobs (tests/slurm_cluster.py: one node, 2 CPUs), launched as ``eaglewatch job
launch --slurm local`` does, through the local agent's job ops.

Three ranks of one CPU each share the two CPUs: two run, the third waits in the queue. One job extracts the tiny
model's data; its rank 1 dies part-way on its first run, ``r`` on its row resubmits it through Slurm, the new run
resumes from the files the first one wrote, and every row reaches COMPLETED. Another job runs until ``c`` and the
confirm scancel it: its rows, the one that never started included, read CANCELLED.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("textual")

from agent_support import run_root, wait_for  # noqa: F401  (run_root: fixture)
from app_support import screen_text, wait_until
from test_fleet_app import DYING_RANK, fleet_screen, job_args, notifications, rows

from eaglewatch.pipeline.agent.slurm_state import FINISHED_STATES
from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.dialogs import ConfirmScreen
from eaglewatch.tui.commands import job as job_command
from eaglewatch.tui.commands.job_hosts import HostPool
from eaglewatch.tui.commands.job_ops import JobOps
from eaglewatch.tui.commands.job_record import JobStore
from eaglewatch.tui.connection import Connection
from eaglewatch.tui.runstate.fleet import slurm_word
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm

ONE_THREAD = ("OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1")  # one CPU per rank, as Slurm gives it
JOB_WAIT_S = 240.0

# Every rank runs until it is stopped.
TICKING_RANK = """\
import sys, time
rank = int(sys.argv[sys.argv.index("--rank") + 1])
print(f"rank {rank} starts", flush=True)
while True:
    print("tick", flush=True)
    time.sleep(0.1)
"""


@pytest.fixture
def slurm_env(slurm_cluster: SlurmCluster, run_root: Path, monkeypatch: pytest.MonkeyPatch):
    """The test cluster for every agent the dashboard starts; whatever the test left queued is cancelled after."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    yield slurm_cluster
    arrays = {int(rank["scheduler_job_id"].split("_")[0]) for path in (run_root / "jobs").glob("*.json")
              for entry in json.loads(path.read_text())["ranks"]
              for rank in [entry, *entry.get("attempts", [])] if rank.get("scheduler_job_id")}
    if arrays:
        slurm_cluster.run("scancel", *map(str, sorted(arrays)))
        wait_for(lambda: not [job for job in slurm_cluster.jobs() if job["array_job_id"] in arrays
                              and job["job_state"] not in FINISHED_STATES], 60.0, 0.2, "the test's jobs to end")


def launch_slurm_job(run_root: Path, store: JobStore, ranks: int, argv: list[str], name: str,
                     env: tuple[str, ...] = ()) -> JobOps:
    """``eaglewatch job launch --slurm local --ranks N --cpus-per-task 1 -- ARGV`` as the command does it."""
    env_words = [word for pair in env for word in ("-e", pair)]
    args = job_args(run_root, "launch", "--slurm", "local", "--ranks", str(ranks), "--cpus-per-task", "1",
                    "--name", name, "--no-tui", *env_words, "--", *argv)
    command, env_pairs = job_command.launch_request(args)
    pool = HostPool(args, interactive=False)
    record = job_command.start(pool, store, args, command, env_pairs)
    return JobOps(record, pool, store)


def states(screen) -> list[str]:
    """Slurm's word on each row, rank order."""
    return [slurm_word(row.state) or row.state for row in screen.fleet.snapshot().rows]


def test_a_slurm_rank_that_failed_is_resubmitted_with_r_resumes_and_every_rank_completes(
        slurm_env, tiny_llama, prepared_data, run_root, tmp_path, capsys):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "dying_rank.py"
    script.write_text(DYING_RANK)
    out = tmp_path / "out"
    argv = [sys.executable, str(script), "extract", "--engine", "hf", "--model-path", str(tiny_llama),
            "--prepared-data", str(prepared_data), "--output-dir", str(out), "--layer-ids", "1", "2", "4",
            "--batch-size", "4", "--max-seq-len", "512", "--max-samples", "33"]
    store = JobStore(tmp_path / "jobs")
    ops = launch_slurm_job(run_root, store, 3, argv, "llama", env=(f"FIRST_RUN_MARKS={marks}", *ONE_THREAD))
    assert ops.scheduler == "slurm" and ops.record["scheduler_job_id"].isdigit()
    # The record names each rank's run from the submission on (the snapshot only once its directory exists).
    first_run = json.loads((run_root / "jobs" / f"{ops.job}.json").read_text())["ranks"][1]["run"]
    app = DashboardApp("local", job=ops)

    async def scenario():
        async with app.run_test(size=(120, 30), notifications=True) as pilot:
            screen = await wait_until(pilot, lambda: fleet_screen(app), 30, what="the fleet view")
            # Two CPUs, three ranks of one CPU: two run while the third waits for a CPU.
            await wait_until(pilot, lambda: sorted(states(screen)) == ["PENDING", "RUNNING", "RUNNING"], 120,
                             what="two ranks RUNNING and one PENDING")
            await wait_until(pilot, lambda: "PENDING" in screen_text(app) and "RUNNING" in screen_text(app), 30,
                             what="the painted states")
            waiting = next(row for row in screen.fleet.snapshot().rows if row.state == "PENDING")
            assert waiting.run is None and waiting.outcome == "pending"  # a rank that waits has no run yet
            # Rank 1 dies part-way: Slurm's word is FAILED, the row says why.
            await wait_until(pilot, lambda: states(screen)[1] == "FAILED" and rows(screen)[1].outcome
                             == "failed" and rows(screen)[1].end_text == "exit code 3", JOB_WAIT_S,
                             what="rank 1 FAILED with exit code 3")
            assert rows(screen)[1].run == first_run and rows(screen)[1].root_cause
            await wait_until(pilot, lambda: any(m.startswith("rank 1 on ") and "failed" in m
                                                for m in notifications(app)), 30, what="the alert")
            await pilot.press("down", "r")
            await wait_until(pilot, lambda: any(m == "rank 1 resubmitted" for m in notifications(app)), 60,
                             what="the resubmission")
            await wait_until(pilot, lambda: rows(screen)[1].run not in (None, first_run), JOB_WAIT_S,
                             what="rank 1's new run")
            assert rows(screen)[1].restart_of == first_run
            await wait_until(pilot, lambda: states(screen) == ["COMPLETED"] * 3
                             and screen.fleet.snapshot().state == "done", JOB_WAIT_S, what="every rank COMPLETED")
            await wait_until(pilot, lambda: "DONE" in screen_text(app) and "33/33" in screen_text(app), 30,
                             what="the painted end")
            view = screen.fleet.snapshot()
            assert [(row.phase, row.outcome, row.total) for row in view.rows] == [("done", "done", 11)] * 3
            assert all(row.where == slurm_env.node for row in view.rows)
            resumed = screen.fleet.rank_model(1).snapshot().extraction.resumed
            assert resumed >= 4  # what the first run wrote was kept, not written again

    try:
        asyncio.run(scenario())
    finally:
        ops.pool.close()
    assert len(list(out.glob("hs_*.safetensors"))) == 33
    record = json.loads((run_root / "jobs" / f"{ops.job}.json").read_text())
    assert [attempt["run"] for attempt in record["ranks"][1]["attempts"]] == [first_run]
    with Connection("local", run_root=str(run_root)) as connection:
        assert connection.status(record["ranks"][1]["run"])["exit"]["code"] == 0
        assert connection.status(first_run)["exit"]["code"] == 3


def test_c_and_the_confirm_scancel_a_slurm_job_and_every_row_reads_cancelled(slurm_env, run_root, tmp_path, capsys):
    store = JobStore(tmp_path / "jobs")
    ops = launch_slurm_job(run_root, store, 3, [sys.executable, "-u", "-c", TICKING_RANK], "ticking")
    app = DashboardApp("local", job=ops)

    async def scenario():
        async with app.run_test(size=(100, 30), notifications=True) as pilot:
            screen = await wait_until(pilot, lambda: fleet_screen(app), 30, what="the fleet view")
            await wait_until(pilot, lambda: sorted(states(screen)) == ["PENDING", "RUNNING", "RUNNING"], 120,
                             what="two ranks RUNNING and one PENDING")
            running = [row.rank for row in screen.fleet.snapshot().rows if row.state == "RUNNING"]
            await wait_until(pilot, lambda: all(has_log(screen, rank) for rank in running), 60,
                             what="the running ranks' logs")
            await pilot.press("c")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, what="the confirm")
            await pilot.press("y")
            await wait_until(pilot, lambda: states(screen) == ["CANCELLED"] * 3
                             and screen.fleet.snapshot().state == "cancelled", 90, what="every rank CANCELLED")
            # The ranks that ran end with the signal scancel sent; the one that waited never ran.
            ended = [("cancelled", "stopped by the operator (SIGTERM)" if row.rank in running else None)
                     for row in screen.fleet.snapshot().rows]
            await wait_until(pilot, lambda: [(row.outcome, row.end_text) for row in screen.fleet.snapshot().rows]
                             == ended, 60, what=f"the ranks' ends {ended}")
            await wait_until(pilot, lambda: "CANCELLED" in screen_text(app), 30, what="the painted state")
            assert not [m for m in notifications(app) if "failed" in m]  # a cancel rings nothing
            await pilot.press("q")
            await wait_until(pilot, lambda: app.return_value is not None, 30, what="the exit")

    try:
        asyncio.run(scenario())
    finally:
        ops.pool.close()
    assert app.return_value == ("job", ops.job, "cancelled", "3 cancelled")
    array = int(ops.record["scheduler_job_id"])
    assert {j["job_state"] for j in slurm_env.jobs() if j["array_job_id"] == array} == {"CANCELLED"}


def has_log(screen, rank: int) -> bool:
    model = screen.fleet.rank_model(rank)
    return model is not None and model.snapshot().log_bytes > 0
