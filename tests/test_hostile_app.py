"""The dashboard on hostile runs, under the real local agent, read from the painted screen: the runs list, the run
screen's header, command, log and failure panels, the traceback screen, the restart dialog and the alerts show
every escape and control sequence visibly, and none reaches the terminal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("textual")

from agent_support import run_root, wait_for  # noqa: F401  (run_root: fixture)
from app_support import screen_text, wait_until
from hostile_support import (
    BIDI_OVERRIDE,
    C1_CSI,
    CSI_CLEAR,
    HOSTILE,
    HOSTILE_LOG,
    OSC0_TITLE,
    OSC52_CLIPBOARD,
    SHOWN,
    assert_safe,
)
from test_app_local import run_screen
from test_hostile_cli import HOSTILE_TRACEBACK

from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.dialogs import RestartScreen, TracebackScreen
from eaglewatch.tui.app.screens.runs import RunsScreen
from eaglewatch.tui.connection import Connection

MARKUP_NAME = "[@click=app.quit]click me[/]"


def painted(app) -> str:
    text = screen_text(app)
    assert_safe(text, what="the painted screen")
    return text


def test_the_runs_list_shows_hostile_names_and_arguments_visibly(run_root: Path):
    names = (*HOSTILE, MARKUP_NAME)
    with Connection("local", run_root=str(run_root)) as connection:
        for hostile, name in zip((*HOSTILE, "plain"), names):
            connection.launch(["sh", "-c", "exit 0", hostile], name=name)
    app = DashboardApp("local", connect_kwargs={"run_root": str(run_root)})

    async def scenario():
        async with app.run_test(size=(180, 30)) as pilot:
            runs = await wait_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen, 60,
                                    what="the runs list")
            await wait_until(pilot, lambda: len(runs.runs) == len(names), 60, what="every run listed")
            await wait_until(pilot, lambda: all(SHOWN[h] in screen_text(app) for h in HOSTILE), 30,
                             what="every hostile name painted, visibly")
            text = painted(app)
            for hostile in HOSTILE:
                assert f"'{SHOWN[hostile]}'" in text, hostile  # the argument, shell-quoted
            assert MARKUP_NAME in text  # a name is text, never markup
            await pilot.press("q")

    asyncio.run(scenario())


def test_the_run_screen_failure_panel_traceback_and_restart_dialog_are_safe(run_root: Path, tmp_path: Path):
    log = tmp_path / "hostile.log"
    log.write_bytes(HOSTILE_LOG + HOSTILE_TRACEBACK)
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch(["sh", "-c", 'cat "$1"; exit 1', CSI_CLEAR, str(log)],
                                name=f"n {OSC0_TITLE}")["run"]
        wait_for(lambda: connection.status(run)["state"] == "exited", what="the run's end")
    app = DashboardApp("local", run=run, connect_kwargs={"run_root": str(run_root)})

    async def scenario():
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="the run screen")
            await wait_until(pilot, lambda: "exit code 1" in screen_text(app) and "boom" in screen_text(app), 60,
                             what="the run's end and its failure painted")
            await wait_until(pilot, lambda: "plain last line" in screen_text(app), 30, what="the log painted")
            text = painted(app)
            assert f"(n {SHOWN[OSC0_TITLE]})" in text  # the header's name
            assert f"'{SHOWN[CSI_CLEAR]}'" in text  # the header's command
            assert "RuntimeError: boom" in text and f"{SHOWN[C1_CSI]} {SHOWN[BIDI_OVERRIDE]}gpj.exe" in text
            assert f"{SHOWN[BIDI_OVERRIDE]}gpj.exe bidi" in text  # a log line
            # The alerts quote the failure too: notifications hold no control character either.
            messages = [notification.message for notification in app._notifications]
            assert any("boom" in message for message in messages)
            for message in messages:
                assert_safe(message, what="a notification")
            # The full traceback.
            failures = screen.query_one("#failures")
            failures.focus()
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, TracebackScreen), 30, what="the traceback")
            await wait_until(pilot, lambda: "full traceback" in screen_text(app), 30, what="it painted")
            text = painted(app)
            assert "RuntimeError: boom" in text and f"{SHOWN[BIDI_OVERRIDE]}gpj.exe" in text
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is screen, 30, what="back on the run")
            # The restart dialog shows the arguments visibly; cancelled, nothing happens.
            await pilot.press("r")
            dialog = await wait_until(pilot, lambda: isinstance(app.screen, RestartScreen) and app.screen, 30,
                                      what="the restart dialog")
            await wait_until(pilot, lambda: "Restart" in screen_text(app), 30, what="it painted")
            assert SHOWN[CSI_CLEAR] in dialog.query_one("#argv").value
            painted(app)
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is screen, 30, what="back on the run")
            # A search is text in the log's title, whatever it holds (markup would raise, an escape would drive).
            await pilot.press("slash")
            screen.query_one("#search").value = f"[/]{OSC0_TITLE}"
            await wait_until(pilot, lambda: f"search “[/]{SHOWN[OSC0_TITLE]}”" in screen_text(app), 30,
                             what="the search in the log's title")
            painted(app)
            await pilot.press("escape")
            await pilot.press("q")

    asyncio.run(scenario())


def test_restarting_unchanged_arguments_keeps_them_byte_for_byte(run_root: Path):
    argv = ["sh", "-c", "sleep 600", f"zero {OSC52_CLIPBOARD}"]
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch(argv, name="to restart")["run"]
        wait_for(lambda: connection.status(run)["state"] == "running", what="the run going")
    app = DashboardApp("local", run=run, connect_kwargs={"run_root": str(run_root)})

    async def scenario():
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="the run screen")
            await wait_until(pilot, lambda: SHOWN[OSC52_CLIPBOARD] in screen_text(app), 30, what="the command")
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, RestartScreen), 30, what="the restart dialog")
            await pilot.press("y")
            new = await wait_until(pilot, lambda: run_screen(app) is not screen and run_screen(app), 120,
                                   what="the new run's screen")
            assert new.run_id != run
            await pilot.press("q")
            return new.run_id

    new_run = asyncio.run(scenario())
    with Connection("local", run_root=str(run_root)) as connection:
        assert connection.status(new_run)["argv"] == argv
        connection.stop(new_run, grace_s=1)
