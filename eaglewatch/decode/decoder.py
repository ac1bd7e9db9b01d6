"""The incremental decoder: bytes in, events out, state kept up to date.

    decoder = Decoder()
    for chunk in chunks:            # any sizes: mid-line, mid-UTF-8, mid-escape-sequence are all fine
        events = decoder.feed(chunk)
    events += decoder.finish()      # end of input: completes the last line and any open traceback
    decoder.state.failures_ranked()[0]   # the root cause

Per segment (a piece of a line closed by ``\\n`` or ``\\r``): find the lane prefix, split off the logger
header, read a tqdm bar if there is one (text glued after a bar is read as a line of its own, and so is a
prefixed line glued after unfinished text), then hand the line to its process's traceback assembler and
look for a death notice. Within one physical line, segments without a prefix of their own belong to the
lane of the last prefix seen on that line, so that ``(EngineCore pid=1) \\rLoading ...: 33%`` is the
EngineCore's bar.

Before a line reaches the assembler, what a paste added around it is set aside (``clean_message``: a literal
``^M``, Ray's ``[repeated 5x across cluster]``, markdown). A lone ``Traceback (most recent call last):`` in one
lane and frames without a header in another within a few lines are joined into one traceback. Lines no report
claims are looked at for NCCL watchdog timeouts, native CUDA checks and the other rows of
``lineshapes.SHAPES``, and death notices.

The assembler shows a failure as soon as its exception line arrives: :class:`ProvisionalFailure` events and
``DecodeState.set_provisional``; the final :class:`TracebackEvent` replaces it.

Events name lanes as printed on the line; the state files them under the process (see state.py).
"""

from __future__ import annotations

import re
import time as _time
from typing import Callable, Optional

from eaglewatch.decode.bars import parse_bar, rewritten_at_once
from eaglewatch.decode.deaths import maybe_death, parse_death
from eaglewatch.decode.escaped import escaped_lines
from eaglewatch.decode.events import Event, LineEvent, ProvisionalFailure
from eaglewatch.decode.header import LEVELS, VLLM_HEADER, parse_header
from eaglewatch.decode.lanes import MAIN, LaneId, PrefixParser, lane_from_prefix, split_prefix
from eaglewatch.decode.lines import LineSplitter
from eaglewatch.decode.lineshapes import MARKER_FIRST, MARKERS, line_failures, might_be_shape
from eaglewatch.decode.stackdump import StackDumpReader
from eaglewatch.decode.stackdump import FIRST_CHARS as DUMP_FIRST_CHARS
from eaglewatch.decode.stackdump import may_start as may_start_dump
from eaglewatch.decode.state import DecodeState, LaneState, lane_key
from eaglewatch.decode.traceback import REASON_TAIL, BASIS_JOINED, TracebackAssembler, may_start, starts_block

# Something a collector wrote in front of each line. Unambiguous forms are always removed: an RFC 3339
# timestamp with its zone (kubectl --timestamps, the CRI "stdout F" form) and a docker compose column with a
# replica number ("vllm-1  | "). Looser forms (a timestamp without zone, "name | ") only when a lane prefix or
# a logger level follows.
_RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)"
_OUTER = re.compile(
    _RFC3339 + r" +(?:(?:stdout|stderr) [FP] )?(?:>> ?)?"
    r"|\[" + _RFC3339 + r"\] +"  # a CI's "[2026-02-24T20:21:58Z] "
    # Cloud Logging: "INFO 2025-11-19T20:16:36.096625454Z [resource.labels.containerName: vllm] " (the severity
    # is the collector's, not the log level)
    r"|(?:DEFAULT|DEBUG|INFO|NOTICE|WARNING|ERROR|CRITICAL|ALERT|EMERGENCY) " + _RFC3339 + r" +(?:\[[^\]]{0,200}\] +)?"
    # syslog: "Mar 12 10:00:00 host python3[1234]: "
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.\-]+ [\w.\-/]+(?:\[\d+\])?: +"
    r"|[A-Za-z][\w.\-]*[-_]\d+ +\| "
    # docker compose pads a service's name: "vllm-ascend  | " (two spaces at least: not a table's column)
    r"|[A-Za-z][\w.\-]* {2,}\| "
    # a viewer's line numbers ("[80746] "), a timestamp without zone, a compose column: only before a lane
    # prefix or a level
    r"|(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?\s+(?:>>\s*)?|[A-Za-z][\w.\-]*\s+\|\s|\[\d{1,9}\] +"
    # "uniq -c"'s count column, right-aligned ("      2 [rank0]: torch.OutOfMemoryError: ...")
    r"| {0,6}\d{1,9} )"
    r"(?=\((?:[A-Za-z_][\w.\- =]*)?pid=\d+|\[rank\d+\]:|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) )"
    # ... also before an exception line of its own ("      3 torch.OutOfMemoryError: CUDA out of memory. ...")
    r"| {0,6}\d{1,9} (?=(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?:" + REASON_TAIL + r")?: )"
)
# Escape sequences written out as text: syslog's "#033[0;36m", a pager's "^[[0;36m".
_TEXT_ESCAPES = re.compile(r"(?:#033|\^\[)\[[0-9;]*[A-Za-z]")
# Ray's colour codes around a prefix whose ESC bytes a paste lost: "[36m(RayWorkerWrapper pid=812)[0m *** SIG...".
_BARE_COLOUR = re.compile(r"\[[0-9;]{1,8}m(?=\()|(?<=\))\[0m")
_REPEATED_SUFFIX = re.compile(r" ?\[repeated \d+x across cluster\]$")
_CLEAN_FIRST = frozenset("`*")
_CLEAN_LAST = frozenset("`*M]")
_ENGINE_VERSION = re.compile(r"LLM engine \(v(?P<version>[\w.+\-]+)\)")
_TP_SIZE = re.compile(r"\btensor_parallel_size=(?P<tp>\d+)")
_EXIT_STATUS = re.compile(r"(?:Command exited with non-zero status|Exit status:) (?P<code>\d+)")

