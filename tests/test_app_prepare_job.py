"""A real ``eaglewatch prepare`` under the real local agent: the dashboard shows what the command does and its log,
not loading, extraction and GPU panels that a command without a model would leave empty."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("textual")

from agent_support import run_root  # noqa: F401  (fixture)
from app_support import screen_text, wait_until, whole_log_arrived
from test_app_local import run_screen

from eaglewatch.assets import SAMPLE_CHAT_DATA
from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
from eaglewatch.tui.runstate.jobkind import engine_free_tool

pytestmark = pytest.mark.slow


def test_a_prepare_run_gets_its_own_panel_and_its_report(tiny_llama, run_root, tmp_path):
    out = tmp_path / "prepared.jsonl"
    argv = [sys.executable, "-m", "eaglewatch", "prepare", "--model-path", str(tiny_llama), "--input",
            str(SAMPLE_CHAT_DATA), "--output", str(out)]
    app = DashboardApp("local", launch=LaunchRequest(argv, name="prepare"), connect_kwargs={"run_root": str(run_root)})

    async def scenario():
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="run screen")
            await wait_until(pilot, lambda: screen.model.snapshot().exit_text is not None, 180, what="run end")
            await wait_until(pilot, lambda: whole_log_arrived(screen, run_root), 60, what="the whole log")
            # The model has the end before the screen paints it: wait for the painted end as well.
            await wait_until(pilot, lambda: "wrote 64 samples" in screen_text(app) and "exit code 0" in screen_text(app),
                             30, what="the report and the painted end")
            text = screen_text(app)
            assert "eaglewatch prepare" in text and "tokenizes the data" in text
            for absent in ("extraction", "─ GPUs", "samples ?", "disk free"):
                assert absent not in text, absent
            assert "exit code 0" in text

    asyncio.run(scenario())
    assert out.exists()


@pytest.mark.parametrize("argv, tool", [
    (["eaglewatch", "prepare", "--input", "x"], "prepare"),
    (["/usr/bin/python3", "-m", "eaglewatch", "verify", "out"], "verify"),
    ([".venv/bin/eaglewatch", "export", "out"], "export"),
    (["eaglewatch", "extract", "--model-path", "m"], None),
    (["python", "train.py", "prepare"], None),
    (["eaglewatch"], None),
])
def test_which_commands_load_no_model(argv, tool):
    assert engine_free_tool(argv) == tool
