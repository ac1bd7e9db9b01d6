"""The files of a Slurm job and of a run that the agent reads or appends to, as hostile input: the job record, a
rank's batch output, a run's GPU history and the log the rank launcher appends to may be a FIFO, a device, huge,
not UTF-8 or JSON of other types. Each is a clear "cannot read" (or nothing read), in bounded time; never a hang
and never a traceback.

Every call runs in a thread that is given a few seconds: one that blocks (a FIFO opened without O_NONBLOCK, a read
of /dev/zero) fails the test instead of hanging it, and the FIFOs are opened from this side at the end so that
such a thread is let go.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any, Callable, cast

import pytest
from telemetry_replay import ReplayNvml, raw_readings

from eaglewatch.pipeline.agent import slurm, slurm_task
from eaglewatch.pipeline.agent.rundir import RECORD_LIMIT, RunDir, new_run_id, write_json_atomic
from eaglewatch.pipeline.agent.slurm_record import (
    JobNotFound,
    UnreadableJob,
    find_job,
    load_record,
    read_record,
    record_path,
)
from eaglewatch.pipeline.telemetry import history
from eaglewatch.pipeline.telemetry.history import HISTORY_FILE, OLDER_FILE, HistoryRecorder, read_recent
from eaglewatch.pipeline.telemetry.nvml import NvmlSource

BOUND_S = 10.0
HUGE = 1 << 30  # a sparse file: no disk, and far more than anything here may read of it


class Outcome:
    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None


def bounded(call: Callable[[], Any]) -> Outcome:
    """call's result or exception, or a failed test when it has not returned within BOUND_S."""
    outcome = Outcome()

    def target() -> None:
        try:
            outcome.value = call()
        except BaseException as exc:  # handed to the test, which says which one is documented
            outcome.error = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"did not return within {BOUND_S:g} s"
    return outcome


@pytest.fixture
def fifos():
    """mkfifo, and at the end open each FIFO's other end (O_RDWR never waits), so that a reader or writer stuck on
    one in a thread is let go."""
    made: list[Path] = []

    def make(path: Path) -> Path:
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for path in made:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            continue
        os.close(fd)


# --- the job record ---------------------------------------------------------------------------------------
def _record(job: str, **changes: Any) -> dict[str, Any]:
    """A record as ``slurm.launch`` writes one, for two ranks."""
    record: dict[str, Any] = {
        "job": job, "name": "hostile", "scheduler": "slurm", "target": "login", "created_at": 1.0e9,
        "world_size": 2, "output_dir": None, "scheduler_job_id": "4711", "run_root": "/nowhere",
        "request": {"argv": ["python", "-c", "pass"], "cwd": "/", "env": {}, "name": "hostile", "python": None,
                    "installed": False, "slurm": {}},
        "ranks": [{"rank": rank, "run": new_run_id(f"hostile-rank{rank}"), "scheduler_job_id": f"4711_{rank}",
                   "output": None, "submitted_at": 1.0e9, "final": {"state": "COMPLETED", "exit_code": 0},
                   "attempts": []} for rank in range(2)],
    }
    record.update(changes)
    return record


def _fifo(path: Path, fifos: Callable[[Path], Path]) -> None:
    fifos(path)


def _dev_zero(path: Path, fifos: Callable[[Path], Path]) -> None:
    path.symlink_to("/dev/zero")


def _bytes(data: bytes) -> Callable[[Path, Callable[[Path], Path]], None]:
    def write(path: Path, fifos: Callable[[Path], Path]) -> None:
        path.write_bytes(data)
    return write


def _json(obj: Any) -> Callable[[Path, Callable[[Path], Path]], None]:
    return _bytes(json.dumps(obj).encode())


def _huge(path: Path, fifos: Callable[[Path], Path]) -> None:
    with open(path, "wb") as fh:
        fh.truncate(HUGE)


def _deep(path: Path, fifos: Callable[[Path], Path]) -> None:
    path.write_bytes(b"[" * 200_000 + b"]" * 200_000)


JOB = new_run_id("hostile")
RANK = _record(JOB)["ranks"][0]

