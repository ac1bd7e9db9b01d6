"""A run's GPU history on the host, kept whether or not anyone is watching.

The agent's live telemetry only runs while a dashboard is attached. A run that loads for 18 minutes and crashes at
night should still show, on the next attach, how its GPU memory grew and whether it was freed. So the supervisor
keeps a small recorder beside the job: every few seconds one line in the run directory's ``gpu_history.jsonl``::

    {"t": 1796017300.58, "gpus": [{"index": 0, "mem_used": B, "mem_total": B, "util_gpu": %}, ...]}

Memory and utilisation only, the figures the dashboard's sparklines draw. A file is capped at
:data:`MAX_LINES` lines, then renamed to ``gpu_history.1.jsonl`` (replacing the older one) and started afresh, so
a run keeps at most twice that (at 5 s: 28 hours, about 1 MB per GPU). Without NVML nothing is recorded.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Optional

from .nvml import NvmlSource

HISTORY_FILE = "gpu_history.jsonl"
OLDER_FILE = "gpu_history.1.jsonl"
MAX_LINES = 10_000
INTERVAL_S = 5.0
_FIELDS = ("memory", "utilization")


def compact(readings: list[dict[str, Any]], t: float) -> dict[str, Any]:
    """One history line from raw NVML readings (see :mod:`.nvml`)."""
    gpus = []
    for reading in readings:
        memory = reading.get("memory") or {}
        util = reading.get("utilization") or {}
        gpus.append({"index": reading.get("index"), "mem_used": memory.get("used"), "mem_total": memory.get("total"),
                     "util_gpu": util.get("gpu")})
    return {"t": round(t, 2), "gpus": gpus}


class HistoryRecorder(threading.Thread):
    """Appends one line every ``interval_s`` until :meth:`finish`, which records a last line (memory released)."""

    def __init__(self, run_dir: Path, interval_s: float = INTERVAL_S, source: Optional[NvmlSource] = None,
                 max_lines: int = MAX_LINES) -> None:
        super().__init__(name="eaglewatch-gpu-history", daemon=True)
        self.path = Path(run_dir) / HISTORY_FILE
        self.older = Path(run_dir) / OLDER_FILE
        self.interval_s = interval_s
        self.source = source if source is not None else NvmlSource()
        self.max_lines = max_lines
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._lines = _count_lines(self.path)

    def available(self) -> bool:
        return self.source.available

    def record(self) -> None:
        readings = self.source.read(fields=_FIELDS)
        if not readings:
            return
        line = (json.dumps(compact(readings, time.time()), separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._lines >= self.max_lines:
                os.replace(self.path, self.older)
                self._lines = 0
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            self._lines += 1

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.record()
            except Exception:  # a failing GPU query must never touch the job; the next tick tries again
                pass
            self._stop_event.wait(self.interval_s)

    def finish(self, settle_s: float = 1.0) -> None:
        """Stop, and record a last line ``settle_s`` later: the driver frees a dead process's memory a moment
        after it is gone (0.15-0.2 s on the H200s), and that release is what the last line is for."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=self.interval_s + 5)
        time.sleep(settle_s)
        try:
            self.record()
        except Exception:
            pass
        self.source.close()


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return 0


def read_recent(run_dir: Path, limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` lines of a run's history, oldest first (across the rename)."""
    lines = _tail_lines(Path(run_dir) / HISTORY_FILE, limit)
    if len(lines) < limit:
        lines = _tail_lines(Path(run_dir) / OLDER_FILE, limit - len(lines)) + lines
    samples = []
    for line in lines:
        try:
            sample = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash of the recorder
        if isinstance(sample, dict) and isinstance(sample.get("gpus"), list):
            samples.append(sample)
    return samples


def _tail_lines(path: Path, limit: int) -> list[bytes]:
    if limit <= 0:
        return []
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            block = 4096 + 1024 * limit
            start = max(0, size - block)
            while True:
                fh.seek(start)
                data = fh.read(size - start)
                lines = data.split(b"\n")
                if start > 0:
                    lines = lines[1:]  # the first may be cut
                lines = [line for line in lines if line.strip()]
                if len(lines) >= limit or start == 0:
                    return lines[-limit:]
                start = max(0, start - block)
    except OSError:
        return []
