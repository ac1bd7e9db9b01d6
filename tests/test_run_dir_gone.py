"""A run directory deleted under a live job: the agent tells the truth from the job's own processes (running, its
directory gone), and `runs`, `attach`, `stop` and the dashboard say so instead of calling the run lost; once the
processes are gone too, the run is lost and the words say why no exit status exists."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_support import PYTHON, Collected, run_root, wait_for  # noqa: F401  (run_root: fixture)
from conftest import run_cli

from eaglewatch.pipeline.agent import procs
from eaglewatch.tui.connection import Connection
from eaglewatch.tui.runend import LOST_DIR_GONE_TEXT, LOST_TEXT

TICKER = [PYTHON, "-u", "-c", "import time\nfor i in range(100000):\n    print(f'tick {i}', flush=True)\n"
          "    time.sleep(0.05)\n"]


def job_pids(run: str) -> list[int]:
    return [found.pid for found in procs.marked_processes() if found.run_id == run]


def test_the_agent_runs_attach_and_stop_tell_the_truth(run_root: Path, tmp_path: Path):
    env = {"HOME": str(tmp_path), "EAGLEWATCH_CONFIG": ""}
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch(TICKER, name="doomed dir")["run"]
        watch = connection.watch(run)
        got = Collected()

        def seen(predicate) -> bool:
            got.take(watch.get(timeout=0.1))
            return predicate()

        wait_for(lambda: seen(lambda: b"tick 3" in got.log), what="the first ticks")
        attach = subprocess.Popen([sys.executable, "-m", "eaglewatch", "attach", "local", run, "--run-root",
                                   str(run_root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env={**os.environ, **env})
        try:
            assert os.read(attach.stdout.fileno(), 1)  # attached while the directory is still there
            shutil.rmtree(run_root / run)
            wait_for(lambda: seen(lambda: any(s.summary.get("run_dir_gone") for s in got.states)), timeout_s=60,
                     what="the job state that says the directory is gone")
            gone = [s for s in got.states if s.summary.get("run_dir_gone")][0]
            assert gone.state == "running" and gone.summary["pid"] in job_pids(run)
            size = len(got.log)
            wait_for(lambda: seen(lambda: len(got.log) > size + 50), what="the log still streaming")
            status = connection.status(run)  # found by id although its directory is gone
            assert status["state"] == "running" and status["run_dir_gone"] is True
            listed = run_cli("runs", "local", "--run-root", run_root, env=env)
            assert listed.returncode == 0, listed.stderr
            [line] = [line for line in listed.stdout.splitlines() if line.startswith(run)]
            assert line.split()[1] == "running" and "run directory gone" in line and "lost" not in line
            stopped = run_cli("stop", "local", run, "--run-root", run_root, "--grace", "2", env=env)
            assert stopped.returncode == 0, stopped.stderr
            assert stopped.stdout == f"{run}\t{LOST_DIR_GONE_TEXT}\n"
            assert job_pids(run) == []
            # Finished and drained: the batch that ends the watch may still be queued when `finished` is set.
            wait_for(lambda: seen(lambda: watch.finished.is_set() and watch.queue.empty()), what="the watch's end")
            assert got.states[-1].state == "lost" and got.states[-1].summary["run_dir_gone"] is True
            _, err = attach.communicate(timeout=60)
        finally:
            if attach.poll() is None:
                attach.kill()
                attach.wait()
    assert attach.returncode == 1
    assert LOST_DIR_GONE_TEXT in err.decode() and LOST_TEXT not in err.decode()
    # Once nothing of it lives, a vanished run is no longer listed: there is nothing left to show.
    listed = run_cli("runs", "local", "--run-root", run_root, env=env)
    assert run not in listed.stdout


def test_the_dashboard_marks_the_gone_directory_and_not_lost(run_root: Path):
    pytest.importorskip("textual")
    from app_support import screen_text, wait_until
    from test_app_local import run_screen

    from eaglewatch.tui.app.app import DashboardApp

    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch(TICKER, name="doomed dir")["run"]
        wait_for(lambda: connection.status(run)["state"] == "running", what="the ticker running")
    app = DashboardApp("local", run=run, connect_kwargs={"run_root": str(run_root)})

    async def scenario():
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="the run screen")
            await wait_until(pilot, lambda: "tick 3" in screen_text(app), 30, what="the first ticks")
            shutil.rmtree(run_root / run)
            await wait_until(pilot, lambda: "⚑ run directory gone" in screen_text(app), 60,
                             what="the header's mark")
            text = screen_text(app)
            assert "LOST" not in text and "lost" not in text.split("\n")[0]
            assert any("run directory" in n.message and "still runs" in n.message for n in app._notifications)
            assert screen.model.snapshot().job_state == "running"
            with Connection("local", run_root=str(run_root)) as connection:
                connection.stop(run, grace_s=2)
            await wait_until(pilot, lambda: "LOST" in screen_text(app), 60, what="lost, once nothing lives")
            assert screen.model.snapshot().exit_text == LOST_DIR_GONE_TEXT
            await pilot.press("q")

    asyncio.run(scenario())
    assert job_pids(run) == []
