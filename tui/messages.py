"""What the connection hands to its consumers (the run state, the CLI commands), as plain types.

No IO and nothing of the connection: the run state imports this module to take the connection's items without
importing the connection itself. The agent's JSON shapes are described in docs/protocol.md; the TypedDicts below
name the fields the operator side reads, and every field may be missing (an older agent, a run not started yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn, Optional, TypedDict, Union


class ExitInfo(TypedDict, total=False):
    """A run's ``exit.json``: how its main process ended."""

    code: Optional[int]
    signal: Optional[int]
    signal_name: Optional[str]
    ended_at: float
    recorded_by: str
    error: str  # the command could not start
    leftovers: dict[str, Any]
    disk_full: bool  # the disk was full when the exit came to be recorded
    stopped: bool  # the operator asked for the stop (stop.json was there when the job ended)
    stop: dict[str, Any]  # that request: by, via, user, host, at


class RunSummary(TypedDict, total=False):
    """The agent's summary of one run (``status``, ``runs``, ``launch``, ``stop``, a ``job`` message)."""

    run: str
    name: Optional[str]
    state: str  # starting, running, exited, lost
    argv: list[str]
    cwd: Optional[str]
    env: dict[str, str]
    started_at: float
    restart_of: Optional[str]
    pid: Optional[int]
    pgid: Optional[int]
    exit: Optional[ExitInfo]
    log_size: int
    events_size: int
    run_dir: str
    run_dir_gone: bool  # the run directory was deleted; state says whether the run's processes still live
    phase: str  # the pipeline's last phase event (validating/loading/extracting/done/failed), if its tail has one
    progress: dict[str, Any]  # {"done", "total"}: samples, from the run's last progress event


class RestartResult(TypedDict):
    old: RunSummary
    new: RunSummary


@dataclass(frozen=True)
class LogChunk:
    """Raw bytes of the run's log, exactly as the file holds them at [offset, offset + len(data))."""

    run: str
    offset: int
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclass(frozen=True)
class Event:
    """One line of the run's events.jsonl at [offset, end). ``event`` is None for a line that is not JSON."""

    run: str
    offset: int
    end: int
    event: dict[str, Any] | None  # a pipeline event: free-form beyond "kind" (docs/pipeline.md)
    raw: str | None = None


@dataclass(frozen=True)
class JobState:
    run: str
    state: str
    exit: ExitInfo | None
    summary: RunSummary = field(default_factory=lambda: RunSummary())


@dataclass(frozen=True)
class Notice:
    run: str | None
    message: str


@dataclass(frozen=True)
class LinkState:
    """connected, lost (with the reason), reconnecting (attempt n), failed (gave up: a fatal error), closed."""

    state: str
    detail: str = ""
    attempt: int = 0


@dataclass(frozen=True)
class Telemetry:
    sample: dict[str, Any]  # one telemetry message (docs/telemetry.md)


Item = Union[LogChunk, Event, JobState, Notice, LinkState, Telemetry]


def unexpected_item(item: NoReturn) -> NoReturn:
    """The last case of a ``match`` over Items: a type checker proves it unreachable while every Item type has its
    case, and a new type that nobody handles is an error, not data dropped on the floor."""
    kind = type(item)
    raise TypeError(f"no case for a {kind.__module__}.{kind.__qualname__} item: {item!r}")
