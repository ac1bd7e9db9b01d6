"""Hostile text from a job's hosts and scheduler (names, hosts, nodes, states, reasons, errors) on the fleet view and in
``eaglewatch job status``: shown visibly, never obeyed, never read as markup."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("textual")

from app_support import screen_text, wait_until
from hostile_support import CSI_CLEAR, HOSTILE, OSC0_TITLE, OSC52_CLIPBOARD, SHOWN, assert_safe

from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.fleet import FleetScreen
from eaglewatch.tui.commands.job import print_status, rows_of
from eaglewatch.tui.runstate.fleet import FleetModel

MARKUP = "[@click=app.quit]click me[/]"


def hostile_snapshot() -> dict:
    every = "".join(HOSTILE)
    return {
        "job": f"job{CSI_CLEAR}", "name": f"name {OSC0_TITLE} {MARKUP}", "scheduler": "slurm",
        "target": f"login{OSC52_CLIPBOARD}", "created_at": 1_000.0, "world_size": 2, "output_dir": f"/out{every}",
        "scheduler_job_id": f"7{CSI_CLEAR}", "scheduler_error": f"squeue said {every}",
        "ranks": [
            {"rank": 0, "host": None, "run": None, "node": f"node{every}", "sched_state": f"FAILED{CSI_CLEAR}",
             "sched_reason": None, "pending_s": None, "error": f"{MARKUP} boom {every}", "summary": None},
            {"rank": 1, "host": None, "run": None, "node": None, "sched_state": "PENDING",
             "sched_reason": f"Resources{OSC0_TITLE}", "pending_s": 5.0, "summary": None},
        ],
    }


def test_the_fleet_view_shows_hostile_text_visibly():
    fleet = FleetModel()
    fleet.set_snapshot(hostile_snapshot())
    app = DashboardApp("login", fleet=fleet)

    async def scenario():
        async with app.run_test(size=(200, 30), notifications=True) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen.redraws > 0, 30,
                             what="the fleet view")
            await wait_until(pilot, lambda: "click me" in screen_text(app), 30, what="the painted rows")
            text = screen_text(app)
            assert_safe(text, what="the painted fleet view")
            assert f"job{SHOWN[CSI_CLEAR]}" in text and MARKUP in text  # markup shown as itself, not run
            assert f"squeue said {SHOWN[HOSTILE[0]]}" in text
            # The alert names the rank's host and error: through the same rule.
            assert app._notifications and all(not [c for c in n.message if c == "\x1b"] for n in app._notifications)
            assert any(SHOWN[OSC52_CLIPBOARD] in n.message for n in app._notifications)

    asyncio.run(scenario())
    assert app.return_value is None  # the markup's click never quit it


def test_job_status_prints_hostile_text_visibly(capsys):
    print_status(rows_of(hostile_snapshot()))
    out = capsys.readouterr().out
    assert_safe(out, what="job status")
    assert f"job{SHOWN[CSI_CLEAR]}" in out and SHOWN[OSC0_TITLE] in out
