"""Snapshots of the runs list at 80x24 and 120x36: seven fixed runs (starting, extracting, failed in three ways,
done, lost), a fixed clock for their ages, start times in UTC; and the list filtered.

Update after an intended change of the look: pytest tests/test_runs_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest

pytest.importorskip("textual")
pytest.importorskip("pytest_textual_snapshot")

from app_support import wait_until
from test_runs_list import RunsApp, fixed_runs, utc  # noqa: F401  (fixture)

from eaglewatch.tui.app.screens.runs import RunsScreen

SIZES = [(80, 24), (120, 36)]


async def listed(pilot):
    app = pilot.app
    await wait_until(pilot, lambda: isinstance(app.screen, RunsScreen) and len(app.screen.shown) == len(fixed_runs())
                     and app.screen.query_one("#runs").row_count == len(fixed_runs()), 30, what="every run listed")


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x36"])
def test_runs_list(snap_compare, size, utc):  # noqa: F811
    assert snap_compare(RunsApp(), terminal_size=size, run_before=listed)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x36"])
def test_runs_list_filtered_and_sorted_by_progress(snap_compare, size, utc):  # noqa: F811
    async def filtered(pilot):
        await listed(pilot)
        await pilot.press("slash", *"extract", "enter", "o", "o", "o", "o", "o")
        screen = pilot.app.screen
        await wait_until(pilot, lambda: screen.order.column == 2 and len(screen.shown) == 4
                         and screen.focused is screen.query_one("#runs"), 30, what="filtered, sorted by progress")

    assert snap_compare(RunsApp(), terminal_size=size, run_before=filtered)
