"""The dashboard's IO: everything that touches the connection, run in Textual thread workers.

:func:`follow_run` is the loop behind a run screen: it takes batches from the run's watch and the host's
telemetry queue and folds them into the RunModel (decoder and state are pure; this is the only place they
are fed). It never posts a message per line: the screen polls ``model.version`` at a fixed rate and redraws
when it moved. Every wait is short and checks ``cancelled()``, so leaving the screen stops the loop at once.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from typing import Any, Callable, Optional

from eaglewatch.tui.runstate import RunModel

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


def output_dir_of(summary: dict[str, Any]) -> Optional[str]:
    """Where a run writes (``--output-dir`` of extract, ``--workdir`` of demo), else its run directory."""
    argv = list(summary.get("argv") or [])
    cwd = summary.get("cwd") or os.getcwd()
    for flag in ("--output-dir", "--workdir"):
        for i, word in enumerate(argv):
            value = None
            if word == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif word.startswith(flag + "="):
                value = word.split("=", 1)[1]
            if value:
                return os.path.join(cwd, os.path.expanduser(value))
    return summary.get("run_dir")


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


def drain(q: "queue.Queue[list[Any]]") -> list[Any]:
    items: list[Any] = []
    while True:
        try:
            items.extend(q.get_nowait())
        except queue.Empty:
            return items


def feed_sliced(model: RunModel, items: list[Any], cancelled: Callable[[], bool]) -> None:
    pending: list[Any] = []
    for item in items:
        data = getattr(item, "data", None)
        if type(item).__name__ != "LogChunk" or len(data) <= SLICE_BYTES:
            pending.append(item)
            continue
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


def follow_run(
    connection: Any,
    model: RunModel,
    run: str,
    cancelled: Callable[[], bool],
    telemetry: bool = True,
) -> None:
    """Stream one run into ``model`` until ``cancelled()``; the whole log from offset 0 (reattaching rebuilds)."""
    summary = connection.status(run)
    model.set_summary(summary)
    local = getattr(connection, "endpoint", "remote") is None
    disk_path = output_dir_of(summary) if local else None
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
            from eaglewatch.tui.connection import Notice

            model.feed_items([Notice(None, f"no telemetry: {exc}")])
    pending: "queue.Queue[list[Any]]" = queue.Queue(maxsize=MAX_PENDING_BATCHES)
    # Until the agent has answered the watch request, batches are kept aside without a bound: this thread is
    # waiting for that answer, and the reader thread that must deliver it would otherwise wait on a full queue
    # that nobody empties (a run with a long log and many events hung that way on reattach).
    early: list[list[Any]] = []
    early_lock = threading.Lock()
    subscribed = threading.Event()

    def hand_off(batch: list[Any]) -> None:  # on the connection's reader thread
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
            if disk_path and now - last_disk >= DISK_EVERY_S:
                last_disk = now
                disk = local_disk(disk_path)
                if disk:
                    model.feed_disk(*disk)
    finally:
        try:
            connection.unwatch(watch)
        except Exception:
            pass

