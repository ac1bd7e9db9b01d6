"""What the decoder produces: plain dataclasses, no behaviour beyond a few derived properties.

Events carry no wall-clock time, so that decoding the same bytes always gives equal events whatever the
chunking; the *state* stamps arrival times with the decoder's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

# Frame kinds: where the code of a frame lives.
FRAME_USER = "user"  # the operator's own scripts and packages
FRAME_LIBRARY = "library"  # site-packages / dist-packages
FRAME_STDLIB = "stdlib"  # the Python standard library
FRAME_INTERNAL = "internal"  # <frozen ...>, <string>, C++ frames without a path


@dataclass(slots=True)
class LineEvent:
    """One line of text in one lane, with the logger header (if any) split off."""

    lane: str
    level: Optional[str]  # DEBUG/INFO/WARNING/ERROR/CRITICAL, or None for an unheaded line
    time: Optional[str]  # the logger's timestamp text, as printed
    source: Optional[str]  # the logger's "file.py:123"
    text: str  # the message, header and lane prefix removed


@dataclass(slots=True)
class BarUpdate:
    """The state of one tqdm bar after a rewrite (or after a line that printed it)."""

    lane: str
    desc: str
    n: float
    total: Optional[float]
    percent: Optional[int]
    elapsed_s: Optional[float]
    remaining_s: Optional[float]  # the bar's own estimate, None when it prints "?"
    rate: Optional[float]  # the number as printed, None when it prints "?"
    rate_unit: Optional[str]  # as printed: "it/s", "s/it", "toks/s", "MB/s", ...
    postfix: Optional[str]
    unit: str = "it"

    @property
    def per_second(self) -> Optional[float]:
        """Items per second, whichever way round the bar printed its rate."""
        if self.rate is None or self.rate_unit is None:
            return None
        if self.rate_unit.startswith("s/"):
            return 1.0 / self.rate if self.rate > 0 else None
        return self.rate

    @property
    def done(self) -> bool:
        return self.total is not None and self.total > 0 and self.n >= self.total

    @property
    def eta_s(self) -> Optional[float]:
        """Seconds left, from n, total and the rate; from the average pace when the rate is unknown."""
        if self.total is None:
            return None
        left = self.total - self.n
        if left <= 0:
            return 0.0
        speed = self.per_second
        if speed:
            return left / speed
        if self.n > 0 and self.elapsed_s:
            return self.elapsed_s * left / self.n
        return None


@dataclass(frozen=True, slots=True)
class Frame:
    file: str
    line: Optional[int]
    function: Optional[str]
    source: Optional[str] = None
    kind: str = FRAME_USER

    @property
    def is_user(self) -> bool:
        return self.kind == FRAME_USER

    @property
    def short_file(self) -> str:
        return self.file.rsplit("/", 1)[-1]

    def location(self) -> str:
        where = self.short_file if self.line is None else f"{self.short_file}:{self.line}"
        return f"{where} in {self.function}" if self.function else where


@dataclass(frozen=True, slots=True)
class ExceptionRecord:
    """One exception of a (possibly chained) traceback."""

    exc_type: str  # as printed, e.g. "torch.OutOfMemoryError"
    message: str
    frames: tuple[Frame, ...] = ()
    sub_exceptions: tuple["ExceptionRecord", ...] = ()  # leaves of an ExceptionGroup
    link: Optional[str] = None  # how it follows the previous one: "cause" or "context"

    @property
    def short_type(self) -> str:
        """``torch.OutOfMemoryError`` -> ``OutOfMemoryError``; ``RayTaskError(ValueError)`` -> ``RayTaskError``;
        ``tensorrt_llm::common::TllmException`` -> ``TllmException``."""
        name = self.exc_type.split("(", 1)[0].rsplit(".", 1)[-1]
        return name.rsplit("::", 1)[-1] if "::" in name else name

    @property
    def innermost(self) -> Optional[Frame]:
        return self.frames[-1] if self.frames else None


KIND_TRACEBACK = "traceback"  # a Python traceback
KIND_FATAL = "fatal"  # a faulthandler dump ("Fatal Python error: Segmentation fault")
KIND_ABORT = "abort"  # a C++ exception that ended in std::terminate
KIND_DEATH = "death"  # a line saying a process died or was killed, with no traceback of its own
KIND_WATCHDOG = "watchdog"  # an NCCL watchdog's collective timeout (a log line, or the C++ abort that carries it)
KIND_NATIVE = "native"  # a fatal line from native code with no Python exception ("CUDA Error: ... at x.cpp:56")
KIND_CHECK = "check"  # eaglewatch's own preflight reporting a failed check
KIND_STACK = "stack"  # a stack dump of a live process (py-spy, faulthandler): where it is stuck, no exception

# How sure the decoder is of a failure it reports (see docs/decode.md, "Confidence").
CERTAIN = "certain"  # a whole report: a complete traceback, a faulthandler dump, a C++ abort, a death notice
LIKELY = "likely"  # read from part of a report: a fragment, a lone exception line, a quote inside a wrapper
GUESS = "guess"  # what is left when the report itself is missing: a cut-off traceback, a bare re-raise


@dataclass(frozen=True, slots=True)
class TracebackEvent:
    """A traceback (or a fatal-error dump) assembled from one lane's lines."""

    lane: str
    kind: str
    exceptions: tuple[ExceptionRecord, ...]  # the chain as printed: the first cause first, the raised one last
    line_no: int  # index of the physical line where it began
    level: Optional[str] = None  # the logger level when it was logged with a header
    # The logger's timestamp on its lines; for a traceback printed without a header, the last logger
    # timestamp seen before it in the stream (the closest the log says about when it happened).
    time: Optional[str] = None
    source: Optional[str] = None
    origin: Optional[str] = None  # the process or thread named just before it ("Process EngineCore:")
    context: Optional[str] = None  # the log message that introduced it ("WorkerProc failed to start.")
    text: str = ""
    survived: bool = False  # logged at WARNING or below, or "Exception ignored in": a warning
    complete: bool = True  # False when the lane moved on before the exception line
    signal: Optional[str] = None
    pid: Optional[int] = None
    # How it was read: ``confidence`` is CERTAIN, LIKELY or GUESS, ``basis`` says why in a few words
    # ("complete traceback", "from a fragment (no Traceback header)", "exception line without traceback header").
    confidence: str = CERTAIN
    basis: str = "complete traceback"
    # True while the report may still grow: the exception line is in, but a chained part, more message lines
    # or the rest of a dump may follow. The final event (provisional False) replaces it.
    provisional: bool = False

    @property
    def final(self) -> ExceptionRecord:
        return self.exceptions[-1]

    @property
    def exc_type(self) -> str:
        return self.final.exc_type

    @property
    def message(self) -> str:
        return self.final.message

    @property
    def frames(self) -> tuple[Frame, ...]:
        return self.final.frames

    @property
    def innermost(self) -> Optional[Frame]:
        for exc in reversed(self.exceptions):
            if exc.frames:
                return exc.frames[-1]
        return None

    @property
    def who(self) -> str:
        """The lane name to show: the process named before it when there was one."""
        return self.origin or self.lane


