"""Grouping failures across lanes and putting the root cause first.

Identical failures (same type, same innermost frame) printed by several ranks, or printed twice by one, become
one :class:`FailureGroup`. Groups are ordered by *tier*, then by where they first appeared:

0. an original exception (nothing says it is a copy of another); a native failure (a fatal signal, a C++ abort,
   a CUDA check, a kill for memory) that no Python exception came before; an NCCL watchdog timeout, after every
   other original (a collective times out because some rank stopped taking part);
1. a secondary one: a process death notice, teardown noise (KeyboardInterrupt, BrokenPipeError, ...), "the actor
   died unexpectedly", a traceback cut short, an abort that follows a C++ exception, a native failure printed
   after a Python exception (``Fatal Python error`` at shutdown);
2. a re-raise of another process's failure ("WorkerProc initialization failed ... See stack trace for root
   cause", "Worker failed with error '...'"), a message that quotes an earlier failure of another lane, a C++
   abort or watchdog that reports a Python exception's error again;
3. the main process's last word ("Engine core initialization failed. See root cause above", EngineDeadError).

So a worker's own exception comes before the EngineCore's re-raise, which comes before the main process's.
A wrapper that quotes its cause (``Worker failed with error 'AssertionError: ...'``, torchrun's "Root Cause" block)
brings the quoted failure in as a group of its own when the log does not hold it. Each group says how sure the
decoder is (``confidence``, ``basis``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from eaglewatch.decode.deaths import SPAWN_SIGNALLED, signal_name
from eaglewatch.decode.events import (
    CERTAIN,
    GUESS,
    KIND_ABORT,
    KIND_CHECK,
    KIND_DEATH,
    KIND_FATAL,
    KIND_NATIVE,
    KIND_STACK,
    KIND_TRACEBACK,
    KIND_WATCHDOG,
    LIKELY,
    ExceptionRecord,
    Failure,
    Frame,
    ProcessDeath,
    TracebackEvent,
)
from eaglewatch.decode.exclass import class_from_message
from eaglewatch.decode.hints import Hint, classify
from eaglewatch.decode.lanes import KIND_WORKER, MAIN_LANE, compress_names
from eaglewatch.decode.stamps import time_key
from eaglewatch.decode.lineshapes import watchdog_key
from eaglewatch.decode.nativereports import BASIS_BANNER
from eaglewatch.decode.traceback import (
    BASIS_FAULTHANDLER,
    REASON_TAIL,
    WATCHDOG_TIMEOUT,
    bare_exception,
    is_watchdog_message,
)

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
_TOPLEVEL_TYPES = frozenset({"EngineDeadError", "EngineGenerateError", "AsyncEngineDeadError", "MQEngineDeadError",
                             "PreflightFailed"})
_PROPAGATED = re.compile(
    r"root cause|see (?:the )?(?:stack ?trace|traceback|logs? )?above|check the (?:stack ?trace|logs?)"
    r"|in a background process|Worker failed with error|WorkerProc (?:initialization|startup) failed"
    r"|failed core proc|exception in (?:a|the) (?:worker|child|background)|^\w*(?:Error|Exception): Executor failed"
    r"|RPC call to \w+ timed out",
    re.I,
)
_PROPAGATED_TYPES = frozenset({"ChildFailedError", "RayTaskError", "RayActorError", "ProcessRaisedException"})
# torch.multiprocessing.spawn's parent re-raises a child's failure with the child's traceback as its message:
# "ProcessRaisedException: \n\n-- Process 1 terminated with the following error:\nTraceback ...\nAssertionError".
_SPAWN_CHILD = "terminated with the following error:"
# Older PyTorch raised the same re-raise as a plain Exception, so its message, not its class, says what it is:
# "Exception: \n\n-- Process 0 terminated with the following error:\nTraceback ...".
_SPAWN_REPORT = re.compile(r"\s*-- Process \d+ " + _SPAWN_CHILD)
_SECONDARY_TYPES = frozenset(
    {"KeyboardInterrupt", "SystemExit", "BrokenPipeError", "ConnectionResetError", "ConnectionAbortedError",
     "EOFError", "CancelledError", "ContextTerminated", "GeneratorExit", "ActorDiedError",
     "ActorUnavailableError", "PreflightWarning"}
)
# An exception that only says another process died: a consequence whenever the log holds the cause.
_DEATH_REPORT = re.compile(
    r"died unexpectedly|(?:process|actor|worker) (?:is dead|has died)"
    # a collective that another rank's failure tore down
    r"|communicator was aborted|ProcessGroup\w* (?:is|was|has been) aborted|Connection (?:closed|reset) by peer"
    r"|^cancelled$",
    re.I,
)
_NATIVE_KINDS = frozenset({KIND_FATAL, KIND_ABORT, KIND_NATIVE, KIND_WATCHDOG})
_DIGITS = re.compile(r"\d+")
_MIN_QUOTE = 16

# "Worker failed with error 'AssertionError: auto_functionalized was not removed', please check ..."
_QUOTED = re.compile(
    r"(?P<q>['\"])(?P<type>(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)(?:" + REASON_TAIL
    + r")?(?:\([\w.]+\))?): "
    r"(?P<msg>.+?)(?P=q)(?=\s*(?:[,.;)]|$|please|see))",
    re.S,
)
# vLLM's wrapper quotes str(e), which has no class name: "Worker failed with error ''X' object has no attribute
# 'y'', please check the stack trace above for the root cause".
_QUOTED_BARE = re.compile(
    r"Worker failed with error (?P<q>['\"])(?P<msg>.+?)(?P=q)(?=\s*(?:[,.;)]|$|please|see))", re.S)
_TORCHRUN_ROOT = re.compile(r"Root Cause \(first observed failure\):(?P<block>.*)", re.S)
_TORCHRUN_FIELD = re.compile(r"^\s*(?P<key>rank|exitcode|traceback|host|time)\s*:\s*(?P<value>.*?)\s*$", re.M)
_SIGNAL_IN_TEXT = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG[A-Z]+)\)")


# Wordings that only one class prints: another class whose message is exactly such a str(e) re-raises it
# ("RuntimeError: No module named 'vllm_ascend.distributed'"), and the quoted class is the original.
_ONE_CLASS_WORDING = re.compile(r"(?P<mod>No module named ')|(?P<attr>'[\w.]+' object has no attribute ')")


def _reworded_class(exc: ExceptionRecord) -> Optional[str]:
    found = _ONE_CLASS_WORDING.match(exc.message)
    if found is None:
        return None
    name = "ModuleNotFoundError" if found.group("mod") else "AttributeError"
    return None if exc.short_type in (name, "ImportError") else name


def exception_tier(exc: ExceptionRecord) -> int:
    text = f"{exc.exc_type}: {exc.message}"
    if _reworded_class(exc) is not None:
        return TIER_PROPAGATED
    if exc.short_type in _TOPLEVEL_TYPES or _TOPLEVEL.search(text):
        return TIER_TOPLEVEL
    # torch.multiprocessing.spawn's report of a child ended by a signal re-reports that death (_quoted_failures)
    if (_PROPAGATED.search(text) or exc.short_type.split("(")[0] in _PROPAGATED_TYPES
            or _SPAWN_REPORT.match(exc.message) is not None or SPAWN_SIGNALLED.match(exc.message) is not None):
        return TIER_PROPAGATED
    if exc.short_type in _SECONDARY_TYPES or _DEATH_REPORT.search(exc.message[:300]):
        return TIER_SECONDARY
    return TIER_ORIGINAL


_CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"})


def _native(failure: Failure) -> bool:
    """A failure of native code: a dump, an abort, a CUDA check, a watchdog, a death by a crash signal."""
    return failure.kind in _NATIVE_KINDS or (failure.kind == KIND_DEATH and failure.signal in _CRASH_SIGNALS)


def failure_tier(failure: Failure) -> int:
    if failure.kind == KIND_STACK:
        return TIER_SECONDARY  # where a live process was: the root cause only when nothing failed
    if failure.kind == KIND_DEATH:
        # Killed for memory from outside, or crashed in native code: a cause, unless an exception came first.
        if getattr(failure, "oom", False) or failure.signal in _CRASH_SIGNALS:
            return TIER_ORIGINAL
        return TIER_SECONDARY
    if not failure.complete:
        return TIER_SECONDARY
    if failure.kind == KIND_FATAL and failure.signal == "SIGABRT":
        return TIER_SECONDARY
    # A chain that contains an original exception is an original failure, whatever wraps it.
    return min(exception_tier(exc) for exc in failure.exceptions)


def root_exception(failure: Failure) -> ExceptionRecord:
    """The exception of a chain an expert would name: the last original one, and of one raised while handling
    another ("During handling of the above exception ..."), the one being handled."""
    excs = failure.exceptions
    if len(excs) == 1:
        return excs[0]
    tiers = [exception_tier(exc) for exc in excs]
    idx = len(excs) - 1
    for i in range(len(excs) - 1, -1, -1):
        if tiers[i] == TIER_ORIGINAL and excs[i].exc_type:
            idx = i
            break
    while idx > 0 and excs[idx].link == "context" and tiers[idx - 1] == TIER_ORIGINAL:
        idx -= 1
    return excs[idx]


def group_key(failure: Failure) -> tuple[object, ...]:
    if failure.kind == KIND_DEATH:
        return (KIND_DEATH, failure.signal, _DIGITS.sub("#", failure.message))
    if failure.kind == KIND_WATCHDOG:
        work = watchdog_key(failure.message)
        if work is not None:
            return (KIND_WATCHDOG, *work)
    inner = failure.innermost
    if inner is not None:
        return (failure.kind, failure.exc_type, inner.file, inner.line, inner.function)
    return (failure.kind, failure.exc_type, _DIGITS.sub("#", failure.message[:300]))


def _summary_of(exc_type: str, message: str, inner: Optional[Frame], width: int) -> str:
    message = message.strip()
    exc_type = exc_type or "incomplete traceback"
    if message:
        text = f"{exc_type}: {' '.join(message.split())}"
    elif inner is not None and inner.source:
        text = f"{exc_type} at {inner.location()}: {inner.source}"
    elif inner is not None:
        text = f"{exc_type} at {inner.location()}"
    else:
        text = exc_type
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _innermost_of(failure: Failure, exc: ExceptionRecord) -> Optional[Frame]:
    return exc.innermost or failure.innermost


def summary(failure: Failure, width: int = 200) -> str:
    """One line: ``Type: message``; for an empty message, the failing source line and where it is."""
    exc = root_exception(failure)
    return _summary_of(exc.exc_type, exc.message, _innermost_of(failure, exc), width)


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
    # Shown before its report is complete (the exception line is in; a chained part may follow).
    provisional: bool = False
    # How sure the decoder is that this is what happened, and why (set by rank()).
    confidence: str = CERTAIN
    basis: str = ""
    # The failure was not printed on its own but quoted in this group's wrapper (set by rank()).
    quoted_in: Optional[str] = None
    # The first line where any copy of it appears (a lone exception line may come before its traceback).
    first_line: Optional[int] = None

    def add(self, failure: Failure, process_key: str, lane_kind: str) -> None:
        self.count += 1
        if process_key not in self.printed:
            self.process_keys.append(process_key)
            self.printed[process_key] = failure.who
            self.kinds[process_key] = lane_kind
            self.lanes.append(failure.who)
        self.last_line_no = failure.line_no

    @property
    def root(self) -> ExceptionRecord:
        """The exception this group is named after (see :func:`root_exception`)."""
        return root_exception(self.first)

    @property
    def exc_type(self) -> str:
        return self.root.exc_type

    @property
    def message(self) -> str:
        return self.root.message

    @property
    def innermost(self) -> Optional[Frame]:
        return _innermost_of(self.first, self.root)

    @property
    def line_no(self) -> int:
        return self.first.line_no if self.first_line is None else min(self.first_line, self.first.line_no)

    @property
    def summary(self) -> str:
        root = self.root
        return _summary_of(root.exc_type, root.message, _innermost_of(self.first, root), 200)

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


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0].strip() if text else ""


def _quotes(later: FailureGroup, earlier: FailureGroup) -> bool:
    """Does ``later``'s message repeat ``earlier``'s (a re-raise that carries the text along)?"""
    if set(later.process_keys) <= set(earlier.process_keys):
        return False
    quoted = _first_line(earlier.message)
    if len(quoted) < _MIN_QUOTE:
        return False
    return any(quoted in exc.message for exc in later.first.exceptions)


def _reports_again(native: FailureGroup, python: FailureGroup) -> bool:
    """Does a C++ abort, watchdog or native line carry a Python exception's error (same process or not)?"""
    quoted = _first_line(python.message)
    if len(quoted) < _MIN_QUOTE:
        return False
    text = native.message.replace("\n", " ")
    return quoted in text or (len(_first_line(native.message)) >= _MIN_QUOTE
                              and _first_line(native.message).split("] ")[-1] in python.message)


