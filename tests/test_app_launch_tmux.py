"""`eaglewatch launch` in a real terminal (tmux): it launches on a named host, then the dashboard opens on the run;
`q` detaches with the way back in the operator's own words."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from agent_support import PYTHON, run_root  # noqa: F401  (run_root: fixture)
from test_app_tmux import tmux, wait_for_screen  # noqa: F401  (tmux: fixture)

from eaglewatch.tui.connection import Connection

pytestmark = pytest.mark.slow

TICKER = "import time\nfor i in range(100000):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.05)\n"


def test_launch_on_a_terminal_opens_the_dashboard_on_the_new_run(tmux, run_root: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.box]\ntarget = "local"\nrun_root = "{run_root}"\n')
    env = {"HOME": str(tmp_path), "EAGLEWATCH_CONFIG": "", "TERM": "xterm-256color", "PYTHONPATH": os.getcwd()}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    launch = shlex.join([sys.executable, "-m", "eaglewatch", "launch", "box", "--config", str(config),
                         "--name", "ticker", "--", PYTHON, "-u", "-c", TICKER])
    tmux("new-session", "-d", "-s", "demo", "-x", "100", "-y", "30", f"env {exports} {launch}; echo EXIT=$?; sleep 60")
    screen = wait_for_screen(tmux, lambda s: "tick 3" in s, 60, "the new run's log in the dashboard")
    assert "box" in screen and "ticker" in screen
    tmux("send-keys", "-t", "demo", "q")
    screen = wait_for_screen(tmux, lambda s: "EXIT=" in s, 20, "the dashboard's exit")
    with Connection("local", run_root=str(run_root)) as connection:
        (summary,) = connection.runs()
        assert summary["state"] == "running"  # detached: it keeps running
        connection.stop(summary["run"], grace_s=1)
    run = summary["run"]
    assert "EXIT=0" in screen and f"detached from {run} on box" in screen.replace("\n", "")
    # The hint names the command as this shell can run it: `eaglewatch` on the PATH, else its absolute path.
    assert re.search(r"Reattach: \S*eaglewatch box " + re.escape(run), screen.replace("\n", ""))
