"""Assembling tracebacks from one lane's lines.

One :class:`TracebackAssembler` per lane receives that lane's messages (logger header already split off)
and returns finished :class:`TracebackEvent` objects. It understands

* plain and chained Python tracebacks ("The above exception was the direct cause...", "During handling..."),
  with multi-line messages, ``[Previous line repeated N more times]`` and 3.11+ caret lines;
* ``ExceptionGroup`` tracebacks drawn with ``+`` and ``|``;
* tracebacks written through a logger, where every line carries the same header;
* ``faulthandler`` dumps ("Fatal Python error: Segmentation fault" with thread stacks);
* C++ exceptions that end in ``std::terminate`` ("terminate called after throwing an instance of ...").

Lines of other lanes never reach an assembler, so interleaving between processes does not matter. Unrelated
lines inside the same lane (another thread, or another process writing without a prefix) are skipped while
the frames are being read.
"""

from __future__ import annotations

import re
import textwrap
from typing import Optional

from eaglewatch.decode.events import (
    KIND_ABORT,
    KIND_FATAL,
    KIND_TRACEBACK,
    ExceptionRecord,
    Frame,
    TracebackEvent,
)
from eaglewatch.decode.frames import frame_kind

TB_START = "Traceback (most recent call last):"
EG_MARK = "Exception Group Traceback (most recent call last):"
CAUSE = "The above exception was the direct cause of the following exception:"
CONTEXT = "During handling of the above exception, another exception occurred:"
FATAL_START = "Fatal Python error: "
ABORT_START = "terminate called "

# A line that may begin a traceback-like block (checked with str.startswith before anything else).
TRIGGERS = (TB_START, FATAL_START, ABORT_START, "  + " + EG_MARK, "+ " + EG_MARK, EG_MARK, "Current thread 0x")

_FILE = re.compile(r'\s*File "(?P<file>[^"]*)", line (?P<line>\d+|\?+)(?:,? in (?P<func>.*?))?\s*$')
_EXC = re.compile(r"(?P<type>[A-Za-z_][\w.]*(?:\([\w.]+\))?)(?:(?P<colon>:)(?: ?(?P<msg>.*))?)?$")
_REPEATED = re.compile(r"\s*\[Previous line repeated \d+ more times?\]")
_PROCESS = re.compile(r"Process (?P<name>[^\s:]+):\s*$")
_THREAD_HEAD = re.compile(r"(?:Current thread|Thread) 0x[0-9a-fA-F]+.*\(most recent call first\):\s*$")
_ABORT_TYPE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
_RAISED_FROM = re.compile(
    r"Exception raised from (?P<func>.+?) at (?P<file>[^\s:]+):(?P<line>\d+) \(most recent call first\)"
)
_SUB_SEP = re.compile(r"\+?-*\+?-+ (?:\d+|\.\.\.) -+$")

_NOT_TYPES = frozenset({"Note", "Warning", "Hint", "Usage", "See", "Error", "Info", "Debug", "Tip"})
_SURVIVABLE_LEVELS = frozenset({"WARNING", "INFO", "DEBUG"})

MAX_TEXT_LINES = 400
MAX_FRAMES = 200
MAX_MESSAGE_LINES = 60
MAX_FOREIGN = 200

# States
_IDLE, _FRAMES, _AFTER_EXC, _CHAIN, _GROUP, _FATAL, _ABORT = range(7)


def starts_block(msg: str) -> bool:
    """Could this line begin a traceback, an exception group, a faulthandler dump or a C++ abort?"""
    if msg.startswith(TRIGGERS):
        return True
    if msg[:1] == " ":
        head = msg.lstrip()
        if head.startswith('File "') and ", in " not in head:
            return True  # a SyntaxError in the main script: no "Traceback" line, the frame has no function
        return head.startswith(TB_START) or (EG_MARK in head[:40] and head.lstrip("+ ").startswith(EG_MARK))
    return False


