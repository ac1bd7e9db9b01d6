"""A job that fills its disk still leaves its exit status: the run ends as "exit code 3, disk full", not as lost.

A real small filesystem (a 1 MiB tmpfs) holds the run directory and the job's output, as when a job writes to the
disk its runs live on. Mounting needs root; where that is refused the case is not checked (skipped, saying so)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from disk_support import small_filesystem

from agent_support import PYTHON, stop_leftovers, wait_for
from eaglewatch.pipeline.agent.rundir import RunDir
from eaglewatch.tui.connection import Connection
from eaglewatch.tui.runend import run_end

FILL = textwrap.dedent(
    """
    import os, sys
    try:
        with open(sys.argv[1], "wb") as fh:
            while True:
                fh.write(b"x" * 65536)
                fh.flush()
    except OSError:
        pass
    os._exit(3)  # what eaglewatch extract exits with on a full disk (DiskFull)
    """
)


@pytest.fixture
def small_disk(tmp_path: Path):
    with small_filesystem(tmp_path / "small", "1m") as mount:
        yield mount
        stop_leftovers(mount / "runs")


def test_a_job_that_fills_the_disk_ends_with_its_exit_status_and_disk_full(small_disk: Path) -> None:
    connection = Connection("local", run_root=str(small_disk / "runs"), backoff_initial_s=0.02)
    connection.connect()
    try:
        summary = connection.launch([PYTHON, "-c", FILL, str(small_disk / "output.bin")], name="filler")
        run = RunDir(small_disk / "runs" / summary["run"])
        wait_for(lambda: connection.status(summary["run"])["state"] in ("exited", "lost"), timeout_s=60,
                 what="the run's end")
        state = connection.status(summary["run"])
    finally:
        connection.close()
    assert state["state"] == "exited", state
    exit_info = run.exit_info()
    assert exit_info["code"] == 3 and exit_info["disk_full"] is True, exit_info
    end = run_end(state["state"], exit_info)
    assert end is not None and end.text == "exit code 3, disk full" and end.failed and end.status == 3