def _same_failure(frameless: FailureGroup, framed: FailureGroup) -> bool:
    if frameless.exc_type != framed.exc_type:
        return False
    a, b = _first_line(frameless.message), _first_line(framed.message)
    if a == b:
        return True
    return len(a) >= _MIN_QUOTE and len(b) >= _MIN_QUOTE and (a.startswith(b) or b.startswith(a))


def _logged_before(frameless: FailureGroup, framed: FailureGroup) -> bool:
    """``logger.exception(repr(e))``: the repr of the exception a handler caught, and the traceback the record
    goes on to print, whose last exception is the one that was caught or its cause. The traceback names the
    line as the message it was logged with."""
    context = framed.first.context
    # Only a traceback that reached its exception line says more than the repr does.
    return (context is not None and framed.first.complete and context == frameless.first.text.strip()
            and 0 < framed.line_no - frameless.line_no <= 2
            and bool(set(frameless.process_keys) & set(framed.process_keys)))


def _fold(base: FailureGroup, group: FailureGroup) -> FailureGroup:
    return dataclasses.replace(
        base, count=base.count + group.count,
        process_keys=base.process_keys + [k for k in group.process_keys if k not in base.printed],
        printed={**group.printed, **base.printed}, kinds={**group.kinds, **base.kinds},
        first_line=min(base.line_no, group.line_no),
    )