def exception_line(text: str) -> Optional[tuple[str, str, bool]]:
    """``"ValueError: bad"`` -> ``("ValueError", "bad", True)``; None when the line is not an exception line."""
    if not text or text[0] in " \t":
        return None
    found = _EXC.match(text)
    if not found:
        return None
    exc_type = found.group("type")
    short = exc_type.split("(")[0].rsplit(".", 1)[-1].lstrip("_")
    if not short or not short[0].isupper() or (short.isupper() and len(short) > 1) or short in _NOT_TYPES:
        return None
    return exc_type, found.group("msg") or "", bool(found.group("colon"))


def _frame_from(found: re.Match[str]) -> Frame:
    file = found.group("file")
    line = found.group("line")
    return Frame(file, int(line) if line.isdigit() else None, found.group("func"), None, frame_kind(file))


def _is_caret(stripped: str) -> bool:
    return bool(stripped) and not stripped.strip("^~ ")


class _Exc:
    """The exception being read."""

    __slots__ = ("frames", "exc_type", "msg_lines", "link", "blank_run", "subs")

    def __init__(self, link: Optional[str]) -> None:
        self.frames: list[Frame] = []
        self.exc_type: Optional[str] = None
        self.msg_lines: list[str] = []
        self.link = link
        self.blank_run = 0
        self.subs: tuple[ExceptionRecord, ...] = ()

    def add_frame(self, frame: Frame) -> None:
        if len(self.frames) >= MAX_FRAMES:
            # Keep the outermost few and the innermost many: the innermost frames say where it failed.
            del self.frames[20]
        self.frames.append(frame)

    def set_source(self, source: str) -> None:
        if self.frames and self.frames[-1].source is None:
            last = self.frames[-1]
            self.frames[-1] = Frame(last.file, last.line, last.function, source, last.kind)

    def record(self) -> ExceptionRecord:
        return ExceptionRecord(self.exc_type or "", _join_message(self.msg_lines), tuple(self.frames), self.subs,
                               self.link)


def _join_message(lines: list[str]) -> str:
    if not lines:
        return ""
    first, rest = lines[0], lines[1:]
    while rest and not rest[-1].strip():
        rest.pop()
    if not rest:
        return first.strip()
    body = textwrap.dedent("\n".join(rest))
    return (first.strip() + "\n" + body).strip()