# (case, how the record file is made, what the message says)
RECORD_CASES = [
    ("fifo", _fifo, "it is a FIFO, not a regular file"),
    ("dev_zero_symlink", _dev_zero, "it is a character device, not a regular file"),
    ("huge", _huge, f"holds more than {RECORD_LIMIT} bytes"),
    ("invalid_utf8", _bytes(b'{"job": "\xff\xfe"}'), "it is not UTF-8 text"),
    ("not_json", _bytes(b'{"job": '), "it is not JSON"),
    ("deeply_nested", _deep, "it is not JSON"),
    ("json_list", _json([_record(JOB)]), "it holds a JSON list, not an object"),
    ("json_string", _json("job"), "it holds a JSON string, not an object"),
    ("other_job", _json(_record(new_run_id("other"))), "it names job"),
    ("ranks_object", _json(_record(JOB, ranks={"0": RANK})), "its ranks are a JSON object, not a list"),
    ("rank_not_object", _json(_record(JOB, ranks=[RANK, 1])), "a rank is a JSON number, not an object"),
    ("rank_number_text", _json(_record(JOB, ranks=[RANK, {**RANK, "rank": "1"}])), "a rank's number is '1'"),
    ("rank_missing", _json(_record(JOB, ranks=[RANK])), "not each rank of 0 to 1 once"),
    ("world_size_text", _json(_record(JOB, world_size="2")), "its world_size is '2'"),
    ("request_list", _json(_record(JOB, request=[])), "its request is a JSON list, not an object"),
    ("argv_numbers", _json(_record(JOB, request={**_record(JOB)["request"], "argv": [1, 2]})),
     "its request's argv is not a list of strings"),
    ("output_number", _json(_record(JOB, ranks=[{**RANK, "output": 3}, {**RANK, "rank": 1}])),
     "rank 0: its output is 3, not a string"),
    ("attempts_object", _json(_record(JOB, ranks=[{**RANK, "attempts": {}}, {**RANK, "rank": 1}])),
     "rank 0: its attempts are a JSON object, not a list"),
    ("final_list", _json(_record(JOB, ranks=[{**RANK, "final": []}, {**RANK, "rank": 1}])),
     "rank 0: its final state is a JSON list, not an object"),
]


@pytest.mark.parametrize(("make", "says"), [case[1:] for case in RECORD_CASES], ids=[case[0] for case in RECORD_CASES])
def test_a_job_record_that_cannot_be_read_is_said_in_one_line(tmp_path: Path, fifos, make, says: str) -> None:
    root = tmp_path / "runs"
    record_path(root, JOB).parent.mkdir(parents=True)
    make(record_path(root, JOB), fifos)

    for call in (lambda: load_record(root, JOB), lambda: find_job(root, JOB), lambda: find_job(root, JOB[:10]),
                 lambda: slurm.status(root, JOB)):
        outcome = bounded(call)
        assert isinstance(outcome.error, UnreadableJob), outcome.error
        message = str(outcome.error)
        assert message.startswith(f"job record {record_path(root, JOB)} cannot be read: ") and says in message
        assert "\n" not in message and len(message) < 400
    assert bounded(lambda: read_record(root, JOB)).value is None
    assert bounded(lambda: slurm.list_jobs(root)).value == []  # the others are listed; this one cannot be
    by_name = bounded(lambda: find_job(root, "hostile")).error
    assert isinstance(by_name, JobNotFound) and "1 job records cannot be read" in str(by_name)