def _merge_lone_lines(groups: list[FailureGroup]) -> list[FailureGroup]:
    """One process logging the same exception twice without frames (its repr, then ``Type: message``) is one
    failure: the copy with the longer message stays."""
    out: list[FailureGroup] = []
    for group in groups:
        first = group.first
        lone = first.kind == KIND_TRACEBACK and group.innermost is None and first.complete
        twin = next((i for i, kept in enumerate(out) if lone and kept.first.kind == KIND_TRACEBACK
                     and kept.innermost is None and kept.first.complete
                     and set(kept.process_keys) & set(group.process_keys) and _same_failure(kept, group)), None)
        if twin is None:
            out.append(group)
            continue
        kept = out[twin]
        longer, shorter = (group, kept) if len(group.message) > len(kept.message) else (kept, group)
        out[twin] = _fold(longer, shorter)
    return out


def _merge_copies(groups: list[FailureGroup]) -> list[FailureGroup]:
    """A lone exception line and the traceback that ends in the same exception are one failure."""
    groups = _merge_lone_lines(groups)
    framed = [g for g in groups if g.first.kind == KIND_TRACEBACK and g.innermost is not None]
    out: list[FailureGroup] = []
    merged: dict[int, FailureGroup] = {}
    for group in groups:
        first = group.first
        if first.kind != KIND_TRACEBACK or group.innermost is not None or not first.complete:
            out.append(group)
            continue
        target = next((g for g in framed if _same_failure(group, g) or _logged_before(group, g)), None)
        if target is None:
            out.append(group)
            continue
        merged[id(target)] = _fold(merged.get(id(target), target), group)
    return [merged.get(id(g), g) for g in out]