_QUIET_LEVELS = frozenset({"INFO", "DEBUG"})
_HEADER_FIRST = frozenset("DIWECF")
_MONTHS = frozenset({"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"})
_SEVERITIES = ("DEFAULT ", "DEBUG ", "INFO ", "NOTICE ", "WARNING ", "ERROR ", "CRITICAL ", "ALERT ", "EMERGENCY ")
_BLOCK_FIRST = frozenset("TFtCE +")  # first characters of the lines that can start a traceback-like block
_PREFIX_CACHE_LIMIT = 4096
_JOIN_LINES = 3  # a Traceback header and frames in another lane join when this close


def _column_ahead(text: str) -> bool:
    """Cheap test for a "name  | " column in front of the line (one word, spaces, a bar)."""
    bar = text.find(" | ", 1, 64)
    if bar < 0:
        return False
    space = text.find(" ", 0, bar + 1)
    return not text[space:bar].strip()


def _outer_ahead(text: str, first: str) -> bool:
    """Cheap test: could a collector's prefix (see _OUTER) start this segment?"""
    if "0" <= first <= "9":
        return True
    if first == " ":
        # uniq -c's count, right-aligned: GNU's in 7 columns, BSD's in 4
        return "0" <= text[6:7] <= "9" or "0" <= text[3:4] <= "9"
    if first == "[":
        return "0" <= text[1:2] <= "9"
    if "A" <= first <= "Z":
        if text[3:4] == " " and text[:3] in _MONTHS:
            return True
        if text.startswith(_SEVERITIES) and "T" in text[9:24]:
            return True
    return _column_ahead(text)


def clean_message(msg: str) -> str:
    """What a paste or a collector added around a line: a literal ``^M`` from a CRLF capture, Ray's
    ``[repeated 5x across cluster]``, markdown (``**...**``, backticks, a code fence)."""
    if msg.endswith("^M"):
        msg = msg[:-2]
    if msg.endswith("across cluster]"):
        msg = _REPEATED_SUFFIX.sub("", msg)
    if (msg[:1] in _CLEAN_FIRST or msg[-1:] in _CLEAN_FIRST) and not msg.startswith("***"):
        if msg.lstrip().startswith("```"):
            return ""
        # A backtick at one end is the user's markdown when the line is wrapped in them or it has no partner;
        # "returned `Poll::Ready(None)`" ends in an inline code span, which is the message's own text.
        ticks_are_marks = (msg[:1] == "`" and msg[-1:] == "`") or msg.count("`") % 2 == 1
        strip = "`*" if ticks_are_marks else "*"
        if msg[:1] in _CLEAN_FIRST:
            msg = msg.lstrip(strip)
        if msg[-1:] in _CLEAN_FIRST:
            msg = msg.rstrip(strip)
        if not msg.strip():
            return ""
    return msg


