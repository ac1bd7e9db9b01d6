"""The fleet view on real ssh-mode jobs on this machine: real local agents, real runs, the real HF-engine extraction.

One job of two ranks extracts the tiny model's data; its rank 1 dies part-way on its first run, and ``r`` on its row
runs it again, which resumes from the files it wrote; every row then reaches done. Another job has a rank that
finishes and one that runs on until ``c`` and the confirm cancel the job.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("textual")

from agent_support import run_root  # noqa: F401  (fixture)
from app_support import screen_text, wait_until

from eaglewatch.cli import build_parser
from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.dialogs import ConfirmScreen, RestartScreen
from eaglewatch.tui.app.screens.fleet import FleetScreen
from eaglewatch.tui.app.screens.run import RunScreen
from eaglewatch.tui.commands import job as job_command
from eaglewatch.tui.commands.job_hosts import HostPool
from eaglewatch.tui.commands.job_ops import JobOps
from eaglewatch.tui.commands.job_record import JobStore
from eaglewatch.tui.connection import Connection

pytestmark = pytest.mark.slow

# Rank 1's first run: the real extraction, killed (SIGKILL, as a dying node would) once it has written some samples.
# Every later run of it, and every other rank, is the extraction itself.
DYING_RANK = """\
import json, os, subprocess, sys, time
from pathlib import Path
args = sys.argv[1:]
rank = int(args[args.index("--rank") + 1])
first = Path(os.environ["FIRST_RUN_MARKS"]) / f"rank{rank}"
command = [sys.executable, "-m", "eaglewatch", *args]
if rank != 1 or first.exists():
    os.execv(sys.executable, command)
first.touch()
child = subprocess.Popen(command)
events = Path(os.environ["EAGLEWATCH_EVENTS_FILE"])
while child.poll() is None:
    lines = events.read_text().splitlines() if events.exists() else []
    if sum(1 for line in lines if line.strip() and json.loads(line).get("kind") == "sample") >= 4:
        child.kill()
        child.wait()
        print("rank 1: the node went away", flush=True)
        sys.exit(3)
    time.sleep(0.05)
sys.exit(child.returncode)
"""

# Rank 0 is done at once; every other rank runs until it is stopped.
SLOW_RANK = """\
import sys, time
rank = int(sys.argv[sys.argv.index("--rank") + 1])
print(f"rank {rank} starts", flush=True)
while rank:
    print("tick", flush=True)
    time.sleep(0.1)
"""


def job_args(run_root: Path, action: str, *words: str):
    """The job command's arguments as parsed from its command line, with this test's run root."""
    return build_parser("job").parse_args(["job", action, "--run-root", str(run_root), *words])


def launch_job(run_root: Path, store: JobStore, hosts: str, argv: list[str], name: str,
               env: tuple[str, ...] = ()) -> JobOps:
    """``eaglewatch job launch --hosts HOSTS -- ARGV`` as the command does it, then the job's actions."""
    env_words = [word for pair in env for word in ("-e", pair)]
    args = job_args(run_root, "launch", "--hosts", hosts, "--name", name, "--no-tui", *env_words, "--", *argv)
    command, env_pairs = job_command.launch_request(args)
    pool = HostPool(args, interactive=False)
    record = job_command.start(pool, store, args, command, env_pairs)
    return JobOps(record, pool, store)


def fleet_screen(app) -> FleetScreen | None:
    return app.screen if isinstance(app.screen, FleetScreen) else None


def rows(screen: FleetScreen):
    return {row.rank: row for row in screen.fleet.snapshot().rows}


def notifications(app) -> list[str]:
    return [n.message for n in app._notifications]


