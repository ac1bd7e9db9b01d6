"""The failure panel and the traceback screen with a provisional failure: painted when the exception line arrives,
marked, refined and closed in place while the traceback screen is open, and alerted once."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("textual")

from app_support import screen_text, wait_until
from test_runstate_provisional import CHAINED_PART, RERAISE, Clock, reraise_lines, traceback_lines, worker

from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.dialogs import TracebackScreen
from eaglewatch.tui.app.screens.run import RunScreen
from eaglewatch.tui.app.widgets.render import PROVISIONAL_MARK
from eaglewatch.tui.runstate import RunModel


class RecordingApp(DashboardApp):
    """The dashboard, noting each notification and bell (toasts expire, and a slow machine outlives them)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.told: list[str] = []
        self.bells = 0

    def notify(self, message: str, **kwargs) -> None:
        self.told.append(message)
        super().notify(message, **kwargs)

    def bell(self) -> None:
        self.bells += 1


def test_a_provisional_failure_is_painted_at_once_and_refined_in_place():
    clock = Clock()
    model = RunModel("gpu-box", {"run": "20251130-041140-3f9a2c-extract", "state": "running"}, clock=clock,
                     wall=lambda: 100.0)
    app = RecordingApp("gpu-box", model=model)
    *head, exc = traceback_lines(11, 0, "AssertionError: crash one")

    async def scenario():
        async with app.run_test(size=(100, 30), notifications=True) as pilot:
            screen = await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen, 30,
                                      what="the run screen")
            model.feed_log(b"".join(head))
            await wait_until(pilot, lambda: "Traceback (most recent" in screen_text(app), 30, what="the log lines")
            assert "AssertionError: crash one" not in screen_text(app)

            model.feed_log(exc)
            await wait_until(pilot, lambda: "1. AssertionError: crash one" in screen_text(app)
                             and PROVISIONAL_MARK in screen_text(app), 30, what="the provisional failure")
            await wait_until(pilot, lambda: app.bells == 1, 30, what="the failure's alert")

            await pilot.press("f")
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, TracebackScreen)
                             and "traceback so far" in screen_text(app), 30, what="the traceback so far")

            # The chained part arrives while the screen is open: it grows in place.
            model.feed_log(b"".join(worker(11, 0, part.decode()) for part in CHAINED_PART))
            await wait_until(pilot, lambda: "RuntimeError: worker step failed" in screen_text(app)
                             and "direct cause" in screen_text(app), 30, what="the refined traceback")
            # The worker went quiet: 2 s later the report is closed, and the screen says so.
            clock.now = 3.0
            model.tick()
            await wait_until(pilot, lambda: "full traceback" in screen_text(app)
                             and PROVISIONAL_MARK not in screen_text(app), 30, what="the closed traceback")
            await pilot.press("escape")
            await pilot.press("f")
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and not screen.maximized
                             and "1. RuntimeError: worker step failed" in screen_text(app), 30,
                             what="the closed failure in the panel")
            text = screen_text(app)
            assert PROVISIONAL_MARK not in text and "2. " not in text
            assert screen.query_one("FailurePanel").highlighted == 0
            return app.bells, [m for m in app.told if m.startswith("failure in")]

    bells, told = asyncio.run(scenario())
    assert bells == 1 and told == ["failure in VllmWorker TP0: AssertionError: crash one"]


def test_two_failures_in_two_lanes_each_ring_once():
    clock = Clock()
    model = RunModel("gpu-box", {"run": "r", "state": "running"}, clock=clock, wall=lambda: 100.0)
    app = RecordingApp("gpu-box", model=model)

    async def scenario():
        async with app.run_test(size=(100, 30), notifications=True) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 30, what="the run screen")
            model.feed_log(b"".join(reraise_lines()))
            await wait_until(pilot, lambda: app.bells == 1, 30, what="the re-raise's alert")
            model.feed_log(b"".join(traceback_lines(12, 1, "ValueError: bad shape", where="/srv/v.py", line=30)))
            await wait_until(pilot, lambda: app.bells == 2, 30, what="the new root cause's alert")
            clock.now = 5.0
            model.tick()
            await wait_until(pilot, lambda: "1. ValueError: bad shape" in screen_text(app)
                             and PROVISIONAL_MARK not in screen_text(app), 30, what="both closed")
            # The redraw that painted the closed failures also posted any alert they raised: none may follow.
            return app.bells, [m for m in app.told if m.startswith("failure in")]

    bells, told = asyncio.run(scenario())
    assert bells == 2 and told == [f"failure in EngineCore: {RERAISE}",
                                   "failure in VllmWorker TP1: ValueError: bad shape"]
