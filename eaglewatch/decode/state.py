"""What a decoded stream amounts to: lanes, bars, failures and warnings. State, not history.

A lane is a process. Its key is the pid when the prefix gives one (a process may print as ``VllmWorker-0``,
then ``Worker``, then ``Worker_TP0``, and two tensor-parallel workers may both print as ``Worker``), else the
printed name (``main`` for unprefixed output, ``rank3`` for torchrun). The lane shows its most telling name.

Memory is bounded: each lane keeps counters and a short tail of recent lines, each bar its last update,
each distinct failure one example and a count. A dashboard reads it from another thread than the one that
feeds the decoder; every public read takes :attr:`DecodeState.lock` and returns values the caller may keep.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from eaglewatch.decode.events import BarUpdate, Failure, LineEvent, ProcessDeath, TracebackEvent
from eaglewatch.decode.lanes import LaneId, lane_kind, lane_ranks, name_score
from eaglewatch.decode.rootcause import FailureGroup, FailureGroups, group_key, rank


def lane_key(lane: LaneId) -> str:
    return str(lane.pid) if lane.pid is not None else lane.name


@dataclass
class LaneState:
    key: str
    name: str  # the most telling name this process printed
    kind: str
    pid: Optional[int]
    ranks: tuple[tuple[str, int], ...]
    first_line_no: int
    aliases: list[str] = field(default_factory=list)  # every name it printed, first seen first
    lines: int = 0
    levels: dict[str, int] = field(default_factory=dict)  # lines per logger level
    last_time: Optional[str] = None  # the last logger timestamp seen, as printed
    last_output_at: Optional[float] = None  # decoder clock: last line or bar of any kind
    last_progress_at: Optional[float] = None  # decoder clock: last bar that moved
    tail: deque = field(default_factory=deque)  # recent LineEvents

    @property
    def warnings(self) -> int:
        return self.levels.get("WARNING", 0)

    @property
    def errors(self) -> int:
        return self.levels.get("ERROR", 0) + self.levels.get("CRITICAL", 0)

    def observe_name(self, name: str) -> None:
        if name in self.aliases:
            return
        self.aliases.append(name)
        if name_score(name) > name_score(self.name):
            self.name = name
            self.kind = lane_kind(name)
            self.ranks = lane_ranks(name)


@dataclass
class BarState:
    lane_state: LaneState
    desc: str
    last: BarUpdate
    updates: int = 1
    first_line_no: int = 0
    last_update_at: Optional[float] = None
    last_progress_at: Optional[float] = None

    @property
    def lane(self) -> str:
        return self.lane_state.name


class DecodeState:
    """Accumulates the decoder's events. Cheap to query; safe to read from another thread."""

    def __init__(self, tail_lines: int = 50, max_groups: int = 500, max_bars: int = 1000) -> None:
        self.lock = threading.RLock()
        self.tail_lines = tail_lines
        self.max_bars = max_bars
        self.lanes: dict[str, LaneState] = {}  # by lane key
        self._by_name: dict[str, LaneState] = {}  # any printed name -> its lane (the latest one printing it)
        self.bars: dict[tuple[str, str], BarState] = {}  # by (lane key, description)
        self.facts: dict[str, Any] = {}  # vllm_version, tensor_parallel_size, exit_status, ...
        self.lines = 0  # physical lines decoded
        self.bytes = 0
        self.version = 0  # bumped whenever failures or warnings change
        self._failures = FailureGroups(max_groups)
        self._warnings = FailureGroups(max_groups)
        self._ranked: Optional[tuple[int, list[FailureGroup], list[FailureGroup]]] = None
        # Per process, the failure it is printing right now, shown before its report is complete.
        self._provisional: dict[str, tuple[Failure, LaneState]] = {}

    # ------------------------------------------------------------------ updates (decoder side)

    def lane(self, lane: LaneId, line_no: int = 0) -> LaneState:
        """The lane of the process ``lane`` names, created on first sight."""
        key = lane_key(lane)
        state = self.lanes.get(key)
        if state is None:
            state = LaneState(key, lane.name, lane.kind, lane.pid, lane.ranks, line_no, [lane.name],
                              tail=deque(maxlen=self.tail_lines))
            self.lanes[key] = state
        else:
            state.observe_name(lane.name)
        self._by_name[lane.name] = state
        return state

    def lane_of(self, name: str) -> Optional[LaneState]:
        """The lane that printed ``name`` most recently, or whose shown name it is."""
        with self.lock:
            return self._by_name.get(name) or next((s for s in self.lanes.values() if s.name == name), None)

    def add_line(self, lane: LaneState, event: LineEvent, now: Optional[float]) -> None:
        lane.lines += 1
        level = event.level
        if level is not None:
            levels = lane.levels
            levels[level] = levels.get(level, 0) + 1
            if event.time is not None:
                lane.last_time = event.time
        lane.last_output_at = now
        lane.tail.append(event)

    def add_bar(self, lane: LaneState, bar: BarUpdate, line_no: int, now: Optional[float]) -> None:
        key = (lane.key, bar.desc)
        state = self.bars.get(key)
        lane.last_output_at = now
        if state is None:
            if len(self.bars) >= self.max_bars:
                return
            self.bars[key] = BarState(lane, bar.desc, bar, 1, line_no, now, now)
            moved = True
        else:
            last = state.last
            moved = bar.n != last.n or bar.total != last.total
            state.last = bar
            state.updates += 1
            state.last_update_at = now
            if moved:
                state.last_progress_at = now
        if moved:
            lane.last_progress_at = now

    def set_provisional(self, failure: Failure, lane: LaneState) -> None:
        """Show ``failure`` at once: the report ``lane`` is printing, not complete yet (it replaces the one shown
        for that lane before, and :meth:`clear_provisional` or the final failure ends it)."""
        self._provisional[lane.key] = (failure, lane)
        self.version += 1

    def clear_provisional(self, lane: LaneState) -> None:
        if self._provisional.pop(lane.key, None) is not None:
            self.version += 1

    @property
    def provisional(self) -> list[Failure]:
        """The failures shown while their reports are still being printed, one per lane at most."""
        with self.lock:
            return [failure for failure, _ in self._provisional.values()]

    def _process(self, failure: Failure, lane: Optional[LaneState]) -> tuple[str, str]:
        """The key and kind of the process a failure is about."""
        if lane is None:
            lane = self._by_name.get(failure.lane)
        who = failure.who
        if who != failure.lane:
            named = self._by_name.get(who)
            if named is not None:
                return named.key, named.kind
            return f"name:{who}", lane_kind(who)
        if lane is not None:
            return lane.key, lane.kind
        return f"name:{who}", lane_kind(who)

    def add_failure(self, failure: Failure, lane: Optional[LaneState] = None) -> None:
        """File a traceback or death notice; ``lane`` is the lane that printed it."""
        if lane is None:
            lane = self._by_name.get(failure.lane)
        who = failure.who
        if who != failure.lane:
            # Printed on someone else's behalf: "Process EngineCore:" before an unprefixed traceback, or a
            # notice that a named worker died.
            named = self._by_name.get(who)
            key = named.key if named is not None else f"name:{who}"
            kind = named.kind if named is not None else lane_kind(who)
        elif lane is not None:
            key, kind = lane.key, lane.kind
        else:
            key, kind = f"name:{who}", lane_kind(who)
        target = self._warnings if failure.survived else self._failures
        target.add(failure, key, kind)
        self.version += 1

    def apply(self, event: Any, lane: LaneId, line_no: int = 0, now: Optional[float] = None) -> None:
        """Apply one event decoded elsewhere (the decoder calls the specific methods itself)."""
        with self.lock:
            state = self.lane(lane, line_no)
            if isinstance(event, LineEvent):
                self.add_line(state, event, now)
            elif isinstance(event, BarUpdate):
                self.add_bar(state, event, line_no, now)
            elif isinstance(event, (TracebackEvent, ProcessDeath)):
                self.add_failure(event, state)

    # ------------------------------------------------------------------ queries (dashboard side)

    def _name_of(self, key: str) -> Optional[str]:
        lane = self.lanes.get(key)
        return lane.name if lane is not None else None

    def _rank(self) -> tuple[list[FailureGroup], list[FailureGroup]]:
        cached = self._ranked
        if cached is not None and cached[0] == self.version:
            return cached[1], cached[2]
        failure_groups = list(self._failures.groups.values())
        warning_groups = list(self._warnings.groups.values())
        for failure, lane in self._provisional.values():
            target, groups = ((self._warnings, warning_groups) if failure.survived
                              else (self._failures, failure_groups))
            key = group_key(failure)
            if key in target.groups:
                continue  # the same failure is already there, complete (another rank printed it first)
            process_key, kind = self._process(failure, lane)
            group = FailureGroup(key, failure, provisional=True)
            group.add(failure, process_key, kind)
            groups.append(group)
        failures = rank(failure_groups, self.facts, self._name_of)
        warnings = rank(warning_groups, self.facts, self._name_of)
        self._ranked = (self.version, failures, warnings)
        return failures, warnings

    def failures_ranked(self) -> list[FailureGroup]:
        """Failure groups, root cause first."""
        with self.lock:
            return list(self._rank()[0])

    def warnings_ranked(self) -> list[FailureGroup]:
        """Tracebacks the process survived (logged at WARNING or below), grouped like failures."""
        with self.lock:
            return list(self._rank()[1])

    def root_cause(self) -> Optional[FailureGroup]:
        with self.lock:
            failures = self._rank()[0]
            return failures[0] if failures else None

    def lanes_list(self) -> list[LaneState]:
        with self.lock:
            return sorted(self.lanes.values(), key=lambda lane: lane.first_line_no)

    def bars_list(self) -> list[BarState]:
        with self.lock:
            return sorted(self.bars.values(), key=lambda bar: bar.first_line_no)

    @property
    def last_progress_at(self) -> dict[str, float]:
        """Lane name -> decoder-clock time its bars last moved (lanes without bars are absent)."""
        with self.lock:
            return {lane.name: lane.last_progress_at for lane in self.lanes.values()
                    if lane.last_progress_at is not None}

    @property
    def last_output_at(self) -> dict[str, float]:
        """Lane name -> decoder-clock time it last printed anything."""
        with self.lock:
            return {lane.name: lane.last_output_at for lane in self.lanes.values()
                    if lane.last_output_at is not None}

    def stalled(self, now: float, after_s: float) -> list[str]:
        """Lanes with an unfinished bar that has not moved for ``after_s`` seconds (by the decoder's clock)."""
        with self.lock:
            out = []
            for bar in self.bars.values():
                lane = bar.lane_state
                if bar.last.done or lane.last_progress_at is None or lane.name in out:
                    continue
                if now - lane.last_progress_at >= after_s:
                    out.append(lane.name)
            return out

    @property
    def dropped_failures(self) -> int:
        return self._failures.dropped + self._warnings.dropped
