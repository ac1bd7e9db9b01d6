"""FleetModel: one data-parallel job at a glance. Plain Python: no Textual, no IO.

It folds the job's snapshot (the shape of docs/fleet.md: one entry per rank, with the scheduler's word on it and
the agent's summary of its run) and, per rank, the rank's :class:`RunModel` (fed from that run's log and events,
as the run screen's is) into one row per rank, the job's totals and an ETA, and raises alerts as plain data: a rank
failed, a rank stalled, a rank pending too long.

The ETA of the job is the ETA of its slowest rank: the job is done when its last rank is. Each rank's ETA is its
own tokens still to extract over its own token rate (the pipeline's ``progress`` events carry it): the ranks'
shares are contiguous slices of the data whose lengths differ, and a sample's cost follows its length, so samples
would misjudge a rank with long ones. A rank with no token figures falls back to samples over its sample rate.
While any unfinished rank has no rate yet (pending, loading), or has failed, the job's ETA is unknown, and says why.

One thread feeds (the fleet's IO workers: :meth:`set_snapshot`, :meth:`set_rank_model`, :meth:`feed_node_gpus`,
:meth:`tick`), another reads (:meth:`snapshot`, :meth:`alerts_since`, :meth:`version_key`); a lock keeps them apart.
The fleet's lock is always taken before a rank model's, never the other way round.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from eaglewatch import protocol as p
from eaglewatch.tui.runend import STOPPED_PHASE, run_end
from eaglewatch.tui.runstate.model import RunModel
from eaglewatch.tui.runstate.view import MARK_STALLED, Alert, RunView

# Slurm's words for a task (squeue / sacct), by what they mean for the rank.
SLURM_PENDING = "PENDING"
SLURM_RUNNING = ("RUNNING", "COMPLETING", "CONFIGURING", "RESIZING", "SUSPENDED", "REQUEUED")
SLURM_COMPLETED = "COMPLETED"
SLURM_CANCELLED = "CANCELLED"
SLURM_FAILED = ("FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")

# What became of a rank, whichever scheduler runs it.
PENDING, RUNNING, DONE, FAILED, CANCELLED = "pending", "running", "done", "failed", "cancelled"
OUTCOMES = (PENDING, RUNNING, DONE, FAILED, CANCELLED)

# Alert kinds.
ALERT_RANK_FAILED = "rank failed"
ALERT_RANK_STALLED = "rank stalled"
ALERT_RANK_PENDING = "rank pending"

_MAX_ALERTS = 200


@dataclass(frozen=True)
class FleetThresholds:
    pending_after_s: float = 600.0  # a rank the scheduler holds back this long: alert
    # A rank's stall is its RunModel's (no progress for Thresholds.stall_after_s while loading or extracting).


@dataclass(frozen=True)
class RankRow:
    rank: int
    where: str  # the node the scheduler put it on, else the host it was launched on
    host: Optional[str]
    node: Optional[str]
    run: Optional[str]
    state: str  # Slurm's word when there is one, else the run's state (starting, running, exited, lost)
    reason: Optional[str]  # Slurm's reason while pending ("Resources", "Priority")
    phase: str  # the run's phase (validating, loading, extracting, done, failed, stalled, ...) or the outcome
    outcome: str  # one of OUTCOMES
    stalled: bool
    done: Optional[int]
    total: Optional[int]
    tokens_per_s: Optional[float]
    samples_per_s: Optional[float]
    eta_s: Optional[float]  # this rank's own, while it extracts; 0 once done
    gpu_used: Optional[int]  # bytes, summed over the GPUs of its node
    gpu_total: Optional[int]
    root_cause: Optional[str]  # the rank's top failure, else why it ended badly, else why its status is unknown
    end_text: Optional[str]  # how its run ended, in the one wording of eaglewatch.tui.runend
    pending_s: Optional[float]
    elapsed_s: Optional[float]
    restart_of: Optional[str]


@dataclass(frozen=True)
class FleetView:
    job: str
    name: Optional[str]
    scheduler: str
    target: str
    world_size: int
    output_dir: Optional[str]
    scheduler_job_id: Optional[str]
    created_at: Optional[float]
    cancelled: bool  # the operator cancelled the job (ssh: the record says so; Slurm: every rank CANCELLED)
    rows: tuple[RankRow, ...]
    done: Optional[int]  # samples, over all ranks (None while no rank has said)
    total: Optional[int]  # None while a rank's share is not known yet
    tokens_per_s: Optional[float]  # the ranks extracting now, together
    eta_s: Optional[float]
    eta_rank: Optional[int]  # the slowest rank, which the ETA is
    eta_note: str  # why there is no ETA, or what it is based on
    counts: tuple[tuple[str, int], ...]  # (outcome, ranks) for each outcome that has any
    state: str  # the job's: pending, running, done, failed, cancelled
    scheduler_error: Optional[str] = None  # what the scheduler said when it could not be read (squeue failed)


def _int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _float(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return None
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def slurm_word(state: Optional[str]) -> Optional[str]:
    """Slurm's state without its decorations: ``CANCELLED by 1000`` is CANCELLED, ``COMPLETING+`` COMPLETING."""
    if not state:
        return None
    word = state.strip().split(" ")[0].rstrip("+*").upper()
    return word or None


