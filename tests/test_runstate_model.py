"""RunModel: the pure fold of log bytes, pipeline events, telemetry and job states. No Textual, no IO."""

from __future__ import annotations

import json

from app_support import H200X2_STREAM, WORKER_ASSERT_LOG, crashed_model

from eaglewatch import protocol as p
from eaglewatch.tui.runstate import RunModel, Thresholds
from eaglewatch.tui.runstate.fmt import bar, fmt_duration, sparkline


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def event(kind: str, **fields):
    return p.make_event(kind, **fields)


def test_the_crash_log_gives_the_worker_assert_first_and_one_alert_whatever_the_chunking():
    data = WORKER_ASSERT_LOG.read_bytes()
    for size in (1, 7, 4096, len(data)):
        model = RunModel("h", {"run": "r"}, clock=lambda: 0.0)
        for i in range(0, len(data), size):
            model.feed_log(data[i:i + size])
        model.finish_log()
        view = model.snapshot()
        assert view.failures[0].summary.startswith("AssertionError at vllm_connector.py:142 in _submit")
        assert view.failures[0].source_line == "assert self._writes_submitted < self._fault_after"
        assert [f.tier for f in view.failures] == ["original", "re-raised", "final report"]
        alerts = model.alerts_since(0)
        assert [a.kind for a in alerts] == ["failure"] and "VllmWorker-0" in alerts[0].message


def test_phases_and_extraction_figures_come_from_the_pipeline_events():
    model = RunModel("h", {"run": "r", "state": "running"})
    assert model.snapshot().phase == "running"
    for phase in ("validating", "loading", "extracting"):
        model.feed_event(event(p.EVENT_PHASE, phase=phase))
    model.feed_event(event(p.EVENT_INFO, samples=64, tokens=10_000, resumed_samples=8))
    assert model.snapshot().extraction.done == 8  # resumed, before the first progress event
    model.feed_event(event(p.EVENT_PROGRESS, done=40, total=64, tokens=6_000, bytes=123_456,
                           tokens_per_s=1_500.0, samples_per_s=10.0, eta_s=2.4))
    view = model.snapshot()
    assert view.phase == "extracting" and view.phases_seen == ("validating", "loading", "extracting")
    ex = view.extraction
    assert (ex.done, ex.total, ex.tokens, ex.bytes, ex.tokens_per_s, ex.eta_s) == (40, 64, 6000, 123456, 1500.0, 2.4)
    model.feed_event(event(p.EVENT_PHASE, phase="done"))
    model.feed_job("exited", {"code": 0, "ended_at": 10.0}, {})
    view = model.snapshot()
    assert (view.phase, view.exit_text, view.marks) == ("done", "exit code 0", ())
    assert model.alerts_since(0) == []


def test_a_stall_is_alerted_once_and_cleared_by_progress():
    clock = Clock()
    model = RunModel("h", {"run": "r", "state": "running"}, Thresholds(stall_after_s=120), clock=clock)
    model.feed_event(event(p.EVENT_PHASE, phase="loading"))
    clock.now = 119
    model.tick()
    assert model.snapshot().phase == "loading"
    clock.now = 121
    model.tick()
    model.tick()
    view = model.snapshot()
    assert view.phase == "stalled" and "stalled" in view.marks
    assert [a.kind for a in model.alerts_since(0)] == ["stall"]
    model.feed_log(b"Loading safetensors checkpoint shards:  50% Completed | 4/8 [00:10<00:10,  2.5s/it]\r")
    view = model.snapshot()
    assert view.phase == "loading" and "stalled" not in view.marks
    assert view.load[0].n == 4 and view.load[0].total == 8


def test_a_stopped_run_is_not_stalled():
    clock = Clock()
    model = RunModel("h", {"run": "r", "state": "running"}, Thresholds(stall_after_s=60), clock=clock)
    model.feed_event(event(p.EVENT_PHASE, phase="extracting"))
    model.feed_job("exited", {"signal": 15, "signal_name": "SIGTERM"}, {})
    clock.now = 1_000
    model.tick()
    view = model.snapshot()
    assert view.phase == "failed" and view.exit_text == "killed by SIGTERM" and view.exit_code == 143
    assert [a.kind for a in model.alerts_since(0)] == ["exit"]


def test_low_disk_from_telemetry_is_alerted():
    model = RunModel("h", {"run": "r", "state": "running"}, Thresholds(low_disk_bytes=10 * 1024**3))
    sample = json.loads(H200X2_STREAM.read_text().splitlines()[0])
    sample["host"]["disk"] = {"free": 5 * 1024**3, "total": 100 * 1024**3, "full_in_s": None}
    model.feed_telemetry(sample)
    assert "low disk" in model.snapshot().marks
    assert [a.kind for a in model.alerts_since(0)] == ["disk"]


def test_telemetry_history_and_the_log_tail_stay_bounded():
    model = RunModel("h", {"run": "r"}, Thresholds(log_tail=100, gpu_history=10))
    for line in H200X2_STREAM.read_text().splitlines():
        model.feed_telemetry(json.loads(line))
    view = model.snapshot()
    assert len(view.gpus) == 2 and all(len(g.mem_history) == 10 for g in view.gpus)
    model.feed_log(b"".join(b"line %d\n" % i for i in range(1000)))
    lines = model.log_since(0)
    assert len(lines) == 100 and lines[-1].text == "line 999" and lines[-1].seq == 1000
    assert [line.text for line in model.log_since(998)] == ["line 998", "line 999"]
    assert len(model.log_since(0, limit=5)) == 5


def test_bars_are_collapsed_in_the_log():
    model = RunModel("h", {"run": "r"}, clock=lambda: 0.0)
    rewrites = b"".join(b"Loading weights: %3d%%|#| %d/39 [00:00<00:00, 100it/s]\r" % (100 * i // 39, i)
                        for i in range(40))
    model.feed_log(rewrites + b"\n")
    texts = [line.text for line in model.log_since(0)]
    assert len(texts) == 2 and texts[-1].startswith("Loading weights: 100% 39/39")


def test_the_view_of_a_crash_with_telemetry_labels_gpu_processes_by_rank():
    view = crashed_model().snapshot()
    ranks = {proc.rank for gpu in view.gpus for proc in gpu.processes if proc.in_job}
    assert ranks == {"Worker_TP0", "Worker_TP1"}
    assert view.uptime_s == 95.0 and view.exit_text == "exit code 1"


def test_formatting_helpers():
    assert bar(0.5, 4) == "██  " and bar(None, 3) == "···" and bar(1.0, 2) == "██"
    assert sparkline([0, 50, 100], 3, 100) == " ▄█"
    assert fmt_duration(3725) == "1h02m" and fmt_duration(None) == "?"