def _quoted_record(message: str, exc: Optional[ExceptionRecord] = None) -> Optional[ExceptionRecord]:
    reworded = _reworded_class(exc) if exc is not None else None
    if reworded is not None:
        return ExceptionRecord(reworded, message)
    if _SPAWN_CHILD in message:
        for line in reversed(message.split(_SPAWN_CHILD, 1)[1].splitlines()):
            child = bare_exception(line.strip())
            if child is not None and child[3] == 0:
                return ExceptionRecord(child[0], child[1])
    found = _QUOTED.search(message)
    if found is not None:
        return ExceptionRecord(found.group("type"), found.group("msg").strip())
    bare = _QUOTED_BARE.search(message)
    if bare is not None:
        quoted = bare.group("msg").strip()
        name = class_from_message(quoted)
        if name is not None:
            return ExceptionRecord(name, quoted)
    return None


def _quoted_failures(group: FailureGroup) -> list[tuple[Failure, str]]:
    """Failures a wrapper's message quotes: ``Worker failed with error 'AssertionError: ...'``, torchrun's
    "Root Cause (first observed failure)" block, torch.multiprocessing.spawn's child ended by a signal."""
    out: list[tuple[Failure, str]] = []
    first = group.first
    wrapper = group.root.short_type or group.exc_type
    for exc in first.exceptions:
        message = exc.message
        record = _quoted_record(message, exc) if ("'" in message or '"' in message or _SPAWN_CHILD in message) else None
        if record is not None:
            event = TracebackEvent(
                lane=first.lane, kind=KIND_TRACEBACK, exceptions=(record,), line_no=first.line_no,
                level=first.level, time=first.time, source=first.source, origin=first.origin,
                context=f"quoted by {exc.exc_type}", text=first.text, pid=getattr(first, "pid", None),
                confidence=LIKELY, basis=f"quoted in the message of {exc.short_type}",
            )
            out.append((event, wrapper))
        root = _TORCHRUN_ROOT.search(message) if "Root Cause" in message else None
        if root is not None:
            fields = {m.group("key"): m.group("value") for m in _TORCHRUN_FIELD.finditer(root.group("block"))}
            code = fields.get("exitcode", "")
            traceback = fields.get("traceback", "")
            signal = None
            found_signal = _SIGNAL_IN_TEXT.search(traceback)
            if found_signal:
                signal = found_signal.group("name")
            else:
                number = re.match(r"-(\d+)", code)
                if number:
                    signal = signal_name(number.group(1))
            rank = fields.get("rank", "").split(" ")[0]
            subject = f"rank{rank}" if rank.isdigit() else None
            if found_signal:
                text = f"{traceback} (rank {fields.get('rank', '?')}, exitcode {code})"
            else:
                text = f"rank {fields.get('rank', '?')} failed: exitcode {code or '?'}"
            death = ProcessDeath(lane=first.lane, subject=subject, signal=signal, text=text,
                                 line_no=first.line_no, level=first.level, time=first.time, source=first.source,
                                 pid=getattr(first, "pid", None))
            out.append((death, wrapper))
        # "ProcessExitedException: process 0 terminated with signal SIGKILL": that child's death, by that signal
        spawned = SPAWN_SIGNALLED.match(message)
        if spawned is not None:
            death = ProcessDeath(lane=first.lane, subject=f"process {spawned.group('index')}",
                                 signal=spawned.group("name"), text=message.strip(), line_no=first.line_no,
                                 level=first.level, time=first.time, source=first.source,
                                 pid=getattr(first, "pid", None))
            out.append((death, wrapper))
    return out


