"""RunModel and the decoder's provisional failures: shown when the exception line arrives, refined or closed in
place, one alert each. No Textual."""

from __future__ import annotations

from app_support import WORKER_ASSERT_LOG

from eaglewatch.tui.runstate import RunModel


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def worker(pid: int, tp: int, text: str) -> bytes:
    return f"(VllmWorker TP{tp} pid={pid}) ERROR 11-30 04:12:00 [multiproc_executor.py:1063] {text}\n".encode()


def traceback_lines(pid: int, tp: int, exc: str, where: str = "/srv/w.py", line: int = 10) -> list[bytes]:
    return [worker(pid, tp, "Traceback (most recent call last):"),
            worker(pid, tp, f'  File "{where}", line {line}, in step'),
            worker(pid, tp, "    assert ok"),
            worker(pid, tp, exc)]


CHAINED_PART = [
    b"",
    b"The above exception was the direct cause of the following exception:",
    b"",
    b"Traceback (most recent call last):",
    b'  File "/srv/runner.py", line 20, in run',
    b"    step()",
    b"RuntimeError: worker step failed",
]


def failure_alerts(model: RunModel) -> list[str]:
    return [alert.message for alert in model.alerts_since(0) if alert.kind == "failure"]


def running_model(clock: Clock) -> RunModel:
    return RunModel("h", {"run": "r", "state": "running"}, clock=clock, wall=lambda: 100.0)


def test_a_failure_shows_with_its_exception_line_and_is_refined_in_place_with_one_alert():
    clock = Clock()
    model = running_model(clock)
    *head, exc = traceback_lines(11, 0, "AssertionError: crash one")
    model.feed_log(b"".join(head))
    assert model.snapshot().failures == ()  # a header and frames are no failure yet

    model.feed_log(exc)
    (shown,) = model.snapshot().failures
    assert shown.provisional and shown.summary == "AssertionError: crash one" and shown.position == 1
    assert failure_alerts(model) == ["failure in VllmWorker TP0: AssertionError: crash one"]

    # A chained part follows: the same failure, more detail (its root exception is now the one raised last).
    model.feed_log(b"".join(worker(11, 0, part.decode()) for part in CHAINED_PART))
    (refined,) = model.snapshot().failures
    assert refined.ident == shown.ident and refined.position == 1 and refined.provisional
    assert refined.summary == "RuntimeError: worker step failed"
    assert "The above exception was the direct cause" in refined.traceback

    # The worker dies: nothing more comes from it, and after 2 s of quiet the report is closed.
    clock.now = 1.0
    model.tick()
    assert model.snapshot().failures[0].provisional
    clock.now = 2.5
    model.tick()
    (closed,) = model.snapshot().failures
    assert closed.ident == shown.ident and not closed.provisional and closed.confidence == "certain"
    assert failure_alerts(model) == ["failure in VllmWorker TP0: AssertionError: crash one"]


def test_a_lane_that_keeps_printing_closes_its_report_at_its_next_line():
    model = running_model(Clock())
    model.feed_log(b"".join(traceback_lines(11, 0, "AssertionError: crash one")))
    assert model.snapshot().failures[0].provisional
    model.feed_log(b"(VllmWorker TP0 pid=11) INFO 11-30 04:12:01 [core.py:11] shutting down\n")
    (closed,) = model.snapshot().failures
    assert not closed.provisional and closed.summary == "AssertionError: crash one"
    assert len(failure_alerts(model)) == 1


RERAISE = ("RuntimeError: WorkerProc initialization failed due to an exception in a background process. "
           "See stack trace for root cause.")


def engine_core(text: str) -> bytes:
    return f"(EngineCore pid=20) ERROR 11-30 04:12:00 [core.py:1512] {text}\n".encode()


def reraise_lines() -> list[bytes]:
    return [engine_core("Traceback (most recent call last):"),
            engine_core('  File "/opt/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 90, in run'),
            engine_core("    raise RuntimeError(msg)"),
            engine_core(RERAISE)]


def test_two_failures_in_two_lanes_ring_once_each_as_each_becomes_the_root_cause():
    clock = Clock()
    model = running_model(clock)
    # The engine's re-raise comes first: the best there is, so it is the root cause for now.
    model.feed_log(b"".join(reraise_lines()))
    assert failure_alerts(model) == [f"failure in EngineCore: {RERAISE}"]
    # Then the worker's own exception: an original failure, the new root cause.
    model.feed_log(b"".join(traceback_lines(12, 1, "ValueError: bad shape", where="/srv/v.py", line=30)))
    view = model.snapshot()
    assert [f.summary for f in view.failures] == ["ValueError: bad shape", RERAISE]
    assert all(f.provisional for f in view.failures)
    clock.now = 5.0
    model.tick()
    view = model.snapshot()
    assert [f.provisional for f in view.failures] == [False, False]
    assert failure_alerts(model) == [f"failure in EngineCore: {RERAISE}",
                                     "failure in VllmWorker TP1: ValueError: bad shape"]


def test_a_later_failure_that_is_not_the_root_cause_does_not_ring():
    clock = Clock()
    model = running_model(clock)
    model.feed_log(b"".join(traceback_lines(11, 0, "AssertionError: crash one")))
    model.feed_log(b"".join(traceback_lines(12, 1, "ValueError: bad shape", where="/srv/v.py", line=30)))
    clock.now = 5.0
    model.tick()
    assert [f.summary for f in model.snapshot().failures] == ["AssertionError: crash one", "ValueError: bad shape"]
    assert failure_alerts(model) == ["failure in VllmWorker TP0: AssertionError: crash one"]


def test_the_same_failure_printed_by_two_ranks_at_once_alerts_once():
    clock = Clock()
    model = running_model(clock)
    first, second = traceback_lines(11, 0, "AssertionError"), traceback_lines(12, 1, "AssertionError")
    for a, b in zip(first, second):  # interleaved, as two TP workers print the same assert
        model.feed_log(a + b)
    clock.now = 5.0
    model.tick()
    (group,) = model.snapshot().failures
    assert group.lanes.startswith("×2") and not group.provisional
    assert len(failure_alerts(model)) == 1


def test_how_sure_the_decoder_is_comes_with_the_failure():
    model = running_model(Clock())
    model.feed_log(b"(EngineCore pid=5) ERROR 11-30 04:12:00 [core.py:10] ValueError: bad shape for layer 3\n")
    (shown,) = model.snapshot().failures
    assert shown.provisional and shown.confidence == "likely"
    assert shown.basis == "exception line without traceback header"


def test_the_crash_log_fed_line_by_line_alerts_once_and_keeps_the_worker_assert_first():
    model = running_model(Clock())
    for line in WORKER_ASSERT_LOG.read_bytes().splitlines(keepends=True):
        model.feed_log(line)
    model.finish_log()
    view = model.snapshot()
    assert view.failures[0].summary.startswith("AssertionError at vllm_connector.py:142 in _submit")
    assert not any(f.provisional for f in view.failures)
    assert len(failure_alerts(model)) == 1