class TracebackAssembler:
    """Reads one lane. Call :meth:`feed` for every line of the lane while :attr:`active` is true, and for
    lines that start with one of :data:`TRIGGERS` otherwise; call :meth:`flush` at the end."""

    __slots__ = (
        "lane", "pid", "state", "hkey", "record_key", "level", "time", "source", "line_no", "origin", "context",
        "survived", "chain", "cur", "text", "foreign", "kind", "signal", "group_lines", "abort_seen", "stacks",
        "last_consumed",
    )

    def __init__(self, lane: str, pid: Optional[int] = None) -> None:
        self.lane = lane
        self.pid = pid
        self.state = _IDLE
        self.last_consumed = False  # whether the last line fed belonged to a traceback
        self._reset()

    def _reset(self) -> None:
        self.state = _IDLE
        self.hkey: Optional[tuple[Optional[str], Optional[str]]] = None
        self.record_key: Optional[tuple[Optional[str], Optional[str], Optional[str]]] = None
        self.level = self.time = self.source = None
        self.line_no = 0
        self.origin: Optional[str] = None
        self.context: Optional[str] = None
        self.survived = False
        self.chain: list[ExceptionRecord] = []
        self.cur: Optional[_Exc] = None
        self.text: list[str] = []
        self.foreign = 0
        self.kind = KIND_TRACEBACK
        self.signal: Optional[str] = None
        self.group_lines: list[str] = []
        self.abort_seen: set[str] = set()
        self.stacks: list[tuple[bool, list[Frame]]] = []

    @property
    def active(self) -> bool:
        return self.state != _IDLE

    @property
    def awaiting_more(self) -> bool:
        """True once what has been read stands as a report (the exception line is in, or a dump or abort
        has begun): what follows may still add to it, or may end it."""
        return self.state in (_AFTER_EXC, _GROUP, _FATAL, _ABORT)

    # ------------------------------------------------------------------ entry point

    def feed(
        self,
        msg: str,
        level: Optional[str],
        time: Optional[str],
        source: Optional[str],
        line_no: int,
        prev_msg: Optional[str] = None,
        prev_record: Optional[tuple[Optional[str], Optional[str], Optional[str]]] = None,
        recent_time: Optional[str] = None,
    ) -> list[TracebackEvent]:
        """Take one line; return the tracebacks it completed (usually none).

        ``prev_msg``/``prev_record`` are the lane's previous line and its (level, time, source), which say
        what introduced a traceback; ``recent_time`` is the last logger time seen anywhere, the time given
        to a traceback printed without a header.
        """
        out: list[TracebackEvent] = []
        self.last_consumed = True
        if self.state != _IDLE:
            if self._continue(msg, level, time, source, line_no, out):
                return out
        self.last_consumed = False
        self._maybe_start(msg, level, time or recent_time, source, line_no, prev_msg, prev_record, out)
        return out

    def flush(self) -> list[TracebackEvent]:
        """End whatever is being read (end of input, or the lane has been quiet long enough)."""
        out: list[TracebackEvent] = []
        if self.state == _GROUP:
            self._close_group()
        if self.state != _IDLE:
            self._finish(out)
        return out

    # ------------------------------------------------------------------ starting

    def _maybe_start(self, msg, level, time, source, line_no, prev_msg, prev_record, out) -> None:
        stripped = msg.lstrip()
        if msg.startswith(TB_START) or stripped.startswith(TB_START):
            self._begin(level, time, source, line_no, prev_msg, prev_record)
            self.cur = _Exc(None)
            self.state = _FRAMES
        elif EG_MARK in msg and stripped.lstrip("+ ").startswith(EG_MARK):
            self._begin(level, time, source, line_no, prev_msg, prev_record)
            self.cur = _Exc(None)
            self.state = _GROUP
            self.group_lines = [msg]
        elif msg.startswith(FATAL_START) or (msg.startswith("Current thread 0x") and _THREAD_HEAD.match(msg)):
            self._begin(level, time, source, line_no, prev_msg, prev_record)
            self.kind = KIND_FATAL
            self.cur = _Exc(None)
            if msg.startswith(FATAL_START):
                self.cur.exc_type = "Fatal Python error"
                self.cur.msg_lines = [msg[len(FATAL_START):]]
            else:
                # A dump without a fatal error (faulthandler.dump_traceback, a watchdog): diagnostic only.
                self.cur.exc_type = "ThreadDump"
                self.cur.msg_lines = ["stacks dumped by faulthandler"]
                self.survived = True
            self.state = _FATAL
            self._fatal_line(msg)
        elif msg.startswith("  File ") and ", in " not in msg and _FILE.match(msg):
            # SyntaxError raised while compiling the main script: the report starts at the frame.
            self._begin(level, time, source, line_no, prev_msg, prev_record)
            self.cur = _Exc(None)
            self.state = _FRAMES
            self.last_consumed = True
            self.text.append(msg)
            self.cur.add_frame(_frame_from(_FILE.match(msg)))  # type: ignore[arg-type]
            return
        elif msg.startswith(ABORT_START):
            self._begin(level, time, source, line_no, prev_msg, prev_record)
            self.kind = KIND_ABORT
            self.cur = _Exc(None)
            found = _ABORT_TYPE.match(msg)
            self.cur.exc_type = found.group("type") if found else "std::terminate"
            if not found:
                self.cur.msg_lines = [msg.strip()]
            self.state = _ABORT
        else:
            return
        self.last_consumed = True
        self.text.append(msg)

    def _begin(self, level, time, source, line_no, prev_msg, prev_record) -> None:
        self._reset()
        self.level, self.time, self.source, self.line_no = level, time, source, line_no
        self.hkey = (level, source) if level is not None else None
        # For an unheaded traceback ``time`` is only the last time seen elsewhere; it keys nothing.
        self.record_key = (level, time, source) if level is not None else None
        self.survived = level in _SURVIVABLE_LEVELS
        if prev_msg is not None:
            prev = prev_msg.strip()
            found = _PROCESS.match(prev)
            if found:
                self.origin = found.group("name")
            elif prev.startswith("Exception ignored"):
                self.survived = True
                self.context = prev
            elif prev.startswith("Exception in thread"):
                self.context = prev
            elif (prev and self.record_key is not None and prev_record == self.record_key
                  and exception_line(prev) is None):
                # The log message the traceback belongs to ("WorkerProc failed to start.").
                self.context = prev

    # ------------------------------------------------------------------ continuing

    def _foreign(self, msg: str, level: Optional[str], source: Optional[str]) -> bool:
        """A line of the same lane that is not part of the traceback being read."""
        if self.hkey is None:
            return level is not None
        return (level, source) != self.hkey

    def _continue(self, msg, level, time, source, line_no, out) -> bool:
        """Handle a line while reading; True when consumed, False when it must be looked at afresh."""
        state = self.state
        if state == _FRAMES:
            return self._frames_line(msg, level, source, out)
        if state == _AFTER_EXC:
            return self._after_exc_line(msg, level, time, source, out)
        if state == _CHAIN:
            return self._chain_line(msg, level, source, out)
        if state == _GROUP:
            if not self._foreign(msg, level, source):
                head = msg.lstrip(" ")
                if head[:1] in ("|", "+") or (EG_MARK in head):
                    if len(self.group_lines) < MAX_TEXT_LINES * 5:
                        self.group_lines.append(msg)
                    self._keep(msg)
                    return True
            self._close_group()
            return self._after_exc_line(msg, level, time, source, out)
        if state == _FATAL:
            if not self._foreign(msg, level, source) and self._fatal_line(msg):
                self._keep(msg)
                return True
            self._finish(out)
            return False
        if state == _ABORT:
            if not self._foreign(msg, level, source) and self._abort_line(msg):
                self._keep(msg)
                return True
            self._finish(out)
            return False
        return False

    def _keep(self, msg: str) -> None:
        text = self.text
        if len(text) >= MAX_TEXT_LINES:
            del text[40]
        text.append(msg)

    def _frames_line(self, msg, level, source, out) -> bool:
        if self._foreign(msg, level, source):
            return self._skip_foreign(out)
        cur = self.cur
        assert cur is not None
        if msg.startswith("  File ") or msg.startswith("File ") or msg.lstrip().startswith('File "'):
            found = _FILE.match(msg)
            if found:
                cur.add_frame(_frame_from(found))
                self._keep(msg)
                return True
        first = msg[:1]
        if first in (" ", "\t"):
            stripped = msg.strip()
            if _is_caret(stripped) or _REPEATED.match(msg):
                self._keep(msg)
                return True
            cur.set_source(stripped)
            self._keep(msg)
            return True
        if not msg.strip():
            self._keep(msg)
            return True
        if msg.startswith(TB_START):
            # A new traceback before the last one's exception line: the last one was cut short.
            self._finish(out, complete=False)
            return False
        parsed = exception_line(msg)
        if parsed is None:
            return self._skip_foreign(out)
        cur.exc_type = parsed[0]
        cur.msg_lines = [parsed[1]]
        self.state = _AFTER_EXC
        self._keep(msg)
        return True

    def _skip_foreign(self, out) -> bool:
        self.last_consumed = False
        self.foreign += 1
        if self.foreign > MAX_FOREIGN:
            self._finish(out, complete=False)
            return False
        # Not part of the traceback; the decoder still shows it as a line of the lane.
        return True

    def _after_exc_line(self, msg, level, time, source, out) -> bool:
        cur = self.cur
        assert cur is not None
        same_record = self.record_key is not None and (level, time, source) == self.record_key
        if self.hkey is not None and not same_record:
            self._finish(out)
            return False
        if self.hkey is None and level is not None:
            self._finish(out)
            return False
        stripped = msg.strip()
        if stripped == CAUSE or stripped == CONTEXT:
            self.chain.append(cur.record())
            self.cur = _Exc("cause" if stripped == CAUSE else "context")
            self.state = _CHAIN
            self._keep(msg)
            return True
        if msg.startswith(TB_START) or (EG_MARK in msg and stripped.lstrip("+ ").startswith(EG_MARK)):
            self._finish(out)
            return False
        if not stripped:
            cur.blank_run += 1
            self._keep(msg)
            return True
        if same_record or msg[:1] in (" ", "\t"):
            if len(cur.msg_lines) < MAX_MESSAGE_LINES:
                cur.msg_lines.extend([""] * cur.blank_run)
                cur.msg_lines.append(msg)
            cur.blank_run = 0
            self._keep(msg)
            return True
        self._finish(out)
        return False

    def _chain_line(self, msg, level, source, out) -> bool:
        if self._foreign(msg, level, source):
            return self._skip_foreign(out)
        stripped = msg.strip()
        if not stripped:
            self._keep(msg)
            return True
        if msg.startswith(TB_START) or stripped.startswith(TB_START):
            self.state = _FRAMES
            self._keep(msg)
            return True
        if EG_MARK in stripped and stripped.lstrip("+ ").startswith(EG_MARK):
            self.state = _GROUP
            self.group_lines = [msg]
            self._keep(msg)
            return True
        parsed = exception_line(msg)
        if parsed is not None:
            cur = self.cur
            assert cur is not None
            cur.exc_type, cur.msg_lines = parsed[0], [parsed[1]]
            self.state = _AFTER_EXC
            self._keep(msg)
            return True
        return self._skip_foreign(out)

    # ------------------------------------------------------------------ exception groups

    def _close_group(self) -> None:
        records = parse_group_block(self.group_lines)
        self.group_lines = []
        cur = self.cur
        assert cur is not None
        if records:
            top = records[0]
            cur.exc_type = top.exc_type
            cur.msg_lines = [top.message]
            cur.frames = list(top.frames)
            cur.subs = top.sub_exceptions
        self.state = _AFTER_EXC

    # ------------------------------------------------------------------ faulthandler and C++ aborts

    def _fatal_line(self, msg: str) -> bool:
        if not msg.strip() or msg.startswith(FATAL_START):
            return True
        if _THREAD_HEAD.match(msg) or msg.startswith("Stack (most recent call first)"):
            self.stacks.append((msg.startswith(("Current", "Stack")), []))
            return True
        if msg.startswith(("Extension modules:", "Python runtime state:")):
            return True
        if msg[:1] == " ":
            found = _FILE.match(msg)
            if found:
                if not self.stacks:
                    self.stacks.append((True, []))
                frames = self.stacks[-1][1]
                if len(frames) < MAX_FRAMES:
                    frames.append(_frame_from(found))
            return True
        return False

    def _abort_line(self, msg: str) -> bool:
        cur = self.cur
        assert cur is not None
        stripped = msg.strip()
        if stripped.startswith("what():"):
            cur.msg_lines = [stripped[len("what():"):].strip()]
            self.abort_seen.add("what")
            return True
        found = _RAISED_FROM.search(msg)
        if found:
            file = found.group("file")
            cur.frames = [Frame(file, int(found.group("line")), found.group("func"), None, frame_kind(file))]
            self.abort_seen.add("raised")
            return True
        if msg.startswith("frame #"):
            self.abort_seen.add("frame")
            return True
        if not stripped:
            return "frame" not in self.abort_seen
        if "what" in self.abort_seen and "raised" not in self.abort_seen and len(cur.msg_lines) < MAX_MESSAGE_LINES:
            cur.msg_lines.append(msg)
            return True
        return False

    # ------------------------------------------------------------------ finishing

    def _finish(self, out: list[TracebackEvent], complete: bool = True) -> None:
        cur = self.cur
        if cur is not None:
            if cur.exc_type is None:
                complete = False
                cur.exc_type = ""
                cur.msg_lines = ["traceback ended before its exception line"]
            if self.kind == KIND_FATAL:
                cur.frames = _fatal_frames(self.stacks)
            self.chain.append(cur.record())
        if self.kind == KIND_FATAL and self.chain:
            message = self.chain[-1].message
            self.signal = _FATAL_SIGNALS.get(message.split(" (")[0].strip())
        out.append(
            TracebackEvent(
                lane=self.lane,
                kind=self.kind,
                exceptions=tuple(self.chain),
                line_no=self.line_no,
                level=self.level,
                time=self.time,
                source=self.source,
                origin=self.origin,
                context=self.context,
                text="\n".join(self.text),
                survived=self.survived,
                complete=complete,
                signal=self.signal,
                pid=self.pid,
            )
        )
        self._reset()


