"""The dashboard's IO: everything that touches the connection, run in Textual thread workers.

:func:`follow_run` is the loop behind a run screen: it takes batches from the run's watch and the host's
telemetry queue and folds them into the RunModel (decoder and state are pure; this is the only place they
are fed). It never posts a message per line: the screen polls ``model.version`` at a fixed rate and redraws
when it moved. What an operator waits for (a failure, a check, an alert: ``model.news()``) it is told of at once
through ``on_news``, so that a crash is not painted a poll period late. Every wait is short and checks
``cancelled()``, so leaving the screen stops the loop at once.

A local run's free disk is measured here when the agent's telemetry has none: at the folder the job said it writes
to (``RunModel.output_dir``: its ``info`` event's ``output_dir``, the run directory until that came).
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from eaglewatch.tui.messages import Item, LogChunk, Notice, RunSummary
from eaglewatch.tui.runstate import RunModel

if TYPE_CHECKING:
    from eaglewatch.tui.connection.stream import RunWatch, Sink
    from eaglewatch.tui.connection.target import Endpoint

POLL_S = 0.05  # longest wait for a batch: bounds the time to notice cancellation
TICK_S = 0.25  # how often idle tracebacks are completed and stalls checked
DISK_EVERY_S = 5.0
TELEMETRY_INTERVAL_S = 1.0
# A big batch (reattaching to a long run, a burst of output) is decoded in slices of this many bytes, with the
# model's lock released and the interpreter yielded in between, so that the UI thread keeps answering keys.
SLICE_BYTES = 32 * 1024
# Batches waiting to be decoded. When the decoder falls behind (a burst, or reattaching to a long log), the
# connection's reader thread waits here instead of piling the log up in memory; the agent's writes then block
# on the full pipe or channel, and the log waits in the run directory on the host, where it already is.
MAX_PENDING_BATCHES = 16


class RunSource(Protocol):
    """What :func:`follow_run` uses of a connection (``eaglewatch.tui.connection.Connection``)."""

    host_items: "queue.Queue[list[Item]]"  # telemetry, notices and link states that belong to no one run

    @property
    def endpoint(self) -> "Optional[Endpoint]":  # None: the agent runs on this machine
        ...

    def status(self, run: str) -> RunSummary: ...

    def gpu_history(self, run: str, limit: int = 60) -> list[dict[str, Any]]: ...

    def telemetry(self, interval_s: float) -> dict[str, Any]: ...

    def stacks(self, run: str, saved: bool = False) -> dict[str, Any]: ...

    def watch(self, run: str, *, log_offset: int = 0, events_offset: int = 0,
              callback: "Optional[Sink]" = None) -> "RunWatch": ...

    def unwatch(self, watch: "RunWatch") -> None: ...


def _existing_parent(path: str) -> Optional[str]:
    path = os.path.abspath(path)
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return path


def local_disk(path: Optional[str]) -> Optional[tuple[int, int]]:
    if not path:
        return None
    found = _existing_parent(path)
    if found is None:
        return None
    try:
        usage = shutil.disk_usage(found)
    except OSError:
        return None
    return usage.free, usage.total


def drain(q: "queue.Queue[list[Item]]") -> list[Item]:
    items: list[Item] = []
    while True:
        try:
            items.extend(q.get_nowait())
        except queue.Empty:
            return items


def feed_sliced(model: RunModel, items: list[Item], cancelled: Callable[[], bool]) -> None:
    pending: list[Item] = []
    for item in items:
        if not isinstance(item, LogChunk) or len(item.data) <= SLICE_BYTES:
            pending.append(item)
            continue
        data = item.data
        if pending:
            model.feed_items(pending)
            pending = []
        for start in range(0, len(data), SLICE_BYTES):
            model.feed_log(data[start:start + SLICE_BYTES])
            time.sleep(0)
            if cancelled():
                return
    if pending:
        model.feed_items(pending)


class StacksTaker:
    """Takes the run's stacks in a thread of its own (the agent needs a few seconds to ask every process), one
    taking at a time: a request while one runs is answered by the one running."""

    def __init__(self, connection: RunSource, model: RunModel, tell: Callable[[], None]) -> None:
        self.connection, self.model, self.tell = connection, model, tell
        self.busy = threading.Lock()

    def take(self, run: str) -> None:
        if self.busy.acquire(blocking=False):
            threading.Thread(target=self._take, args=(run,), name="stacks", daemon=True).start()

    def _take(self, run: str) -> None:
        try:
            self.model.feed_stacks(self.connection.stacks(run))
        except Exception as exc:  # an agent from before stacks, a run that just ended: said on the stacks screen
            self.model.feed_stacks(None, f"{type(exc).__name__}: {exc}")
        finally:
            self.busy.release()
        self.tell()


def follow_run(
    connection: RunSource,
    model: RunModel,
    run: str,
    cancelled: Callable[[], bool],
    telemetry: bool = True,
    on_news: Optional[Callable[[], None]] = None,
) -> None:
    """Stream one run into ``model`` until ``cancelled()``; the whole log from offset 0 (reattaching rebuilds).
    ``on_news`` (thread-safe, quick) is called when ``model.news()`` moved after a batch or a tick."""
    summary = connection.status(run)
    news = model.news()

    def tell() -> None:
        nonlocal news
        now = model.news()
        if now != news:
            news = now
            if on_news is not None:
                on_news()

    model.set_summary(summary)
    local = connection.endpoint is None
    if telemetry:
        drain(connection.host_items)  # samples taken while no run was watched are stale
        try:
            # What the run's GPUs did while nobody watched: the sparklines start full on a reattach.
            model.feed_gpu_history(connection.gpu_history(summary["run"], model.thresholds.gpu_history))
        except Exception:  # an agent from before the history, or none recorded: live samples fill them
            pass
        try:
            connection.telemetry(TELEMETRY_INTERVAL_S)
        except Exception as exc:  # an agent without telemetry still streams the run
            model.feed_items([Notice(None, f"no telemetry: {exc}")])
    pending: "queue.Queue[list[Item]]" = queue.Queue(maxsize=MAX_PENDING_BATCHES)
    # Until the agent has answered the watch request, batches are kept aside without a bound: this thread is
    # waiting for that answer, and the reader thread that must deliver it would otherwise wait on a full queue
    # that nobody empties (a run with a long log and many events hung that way on reattach).
    early: list[list[Item]] = []
    early_lock = threading.Lock()
    subscribed = threading.Event()

    def hand_off(batch: list[Item]) -> None:  # on the connection's reader thread
        if not subscribed.is_set():
            with early_lock:
                if not subscribed.is_set():
                    early.append(batch)
                    return
        while True:
            try:
                pending.put(batch, timeout=POLL_S)
                return
            except queue.Full:
                if cancelled():
                    return

    stacks = StacksTaker(connection, model, tell)
    watch = connection.watch(summary["run"], callback=hand_off)
    with early_lock:
        subscribed.set()
        first = [item for batch in early for item in batch]
        early.clear()
    finished = False
    last_tick = last_disk = 0.0
    try:
        if first:
            feed_sliced(model, first, cancelled)
            tell()
        while not cancelled():
            try:
                batch = pending.get(timeout=POLL_S)
            except queue.Empty:
                batch = []
            host = drain(connection.host_items)
            if batch or host:
                feed_sliced(model, batch + host, cancelled)
            now = time.monotonic()
            if not finished and watch.finished.is_set() and pending.empty():
                finished = True
                model.finish_log()
            if now - last_tick >= TICK_S:
                last_tick = now
                model.tick()
            if model.take_stacks_request():
                stacks.take(summary["run"])
            tell()
            if local and now - last_disk >= DISK_EVERY_S:
                last_disk = now
                # Asked each time: the job says where it writes some time after it started.
                disk = local_disk(model.output_dir())
                if disk:
                    model.feed_disk(*disk)
    finally:
        try:
            connection.unwatch(watch)
        except Exception:
            pass

