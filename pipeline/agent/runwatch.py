"""News of a run that reaches the operator with no dashboard open: the supervisor's watcher.

The supervisor lives as long as the job, on the host, whether or not anyone is connected. When the launch asked for
alerts (``alerts.json`` in the run directory, written by the agent from the operator's config file), a thread of the
supervisor reads the run's log and events as they grow, decodes the log, and raises at most one alert per episode:

* ``failure``: a failure becomes the root cause (complete, not provisional), with its decoded summary;
* ``stall``: no progress for the stall time while validating, loading or extracting (a job that says no phase:
  no output and no event at all), with the stacks of every process, grouped (stacks.py, decode/stackgroups.py);
  kept in ``stacks.json`` for the dashboard and ``eaglewatch stacks``;
* ``low_disk``: free space under the limit on the output disk, with the time left at the current rate;
* ``time_limit``: a Slurm rank whose ETA passes the time its job has left;
* ``end``: the run ended (finished, stopped, or failed with its root cause).

Sending is alert_send.py's: in a worker thread, bounded retries, nothing secret in the log. Nothing here can
disturb the job: every error of the watcher is swallowed into one ``[eaglewatch]`` line at most.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from eaglewatch import protocol as p
from eaglewatch.decode import Decoder
from eaglewatch.decode.stackgroups import group, render, summary
from eaglewatch.pipeline.agent import stacks
from eaglewatch.pipeline.agent.alert_send import AlertSender, AlertSinks
from eaglewatch.pipeline.agent.rundir import RunDir, read_run_file, read_run_record, write_json_atomic

ALERTS_FILE = "alerts.json"
ALERTS_LIMIT = 64 * 1024
READ_STEP = 4 << 20  # bytes of log or events read per look: a burst is read over a few looks, never all at once
LOOK_EVERY_S = 1.0
FLUSH_IDLE_S = 2.0  # a traceback whose lane has been quiet this long is complete
DISK_EVERY_S = 10.0
SLURM_EVERY_S = 60.0
_STALL_PHASES = (p.PHASE_VALIDATING, p.PHASE_LOADING, p.PHASE_EXTRACTING)
_PROGRESS_EVENTS = (p.EVENT_PHASE, p.EVENT_PROGRESS, p.EVENT_SAMPLE)


@dataclass(frozen=True)
class AlertSettings:
    """What alerts.json asks for: where to send, and the thresholds (the operator's config file's)."""

    sinks: AlertSinks
    stall_after_s: float = 300.0
    low_disk_bytes: int = 2 * 1024**3
    problems: tuple[str, ...] = ()

    @classmethod
    def from_record(cls, record: object) -> "AlertSettings":
        if not isinstance(record, dict):
            return cls(AlertSinks(), problems=("alerts.json is not a JSON object",))
        sinks, problems = AlertSinks.from_record({k: v for k, v in record.items() if k in SINK_KEYS})
        stall = _positive(record.get("stall_after_s"), 300.0)
        low = _positive(record.get("low_disk_bytes"), 2 * 1024**3)
        return cls(sinks, stall, int(low), tuple(problems))


SINK_KEYS = ("command", "webhook", "format")


def _positive(value: Any, default: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    return default


def read_record(run: RunDir | Path) -> dict[str, Any] | None:
    """alerts.json as written, or None when the launch asked for no alerts (or the file is unreadable)."""
    path = (run.path if isinstance(run, RunDir) else run) / ALERTS_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(read_run_record(path, ALERTS_LIMIT).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_settings(run: RunDir) -> AlertSettings | None:
    """The run's alert settings, or None when its launch asked for none."""
    record = read_record(run)
    return None if record is None else AlertSettings.from_record(record)


def write_settings(run: RunDir | Path, record: dict[str, Any]) -> None:
    """alerts.json in a run directory (or a Slurm job's folder, whose ranks copy it), readable by its owner only
    (a webhook's URL is a secret), new beside old then swapped in."""
    folder = run.path if isinstance(run, RunDir) else run
    write_json_atomic(folder / ALERTS_FILE, record)
    os.chmod(folder / ALERTS_FILE, 0o600)


@dataclass
class _Progress:
    """When the run last moved, by the dashboard's rule (tui/runstate/model.py), read on the host."""

    phase: str = ""
    moved_at: float = 0.0
    output_at: float = 0.0

    def stalled_for(self, now: float, bars_moved_at: float) -> float | None:
        """Seconds without progress, or None when a stall cannot be (a phase that does not stall)."""
        if self.phase:
            if self.phase not in _STALL_PHASES:
                return None
            return now - max(self.moved_at, bars_moved_at)
        return now - max(self.output_at, self.moved_at)