def test_a_rank_that_died_runs_again_with_r_resumes_and_every_rank_completes(tiny_llama, prepared_data, run_root,
                                                                              tmp_path, capsys):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "dying_rank.py"
    script.write_text(DYING_RANK)
    out = tmp_path / "out"
    argv = [sys.executable, str(script), "extract", "--engine", "hf", "--model-path", str(tiny_llama),
            "--prepared-data", str(prepared_data), "--output-dir", str(out), "--layer-ids", "1", "2", "4",
            "--batch-size", "4", "--max-seq-len", "512", "--max-samples", "32"]
    store = JobStore(tmp_path / "jobs")
    ops = launch_job(run_root, store, "local,local", argv, "llama", env=(f"FIRST_RUN_MARKS={marks}",))
    first_run = ops.record["ranks"][1]["run"]
    app = DashboardApp("local", job=ops)

    async def scenario():
        async with app.run_test(size=(120, 30), notifications=True) as pilot:
            screen = await wait_until(pilot, lambda: fleet_screen(app), 30, what="the fleet view")
            await wait_until(pilot, lambda: rows(screen).get(1) and rows(screen)[1].outcome == "failed", 180,
                             what="rank 1 failed")
            assert rows(screen)[1].root_cause == "exit code 3"
            await wait_until(pilot, lambda: any(m.startswith("rank 1 on local failed") for m in notifications(app)),
                             30, what="the alert")
            # Enter opens a rank's run screen, on its host; Esc comes back.
            await pilot.press("enter")
            run_screen = await wait_until(pilot, lambda: app.screen if isinstance(app.screen, RunScreen) else None,
                                          30, what="rank 0's run screen")
            assert run_screen.run_id == ops.record["ranks"][0]["run"] and run_screen.model is ops_model(screen, 0)
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is screen, 30, what="back on the fleet view")
            await pilot.press("down", "r")
            await wait_until(pilot, lambda: rows(screen)[1].run != first_run, 60, what="rank 1's new run")
            assert rows(screen)[1].restart_of == first_run
            await wait_until(pilot, lambda: screen.fleet.snapshot().state == "done", 180, what="every rank done")
            await wait_until(pilot, lambda: "DONE" in screen_text(app) and "32/32" in screen_text(app), 30,
                             what="the painted end")
            view = screen.fleet.snapshot()
            assert [(row.phase, row.done, row.total) for row in view.rows] == [("done", 16, 16), ("done", 16, 16)]
            # It resumed: the files its first run wrote were kept, not written again.
            resumed = ops_model(screen, 1).snapshot().extraction.resumed
            assert resumed >= 4
            text = screen_text(app)
            assert "samples 32/32" in text and "2 done" in text
        return resumed

    try:
        asyncio.run(scenario())
    finally:
        ops.pool.close()
    # The record follows the rank to its new run; the shared folder holds every sample once.
    record = store.load(ops.job)
    new_run = record["ranks"][1]["run"]
    assert new_run != first_run and record["ranks"][1]["summary"]["restart_of"] == first_run
    assert len(list(out.glob("hs_*.safetensors"))) == 32
    with Connection("local", run_root=str(run_root)) as connection:
        assert connection.status(new_run)["exit"]["code"] == 0
        assert connection.status(first_run)["exit"]["code"] == 3


def ops_model(screen: FleetScreen, rank: int):
    return screen.fleet.rank_model(rank)


