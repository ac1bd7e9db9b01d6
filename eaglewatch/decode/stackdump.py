"""Stack dumps of live processes: where each thread is, with no exception at all.

A hung job is looked at with ``py-spy dump`` or ``faulthandler`` (``dump_traceback``, a watchdog's
``dump_traceback_later``, ``kill -USR1`` with ``faulthandler.register``). Neither prints an exception; what the
dump says is where each thread is stuck, and that is the news::

    Thread 0x00007f5a (most recent call first):            Thread 4085279 (idle): "MainThread"
      File "/x/torch/distributed/distributed_c10d.py",          poll (zmq/sugar/poll.py:106)
           line 2050 in all_reduce                              dequeue (vllm/.../shm_broadcast.py:794)

Both print the innermost call first. A dump becomes one failure of kind ``stack`` (type ``Stack dump``): its
message names the thread that matters (faulthandler's current thread, else ``MainThread``, else the first) and
the frame it is stuck in, past the waiting primitives (a poll, a lock, a queue) to the first frame that says what
it waits for. It ranks after every failure with an exception or a signal: in a log that also holds a crash, the
crash is the root cause, and the dump says where the others were.

A faulthandler dump that follows ``Fatal Python error:`` is that error's, and ``traceback.py`` reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from eaglewatch.decode.events import KIND_STACK, LIKELY, ExceptionRecord, Frame, TracebackEvent
from eaglewatch.decode.frames import frame_kind

STACK_DUMP = "Stack dump"
BASIS_STACK_DUMP = "stack dump of a live process (no exception)"
MAX_FRAMES = 200

_FH_HEAD = re.compile(r"^(?P<cur>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])? "
                      r"\(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>[^\s,]+)\s*$')
_SPY_HEAD = re.compile(r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<state>[^()]*)\)(?:: "(?P<name>[^"]*)")?\s*$')
_SPY_FRAME = re.compile(r"^\s{2,}(?P<func>[^\s()]+) \((?P<file><[^<>]*>|[^()\s]+):(?P<line>\d+)\)\s*$")
_SPY_PREAMBLE = re.compile(r"^(?:Process \d+: .*|Python v\d+\.\d+\S* \(.*\))\s*$")
# Where a thread sits while it waits: its innermost frames say that it waits, not for what.
_WAITING = re.compile(r"(?:^|/)(?:zmq/sugar/\w+\.py|selectors\.py|threading\.py|queue\.py|socket\.py|ssl\.py"
                      r"|subprocess\.py|multiprocessing/(?:connection|synchronize|queues|popen_\w+)\.py"
                      r"|asyncio/\w+\.py|concurrent/futures/_base\.py|time\.py)$")

# Public names of the dump shapes above, for the readers of whole dumps (``stackgroups``).
FH_HEAD, FH_FRAME, SPY_HEAD, SPY_FRAME, SPY_PREAMBLE, WAITING = (
    _FH_HEAD, _FH_FRAME, _SPY_HEAD, _SPY_FRAME, _SPY_PREAMBLE, _WAITING)


def is_waiting(file: str) -> bool:
    """Whether a frame in ``file`` is a waiting primitive (a poll, a lock, a queue): it says that a thread waits,
    not for what."""
    return _WAITING.search(file.replace("\\", "/")) is not None


FIRST_CHARS = frozenset("TCP ")  # what a dump's lines begin with: a line that begins otherwise is no dump's


def may_start(msg: str) -> bool:
    """Cheap test: could this line begin a dump (a thread's head, a frame in a dump's form, py-spy's preamble)?"""
    head = msg[:1]
    if head == "T" or head == "C" or head == "P":
        return (_FH_HEAD.match(msg) or _SPY_HEAD.match(msg) or _SPY_PREAMBLE.match(msg)) is not None
    return head == " " and '", line ' in msg and ", in " not in msg and _FH_FRAME.match(msg) is not None


@dataclass
class _Thread:
    name: str
    current: bool = False
    frames: list[Frame] = field(default_factory=list)  # innermost first, as printed


class StackDumpReader:
    """One lane's dump being read: fed lines while :attr:`active`; a line that is no part of a dump ends it."""

    def __init__(self, lane: str, pid: Optional[int]) -> None:
        self.lane = lane
        self.pid = pid
        self.active = False
        self._reset(0)

    def _reset(self, line_no: int) -> None:
        self.threads: list[_Thread] = []
        self.text: list[str] = []
        self.line_no = line_no
        self.preamble_only = True

    def feed(self, msg: str, line_no: int) -> tuple[bool, list[TracebackEvent]]:
        """(whether the line was part of a dump, the dumps it ended)."""
        done: list[TracebackEvent] = []
        if not self.active:
            if not may_start(msg):
                return False, done
            self.active = True
            self._reset(line_no)
        if self._take(msg):
            self.text.append(msg)
            return True, done
        done.extend(self.flush())
        if may_start(msg):  # the next dump right after this one
            return self.feed(msg, line_no)
        return False, done

    def _take(self, msg: str) -> bool:
        if not msg.strip():
            return True  # py-spy leaves a blank line between threads
        found = _FH_FRAME.match(msg) or _SPY_FRAME.match(msg)
        if found is not None:
            if not self.threads:
                self.threads.append(_Thread("thread"))
            frames = self.threads[-1].frames
            if len(frames) < MAX_FRAMES:
                file = found.group("file")
                frames.append(Frame(file, int(found.group("line")), found.group("func"), None, frame_kind(file)))
            self.preamble_only = False
            return True
        head = _FH_HEAD.match(msg)
        if head is not None:
            self.threads.append(_Thread(head.group("name") or head.group("tid"), head.group("cur") == "Current thread"))
            self.preamble_only = False
            return True
        spy = _SPY_HEAD.match(msg)
        if spy is not None:
            state = spy.group("state")
            self.threads.append(_Thread(spy.group("name") or spy.group("tid"), "active" in state))
            self.preamble_only = False
            return True
        return _SPY_PREAMBLE.match(msg) is not None

    def flush(self) -> list[TracebackEvent]:
        """End the dump being read: one failure, when it held a frame."""
        if not self.active:
            return []
        self.active = False
        threads = [t for t in self.threads if t.frames]
        if self.preamble_only or not threads:
            return []
        main = (next((t for t in threads if t.current), None) or next((t for t in threads if t.name == "MainThread"),
                                                                      None) or threads[0])
        summary = _where(main)
        if len(threads) > 1:
            summary = f"{summary} ({len(threads)} threads dumped)"
        return [TracebackEvent(
            lane=self.lane, kind=KIND_STACK,
            # Frames as a traceback holds them, the innermost last, so that "at" names where it is stuck.
            exceptions=(ExceptionRecord(STACK_DUMP, summary, tuple(reversed(main.frames))),),
            line_no=self.line_no, text="\n".join(self.text).strip("\n"), pid=self.pid, confidence=LIKELY,
            basis=BASIS_STACK_DUMP,
        )]


def _where(thread: _Thread) -> str:
    """``MainThread stuck in all_reduce (distributed_c10d.py:2050)``; past a wait: ``... waiting in poll
    (zmq/sugar/poll.py:106) under dequeue (shm_broadcast.py:794)``."""
    frames = thread.frames
    inner = frames[0]
    named = f"{thread.name} " if thread.name != "thread" else ""
    if not is_waiting(inner.file):
        return f"{named}stuck in {_frame_text(inner)}"
    cause = next((f for f in frames if not is_waiting(f.file)), None)
    if cause is None:
        return f"{named}waiting in {_frame_text(inner)}"
    return f"{named}waiting in {_frame_text(inner)} under {_frame_text(cause)}"


def _frame_text(frame: Frame) -> str:
    return f"{frame.function} ({frame.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{frame.line})"
