"""A run's GPU history on the host, kept whether or not anyone is watching.

The agent's live telemetry only runs while a dashboard is attached. A run that loads for 18 minutes and crashes at
night should still show, on the next attach, how its GPU memory grew and whether it was freed. So the supervisor
keeps a small recorder beside the job: every few seconds one line in the run directory's ``gpu_history.jsonl``::

    {"t": 1796017300.58, "gpus": [{"index": 0, "mem_used": B, "mem_total": B, "util_gpu": %}, ...]}

Memory and utilisation only, the figures the dashboard's sparklines draw. A file is capped at
:data:`MAX_LINES` lines, then renamed to ``gpu_history.1.jsonl`` (replacing the older one) and started afresh, so
a run keeps at most twice that (at 5 s: 28 hours, about 1 MB per GPU). Without NVML nothing is recorded.

The files are in the run directory, where anything may have been put: one that is not a regular file (a FIFO, a
device) is neither read nor written, and no more than :data:`READ_LIMIT` bytes of one are read. (The agent's
``rundir.open_run_file`` does the same for the run's other files; this package cannot import the agent's.)
"""

from __future__ import annotations

import errno
import json
import os
import stat
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
# The most read of a history file: far above MAX_LINES lines of any host's GPUs, a blink for a huge or endless file.
READ_LIMIT = 64 << 20


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
        self._lines = _count_lines(self.path, max_lines)

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
            fd = _open_regular(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
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


def _open_regular(path: Path, flags: int) -> int:
    """A descriptor of path opened with flags, which must be a regular file; OSError for anything else. The stat
    first keeps a device from being opened at all; O_NONBLOCK keeps the open of a FIFO swapped in after it from
    waiting for the other end; fstat checks what was opened."""
    try:
        mode: int | None = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None  # made by an O_CREAT open, else that open says it is missing
    if mode is not None and not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_at(fd: int, size: int, offset: int) -> bytes:
    """Up to size bytes from offset (fewer when the file is shorter: it may have been cut meanwhile)."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        data = os.pread(fd, size - got, offset + got)
        if not data:
            break
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def _count_lines(path: Path, max_lines: int = MAX_LINES) -> int:
    """The lines of a history file; ``max_lines`` (the next line starts a new file) for one over READ_LIMIT."""
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        lines = offset = 0
        while offset < READ_LIMIT:
            data = os.pread(fd, min(1 << 20, READ_LIMIT - offset), offset)
            if not data:
                return lines
            lines += data.count(b"\n")
            offset += len(data)
        return max(lines, max_lines) if os.pread(fd, 1, offset) else lines
    except OSError:
        return 0
    finally:
        os.close(fd)


def read_recent(run_dir: Path, limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` lines of a run's history, oldest first (across the rename)."""
    lines = _tail_lines(Path(run_dir) / HISTORY_FILE, limit)
    if len(lines) < limit:
        lines = _tail_lines(Path(run_dir) / OLDER_FILE, limit - len(lines)) + lines
    samples = []
    for line in lines:
        try:
            sample = json.loads(line)
        except (ValueError, RecursionError):  # invalid UTF-8 is a ValueError too
            continue  # a line torn by a crash of the recorder
        if isinstance(sample, dict) and isinstance(sample.get("gpus"), list):
            gpus = [gpu for gpu in sample["gpus"] if isinstance(gpu, dict)]
            samples.append(sample if len(gpus) == len(sample["gpus"]) else {**sample, "gpus": gpus})
    return samples


def _tail_lines(path: Path, limit: int) -> list[bytes]:
    """The last ``limit`` non-empty lines of a history file, of its last READ_LIMIT bytes at most; none when it is
    missing or not a regular file."""
    if limit <= 0:
        return []
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except OSError:
        return []
    try:
        size = os.fstat(fd).st_size
        floor = max(0, size - READ_LIMIT)
        block = 4096 + 1024 * min(limit, READ_LIMIT)
        while True:
            start = max(floor, size - block)
            lines = _read_at(fd, size - start, start).split(b"\n")
            if start > 0:
                lines = lines[1:]  # the first may be cut
            lines = [line for line in lines if line.strip()]
            if len(lines) >= limit or start == floor:
                return lines[-limit:]
            block *= 2  # doubling: all the reads together are at most twice the last
    except OSError:
        return []
    finally:
        os.close(fd)
