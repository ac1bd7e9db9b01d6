"""What Slurm says about the tasks of an array job, parsed; no IO.

Three sources, in the order they are trusted (docs/slurm.md):

* ``squeue --json`` (openapi v0.0.38 on Slurm 22.05; later versions wrap numbers as ``{"set", "number"}`` and
  states in lists, read too): every job the controller still holds, finished ones included until ``MinJobAge``;
* ``scontrol show job --oneliner`` where ``squeue --json`` is missing (a build without the JSON plugin): the same
  facts as ``key=value`` words;
* the batch output file, once the controller has forgotten the job (``sacct`` needs ``slurmdbd``, which many
  clusters lack): ``slurmstepd`` writes ``*** JOB 45 ON node CANCELLED AT ... DUE TO TIME LIMIT ***`` there when it
  ends a job; a job that ended by itself leaves no such line and the rank's ``exit.json`` tells how it ended.

A task is keyed by ``(array job id, task id)``: the pending part of an array is one record whose
``array_task_string`` ("0-3", "1,5-7%2") names the tasks it still holds.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Tuple

# Slurm's own words (job_state). Finished: the task will not run again unless resubmitted.
PENDING = "PENDING"
RUNNING = "RUNNING"
COMPLETING = "COMPLETING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
PREEMPTED = "PREEMPTED"
NODE_FAIL = "NODE_FAIL"
OUT_OF_MEMORY = "OUT_OF_MEMORY"
FINISHED_STATES = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY,
                             "BOOT_FAIL", "DEADLINE"})
# Reasons that only describe why a job waited: once it ran, or was cancelled, they are stale.
_STALE_REASON_STATES = frozenset({RUNNING, COMPLETING, COMPLETED, CANCELLED})

# typing.Tuple: an alias is evaluated at import, and ``tuple[int, int]`` needs Python 3.9 (the agent runs on 3.8+).
TaskKey = Tuple[int, int]


@dataclass(frozen=True)
class SlurmTask:
    """One array task as the controller reports it. Times are epoch seconds, None when not (yet) known."""

    array_job_id: int
    task_id: int
    job_id: int
    state: str
    reason: str | None = None
    node: str | None = None
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None  # the batch script's own code, None when a signal ended it or it has not ended
    exit_signal: int | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def active(self) -> bool:
        return not self.finished

    def to_record(self) -> dict[str, Any]:
        """What a job record keeps of a finished task, for when the controller has forgotten it."""
        return {"state": self.state, "reason": self.reason, "node": self.node, "submit_time": self.submit_time,
                "start_time": self.start_time, "end_time": self.end_time, "exit_code": self.exit_code,
                "exit_signal": self.exit_signal}


class SlurmParseError(ValueError):
    """Output that is not what the Slurm command prints."""


def parse_job_ref(ref: str) -> TaskKey:
    """``"123_4"`` (array job 123, task 4) as a key."""
    array, _, task = ref.partition("_")
    return int(array), int(task)


def expand_task_string(text: str) -> list[int]:
    """Task ids of an ``array_task_string``: "0-3", "1,5-7", "0-15:5", with an optional "%N" throttle."""
    text = text.split("%", 1)[0].strip().strip("[]")
    ids: list[int] = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        ids.extend(range(int(first), int(last or first) + 1, int(step or 1)))
    return ids


def _number(value: Any) -> int | None:
    """An integer field of either JSON shape: a plain number (v0.0.38) or ``{"set": …, "number": …}`` (later)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _epoch(value: Any) -> float | None:
    number = _number(value)
    return float(number) if number else None  # 0 is Slurm's "not set"


def _state(value: Any) -> str:
    if isinstance(value, list):  # later versions: the base state first, then flags
        value = value[0] if value else ""
    return str(value or "").upper()


def _reason(state: str, reason: Any) -> str | None:
    text = str(reason or "").strip()
    if not text or text == "None" or state in _STALE_REASON_STATES:
        return None
    return text


def _exit_of(state: str, code: int | None, signal: int | None) -> tuple[int | None, int | None]:
    if state not in FINISHED_STATES:
        return None, None
    if state == CANCELLED and not signal and not code:
        return None, None  # cancelled before it ran: "0:0" is no exit status
    if signal:
        return None, signal
    return code, None


def _exit_fields(value: Any) -> tuple[int | None, int | None]:
    """(code, signal) of squeue --json's ``exit_code``: a wait status in v0.0.38 (768 for exit 3, 15 for SIGTERM),
    ``{"return_code", "signal": {"id"}}`` in later versions."""
    if isinstance(value, dict):
        signal = value.get("signal")
        return _number(value.get("return_code")), (_number(signal.get("id")) if isinstance(signal, dict) else None)
    raw = _number(value)
    if raw is None:
        return None, None
    return (raw >> 8) & 0xFF, (raw & 0x7F) or None


