"""The dashboard on a hung job (Pilot, a real local agent and run): the stall alert fires, the dashboard takes the
stacks of every process itself, and `k` shows where each is stuck."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

pytest.importorskip("textual")

from agent_support import run_root  # noqa: F401  (fixture)
from app_support import screen_text, wait_until
from test_app_local import run_screen

from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
from eaglewatch.tui.app.screens.dialogs import StacksScreen
from eaglewatch.tui.runstate.model import Thresholds

BLOCKED = textwrap.dedent("""\
    import threading

    def waits_for_a_peer():
        threading.Event().wait()

    print("about to block", flush=True)
    waits_for_a_peer()
    """)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_stall_takes_the_stacks_and_k_shows_the_blocking_frame(run_root, tmp_path, size):
    script = tmp_path / "hung.py"
    script.write_text(BLOCKED)
    app = DashboardApp("local", launch=LaunchRequest([sys.executable, str(script)], name="hung"),
                       connect_kwargs={"run_root": str(run_root)}, thresholds=Thresholds(stall_after_s=2.0))
    posted: list[str] = []
    notify = app.notify

    def keep(message, *args, **kwargs):
        posted.append(str(message))
        return notify(message, *args, **kwargs)

    app.notify = keep  # type: ignore[method-assign]

    async def scenario():
        async with app.run_test(size=size, notifications=True) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="run screen")
            await wait_until(pilot, lambda: any(m.startswith("no progress for") for m in posted), 60,
                             what="the stall alert")
            assert "stalled" in screen.model.snapshot().marks

            def taken():
                stacks = screen.model.stacks()
                return stacks is not None and stacks.get("processes")

            # Taken by the dashboard itself when the alert fired: nobody pressed a key.
            await wait_until(pilot, taken, 30, what="the stacks taken at the stall")
            app.clear_notifications()
            await pilot.press("k")
            await wait_until(pilot, lambda: isinstance(app.screen, StacksScreen), 10, what="the stacks screen")
            await wait_until(pilot, lambda: "waits_for_a_peer (hung.py:4)" in screen_text(app), 10,
                             what="the blocking frame on screen")
            text = screen_text(app)
            assert "main" in text and "faulthandler" in text
            await pilot.press("escape")
            await wait_until(pilot, lambda: run_screen(app), 10, what="back to the run")
            app.exit()

    try:
        asyncio.run(scenario())
    finally:
        from eaglewatch.pipeline.agent import jobs
        for run in jobs.run_dirs(run_root):
            jobs.stop(run, 1.0)