def _known(groups: list[FailureGroup], failure: Failure) -> bool:
    """Is the quoted failure in the log already (printed by the process it happened in)?"""
    if failure.kind == KIND_DEATH:
        signal = failure.signal
        return any(g.first.kind == KIND_DEATH and g.first.signal == signal and signal is not None for g in groups)
    head = _first_line(failure.message)[:60]
    short = root_exception(failure).short_type
    for group in groups:
        if group.root.short_type == short and (not head or head in group.message):
            return True
    return False


def _confidence(group: FailureGroup) -> tuple[str, str]:
    first = group.first
    confidence = getattr(first, "confidence", CERTAIN)
    basis = getattr(first, "basis", "") or ""
    if first.kind == KIND_DEATH and first.signal is None:
        confidence = LIKELY
    return confidence, basis


def _came_before(first: FailureGroup, second: FailureGroup) -> bool:
    """Whether ``first`` happened before ``second``: by their times when both lines carry one (processes print
    through their own buffers, out of order), else by where they are in the log."""
    one, two = time_key(getattr(first.first, "time", None)), time_key(getattr(second.first, "time", None))
    if one is not None and two is not None and one != two:
        return one < two
    return first.line_no < second.line_no


def _in_time_order(groups: list[FailureGroup], later_rank: Mapping[int, int]) -> list[FailureGroup]:
    """Within a tier, failures whose lines all carry their times in order of those times: processes print
    through their own buffers, and the consequence can reach the log before its cause (a peer's glog ``Check
    failed`` stamped earlier than the worker's death it caused). Where any of them has no time, the log's order
    stands."""
    out: list[FailureGroup] = []
    start = 0
    while start < len(groups):
        end = start
        band = (groups[start].tier, later_rank.get(id(groups[start]), 0))
        while end < len(groups) and (groups[end].tier, later_rank.get(id(groups[end]), 0)) == band:
            end += 1
        members = groups[start:end]
        keys = [time_key(getattr(g.first, "time", None)) for g in members]
        if len(members) > 1 and all(key is not None for key in keys):
            order = sorted(range(len(members)), key=lambda i: (keys[i], members[i].line_no))
            members = [members[i] for i in order]
        out.extend(members)
        start = end
    return out