def parse_squeue_json(text: str) -> dict[TaskKey, SlurmTask]:
    """Every array task in ``squeue --json`` output. Jobs that are not array tasks are left out (ours always are)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SlurmParseError(f"squeue --json printed something that is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise SlurmParseError("squeue --json printed no 'jobs' list")
    found: dict[TaskKey, SlurmTask] = {}
    for job in data["jobs"]:
        if not isinstance(job, dict):
            continue
        array_job_id = _number(job.get("array_job_id"))
        job_id = _number(job.get("job_id"))
        if not array_job_id or job_id is None:
            continue
        state = _state(job.get("job_state"))
        code, signal = _exit_of(state, *_exit_fields(job.get("exit_code")))
        task_id = _number(job.get("array_task_id"))
        task_string = str(job.get("array_task_string") or "")
        for task in expand_task_string(task_string) if task_string else [task_id] if task_id is not None else []:
            found[(array_job_id, task)] = SlurmTask(
                array_job_id=array_job_id, task_id=task, job_id=job_id, state=state,
                reason=_reason(state, job.get("state_reason")),
                node=str(job.get("nodes") or job.get("batch_host") or "") or None,
                submit_time=_epoch(job.get("submit_time")), start_time=_epoch(job.get("start_time")),
                end_time=_epoch(job.get("end_time")), exit_code=code, exit_signal=signal,
            )
    return found


_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol_words(line: str) -> dict[str, str]:
    """One line of ``scontrol show job --oneliner`` as a dict. A value runs up to the next ``Key=``: the few fields
    read here hold no spaces, and a path with spaces in another field does not shift them."""
    matches = list(_SCONTROL_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields.setdefault(match.group(1), line[match.end():end].strip())
    return fields


def _scontrol_time(value: str | None) -> float | None:
    if not value or value in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def parse_scontrol(text: str) -> dict[TaskKey, SlurmTask]:
    """Every array task in ``scontrol show job --oneliner`` output (one job a line)."""
    found: dict[TaskKey, SlurmTask] = {}
    for line in text.splitlines():
        fields = parse_scontrol_words(line)
        array_job_id = _int_or_none(fields.get("ArrayJobId"))
        job_id = _int_or_none(fields.get("JobId"))
        if not array_job_id or job_id is None:
            continue
        state = fields.get("JobState", "").split()[0].upper() if fields.get("JobState") else ""
        code_text, _, signal_text = (fields.get("ExitCode") or "").partition(":")
        code, signal = _exit_of(state, _int_or_none(code_text), _int_or_none(signal_text) or None)
        node = fields.get("NodeList") or fields.get("BatchHost")
        task_text = fields.get("ArrayTaskId", "")
        try:
            tasks = expand_task_string(task_text)
        except ValueError:
            continue
        for task in tasks:
            found[(array_job_id, task)] = SlurmTask(
                array_job_id=array_job_id, task_id=task, job_id=job_id, state=state,
                reason=_reason(state, fields.get("Reason")),
                node=node if node and node != "(null)" else None,
                submit_time=_scontrol_time(fields.get("SubmitTime")),
                start_time=_scontrol_time(fields.get("StartTime")) if state != PENDING else None,
                end_time=_scontrol_time(fields.get("EndTime")), exit_code=code, exit_signal=signal,
            )
    return found


# slurmstepd's line in the batch output when it ends a job: "*** JOB 45 ON vm CANCELLED AT 2026-12-01T16:12:44
# DUE TO TIME LIMIT ***" (also "DUE TO PREEMPTION", "DUE TO NODE FAILURE"; a plain scancel has no DUE TO).
_STEPD_END = re.compile(rb"\*\*\* JOB (\d+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*")
_DUE_TO = {"TIME LIMIT": TIMEOUT, "PREEMPTION": PREEMPTED, "NODE FAILURE": NODE_FAIL}
_OOM = re.compile(rb"Detected \d+ oom[-_]kill event")


@dataclass(frozen=True)
class StepdEnd:
    state: str
    node: str
    at: float | None


def stepd_end(output: bytes) -> StepdEnd | None:
    """How Slurm ended the task, from its batch output (None when it ended by itself)."""
    matches = list(_STEPD_END.finditer(output))
    match = matches[-1] if matches else None  # the last: a task ends once
    if match is None:
        if _OOM.search(output):
            return StepdEnd(OUT_OF_MEMORY, "", None)
        return None
    due = (match.group(4) or b"").decode("ascii", "replace")
    when = _scontrol_time(match.group(3).decode("ascii", "replace"))
    return StepdEnd(_DUE_TO.get(due, CANCELLED), match.group(2).decode("utf-8", "replace"), when)


def state_from_exit(exit_info: dict[str, Any] | None) -> str | None:
    """A finished task's state from the rank's exit.json alone: what is left once Slurm has forgotten the job and
    its batch output names no cause."""
    if not exit_info:
        return None
    if exit_info.get("stopped") is True:
        return CANCELLED  # the operator's cancel or restart (stop.json before scancel), not a failure
    code = exit_info.get("code")
    if code == 0 and not exit_info.get("signal"):
        return COMPLETED
    return FAILED
