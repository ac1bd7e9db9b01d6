"""The connection's items as the run state takes them (dispatch by type), the output folder the job names, and the
one wording of how a run ended. Pure: no agent, no Textual."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from eaglewatch import protocol as p
from eaglewatch.tui.commands import _common
from eaglewatch.tui.messages import Event, JobState, LinkState, LogChunk, Notice, RunSummary, Telemetry
from eaglewatch.tui.runend import LOST_TEXT, run_end
from eaglewatch.tui.runstate import RunModel


def test_each_item_type_reaches_its_part_of_the_model():
    model = RunModel("h", {"run": "r", "state": "running"})
    gpu = {"index": 0, "name": "H200", "mem_used": 10, "mem_total": 100, "util_gpu": 50.0}
    model.feed_items([
        LogChunk("r", 0, b"hello\n"),
        Event("r", 0, 10, p.make_event(p.EVENT_PHASE, phase=p.PHASE_LOADING)),
        Event("r", 10, 20, None, raw="not json"),
        Telemetry({"t": 1.0, "gpus": [gpu]}),
        Notice("r", "SIGTERM sent"),
        LinkState("lost", "no heartbeat"),
    ])
    view = model.snapshot()
    assert view.phase == p.PHASE_LOADING and view.link == "lost" and [g.name for g in view.gpus] == ["H200"]
    assert [line.text for line in model.log_since(0)] == ["hello", "SIGTERM sent", "link lost: no heartbeat"]
    model.feed_items([JobState("r", p.JOB_EXITED, {"code": 0}, RunSummary(run="r", state=p.JOB_EXITED))])
    assert model.snapshot().exit_text == "exit code 0"


def test_an_item_of_a_type_without_a_case_is_an_error_not_dropped():
    @dataclass(frozen=True)
    class LogChunk:  # the same name as the real one: names are not what dispatch reads
        run: str
        offset: int
        data: bytes

    model = RunModel("h", {"run": "r"})
    with pytest.raises(TypeError, match="no case for"):
        model.feed_items([LogChunk("r", 0, b"lost?\n")])  # type: ignore[list-item]
    assert model.log_since(0) == []


def test_the_output_folder_is_the_one_the_job_names_and_the_run_directory_until_then():
    model = RunModel("h", {"run": "r", "run_dir": "/runs/r", "argv": ["x", "--output-dir", "/from/argv"]})
    assert model.output_dir() == "/runs/r"  # argv is not read
    model.feed_event(p.make_event(p.EVENT_INFO, output_dir="/data/demo"))
    assert model.output_dir() == "/data/demo"
    model.feed_event(p.make_event(p.EVENT_INFO, engine="vllm", samples=64))  # other facts leave it alone
    assert model.output_dir() == "/data/demo"
    # The demo names its work folder, then its extraction its own: the last one said wins.
    model.feed_items([Event("r", 0, 1, p.make_event(p.EVENT_INFO, output_dir="/data/demo/hidden-states"))])
    assert model.output_dir() == "/data/demo/hidden-states"
    assert RunModel("h", {"run": "r"}).output_dir() is None


STOPPED_TERM = {"signal": 15, "signal_name": "SIGTERM", "stopped": True, "stop": {"by": "operator", "via": "stop"}}


@pytest.mark.parametrize(
    "state, exit_info, text, code, phase",
    [
        (p.JOB_EXITED, {"code": 0}, "exit code 0", 0, "exited"),
        (p.JOB_EXITED, {"code": 7}, "exit code 7", 7, "failed"),
        (p.JOB_EXITED, {"signal": 15, "signal_name": "SIGTERM"}, "killed by SIGTERM", 143, "failed"),
        (p.JOB_EXITED, {"signal": 9}, "killed by 9", 137, "failed"),
        (p.JOB_EXITED, {"code": 127, "error": "no such file: 'nope'"}, "did not start: no such file: 'nope'", 127,
         "failed"),
        (p.JOB_LOST, None, LOST_TEXT, None, "lost"),
        # The operator's stop: the shell status stays 128 + the signal, but it is no failure and rings nothing.
        (p.JOB_EXITED, STOPPED_TERM, "stopped by the operator (SIGTERM)", 143, "stopped"),
        (p.JOB_EXITED, {"signal": 9, "signal_name": "SIGKILL", "stopped": True}, "stopped by the operator (SIGKILL)",
         137, "stopped"),
        # A job that handles SIGTERM itself and exits with a code of its own was still stopped.
        (p.JOB_EXITED, {"code": 1, "stopped": True}, "stopped by the operator (exit code 1)", 1, "stopped"),
        # Only ``true`` says so: anything else in the field is a kill nobody asked for.
        (p.JOB_EXITED, {"signal": 15, "signal_name": "SIGTERM", "stopped": "yes"}, "killed by SIGTERM", 143,
         "failed"),
    ],
)
def test_a_run_end_reads_the_same_in_the_model_and_the_commands(state, exit_info, text, code, phase):
    end = run_end(state, exit_info)
    assert end is not None and (end.text, end.code) == (text, code)
    assert end.stopped == (phase == "stopped") and end.failed == (phase in ("failed", "lost"))
    summary = RunSummary(run="r", state=state, exit=exit_info)
    assert _common.describe_exit(summary) == text
    assert _common.exit_status(summary) == (1 if code is None else code)
    model = RunModel("h", summary)
    model.feed_job(state, exit_info, {})
    view = model.snapshot()
    assert (view.exit_text, view.exit_code, view.phase) == (text, code, phase)
    assert ("failed" in view.marks) == (phase == "failed")
    alerts = [a.message for a in model.alerts_since(0)]
    assert alerts == ([f"the run ended: {text}"] if phase in ("failed", "lost") else [])


def test_a_run_that_has_not_ended_has_no_end():
    assert run_end(p.JOB_RUNNING, None) is None and run_end(None, None) is None
    assert _common.describe_exit(RunSummary(run="r", state=p.JOB_RUNNING)) == "running"
    view = RunModel("h", {"run": "r", "state": p.JOB_RUNNING}).snapshot()
    assert (view.exit_text, view.exit_code) == (None, None)


def test_the_runs_list_says_it_with_the_same_words():
    pytest.importorskip("textual")
    from eaglewatch.tui.app.screens.runs import result_of

    assert result_of(RunSummary(run="r", state=p.JOB_EXITED, exit={"signal": 15, "signal_name": "SIGTERM"})) \
        == "killed by SIGTERM"
    assert result_of(RunSummary(run="r", state=p.JOB_EXITED, exit=STOPPED_TERM)) \
        == "stopped by the operator (SIGTERM)"
    assert result_of(RunSummary(run="r", state=p.JOB_EXITED, exit={"code": 0})) == "exit code 0"
    assert result_of(RunSummary(run="r", state=p.JOB_LOST)) == ""  # its state column says lost