def test_c_cancels_the_job_after_the_confirm_and_stops_the_ranks_still_running(run_root, tmp_path, capsys):
    store = JobStore(tmp_path / "jobs")
    ops = launch_job(run_root, store, "local,local,local", [sys.executable, "-u", "-c", SLOW_RANK], "slow")
    app = DashboardApp("local", job=ops)

    async def scenario():
        async with app.run_test(size=(100, 30), notifications=True) as pilot:
            screen = await wait_until(pilot, lambda: fleet_screen(app), 30, what="the fleet view")
            await wait_until(pilot, lambda: [row.outcome for row in rows(screen).values()]
                             == ["done", "running", "running"], 60, what="rank 0 done, the others running")
            # Rank 1 restarted from its own run screen: the fleet view takes its new run over.
            first = rows(screen)[1].run
            await pilot.press("down", "enter")
            opened = await wait_until(pilot, lambda: app.screen if isinstance(app.screen, RunScreen) else None, 30,
                                      what="rank 1's run screen")
            assert opened.run_id == first
            await wait_until(pilot, lambda: "tick" in screen_text(app), 30, what="rank 1's log")
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, RestartScreen), 30, what="the restart dialog")
            await pilot.press("y")
            again = await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen is not opened
                                     and app.screen, 60, what="the new run's screen")
            await wait_until(pilot, lambda: rows(screen)[1].run == again.run_id != first
                             and rows(screen)[1].outcome == "running", 60, what="the fleet on rank 1's new run")
            assert again.model is ops_model(screen, 1) and rows(screen)[1].restart_of == first
            await wait_until(pilot, lambda: store.load(ops.job)["ranks"][1]["run"] == again.run_id, 30,
                             what="the record on the new run")
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is screen, 30, what="back on the fleet view")
            await pilot.press("c")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, what="the confirm")
            await pilot.press("n")  # not yet: nothing is stopped
            await wait_until(pilot, lambda: app.screen is screen, 30, what="the dialog closed")
            assert not [worker for worker in app.workers if worker.group == "fleet-command"]
            await pilot.press("c")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, what="the confirm")
            await pilot.press("y")
            await wait_until(pilot, lambda: screen.fleet.snapshot().state == "cancelled", 60, what="the job cancelled")
            # Each rank's end arrives with its own exit record: wait for all three, not only the job's state.
            stopped = "stopped by the operator (SIGTERM)"
            ended = [("done", "exit code 0"), ("cancelled", stopped), ("cancelled", stopped)]
            await wait_until(pilot, lambda: [(row.outcome, row.end_text) for row in screen.fleet.snapshot().rows]
                             == ended, 60, what=f"the ranks' ends {ended}")
            await wait_until(pilot, lambda: "CANCELLED" in screen_text(app), 30, what="the painted state")
            # A cancel is what the operator asked for: no rank rings as failed.
            assert not [m for m in notifications(app) if "failed" in m]
            await pilot.press("q")
            await wait_until(pilot, lambda: app.return_value is not None, 30, what="the exit")

    try:
        asyncio.run(scenario())
    finally:
        ops.pool.close()
    assert app.return_value == ("job", ops.job, "cancelled", "1 done, 2 cancelled")
    assert store.load(ops.job)["cancelled_at"] is not None
    with Connection("local", run_root=str(run_root)) as connection:
        states = [connection.status(entry["run"]) for entry in store.load(ops.job)["ranks"]]
    assert [s["state"] for s in states] == ["exited"] * 3
    assert states[1]["restart_of"] is not None  # rank 1's run is the one restarted from its run screen
    assert [s["exit"].get("signal_name") for s in states] == [None, "SIGTERM", "SIGTERM"]
    assert [s["exit"].get("stopped") for s in states] == [None, True, True]
    assert [s["exit"].get("stop", {}).get("via") for s in states] == [None, "stop", "stop"]


# ---------------------------------------------------------------------------------------------- the list itself
# On the fixed Slurm job of tests/test_fleet_snapshots.py (no job runs): the columns at both sizes, filtering and
# sorting. Quick, but in this module with the other fleet view tests.

def fixed_fleet_app():
    from test_fleet_snapshots import fixed_fleet

    return DashboardApp("login1", fleet=fixed_fleet())


def shown_ranks(screen: FleetScreen) -> list[int]:
    return [row.rank for row in screen.shown]


