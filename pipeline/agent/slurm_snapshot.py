"""A job's snapshot (docs/protocol.md, "Jobs") from what was read about it: no IO.

Each rank's scheduler state comes from the first source that knows it: Slurm's own view of the task
(``squeue``/``scontrol``), the finished state the job record kept from an earlier look, slurmstepd's line in the
batch output (cancelled, timed out, preempted, node failure), and last the rank's ``exit.json`` (exit code 0:
COMPLETED, else FAILED).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eaglewatch.pipeline.agent.rundir import JOB_LOST, JOB_RUNNING, JOB_STARTING
from eaglewatch.pipeline.agent.slurm_state import PENDING, SlurmTask, StepdEnd, state_from_exit

SCHEDULER = "slurm"


@dataclass
class RankFacts:
    """What the agent read about one rank's current attempt, besides Slurm's view."""

    summary: dict[str, Any] | None  # the run's summary (op ``status``) once its run directory exists
    host: str | None  # the node the run's cmd.json names
    stepd: StepdEnd | None  # slurmstepd's end line in the batch output, if any
    this_host: str  # the host the agent runs on


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _from_record(final: dict[str, Any]) -> SlurmTask:
    """The finished state a job record kept; a field of another type than the agent writes there is not known."""
    return SlurmTask(array_job_id=0, task_id=0, job_id=0, state=_text(final.get("state")) or "",
                     reason=_text(final.get("reason")), node=_text(final.get("node")),
                     submit_time=_number(final.get("submit_time")), start_time=_number(final.get("start_time")),
                     end_time=_number(final.get("end_time")), exit_code=_int(final.get("exit_code")),
                     exit_signal=_int(final.get("exit_signal")))


def _derived(rank: dict[str, Any], facts: RankFacts) -> SlurmTask | None:
    """The task's end when Slurm no longer knows it and no earlier look kept it."""
    summary = facts.summary or {}
    exit_info = summary.get("exit") if isinstance(summary.get("exit"), dict) else None
    state = facts.stepd.state if facts.stepd is not None else state_from_exit(exit_info)
    if state is None:
        return None
    ended = _number((exit_info or {}).get("ended_at")) or (facts.stepd.at if facts.stepd else None)
    return SlurmTask(array_job_id=0, task_id=0, job_id=0, state=state,
                     node=(facts.stepd.node if facts.stepd and facts.stepd.node else None) or facts.host,
                     submit_time=_number(rank.get("submitted_at")), start_time=_number(summary.get("started_at")),
                     end_time=ended)


def rank_entry(rank: dict[str, Any], task: SlurmTask | None, facts: RankFacts, now: float) -> dict[str, Any]:
    """One rank of the snapshot. ``task`` is Slurm's view of the rank's current array task (None: not known to
    Slurm now)."""
    final = rank.get("final") if isinstance(rank.get("final"), dict) else None
    view = task or (_from_record(final) if final else None) or _derived(rank, facts)
    summary = facts.summary
    exit_info = summary.get("exit") if summary and isinstance(summary.get("exit"), dict) else None
    state = view.state if view else None
    elapsed = pending = None
    if view is not None:
        if view.start_time and state != PENDING:
            end = view.end_time if view.finished and view.end_time else now
            elapsed = max(0.0, end - view.start_time)
        if view.submit_time:
            if state == PENDING:
                pending = max(0.0, now - view.submit_time)
            elif view.start_time:
                pending = max(0.0, view.start_time - view.submit_time)
    if exit_info is not None:
        code = exit_info.get("code")
        exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
    else:
        exit_code = view.exit_code if view is not None else None
    if summary is not None and view is not None and view.active and facts.host and facts.host != facts.this_host \
            and summary.get("state") in (JOB_LOST, JOB_STARTING):
        # The run lives on a compute node: this host cannot see its processes, Slurm can.
        summary = {**summary, "state": JOB_RUNNING}
    return {
        "rank": rank["rank"],
        "host": facts.host,
        "run": summary["run"] if summary else None,
        "run_dir": summary["run_dir"] if summary else None,
        "node": view.node if view and view.node else facts.host,
        "sched_state": state,
        "sched_reason": view.reason if view else None,
        "pending_s": None if pending is None else round(pending, 3),
        "elapsed_s": None if elapsed is None else round(elapsed, 3),
        "exit_code": exit_code,
        "summary": summary,
        "scheduler_job_id": rank.get("scheduler_job_id"),
        "scheduler_output": rank.get("output"),
    }


def snapshot(record: dict[str, Any], ranks: list[dict[str, Any]], error: str | None = None) -> dict[str, Any]:
    """The job snapshot: the record's facts and one entry per rank (``rank_entry``), rank order."""
    out = {
        "job": record["job"],
        "name": record.get("name"),
        "scheduler": SCHEDULER,
        "target": record.get("target"),
        "created_at": record.get("created_at"),
        "world_size": record.get("world_size"),
        "output_dir": record.get("output_dir"),
        "scheduler_job_id": record.get("scheduler_job_id"),
        "ranks": sorted(ranks, key=lambda entry: entry["rank"]),
    }
    if error:
        out["scheduler_error"] = error
    return out
