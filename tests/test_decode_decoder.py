"""The incremental decoder: chunking never changes what it reads, lanes within a line, glued lines, the clock."""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglewatch.decode.decoder import Decoder, decode_bytes
from eaglewatch.decode.events import BarUpdate, LineEvent, ProcessDeath, TracebackEvent

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_FILES = sorted((FIXTURES / "vllm-logs").glob("*.log")) + sorted((FIXTURES / "decode").glob("*.log"))


def decode_chunks(data: bytes, cuts: list[int]) -> list:
    decoder = Decoder(clock=lambda: 0.0)
    events: list = []
    start = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events += decoder.feed(data[start:cut])
        start = cut
    return events + decoder.finish()


def assert_same_reading(chunked: list, whole_file: list) -> None:
    """What chunking may change: a bar rewrite that the next segment of the same chunk rewrites again is skipped
    (``bars.rewritten_at_once``), so a file read in one go reports fewer rewrites. Everything else is the same,
    in the same order, and so is every bar's last state."""
    assert [e for e in chunked if type(e) is not BarUpdate] == [e for e in whole_file if type(e) is not BarUpdate]
    chunked_bars = [e for e in chunked if type(e) is BarUpdate]
    whole_bars = [e for e in whole_file if type(e) is BarUpdate]
    rest = iter(chunked_bars)
    assert all(any(bar == other for other in rest) for bar in whole_bars), "a rewrite read whole is missing"
    assert {(b.lane, b.desc): b for b in chunked_bars} == {(b.lane, b.desc): b for b in whole_bars}


@lru_cache(maxsize=None)
def whole(path: Path) -> tuple[bytes, tuple]:
    data = path.read_bytes()
    events, _ = decode_bytes(data)
    return data, tuple(events)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FIXTURE_FILES), st.data())
def test_random_chunking_gives_the_same_events_as_whole_file(path: Path, data: st.DataObject) -> None:
    content, expected = whole(path)
    cuts = data.draw(st.lists(st.integers(0, len(content)), max_size=60))
    assert_same_reading(decode_chunks(content, cuts), list(expected))


# Random streams built from pieces that stress the boundaries: prefixes with colour, multi-byte text, \r bars
# without newlines, logged and unlogged traceback lines, glued lines.
PIECES = [
    b"\x1b[0;36m(Worker_TP0 pid=11)\x1b[0;0m ",
    b"(Worker_TP1 pid=12) ",
    b"(EngineCore_DP0 pid=10) ",
    b"(VllmWorker rank=3 pid=13) ",
    b"[rank2]: ",
    b"INFO 11-30 01:28:09 [model.py:733] Resolved architecture \xe2\x82\xac \xe6\xbc\xa2\n",
    b"\x1b[33mWARNING\x1b[0m 11-30 01:28:10 [vllm.py:1703] careful\n",
    b"ERROR 11-30 01:29:02 [multiproc_executor.py:1063] Traceback (most recent call last):\n",
    b'ERROR 11-30 01:29:02 [multiproc_executor.py:1063]   File "/opt/venv/lib/python3.11/site-packages/vllm/a.py", '
    b"line 5, in f\n",
    b"ERROR 11-30 01:29:02 [multiproc_executor.py:1063]     g()\n",
    b"ERROR 11-30 01:29:02 [multiproc_executor.py:1063] AssertionError\n",
    b"Traceback (most recent call last):\n",
    b'  File "/srv/run.py", line 3, in main\n',
    b"    raise ValueError('\xc3\xa9')\n",
    b"ValueError: \xc3\xa9\n",
    b"\rLoading safetensors checkpoint shards:  50% Completed | 4/8 [00:01<00:01,  3.00it/s]",
    b"\rProcessed prompts:  33%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x8e      | 1/3 [00:00<00:01,  1.14it/s]",
    b"\r\n",
    b"\n",
    b"Worker proc VllmWorker-1 died unexpectedly (exitcode=-9)\n",
    b"Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n",
    b'  File "/srv/x.py", line 9 in crash\n',
    b"\xff\xfe broken bytes \xe2\x82\n",
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40), st.data())
def test_random_streams_decode_the_same_whatever_the_chunking(pieces: list[bytes], data: st.DataObject) -> None:
    content = b"".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(content)), max_size=30))
    whole_events, _ = decode_bytes(content)
    assert_same_reading(decode_chunks(content, cuts), whole_events)


