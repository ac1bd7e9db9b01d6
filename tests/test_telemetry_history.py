"""A run's GPU history on the host: recorded by the supervisor from NVML (here, NVML readings recorded on two H200s
replayed), read back by the agent, and put before the live samples in the dashboard's sparklines."""

from __future__ import annotations

import json
from pathlib import Path

from agent_support import wait_for
from telemetry_replay import ReplayNvml, raw_readings

from eaglewatch.pipeline.telemetry.history import HISTORY_FILE, OLDER_FILE, HistoryRecorder, read_recent
from eaglewatch.pipeline.telemetry.nvml import NvmlSource
from eaglewatch.tui.runstate import RunModel, Thresholds

READINGS = raw_readings("h200x2_raw.jsonl")


def recorder(tmp_path: Path, max_lines: int = 1000) -> HistoryRecorder:
    return HistoryRecorder(tmp_path, interval_s=0.01, source=NvmlSource(module=ReplayNvml(READINGS)),
                           max_lines=max_lines)


def test_each_line_holds_memory_and_utilisation_of_every_gpu(tmp_path: Path) -> None:
    history = recorder(tmp_path)
    for _ in range(5):
        history.record()
    lines = [json.loads(line) for line in (tmp_path / HISTORY_FILE).read_text().splitlines()]
    assert len(lines) == 5 and all(len(line["gpus"]) == 2 for line in lines)
    first = READINGS[0]
    assert [gpu["mem_used"] for gpu in lines[0]["gpus"]] == [gpu["memory"]["used"] for gpu in first]
    assert [gpu["util_gpu"] for gpu in lines[0]["gpus"]] == [gpu["utilization"]["gpu"] for gpu in first]
    assert read_recent(tmp_path, 3) == lines[-3:]


def test_the_thread_records_until_finish_then_once_more(tmp_path: Path) -> None:
    history = recorder(tmp_path)
    history.start()
    path = tmp_path / HISTORY_FILE
    wait_for(lambda: path.exists() and len(path.read_text().splitlines()) >= 3, what="three recorded lines")
    history.finish(settle_s=0)
    count = len((tmp_path / HISTORY_FILE).read_text().splitlines())
    assert not history.is_alive()
    history.record()  # nothing keeps writing behind our back: only this explicit line adds one
    assert len((tmp_path / HISTORY_FILE).read_text().splitlines()) == count + 1


def test_a_full_file_is_renamed_and_reading_spans_both(tmp_path: Path) -> None:
    history = recorder(tmp_path, max_lines=4)
    for _ in range(6):
        history.record()
    assert len((tmp_path / OLDER_FILE).read_text().splitlines()) == 4
    assert len((tmp_path / HISTORY_FILE).read_text().splitlines()) == 2
    recent = read_recent(tmp_path, 5)
    assert len(recent) == 5 and [s["t"] for s in recent] == sorted(s["t"] for s in recent)
    # A new recorder on the same run directory (a restarted supervisor) counts what is there.
    assert recorder(tmp_path, max_lines=4)._lines == 2


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    history = recorder(tmp_path)
    history.record()
    with open(tmp_path / HISTORY_FILE, "a") as fh:
        fh.write('{"t": 1, "gpus": [{"ind')
    assert len(read_recent(tmp_path, 10)) == 1


def test_without_nvml_nothing_is_recorded(tmp_path: Path) -> None:
    history = HistoryRecorder(tmp_path, source=NvmlSource(module=None))  # no driver on this machine
    assert not history.available()
    history.record()
    assert not (tmp_path / HISTORY_FILE).exists()


def test_the_model_puts_recorded_samples_before_live_ones(tmp_path: Path) -> None:
    history = recorder(tmp_path)
    for _ in range(8):
        history.record()
    recorded = read_recent(tmp_path, 8)
    model = RunModel("h", {"run": "r", "state": "running"}, Thresholds(gpu_history=10))
    live = json.loads((Path(__file__).parent / "fixtures" / "telemetry" / "h200x2_stream.jsonl")
                      .read_text().splitlines()[-1])
    model.feed_telemetry(live)
    model.feed_gpu_history(recorded)
    gpu0 = model.snapshot().gpus[0]
    expected_past = [s["gpus"][0]["mem_used"] / s["gpus"][0]["mem_total"] for s in recorded]
    assert list(gpu0.mem_history[:-1]) == expected_past[-9:]  # oldest dropped: the bound holds
    assert gpu0.mem_history[-1] == live["gpus"][0]["mem_used"] / live["gpus"][0]["mem_total"]
    assert list(gpu0.util_history[:-1]) == [float(s["gpus"][0]["util_gpu"]) for s in recorded][-9:]
