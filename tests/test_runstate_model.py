"""RunModel: the pure fold of log bytes, pipeline events, telemetry and job states. No Textual, no IO."""

from __future__ import annotations

import json

from app_support import FIXTURES, H200X2_STREAM, WORKER_ASSERT_LOG, crashed_model

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


def test_a_stopped_run_is_not_stalled_and_reads_stopped_not_failed():
    clock = Clock()
    model = RunModel("h", {"run": "r", "state": "running"}, Thresholds(stall_after_s=60), clock=clock)
    model.feed_event(event(p.EVENT_PHASE, phase="extracting"))
    # The operator's stop: the supervisor found stop.json and said so in exit.json.
    model.feed_job("exited", {"signal": 15, "signal_name": "SIGTERM", "stopped": True}, {})
    clock.now = 1_000
    model.tick()
    view = model.snapshot()
    assert view.phase == "stopped" and view.exit_text == "stopped by the operator (SIGTERM)"
    assert view.exit_code == 143 and view.marks == ()
    assert model.alerts_since(0) == []


def test_a_run_killed_by_a_signal_nobody_asked_for_failed():
    clock = Clock()
    model = RunModel("h", {"run": "r", "state": "running"}, Thresholds(stall_after_s=60), clock=clock)
    model.feed_event(event(p.EVENT_PHASE, phase="extracting"))
    model.feed_job("exited", {"signal": 15, "signal_name": "SIGTERM"}, {})  # kill -TERM from outside
    clock.now = 1_000
    model.tick()
    view = model.snapshot()
    assert view.phase == "failed" and view.exit_text == "killed by SIGTERM" and view.exit_code == 143
    assert view.marks == ("failed",)
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
    # In one chunk the rewrites before the last are skipped (the decoder's bars.rewritten_at_once): one line.
    assert len(texts) == 1 and texts[0].startswith("Loading weights: 100% 39/39")

    # Arriving rewrite by rewrite, the bar is noted when it first shows and when it ends: two lines, not 40.
    live = RunModel("h", {"run": "r"}, clock=lambda: 0.0)
    for piece in rewrites.split(b"\r")[:-1]:
        live.feed_log(piece + b"\r")
    live.feed_log(b"\n")
    texts = [line.text for line in live.log_since(0)]
    assert len(texts) == 2 and texts[0].startswith("Loading weights: 0% 0/39")
    assert texts[-1].startswith("Loading weights: 100% 39/39")


def test_the_view_of_a_crash_with_telemetry_labels_gpu_processes_by_rank():
    view = crashed_model().snapshot()
    ranks = {proc.rank for gpu in view.gpus for proc in gpu.processes if proc.in_job}
    assert ranks == {"Worker_TP0", "Worker_TP1"}
    assert view.uptime_s == 95.0 and view.exit_text == "exit code 1"


def test_formatting_helpers():
    assert bar(0.5, 4) == "██  " and bar(None, 3) == "···" and bar(1.0, 2) == "██"
    assert sparkline([0, 50, 100], 3, 100) == " ▄█"
    assert fmt_duration(3725) == "1h02m" and fmt_duration(None) == "?"


H200_LOG = FIXTURES / "gpu" / "h200_eaglewatch_vllm026_extract.log"


def test_the_engines_latest_info_line_shows_what_loading_is_doing_after_the_shards():
    # On the H200, vLLM profiled and warmed up for two minutes after its last shard, printing nothing.
    clock = Clock()
    model = RunModel("h", {"run": "r", "state": "running"}, clock=clock)
    model.feed_event(event(p.EVENT_PHASE, phase="loading"))
    lines = H200_LOG.read_bytes().splitlines(keepends=True)
    upto = next(i for i, line in enumerate(lines) if b"Model loading took" in line)
    model.feed_log(b"".join(lines[: upto + 1]))
    clock.now = 123.0
    model.tick()
    view = model.snapshot()
    assert view.load[0].done and view.load[0].total == 9
    assert view.load_step.startswith("Model loading took 1.88 GiB memory")
    assert view.load_step_age_s == 123.0
    # Warnings and unheaded lines are not steps; the next INFO line is.
    model.feed_log(b"WARNING 11-30 04:26:05 [x.py:1] something odd\nplain text\n"
                   b"INFO 11-30 04:28:05 [gpu_worker.py:560] Available KV cache memory: 122.56 GiB\n")
    view = model.snapshot()
    assert view.load_step == "Available KV cache memory: 122.56 GiB" and view.load_step_age_s == 0.0
    model.feed_event(event(p.EVENT_PHASE, phase="extracting"))
    model.feed_log(b"INFO 11-30 04:28:07 [core.py:347] init engine took 124 s\n")
    assert model.snapshot().load_step is None