async def painted_fleet(pilot, app) -> FleetScreen:
    screen = await wait_until(pilot, lambda: fleet_screen(app), 30, what="the fleet view")
    await wait_until(pilot, lambda: screen.redraws > 0 and "gpu-node-03" in screen_text(app), 30,
                     what="the ranks painted")
    return screen


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
def test_the_fleet_view_fits_and_says_sizes_in_gib(size):
    app = fixed_fleet_app()

    async def scenario():
        async with app.run_test(size=size) as pilot:
            await painted_fleet(pilot, app)
            lines = screen_text(app).splitlines()
            assert all(len(line.rstrip()) <= size[0] for line in lines)
            header = next(line for line in lines if "host/node" in line)
            assert "rank↑" in header and "root cause" in header
            footer = lines[-1]
            for key in ("open", "restart", "cancel", "filter", "sort", "help", "quit"):
                assert key in footer, footer
            text = screen_text(app)
            assert "GPU 29/140 GiB" in text and " GB" not in text  # the selected rank's line: binary units
            if size[0] >= 120:
                assert "GPU mem" in header and "29/140 GiB" in text and "29/281 GiB" in text
            else:
                assert "GPU mem" not in header  # the run screen has it
            await pilot.press("q")

    asyncio.run(scenario())


def test_slash_filters_the_ranks_and_escape_brings_them_back():
    app = fixed_fleet_app()

    async def scenario():
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await painted_fleet(pilot, app)
            await pilot.press("slash", *"Fail")  # FAILED, failed, any case
            await wait_until(pilot, lambda: shown_ranks(screen) == [1] and "1 of 4 ranks" in screen_text(app), 30,
                             what="rank 1 only")
            assert "gpu-node-03" not in screen_text(app).split("1 of 4 ranks")[0]
            await pilot.press("enter")  # keeps it; Enter on the table then opens the rank (here: no run to show)
            await wait_until(pilot, lambda: screen.focused is screen.query_one("#fleet-ranks"), 30,
                             what="the table focused")
            assert shown_ranks(screen) == [1]
            await pilot.press("escape")
            await wait_until(pilot, lambda: shown_ranks(screen) == [0, 1, 2, 3], 30, what="every rank back")
            await pilot.press("slash", *"resources")  # Slurm's reason, in the last column
            await wait_until(pilot, lambda: shown_ranks(screen) == [3], 30, what="the pending rank")
            await pilot.press("escape")
            await wait_until(pilot, lambda: shown_ranks(screen) == [0, 1, 2, 3], 30, what="cleared from the line")
            await pilot.press("q")

    asyncio.run(scenario())


def test_o_sorts_by_each_column_shown_and_the_selection_stays_on_its_rank():
    app = fixed_fleet_app()

    async def scenario():
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await painted_fleet(pilot, app)
            await pilot.press("down", "down")
            await wait_until(pilot, lambda: screen.selected() and screen.selected().rank == 2, 30, what="rank 2")
            expected = [
                ("host/node↑", [0, 1, 2, 3]),  # rank 3 has no node yet: last
                ("state↑", [2, 1, 3, 0]),  # COMPLETED, FAILED, PENDING, RUNNING
                ("phase↑", [3, 0, 2, 1]),  # pending, running, done, failed
                ("samples↓", [0, 1, 2, 3]),  # the furthest along first; none known last
                ("tokens/s↓", [0, 1, 2, 3]),
                ("root cause↑", [1, 3, 0, 2]),  # GPU mem is not shown at 80 columns: skipped
                ("rank↑", [0, 1, 2, 3]),
            ]
            for label, ranks in expected:
                await pilot.press("o")
                await wait_until(pilot, lambda ranks=ranks, label=label: shown_ranks(screen) == ranks
                                 and label in screen_text(app), 30, what=f"sorted by {label}")
                assert screen.selected().rank == 2
            await pilot.press("o", "o", "O")  # state, reversed
            await wait_until(pilot, lambda: shown_ranks(screen) == [0, 3, 1, 2] and "state↓" in screen_text(app), 30,
                             what="sorted by state, reversed")
            # Keys act on the rank selected, wherever the sort put it.
            await pilot.press("enter")
            await wait_until(pilot, lambda: any("rank 2 has no run to show" in m for m in notifications(app)), 30,
                             what="Enter on rank 2")
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: "reverse the sort" in screen_text(app), 30, what="the help")
            await pilot.press("escape")
            await pilot.press("q")

    asyncio.run(scenario())
