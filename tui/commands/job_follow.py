"""Keeping a FleetModel current: the job's snapshot polled, and each rank's run streamed into its RunModel.

Two loops, each meant for a thread of its own (the dashboard's thread workers), each returning once
``cancelled()`` is true:

- :meth:`FleetFollower.poll_forever` asks for the job's snapshot every ``poll_s`` (or at once after
  :meth:`FleetFollower.poll_now`), one poll at a time, and subscribes to each rank's current run (one watch per
  run, on the connection of the rank's host; a restarted rank's new run replaces the old one's watch and model).
- :meth:`FleetFollower.stream_forever` folds what the watches deliver into the ranks' RunModels (a big batch in
  slices, so that readers of the models keep getting the lock), the hosts' telemetry into the fleet's GPU figures,
  and ticks the models and the fleet (stalls, alerts).

The watches hand their batches over through one bounded queue: when the models fall behind, the connections'
reader threads wait, and the log waits in the run directories on the hosts. The poll loop makes requests while a
reader may wait on that queue; the stream loop, which never makes a request, always empties it, so both move.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, cast

from eaglewatch.tui.commands.job_ops import SSH, JobOps
from eaglewatch.tui.connection.connection import CONNECTED
from eaglewatch.tui.messages import Item, LinkState, LogChunk, RunSummary, Telemetry
from eaglewatch.tui.runstate import RunModel, Thresholds
from eaglewatch.tui.runstate.fleet import FleetModel

if TYPE_CHECKING:
    from eaglewatch.tui.connection import Connection, RunWatch

POLL_S = 2.0
WAIT_S = 0.05  # longest wait of either loop: bounds the time to notice cancellation
TICK_S = 0.25
TELEMETRY_INTERVAL_S = 1.0
SLICE_BYTES = 32 * 1024
MAX_PENDING_BATCHES = 64


@dataclass(eq=False)
class _Followed:
    """One rank's current run, as streamed."""

    rank: int
    run: str
    host: str
    model: RunModel
    connection: Optional["Connection"] = None
    watch: Optional["RunWatch"] = None
    pending: int = 0  # batches handed over and not yet fed
    finished: bool = False
    dropped: threading.Event = field(default_factory=threading.Event)