def rank(
    groups: list[FailureGroup],
    facts: Optional[Mapping[str, object]] = None,
    names: Optional[Callable[[str], Optional[str]]] = None,
) -> list[FailureGroup]:
    """Set each group's lanes, tier, flags, confidence and hint, and return the groups root cause first.

    ``names`` maps a process key to the name its lane shows now (a process may have printed under a less
    telling name when it failed); without it the printed names stay. Groups for failures quoted by wrappers are
    added to the result (they are not kept in the state).
    """
    groups = _merge_copies(groups)
    for group in groups:
        group.tier = failure_tier(group.first)
    derived: list[FailureGroup] = []
    any_original = any(g.tier == TIER_ORIGINAL for g in groups)
    for group in groups:
        if group.tier < TIER_PROPAGATED:
            continue
        for failure, wrapper in _quoted_failures(group):
            if _known(groups, failure) or _known(derived, failure):
                continue
            if failure.kind == KIND_DEATH and failure.signal is None and any_original:
                continue  # "exitcode: 1": the rank's own exception is in the log
            quoted = FailureGroup(("quoted", *group.key), failure, quoted_in=wrapper,
                                  provisional=group.provisional)
            for key in group.process_keys:
                quoted.add(failure, key, group.kinds[key])
                quoted.printed[key] = group.printed[key]
            quoted.tier = failure_tier(failure)
            derived.append(quoted)
    groups = groups + derived

    ordered = sorted(groups, key=lambda g: g.line_no)
    for group in ordered:
        lanes: list[str] = []
        for key in group.process_keys:
            name = (names(key) if names is not None else None) or group.printed[key]
            if name not in lanes:
                lanes.append(name)
        group.lanes = lanes
    for i, group in enumerate(ordered):
        if group.tier >= TIER_PROPAGATED:
            continue
        for earlier in ordered[:i]:
            if earlier.tier <= TIER_SECONDARY and _quotes(group, earlier):
                group.tier = TIER_PROPAGATED
                break
    pythons = [g for g in ordered if g.tier == TIER_ORIGINAL and g.first.kind == KIND_TRACEBACK]
    later_rank: dict[int, int] = {}
    for group in ordered:
        kind = group.first.kind
        if group.tier != TIER_ORIGINAL:
            continue
        watchdog = kind == KIND_WATCHDOG or WATCHDOG_TIMEOUT in group.message or is_watchdog_message(
            group.message)
        native = _native(group.first)
        if native or watchdog:
            others = [p for p in pythons if p is not group and not is_watchdog_message(p.message)]
            if native and kind != KIND_DEATH and any(_reports_again(group, p) for p in others):
                group.tier = TIER_PROPAGATED  # the abort or watchdog of the process that raised it
                continue
            if native and kind != KIND_WATCHDOG and any(_came_before(p, group) for p in others):
                group.tier = TIER_SECONDARY  # after the exception: the process going down
                continue
            if watchdog:
                later_rank[id(group)] = 1  # the timeout of a collective some rank stopped taking part in
    # A fatal-signal banner (abseil's, Ray's "*** SIGSEGV received ***") and faulthandler's dump of the same signal
    # report one crash. The dump comes first when it holds the Python stack where it happened; a dump cut to its
    # first line says less than the banner, whose "PC: @ ..." names the native function.
    def fatal(group: FailureGroup, basis: str) -> Optional[str]:
        first = group.first
        return getattr(first, "signal", None) if first.kind == KIND_FATAL and getattr(first, "basis", None) == basis \
            else None

    dumps = [g for g in ordered if g.tier == TIER_ORIGINAL and fatal(g, BASIS_FAULTHANDLER) is not None]
    with_stack = {fatal(g, BASIS_FAULTHANDLER) for g in dumps if g.first.innermost is not None}
    banners = {fatal(g, BASIS_BANNER) for g in ordered if g.tier == TIER_ORIGINAL} - {None}
    for group in ordered:
        signal = fatal(group, BASIS_BANNER)
        if signal is not None and signal in with_stack:
            later_rank[id(group)] = 1
    for group in dumps:
        signal = fatal(group, BASIS_FAULTHANDLER)
        if signal in banners and signal not in with_stack:
            later_rank[id(group)] = 1
    originals = [g for g in ordered if g.tier == TIER_ORIGINAL and g.first.kind != KIND_DEATH]
    explained: set[str] = set()
    for group in originals:
        explained.update(group.process_keys)
    # A crash dump written straight to the terminal (faulthandler, std::terminate) carries no lane prefix;
    # it may well be the named process's own last words.
    stray_dump = any(g.first.kind in (KIND_FATAL, KIND_ABORT) and g.first.lane == MAIN_LANE for g in originals)
    result = sorted(ordered, key=lambda g: (g.tier, later_rank.get(id(g), 0), g.line_no))
    result = _in_time_order(result, later_rank)
    for group in result:
        flags: set[str] = set()
        if group.first.kind == KIND_DEATH:
            # Silent: no traceback tells why that process ended (for a notice naming no process: none at all).
            named = getattr(group.first, "subject", None) is not None
            if named and not set(group.process_keys) & explained and not stray_dump:
                flags.add("silent")
            elif not named and not originals:
                flags.add("silent")
        elif group is result[0] and group.tier >= TIER_PROPAGATED and group.first.kind != KIND_CHECK:
            # The best there is, a re-raise, re-raises nothing in the log: that process died silently.
            flags.add("silent")
        group.flags = frozenset(flags)
        group.confidence, group.basis = _confidence(group)
        if group is result[0] and group.tier >= TIER_PROPAGATED and group.first.kind != KIND_CHECK:
            group.confidence = GUESS
            group.basis = f"{group.basis}; only a re-raise is in the log" if group.basis else "only a re-raise"
        group.hint = classify(group.first, flags=group.flags, facts=facts)
    return result
