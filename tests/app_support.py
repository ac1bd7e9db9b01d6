"""Helpers shared by the dashboard tests: the screen as plain text, waiting on the app, preloaded models."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Callable

from rich.console import Console

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WORKER_ASSERT_LOG = FIXTURES / "pipeline-logs" / "eaglewatch_vllm_worker_assert.log"
H200X2_STREAM = FIXTURES / "telemetry" / "h200x2_stream.jsonl"


def screen_text(app) -> str:
    """What the terminal shows, as plain text (one line per row)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None,
                      record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def wait_until(pilot, predicate: Callable[[], object], timeout_s: float = 60.0, step_s: float = 0.1,
                     what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s; screen:\n{screen_text(pilot.app)}")
        await pilot.pause(step_s)


def whole_log_arrived(screen, run_root) -> bool:
    """Whether a run screen's model holds every byte of its run's log, as the agent wrote it on this host."""
    log = Path(run_root) / str(screen.run_id) / "log"
    return log.exists() and screen.model.snapshot().log_bytes == log.stat().st_size


def crashed_model(stream: Path = H200X2_STREAM, samples: int = 30):
    """A finished run rebuilt from a real crash log and real H200 telemetry, with fixed clocks."""
    from eaglewatch.tui.runstate import RunModel

    model = RunModel("gpu-box", {"run": "20251130-041140-3f9a2c-extract", "name": "extract",
                                 "argv": ["eaglewatch", "extract", "--model-path", "models/llama", "--tp-size", "2",
                                          "--output-dir", "out"],
                                 "started_at": 1_000.0, "state": "running"},
                     clock=lambda: 0.0, wall=lambda: 2_000.0)
    model.feed_log(WORKER_ASSERT_LOG.read_bytes())
    for line in stream.read_text().splitlines()[:samples]:
        model.feed_telemetry(json.loads(line))
    model.feed_job("exited", {"code": 1, "ended_at": 1_095.0}, {})
    return model


OK_LOG = FIXTURES / "pipeline-logs" / "eaglewatch_vllm_extract_ok.log"
H200_STREAM = FIXTURES / "telemetry" / "h200_stream.jsonl"


def extracting_model():
    """A run caught mid-extraction: the real log up to the extraction bar, the pipeline's events, real telemetry."""
    from eaglewatch import protocol as p
    from eaglewatch.tui.runstate import RunModel

    model = RunModel("gpu-box", {"run": "20251130-041030-5b1d0e-llama", "name": "llama",
                                 "argv": ["eaglewatch", "extract", "--model-path", "models/llama",
                                          "--prepared-data", "data/prepared.jsonl", "--output-dir", "out",
                                          "--layer-ids", "1", "2", "4"],
                                 "started_at": 1_000.0, "state": "running"},
                     clock=lambda: 0.0, wall=lambda: 1_042.0)
    lines = OK_LOG.read_bytes().splitlines(keepends=True)
    model.feed_log(b"".join(lines[:73]))
    for phase in (p.PHASE_VALIDATING, p.PHASE_LOADING):
        model.feed_event(p.make_event(p.EVENT_PHASE, phase=phase, detail=""))
    model.feed_event(p.make_event(p.EVENT_INFO, engine="vllm", samples=64, tokens=10297, resumed_samples=0))
    model.feed_event(p.make_event(p.EVENT_PHASE, phase=p.PHASE_EXTRACTING, detail="8 of 8 batches to run"))
    model.feed_event(p.make_event(p.EVENT_PROGRESS, done=40, total=64, tokens=6420, bytes=2_100_000_000,
                                  elapsed_s=3.4, tokens_per_s=1888.2, samples_per_s=11.8, eta_s=2.0))
    for line in H200_STREAM.read_text().splitlines()[:30]:
        model.feed_telemetry(json.loads(line))
    return model
