"""A run's summary carries its pipeline's last phase and progress, read from a bounded tail of its events, so the
runs list's PHASE and PROGRESS columns fill in for live runs; hostile tails add nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eaglewatch import protocol as p
from eaglewatch.pipeline.agent import rundir
from eaglewatch.pipeline.agent.rundir import EVENTS_TAIL, RunDir, summary


def run_with_events(tmp_path: Path, lines: list[bytes]) -> RunDir:
    run = RunDir(tmp_path / "20261203-120000-abcdef-x")
    run.path.mkdir()
    (run.path / rundir.EVENTS_FILE).write_bytes(b"".join(lines))
    return run


def event(kind: str, **fields) -> bytes:
    return (json.dumps(p.make_event(kind, **fields)) + "\n").encode()


def test_the_last_phase_and_progress_of_the_events(tmp_path):
    run = run_with_events(tmp_path, [
        event(p.EVENT_PHASE, phase=p.PHASE_LOADING, detail=""),
        event(p.EVENT_PHASE, phase=p.PHASE_EXTRACTING, detail=""),
        event(p.EVENT_PROGRESS, done=8, total=64),
        event(p.EVENT_PROGRESS, done=16, total=64),
        b'{"kind": "progress", "done": 2',  # being written
    ])
    found = summary(run, p.JOB_RUNNING)
    assert found["phase"] == p.PHASE_EXTRACTING and found["progress"] == {"done": 16, "total": 64}


def test_a_long_extraction_beyond_the_tail_is_extracting(tmp_path):
    samples = [event(p.EVENT_SAMPLE, index=i, tokens=100) for i in range(3000)]
    run = run_with_events(tmp_path, [event(p.EVENT_PHASE, phase=p.PHASE_EXTRACTING, detail=""), *samples,
                                     event(p.EVENT_PROGRESS, done=3000, total=4000), *samples[:50]])
    assert sum(map(len, samples)) > EVENTS_TAIL
    found = summary(run, p.JOB_RUNNING)
    assert found["phase"] == p.PHASE_EXTRACTING and found["progress"] == {"done": 3000, "total": 4000}


def test_hostile_or_missing_events_add_nothing(tmp_path):
    junk = run_with_events(tmp_path, [b"\xff\xfe not json\n", b"[1, 2]\n",
                                      b'{"kind": "progress", "done": true, "total": "x"}\n'])
    found = summary(junk, p.JOB_RUNNING)
    assert "phase" not in found and "progress" not in found
    fifo_run = RunDir(tmp_path / "20261203-120001-abcdef-y")
    fifo_run.path.mkdir()
    os.mkfifo(fifo_run.path / rundir.EVENTS_FILE)
    found = summary(fifo_run, p.JOB_RUNNING)  # returns: a FIFO is never opened
    assert "phase" not in found and found["not_regular"] == {rundir.EVENTS_FILE: "a FIFO"}