class FleetFollower:
    def __init__(self, ops: JobOps, fleet: FleetModel, thresholds: Optional[Thresholds] = None,
                 telemetry: bool = True, poll_s: float = POLL_S,
                 on_error: Optional[Callable[[str], None]] = None) -> None:
        self.ops = ops
        self.fleet = fleet
        self.thresholds = thresholds or Thresholds()
        self.telemetry = telemetry
        self.poll_s = poll_s
        self.on_error = on_error  # told (once per new message) when a poll fails as a whole
        self.polls = 0
        self._followed: dict[int, _Followed] = {}
        self._adopted: dict[tuple[int, str], RunModel] = {}
        self._telemetry_on: set[str] = set()
        self._lock = threading.Lock()
        self._queue: "queue.Queue[tuple[_Followed, list[Item]]]" = queue.Queue(maxsize=MAX_PENDING_BATCHES)
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._last_error: Optional[str] = None

    # ------------------------------------------------------------------ for the UI thread

    def poll_now(self) -> None:
        self._wake.set()

    def model_for(self, rank: int, summary: dict[str, Any]) -> RunModel:
        """A model for the rank's new run, to be shown at once; the next poll streams into it."""
        run = str(summary.get("run"))
        with self._lock:
            current = self._followed.get(rank)
            if current is not None and current.run == run:
                return current.model
            model = self._adopted.get((rank, run))
            if model is None:
                model = self._new_model(rank, summary)
                self._adopted[(rank, run)] = model
        self.poll_now()
        return model

    def stop(self) -> None:
        """Stop feeding (the loops return at their next wait); what the connections hold stays theirs."""
        self._stopped.set()
        self._wake.set()
        with self._lock:
            for followed in self._followed.values():
                followed.dropped.set()

    # ------------------------------------------------------------------ polling

    def poll_forever(self, cancelled: Callable[[], bool]) -> None:
        while not cancelled() and not self._stopped.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # said, and tried again at the next poll: one bad answer stops nothing
                self._tell(f"cannot follow job {self.ops.job}: {exc}")
            self._wake.clear()
            deadline = time.monotonic() + self.poll_s
            while time.monotonic() < deadline and not cancelled() and not self._stopped.is_set():
                if self._wake.wait(WAIT_S):
                    break

    def poll_once(self) -> None:
        try:
            snapshot = self.ops.snapshot()
        except Exception as exc:
            self._tell(f"cannot read job {self.ops.job}: {exc}")
            return
        self._last_error = None
        self.polls += 1
        self.fleet.set_snapshot(snapshot)
        for entry in snapshot.get("ranks") or []:
            if self._stopped.is_set():
                return
            self._follow(entry)
        self.fleet.tick()

    def _tell(self, message: str) -> None:
        """Say what went wrong, once until something else does."""
        if message != self._last_error and self.on_error is not None:
            self.on_error(message)
        self._last_error = message

    def _new_model(self, rank: int, summary: dict[str, Any]) -> RunModel:
        entry = next((e for e in self.ops.record.get("ranks") or [] if e.get("rank") == rank), {"rank": rank})
        return RunModel(self.ops.host_of(entry), cast(RunSummary, summary) or None, thresholds=self.thresholds)

    def _follow(self, entry: dict[str, Any]) -> None:
        rank, run = entry.get("rank"), entry.get("run")
        if not isinstance(rank, int) or not isinstance(run, str) or not run:
            return
        summary = _dict(entry.get("summary"))
        with self._lock:
            current = self._followed.get(rank)
        if current is not None and current.run == run:
            if summary and current.watch is None:
                current.model.set_summary(cast(RunSummary, summary))
            if current.watch is None and not current.finished:
                self._subscribe(current, entry)
            self._recorded_gpus(current, entry)
            return
        if current is not None:
            self._drop(current)
        with self._lock:
            model = self._adopted.pop((rank, run), None)
        if model is None:
            model = self._new_model(rank, summary)
        followed = _Followed(rank, run, self.ops.host_of(entry), model)
        with self._lock:
            self._followed[rank] = followed
        self.fleet.set_rank_model(rank, model)
        self._subscribe(followed, entry)

    def _subscribe(self, followed: _Followed, entry: dict[str, Any]) -> None:
        try:
            connection = self.ops.connection_for(entry)
            followed.connection = connection
            if connection.state != CONNECTED:
                return  # reconnecting by itself; the next poll subscribes (a request now would wait for it)
            if self.telemetry and self.ops.scheduler == SSH and followed.host not in self._telemetry_on:
                try:
                    connection.telemetry(TELEMETRY_INTERVAL_S)
                except Exception:  # an agent without telemetry still streams its runs
                    pass
                self._telemetry_on.add(followed.host)
            followed.watch = connection.watch(followed.run, callback=lambda batch: self._hand_off(followed, batch))
        except Exception:  # the rank's row says why (the snapshot's error); the next poll tries again
            followed.watch = None
        self._recorded_gpus(followed, entry)

    def _recorded_gpus(self, followed: _Followed, entry: dict[str, Any]) -> None:
        """A Slurm rank's node is not the target, whose telemetry is its own: the node's GPUs are known from what
        the run's supervisor records there (its GPU history), asked once a poll while the run runs."""
        node = entry.get("node")
        if self.ops.scheduler == SSH or not isinstance(node, str) or followed.connection is None \
                or _dict(entry.get("summary")).get("state") != "running":
            return
        try:
            samples = followed.connection.gpu_history(followed.run, limit=1)
        except Exception:
            return
        if samples:
            self.fleet.feed_node_gpus(node, samples[-1].get("gpus") or [])

    def _drop(self, followed: _Followed) -> None:
        followed.dropped.set()
        if followed.watch is not None and followed.connection is not None:
            try:
                followed.connection.unwatch(followed.watch)
            except Exception:
                pass

    # ------------------------------------------------------------------ streaming

    def _hand_off(self, followed: _Followed, batch: list[Item]) -> None:  # on a connection's reader thread
        with self._lock:
            followed.pending += 1
        while not followed.dropped.is_set():
            try:
                self._queue.put((followed, batch), timeout=WAIT_S)
                return
            except queue.Full:
                continue
        with self._lock:
            followed.pending -= 1

    def stream_forever(self, cancelled: Callable[[], bool]) -> None:
        last_tick = 0.0
        try:
            while not cancelled() and not self._stopped.is_set():
                batches = self._take(cancelled)
                for followed, items in batches:
                    if not followed.dropped.is_set():
                        _feed(followed.model, items, cancelled)
                    with self._lock:
                        followed.pending -= 1
                self._host_items()
                with self._lock:
                    current = list(self._followed.values())
                for followed in current:
                    watch = followed.watch
                    if not followed.finished and watch is not None and watch.finished.is_set() \
                            and followed.pending == 0:
                        followed.finished = True
                        followed.model.finish_log()
                now = time.monotonic()
                if now - last_tick >= TICK_S:
                    last_tick = now
                    for followed in current:
                        followed.model.tick()
                    self.fleet.tick()
        finally:
            self.stop()

    def _take(self, cancelled: Callable[[], bool]) -> list[tuple[_Followed, list[Item]]]:
        try:
            first = self._queue.get(timeout=WAIT_S)
        except queue.Empty:
            return []
        taken = [first]
        while len(taken) < MAX_PENDING_BATCHES and not cancelled():
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return taken

    def _host_items(self) -> None:
        """Each host's telemetry and link states: the node's GPUs for the fleet, and the samples for the models of
        the ranks on that host (their run screens show them)."""
        with self._lock:
            by_host: dict[str, list[_Followed]] = {}
            for followed in self._followed.values():
                by_host.setdefault(followed.host, []).append(followed)
        for host, ranks in by_host.items():
            connection = ranks[0].connection
            if connection is None:
                continue
            items: list[Item] = []
            while True:
                try:
                    items.extend(connection.host_items.get_nowait())
                except queue.Empty:
                    break
            shared = [item for item in items if isinstance(item, (Telemetry, LinkState))]
            if not shared:
                continue
            if self.ops.scheduler == SSH:
                for item in shared:
                    if isinstance(item, Telemetry):
                        self.fleet.feed_node_gpus(host, item.sample.get("gpus") or [])
            for followed in ranks:
                # Telemetry of a Slurm target is the login node's, not the ranks' nodes': only link states there.
                mine = shared if self.ops.scheduler == SSH else [i for i in shared if isinstance(i, LinkState)]
                if mine:
                    followed.model.feed_items(mine)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _feed(model: RunModel, items: list[Item], cancelled: Callable[[], bool]) -> None:
    """Items into the model, a big log chunk in slices: the model's lock is let go between them."""
    pending: list[Item] = []
    for item in items:
        if not isinstance(item, LogChunk) or len(item.data) <= SLICE_BYTES:
            pending.append(item)
            continue
        if pending:
            model.feed_items(pending)
            pending = []
        for start in range(0, len(item.data), SLICE_BYTES):
            model.feed_log(item.data[start:start + SLICE_BYTES])
            time.sleep(0)
            if cancelled():
                return
    if pending:
        model.feed_items(pending)
