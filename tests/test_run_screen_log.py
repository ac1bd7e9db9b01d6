"""The run screen's log as a reader of less or toolong expects it: a search that highlights and jumps between its
matches, only-matching lines on request, wrap, a position, following new lines only at the end, and the log and
the failures out of the dashboard (a file, a pager)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("textual")

from app_support import crashed_model, screen_text, wait_until

from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.run import RunScreen
from eaglewatch.tui.app.widgets.panels import LogPanel


def run(scenario_body, size=(120, 36)):
    app = DashboardApp("gpu-box", model=crashed_model())

    async def scenario():
        async with app.run_test(size=size, notifications=True) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.redraws > 0, 30,
                             what="the run screen")
            log = app.screen.query_one(LogPanel)
            await wait_until(pilot, lambda: log.shown > 100, 30, what="the log written")
            return await scenario_body(pilot, app, log)

    return asyncio.run(scenario())


async def search(pilot, app, text):
    await pilot.press("slash")
    for char in text:
        await pilot.press(char)
    await pilot.press("enter")
    log = app.screen.query_one(LogPanel)
    await wait_until(pilot, lambda: log.search == text and log.shown > 100, 30, what="the search applied")


def test_search_highlights_and_jumps_between_matches_both_ways():
    async def body(pilot, app, log):
        await search(pilot, app, "File")
        matches = log.match_rows()
        assert len(matches) > 3 and log.shown > len(matches)  # every line is still there: the matches are marked
        await pilot.press("l")  # the log full-screen, with the focus
        await pilot.press("right_square_bracket")
        await wait_until(pilot, lambda: log.match_row is not None, 30, what="the first jump")
        first = log.match_row
        await pilot.press("right_square_bracket")
        await wait_until(pilot, lambda: log.match_row != first, 30, what="the next match")
        second = log.match_row
        assert matches.index(second) == matches.index(first) + 1
        assert f"{matches.index(second) + 1}/{len(matches)}" in str(log.border_title)
        assert log.scroll_y <= second < log.scroll_y + log.scrollable_content_region.height  # on screen
        await pilot.press("left_square_bracket")
        await wait_until(pilot, lambda: log.match_row == first, 30, what="back to the first")
        # New lines do not pull the view away from the match it was sent to.
        assert not log.following
        await pilot.press("end")
        await wait_until(pilot, lambda: log.following and log.match_row is None, 30, what="following again")

    run(body)


def test_only_matching_lines_and_wrap_are_toggles():
    async def body(pilot, app, log):
        everything = len(app.screen.model.log_since(0))  # a search redraws the whole tail
        await search(pilot, app, "File")
        await pilot.press("l")
        await pilot.press("ampersand")
        await wait_until(pilot, lambda: log.only_matches and 0 < log.shown < everything, 30, what="only matches")
        assert "only" in str(log.border_title)
        await pilot.press("ampersand")
        await wait_until(pilot, lambda: not log.only_matches and log.shown == everything, 30, what="all again")
        longest = max(len(strip.text) for strip in log.lines)
        await pilot.press("w")
        await wait_until(pilot, lambda: log.wrap and "wrap" in str(log.border_title), 30, what="wrapped")
        await wait_until(pilot, lambda: len(log.lines) > everything, 30, what="long lines on more rows")
        assert max(len(strip.text.rstrip()) for strip in log.lines) < longest
        await pilot.press("w")
        await wait_until(pilot, lambda: not log.wrap and len(log.lines) == everything, 30, what="cut again")

    run(body)


def test_the_log_title_says_where_the_view_is():
    async def body(pilot, app, log):
        await wait_until(pilot, lambda: f"end/{len(log.lines)}" in str(log.border_title), 30, what="at the end")
        await pilot.press("l")
        await pilot.press("home")
        height = log.scrollable_content_region.height
        await wait_until(pilot, lambda: f" {height}/{len(log.lines)}" in str(log.border_title), 30,
                         what="the top's position")
        # Scrolled up by the reader: a new line does not pull the view down.
        assert not log.following
        app.screen.model.feed_log(b"a line that came while the reader was reading\n")
        await wait_until(pilot, lambda: "a line that came" in log.lines[-1].text, 30, what="the new line")
        assert log.scroll_y == 0
        await pilot.press("end")
        await wait_until(pilot, lambda: log.following and "end/" in str(log.border_title), 30, what="following")

    run(body)


def test_x_saves_the_log_and_the_failures_to_files_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    async def body(pilot, app, log):
        await pilot.press("x")
        await wait_until(pilot, lambda: any("saved" in n.message for n in app._notifications), 30, what="saved")
        return [n.message for n in app._notifications if "saved" in n.message][0]

    message = run(body)
    stem = "20251130-041140-3f9a2c-extract"
    log_file, failures_file = tmp_path / f"{stem}.log.txt", tmp_path / f"{stem}.failures.txt"
    assert str(log_file) in message and str(failures_file) in message
    assert "EngineDeadError" in log_file.read_text()
    failures = failures_file.read_text()
    # Root cause first, with its whole traceback.
    assert failures.index("=== failure 1") < failures.index("=== failure 2")
    assert "AssertionError" in failures.split("=== failure 2")[0] and "Traceback" in failures
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([log_file.name, failures_file.name])


def test_p_without_a_terminal_to_hand_over_says_where_the_log_is():
    async def body(pilot, app, log):
        await pilot.press("p")
        await wait_until(pilot, lambda: any("no pager" in n.message for n in app._notifications), 30,
                         what="the pager's fallback")
        return screen_text(app), [n.message for n in app._notifications if "no pager" in n.message][0]

    _, message = run(body)
    path = message.rsplit(" ", 1)[-1]
    with open(path, encoding="utf-8") as saved:
        assert "EngineDeadError" in saved.read()