def test_byte_by_byte_equals_whole_file() -> None:
    for path in FIXTURE_FILES[:3] + [FIXTURES / "vllm-logs" / "llama_extract_tty_pty.log"]:
        content, expected = whole(path)
        assert_same_reading(decode_chunks(content, list(range(len(content)))), list(expected))


def test_prefix_then_carriage_return_bar_belongs_to_the_prefix_lane() -> None:
    events, state = decode_bytes(
        b"(EngineCore pid=835) \rLoading safetensors checkpoint shards:  33% Completed | 3/9 [00:00<00:00, 28.53it/s]\n"
        b"\rRendering prompts: 100%|##########| 4/4 [00:00<00:00, 235.12it/s]\n"
    )
    bars = [e for e in events if isinstance(e, BarUpdate)]
    assert [(b.lane, b.desc) for b in bars] == [("EngineCore", "Loading safetensors checkpoint shards"),
                                                ("main", "Rendering prompts")]
    assert not [e for e in events if isinstance(e, LineEvent)]


def test_line_glued_after_a_bar_is_split_into_its_own_lane() -> None:
    events, _ = decode_bytes(
        b"\rProcessed prompts:   0%|          | 0/3 [00:00<?, ?it/s, est. speed input: 0.00 toks/s]"
        b"(Worker pid=20007) ERROR 11-30 01:29:02 [multiproc_executor.py:1063] WorkerProc hit an exception.\r\n"
        b"\rProcessed prompts: 100%|##########| 3/3 [00:00<00:00, 3.25it/s]"
        b"/opt/x/c10d_logger.py:83: FutureWarning: old\n"
    )
    lines = [e for e in events if isinstance(e, LineEvent)]
    assert [(e.lane, e.level, e.text) for e in lines] == [
        ("Worker", "ERROR", "WorkerProc hit an exception."),
        ("main", "WARNING", "FutureWarning: old"),
    ]
    assert [e.n for e in events if isinstance(e, BarUpdate)] == [0, 3]


def test_clock_stamps_output_and_progress_and_stall_detection() -> None:
    now = [100.0]
    decoder = Decoder(clock=lambda: now[0])
    decoder.feed(b"(Worker_TP0 pid=1) \rshards:  10%|#         | 1/10 [00:01<00:09, 1.00it/s]")
    decoder.feed(b"\n(Worker_TP1 pid=2) INFO 11-30 01:28:09 [x.py:1] hello\n")
    now[0] = 160.0
    decoder.feed(b"(Worker_TP0 pid=1) \rshards:  10%|#         | 1/10 [00:02<00:18, 0.50it/s]\n")
    state = decoder.state
    assert state.last_progress_at == {"Worker_TP0": 100.0}  # the bar printed again but did not move
    assert state.last_output_at == {"Worker_TP0": 160.0, "Worker_TP1": 100.0}
    assert state.stalled(now=400.0, after_s=240.0) == ["Worker_TP0"]
    assert state.stalled(now=200.0, after_s=240.0) == []
    now[0] = 500.0
    decoder.feed(b"(Worker_TP0 pid=1) \rshards: 100%|##########| 10/10 [00:09<00:00, 1.00it/s]\n")
    assert state.last_progress_at["Worker_TP0"] == 500.0
    assert state.stalled(now=10_000.0, after_s=240.0) == []  # finished bars do not stall