@dataclass(frozen=True, slots=True)
class ProcessDeath:
    """A process that died (signal, OOM killer, "died unexpectedly") as told by a log line."""

    lane: str  # the lane that printed the notice
    subject: Optional[str]  # the process the notice is about, when it names one
    signal: Optional[str]  # "SIGKILL", ...
    text: str
    line_no: int
    level: Optional[str] = None
    time: Optional[str] = None
    source: Optional[str] = None
    pid: Optional[int] = None
    kind: str = field(default=KIND_DEATH, init=False)
    survived: bool = field(default=False, init=False)
    complete: bool = field(default=True, init=False)
    origin: Optional[str] = field(default=None, init=False)
    context: Optional[str] = field(default=None, init=False)
    oom: bool = False  # killed for memory: the OOM killer, a cgroup limit, Ray's memory monitor
    confidence: str = field(default=CERTAIN, init=False)
    basis: str = field(default="death notice", init=False)
    provisional: bool = field(default=False, init=False)

    @property
    def exc_type(self) -> str:
        return "ProcessDied"

    @property
    def message(self) -> str:
        return self.text

    @property
    def exceptions(self) -> tuple[ExceptionRecord, ...]:
        return (ExceptionRecord("ProcessDied", self.text),)

    @property
    def frames(self) -> tuple[Frame, ...]:
        return ()

    @property
    def innermost(self) -> Optional[Frame]:
        return None

    @property
    def who(self) -> str:
        return self.subject or self.lane


@dataclass(frozen=True, slots=True)
class ProvisionalFailure:
    """A failure shown at once: the exception line of ``failure`` has arrived, the rest may follow.

    ``failure`` is a :class:`TracebackEvent` with ``provisional=True``. The decoder emits one when the exception
    line arrives and another each time the report grows into a new part (a chained exception); the final
    :class:`TracebackEvent` of the same lane and ``line_no`` replaces it. The state shows the latest in
    ``failures_ranked()`` (``FailureGroup.provisional``) until then.
    """

    lane: str
    failure: TracebackEvent

    @property
    def line_no(self) -> int:
        return self.failure.line_no


Failure = Union[TracebackEvent, ProcessDeath]
Event = Union[LineEvent, BarUpdate, TracebackEvent, ProcessDeath, ProvisionalFailure]
