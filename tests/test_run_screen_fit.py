"""The run screen fits 80x24 and 120x36: every state, every full-screen view, nothing that matters cut.

What "fits" means here, row by row of the painted screen: the footer's last key is whole; every figure of the
extraction panel is there (a narrow panel flows them onto more lines instead of cutting them); a failure's row is
one line on a narrow screen and the log keeps at least four lines under it; a full-screen panel's box is the
screen's width; the read-only mode wears a badge and offers no key that would change the job."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("textual")

from app_support import crashed_model, extracting_model, screen_text, wait_until
from test_app_preflight import miniature_failed_model

from eaglewatch.tui.app.app import DashboardApp
from eaglewatch.tui.app.screens.run import RunScreen

SIZES = [(80, 24), (120, 36)]
MODELS = {"crashed": crashed_model, "extracting": extracting_model, "miniature failed": miniature_failed_model}


async def settled(pilot, app):
    await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.redraws > 0, 30,
                     what="the run screen's first redraw")
    app.clear_notifications()
    await wait_until(pilot, lambda: not app.screen.query("Toast"), 30, what="no toasts")
    return app.screen


def painted(model_name: str, size: tuple[int, int], keys: tuple[str, ...] = (), read_only: bool = False) -> str:
    app = DashboardApp("gpu-box", model=MODELS[model_name](), read_only=read_only)

    async def scenario():
        async with app.run_test(size=size) as pilot:
            screen = await settled(pilot, app)
            for key in keys:
                await pilot.press(key)
            if keys:
                await wait_until(pilot, lambda: screen.maximized is not None, 30, what="the full-screen panel")
            await pilot.pause()
            return screen_text(app)

    return asyncio.run(scenario())


def rows(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x36"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_footer_and_the_figures_are_whole(name, size):
    text = painted(name, size)
    lines = rows(text)
    assert len(lines) == size[1] and all(len(line) <= size[0] for line in lines)
    assert lines[-1].rstrip().endswith("q detach"), lines[-1]
    if name != "miniature failed":
        for figure in ("tokens/s", "written", "eta", "disk free"):
            assert figure in text, figure
        panel = [line for line in lines if "samples " in line or "tokens/s" in line or "disk free" in line]
        assert not any("…" in line for line in panel), panel


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x36"])
def test_failures_leave_the_log_room_on_a_narrow_screen(size):
    lines = rows(painted("crashed", size))
    log_top = next(i for i, line in enumerate(lines) if "─ log " in line)
    log_rows = next(i for i in range(log_top + 1, len(lines)) if lines[i].startswith("╰")) - log_top - 1
    assert log_rows >= 4, "\n".join(lines)
    if size == (80, 24):
        # One row per failure, root cause first, each cut to the box.
        rows_of = [line for line in lines if line.startswith("│ ") and line[2:4] in ("1.", "2.", "3.")]
        assert [line[2:4] for line in rows_of] == ["1.", "2.", "3."]
        assert "AssertionError at vllm_connector.py:142" in rows_of[0]


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x36"])
@pytest.mark.parametrize("key", ["f", "g", "l"])
def test_a_full_screen_panel_is_the_screen_s_width(key, size):
    lines = rows(painted("crashed", size, (key,)))
    box = [line for line in lines[:-1] if line.strip()]
    assert box[0].startswith("╭") and box[0].rstrip().endswith("╮"), box[0]
    assert len(box[0].rstrip()) == size[0]
    assert box[-1].startswith("╰") and len(box[-1].rstrip()) == size[0]
    if key == "f":
        assert "VllmWorker-0 · printed 2×" in "\n".join(lines)  # the full rows, lanes on their own line


def test_read_only_wears_a_badge_and_offers_no_changing_key():
    text = painted("extracting", (80, 24), read_only=True)
    lines = rows(text)
    assert "READ-ONLY" in lines[0]
    footer = lines[-1]
    assert "restart" not in footer and "stop" not in footer and "detach" in footer


def test_a_failed_check_s_reason_wraps_instead_of_being_cut():
    lines = rows(painted("miniature failed", (80, 24)))
    reason = " ".join(line.split("│")[1].strip() for line in lines[3:7] if "│" in line)
    assert "the 4-layer miniature" in reason and "failed:" in reason and "AssertionError" in reason