def test_flush_idle_completes_a_traceback_once_the_lane_is_quiet() -> None:
    now = [0.0]
    decoder = Decoder(clock=lambda: now[0])
    events = decoder.feed(
        b"(Worker pid=5) ERROR 11-30 01:29:02 [m.py:1] Traceback (most recent call last):\n"
        b'(Worker pid=5) ERROR 11-30 01:29:02 [m.py:1]   File "/srv/a.py", line 1, in f\n'
        b"(Worker pid=5) ERROR 11-30 01:29:02 [m.py:1] RuntimeError: boom\n"
    )
    assert not [e for e in events if isinstance(e, TracebackEvent)]
    now[0] = 1.0
    assert decoder.flush_idle(idle_s=2.0) == []
    now[0] = 3.0
    (tb,) = decoder.flush_idle(idle_s=2.0)
    assert tb.message == "boom" and decoder.state.root_cause() is not None
    assert not [e for e in decoder.finish() if isinstance(e, TracebackEvent)]


def test_flush_idle_reports_a_crash_dump_that_nothing_follows() -> None:
    now = [0.0]
    decoder = Decoder(clock=lambda: now[0])
    decoder.feed(b"Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
                 b'  File "/srv/x.py", line 9 in crash\n')
    # Shown at once, marked provisional (the rest of the dump may follow), until the lane has been quiet.
    shown = decoder.state.root_cause()
    assert shown is not None and shown.provisional and shown.exc_type == "Fatal Python error"
    now[0] = 5.0
    (dump,) = decoder.flush_idle(idle_s=2.0)
    assert dump.signal == "SIGSEGV" and dump.innermost is not None and dump.innermost.function == "crash"
    root = decoder.state.root_cause()
    assert root is not None and not root.provisional and root.first is dump


def test_emit_lines_false_still_fills_the_state() -> None:
    decoder = Decoder(emit_lines=False)
    events = decoder.feed(b"(Worker pid=5) INFO 11-30 01:29:02 [m.py:1] hello\nKilled\n")
    assert [type(e) for e in events] == [ProcessDeath]
    lanes = {lane.name: lane.lines for lane in decoder.state.lanes_list()}
    assert lanes == {"Worker": 1, "main": 1}


def test_memory_stays_bounded_on_repetitive_input() -> None:
    block = b"".join(
        b"(Worker_TP%d pid=%d) INFO 11-30 01:28:09 [x.py:1] step %d\n" % (i % 8, 100 + i % 8, i) for i in range(200)
    )
    block += b"(Worker_TP3 pid=103) ERROR 11-30 01:29:02 [m.py:1] Traceback (most recent call last):\n"
    block += b'(Worker_TP3 pid=103) ERROR 11-30 01:29:02 [m.py:1]   File "/srv/a.py", line 1, in f\n'
    block += b"(Worker_TP3 pid=103) ERROR 11-30 01:29:02 [m.py:1] RuntimeError: again\n"
    decoder = Decoder(emit_lines=False)
    for _ in range(300):
        decoder.feed(block)
    decoder.finish()
    state = decoder.state
    assert len(state.lanes) == 8 and all(len(lane.tail) <= state.tail_lines for lane in state.lanes.values())
    (group,) = state.failures_ranked()
    assert group.count == 300


def test_state_can_be_read_while_another_thread_feeds() -> None:
    content, _ = whole(FIXTURES / "vllm-logs" / "crash_weight_load_shape_mismatch.log")
    decoder = Decoder()
    errors: list[BaseException] = []

    def feed() -> None:
        try:
            for _ in range(30):
                for start in range(0, len(content), 512):
                    decoder.feed(content[start : start + 512])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=feed)
    worker.start()
    while worker.is_alive():
        decoder.state.failures_ranked()
        decoder.state.bars_list()
        decoder.state.lanes_list()
    worker.join()
    assert not errors
    assert decoder.state.root_cause() is not None
