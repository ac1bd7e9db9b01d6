"""The wire and file schema shared by the GPU host and the operator side.

Two kinds of JSON lines live here, both carrying the same version field ``v``:

* **Pipeline events** (``events.jsonl`` in the output folder and the run directory), written by
  ``prepare``/``extract``/``verify`` whether or not anything watches. Each has ``kind``.
* **Agent messages**, one JSON object a line on the agent's stdout (over one SSH channel or a local pipe).
  Each has ``type``.

Stdlib only: both halves import this module, and the GPU side may be a bare Python on the host.
A reader refuses a version it does not know with :class:`ProtocolVersionError`, rather than guessing.
See docs/protocol.md for every field.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Iterable, Mapping

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

# --- pipeline events (field "kind") -------------------------------------------------------------
EVENT_PHASE = "phase"  # phase: one of PHASES; detail: str
# done, total, tokens, bytes, elapsed_s, tokens_per_s, samples_per_s, eta_s; recent_tokens_per_s, pace ("disk" or
# "engine"), writer_wait_share when the engine streams (docs/pipeline.md)
EVENT_PROGRESS = "progress"
EVENT_SAMPLE = "sample"  # id, tokens, bytes, file
EVENT_WARNING = "warning"  # message, code
EVENT_ERROR = "error"  # message, exc_type, traceback
EVENT_CHECK = "check"  # preflight: name, status (one of CHECK_STATUSES), reason, fix, details
EVENT_INFO = "info"  # free-form facts worth keeping: engine, model, layer_ids, ...

PHASE_VALIDATING = "validating"
PHASE_LOADING = "loading"
PHASE_EXTRACTING = "extracting"
PHASE_DONE = "done"
PHASE_FAILED = "failed"
PHASES = (PHASE_VALIDATING, PHASE_LOADING, PHASE_EXTRACTING, PHASE_DONE, PHASE_FAILED)

# Check statuses (EVENT_CHECK "status"): a check event is a result.
CHECK_PASS = "pass"
CHECK_WARN = "warn"
CHECK_FAIL = "fail"
CHECK_STATUSES = (CHECK_PASS, CHECK_WARN, CHECK_FAIL)
# A check that takes a while (the miniature) says so as each of its stages starts, in an event of its own kind, so
# that a reader of check events sees results only: name (the check's), stage (one of MINIATURE_STAGES), elapsed_s
# (since the check began). The check's result, an EVENT_CHECK of the same name, follows.
EVENT_CHECK_STAGE = "check_stage"
MINIATURE_STAGES = ("planning", "starting", "building", "loading the engine", "extracting")
# The stage of the check "miniature vs transformers", which follows a passed miniature on the vllm engine.
COMPARISON_STAGE = "comparing with transformers"

# --- agent messages (field "type") --------------------------------------------------------------
# docs/protocol.md describes every field; the one-line notes here are a reminder.
MSG_HELLO = "hello"  # agent -> client, first line: agent_version, pid, host, user, run_root, python, features
MSG_LOG = "log"  # run, offset, data (base64 of raw bytes)
MSG_EVENT = "event"  # run, offset, end, event (one pipeline event) | raw (a line that is not JSON)
MSG_TELEMETRY = "telemetry"  # t, interval_s, driver, nvml, gpus: [...], host: {...} (eaglewatch.pipeline.telemetry)
MSG_JOB = "job"  # run, state (one of JOB_STATES), pid, pgid, exit: {...}|None, summary: {...}
MSG_NOTICE = "notice"  # run|None, message: progress of a long command (stop, restart)
MSG_REPLY = "reply"  # id, ok, result|error {message, code}
MSG_HEARTBEAT = "heartbeat"  # t, every HEARTBEAT_INTERVAL_S whether or not anything else is sent
MSG_COMMAND = "command"  # client -> agent: id, op (one of OPS), args
MESSAGE_TYPES = (
    MSG_HELLO, MSG_LOG, MSG_EVENT, MSG_TELEMETRY, MSG_JOB, MSG_NOTICE, MSG_REPLY, MSG_HEARTBEAT, MSG_COMMAND,
)

# Commands the client sends (field "op" of MSG_COMMAND) and their "args".
OP_PING = "ping"  # {} -> {t}
OP_RUNS = "runs"  # {} -> {runs: [summary, ...]} newest first
OP_STATUS = "status"  # {run} -> summary; run is an id, a unique id prefix, or a name (newest wins)
OP_LAUNCH = "launch"  # {argv, cwd?, env?, name?} -> summary
OP_WATCH = "watch"  # {run, log_offset, events_offset} -> summary; then MSG_LOG/MSG_EVENT/MSG_JOB for run
OP_UNWATCH = "unwatch"  # {run} -> {}
OP_STOP = "stop"  # {run, grace_s} -> summary once every process of the run is gone
OP_RESTART = "restart"  # {run, argv?, grace_s, gpu_timeout_s} -> {old: summary, new: summary}
OP_TELEMETRY = "telemetry"  # {interval_s} (0 stops) -> {available, reason}
OP_GPU_HISTORY = "gpu_history"  # {run, limit} -> {samples: [{t, gpus: [{index, mem_used, mem_total, util_gpu}]}]}
# {run, saved?} -> {run, taken_at, methods, processes: [{pid, role, rank, cmdline, comm, state, wchan, method, note,
# threads: [{name, current, frames: [{func, file, line}] innermost first}]}]}; saved: the last taken (stacks.json)
OP_STACKS = "stacks"
# Data-parallel jobs (docs/protocol.md, "Jobs"; docs/slurm.md): one run per rank, submitted to a scheduler. Each
# answers with a job snapshot: {job, name, scheduler, target, created_at, world_size, output_dir, scheduler_job_id,
# ranks: [{rank, host, run, run_dir, node, sched_state, sched_reason, pending_s, elapsed_s, exit_code, summary,
# scheduler_job_id, scheduler_output}], scheduler_error?}.
OP_JOB_LAUNCH = "job_launch"  # {scheduler, ranks, argv, cwd?, env?, name?, python?, installed?, slurm?} -> snapshot
OP_JOBS = "jobs"  # {} -> [snapshot, ...] newest first
OP_JOB_STATUS = "job_status"  # {job} -> snapshot
OP_JOB_CANCEL = "job_cancel"  # {job} -> snapshot once the scheduler has ended every rank
OP_JOB_RESTART_RANK = "job_restart_rank"  # {job, rank} -> snapshot; the rank is submitted again and resumes
JOB_OPS = (OP_JOB_LAUNCH, OP_JOBS, OP_JOB_STATUS, OP_JOB_CANCEL, OP_JOB_RESTART_RANK)
OPS = (OP_PING, OP_RUNS, OP_STATUS, OP_LAUNCH, OP_WATCH, OP_UNWATCH, OP_STOP, OP_RESTART, OP_TELEMETRY,
       OP_GPU_HISTORY, OP_STACKS, *JOB_OPS)

# Job states (MSG_JOB "state", summary "state").
JOB_STARTING = "starting"  # cmd.json written, the job's pid not yet recorded
JOB_RUNNING = "running"
JOB_EXITED = "exited"  # exit.json holds code or signal
# lost: no exit.json and no process of the run is left (the host rebooted, or the job died with its supervisor)
JOB_LOST = "lost"
JOB_STATES = (JOB_STARTING, JOB_RUNNING, JOB_EXITED, JOB_LOST)

# Error codes in a failed MSG_REPLY ("error": {"code", "message"}).
ERR_VERSION = "version"  # the command's "v" is not one this agent reads
ERR_BAD_REQUEST = "bad_request"  # malformed command or arguments
ERR_NOT_FOUND = "not_found"  # no such run
ERR_AMBIGUOUS = "ambiguous"  # a run prefix or name that matches several runs
ERR_REFUSED = "refused"  # e.g. the recorded pid no longer belongs to the run
ERR_FAILED = "failed"  # anything else

HEARTBEAT_INTERVAL_S = 1.0
# A client that has heard nothing (not even a heartbeat) for this long treats the link as dead.
DEAD_AFTER_S = 3.0
# A client sends at least one command (OP_PING) this often; an agent that hears nothing for AGENT_IDLE_EXIT_S
# exits, so that an agent whose link hung does not live for ever.
CLIENT_PING_INTERVAL_S = 5.0
AGENT_IDLE_EXIT_S = 60.0


class ProtocolError(ValueError):
    """A line that is not a valid message of this protocol."""


class ProtocolVersionError(ProtocolError):
    """A message from a version of eaglewatch this one cannot read."""


def _check_version(obj: Mapping[str, Any]) -> None:
    version = obj.get("v")
    if version not in SUPPORTED_VERSIONS:
        raise ProtocolVersionError(
            f"protocol version {version!r} is not supported (this eaglewatch reads "
            f"{sorted(SUPPORTED_VERSIONS)}); install the same eaglewatch version on both sides"
        )


def encode(obj: Mapping[str, Any]) -> bytes:
    """One compact JSON line, newline included, with the version stamped in. A string that UTF-8 cannot hold (a lone
    surrogate, read from a hand-edited cmd.json) travels as a ``\\u`` escape instead of failing the message."""
    payload = {"v": PROTOCOL_VERSION, **obj}
    try:
        return (json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(payload, separators=(",", ":"), ensure_ascii=True) + "\n").encode("ascii")


def decode(line: bytes | str) -> dict[str, Any]:
    """Parse one line; raise ProtocolError for junk and ProtocolVersionError for an unknown version."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not a JSON line: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("a message must be a JSON object")
    _check_version(obj)
    return obj


