"""Keys on the run screen against real local runs: stop, stop-and-quit, restart, detach and reattach, read-only."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("textual")

from agent_support import run_root  # noqa: F401  (fixture)
from app_support import screen_text, wait_until, whole_log_arrived
from test_app_local import extract_argv, run_screen

from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
from eaglewatch.tui.app.screens.dialogs import ConfirmScreen, HelpScreen, RestartScreen
from eaglewatch.tui.connection import Connection

# A job that runs until stopped and says so: a numbered line every 50 ms.
TICKER = [sys.executable, "-u", "-c",
          "import time\nfor i in range(100000):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.05)\n"]


def status(run_root, run):
    with Connection("local", run_root=str(run_root)) as connection:
        return connection.status(run)


def launch_app(run_root, argv=TICKER, **kwargs):
    return DashboardApp("local", launch=LaunchRequest(argv, name="ticker"),
                        connect_kwargs={"run_root": str(run_root)}, **kwargs)


async def open_screen(pilot, app):
    screen = await wait_until(pilot, lambda: run_screen(app), 60, what="run screen")
    await wait_until(pilot, lambda: screen.model.snapshot().log_last_seq > 3, 30, what="first lines")
    return screen


def notifications(app) -> list[str]:
    return [n.message for n in app._notifications]


def test_stop_asks_first_then_stops_the_job(run_root):
    app = launch_app(run_root)

    async def scenario():
        async with app.run_test(size=(100, 30), notifications=True) as pilot:
            screen = await open_screen(pilot, app)
            for key in ("n", "escape", "enter"):  # each cancels: Enter presses the focused button, Cancel
                await pilot.press("s")
                await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, what="confirm")
                await wait_until(pilot, lambda: "y stop · n/Esc cancel" in screen_text(app), 30, what="its keys")
                await pilot.press(key)
                await wait_until(pilot, lambda: app.screen is screen, 30, what=f"the dialog closed by {key}")
                # The dialog's answer is handled as it closes: a stop would have started its command worker by now.
                assert not [worker for worker in app.workers if worker.group == "command"], key
                assert status(run_root, screen.run_id)["state"] == "running"
            await pilot.press("s")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, what="confirm")
            await pilot.press("y")
            await wait_until(pilot, lambda: screen.model.snapshot().exit_text, 30, what="the stop")
            view = screen.model.snapshot()
            # The operator's stop reads as one: not FAILED, not an alert.
            assert view.exit_text == "stopped by the operator (SIGTERM)" and view.phase == "stopped"
            assert "failed" not in view.marks and not screen.model.alerts_since(0)
            final = status(run_root, screen.run_id)
            assert final["state"] == "exited" and final["exit"]["stopped"] is True
            assert final["exit"]["signal_name"] == "SIGTERM"
            await wait_until(pilot, lambda: "STOPPED" in screen_text(app)
                             and "stopped by the operator (SIGTERM)" in screen_text(app), 30, what="the painted end")
            assert "FAILED" not in screen_text(app)

    asyncio.run(scenario())


def test_stop_and_quit_stops_the_job_then_exits(run_root):
    app = launch_app(run_root)

    async def scenario():
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_screen(pilot, app)
            run = screen.run_id
            await pilot.press("Q")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, what="confirm")
            await pilot.press("y")
            await wait_until(pilot, lambda: app.return_value is not None, 30, what="exit")
        return run

    run = asyncio.run(scenario())
    assert app.return_value == ("stopped", run)
    assert status(run_root, run)["state"] == "exited"


def test_detach_leaves_the_job_running_and_reattach_rebuilds_the_view(tiny_llama, prepared_data, run_root,
                                                                       tmp_path):
    app = launch_app(run_root, extract_argv(tiny_llama, prepared_data, tmp_path / "out"))

    async def first():
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="run screen")
            await wait_until(pilot, lambda: screen.model.snapshot().phases_seen, 60, what="first phase")
            await pilot.press("q")
            await wait_until(pilot, lambda: app.return_value is not None, 30, what="exit")
            return screen.run_id

    run = asyncio.run(first())
    assert app.return_value == ("detached", run)
    # The job outlived the dashboard: it goes on to a normal end, not a signal.
    with Connection("local", run_root=str(run_root)) as connection:
        watch = connection.watch(run)
        assert watch.finished.wait(90)
        final = connection.status(run)
    assert final["exit"] == {**final["exit"], "code": 0}

    again = DashboardApp("local", run=run, connect_kwargs={"run_root": str(run_root)})

    async def second():
        async with again.run_test(size=(160, 48)) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(again), 30, what="run screen")
            await wait_until(pilot, lambda: screen.model.snapshot().phase == "done", 30, what="replayed view")
            # The events can be ahead of the log: wait for all of it before reading what the log shows.
            await wait_until(pilot, lambda: whole_log_arrived(screen, run_root), 30, what="the whole log")
            view = screen.model.snapshot()
            assert view.run == run and view.phases_seen == ("validating", "loading", "extracting", "done")
            assert (view.extraction.done, view.extraction.total) == (64, 64)
            assert any(bar.desc == "Loading weights" and bar.done for bar in view.load)
            # The screen repaints at its own pace after the model moved: wait for the painted figure.
            await wait_until(pilot, lambda: "64/64" in screen_text(again), 30, what="the painted view")

    asyncio.run(second())


def test_restart_from_the_keyboard_with_edited_arguments(run_root):
    app = launch_app(run_root)

    async def scenario():
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_screen(pilot, app)
            old = screen.run_id
            await pilot.press("r")
            dialog = await wait_until(pilot, lambda: isinstance(app.screen, RestartScreen) and app.screen, 30,
                                      what="restart dialog")
            field = dialog.query_one("#argv")
            assert "tick" in field.value
            await pilot.press("tab")  # focus starts on Cancel; Tab goes round to the arguments
            assert dialog.focused is field
            field.value = field.value.replace("tick {i}", "tock {i}")
            await pilot.press("enter")  # in the field: checks the arguments and moves to Restart
            await wait_until(pilot, lambda: dialog.focused is dialog.query_one("#restart"), 30,
                             what="Restart focused")
            assert app.screen is dialog  # nothing restarted yet
            await pilot.press("enter")
            new_screen = await wait_until(pilot, lambda: run_screen(app) is not screen and run_screen(app), 60,
                                          what="the new run's screen")
            await wait_until(pilot, lambda: "tock" in screen_text(app), 30, what="the new run's output")
            new = new_screen.run_id
            assert new != old
            assert new_screen.model.snapshot().restart_of == old
            assert status(run_root, old)["state"] == "exited"
            assert status(run_root, new)["state"] == "running"
            await pilot.press("Q")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, what="confirm")
            await pilot.press("y")
            await wait_until(pilot, lambda: app.return_value is not None, 30, what="exit")

    asyncio.run(scenario())


def test_read_only_refuses_every_key_that_changes_the_job(run_root):
    app = launch_app(run_root, read_only=True)

    async def scenario():
        async with app.run_test(size=(100, 30), notifications=True) as pilot:
            screen = await open_screen(pilot, app)
            for key, what in (("r", "restart"), ("s", "stop"), ("Q", "stop and quit")):
                await pilot.press(key)
                # The refusal is the key's whole effect: once it is noted, no dialog came up instead. Each key's
                # own message is awaited: toasts expire, so on a slow machine an earlier one may be gone already.
                message = f"read-only: {what} refused"
                await wait_until(pilot, lambda message=message: message in notifications(app), 30,
                                 what=f"the refusal of {key}")
                assert app.screen is screen, f"{key} opened {app.screen!r}"
            assert status(run_root, screen.run_id)["state"] == "running"
            # Looking is still allowed: help, full-screen log, and detaching.
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), 30, what="help")
            await wait_until(pilot, lambda: "read-only" in screen_text(app), 30, what="the painted read-only note")
            await pilot.press("escape")
            await pilot.press("l")
            await wait_until(pilot, lambda: screen.maximized is screen.query_one("#log"), 30, what="full-screen log")
            await pilot.press("q")
            await wait_until(pilot, lambda: app.return_value is not None, 30, what="exit")
            return screen.run_id

    run = asyncio.run(scenario())
    assert app.return_value == ("detached", run)
    assert status(run_root, run)["state"] == "running"  # the fixture's clean-up stops it