class _Proc:
    """What the decoder keeps per process besides the state: its assembler and its previous line."""

    __slots__ = ("lane", "asm", "prev_msg", "prev_record", "run_first", "seen", "stack")

    def __init__(self, lane: LaneState) -> None:
        self.lane = lane
        self.asm: Optional[TracebackAssembler] = None
        self.prev_msg: Optional[str] = None
        self.prev_record: Optional[tuple[Optional[str], Optional[str], Optional[str]]] = None
        # The first line of the logger record the previous line belongs to (lines of one record share level, time
        # and source): ``logger.exception(e)`` prints str(e) there, before the traceback.
        self.run_first: Optional[str] = None
        # Where this lane last printed each line start a one-line shape waits for (lineshapes.MARKERS).
        self.seen: dict[str, int] = {}
        self.stack: Optional[StackDumpReader] = None  # a stack dump being read (stackdump.py)

    @property
    def rank(self) -> Optional[int]:
        """The rank the lane's name carries (``rank3``, ``Worker_TP3``), if any."""
        return next((num for _, num in self.lane.ranks), None)


class Decoder:
    """Turns a byte stream into events and keeps :attr:`state` up to date.

    ``clock`` stamps the state's "last output" and "last progress" times (one reading per :meth:`feed`); it
    never appears in the events, so the same bytes always give the same events. ``emit_lines=False`` keeps
    the per-line :class:`LineEvent` objects out of the returned list (the state still gets them).
    """

    def __init__(
        self,
        state: Optional[DecodeState] = None,
        clock: Callable[[], float] = _time.monotonic,
        emit_lines: bool = True,
    ) -> None:
        self.state = state if state is not None else DecodeState()
        self.clock = clock
        self.emit_lines = emit_lines
        self._splitter = LineSplitter()
        self._prefixes = PrefixParser()
        # prefix text -> (process, name as printed), or None when that text is not a lane prefix
        self._prefix_cache: dict[str, Optional[tuple[_Proc, str]]] = {}
        self._procs: dict[str, _Proc] = {}
        self._main: Optional[tuple[_Proc, str]] = None
        self._line_ctx: Optional[tuple[_Proc, str]] = None  # lane of the last prefix on this physical line
        self._line_no = 0
        self._recent_time: Optional[str] = None  # the last logger timestamp seen, any lane
        # A "Traceback (most recent call last):" with nothing after it yet, and its line: its frames may come
        # in another lane.
        self._orphan: Optional[tuple[_Proc, int]] = None
        # (lane, other): the lane's lines continue a traceback whose header the other lane printed.
        self._redirect: Optional[tuple[_Proc, _Proc]] = None

    # ------------------------------------------------------------------ public

    def feed(self, data: bytes) -> list[Event]:
        """Decode one chunk; return the events it completed."""
        out: list[Event] = []
        now = self.clock()
        with self.state.lock:
            self.state.bytes += len(data)
            self._run(self._splitter.feed(data), out, now)
        if not self.emit_lines:
            out = [event for event in out if type(event) is not LineEvent]
        return out

    def finish(self) -> list[Event]:
        """End of input: the unterminated last line, and every traceback still being read."""
        out: list[Event] = []
        now = self.clock()
        with self.state.lock:
            self._run(self._splitter.finish(), out, now)
            for proc in self._procs.values():
                if proc.asm is not None and proc.asm.active:
                    self._add_failures(proc.asm.flush(), proc, out, resolves=True)
                if proc.stack is not None and proc.stack.active:
                    self._add_failures(proc.stack.flush(), proc, out)
        if not self.emit_lines:
            out = [event for event in out if type(event) is not LineEvent]
        return out

    def flush_idle(self, idle_s: float = 2.0) -> list[Event]:
        """Complete tracebacks whose lane has been quiet for ``idle_s`` seconds after the exception line.

        A traceback is only known to be over when its lane prints something else; a live view calls this
        now and then so that a process that dies right after its traceback still shows it.
        """
        out: list[Event] = []
        now = self.clock()
        with self.state.lock:
            for proc in self._procs.values():
                asm = proc.asm
                if asm is None or not asm.awaiting_more:
                    continue
                last = proc.lane.last_output_at
                if last is None or now - last >= idle_s:
                    self._add_failures(asm.flush(), proc, out, resolves=True)
        return out

    @property
    def line_no(self) -> int:
        """Physical lines completed so far."""
        return self._line_no

    # ------------------------------------------------------------------ segments

    def _run(self, segments: list[tuple[str, bool]], out: list[Event], now: float) -> None:
        segment = self._segment
        last = len(segments) - 1
        for index, (text, ends_line) in enumerate(segments):
            if text:
                if not ends_line and index < last and "%|" in text and rewritten_at_once(text, segments[index + 1][0]):
                    continue
                segment(text, out, now)
            if ends_line:
                self._line_ctx = None
                self._line_no += 1
        self.state.lines = self._line_no

    def _proc(self, lane: LaneId) -> _Proc:
        key = lane_key(lane)
        proc = self._procs.get(key)
        state = self.state.lane(lane, self._line_no)
        if proc is None:
            proc = _Proc(state)
            self._procs[key] = proc
        return proc

    def _learn(self, key: str) -> Optional[tuple[_Proc, str]]:
        lane = lane_from_prefix(key)
        hit = None if lane is None else (self._proc(lane), lane.name)
        if len(self._prefix_cache) >= _PREFIX_CACHE_LIMIT:
            self._prefix_cache.clear()
        self._prefix_cache[key] = hit
        return hit

    def _main_lane(self) -> tuple[_Proc, str]:
        if self._main is None:
            self._main = (self._proc(MAIN), MAIN.name)
        return self._main

    def _segment(self, text: str, out: list[Event], now: float) -> None:
        cache = self._prefix_cache
        if "#033[" in text or "^[[" in text:
            text = _TEXT_ESCAPES.sub("", text)
        elif text[:1] == "[" and text[1:2].isdigit() and "m(" in text[:12]:
            text = _BARE_COLOUR.sub("", text, 2)
        while text:
            first = text[0]
            hit = None
            if first == "(":
                end = text.find(")", 1, 120) + 1
                if end > 0 and (end == len(text) or text[end] == " "):
                    key = text[:end]
                    hit = cache[key] if key in cache else self._learn(key)
                    if hit is not None and end < len(text):
                        end += 1
            elif first == "[" and (text.startswith("[rank") or text.startswith("[default")):
                rank_key, end = split_prefix(text)
                if rank_key is not None:
                    hit = cache[rank_key] if rank_key in cache else self._learn(rank_key)
            if hit is not None:
                self._line_ctx = hit
                msg = text[end:]
                if not msg:
                    return
                if msg[0] == "(" and "pid=" in msg[:130]:
                    inner, _ = split_prefix(msg)
                    if inner is not None and (cache[inner] if inner in cache else self._learn(inner)) is not None:
                        text = msg  # a launcher's prefix in front of vLLM's: the inner one names the process
                        continue
                header = None
                if msg[0] in _HEADER_FIRST:
                    found = VLLM_HEADER.match(msg)
                    if found is not None:
                        level, time, source = found.groups()
                        body = msg[found.end():]
                        # A paste that lost its line breaks runs the next prefixed line on into this one.
                        cut = self._prefixes.find_embedded(body, 1) if "pid=" in body else -1
                        if cut > 0 and VLLM_HEADER.match(body, body.index(") ", cut) + 2) is not None:
                            self._line(hit, LEVELS[level], time, source, body[:cut].rstrip(), out, now)
                            text = body[cut:]
                            continue
                        self._line(hit, LEVELS[level], time, source, body, out, now)
                        return
                    header = parse_header(msg)
                elif msg[0] in "[0123456789/" or "Warning: " in msg:
                    header = parse_header(msg)
            else:
                msg = text
                header = parse_header(msg)
                ctx = self._line_ctx
                hit = ctx or self._main_lane()
                # A collector writes its prefix where a physical line begins, never after a \r or a lane prefix.
                if header is None and ctx is None and _outer_ahead(text, first):
                    outer = _OUTER.match(text)
                    if outer is not None:
                        text = text[outer.end():]
                        continue
            if header is not None:
                level, time, source, start = header
                self._line(hit, level, time, source, msg[start:], out, now)
                return
            if "]" in msg:
                found_bar = parse_bar(msg, hit[1])
                if found_bar is not None:
                    bar, end = found_bar
                    out.append(bar)
                    self.state.add_bar(hit[0].lane, bar, self._line_no, now)
                    if end < len(msg):
                        rest = msg[end:]
                        if rest.strip():
                            # Printed right after the bar with no newline: a line of its own, same lane.
                            self._line_ctx = hit
                            text = rest
                            continue
                    return
            if "pid=" in msg:
                cut = self._prefixes.find_embedded(msg, 1)
                if cut > 0:
                    head = msg[:cut]
                    if head.strip():
                        self._line(hit, None, None, None, head, out, now)
                    text = msg[cut:]
                    continue
            self._line(hit, None, None, None, msg, out, now)
            return

    def _line(
        self,
        hit: tuple[_Proc, str],
        level: Optional[str],
        time: Optional[str],
        source: Optional[str],
        msg: str,
        out: list[Event],
        now: float,
    ) -> None:
        proc, name = hit
        if msg[:1] in MARKER_FIRST and msg.startswith(MARKERS):
            proc.seen[next(m for m in MARKERS if msg.startswith(m))] = self._line_no
        event = LineEvent(name, level, time, source, msg)
        out.append(event)
        self.state.add_line(proc.lane, event, now)

        if time is not None:
            self._recent_time = time
        asm = proc.asm
        if (level in _QUIET_LEVELS and msg and (asm is None or not asm.state) and self._redirect is None
                and not (msg[0] in _BLOCK_FIRST and starts_block(msg))):
            # The common case, an INFO line outside any report: only a native line may hide in it (a
            # collector's INFO in front of a C++ CUDA check), and the engine's facts.
            if might_be_shape(msg):  # an anchor only: the engine's facts line may hold one too
                self._native_lines(proc, name, msg, level, time, source, out)
            if "LLM engine (v" in msg:
                self._engine_facts(msg)
            record: Optional[tuple[Optional[str], Optional[str], Optional[str]]] = (level, time, source)
            if record != proc.prev_record:
                proc.run_first = msg
            proc.prev_msg = msg
            proc.prev_record = record
            return
        if "\\n" in msg and level is not None:
            pieces = escaped_lines(msg)
            if pieces is not None:
                # One record holding a whole report as an escaped string: read it as the lines it stands for.
                for piece in pieces:
                    self._read(proc, name, level, time, source, piece, out)
                return
        self._read(proc, name, level, time, source, msg, out)

    def _read(self, proc: _Proc, name: str, level: Optional[str], time: Optional[str], source: Optional[str],
              msg: str, out: list[Event]) -> None:
        """What one line that is not a plain INFO line says of failures and of the run."""
        asm = proc.asm
        if msg and (msg[0] in _CLEAN_FIRST or msg[-1] in _CLEAN_LAST):
            msg = clean_message(msg)
        consumed = False
        redirect = self._redirect
        if redirect is not None and redirect[0] is proc:
            consumed = self._redirected(redirect[1], msg, level, time, source, out)
        stack = proc.stack
        if not consumed and ((stack is not None and stack.active)
                             or (msg[:1] in DUMP_FIRST_CHARS and (asm is None or not asm.state)
                                 and may_start_dump(msg))):
            if stack is None:
                stack = proc.stack = StackDumpReader(name, proc.lane.pid)
            consumed, dumped = stack.feed(msg, self._line_no)
            if dumped:
                self._add_failures(dumped, proc, out)
        if consumed:
            pass
        elif asm is not None and asm.state:
            consumed = self._feed(proc, asm, msg, level, time, source, out)
            if "Traceback" in msg and asm.header_only:
                self._orphan = (proc, self._line_no)
        elif msg and ((msg[0] in _BLOCK_FIRST and starts_block(msg)) if level in _QUIET_LEVELS
                      else may_start(msg, level)):
            if self._orphan is not None and self._join_into_orphan(proc, msg, level, time, source, out):
                consumed = True
            else:
                if asm is None:
                    asm = proc.asm = TracebackAssembler(name, proc.lane.pid)
                asm.lane = name
                consumed = self._feed(proc, asm, msg, level, time, source, out)
                if asm.state:
                    if asm.header_only:
                        self._orphan = (proc, self._line_no)
                    elif asm.started_by == "frame" and self._orphan is not None:
                        self._join_orphan_header(proc, asm)

        if not consumed and msg and might_be_shape(msg):
            self._native_lines(proc, name, msg, level, time, source, out)
        if level not in _QUIET_LEVELS:
            if not consumed and maybe_death(msg):
                death = parse_death(msg, name, self._line_no, level, time, source, proc.lane.pid)
                if death is not None:
                    self._add_failures([death], proc, out)
            if level is None and ("Exit status" in msg or "Command exited" in msg):
                found = _EXIT_STATUS.search(msg)
                if found:
                    self.state.facts["exit_status"] = int(found.group("code"))
        elif "LLM engine (v" in msg:
            self._engine_facts(msg)

        record = (level, time, source) if level is not None else None
        if record is None or record != proc.prev_record:
            proc.run_first = msg if record is not None else None
        proc.prev_msg = msg
        proc.prev_record = record

    def _native_lines(self, proc: _Proc, name: str, msg: str, level: Optional[str], time: Optional[str],
                      source: Optional[str], out: list[Event]) -> None:
        """The one-line shapes (lineshapes.SHAPES: NCCL watchdog timeouts, native CUDA checks, ...): failures
        whatever level a collector printed."""
        found = line_failures(msg, name, self._line_no, level, time, source, proc.lane.pid, proc.rank, proc.seen)
        if found:
            self._add_failures(found, proc, out)

    def _feed(self, proc: _Proc, asm: TracebackAssembler, msg: str, level: Optional[str], time: Optional[str],
              source: Optional[str], out: list[Event]) -> bool:
        """One line to ``proc``'s assembler; what it completes goes to the state, and so does what it shows
        at once (the exception line has arrived). Returns whether the line belonged to a report."""
        asm.run_first = proc.run_first
        done = asm.feed(msg, level, time, source, self._line_no, proc.prev_msg, proc.prev_record,
                        self._recent_time)
        consumed = asm.last_consumed
        if done:
            self._add_failures(done, proc, out, resolves=True)
        if asm.provisional_due:
            shown = asm.snapshot()
            if shown is not None:
                out.append(ProvisionalFailure(shown.lane, shown))
                self.state.set_provisional(shown, proc.lane)
        return consumed

    def _fresh_orphan(self, proc: _Proc) -> Optional[_Proc]:
        """The lane holding a bare "Traceback (most recent call last):" printed just now, if not ``proc``."""
        orphan = self._orphan
        if orphan is None:
            return None
        other, line_no = orphan
        if self._line_no - line_no > _JOIN_LINES or other.asm is None or not other.asm.header_only:
            self._orphan = None
            return None
        return other if other is not proc else None

    def _join_orphan_header(self, proc: _Proc, asm: TracebackAssembler) -> None:
        """Frames began in ``proc`` with no header just after a lone header in another lane: one traceback,
        in the lane of the frames (which carries the process's prefix)."""
        other = self._fresh_orphan(proc)
        if other is None or other.asm is None:
            return
        header = other.asm
        asm.fragment = False
        asm.basis = BASIS_JOINED
        asm.origin = asm.origin or header.origin
        asm.context = asm.context or header.context
        asm.text.insert(0, header.text[0])
        header.discard()
        self._orphan = None

    def _join_into_orphan(self, proc: _Proc, msg: str, level: Optional[str], time: Optional[str],
                          source: Optional[str], out: list[Event]) -> bool:
        """The reverse: a lone header in another lane, then frames here without a prefix (lane ``main``)."""
        if proc.lane.kind != "main" or not msg.lstrip().startswith('File "'):
            return False
        other = self._fresh_orphan(proc)
        if other is None or other.asm is None:
            return False
        other.asm.unhead()
        other.asm.basis = BASIS_JOINED
        self._redirect = (proc, other)
        self._orphan = None
        return self._feed(other, other.asm, msg, None, None, None, out)

    def _redirected(self, other: _Proc, msg: str, level: Optional[str], time: Optional[str],
                    source: Optional[str], out: list[Event]) -> bool:
        asm = other.asm
        if asm is None or not asm.state:
            self._redirect = None
            return False
        consumed = self._feed(other, asm, msg, level, time, source, out)
        if not asm.state:
            self._redirect = None
        return consumed

    def _engine_facts(self, msg: str) -> None:
        found = _ENGINE_VERSION.search(msg)
        if found:
            self.state.facts["vllm_version"] = found.group("version")
        tp = _TP_SIZE.search(msg)
        if tp:
            self.state.facts["tensor_parallel_size"] = int(tp.group("tp"))

    def _add_failures(self, failures: list, proc: _Proc, out: list[Event], resolves: bool = False) -> None:
        if resolves:
            self.state.clear_provisional(proc.lane)
        for failure in failures:
            out.append(failure)
            self.state.add_failure(failure, proc.lane)


def decode_bytes(data: bytes, clock: Callable[[], float] = lambda: 0.0) -> tuple[list[Event], DecodeState]:
    """Decode a whole buffer at once (tests, small files)."""
    decoder = Decoder(clock=clock)
    events = decoder.feed(data)
    events += decoder.finish()
    return events, decoder.state