_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}


def _fatal_frames(stacks: list[tuple[bool, list[Frame]]]) -> list[Frame]:
    """The crashing thread's stack, most recent call last like a traceback (faulthandler prints it first)."""
    for current, frames in stacks:
        if current:
            return list(reversed(frames))
    return list(reversed(stacks[0][1])) if stacks else []


def parse_group_block(lines: list[str]) -> list[ExceptionRecord]:
    """Exceptions of an ExceptionGroup drawing, outermost first. The first record carries the leaves of the
    whole tree (nested groups flattened) as ``sub_exceptions``."""
    records: list[_Exc] = []
    superseded: set[int] = set()  # records followed by "The above exception ...": not leaves themselves
    cur: Optional[_Exc] = None
    for raw in lines:
        head = raw.lstrip(" ")
        if head.startswith("+"):
            if EG_MARK in head:
                cur = _Exc(None)
                records.append(cur)
            elif _SUB_SEP.match(head):
                cur = None
            continue
        if head.startswith("|"):
            content = head[2:] if head.startswith("| ") else head[1:]
        else:
            content = head
        nested = content.lstrip(" +")
        if EG_MARK in nested and nested.startswith(EG_MARK):
            cur = _Exc(None)
            records.append(cur)
            continue
        if content.startswith(TB_START):
            cur = _Exc(None)
            records.append(cur)
            continue
        if content.strip() in (CAUSE, CONTEXT):
            if records:
                superseded.add(len(records) - 1)
            cur = None
            continue
        found = _FILE.match(content) if "File " in content else None
        if found:
            if cur is None:
                cur = _Exc(None)
                records.append(cur)
            cur.add_frame(_frame_from(found))
            continue
        if content[:1] in (" ", "\t"):
            if cur is not None:
                stripped = content.strip()
                if not _is_caret(stripped):
                    cur.set_source(stripped)
            continue
        parsed = exception_line(content)
        if parsed is None:
            continue
        if cur is None or cur.exc_type is not None:
            cur = _Exc(None)
            records.append(cur)
        cur.exc_type, cur.msg_lines = parsed[0], [parsed[1]]
    done = [r.record() for r in records if r.exc_type]
    leaf_flags = [i not in superseded for i, r in enumerate(records) if r.exc_type]
    if not done:
        return []
    leaves = tuple(r for r, leaf in zip(done[1:], leaf_flags[1:], strict=True) if leaf and not _is_group(r))
    top = done[0]
    return [ExceptionRecord(top.exc_type, top.message, top.frames, leaves, top.link)] + done[1:]


def _is_group(record: ExceptionRecord) -> bool:
    return record.short_type in ("ExceptionGroup", "BaseExceptionGroup") or bool(
        re.search(r"\(\d+ sub-exceptions?\)$", record.message)
    )
