"""A healthy run on the real vLLM engine (CPU build), its preflight miniature included, as the dashboard reads
its log: no traceback anywhere in it (vLLM's chat-template warm-up, which fails without a tokenizer, used to leave
a 15-line one in every run), and the loading panel showing the job's own load only, every piece of the
miniature's output (its engine's bars, its comparison with transformers) in the miniature's lanes."""

from __future__ import annotations

import re

import pytest
from conftest import read_events, run_cli

from eaglewatch.decode import BarUpdate, LineEvent, decode_bytes
from eaglewatch.decode.lanes import KIND_MINIATURE, lane_kind
from eaglewatch.tui.runstate import RunModel

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def healthy_run(tiny_llama, prepared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("healthy")
    proc = run_cli("extract", "--engine", "vllm", "--model-path", tiny_llama, "--prepared-data", prepared_data,
                   "--output-dir", out, "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--max-samples", "8")
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc.stderr.encode(), read_events(out / "events.jsonl")


def test_a_healthy_runs_log_has_no_traceback(healthy_run):
    log, events = healthy_run
    checks = {e["name"]: e["status"] for e in events if e["kind"] == "check"}
    assert checks.get("miniature") == "pass"  # the miniature's own engine ran, and its log is in this one
    assert b"(Miniature" in log
    assert b"Traceback" not in log, log.decode(errors="replace")[-6000:]
    _, state = decode_bytes(log)
    assert state.failures_ranked() == []


def test_the_loading_panel_shows_the_jobs_load_and_the_miniature_stays_in_its_lanes(healthy_run):
    log, events = healthy_run
    model = RunModel("h", {"run": "r", "state": "exited"})
    model.feed_log(log)
    for event in events:
        model.feed_event(event)
    view = model.snapshot()
    assert [(bar.lane, bar.desc, bar.n, bar.total) for bar in view.load] == [
        ("main", "Loading safetensors checkpoint shards", 8, 8)]
    assert (view.extraction.done, view.extraction.total) == (8, 8)
    # Each piece of the log on its own (a \r segment, a line): the miniature's pieces name the miniature, and its
    # bars (2 shards, 4 samples) are never in another lane.
    for piece in re.split(rb"[\r\n]", log):
        found, _ = decode_bytes(piece + b"\n")
        lanes = {event.lane for event in found if isinstance(event, (BarUpdate, LineEvent))}
        if piece.startswith(b"(Miniature"):
            assert all(lane_kind(name) == KIND_MINIATURE for name in lanes), piece[:200]
        for event in found:
            if isinstance(event, BarUpdate) and event.total in (2, 4):
                assert lane_kind(event.lane) == KIND_MINIATURE, piece[:200]