@dataclass
class RunWatcher:
    """Reads one run as it grows and raises alerts (see the module's docstring). ``step`` is one look."""

    run: RunDir
    settings: AlertSettings
    sender: AlertSender
    pgid: int | None = None
    clock: Callable[[], float] = time.monotonic
    host: str = field(default_factory=socket.gethostname)
    take_stacks: Callable[[], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.decoder = Decoder(clock=self.clock, emit_lines=False)
        now = self.clock()
        self.progress = _Progress(moved_at=now, output_at=now)
        self.log_offset = 0
        self.events_offset = 0
        self.alerted: set[tuple[object, ...]] = set()
        self.stalled = False
        self.low_disk = False
        self.late = False
        self.output_dir: str | None = None
        self.eta_s: float | None = None
        self.disk: list[tuple[float, int]] = []  # (clock, free bytes), the last few minutes
        self.disk_at = 0.0
        self.slurm_at = 0.0
        self.stop_event = threading.Event()

    # ------------------------------------------------------------------ reading
    def step(self) -> None:
        now = self.clock()
        self._read_events(now)
        self._read_log(now)
        self.decoder.flush_idle(FLUSH_IDLE_S)
        self._check_failure()
        self._check_stall(now)
        if now - self.disk_at >= DISK_EVERY_S:
            self.disk_at = now
            self._check_disk(now)
        if self.eta_s is not None and now - self.slurm_at >= SLURM_EVERY_S:
            self.slurm_at = now
            self._check_time_limit()

    def _read_log(self, now: float) -> None:
        try:
            data = read_run_file(self.run.log_path, READ_STEP, self.log_offset)
        except OSError:
            return
        if data:
            self.log_offset += len(data)
            self.progress.output_at = now
            self.decoder.feed(data)

    def _read_events(self, now: float) -> None:
        try:
            data = read_run_file(self.run.events_path, READ_STEP, self.events_offset)
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.events_offset += end
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self._event(event, now)

    def _event(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("kind")
        self.progress.output_at = now
        if kind in _PROGRESS_EVENTS:
            self.progress.moved_at = now
        if kind == p.EVENT_PHASE and isinstance(event.get("phase"), str):
            self.progress.phase = event["phase"]
        elif kind == p.EVENT_PROGRESS:
            eta = event.get("eta_s")
            self.eta_s = float(eta) if isinstance(eta, (int, float)) and not isinstance(eta, bool) else None
        elif kind == p.EVENT_INFO and isinstance(event.get("output_dir"), str):
            self.output_dir = event["output_dir"]

    # ------------------------------------------------------------------ alerts
    def _alert(self, kind: str, severity: str, title: str, message: str = "", **extra: Any) -> None:
        cmd = self._cmd()
        name = cmd.get("name") if isinstance(cmd.get("name"), str) else None
        who = name or self.run.run_id
        self.sender.send({"kind": kind, "run": self.run.run_id, "name": name, "host": self.host,
                          "title": f"{who} on {self.host}: {title}", "message": message or title,
                          "severity": severity, "at": round(time.time(), 3), **extra})

    def _cmd(self) -> dict[str, Any]:
        try:
            return self.run.cmd()
        except (OSError, ValueError):
            return {}

    def _check_failure(self) -> None:
        root = self.decoder.state.root_cause()
        if root is None or root.provisional or root.key in self.alerted:
            return
        self.alerted.add(root.key)
        hint = f"\nhint: {root.hint.text}" if root.hint is not None else ""
        self._alert("failure", "error", f"failure in {root.lanes_label()}: {root.summary}",
                    f"{root.summary}{hint}", root_cause=root.summary)

    def _check_stall(self, now: float) -> None:
        bars = self.decoder.state.last_progress_at
        quiet = self.progress.stalled_for(now, max(bars.values(), default=0.0))
        stalled = quiet is not None and quiet >= self.settings.stall_after_s
        if stalled and not self.stalled:
            while_ = f" while {self.progress.phase}" if self.progress.phase else " (no output)"
            title = f"stalled: no progress for {_span(self.settings.stall_after_s)}{while_}"
            taken = self._take_stacks()
            message = title
            extra: dict[str, Any] = {}
            if taken is not None:
                groups = group(taken["processes"])
                if groups:
                    title = f"{title}: {summary(groups)}"
                    message = "\n".join([title, ""] + render(groups))
                    extra["stacks"] = summary(groups)
            self._alert("stall", "warning", title, message, **extra)
        self.stalled = stalled

    def _take_stacks(self) -> dict[str, Any] | None:
        try:
            taken = (self.take_stacks or (lambda: stacks.take(self.run.run_id, self.run.path, self.pgid)))()
        except Exception:
            return None
        try:
            write_json_atomic(self.run.path / stacks.LAST_STACKS, taken)
        except OSError:
            pass
        return taken

    def _check_disk(self, now: float) -> None:
        folder = self.output_dir or str(self.run.path)
        try:
            got = os.statvfs(folder)
        except OSError:
            return
        free = got.f_bavail * got.f_frsize
        self.disk = [(at, value) for at, value in self.disk if now - at <= 300.0] + [(now, free)]
        low = free < self.settings.low_disk_bytes
        if low and not self.low_disk:
            left = time_left(self.disk)
            rate = f"; full in {_duration(left)} at the current rate" if left is not None else ""
            self._alert("low_disk", "warning", f"low disk: {free / 1024**3:.1f} GiB free on {folder}{rate}",
                        free_bytes=free, full_in_s=left)
        self.low_disk = low

    def _check_time_limit(self) -> None:
        job = os.environ.get("SLURM_JOB_ID") or _environ_of_job(self.run)
        if not job or self.eta_s is None or self.late:
            return
        left = slurm_time_left(job)
        if left is not None and self.eta_s > left:
            self.late = True
            self._alert("time_limit", "warning",
                        f"will not finish before the Slurm time limit: ETA {_duration(self.eta_s)}, "
                        f"{_duration(left)} left to job {job}", eta_s=self.eta_s, time_left_s=left)

    def end(self, record: dict[str, Any]) -> None:
        """After the job's exit: the rest of the log, then the end alert (a failure's root cause in it)."""
        try:
            self._read_events(self.clock())
            for _ in range(64):
                before = self.log_offset
                self._read_log(self.clock())
                if self.log_offset == before:
                    break
            self.decoder.finish()
        except Exception:
            pass
        self._check_failure()
        root = self.decoder.state.root_cause()
        how = outcome(record)
        if record.get("stopped"):
            self._alert("end", "info", f"ended: {how}", outcome="stopped")
        elif record.get("code") == 0:
            self._alert("end", "info", f"ended: {how}", outcome="finished")
        else:
            cause = f": {root.summary}" if root is not None else ""
            self._alert("end", "error", f"ended: failed ({how}){cause}", outcome="failed",
                        root_cause=root.summary if root is not None else None)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run_until_stopped, name="alerts", daemon=True)
        self.thread.start()

    def finish(self, record: dict[str, Any]) -> None:
        """The job ended: the last look is ``end``'s, once the watching thread has stopped."""
        self.stop_event.set()
        thread = getattr(self, "thread", None)
        if thread is not None:
            thread.join(10.0)
        self.end(record)

    def run_until_stopped(self, every_s: float = LOOK_EVERY_S) -> None:
        while not self.stop_event.wait(every_s):
            try:
                self.step()
            except Exception:
                continue  # a watcher's mistake must never end the supervisor or disturb the job


def outcome(record: dict[str, Any]) -> str:
    if record.get("stopped"):
        return "stopped by the operator"
    if record.get("signal_name") or record.get("signal"):
        return f"killed by {record.get('signal_name') or record.get('signal')}"
    if record.get("code") == 0:
        return "finished (exit code 0)"
    return f"exit code {record.get('code')}"


def time_left(samples: list[tuple[float, int]]) -> float | None:
    """Seconds until the disk is full at the rate of the samples (the last few minutes), or None when it does not
    shrink."""
    if len(samples) < 2:
        return None
    (t0, f0), (t1, f1) = samples[0], samples[-1]
    if t1 <= t0 or f1 >= f0:
        return None
    return f1 / ((f0 - f1) / (t1 - t0))


def _span(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 60 else f"{seconds / 60:.3g} min"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def _environ_of_job(run: RunDir) -> str | None:
    pid = run.pid()
    if pid is None:
        return None
    data = stacks._read(f"/proc/{pid}/environ", 1 << 20)
    for item in data.split(b"\0"):
        if item.startswith(b"SLURM_JOB_ID="):
            return item.split(b"=", 1)[1].decode("ascii", "replace")
    return None


def slurm_time_left(job: str) -> float | None:
    """What ``squeue -h -j JOB -o %L`` says the job has left (``[D-]HH:MM:SS``, ``MM:SS``), in seconds."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_slurm_time(done.stdout.decode("ascii", "replace").strip().splitlines()[0:1])


def parse_slurm_time(lines: list[str]) -> float | None:
    if not lines:
        return None
    text = lines[0].strip()
    days = 0
    if "-" in text:
        head, _, text = text.partition("-")
        if not head.isdigit():
            return None
        days = int(head)
    parts = text.split(":")
    if not parts or not all(part.isdigit() for part in parts) or len(parts) > 3:
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return float(days * 86400 + seconds)
