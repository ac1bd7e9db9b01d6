"""The dashboard's view of one run: immutable plain dataclasses, built by RunModel.snapshot()."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

# Marks a run can carry (shown in the header and the runs list).
MARK_FAILED = "failed"
MARK_STALLED = "stalled"
MARK_LOW_DISK = "low disk"
MARK_DIR_GONE = "run directory gone"  # the job runs on, but its run directory was deleted on the host

# Alert kinds.
ALERT_FAILURE = "failure"
ALERT_STALL = "stall"
ALERT_DISK = "disk"
ALERT_EXIT = "exit"
ALERT_PROCESSES = "processes"  # the supervisor's word on processes that outlived the job
ALERT_DIR_GONE = "run directory"  # the run directory was deleted under a live job


@dataclass(frozen=True)
class LoadBar:
    """One progress bar of the loading phase (a shard loader, a weight loader), per lane."""

    lane: str
    desc: str
    n: float
    total: Optional[float]
    per_second: Optional[float]
    unit: str
    eta_s: Optional[float]
    done: bool


@dataclass(frozen=True)
class Extraction:
    done: Optional[int] = None
    total: Optional[int] = None
    tokens: int = 0
    tokens_total: Optional[int] = None
    bytes: int = 0
    tokens_per_s: Optional[float] = None
    samples_per_s: Optional[float] = None
    eta_s: Optional[float] = None
    disk_free: Optional[int] = None
    disk_total: Optional[int] = None
    disk_full_in_s: Optional[float] = None  # at the disk's recent growth rate
    bytes_to_go: Optional[int] = None  # what the rest of the extraction will write, estimated
    resumed: int = 0
    failed_samples: Optional[int] = None  # samples a job reported as failed and went past (speculators' err=)
    # What sets the pace over the last minute: "disk" (the stream waited on the writer most of it) or "engine";
    # None for an engine that does not stream. tokens_per_s is then the last minute's rate, which the ETA follows.
    pace: Optional[str] = None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mem: Optional[int]
    rank: Optional[str]
    in_job: bool


@dataclass(frozen=True)
class GpuView:
    index: int
    name: str
    mem_used: Optional[int]
    mem_total: Optional[int]
    util: Optional[float]
    temp_c: Optional[float]
    power_w: Optional[float]
    power_limit_w: Optional[float]
    throttle: Optional[str]
    error: Optional[str]
    mem_history: tuple[float, ...]  # fraction of memory used, oldest first
    util_history: tuple[float, ...]  # utilisation in %, oldest first
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True)
class HostView:
    cpu_percent: Optional[float] = None
    cpu_count: Optional[int] = None
    ram_used: Optional[int] = None
    ram_total: Optional[int] = None
    load1: Optional[float] = None


@dataclass(frozen=True)
class FailureView:
    position: int
    summary: str  # "Type: message", or for an empty message the failing source line and where
    lanes: str  # "×2 ranks: Worker_TP0–1"
    tier: str  # original / secondary / re-raised / final report
    count: int
    location: Optional[str]  # innermost frame, "file.py:142 in _submit"
    source_line: Optional[str]
    context: Optional[str]
    hint_title: Optional[str]
    hint_text: Optional[str]
    traceback: str  # the full text, as printed
    # Shown as soon as its exception line arrived: a chained part or more of the report may still follow, and the
    # complete failure then takes its place (same ``ident``).
    provisional: bool = False
    confidence: str = "certain"  # the decoder's: certain, likely, guess
    basis: str = ""  # why it is that sure ("from a fragment (no Traceback header)")
    quoted_in: Optional[str] = None  # not printed on its own, but quoted in this wrapper's message
    # Which failure this is, stable while it is refined: the process that printed it and the line where it began
    # ("1234@87"), "check:<name>" for a failed preflight check.
    ident: str = ""


@dataclass(frozen=True)
class CheckView:
    """One preflight check as the job reported it (``check`` events): passed, warned, failed, or still running."""

    name: str
    status: str  # pass / warn / fail / running
    reason: str
    fix: str
    stage: Optional[str] = None  # while running: building / extracting / verifying
    elapsed_s: Optional[float] = None  # running: since the check began; finished: how long it took
    stage_elapsed_s: Optional[float] = None  # running: since its stage began


@dataclass(frozen=True)
class LogLine:
    seq: int  # 1, 2, ... in arrival order; lines before the tail are gone from memory
    lane: str
    level: Optional[str]
    text: str


Severity = Literal["error", "warning"]  # of Textual's notification severities, the two alerts use


@dataclass(frozen=True)
class Alert:
    seq: int
    kind: str
    severity: Severity
    message: str


@dataclass(frozen=True)
class RunView:
    host: str
    run: Optional[str]
    name: Optional[str]
    command: str
    phase: str  # validating/loading/extracting/done/failed, "stalled", or "starting"/"waiting"
    phase_detail: str
    job_state: Optional[str]  # starting/running/exited/lost
    exit_text: Optional[str]  # "exit code 1", "killed by SIGTERM"
    exit_code: Optional[int]
    uptime_s: Optional[float]
    marks: tuple[str, ...]
    link: str  # connected / lost / reconnecting / failed / closed / "" (not yet)
    load: tuple[LoadBar, ...]
    extraction: Extraction
    gpus: tuple[GpuView, ...]
    gpu_note: Optional[str]  # why there are no GPU figures ("no NVML: ...")
    host_info: HostView
    failures: tuple[FailureView, ...]
    warnings: int  # tracebacks the processes survived
    lanes: tuple[str, ...]
    lines: int  # physical log lines decoded
    log_bytes: int
    log_last_seq: int
    restart_of: Optional[str] = None
    argv: tuple[str, ...] = field(default_factory=tuple)
    phases_seen: tuple[str, ...] = field(default_factory=tuple)  # pipeline phases in the order they came
    load_step: Optional[str] = None  # the engine's latest INFO line while it starts ("Model loading took ...")
    load_step_age_s: Optional[float] = None  # how long ago that line came
    checks: tuple[CheckView, ...] = ()  # the preflight's checks, in the order they first came
    job_kind: Optional[str] = None  # a job the dashboard knows other than eaglewatch's own (runstate/jobkind.py)