def extracting_with_disk(free_gib: float, full_in_s: float, resumed: int = 0, done: int = 512):
    model = RunModel("h", {"run": "r", "state": "running"}, Thresholds(low_disk_bytes=2 * 1024**3))
    model.feed_event(event(p.EVENT_PHASE, phase="extracting"))
    model.feed_event(event(p.EVENT_INFO, samples=1024, tokens=1024 * 1024, resumed_samples=resumed))
    written = done - resumed
    model.feed_event(event(p.EVENT_PROGRESS, done=done, total=1024, tokens=written * 1024,
                           bytes=written * 16 * 1024**2, tokens_per_s=80_000.0))
    sample = json.loads(H200X2_STREAM.read_text().splitlines()[0])
    sample["host"]["disk"] = {"free": int(free_gib * 1024**3), "total": 270 * 1024**3, "full_in_s": full_in_s}
    model.feed_telemetry(sample)
    return model


def test_a_fast_writer_that_will_fit_is_no_low_disk_alarm():
    # As seen on the H200: 47 GB free, "full in 35 s" at 1.2 GB/s, but the job needs 8 GiB more and stops.
    model = extracting_with_disk(free_gib=47, full_in_s=35)
    view = model.snapshot()
    assert view.extraction.bytes_to_go == 512 * 16 * 1024**2
    assert "low disk" not in view.marks and model.alerts_since(0) == []


def test_output_that_will_not_fit_is_alerted_with_what_it_needs():
    model = extracting_with_disk(free_gib=9, full_in_s=4000)
    assert "low disk" in model.snapshot().marks
    (alert,) = model.alerts_since(0)
    assert alert.kind == "disk" and "needs about 8.0 GiB" in alert.message


def test_a_resumed_run_estimates_what_is_left_per_sample():
    # 800 of 1024 done, 300 of them resumed: 500 written this time, 224 to go at 16 MiB each.
    model = extracting_with_disk(free_gib=100, full_in_s=4000, resumed=300, done=800)
    assert model.snapshot().extraction.bytes_to_go == 224 * 16 * 1024**2


def test_before_the_first_batch_the_growth_rate_decides():
    model = RunModel("h", {"run": "r", "state": "running"})
    sample = json.loads(H200X2_STREAM.read_text().splitlines()[0])
    sample["host"]["disk"] = {"free": 50 * 1024**3, "total": 270 * 1024**3, "full_in_s": 600}
    model.feed_telemetry(sample)
    view = model.snapshot()
    assert view.extraction.bytes_to_go is None and "low disk" in view.marks


def test_the_supervisors_word_on_leftover_processes_is_alerted_after_the_end():
    model = RunModel("h", {"run": "r", "state": "running"})
    model.feed_job("exited", {"code": 1}, {})
    model.feed_event(event(p.EVENT_WARNING, message="1 process(es) of the run outlived its main process (pids 7)",
                           code="leftover_processes", by="supervisor"))
    model.feed_event(event(p.EVENT_WARNING, message="a pipeline warning"))
    alerts = [a for a in model.alerts_since(0) if a.kind == "processes"]
    assert [a.message for a in alerts] == ["1 process(es) of the run outlived its main process (pids 7)"]


def test_a_run_with_nothing_left_to_do_counts_what_it_found_done_not_another_bar():
    """A resumed run that finds every sample done draws no bar of its own; the preflight miniature's
    "Extracting hidden states 4/4" in its log (in the main lane, as in a log written before each of its \\r
    updates carried the miniature's lane) is not the run's count."""
    model = RunModel("h", {"run": "r", "state": "running"})
    model.feed_log(b"(Miniature pid=7) \nExtracting hidden states:   0%|   | 0/4 [00:00<?, ?sample/s]"
                   b"\rExtracting hidden states: 100%|###| 4/4 [00:00<00:00, 25.95sample/s]\n")
    model.feed_event(event(p.EVENT_INFO, samples=11, tokens=1_863, resumed_samples=11))
    model.feed_event(event(p.EVENT_PHASE, phase="done"))
    extraction = model.snapshot().extraction
    assert (extraction.done, extraction.total) == (11, 11)


def test_a_run_that_has_ended_forecasts_no_full_disk():
    # "full in" forecasts this job's writing; once it has ended the disk's growth is someone else's.
    model = RunModel("h", {"run": "r", "state": "running"})
    sample = json.loads(H200X2_STREAM.read_text().splitlines()[0])
    sample["host"]["disk"] = {"free": 50 * 1024**3, "total": 270 * 1024**3, "full_in_s": 600}
    model.feed_telemetry(sample)
    assert model.snapshot().extraction.disk_full_in_s == 600
    model.feed_job("exited", {"code": 0}, {})
    view = model.snapshot()
    assert view.extraction.disk_full_in_s is None and view.extraction.disk_free == 50 * 1024**3


def test_a_forecast_of_days_is_not_shown():
    # An idle host's disk grows by a trickle: "full in 5073d" says nothing a job of hours can use.
    model = RunModel("h", {"run": "r", "state": "running"})
    sample = json.loads(H200X2_STREAM.read_text().splitlines()[0])
    sample["host"]["disk"] = {"free": 50 * 1024**3, "total": 270 * 1024**3, "full_in_s": 438_000_000.0}
    model.feed_telemetry(sample)
    assert model.snapshot().extraction.disk_full_in_s is None
    sample["host"]["disk"]["full_in_s"] = 36 * 3600.0
    model.feed_telemetry(sample)
    assert model.snapshot().extraction.disk_full_in_s == 36 * 3600.0
