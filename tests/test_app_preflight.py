"""The preflight in the dashboard: each check as it comes, the miniature's stage and ticking time, a failed
miniature in the failure panel with its decoded root cause; and a real extract's preflight under the real agent."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

pytest.importorskip("textual")

from agent_support import run_root  # noqa: F401  (fixture)
from app_support import WORKER_ASSERT_LOG, screen_text, wait_until

from eaglewatch import protocol as p
from eaglewatch.tui.app.app import DashboardApp, LaunchRequest
from eaglewatch.tui.app.screens.run import RunScreen
from eaglewatch.tui.runstate import RunModel

T0 = 1_796_133_692.064  # the events below are a real hf extract's (tiny Llama, this machine), times included
CHECK_EVENTS = [json.loads(line) for line in r"""
{"v":1,"kind":"check","t":1796133692.083,"name":"model folder","status":"pass","reason":"LlamaForCausalLM: 4 layers, hidden 128, 8 shards","fix":"","details":{}}
{"v":1,"kind":"check","t":1796133692.083,"name":"shards","status":"pass","reason":"8 shards, 0.00 GB of tensors, sizes match their headers, index consistent","fix":"","details":{"tensor_bytes":3281408}}
{"v":1,"kind":"check","t":1796133692.083,"name":"versions","status":"pass","reason":"hf engine: no vLLM needed","fix":"","details":{}}
{"v":1,"kind":"check","t":1796133692.083,"name":"layer ids","status":"pass","reason":"[1, 2, 4] of 0..4","fix":"","details":{}}
{"v":1,"kind":"check","t":1796133692.083,"name":"parallelism","status":"pass","reason":"TP 1: 4 heads","fix":"","details":{}}
{"v":1,"kind":"check","t":1796133692.083,"name":"data","status":"pass","reason":"4 samples, 764 tokens, longest 316","fix":"","details":{"length_histogram":{"<=128":2,"<=256":1,"<=512":1}}}
{"v":1,"kind":"check","t":1796133692.083,"name":"memory","status":"pass","reason":"weights 0.00 GiB per device; no GPU to compare with","fix":"","details":{}}
{"v":1,"kind":"check","t":1796133692.084,"name":"disk","status":"pass","reason":"about 0.00 GB of output, 73.7 GB free","fix":"","details":{}}
{"v":1,"kind":"check_stage","t":1796133692.107,"name":"miniature","stage":"building","elapsed_s":0.0}
{"v":1,"kind":"check_stage","t":1796133700.634,"name":"miniature","stage":"extracting","elapsed_s":8.5}
""".strip().splitlines()]
BUILDING, EXTRACTING = CHECK_EVENTS[-2:]


class Wall:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def validating_model(wall: Wall) -> RunModel:
    model = RunModel("gpu-box", {"run": "20251201-131415-6c2e1a-llama", "name": "llama", "state": "running",
                                 "started_at": T0 - 2.0,
                                 "argv": ["eaglewatch", "extract", "--engine", "hf", "--model-path", "llama",
                                          "--prepared-data", "prepared.jsonl", "--output-dir", "out",
                                          "--layer-ids", "1", "2", "4"]},
                     clock=lambda: 0.0, wall=wall)
    model.feed_event({"v": 1, "kind": "phase", "t": T0, "phase": "validating", "detail": ""})
    return model


def failed_miniature_event() -> dict:
    """The miniature's result as the pipeline writes it when the miniature's extract hits vLLM's worker assert: its
    root cause decoded from that real log the way the miniature decodes its own (``decode_root_cause`` in
    pipeline/preflight/miniature.py; the decoder only, so that this test needs nothing of the GPU side)."""
    from eaglewatch.decode import decode_bytes

    _events, state = decode_bytes(WORKER_ASSERT_LOG.read_bytes())
    first = state.failures_ranked()[0]
    root = {"summary": f"{first.summary} [{first.lanes_label()}]", "exc_type": first.exc_type,
            "hint": first.hint.title if first.hint else None}
    return {"v": 1, "kind": "check", "t": 1796133732.3, "name": "miniature", "status": "fail",
            "reason": f"the 4-layer miniature failed: {root['summary']}",
            "fix": "see /tmp/eaglewatch-miniature-x1/miniature.log; fix this before the real load",
            "details": {"layer_map": {"1": 1, "2": 2, "4": 4}, "seconds": 40.2, "root_cause": root}}


def miniature_running_model() -> RunModel:
    """Mid-miniature, 21 s in (13 s into its extraction), for the snapshots."""
    model = validating_model(Wall(1796133713.3))
    for event in CHECK_EVENTS:
        model.feed_event(event)
    return model


def miniature_failed_model() -> RunModel:
    model = validating_model(Wall(1796133733.0))
    for event in CHECK_EVENTS:
        model.feed_event(event)
    model.feed_event(failed_miniature_event())
    model.feed_event({"v": 1, "kind": "phase", "t": 1796133732.4, "phase": "failed",
                      "detail": "UserError: preflight: the 4-layer miniature failed"})
    model.feed_job("exited", {"code": 2, "ended_at": 1796133733.0}, {})
    return model


def test_the_checklist_fills_in_and_the_miniature_ticks_then_fails_with_its_root_cause():
    wall = Wall(T0 + 0.01)
    model = validating_model(wall)
    app = DashboardApp("gpu-box", model=model)

    async def scenario():
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 30, what="the run screen")
            await wait_until(pilot, lambda: "waiting for the loader" in screen_text(app), 30, what="the empty panel")
            for event in CHECK_EVENTS[:8]:
                model.feed_event(event)
            await wait_until(pilot, lambda: "preflight" in screen_text(app) and "✓ model folder" in screen_text(app)
                             and "8 passed" in screen_text(app), 30, what="the passed checks")
            model.feed_event(BUILDING)
            wall.now = BUILDING["t"] + 3.2
            model.tick()
            await wait_until(pilot, lambda: "▸ miniature" in screen_text(app) and "building 3s" in screen_text(app),
                             30, what="the miniature building")
            model.feed_event(EXTRACTING)
            wall.now = EXTRACTING["t"] + 5.0
            model.tick()  # what the feed loop does four times a second: the time moves on screen
            await wait_until(pilot, lambda: "extracting 14s" in screen_text(app)
                             and "(this stage 5s)" in screen_text(app), 30, what="the miniature's ticking time")
            wall.now += 2.0
            model.tick()
            await wait_until(pilot, lambda: "extracting 16s" in screen_text(app), 30, what="the time ticking on")

            model.feed_event(failed_miniature_event())
            await wait_until(pilot, lambda: "✗ miniature" in screen_text(app)
                             and "1. AssertionError at vllm_connector.py" in screen_text(app), 30,
                             what="the failed miniature in the checklist and the failure panel")
            text = screen_text(app)
            assert "▸" not in text
            await pilot.press("f")  # full screen: each failure with its lanes on a line of their own
            await wait_until(pilot, lambda: "preflight · miniature" in screen_text(app), 30,
                             what="the failure's lanes in the full-screen failures")

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_real_extract_shows_its_preflight_while_it_runs(tiny_llama, prepared_data, run_root, tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "eaglewatch", "extract", "--engine", "hf", "--model-path", str(tiny_llama),
            "--prepared-data", str(prepared_data), "--output-dir", str(out), "--layer-ids", "1", "2", "4",
            "--max-samples", "4", "--max-seq-len", "512"]
    app = DashboardApp("local", launch=LaunchRequest(argv, name="preflight"),
                       connect_kwargs={"run_root": str(run_root)}, telemetry=False)

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen, 60,
                                      what="the run screen")
            # The miniature takes tens of seconds here: its stage shows while it runs.
            await wait_until(pilot, lambda: "▸ miniature" in screen_text(app) and any(
                stage in screen_text(app) for stage in p.MINIATURE_STAGES), 90, what="the miniature running")
            await wait_until(pilot, lambda: screen.model.snapshot().phase == "done", 120, step_s=0.5,
                             what="the run done")
            view = screen.model.snapshot()
            return view

    view = asyncio.run(scenario())
    checks = {check.name: check for check in view.checks}
    assert {"model folder", "layer ids", "data", "disk", "miniature"} <= set(checks)
    assert all(check.status == "pass" for check in checks.values())
    assert checks["miniature"].elapsed_s and checks["miniature"].elapsed_s > 0
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    stages = [e["stage"] for e in events if e["kind"] == p.EVENT_CHECK_STAGE and e["name"] == "miniature"]
    assert stages == list(p.MINIATURE_STAGES)
    # Check events are results only: what read them before the stages came reads them the same way.
    assert {e["status"] for e in events if e["kind"] == p.EVENT_CHECK} == {p.CHECK_PASS}
    assert view.failures == ()
