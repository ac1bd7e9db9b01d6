"""What a watch delivers, and how a run's log bytes are kept exact across reconnects.

Plain Python, no IO: the connection feeds agent messages in, a consumer (CLI, dashboard) takes batches of items out.
The item types themselves live in ``eaglewatch.tui.messages``, where the run state can import them.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from eaglewatch.tui.messages import Event, ExitInfo, Item, JobState, LogChunk, RunSummary

# A partial line (no \n or \r yet) is held back this long before it is delivered anyway: a prompt or a progress
# bar that never ends its line must still be seen.
PARTIAL_HOLD_S = 0.5
PARTIAL_MAX = 64 * 1024


class StreamGap(Exception):
    """Bytes arrived for an offset past what was received: something was skipped, so resubscribe."""


class LogAssembler:
    """Turns log messages (offset, bytes) into exact, ordered, duplicate-free chunks that end on a line end.

    ``delivered`` is the resume offset: everything before it was handed to the consumer. Bytes after the last
    line end are held back (up to PARTIAL_HOLD_S) so that after a reconnect streaming resumes on a line boundary.
    Bytes the agent sends again (a resend after a reconnect) are dropped by offset, never delivered twice.
    """

    def __init__(self, offset: int = 0) -> None:
        self.delivered = offset
        self._pending = bytearray()
        self._pending_since: float | None = None

    @property
    def received(self) -> int:
        return self.delivered + len(self._pending)

    def feed(self, offset: int, data: bytes, now: float | None = None) -> bytes:
        """Take one log message; return the bytes now ready (starting at the old ``delivered``)."""
        expected = self.received
        if offset > expected:
            raise StreamGap(f"log bytes from offset {offset} arrived while {expected} was expected")
        if offset < expected:
            data = data[expected - offset :]
        if data:
            self._pending += data
        return self._take(now if now is not None else time.monotonic(), force=False)

    def flush(self, now: float | None = None, force: bool = False) -> bytes:
        return self._take(now if now is not None else time.monotonic(), force=force)

    def drop_pending(self) -> None:
        """Forget held bytes (on a lost link): they will be sent again from ``delivered``."""
        self._pending.clear()
        self._pending_since = None

    def _take(self, now: float, force: bool) -> bytes:
        if not self._pending:
            return b""
        cut = max(self._pending.rfind(b"\n"), self._pending.rfind(b"\r")) + 1
        stale = self._pending_since is not None and now - self._pending_since >= PARTIAL_HOLD_S
        if force or stale or len(self._pending) > PARTIAL_MAX:
            cut = len(self._pending)
        out = bytes(self._pending[:cut])
        del self._pending[:cut]
        self.delivered += len(out)
        if not self._pending:
            self._pending_since = None
        elif cut or self._pending_since is None:
            self._pending_since = now
        return out


Sink = Callable[[list[Item]], None]


class RunWatch:
    """A subscription to one run. Items arrive in batches, on ``queue`` or through ``callback`` (called from the
    connection's reader thread: keep it short, or hand off). Survives reconnects: offsets live here."""

    def __init__(self, run: str, log_offset: int = 0, events_offset: int = 0, callback: Sink | None = None) -> None:
        self.run = run
        self.log = LogAssembler(log_offset)
        self.events_offset = events_offset
        self.callback = callback
        self.queue: queue.Queue[list[Item]] = queue.Queue()
        self.state: JobState | None = None
        self.finished = threading.Event()  # the job ended and every byte before its exit was delivered
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._batch: list[Item] = []
        self._ended = False
        self.error: Exception | None = None  # what the callback raised, if it did (the watch then stops)

    # --- fed by the connection (reader thread) ------------------------------------------------------
    def on_log(self, offset: int, data: bytes) -> None:
        ready_at = self.log.delivered
        ready = self.log.feed(offset, data)
        if ready:
            self._batch.append(LogChunk(self.run, ready_at, ready))

    def on_event(self, offset: int, end: int, event: dict[str, Any] | None, raw: str | None) -> None:
        if offset < self.events_offset:
            return
        self.events_offset = end
        self._batch.append(Event(self.run, offset, end, event, raw))

    def on_job(self, state: str, exit_info: ExitInfo | None, summary: RunSummary) -> None:
        if state == "exited":
            self._flush_log(force=True)
        job = JobState(self.run, state, exit_info, summary)
        self.state = job
        self._batch.append(job)
        if state in ("exited", "lost"):
            self._ended = True

    def on_item(self, item: Item) -> None:
        self._batch.append(item)

    def on_link_lost(self) -> None:
        self.log.drop_pending()

    def tick(self) -> None:
        """Deliver a partial line that waited long enough, then hand the batch over."""
        self._flush_log(force=False)
        self.deliver()

    def _flush_log(self, force: bool) -> None:
        ready_at = self.log.delivered
        ready = self.log.flush(force=force)
        if ready:
            self._batch.append(LogChunk(self.run, ready_at, ready))

    def deliver(self) -> None:
        with self._lock:
            batch, self._batch = self._batch, []
        if not batch or self.cancelled.is_set():
            return
        if self.callback is not None:
            try:
                self.callback(batch)
            except Exception as exc:
                # A broken consumer must not take the link down with it: stop feeding it and say why.
                self.error = exc
                self.cancelled.set()
                self.finished.set()
                return
        else:
            self.queue.put(batch)
        if self._ended:
            self.finished.set()

    # --- for the consumer ---------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> list[Item]:
        """The next batch, or [] after timeout."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return []

    @property
    def resume_offsets(self) -> tuple[int, int]:
        return self.log.delivered, self.events_offset
