"""A crash run: `eaglewatch demo --fault` (the real vLLM engine, a worker failing a bare assert) under the
dashboard. The failure panel must put the worker's AssertionError first, with its source line, and alert."""

from __future__ import annotations

import argparse
import asyncio

import pytest

pytest.importorskip("textual")
pytest.importorskip("vllm")

from agent_support import run_root  # noqa: F401  (fixture)
from app_support import screen_text, wait_until, whole_log_arrived
from test_app_local import run_screen

from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
from eaglewatch.tui.app.embedded import demo_argv
from eaglewatch.tui.app.screens.dialogs import TracebackScreen

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def alerts(app) -> list[str]:
    """The toasts on screen now."""
    return [n.message for n in app._notifications]


def record_alerts(app) -> list[str]:
    """Every notification the app posts, kept: a toast expires, and leaves the screen, long before a slow run ends."""
    posted: list[str] = []
    notify = app.notify

    def keep(message, *args, **kwargs):
        posted.append(str(message))
        return notify(message, *args, **kwargs)

    app.notify = keep
    return posted


def test_demo_fault_shows_the_worker_assert_as_root_cause(run_root, tmp_path):
    args = argparse.Namespace(workdir=str(tmp_path / "demo"), engine="vllm", tp_size=1, fault=True)
    app = DashboardApp("local", launch=LaunchRequest(demo_argv(args), name="demo-fault"),
                       connect_kwargs={"run_root": str(run_root)})
    posted = record_alerts(app)

    async def scenario():
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="run screen")
            await wait_until(pilot, lambda: screen.model.snapshot().failures, 240, step_s=0.5,
                             what="a decoded failure")
            await wait_until(pilot, lambda: screen.model.snapshot().exit_text, 180, what="the run's end")
            # vLLM's shutdown output may still be on its way after the exit: wait for all of the run's log.
            await wait_until(pilot, lambda: whole_log_arrived(screen, run_root), 60, what="the whole log")
            # The screen posts the model's alerts at its next redraw.
            await wait_until(pilot, lambda: any(m.startswith("failure in") for m in posted), 30,
                             what="the failure alert")
            view = screen.model.snapshot()
            root = view.failures[0]
            assert root.summary.startswith("AssertionError at vllm_connector.py")
            assert root.source_line == "assert self._writes_submitted < self._fault_after"
            assert "Worker" in root.lanes and root.tier == "original"
            # What re-raised it comes after, marked as such.
            assert all(f.tier != "original" or "Worker" in f.lanes for f in view.failures[1:])
            assert view.phase == "failed" and "failed" in view.marks and view.exit_code
            assert "loading" in view.phases_seen and "extracting" in view.phases_seen
            assert any(m.startswith("failure in") and "AssertionError" in m for m in posted)

            def failure_painted() -> bool:
                # Readable at 80x24 once no toast covers it; an alert posted after the clearing (the run's end)
                # is cleared too, and the screen read again after its repaint.
                if alerts(app):
                    app.clear_notifications()
                    return False
                text = screen_text(app)
                return "FAILED" in text and "AssertionError at vllm_connector.py" in text

            await wait_until(pilot, failure_painted, 30, what="the painted failure")
            await pilot.press("f")
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, TracebackScreen), 30, what="traceback")
            await wait_until(pilot, lambda: "Traceback (most recent call last)" in screen_text(app)
                             and "_submit" in screen_text(app), 30, what="the painted traceback")
            await pilot.press("escape")
            await pilot.press("q")
            await wait_until(pilot, lambda: app.return_value is not None, 30, what="exit")
            return screen.run_id

    run = asyncio.run(scenario())
    # Leaving a run that has ended says how it ended, not that it keeps running.
    assert app.return_value == ("left", run, "exit code 1")