def test_a_job_record_as_launch_writes_it_is_read(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    record_path(root, JOB).parent.mkdir(parents=True)
    record = _record(JOB)
    write_json_atomic(record_path(root, JOB), record)
    assert bounded(lambda: load_record(root, JOB)).value == record
    assert bounded(lambda: find_job(root, "hostile")).value["job"] == JOB


# --- a rank's batch output --------------------------------------------------------------------------------
OUTPUT_CASES = [
    ("fifo", _fifo),
    ("dev_zero_symlink", _dev_zero),
    ("huge", _huge),
    ("not_utf8", _bytes(b"\xff\xfe*** JOB 45 ON vm CANCELLED AT 2026-12-01T16:12:44 DUE TO TIME LIMIT ***\xff")),
]


@pytest.mark.parametrize("make", [case[1] for case in OUTPUT_CASES], ids=[case[0] for case in OUTPUT_CASES])
def test_a_batch_output_that_is_no_plain_file_is_not_read_and_a_huge_one_only_its_tail(
        tmp_path: Path, fifos, monkeypatch: pytest.MonkeyPatch, make) -> None:
    root = tmp_path / "runs"
    record_path(root, JOB).parent.mkdir(parents=True)
    output = tmp_path / "slurm-4711_0.out"
    make(output, fifos)
    ranks = [{**RANK, "output": str(output), "final": None}, {**RANK, "rank": 1}]
    write_json_atomic(record_path(root, JOB), _record(JOB, ranks=ranks))
    # No Slurm is asked: the controller has forgotten the task, so the batch output is where its end is read.
    monkeypatch.setattr(slurm, "query", lambda keys: ({}, None))

    tail = bounded(lambda: slurm._read_tail(str(output)))
    assert tail.error is None and len(tail.value) <= slurm.BATCH_OUTPUT_TAIL
    if stat.S_ISREG(os.stat(output).st_mode):
        assert len(tail.value) == min(os.stat(output).st_size, slurm.BATCH_OUTPUT_TAIL)
    else:
        assert tail.value == b""
    snapshot = bounded(lambda: slurm.status(root, JOB))
    assert snapshot.error is None, snapshot.error
    assert [rank["rank"] for rank in snapshot.value["ranks"]] == [0, 1]


# --- the log the rank launcher appends to -----------------------------------------------------------------
def _log_fifo(path: Path, fifos: Callable[[Path], Path]) -> int | None:
    fifos(path)
    return None


def _log_fifo_with_a_reader(path: Path, fifos: Callable[[Path], Path]) -> int | None:
    fifos(path)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a writer's open then succeeds: fstat must refuse it


def _log_dev_null(path: Path, fifos: Callable[[Path], Path]) -> int | None:
    path.symlink_to("/dev/null")
    return None


def _log_directory(path: Path, fifos: Callable[[Path], Path]) -> int | None:
    path.mkdir()
    return None


# (case, how the log is made, whether the stat before the open misses it (a FIFO swapped in after it), what
# exit.json's error says of the log)
LOG_CASES = [
    ("fifo", _log_fifo, False, "is a FIFO, not a regular file"),
    ("fifo_with_a_reader", _log_fifo_with_a_reader, False, "is a FIFO, not a regular file"),
    ("fifo_after_the_stat", _log_fifo, True, "No such device or address"),  # O_NONBLOCK, no reader: ENXIO at once
    ("fifo_with_a_reader_after_the_stat", _log_fifo_with_a_reader, True, "not a regular file"),  # fstat refuses it
    ("dev_null_symlink", _log_dev_null, False, "is a character device, not a regular file"),
    ("directory", _log_directory, False, "is a directory, not a regular file"),
]


@pytest.mark.parametrize(("make", "stat_misses", "says"), [case[1:] for case in LOG_CASES],
                         ids=[case[0] for case in LOG_CASES])
def test_a_rank_that_cannot_start_and_whose_log_is_no_plain_file_is_still_recorded(
        tmp_path: Path, fifos, monkeypatch: pytest.MonkeyPatch, make, stat_misses: bool, says: str) -> None:
    run = RunDir(tmp_path / new_run_id("rank0"))
    run.path.mkdir()
    reader = make(run.log_path, fifos)
    if stat_misses:
        monkeypatch.setattr(slurm_task, "not_regular", lambda path: None)
    try:
        outcome = bounded(lambda: slurm_task._refused(run, "the folder /gone does not exist on this node"))
    finally:
        if reader is not None:
            os.close(reader)
    assert outcome.error is None and outcome.value == slurm_task.EXIT_BAD_TASK
    info = run.exit_info()
    assert info is not None and info["code"] == slurm_task.EXIT_BAD_TASK
    assert "/gone does not exist" in info["error"] and "the run's log cannot be written" in info["error"]
    assert says in info["error"] and "\n" not in info["error"]


def test_a_rank_that_cannot_start_appends_to_a_plain_log(tmp_path: Path) -> None:
    run = RunDir(tmp_path / new_run_id("rank0"))
    run.path.mkdir()
    run.log_path.write_bytes(b"before\n")
    assert bounded(lambda: slurm_task._refused(run, "no Python with vLLM")).value == slurm_task.EXIT_BAD_TASK
    assert run.log_path.read_bytes() == b"before\neaglewatch: cannot start the rank on this node: no Python with vLLM\n"
    info = run.exit_info()
    assert info is not None and info["error"] == "no Python with vLLM"


def _replayed() -> NvmlSource:
    """NVML readings recorded on two H200s, replayed."""
    return NvmlSource(module=ReplayNvml(cast(Any, raw_readings("h200x2_raw.jsonl"))))


# --- a run's GPU history ----------------------------------------------------------------------------------
def _lines(*samples: Any) -> Callable[[Path, Callable[[Path], Path]], None]:
    return _bytes(b"".join(sample if isinstance(sample, bytes) else json.dumps(sample).encode() + b"\n"
                           for sample in samples))


GOOD_GPU = {"index": 0, "mem_used": 1, "mem_total": 2, "util_gpu": 50}
GOOD = {"t": 1.0, "gpus": [GOOD_GPU]}

# (case, how gpu_history.jsonl is made, what read_recent gives)
HISTORY_CASES = [
    ("fifo", _fifo, []),
    ("dev_zero_symlink", _dev_zero, []),
    ("huge_without_lines", _huge, []),
    ("invalid_utf8_and_torn_lines", _lines(b'{"t": "\xff"}\n', GOOD, b'{"t": 2, "gp\n', b"[" * 100_000 + b"\n"),
     [GOOD]),
    ("wrong_types", _lines([GOOD], {"t": 1, "gpus": {"0": {}}}, "x", {"t": 3, "gpus": [1, "a", None, GOOD_GPU]}),
     [{"t": 3, "gpus": [GOOD_GPU]}]),
]


@pytest.mark.parametrize(("make", "recent"), [case[1:] for case in HISTORY_CASES],
                         ids=[case[0] for case in HISTORY_CASES])
def test_a_gpu_history_that_is_no_plain_file_huge_or_garbled_is_read_bounded(
        tmp_path: Path, fifos, make, recent: list[Any]) -> None:
    make(tmp_path / HISTORY_FILE, fifos)
    fifos(tmp_path / OLDER_FILE)  # a FIFO too: read_recent goes on to the older file when the newer has too few lines
    outcome = bounded(lambda: read_recent(tmp_path, 10))
    assert outcome.error is None and outcome.value == recent

    recorder = bounded(lambda: HistoryRecorder(tmp_path, interval_s=0.01, max_lines=100, source=_replayed()))
    assert recorder.error is None
    recorded = bounded(recorder.value.record)
    if stat.S_ISREG(os.stat(tmp_path / HISTORY_FILE).st_mode):
        assert recorded.error is None
    else:  # neither read nor written: the recorder's thread takes the OSError and tries again next tick
        assert isinstance(recorded.error, OSError) and "not a regular file" in str(recorded.error)


def test_a_history_over_the_read_limit_is_counted_full_and_rotated(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(history, "READ_LIMIT", 1 << 20)
    # No newline: counted as far as it is read, it would hold 0 lines and grow on without ever being rotated.
    (tmp_path / HISTORY_FILE).write_bytes(b"x" * (2 << 20))
    recorder = HistoryRecorder(tmp_path, interval_s=0.01, max_lines=50, source=_replayed())
    assert recorder._lines == 50
    recorder.record()
    assert (tmp_path / OLDER_FILE).stat().st_size == 2 << 20 and len(read_recent(tmp_path, 5)) == 1

