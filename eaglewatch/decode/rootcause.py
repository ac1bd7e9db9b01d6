"""Grouping failures across lanes and putting the root cause first.

Identical failures (same type, same innermost frame) printed by several ranks, or printed twice by one, become
one :class:`FailureGroup`. Groups are ordered by *tier*, then by where they first appeared:

0. an original exception (nothing says it is a copy of another);
1. a secondary one: a process death notice, teardown noise (KeyboardInterrupt, BrokenPipeError, ...), a
   traceback cut short, an abort that follows a C++ exception;
2. a re-raise of another process's failure ("WorkerProc initialization failed ... See stack trace for root
   cause", "Worker failed with error '...'"), or a message that quotes an earlier failure of another lane;
3. the main process's last word ("Engine core initialization failed. See root cause above", EngineDeadError).

So a worker's own exception comes before the EngineCore's re-raise, which comes before the main process's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from eaglewatch.decode.events import (
    KIND_ABORT,
    KIND_DEATH,
    KIND_FATAL,
    ExceptionRecord,
    Failure,
    Frame,
)
from eaglewatch.decode.hints import Hint, classify
from eaglewatch.decode.lanes import KIND_WORKER, MAIN_LANE, compress_names

TIER_ORIGINAL = 0
TIER_SECONDARY = 1
TIER_PROPAGATED = 2
TIER_TOPLEVEL = 3

TIER_NAMES = {TIER_ORIGINAL: "original", TIER_SECONDARY: "secondary", TIER_PROPAGATED: "re-raised",
              TIER_TOPLEVEL: "final report"}

_TOPLEVEL = re.compile(
    r"Engine core initialization failed|EngineCore encountered an issue|Engine process failed to start"
    r"|engine core (?:client )?(?:has )?(?:died|is dead)|EngineCore(?:_DP\d+)? (?:failed|died)",
    re.I,
)
_TOPLEVEL_TYPES = frozenset({"EngineDeadError", "EngineGenerateError"})
_PROPAGATED = re.compile(
    r"root cause|see (?:the )?(?:stack ?trace|traceback|logs? )?above|check the (?:stack ?trace|logs?)"
    r"|in a background process|Worker failed with error|WorkerProc (?:initialization|startup) failed"
    r"|failed core proc|exception in (?:a|the) (?:worker|child|background)|^\w*(?:Error|Exception): Executor failed"
    r"|RPC call to \w+ timed out",
    re.I,
)
_PROPAGATED_TYPES = frozenset({"ChildFailedError", "RayTaskError", "RayActorError"})
_SECONDARY_TYPES = frozenset(
    {"KeyboardInterrupt", "SystemExit", "BrokenPipeError", "ConnectionResetError", "ConnectionAbortedError",
     "EOFError", "CancelledError", "ContextTerminated", "GeneratorExit", "ThreadDump"}
)
_DIGITS = re.compile(r"\d+")
_MIN_QUOTE = 16


def exception_tier(exc: ExceptionRecord) -> int:
    text = f"{exc.exc_type}: {exc.message}"
    if exc.short_type in _TOPLEVEL_TYPES or _TOPLEVEL.search(text):
        return TIER_TOPLEVEL
    if _PROPAGATED.search(text) or exc.short_type.split("(")[0] in _PROPAGATED_TYPES:
        return TIER_PROPAGATED
    if exc.short_type in _SECONDARY_TYPES:
        return TIER_SECONDARY
    return TIER_ORIGINAL


def failure_tier(failure: Failure) -> int:
    if failure.kind == KIND_DEATH or not failure.complete:
        return TIER_SECONDARY
    if failure.kind == KIND_FATAL and failure.signal == "SIGABRT":
        return TIER_SECONDARY
    # A chain that contains an original exception is an original failure, whatever wraps it.
    return min(exception_tier(exc) for exc in failure.exceptions)


def group_key(failure: Failure) -> tuple[object, ...]:
    if failure.kind == KIND_DEATH:
        return (KIND_DEATH, failure.signal, _DIGITS.sub("#", failure.message))
    inner = failure.innermost
    if inner is not None:
        return (failure.kind, failure.exc_type, inner.file, inner.line, inner.function)
    return (failure.kind, failure.exc_type, _DIGITS.sub("#", failure.message[:300]))


def summary(failure: Failure, width: int = 200) -> str:
    """One line: ``Type: message``; for an empty message, the failing source line and where it is."""
    message = failure.message.strip()
    exc_type = failure.exc_type or "incomplete traceback"
    if message:
        text = f"{exc_type}: {' '.join(message.split())}"
    else:
        inner = failure.innermost
        if inner is not None and inner.source:
            text = f"{exc_type} at {inner.location()}: {inner.source}"
        elif inner is not None:
            text = f"{exc_type} at {inner.location()}"
        else:
            text = exc_type
    return text if len(text) <= width else text[: width - 1] + "\u2026"


@dataclass
class FailureGroup:
    """One failure, however many processes printed it and however often."""

    key: tuple[object, ...]
    first: Failure
    count: int = 0
    process_keys: list[str] = field(default_factory=list)  # the processes that printed it, first first
    printed: dict[str, str] = field(default_factory=dict)  # process key -> the name it printed with
    kinds: dict[str, str] = field(default_factory=dict)  # process key -> lane kind
    last_line_no: int = 0
    lanes: list[str] = field(default_factory=list)  # display names of the processes (set by rank())
    tier: int = TIER_ORIGINAL
    hint: Optional[Hint] = None
    flags: frozenset[str] = frozenset()

    def add(self, failure: Failure, process_key: str, lane_kind: str) -> None:
        self.count += 1
        if process_key not in self.printed:
            self.process_keys.append(process_key)
            self.printed[process_key] = failure.who
            self.kinds[process_key] = lane_kind
            self.lanes.append(failure.who)
        self.last_line_no = failure.line_no

    @property
    def exc_type(self) -> str:
        return self.first.exc_type

    @property
    def message(self) -> str:
        return self.first.message

    @property
    def innermost(self) -> Optional[Frame]:
        return self.first.innermost

    @property
    def line_no(self) -> int:
        return self.first.line_no

    @property
    def summary(self) -> str:
        return summary(self.first)

    @property
    def spread(self) -> int:
        """How many distinct processes printed it."""
        return max(1, len(self.process_keys))

    def lanes_label(self) -> str:
        names = compress_names(self.lanes)
        if self.spread > 1:
            noun = "ranks" if all(k == KIND_WORKER for k in self.kinds.values()) else "processes"
            return f"\u00d7{self.spread} {noun}: {names}"
        return names


class FailureGroups:
    """Bounded collection of groups; remembers how many failures did not fit."""

    def __init__(self, limit: int = 500) -> None:
        self.limit = limit
        self.groups: dict[tuple[object, ...], FailureGroup] = {}
        self.dropped = 0

    def add(self, failure: Failure, process_key: str, lane_kind: str) -> Optional[FailureGroup]:
        key = group_key(failure)
        group = self.groups.get(key)
        if group is None:
            if len(self.groups) >= self.limit:
                self.dropped += 1
                return None
            group = FailureGroup(key, failure)
            self.groups[key] = group
        group.add(failure, process_key, lane_kind)
        return group

    def __len__(self) -> int:
        return len(self.groups)


def _quotes(later: FailureGroup, earlier: FailureGroup) -> bool:
    """Does ``later``'s message repeat ``earlier``'s (a re-raise that carries the text along)?"""
    if set(later.process_keys) <= set(earlier.process_keys):
        return False
    quoted = earlier.message.strip().splitlines()[0].strip() if earlier.message.strip() else ""
    if len(quoted) < _MIN_QUOTE:
        return False
    return any(quoted in exc.message for exc in later.first.exceptions)


def rank(
    groups: list[FailureGroup],
    facts: Optional[Mapping[str, object]] = None,
    names: Optional[Callable[[str], Optional[str]]] = None,
) -> list[FailureGroup]:
    """Set each group's lanes, tier, flags and hint, and return the groups root cause first.

    ``names`` maps a process key to the name its lane shows now (a process may have printed under a less
    telling name when it failed); without it the printed names stay.
    """
    ordered = sorted(groups, key=lambda g: g.line_no)
    for group in ordered:
        lanes: list[str] = []
        for key in group.process_keys:
            name = (names(key) if names is not None else None) or group.printed[key]
            if name not in lanes:
                lanes.append(name)
        group.lanes = lanes
        group.tier = failure_tier(group.first)
    for i, group in enumerate(ordered):
        if group.tier >= TIER_PROPAGATED:
            continue
        for earlier in ordered[:i]:
            if earlier.tier <= TIER_SECONDARY and _quotes(group, earlier):
                group.tier = TIER_PROPAGATED
                break
    originals = [g for g in ordered if g.tier == TIER_ORIGINAL and g.first.kind != KIND_DEATH]
    explained: set[str] = set()
    for group in originals:
        explained.update(group.process_keys)
    # A crash dump written straight to the terminal (faulthandler, std::terminate) carries no lane prefix;
    # it may well be the named process's own last words.
    stray_dump = any(g.first.kind in (KIND_FATAL, KIND_ABORT) and g.first.lane == MAIN_LANE for g in originals)
    result = sorted(ordered, key=lambda g: (g.tier, g.line_no))
    for group in result:
        flags: set[str] = set()
        if group.first.kind == KIND_DEATH:
            # Silent: no traceback tells why that process ended (for a notice naming no process: none at all).
            named = getattr(group.first, "subject", None) is not None
            if named and not set(group.process_keys) & explained and not stray_dump:
                flags.add("silent")
            elif not named and not originals:
                flags.add("silent")
        elif group is result[0] and group.tier >= TIER_PROPAGATED:
            # The best there is, a re-raise, re-raises nothing in the log: that process died silently.
            flags.add("silent")
        group.flags = frozenset(flags)
        group.hint = classify(group.first, flags=group.flags, facts=facts)
    return result