def gpu_memory(gpus: Iterable[Mapping[str, Any]]) -> Optional[tuple[int, int]]:
    """Used and total GPU memory (bytes) over the GPUs of one telemetry sample, or None when it has none."""
    used = total = 0
    seen = False
    for gpu in gpus:
        mem_used, mem_total = _int(gpu.get("mem_used")), _int(gpu.get("mem_total"))
        if mem_used is None or not mem_total:
            continue
        used, total, seen = used + mem_used, total + mem_total, True
    return (used, total) if seen else None


class FleetModel:
    def __init__(self, thresholds: FleetThresholds = FleetThresholds(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.thresholds = thresholds
        self.clock = clock
        self.lock = threading.RLock()
        self._snapshot: dict[str, Any] = {}
        self._models: dict[int, RunModel] = {}
        self._node_gpus: dict[str, tuple[int, int]] = {}
        self._version = 0
        self._alerts: deque[Alert] = deque(maxlen=_MAX_ALERTS)
        self._alert_seq = 0
        self._in_episode: dict[tuple[str, int], bool] = {}  # (alert kind, rank): the condition holds now
        self._rows_cache: dict[int, tuple[tuple[object, ...], RankRow]] = {}
        self._ended_by_operator: set[str] = set()  # runs the operator stopped or restarted from their run screen

    # ------------------------------------------------------------------ feeding (IO workers)

    def set_snapshot(self, snapshot: Mapping[str, Any]) -> None:
        """The job as its scheduler side sees it (docs/fleet.md); replaces the last one."""
        with self.lock:
            if dict(snapshot) != self._snapshot:
                self._snapshot = dict(snapshot)
                self._version += 1
            self._check()

    def set_rank_model(self, rank: int, model: Optional[RunModel]) -> None:
        """The RunModel of the rank's current run (a new one after a restart), or None to forget it."""
        with self.lock:
            if model is None:
                self._models.pop(rank, None)
            else:
                self._models[rank] = model
            self._version += 1
            self._check()

    def ended_by_operator(self, run: str) -> None:
        """The operator is stopping (or restarting) this run: its end is no failure of the rank (it shows as
        cancelled, and rings nothing)."""
        with self.lock:
            if run not in self._ended_by_operator:
                self._ended_by_operator.add(run)
                self._version += 1

    def rank_model(self, rank: int) -> Optional[RunModel]:
        with self.lock:
            return self._models.get(rank)

    def feed_node_gpus(self, node: str, gpus: Iterable[Mapping[str, Any]]) -> None:
        """GPUs of one node (a telemetry sample's ``gpus``, or a run's recorded GPU history sample)."""
        memory = gpu_memory(gpus)
        with self.lock:
            if memory is None:
                changed = self._node_gpus.pop(node, None) is not None
            else:
                changed = self._node_gpus.get(node) != memory
                self._node_gpus[node] = memory
            if changed:
                self._version += 1

    def tick(self) -> None:
        """Look at the ranks again (stalls and pending times move with the clock; the rank models move by
        themselves): raises the alerts that became due."""
        with self.lock:
            self._check()

    # ------------------------------------------------------------------ alerts

    def _alert(self, kind: str, severity: Any, message: str) -> None:
        self._alert_seq += 1
        self._alerts.append(Alert(self._alert_seq, kind, severity, message))
        self._version += 1

    def _episode(self, kind: str, rank: int, holds: bool) -> bool:
        """Whether a condition just began for a rank: an alert rings once per episode, again only after the
        condition went away (a restarted rank that fails again rings again)."""
        key = (kind, rank)
        began = holds and not self._in_episode.get(key, False)
        self._in_episode[key] = holds
        return began

    def _check(self) -> None:
        if not self._snapshot:
            return
        for row in self._rows():
            where = f" on {row.where}" if row.where != "—" else ""
            if self._episode(ALERT_RANK_FAILED, row.rank, row.outcome == FAILED):
                why = row.root_cause or row.end_text or row.state
                self._alert(ALERT_RANK_FAILED, "error", f"rank {row.rank}{where} failed: {why}")
            if self._episode(ALERT_RANK_STALLED, row.rank, row.stalled and row.outcome == RUNNING):
                self._alert(ALERT_RANK_STALLED, "warning", f"rank {row.rank}{where} stalled: no progress while "
                            f"{self._phase_before_stall(row)}")
            pending_long = (row.outcome == PENDING and row.pending_s is not None
                            and row.pending_s >= self.thresholds.pending_after_s)
            if self._episode(ALERT_RANK_PENDING, row.rank, pending_long):
                reason = f" ({row.reason})" if row.reason else ""
                minutes = (row.pending_s or 0) / 60
                self._alert(ALERT_RANK_PENDING, "warning", f"rank {row.rank} pending for {minutes:.0f} min{reason}")

    def _phase_before_stall(self, row: RankRow) -> str:
        model = self._models.get(row.rank)
        phases = model.snapshot().phases_seen if model is not None else ()
        return phases[-1] if phases else "starting"

    def alerts_since(self, seq: int) -> list[Alert]:
        with self.lock:
            return [alert for alert in self._alerts if alert.seq > seq]

    # ------------------------------------------------------------------ reading (UI thread)

    def version_key(self) -> tuple[object, ...]:
        """Moves whenever something a row shows may have changed: the snapshot, the nodes' GPUs, an alert, or
        any rank's RunModel."""
        with self.lock:
            return (self._version, tuple((rank, id(model), model.version) for rank, model in self._models.items()))

    def _ranks(self) -> list[dict[str, Any]]:
        ranks = self._snapshot.get("ranks")
        if not isinstance(ranks, list):
            return []
        entries = [entry for entry in ranks if isinstance(entry, dict) and _int(entry.get("rank")) is not None]
        return sorted(entries, key=lambda entry: _int(entry.get("rank")) or 0)

    def _cancelled_at(self) -> Optional[float]:
        return _float(self._snapshot.get("cancelled_at"))

    def _rows(self) -> list[RankRow]:
        rows = []
        for entry in self._ranks():
            rank = _int(entry.get("rank")) or 0
            model = self._models.get(rank)
            key = (self._version, id(model), model.version if model is not None else None)
            cached = self._rows_cache.get(rank)
            if cached is not None and cached[0] == key:
                rows.append(cached[1])
                continue
            view = model.snapshot() if model is not None else None
            if view is not None and entry.get("run") and view.run != entry.get("run"):
                view = None  # a model of the rank's previous run, until the new one is attached
            row = self._row(rank, entry, view)
            self._rows_cache[rank] = (key, row)
            rows.append(row)
        return rows

    def _row(self, rank: int, entry: Mapping[str, Any], view: Optional[RunView]) -> RankRow:
        summary = _dict(entry.get("summary"))
        host, node = _str(entry.get("host")), _str(entry.get("node"))
        sched_raw = _str(entry.get("sched_state"))
        sched = slurm_word(sched_raw)
        run_state = (view.job_state if view is not None and view.job_state else None) or _str(summary.get("state"))
        end = run_end(run_state, summary.get("exit"), bool(summary.get("run_dir_gone")))
        end_text: Optional[str] = None
        ended_badly = False
        if view is not None and view.exit_text:
            end_text = view.exit_text
            ended_badly = view.exit_code not in (None, 0) or view.job_state == p.JOB_LOST or view.phase == STOPPED_PHASE
        elif end is not None:
            end_text, ended_badly = end.text, end.failed or end.stopped
        error = _str(entry.get("error"))
        outcome = self._outcome(entry, sched, run_state, end_text, ended_badly, error, view)
        ext = view.extraction if view is not None else None
        stalled = view is not None and MARK_STALLED in view.marks
        if view is not None:
            phase = view.phase
        elif outcome == RUNNING:
            phase = run_state or "running"
        else:
            phase = outcome
        if outcome == CANCELLED and view is not None and view.phase in (p.PHASE_FAILED, STOPPED_PHASE):
            phase = CANCELLED
        gpu = self._node_gpus.get(node or host or "") if (node or host) else None
        if gpu is None and view is not None:
            gpu = gpu_memory({"mem_used": g.mem_used, "mem_total": g.mem_total} for g in view.gpus)
        root = None
        if view is not None and view.failures:
            root = view.failures[0].summary
        elif outcome == FAILED:
            # How the rank's run ended ("killed by SIGKILL", "exit code 3") says more than Slurm's word for it.
            root = error or (end_text if ended_badly else None) or (
                f"{sched_raw}" if sched in SLURM_FAILED else None) or end_text
        elif error:
            root = error
        if sched_raw:
            state = sched_raw
        elif outcome == CANCELLED:
            state = CANCELLED
        else:
            state = run_state or ("not launched" if error else "—")
        eta: Optional[float] = None
        if outcome == DONE:
            eta = 0.0
        elif ext is not None and phase == p.PHASE_EXTRACTING:
            eta = ext.eta_s
            if eta is None and ext.samples_per_s and ext.done is not None and ext.total is not None:
                eta = max(0, ext.total - ext.done) / ext.samples_per_s
        elapsed = _float(entry.get("elapsed_s"))
        if elapsed is None and view is not None:
            elapsed = view.uptime_s
        return RankRow(
            rank=rank, where=node or host or "—", host=host, node=node,
            run=_str(entry.get("run")) or (view.run if view is not None else None),
            state=state, reason=_str(entry.get("sched_reason")), phase=phase, outcome=outcome, stalled=stalled,
            done=ext.done if ext is not None else None, total=ext.total if ext is not None else None,
            tokens_per_s=ext.tokens_per_s if ext is not None else None,
            samples_per_s=ext.samples_per_s if ext is not None else None,
            eta_s=eta, gpu_used=gpu[0] if gpu else None, gpu_total=gpu[1] if gpu else None,
            root_cause=root, end_text=end_text, pending_s=_float(entry.get("pending_s")), elapsed_s=elapsed,
            restart_of=_str(summary.get("restart_of")) or (view.restart_of if view is not None else None),
        )

    def _outcome(self, entry: Mapping[str, Any], sched: Optional[str], run_state: Optional[str],
                 end_text: Optional[str], ended_badly: bool, error: Optional[str], view: Optional[RunView]) -> str:
        """The run's own end wins (Slurm's word on a task can lag behind it); then Slurm's; then whether anything
        runs at all."""
        if end_text is not None:
            if not ended_badly:
                return DONE
            # Slurm's CANCELLED: someone scancelled the task (the job's cancel, or by hand), which ended the run.
            return CANCELLED if sched == SLURM_CANCELLED or self._ended_by_cancel(entry, view) else FAILED
        if sched in SLURM_FAILED:
            return FAILED
        if sched == SLURM_CANCELLED:
            return CANCELLED
        if sched == SLURM_COMPLETED:
            return DONE
        if sched == SLURM_PENDING:
            return PENDING
        if run_state in (p.JOB_STARTING, p.JOB_RUNNING) or sched in SLURM_RUNNING:
            return RUNNING
        if error:
            return FAILED
        return PENDING

    def _ended_by_cancel(self, entry: Mapping[str, Any], view: Optional[RunView]) -> bool:
        """A run that ended badly after the operator cancelled the job, and had started before: the cancel ended
        it (ssh jobs; a Slurm job's ranks say CANCELLED themselves). Or one the operator stopped or restarted."""
        if entry.get("run") in self._ended_by_operator or (view is not None and view.phase == STOPPED_PHASE):
            return True
        stopped = run_end(None, _dict(entry.get("summary")).get("exit"))
        if stopped is not None and stopped.stopped:  # its exit.json says the operator stopped it
            return True
        cancelled_at = self._cancelled_at()
        if cancelled_at is None:
            return False
        summary = _dict(entry.get("summary"))
        started = _float(summary.get("started_at"))
        return started is None or started <= cancelled_at

    def snapshot(self) -> FleetView:
        with self.lock:
            snap = self._snapshot
            rows = tuple(self._rows())
            total: Optional[int] = 0
            done: Optional[int] = None
            rate = 0.0
            extracting = 0
            for row in rows:
                if row.done is not None:
                    done = (done or 0) + row.done
                if row.total is None or total is None:
                    total = None
                else:
                    total += row.total
                if row.phase == p.PHASE_EXTRACTING and row.tokens_per_s is not None:
                    rate += row.tokens_per_s
                    extracting += 1
            eta, eta_rank, note = _job_eta(rows)
            counts = tuple((outcome, n) for outcome in OUTCOMES
                           if (n := sum(1 for row in rows if row.outcome == outcome)))
            cancelled = self._cancelled_at() is not None or (
                bool(rows) and all(slurm_word(row.state) == SLURM_CANCELLED for row in rows))
            return FleetView(
                job=str(snap.get("job") or ""), name=_str(snap.get("name")),
                scheduler=str(snap.get("scheduler") or ""), target=str(snap.get("target") or ""),
                world_size=_int(snap.get("world_size")) or len(rows), output_dir=_str(snap.get("output_dir")),
                scheduler_job_id=_str(snap.get("scheduler_job_id")), created_at=_float(snap.get("created_at")),
                cancelled=cancelled, rows=rows, done=done, total=total if rows else None,
                tokens_per_s=rate if extracting else None, eta_s=eta, eta_rank=eta_rank, eta_note=note,
                counts=counts, state=_job_state(rows), scheduler_error=_str(snap.get("scheduler_error")),
            )


def _job_eta(rows: Iterable[RankRow]) -> tuple[Optional[float], Optional[int], str]:
    """The slowest unfinished rank's ETA (see the module's docstring), with the rank; or None and why."""
    slowest: Optional[RankRow] = None
    for row in rows:
        if row.outcome == DONE:
            continue
        if row.outcome in (FAILED, CANCELLED):
            return None, row.rank, f"rank {row.rank} {row.outcome}"
        if row.eta_s is None:
            waiting = row.phase if row.outcome == RUNNING else row.outcome
            return None, row.rank, f"rank {row.rank} {waiting}"
        if slowest is None or (slowest.eta_s or 0) < row.eta_s:
            slowest = row
    if slowest is None:
        return 0.0, None, "all ranks done"
    return slowest.eta_s, slowest.rank, f"slowest: rank {slowest.rank}"


def _job_state(rows: tuple[RankRow, ...]) -> str:
    """Running while any rank runs; once none does, what holds the job back, else how it ended."""
    outcomes = {row.outcome for row in rows}
    if not rows:
        return PENDING
    if outcomes == {DONE}:
        return DONE
    for state in (RUNNING, PENDING, FAILED):
        if state in outcomes:
            return state
    return CANCELLED
