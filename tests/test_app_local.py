"""The dashboard on real local runs: the real pipeline (transformers engine, tiny model) under the real agent."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from agent_support import run_root  # noqa: F401  (fixture)
from app_support import screen_text, wait_until, whole_log_arrived

from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
from eaglewatch.tui.app.screens.run import REFRESH_HZ, RunScreen

pytestmark = pytest.mark.slow


def extract_argv(model: Path, data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "eaglewatch", "extract", "--engine", "hf", "--model-path", str(model),
            "--prepared-data", str(data), "--output-dir", str(out), "--layer-ids", "1", "2", "4",
            "--batch-size", "8", "--max-seq-len", "512"]


def run_screen(app):
    return app.screen if isinstance(app.screen, RunScreen) else None


def test_local_run_goes_through_loading_and_extraction_to_done(tiny_llama, prepared_data, run_root, tmp_path):
    out = tmp_path / "out"
    app = DashboardApp("local", launch=LaunchRequest(extract_argv(tiny_llama, prepared_data, out), name="hf"),
                       connect_kwargs={"run_root": str(run_root)})

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await wait_until(pilot, lambda: run_screen(app), 60, what="run screen")
            started = time.monotonic()
            await wait_until(pilot, lambda: screen.model.snapshot().exit_text is not None, 180, what="run end")
            # The exit can come before the log's last bytes: wait until the model holds all of the run's log.
            await wait_until(pilot, lambda: whole_log_arrived(screen, run_root), 60, what="the whole log")
            # The screen repaints at its own pace after the model moved: wait for the painted end.
            await wait_until(pilot, lambda: all(word in screen_text(app) for word in ("DONE", "64/64", "exit code 0")),
                             30, what="the painted end")
            elapsed = time.monotonic() - started
            view = screen.model.snapshot()
            assert view.exit_text == "exit code 0" and view.phase == "done"
            assert view.phases_seen == ("validating", "loading", "extracting", "done")
            assert (view.extraction.done, view.extraction.total) == (64, 64)
            assert view.extraction.tokens > 0 and view.extraction.bytes > 0
            assert view.extraction.disk_free is not None  # measured locally: the agent's telemetry has no disk
            loaders = [bar for bar in view.load if bar.desc == "Loading weights"]
            assert loaders and loaders[0].done and loaders[0].total == loaders[0].n > 0
            assert view.failures == () and "failed" not in view.marks
            # No GPU here: the panel says why instead of showing figures.
            assert view.gpus == () and view.gpu_note
            # Redraws are batched: far fewer than the log's lines, and never above the refresh rate.
            assert screen.redraws <= elapsed * REFRESH_HZ + 5
            text = screen_text(app)
            assert "DONE" in text and "64/64" in text and "exit code 0" in text
            assert "Loading weights" in text
            assert "phase: extracting" in text  # the live log panel shows the job's own lines

    asyncio.run(scenario())
