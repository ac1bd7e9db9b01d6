"""RunModel: everything known about one run, folded from what the connection delivers. Plain Python.

Feeding (one thread, the dashboard's IO worker): :meth:`RunModel.feed_items` takes a batch of the connection's
items (log chunks, events, telemetry, job and link states, notices: ``eaglewatch.tui.messages``, which imports
nothing of the connection) and dispatches on their type; the ``feed_*`` methods take the parts directly (tests,
benchmarks).
Reading (another thread, the UI): :meth:`snapshot`, :meth:`log_since`, :meth:`alerts_since`, and
:attr:`version`, which moves whenever something visible changed, so the UI redraws only then.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable, Iterable, Mapping, Optional

from eaglewatch import protocol as p
from eaglewatch.decode import BarState, BarUpdate, Decoder, LineEvent
from eaglewatch.decode.lanes import KIND_MINIATURE, lane_kind
from eaglewatch.tui.runstate.jobkind import SPECULATORS_DATAGEN, SampleCounts, kind_of_command, sample_counts
from eaglewatch.tui.messages import (
    Event,
    ExitInfo,
    Item,
    JobState,
    LinkState,
    LogChunk,
    Notice,
    RunSummary,
    Telemetry,
    unexpected_item,
)
from eaglewatch.tui.runend import STOPPED_PHASE, RunEnd, run_end
from eaglewatch.tui.runstate.failures import (
    AlertKeys,
    alert_keys,
    check_copy,
    check_failure_view,
    check_keys,
    failure_view,
)
from eaglewatch.tui.runstate.fmt import fmt_argv, fmt_duration
from eaglewatch.tui.runstate.preflight import Preflight
from eaglewatch.tui.runstate.view import (
    ALERT_DIR_GONE,
    ALERT_DISK,
    ALERT_EXIT,
    ALERT_FAILURE,
    ALERT_PROCESSES,
    ALERT_STALL,
    MARK_DIR_GONE,
    MARK_FAILED,
    MARK_LOW_DISK,
    MARK_STALLED,
    Alert,
    Extraction,
    FailureView,
    GpuProcess,
    GpuView,
    HostView,
    LoadBar,
    LogLine,
    RunView,
    Severity,
)

_EXTRACT_BAR = "Extracting"
_BAR_NOTE_EVERY_S = 10.0
_MAX_ALERTS = 200
FULL_IN_SHOWN_S = 2 * 86400.0  # the longest "full in" forecast worth showing
_AFTER_LOADING = (p.PHASE_EXTRACTING, p.PHASE_DONE, p.PHASE_FAILED)
# vLLM loads a drafter after the target; extraction's drafter has no weights, so the loader's timer never starts
# and its "Loading weights took N seconds" is the host's uptime (13053 s for a 0.01 s load).
_DRAFTER_LOAD = "Loading drafter model"
_WEIGHTS_TOOK = "Loading weights took "


@dataclass(frozen=True)
class Thresholds:
    stall_after_s: float = 300.0  # no progress for this long while loading or extracting: stalled
    low_disk_bytes: int = 2 * 1024**3  # less free space than this on the output disk: low disk
    full_in_s: float = 1800.0  # ... or the output disk fills up within this many seconds
    log_tail: int = 5000  # decoded log lines kept in memory
    gpu_history: int = 60  # telemetry samples kept per GPU for the sparklines


def _int(value: Any) -> Optional[int]:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> Optional[float]:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


class RunModel:
    def __init__(
        self,
        host: str,
        summary: Optional[RunSummary] = None,
        thresholds: Thresholds = Thresholds(),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.host = host
        self.thresholds = thresholds
        self.clock = clock
        self.wall = wall
        self.lock = threading.RLock()
        self.decoder = Decoder(clock=clock)
        self.version = 0
        self._summary: dict[str, Any] = {}
        self._job_state: Optional[str] = None
        self._exit: Optional[ExitInfo] = None
        self._link = ""
        self._phase: Optional[str] = None
        self._phase_detail = ""
        self._phases: list[str] = []
        self._info: dict[str, Any] = {}
        self._progress: dict[str, Any] = {}
        self._error_event: Optional[dict[str, Any]] = None
        self._warning_events = 0
        self._load_step: Optional[tuple[str, float]] = None  # the job's latest logger line before extraction
        self._drafter_lanes: set[str] = set()  # lanes whose engine said it loads the drafter (see _DRAFTER_LOAD)
        self._last_progress_at = clock()
        self._last_output_at = clock()  # a job that says no phase (a plain script) stalls when it prints nothing
        # Where each process is (the agent's ``stacks``): taken when the stall alert fires, or when asked (a key).
        self._stacks: Optional[dict[str, Any]] = None
        self._stacks_wanted = False
        self._bar_notes: dict[tuple[str, str], tuple[float, bool]] = {}
        self._tail: deque[LogLine] = deque(maxlen=thresholds.log_tail)
        self._seq = 0
        self._gpus: dict[int, dict[str, Any]] = {}
        self._gpu_mem: dict[int, deque[float]] = {}
        self._gpu_util: dict[int, deque[float]] = {}
        self._gpu_note: Optional[str] = None
        self._host: dict[str, Any] = {}
        self._disk: dict[str, Any] = {}
        self._alerts: deque[Alert] = deque(maxlen=_MAX_ALERTS)
        self._alert_seq = 0
        # The keys of every failure that rang (failures.alert_keys), and those it took on since: it rings once.
        self._alerted: set[tuple[object, ...]] = set()
        self._alerts_checked: tuple[int, int] = (-1, -1)
        self._stalled = False
        self._low_disk = False
        self._exit_alerted = False
        self._dir_gone_alerted = False
        self._failures_cache: tuple[tuple[int, int], tuple[_Shown, ...]] = ((-1, -1), ())
        self._preflight = Preflight()
        self._preflight_tick = 0
        if summary:
            self.set_summary(summary)

    # ------------------------------------------------------------------ feeding (IO worker thread)

    def set_summary(self, summary: RunSummary) -> None:
        """The agent's summary of the run (status, launch, or a job message's)."""
        with self.lock:
            self._update_summary(summary)
            state = summary.get("state")
            if state:
                self._job_state = state
            exit_info = summary.get("exit")
            if exit_info:
                self._exit = exit_info
            self._changed()

    def _update_summary(self, summary: Mapping[str, object]) -> None:
        self._summary.update({k: v for k, v in summary.items() if v is not None})

    def feed_items(self, items: Iterable[Item]) -> None:
        """One batch from a RunWatch or the connection's host queue. An item of a type this model has no case for
        raises TypeError: a message type added to the connection must be handled here, not lost."""
        with self.lock:
            for item in items:
                match item:
                    case LogChunk():
                        self.feed_log(item.data)
                    case Event():
                        if item.event is not None:
                            self.feed_event(item.event)
                    case Telemetry():
                        self.feed_telemetry(item.sample)
                    case JobState():
                        self.feed_job(item.state, item.exit, item.summary)
                    case LinkState():
                        self.feed_link(item.state, item.detail)
                    case Notice():
                        self._add_log_line("eaglewatch", None, item.message)
                    case _:
                        unexpected_item(item)
            self._check()

    def feed_log(self, data: bytes) -> None:
        with self.lock:
            if data:
                self._last_output_at = self.clock()
            self._take(self.decoder.feed(data))
            self._check()

    def finish_log(self) -> None:
        """The log is complete (the job ended and every byte arrived): close the last line and tracebacks."""
        with self.lock:
            self._take(self.decoder.finish())
            self._check()

    def _take(self, events: list[Any]) -> None:
        if not events:
            return
        moved = False
        for event in events:
            kind = type(event)
            if kind is LineEvent:
                self._add_log_line(event.lane, event.level, event.text)
                if self._is_load_step(event) and self._says_something(event):
                    self._load_step = (event.text, self.clock())
            elif kind is BarUpdate:
                moved = True
                self._bar_note(event)
        if moved:
            progress = self.decoder.state.last_progress_at
            if progress:
                self._last_progress_at = max(self._last_progress_at, max(progress.values()))
        self._changed()

    def _is_load_step(self, line: LineEvent) -> bool:
        """An INFO line of a logger (vLLM's "Loading weights took ...") while the engine starts: between the shard
        bars and the first sample there can be minutes of profiling and warm-up that only such lines describe."""
        return (line.level == "INFO" and line.source is not None and line.lane != "eaglewatch"
                and lane_kind(line.lane) != KIND_MINIATURE and self._phase not in _AFTER_LOADING)

    def _says_something(self, line: LineEvent) -> bool:
        """Whether a load step's line means something alone. vLLM repeats its header on each line of a multi-line
        record, so the rest of one ("\\treserved_cpus=[]" after "OpenMP thread binding info:", the banner's art)
        comes as INFO lines of their own, indented; and the drafter's "Loading weights took" figure is not a
        time (see ``_DRAFTER_LOAD``): the line before it stays."""
        text = line.text
        if not text or text[0].isspace():
            return False
        if text.startswith(_DRAFTER_LOAD):
            self._drafter_lanes.add(line.lane)
        elif text.startswith(_WEIGHTS_TOOK) and line.lane in self._drafter_lanes:
            return False
        return True

    def _add_log_line(self, lane: str, level: Optional[str], text: str) -> None:
        self._seq += 1
        self._tail.append(LogLine(self._seq, lane, level, text))

    def _bar_note(self, bar: BarUpdate) -> None:
        """A bar's rewrites collapse into a line when it first shows, every 10 s, and when it ends."""
        key = (bar.lane, bar.desc)
        now = self.clock()
        last = self._bar_notes.get(key)
        done = bar.done
        if last is not None:
            noted_at, was_done = last
            if (done and was_done) or (not done and now - noted_at < _BAR_NOTE_EVERY_S):
                return
        self._bar_notes[key] = (now, done)
        total = f"/{bar.total:g}" if bar.total is not None else ""
        pct = f" {bar.percent}%" if bar.percent is not None else ""
        self._add_log_line(bar.lane, None, f"{bar.desc or 'progress'}:{pct} {bar.n:g}{total} {bar.unit}".rstrip())

    def feed_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            self._last_output_at = self.clock()
            kind = event.get("kind")
            if kind == p.EVENT_PHASE:
                self._phase = str(event.get("phase") or "")
                if not self._phases or self._phases[-1] != self._phase:
                    self._phases.append(self._phase)
                self._phase_detail = str(event.get("detail") or "")
                self._last_progress_at = self.clock()
            elif kind == p.EVENT_PROGRESS:
                self._progress = event
                self._last_progress_at = self.clock()
            elif kind == p.EVENT_SAMPLE:
                self._last_progress_at = self.clock()
                return  # progress events carry the totals; no redraw per sample
            elif kind == p.EVENT_INFO:
                self._info.update(event)
            elif kind == p.EVENT_ERROR:
                self._error_event = event
            elif kind == p.EVENT_CHECK or kind == p.EVENT_CHECK_STAGE:
                self._preflight.feed(event)
            elif kind == p.EVENT_WARNING:
                self._warning_events += 1
                if event.get("by") == "supervisor":
                    # Processes that outlived the job (and hold its GPUs) are news even after the run ended.
                    self._alert(ALERT_PROCESSES, "warning", str(event.get("message") or "leftover processes"))
            self._changed()
            self._check()

    def feed_telemetry(self, sample: dict[str, Any]) -> None:
        with self.lock:
            self._gpu_note = sample.get("nvml")
            history = self.thresholds.gpu_history
            for gpu in sample.get("gpus") or []:
                index = _int(gpu.get("index"))
                if index is None:
                    continue
                self._gpus[index] = gpu
                used, total = _float(gpu.get("mem_used")), _float(gpu.get("mem_total"))
                mem = self._gpu_mem.setdefault(index, deque(maxlen=history))
                util = self._gpu_util.setdefault(index, deque(maxlen=history))
                mem.append(used / total if used is not None and total else 0.0)
                util.append(_float(gpu.get("util_gpu")) or 0.0)
            host = sample.get("host") or {}
            self._host = host
            if host.get("disk"):
                self._disk = dict(host["disk"])
            self._changed()
            self._check()

    def feed_gpu_history(self, samples: Iterable[dict[str, Any]]) -> None:
        """Samples the host recorded before this dashboard attached (oldest first): they go before any live ones
        in the sparklines' history."""
        with self.lock:
            older_mem: dict[int, list[float]] = {}
            older_util: dict[int, list[float]] = {}
            for sample in samples:
                for gpu in sample.get("gpus") or []:
                    index = _int(gpu.get("index"))
                    if index is None:
                        continue
                    used, total = _float(gpu.get("mem_used")), _float(gpu.get("mem_total"))
                    older_mem.setdefault(index, []).append(used / total if used is not None and total else 0.0)
                    older_util.setdefault(index, []).append(_float(gpu.get("util_gpu")) or 0.0)
            history = self.thresholds.gpu_history
            for index, values in older_mem.items():
                self._gpu_mem[index] = deque(values + list(self._gpu_mem.get(index, ())), maxlen=history)
                self._gpu_util[index] = deque(older_util[index] + list(self._gpu_util.get(index, ())), maxlen=history)
            if older_mem:
                self._changed()

    def feed_disk(self, free: int, total: int) -> None:
        """Free space of the output disk, measured by the caller (for a local run, where telemetry has none)."""
        with self.lock:
            if not self._disk.get("free") or self._disk.get("source") == "local":
                self._disk = {"free": free, "total": total, "source": "local"}
                self._changed()

    def feed_job(self, state: str, exit_info: Optional[ExitInfo], summary: RunSummary) -> None:
        with self.lock:
            if summary:
                self._update_summary(summary)
            self._job_state = state
            if exit_info:
                self._exit = exit_info
            if state in (p.JOB_EXITED, p.JOB_LOST):
                self._take(self.decoder.finish())
            self._changed()
            self._check()

    def feed_link(self, state: str, detail: str = "") -> None:
        with self.lock:
            self._link = state
            if state not in ("connected", "closed"):
                self._add_log_line("eaglewatch", "WARNING", f"link {state}" + (f": {detail}" if detail else ""))
            self._changed()

    def tick(self) -> None:
        """Now and then (a few times a second): finish tracebacks of lanes that went quiet, check for stalls."""
        with self.lock:
            self._take(self.decoder.flush_idle())
            if self._preflight.running:
                # A running check's time ticks on screen; the view moves once a second for it.
                seconds = self._preflight.running_seconds(self.wall())
                if seconds != self._preflight_tick:
                    self._preflight_tick = seconds
                    self._changed()
            self._check()

    def _changed(self) -> None:
        self.version += 1

    # ------------------------------------------------------------------ derived state and alerts

    def _alert(self, kind: str, severity: Severity, message: str) -> None:
        self._alert_seq += 1
        self._alerts.append(Alert(self._alert_seq, kind, severity, message))
        self._changed()

    def _running(self) -> bool:
        return self._job_state in (None, p.JOB_STARTING, p.JOB_RUNNING)

    def _is_stalled(self) -> bool:
        if not self._running():
            return False
        if not self._phase:
            # A job that says no phase (a plain script, a trainer): no output and no event for the stall time.
            return (self._job_state == p.JOB_RUNNING
                    and self.clock() - self._last_output_at >= self.thresholds.stall_after_s)
        if self._phase not in (p.PHASE_LOADING, p.PHASE_EXTRACTING, p.PHASE_VALIDATING):
            return False
        return self.clock() - self._last_progress_at >= self.thresholds.stall_after_s

    # ------------------------------------------------------------------ stacks (the agent's ``stacks``)

    def want_stacks(self) -> None:
        """Ask the feed to take the stacks of every process of the run (the screen's key)."""
        with self.lock:
            self._stacks_wanted = True

    def take_stacks_request(self) -> bool:
        """Whether stacks were asked for since the last call (the feed's loop takes them then)."""
        with self.lock:
            wanted, self._stacks_wanted = self._stacks_wanted, False
            return wanted

    def feed_stacks(self, taken: Optional[dict[str, Any]], error: str = "") -> None:
        """The stacks the agent sent (or why there are none), kept until the next are taken."""
        with self.lock:
            if taken is not None:
                self._stacks = taken
            else:
                self._stacks = {"processes": [], "error": error, "taken_at": None}
            self._changed()

    def stacks(self) -> Optional[dict[str, Any]]:
        with self.lock:
            return self._stacks

    def _output_bytes_to_go(self) -> Optional[int]:
        """What the rest of the extraction will write, from what it has written so far (None before the first
        batch). Sizes follow tokens, so a fresh run scales by tokens; a resumed one by samples."""
        prog, info = self._progress, self._info
        done, total, written_bytes = _int(prog.get("done")), _int(prog.get("total")), _int(prog.get("bytes"))
        if not done or not total or not written_bytes:
            return None
        resumed = _int(info.get("resumed_samples")) or 0
        tokens, tokens_total = _int(prog.get("tokens")), _int(info.get("tokens"))
        if resumed == 0 and tokens and tokens_total:
            return int(written_bytes / tokens * max(0, tokens_total - tokens))
        written = done - resumed
        return int(written_bytes / written * max(0, total - done)) if written > 0 else None

    def _is_low_disk(self) -> bool:
        free = _int(self._disk.get("free"))
        if free is None or not self._running():
            return False
        if free < self.thresholds.low_disk_bytes:
            return True
        to_go = self._output_bytes_to_go()
        if to_go is not None:
            # The job's own needs are known: a fast writer that will stop in time is no alarm.
            return free - to_go < self.thresholds.low_disk_bytes
        full_in = _float(self._disk.get("full_in_s"))
        return full_in is not None and 0 < full_in < self.thresholds.full_in_s

    def _alert_failures(self) -> None:
        """An alert when a failure not alerted before becomes the root cause (at once: provisional or not). A failure
        is known by every key it has had (the process and first line stay while it is refined; the group key may
        change), so a refined one rings no second time, and one that was the root before rings once only."""
        key = self._failures_key()
        shown = self._shown()
        if key != self._alerts_checked:
            self._alerts_checked = key
            for entry in shown:
                if entry.keys & self._alerted:
                    self._alerted.update(entry.keys)
            root = shown[0] if shown else None
            if root is not None and not root.keys & self._alerted:
                self._alerted.update(root.keys)
                self._alert(ALERT_FAILURE, "error", f"failure in {root.view.lanes}: {root.view.summary}")
        if not shown and self._error_event is not None and ("event",) not in self._alerted:
            self._alerted.add(("event",))
            event = self._error_event
            self._alert(ALERT_FAILURE, "error", f"{event.get('exc_type')}: {event.get('message')}")

    def _check(self) -> None:
        self._alert_failures()
        stalled = self._is_stalled()
        if stalled and not self._stalled:
            minutes = self.thresholds.stall_after_s / 60
            doing = f"while {self._phase}" if self._phase else "(no output)"
            self._alert(ALERT_STALL, "warning", f"no progress for {minutes:g} min {doing}; taking the stacks (k)")
            self._stacks_wanted = True  # where each process is, there when the operator looks
        if stalled != self._stalled:
            self._stalled = stalled
            self._changed()
        low = self._is_low_disk()
        if low and not self._low_disk:
            free = _int(self._disk.get("free")) or 0
            to_go = self._output_bytes_to_go()
            needs = f"; the rest of the output needs about {to_go / 1024**3:.1f} GiB" if to_go else ""
            full_in = _float(self._disk.get("full_in_s"))
            left = f"; full in {fmt_duration(full_in)} at the current rate" if full_in and full_in > 0 else ""
            self._alert(ALERT_DISK, "warning",
                        f"low disk space: {free / 1024**3:.1f} GiB free on the output disk{needs}{left}")
        if low != self._low_disk:
            self._low_disk = low
            self._changed()
        if self._dir_gone() and self._running() and not self._dir_gone_alerted:
            self._dir_gone_alerted = True
            pid = self._summary.get("pid")
            self._alert(ALERT_DIR_GONE, "warning",
                        f"the run directory of {self._summary.get('run')} was deleted on the host; the job still runs"
                        + (f" (pid {pid})" if pid else "") + ", but how it ends will not be recorded")
        if self._job_state in (p.JOB_EXITED, p.JOB_LOST) and not self._exit_alerted:
            self._exit_alerted = True
            end = self._end()
            if end is not None and end.failed:
                self._alert(ALERT_EXIT, "error", f"the run ended: {end.text}")

    # ------------------------------------------------------------------ reading (UI thread)

    def output_dir(self) -> Optional[str]:
        """Where the run writes, as the job itself said (the ``output_dir`` of its ``info`` event); until it has
        said so, the run directory."""
        with self.lock:
            told = self._info.get("output_dir")
            if isinstance(told, str) and told:
                return told
            run_dir = self._summary.get("run_dir")
            return run_dir if isinstance(run_dir, str) and run_dir else None

    def alerts_since(self, seq: int) -> list[Alert]:
        with self.lock:
            return [alert for alert in self._alerts if alert.seq > seq]

    def log_since(self, seq: int, limit: Optional[int] = None) -> list[LogLine]:
        """Lines after ``seq`` still in the tail (at most the last ``limit``)."""
        with self.lock:
            count = len(self._tail)
            first = self._seq - count + 1
            start = max(seq + 1, first, self._seq - limit + 1 if limit else first)
            return list(islice(self._tail, start - first, None))

    def _failures_key(self) -> tuple[int, int]:
        return (self.decoder.state.version, self._preflight.version)

    def _shown(self) -> tuple["_Shown", ...]:
        """Failed checks first (they stopped the run before anything loaded), then the decoder's groups, root cause
        first, without the printed table's copies of those checks."""
        key = self._failures_key()
        if self._failures_cache[0] == key:
            return self._failures_cache[1]
        groups = self.decoder.state.failures_ranked()
        failed = self._preflight.failed()
        names = {name for name, _ in failed}
        keys = {name: check_keys(name) for name in names}
        rest = []
        for group in groups:
            copy_of = check_copy(group, names) if names else None
            if copy_of is not None:
                keys[copy_of] = keys[copy_of] | alert_keys(group)
            else:
                rest.append(group)
        shown = [_Shown(check_failure_view(name, event, i + 1), keys[name]) for i, (name, event) in enumerate(failed)]
        for group in rest:
            shown.append(_Shown(failure_view(group, len(shown) + 1), alert_keys(group)))
        result = tuple(shown)
        self._failures_cache = (key, result)
        return result

    def _failures(self) -> tuple[FailureView, ...]:
        return tuple(entry.view for entry in self._shown())

    def news(self) -> tuple[int, int, int]:
        """Moves when the failures, the checks or the alerts change (not with every line): a reader that waits
        for its next poll to redraw anyway may redraw at once when this moved."""
        with self.lock:
            return (self.decoder.state.version, self._preflight.version, self._alert_seq)

    def failures(self) -> tuple[FailureView, ...]:
        """The failures as the panel lists them (the traceback screen follows one of them by its ``ident``)."""
        with self.lock:
            return self._failures_with_event()

    def _dir_gone(self) -> bool:
        return bool(self._summary.get("run_dir_gone"))

    def _end(self) -> Optional[RunEnd]:
        return run_end(self._job_state, self._exit, self._dir_gone())

    def _phase_now(self, samples: Optional[SampleCounts] = None) -> str:
        phase = self._phase
        if self._job_state == p.JOB_LOST:
            return "lost"
        if self._job_state == p.JOB_EXITED:
            end = self._end()
            if end is not None and end.stopped:
                return STOPPED_PHASE  # the operator's stop, not a crash
            if end is not None and end.code:
                return p.PHASE_FAILED
            return phase or "exited"
        if self._stalled:
            return "stalled"
        if phase:
            return phase
        if samples is not None:
            return p.PHASE_EXTRACTING  # a known job past its start: its samples are going through
        return "starting" if self._job_state in (None, p.JOB_STARTING) else "running"

    def _sample_bar(self) -> Optional[SampleCounts]:
        """The latest frame of a known job's sample bar (speculators' data generation), if it has one."""
        found = None
        for bar in self._job_bars():
            counts = sample_counts(bar.last)
            if counts is not None:
                found = counts
        return found

    def _job_kind(self, samples: Optional[SampleCounts]) -> Optional[str]:
        words = self._summary.get("argv")
        kind = kind_of_command([str(w) for w in words]) if isinstance(words, (list, tuple)) else None
        if kind is None and samples is not None:
            kind = SPECULATORS_DATAGEN
        return kind

    def _job_bars(self) -> list[BarState]:
        """The job's own bars, one per lane and description (the decoder keeps them apart), in order of first
        showing. The preflight miniature's bars (its toy shards' "2/2", its "Extracting hidden states 4/4", the
        comparison's reference load), in lanes of its own, are not the job's: the checks panel shows the
        miniature's stage and time, and the log keeps its bars under its lanes."""
        return [bar for bar in self.decoder.state.bars_list() if lane_kind(bar.lane) != KIND_MINIATURE]

    def _load_bars(self) -> tuple[LoadBar, ...]:
        bars = []
        for bar in self._job_bars():
            last = bar.last
            if last.desc.startswith(_EXTRACT_BAR) or sample_counts(last) is not None:
                continue
            bars.append(LoadBar(bar.lane, last.desc, last.n, last.total, last.per_second, last.unit,
                                last.eta_s, last.done))
        return tuple(bars)

    def _extraction(self, samples: Optional[SampleCounts] = None) -> Extraction:
        info, prog, disk = self._info, self._progress, self._disk
        total = _int(prog.get("total")) or _int(info.get("samples"))
        done = _int(prog.get("done"))
        # A run that said how many samples it found done (eaglewatch's info event) is counted by its own events: a
        # run with nothing left to do draws no bar of its own, and a log written before the miniature's lane was on
        # each of its bar's \r updates can hold the miniature's "Extracting hidden states 4/4" in the main lane.
        if done is None and info.get("resumed_samples") is None:
            for bar in self._job_bars():
                if bar.last.desc.startswith(_EXTRACT_BAR):
                    done = int(bar.last.n)
                    total = total or _int(bar.last.total)
        if samples is not None and done is None:
            # A job without eaglewatch's events (speculators' own pipeline): its sample bar is the progress.
            return Extraction(done=samples.n, total=samples.total, samples_per_s=samples.per_second,
                              eta_s=samples.remaining_s if self._running() else None,
                              disk_free=_int(disk.get("free")), disk_total=_int(disk.get("total")),
                              disk_full_in_s=self._full_in(disk), failed_samples=samples.err)
        if done is None and info:
            done = _int(info.get("resumed_samples"))
        extracting = self._phase == p.PHASE_EXTRACTING and self._running()
        return Extraction(
            done=done,
            total=total,
            tokens=_int(prog.get("tokens")) or 0,
            tokens_total=_int(info.get("tokens")),
            bytes=_int(prog.get("bytes")) or 0,
            # While extracting, the last minute's rate where the job measures it (what the ETA follows); after, the
            # run's own average.
            tokens_per_s=(_float(prog.get("recent_tokens_per_s")) if extracting else None)
            or _float(prog.get("tokens_per_s")),
            samples_per_s=_float(prog.get("samples_per_s")),
            eta_s=_float(prog.get("eta_s")) if self._phase == p.PHASE_EXTRACTING else None,
            pace=str(prog["pace"]) if prog.get("pace") in ("disk", "engine") and extracting else None,
            disk_free=_int(disk.get("free")),
            disk_total=_int(disk.get("total")),
            disk_full_in_s=self._full_in(disk),
            bytes_to_go=self._output_bytes_to_go() if self._phase == p.PHASE_EXTRACTING else None,
            resumed=_int(info.get("resumed_samples")) or 0,
        )

    def _full_in(self, disk: dict) -> float | None:
        # When the disk fills at its recent growth: a forecast of this job's writing, so none once it has ended, and
        # none beyond FULL_IN_SHOWN_S (a slow trickle's "full in 5073d" is noise beside a job of hours).
        full_in = _float(disk.get("full_in_s")) if self._running() else None
        return full_in if full_in is not None and 0 < full_in <= FULL_IN_SHOWN_S else None

    def _gpu_views(self) -> tuple[GpuView, ...]:
        views = []
        for index in sorted(self._gpus):
            gpu = self._gpus[index]
            procs = tuple(
                GpuProcess(_int(proc.get("pid")) or 0, _int(proc.get("used_mem")), proc.get("rank"),
                           bool(proc.get("in_job")))
                for proc in gpu.get("processes") or []
            )
            views.append(GpuView(
                index=index,
                name=str(gpu.get("name") or f"GPU {index}"),
                mem_used=_int(gpu.get("mem_used")),
                mem_total=_int(gpu.get("mem_total")),
                util=_float(gpu.get("util_gpu")),
                temp_c=_float(gpu.get("temp_c")),
                power_w=_float(gpu.get("power_w")),
                power_limit_w=_float(gpu.get("power_limit_w")),
                throttle=gpu.get("throttle"),
                error=gpu.get("error"),
                mem_history=tuple(self._gpu_mem.get(index, ())),
                util_history=tuple(self._gpu_util.get(index, ())),
                processes=procs,
            ))
        return tuple(views)

    def _failures_with_event(self) -> tuple[FailureView, ...]:
        views = self._failures()
        if views or self._error_event is None:
            return views
        event = self._error_event
        text = str(event.get("traceback") or "")
        return (FailureView(1, f"{event.get('exc_type')}: {event.get('message')}", "main", "original", 1,
                            None, None, "the pipeline's error event", None, None, text or str(event.get("message")),
                            basis="the pipeline's error event", ident="event:error"),)

    def snapshot(self) -> RunView:
        with self.lock:
            summary = self._summary
            words = summary.get("argv")
            argv = tuple(str(word) for word in words) if isinstance(words, (list, tuple)) else ()
            started = _float(summary.get("started_at"))
            ended = _float((self._exit or {}).get("ended_at"))
            uptime = None
            if started is not None:
                uptime = max(0.0, (ended if ended is not None else self.wall()) - started)
            end = self._end()
            code = end.code if end is not None else None
            marks = []
            failures = self._failures_with_event()
            if failures or (code and not (end is not None and end.stopped)):
                marks.append(MARK_FAILED)
            if self._stalled:
                marks.append(MARK_STALLED)
            if self._low_disk:
                marks.append(MARK_LOW_DISK)
            if self._dir_gone() and self._running():
                marks.append(MARK_DIR_GONE)
            host = self._host
            state = self.decoder.state
            samples = self._sample_bar()  # a known job's sample bar, read once for the view
            return RunView(
                host=self.host,
                run=summary.get("run"),
                name=summary.get("name"),
                command=fmt_argv(argv),
                phase=self._phase_now(samples),
                phase_detail=self._phase_detail,
                job_state=self._job_state,
                exit_text=end.text if end is not None else None,
                exit_code=code,
                uptime_s=uptime,
                marks=tuple(marks),
                link=self._link,
                load=self._load_bars(),
                extraction=self._extraction(samples),
                gpus=self._gpu_views(),
                gpu_note=self._gpu_note,
                host_info=HostView(_float(host.get("cpu_percent")), _int(host.get("cpu_count")),
                                   _int(host.get("ram_used")), _int(host.get("ram_total")),
                                   _float(host.get("load1"))),
                failures=failures,
                warnings=len(state.warnings_ranked()) + self._warning_events,
                lanes=tuple(lane.name for lane in state.lanes_list()),
                lines=state.lines,
                log_bytes=state.bytes,
                log_last_seq=self._seq,
                restart_of=summary.get("restart_of"),
                argv=argv,
                phases_seen=tuple(self._phases),
                load_step=self._load_step[0] if self._load_step and self._running()
                and self._phase not in _AFTER_LOADING else None,
                load_step_age_s=(self.clock() - self._load_step[1]) if self._load_step else None,
                checks=self._preflight.views(self.wall()),
                job_kind=self._job_kind(samples),
            )


@dataclass(frozen=True)
class _Shown:
    """A failure as listed, and the keys its alert is remembered by."""

    view: FailureView
    keys: AlertKeys