# --- pipeline event helpers ---------------------------------------------------------------------
def make_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": round(time.time(), 3), **fields}


def read_events(lines: Iterable[bytes | str]) -> list[dict[str, Any]]:
    """Parse complete event lines, skipping blank ones. A torn last line is the caller's to hold back."""
    return [decode(line) for line in lines if line.strip()]


# --- agent message helpers ----------------------------------------------------------------------
def log_message(run: str, offset: int, data: bytes) -> dict[str, Any]:
    return {"type": MSG_LOG, "run": run, "offset": offset, "data": base64.b64encode(data).decode("ascii")}


def log_payload(message: Mapping[str, Any]) -> bytes:
    return base64.b64decode(message["data"])


def event_message(run: str, offset: int, end: int, line: bytes) -> dict[str, Any]:
    """One line of a run's events.jsonl; a line that is not JSON travels as ``raw`` text."""
    try:
        event = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        event = None
    message: dict[str, Any] = {"type": MSG_EVENT, "run": run, "offset": offset, "end": end}
    if isinstance(event, dict):
        message["event"] = event
    else:
        message["raw"] = line.decode("utf-8", "replace")
    return message


def command_message(request_id: int, op: str, **args: Any) -> dict[str, Any]:
    return {"type": MSG_COMMAND, "id": request_id, "op": op, "args": args}


def reply_ok(request_id: Any, result: Any) -> dict[str, Any]:
    return {"type": MSG_REPLY, "id": request_id, "ok": True, "result": result}


def reply_error(request_id: Any, code: str, message: str) -> dict[str, Any]:
    return {"type": MSG_REPLY, "id": request_id, "ok": False, "error": {"code": code, "message": message}}


def heartbeat_message() -> dict[str, Any]:
    return {"type": MSG_HEARTBEAT, "t": round(time.time(), 3)}
