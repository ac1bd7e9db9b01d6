"""Assembling tracebacks from one lane's lines.

One :class:`TracebackAssembler` per lane receives that lane's messages (logger header already split off)
and returns finished :class:`TracebackEvent` objects. It understands

* plain and chained Python tracebacks ("The above exception was the direct cause...", "During handling..."),
  with multi-line messages, ``[Previous line repeated N more times]`` and 3.11+ caret lines;
* ``ExceptionGroup`` tracebacks drawn with ``+`` and ``|``;
* tracebacks written through a logger, where every line carries the same header (or only the first does);
* parts of tracebacks, as pasted or cut: frames with no ``Traceback`` header (indented or not), an exception
  line alone (``ValueError: Free memory on device ...``), an exception line after a stray source or caret line,
  a message and ``Traceback (most recent call last):`` on one line, Ray's ``ray::Actor.method() (pid=...)``
  header, a debugger's "Exception has occurred: X" report (frames innermost first), an exception line that ranks
  sharing one stream split (its ``": message"`` on a line of its own: ``interleaved.py``);
* ``faulthandler``'s report of a fatal error ("Fatal Python error: Segmentation fault" with thread stacks).

How a report begins is a table, :data:`START_RULES`. Reports that are not Python's are read by the readers of
``nativereports.py``, mixed in: C++ exceptions that end in ``std::terminate`` (one whose ``what()`` is an NCCL
watchdog timeout is a watchdog failure), Rust panics, fatal-signal banners, and eaglewatch's preflight table.
One-line failures that are not exceptions are rows of ``lineshapes.py``; stack dumps of live processes are
``stackdump.py``'s.

Lines of other lanes never reach an assembler, so interleaving between processes does not matter. Unrelated
lines inside the same lane (another thread, or another process writing without a prefix) are skipped while
the frames are being read.

As soon as an exception line (or the first line of a dump or abort) is in, :attr:`TracebackAssembler.provisional_due`
is set and :meth:`TracebackAssembler.snapshot` gives the failure as read so far, for a live view to show at once.
"""

from __future__ import annotations

import builtins
import re
import textwrap
from typing import Callable, NamedTuple, Optional

from eaglewatch.decode.events import (
    CERTAIN,
    GUESS,
    KIND_ABORT,
    KIND_FATAL,
    KIND_TRACEBACK,
    KIND_WATCHDOG,
    LIKELY,
    ExceptionRecord,
    Frame,
    TracebackEvent,
)
from eaglewatch.decode.exclass import class_from_message
from eaglewatch.decode.frames import frame_kind
from eaglewatch.decode.gate import holds_any, make_gate
from eaglewatch.decode.interleaved import glued_class, split_message
from eaglewatch.decode.nativereports import ABORT_START, BASIS_BANNER, RPC_TERMINATED, NativeReports
from eaglewatch.decode.nativereports import ReportLine as _Line

TB_START = "Traceback (most recent call last):"
EG_MARK = "Exception Group Traceback (most recent call last):"
CAUSE = "The above exception was the direct cause of the following exception:"
CONTEXT = "During handling of the above exception, another exception occurred:"
FATAL_START = "Fatal Python error: "
DEBUGGER_START = "Exception has occurred: "

# A line that may begin a traceback-like block (checked with str.startswith before anything else).
TRIGGERS = (TB_START, FATAL_START, ABORT_START, "  + " + EG_MARK, "+ " + EG_MARK, EG_MARK)

BASIS_COMPLETE = "complete traceback"
BASIS_FRAGMENT = "from a fragment (no Traceback header)"
BASIS_BARE = "exception line without traceback header"
BASIS_QUOTED = "exception line quoted in a sentence"
BASIS_CUT = "traceback cut off before its exception line"
BASIS_CHAIN_CUT = "chained part cut off"
BASIS_JOINED = "header and frames joined across lanes"
BASIS_LOGGED = "exception message logged before its traceback, which is cut"
BASIS_RAY = "Ray task report"
BASIS_DEBUGGER = "debugger exception report (frames innermost first)"
BASIS_FAULTHANDLER = "faulthandler dump"
BASIS_INTERLEAVED = "exception line split by interleaved output (class and message joined)"

_FILE = re.compile(r'\s*File "(?P<file>[^"]*)", line (?P<line>\d+|\?+)(?:,? in (?P<func>.*?))?\s*$')
_EXC = re.compile(r"(?P<type>[A-Za-z_][\w.]*(?:\([\w.]+\))?)(?:(?P<colon>:)(?: ?(?P<msg>.*))?)?$")
# An exception line outside a traceback must name a class that looks like one.
# A C++ class keeps its namespaces as printed: tensorrt_llm::common::TllmException.
# The endings of a class name that says it is an exception (also the start rules' triggers for exception lines).
EXCEPTION_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Iteration", "Failed", "Failure", "Timeout")
# What follows "Error" or "Exception" in the name of a class made per reason (pynvml's NVMLError_DriverNotLoaded,
# NVMLError_GpuIsLost): an underscore and the reason in CamelCase.
REASON_TAIL = r"_[A-Z][A-Za-z0-9]*"
_EXC_NAME = (r"(?:[A-Za-z_]\w*(?:\.|::))*"
             r"(?:_?[A-Z]\w*(?:" + "|".join(EXCEPTION_SUFFIXES) + r")|Exception|BaseException"
             # a class per reason, named "<Base>Error_<Reason>": pynvml's NVMLError_LibraryNotFound
             r"|_?[A-Z][A-Za-z0-9]*(?:Error|Exception)" + REASON_TAIL + ")"
             # any class of a module named for them: triton.runtime.errors.OutOfResources
             r"|(?:[a-z_]\w*\.)+(?:errors|exceptions)\.[A-Z]\w*")
_BARE_AT_START = re.compile(r"(?P<type>" + _EXC_NAME + r"(?:\([\w.]+\))?)(?::(?: ?(?P<msg>.*))?$|$)")
_BARE_INSIDE = re.compile(r"(?<![A-Za-z0-9_.])(?<!::)(?P<type>" + _EXC_NAME + r"(?:\([\w.]+\))?): ")
# A class whose message other writers' output pushed to a line of its own (interleaved.py): glued anywhere in a line,
# then its colon, spaces or the line's end.
_GLUED_CLASS = re.compile(r"(?<![A-Za-z0-9_.])(?<!::)(?P<type>" + _EXC_NAME + r")(?=:|\s|$)")
# A class whose name says nothing of errors (pyarrow.lib.PlasmaStoreFull, torch._dynamo.exc.Unsupported): only at
# the start of a line, with a message, after at least two lowercase module names.
_DOTTED_AT_START = re.compile(r"(?P<type>(?:[a-z_][a-z0-9_]*\.){2,}_?[A-Z][A-Za-z0-9]*): (?P<msg>\S.*)$")
# A module's own error class, named in lower case or plainly "Error": struct.error, zlib.error, socket.gaierror,
# binascii.Error. Only with its module, which says it is one.
_MODULE_ERROR = re.compile(r"(?!self\.|cls\.)(?:[a-z_][a-z0-9_]*\.)+(?:[a-z]*error|Error)")
_MODULE_ERROR_AT_START = re.compile(r"(?P<type>" + _MODULE_ERROR.pattern + r"): (?P<msg>\S.*)$")
# An exception line quoted whole in a sentence: 'But I get the error "RuntimeError: CUDA error: ...".' The quotes
# close where the sentence ends or goes on in words (not before a bracket: a report's fields, a call's arguments).
_QUOTED_IN_PROSE = re.compile(r'"(?P<type>' + _EXC_NAME + r'): (?P<msg>[^"]{1,2000})"(?=[.,;:!?]*(?:\s*$|\s+\w))')
_NOT_PROSE_BEFORE = frozenset("=([{,<|")
# The first line of a log that begins mid-line: "ecursionError: maximum recursion depth exceeded".
_CUT_CLASS = re.compile(r"(?P<tail>[a-z]\w*(?:Error|Exception|Interrupt|Exit)): (?P<msg>\S.*)$")
_BUILTIN_FAILURES = tuple(sorted(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException) and not issubclass(value, Warning)
))
BASIS_CUT_CLASS = "from a fragment (the class name's first letters cut off)"
# The exception's repr, as ``logger.error(repr(e))`` prints it: ``AssertionError()``, ``ValueError('bad value')``.
_REPR_AT_START = re.compile(r"(?P<type>" + _EXC_NAME + r")\((?:(?P<q>['\"])(?P<msg>.*)(?P=q))?\)\s*$")
# torchelastic's error file, dumped into the log by its error handler: the exception is a JSON string,
# '    "message": "RendezvousConnectionError: The connection to the C10d store has failed. ...",'.
_JSON_MESSAGE = re.compile(r'\s*"message": "(?P<type>' + _EXC_NAME + r'): (?P<msg>(?:[^"\\]|\\.)*)"?,?\s*$')
BASIS_JSON = "exception quoted in an error file's JSON"
# Huawei CANN's error report, which torch_npu raises as a RuntimeError's message: "EH9999: Inner Error!" and the
# reason on the indented lines under it. A paste often keeps the report without the exception line above it.
_CANN_REPORT = re.compile(r"E[A-Z0-9]\d{4}: (?P<msg>\S.*)$")
BASIS_CANN = "CANN error report (torch_npu raises it as a RuntimeError)"
# A line of that report with its [FUNC:][FILE:] tail that says what failed (not a warning's, not context info).
_CANN_TAIL_FAILURE = re.compile(r"^(?!.*\bWARN).*(?: failed\b| timeout occurred|error from device)")
_LABEL_END = frozenset(":：】]>)*`'\" \t")
_WORKER_METHOD = re.compile(r"Exception in worker \S+ while processing method \w+: (?P<msg>.*?),?$")
_STATE_DICT = "Error(s) in loading state_dict for "
_RAY_ACTOR_TAIL = ("The actor is dead because", "The actor never ran", "The actor died because")
_REPEATED = re.compile(r"\s*\[Previous line repeated \d+ more times?\]")
_PROCESS = re.compile(r"Process (?P<name>[^\s:]+):\s*$")
_THREAD_HEAD = re.compile(r"(?:Current thread|Thread) 0x[0-9a-fA-F]+.*\(most recent call first\):\s*$")
_SUB_SEP = re.compile(r"\+?-*\+?-+ (?:\d+|\.\.\.) -+$")
_RAY_TASK = re.compile(r"ray::[\w.<>\-]+\(\) \(pid=\d+")
# IPython / Jupyter / Databricks: "ValueError                Traceback (most recent call last)", frames as
# "File /x/llm.py:178, in LLM.__init__(self, model)" or "File <command-12>, line 3", the failing line as "---> 178 ..."
_IPY_FILE = re.compile(
    r"(?:Input In \[\d+\], in |File |Cell (?=In ?\[))(?P<file>[^\s,]+?)(?::(?P<line>\d+))?"
    r"(?:, line (?P<line2>\d+))?(?:, in (?P<func>[^(\s]+)(?:\(.*)?)?\s*$"
)
_IPY_ARROW = re.compile(r"-*> ?(?P<no>\d+) (?P<src>.*)$")
WATCHDOG_TIMEOUT = "Watchdog caught collective operation timeout"
_RANK_IN = re.compile(r"\[Rank (\d+)\] Watchdog caught")

_NOT_TYPES = frozenset({"Note", "Warning", "Hint", "Usage", "See", "Error", "Info", "Debug", "Tip"})
_SURVIVABLE_LEVELS = frozenset({"WARNING", "INFO", "DEBUG"})
_QUIET_LEVELS = frozenset({"INFO", "DEBUG"})

MAX_TEXT_LINES = 400
MAX_FRAMES = 200
MAX_MESSAGE_LINES = 60
MAX_FOREIGN = 200

# States
_IDLE, _FRAMES, _AFTER_EXC, _CHAIN, _GROUP, _FATAL, _ABORT, _DEBUGGER, _CHECKLINE, _RPC = range(10)
_SHOWN_STATES = (_AFTER_EXC, _GROUP, _FATAL, _ABORT, _DEBUGGER, _CHECKLINE, _RPC)


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


def may_start(msg: str, level: Optional[str]) -> bool:
    """Cheap test: could this line begin anything the assembler reads (a part of a report included)? Made from
    START_RULES' triggers."""
    if starts_block(msg):
        return True
    if level in _QUIET_LEVELS:
        return TB_START in msg
    return start_gate(msg) or _lower_dotted(msg)


def exception_line(text: str) -> Optional[tuple[str, str, bool]]:
    """``"ValueError: bad"`` -> ``("ValueError", "bad", True)``; None when the line is not an exception line."""
    if not text or text[0] in " \t":
        return None
    found = _EXC.match(text)
    if not found:
        return None
    exc_type = found.group("type")
    short = exc_type.split("(")[0].rsplit(".", 1)[-1].lstrip("_")
    if not short or ((not short[0].isupper() or (short.isupper() and len(short) > 1) or short in _NOT_TYPES)
                     and _MODULE_ERROR.fullmatch(exc_type) is None):
        return None
    return exc_type, found.group("msg") or "", bool(found.group("colon"))


def bare_exception(text: str) -> Optional[tuple[str, str, bool, int]]:
    """An exception line outside any traceback: ``Type: message`` at the start of the line, or after a short
    label (``【BUG】：RuntimeError: ...``, ``Error in model execution: RuntimeError: ...``). The class name must
    look like an exception's (``...Error``, ``...Exception``, ``KeyboardInterrupt``, ``SystemExit`` ...).

    Returns ``(type, message, has_colon, where the type starts)`` or None.
    """
    if not text or text[0] in " \t":
        return None
    found = _BARE_AT_START.match(text)
    if found:
        msg = found.group("msg")
        return found.group("type"), msg or "", msg is not None or text.endswith(":"), 0
    found = _REPR_AT_START.match(text)
    if found:
        # A repr is a whole exception on one line: nothing follows on the lines below.
        return found.group("type"), found.group("msg") or "", True, 0
    inside = _BARE_INSIDE.search(text, 1, 120)
    # After a label's punctuation, or glued to a word of another script ("报错ZeroDivisionError: ...").
    if inside is None or inside.start() > 60 or (text[inside.start() - 1] not in _LABEL_END
                                                 and text[inside.start() - 1] < "\u0370"):
        if text[0].islower() and "." in text[:60]:
            found = _DOTTED_AT_START.match(text) or _MODULE_ERROR_AT_START.match(text)
            if found is not None:
                return found.group("type"), found.group("msg"), True, 0
        return quoted_in_prose(text) if '"' in text else None
    start = inside.start()
    if '"' in text[:start] or "File " in text[:start]:
        return quoted_in_prose(text) if '"' in text[:start] else None
    return inside.group("type"), text[inside.end():], True, start


def quoted_in_prose(text: str) -> Optional[tuple[str, str, bool, int]]:
    """An exception line quoted whole in a sentence (``I get the error "RuntimeError: CUDA error: ..."``): the
    quotes open at the line's start or after a word (a label's colon included), never where a value opens (after
    ``=``, a bracket, a comma, or a key in quotes), and close where the sentence ends or goes on in words.
    Returns what :func:`bare_exception` does, the quote's place as where the type starts."""
    for found in _QUOTED_IN_PROSE.finditer(text, 0, 4000):
        at = found.start()
        before = text[:at].rstrip(" ")
        if before and (before[-1] in _NOT_PROSE_BEFORE or (before[-1] == ":" and before[-2:-1] in ('"', "'"))):
            continue
        return found.group("type"), found.group("msg").strip(), True, at
    return None


def cut_class_exception(text: str) -> Optional[tuple[str, str]]:
    """``"ecursionError: ..."`` -> ``("RecursionError", "...")``: the first line of a log that begins inside a line,
    when what is left of the class name ends exactly one of Python's built-in exception names."""
    found = _CUT_CLASS.match(text)
    if found is None:
        return None
    tail = found.group("tail")
    names = [name for name in _BUILTIN_FAILURES if name.endswith(tail) and len(name) > len(tail)]
    return (names[0], found.group("msg")) if len(names) == 1 else None


def _frame_from(found: re.Match[str]) -> Frame:
    file = found.group("file")
    line = found.group("line")
    return Frame(file, int(line) if line.isdigit() else None, found.group("func"), None, frame_kind(file))


def _is_caret(stripped: str) -> bool:
    return bool(stripped) and not stripped.strip("^~ ")


def _is_frame(msg: str) -> Optional[re.Match[str]]:
    if 'File "' not in msg[:40]:
        return None
    return _FILE.match(msg)


class _Exc:
    """The exception being read."""

    __slots__ = ("frames", "exc_type", "msg_lines", "link", "blank_run", "subs", "absorb", "wrapped", "raw_lens")

    def __init__(self, link: Optional[str]) -> None:
        self.frames: list[Frame] = []
        self.exc_type: Optional[str] = None
        self.msg_lines: list[str] = []
        self.link = link
        self.blank_run = 0
        self.subs: tuple[ExceptionRecord, ...] = ()
        self.absorb = False  # "RuntimeError:" with the message on the following lines, unindented
        self.wrapped = False  # message lines may be hard-wrapped by a terminal: join those without a newline
        self.raw_lens: list[int] = []  # the physical length of each message line, to see where it was wrapped

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
        message = _join_wrapped(self.msg_lines, self.raw_lens) if self.wrapped else _join_message(self.msg_lines)
        return ExceptionRecord(self.exc_type or "", message, tuple(self.frames), self.subs, self.link)


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


def _join_wrapped(lines: list[str], raw_lens: list[int]) -> str:
    """Lines a terminal cut at its width: a line as long as the longest one (when more than one is, or when it
    stops in the middle of a word) continues on the next."""
    pairs = [(line, raw_lens[i] if i < len(raw_lens) else len(line)) for i, line in enumerate(lines) if line.strip()]
    if not pairs:
        return ""
    width = max(length for _, length in pairs)
    shared = sum(1 for _, length in pairs if length == width) > 1
    out = pairs[0][0].strip()
    for (prev, prev_len), (line, _) in zip(pairs, pairs[1:]):
        piece = line.strip()
        cut = width >= 60 and prev_len == width and (
            shared or (prev.rstrip()[-1:].isalnum() and piece[:1].isalnum() and piece[:1].islower()))
        out += piece if cut else "\n" + line.rstrip()
    return out.strip()


def is_watchdog_message(message: str) -> bool:
    return WATCHDOG_TIMEOUT in message or WATCHDOG_TIMEOUT in message.replace("\n", "")


class TracebackAssembler(NativeReports):
    """Reads one lane. Call :meth:`feed` for every line of the lane while :attr:`active` is true, and for
    lines that :func:`may_start` a report otherwise; call :meth:`flush` at the end."""

    __slots__ = (
        "lane", "pid", "state", "hkey", "record_key", "level", "time", "source", "line_no", "origin", "context",
        "survived", "chain", "cur", "text", "foreign", "kind", "signal", "group_lines", "abort_seen", "stacks",
        "last_consumed", "fragment", "basis", "flat", "after_frame", "provisional_due", "pending_exc",
        "reverse", "abort_junk", "started_by", "prev_indented", "ipython", "run_first", "pending_basis",
        "margin",
    )

    def __init__(self, lane: str, pid: Optional[int] = None) -> None:
        self.lane = lane
        self.pid = pid
        self.state = _IDLE
        self.last_consumed = False  # whether the last line fed belonged to a traceback
        self.provisional_due = False  # an exception line just arrived: snapshot() shows it
        self.prev_indented = False  # the lane's previous line was indented code or a caret line
        self.run_first: Optional[str] = None  # the first line of the logger record before this line (the decoder's)
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
        self.fragment = False  # no header: the report starts at a frame or at the exception line
        self.basis = BASIS_COMPLETE
        self.flat = False  # frames printed without their indentation: source lines are not indented either
        self.after_frame = False  # the last line kept was a frame line
        self.pending_exc: Optional[tuple[str, str]] = None  # the wrapper named by a Ray task header
        self.pending_basis: Optional[str] = None  # how the decoder knows pending_exc, when not from a header
        self.reverse = False  # frames listed innermost first (a debugger's report)
        self.abort_junk = 0
        self.started_by = ""  # "header", "frame", "exception", ...
        self.ipython = False  # IPython's layout of frames
        # The indent of a header printed indented (pip's "[28 lines of output]" block): Python's layout
        # is read beneath it, so its exception and chain lines, at the header's indent, are not source lines.
        self.margin = ""

    @property
    def active(self) -> bool:
        return self.state != _IDLE

    @property
    def awaiting_more(self) -> bool:
        """True once what has been read stands as a report (the exception line is in, or a dump or abort
        has begun): what follows may still add to it, or may end it."""
        return self.state in _SHOWN_STATES

    @property
    def header_only(self) -> bool:
        """A ``Traceback (most recent call last):`` line and nothing after it yet."""
        cur = self.cur
        return (self.state == _FRAMES and self.started_by == "header" and not self.chain and cur is not None
                and not cur.frames and cur.exc_type is None and len(self.text) <= 1)

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
        self.prev_indented = prev_msg is not None and (prev_msg[:1] in (" ", "\t") or _is_caret(prev_msg.strip()))
        if self.state != _IDLE:
            margin = self.margin
            read = msg[len(margin):] if margin and msg.startswith(margin) else msg
            if self._continue(read, level, time, source, line_no, out):
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

    def discard(self) -> None:
        """Forget what is being read (its header turned out to belong to another lane's frames)."""
        self._reset()

    def unhead(self) -> None:
        """The rest of this report comes without a logger header (a header was on its first line only)."""
        self.hkey = None
        self.record_key = None

    # ------------------------------------------------------------------ starting

    def _maybe_start(self, msg, level, time, source, line_no, prev_msg, prev_record, out) -> None:
        """The first row of START_RULES whose trigger the line holds and whose reader begins a report."""
        c = _Line(msg, msg.lstrip(), level, time, source, line_no, prev_msg, prev_record)
        quiet = level in _QUIET_LEVELS
        for rule, holds, reader in _START_TESTS:
            if quiet and not rule.at_any_level:
                break  # the rows after the first such one read failures, which INFO and DEBUG lines never are
            if (holds(msg) or (rule.also is not None and rule.also(msg))) and reader(self, c):
                self.last_consumed = True
                self.text.append(msg)
                return

    def _start_header(self, c: "_Line") -> bool:
        if not (c.msg.startswith(TB_START) or c.stripped.startswith(TB_START)):
            return False
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.cur = _Exc(None)
        self.state = _FRAMES
        self.started_by = "header"
        if not c.msg.startswith(TB_START):
            self.margin = c.msg[: len(c.msg) - len(c.stripped)]
        if self.record_key is not None and c.prev_record == self.record_key and self.run_first:
            self._logged_message(self.run_first)
        return True

    def _start_group(self, c: "_Line") -> bool:
        if not c.stripped.lstrip("+ ").startswith(EG_MARK):
            return False
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.cur = _Exc(None)
        self.state = _GROUP
        self.group_lines = [c.msg]
        return True

    def _start_fatal(self, c: "_Line") -> bool:
        if not c.msg.startswith(FATAL_START):
            return False
        # (A dump without a fatal error, faulthandler.dump_traceback's, is a stack dump: stackdump.py.)
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.kind = KIND_FATAL
        self.basis = BASIS_FAULTHANDLER
        self.cur = _Exc(None)
        self.cur.exc_type = "Fatal Python error"
        self.cur.msg_lines = [c.msg[len(FATAL_START):]]
        self.state = _FATAL
        self._fatal_line(c.msg)
        self.provisional_due = True
        return True

    def _start_syntax_frame(self, c: "_Line") -> bool:
        msg = c.msg
        if not (msg[:1] == " " and c.stripped.startswith("File ") and ", in " not in msg):
            return False
        found = _FILE.match(msg)
        if found is None:
            return False
        # SyntaxError raised while compiling the main script: the report starts at the frame.
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.cur = _Exc(None)
        self.state = _FRAMES
        self.started_by = "frame"
        self.cur.add_frame(_frame_from(found))
        self.after_frame = True
        return True

    def _start_fragment(self, c: "_Line") -> bool:
        found = _is_frame(c.stripped)
        if found is None:
            return False
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.cur = _Exc(None)
        self.cur.add_frame(_frame_from(found))
        self.state = _FRAMES
        self.started_by = "frame"
        self.fragment = True
        self.basis = BASIS_FRAGMENT
        self.flat = c.msg[:1] not in (" ", "\t")
        self.after_frame = True
        return True

    def _start_debugger(self, c: "_Line") -> bool:
        msg = c.msg
        if not msg.startswith(DEBUGGER_START):
            return False
        parsed = exception_line(msg[len(DEBUGGER_START):].split("  ", 1)[0].strip())
        if parsed is None:
            return False
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.cur = _Exc(None)
        self.cur.exc_type = parsed[0]
        self.state = _DEBUGGER
        self.reverse = True
        self.fragment = True
        self.basis = BASIS_DEBUGGER
        self.provisional_due = True
        return True

    def _start_inline_header(self, c: "_Line") -> bool:
        msg = c.msg
        cut = msg.find(TB_START[:-1])  # IPython prints it without the colon
        if cut <= 0:
            return False
        # The message and the traceback on one logger line: "Worker failed: boom Traceback (most ...):"
        self._begin(c.level, c.time, c.source, c.line_no, None, None)
        head = msg[:cut].strip()
        named = exception_line(head) if "   " in msg[:cut] else None
        worker = _WORKER_METHOD.match(head)
        if named is not None and not named[2]:
            self.ipython = True  # "ValueError                 Traceback (most recent call last)"
            self.pending_exc = (named[0], "")
        elif worker is not None:
            # vLLM's worker wrapper: "Exception in worker W while processing method M: <str(e)>, Traceback":
            # the exception line that the traceback should end in, in case the log loses it.
            self.context = head
            quoted = worker.group("msg").strip()
            self.pending_exc = (class_from_message(quoted) or "Exception", quoted)
        elif head:
            self.context = head
        self.cur = _Exc(None)
        self.state = _FRAMES
        self.started_by = "header"
        return True

    def _start_ray_task(self, c: "_Line") -> bool:
        msg = c.msg
        ray = _RAY_TASK.search(msg)
        if ray is None:
            return False
        # Ray's task header stands where "Traceback (most recent call last):" would.
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.context = msg.strip()
        wrapper = exception_line(msg[:ray.start()].rstrip().rstrip(":").strip() + ":")
        if wrapper is not None and msg[:ray.start()].rstrip().endswith(":"):
            self.pending_exc = (wrapper[0], msg[ray.start():].strip())
        self.cur = _Exc(None)
        self.state = _FRAMES
        self.started_by = "header"
        self.basis = BASIS_RAY
        return True

    def _start_bare(self, c: "_Line") -> bool:
        """An exception line with no traceback around it, in its many pasted forms."""
        msg, level, line_no, prev_msg, prev_record = c.msg, c.level, c.line_no, c.prev_msg, c.prev_record
        time, source = c.time, c.source
        bare = bare_exception(msg)
        if bare is None and msg.startswith(_STATE_DICT):
            # torch's load_state_dict raises a RuntimeError whose str() is this; printed alone it has no class.
            bare = ("RuntimeError", msg, True, 0)
        if bare is None and msg[:1] == " " and level is None and not self.prev_indented:
            # An exception line quoted in prose with the writer's own indent ("  RuntimeError: ..."): only a
            # whole "Type: message", never a source line, which would sit under a frame.
            lead = len(msg) - len(msg.lstrip(" "))
            quoted = bare_exception(msg[lead:]) if lead <= 4 else None
            if quoted is not None and quoted[2] and quoted[1].strip() and quoted[3] == 0:
                bare = quoted
        json_quoted = cann = cut_class = False
        if bare is None and msg[:1].islower() and (line_no == 0 or (line_no <= 2 and not (prev_msg or "").strip())):
            # The log's first line (under a code fence, perhaps): a paste or a tail that began mid-line.
            repaired = cut_class_exception(msg)
            if repaired is not None:
                bare, cut_class = (repaired[0], repaired[1], True, 0), True
        if bare is None and msg[:1] == "E" and msg[6:8] == ": " and _CANN_REPORT.match(msg):
            bare, cann = ("RuntimeError", msg.strip(), True, 0), True
            first = self.run_first
            if (first is not None and first.startswith("[Error]: ") and prev_record is not None
                    and prev_record == (level, time, source)):
                # torch_npu's own description opens the same message, a line or two above the code line.
                bare = ("RuntimeError", f"{first.strip()}\n{msg.strip()}", True, 0)
        elif bare is None and "[FUNC:" in msg and "][FILE:" in msg and _CANN_TAIL_FAILURE.search(msg) is not None:
            # a line of the same report past its code line: "rtStreamSynchronize execute failed, reason=[vector
            # core exception][FUNC:FuncErrorReason][FILE:error_message_manage.cc][LINE:53]"
            bare, cann = ("RuntimeError", msg.strip(), True, 0), True
        if bare is None and '"message": "' in msg[:40]:
            found = _JSON_MESSAGE.match(msg)
            if found is not None:
                text = found.group("msg").replace('\\"', '"').replace("\\n", "\n").split("\n")[0]
                bare, json_quoted = (found.group("type"), text, True, 0), True
        if bare is None:
            return False
        exc_type, message, colon, start = bare
        in_prose = msg[start:start + 1] == '"'  # quoted_in_prose's: a type found by the others starts with a letter
        after_statement = prev_msg is not None and prev_msg.lstrip().startswith(("assert ", "raise "))
        if not colon and not self.prev_indented and not after_statement:
            # "SomethingError" alone on a line, with nothing around it that says traceback (a frame's source
            # line above it, "assert x >= y" pasted without its indent, does).
            return False
        self._begin(level, time, source, line_no, prev_msg, prev_record)
        if after_statement and not colon and prev_msg is not None:
            self.text.append(prev_msg)  # the statement that failed is all there is of where
        self.cur = _Exc(None)
        self.cur.exc_type = exc_type
        self.cur.msg_lines = [message]
        self.cur.absorb = colon and not message.strip()
        if start > 0 and self.context is None:
            self.context = msg[:start].strip() or None
        self.state = _AFTER_EXC
        self.started_by = "exception"
        self.fragment = True
        self.basis = (BASIS_JSON if json_quoted else BASIS_CANN if cann else BASIS_CUT_CLASS if cut_class
                      else BASIS_QUOTED if in_prose else BASIS_FRAGMENT if self.prev_indented else BASIS_BARE)
        self.provisional_due = True
        return True

    def _logged_message(self, first: str) -> None:
        """``logger.exception(e)`` (vLLM's V0 engine, many servers): str(e) opens the record and the traceback
        follows in it. Should the traceback be cut before its exception line, that message, with the class its
        wording gives away, is the exception."""
        first = first.strip()
        # A line that names its class ("AssertionError()", "ValueError: x") is a failure of its own already.
        exc_class = class_from_message(first) if first and bare_exception(first) is None else None
        if exc_class is not None:
            self.pending_exc = (exc_class, first)
            self.pending_basis = BASIS_LOGGED

    # What the readers of NativeReports use of the assembler.
    STATE_FATAL, STATE_ABORT, STATE_CHECKLINE, STATE_RPC = _FATAL, _ABORT, _CHECKLINE, _RPC
    MAX_MESSAGE_LINES = MAX_MESSAGE_LINES
    _starts_block = staticmethod(starts_block)

    def _new_exc(self) -> "_Exc":
        return _Exc(None)

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
            elif prev.startswith(("Exception in thread", "Exception in callback", "Task exception was never")):
                self.context = prev
            elif (prev and self.record_key is not None and prev_record == self.record_key
                  and prev_msg[:1] not in (" ", "\t") and exception_line(prev) is None):
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
        if state == _DEBUGGER:
            return self._debugger_line(msg, level, source, out)
        if state == _RPC:
            return self._rpc_line(msg, out)
        if state == _CHECKLINE:
            return self._check_line(msg, level, out)
        return False

    def _keep(self, msg: str) -> None:
        text = self.text
        if len(text) >= MAX_TEXT_LINES:
            del text[40]
        text.append(msg)

    def _frames_line(self, msg, level, source, out) -> bool:
        cur = self.cur
        assert cur is not None
        if self.hkey is not None and level is None and len(self.text) == 1 and not cur.frames:
            # The header was on the first line only (Ray's "ERROR worker.py:433 -- Unhandled error ..."); the
            # frames come as printed.
            head = msg.lstrip()
            if head.startswith('File "') or _is_caret(head.strip()) or msg[:1] in (" ", "\t"):
                self.unhead()
        if self._foreign(msg, level, source):
            if level is not None and not cur.exc_type and self._starts_own_failure(msg):
                # Another writer of this lane (a logger's records among a traceback printed bare) begins a
                # failure of its own while this traceback still waits for its exception line: the two were
                # interleaved, and this one will not end here. Close it as cut off and read the other afresh.
                self._finish(out, complete=False)
                return False
            return self._skip_foreign(out)
        after_frame = self.after_frame
        self.after_frame = False
        if 'File "' in msg[:40]:
            found = _FILE.match(msg)
            if found:
                cur.add_frame(_frame_from(found))
                self._keep(msg)
                self.after_frame = True
                if msg[:1] not in (" ", "\t"):
                    self.flat = True
                return True
        first = msg[:1]
        stripped = msg.strip()
        if self.ipython and (first == "F" or first == "I" or first == "C" or first == "-"):
            ipy = _IPY_FILE.match(msg) if first != "-" else None
            if ipy is not None:
                file = ipy.group("file")
                line = ipy.group("line") or ipy.group("line2")
                cur.add_frame(Frame(file, int(line) if line else None, ipy.group("func"), None, frame_kind(file)))
                self._keep(msg)
                return True
            arrow = _IPY_ARROW.match(msg) if first == "-" else None
            if arrow is not None:
                last = cur.frames[-1] if cur.frames else None
                if last is not None:
                    cur.frames[-1] = Frame(last.file, last.line or int(arrow.group("no")), last.function,
                                           arrow.group("src").strip(), last.kind)
                self._keep(msg)
                return True
        if first in (" ", "\t"):
            if self.ipython:
                self._keep(msg)  # IPython's context lines around the failing one
                return True
            if _is_caret(stripped) or _REPEATED.match(msg):
                self._keep(msg)
                return True
            if stripped == "...":
                self._keep(msg)  # a traceback the user shortened by hand
                return True
            cur.set_source(stripped)
            self._keep(msg)
            return True
        if not stripped:
            self._keep(msg)
            return True
        if _is_caret(stripped):
            self._keep(msg)
            return True
        if msg.startswith(TB_START):
            # A new traceback before the last one's exception line: the last one was cut short.
            self._finish(out, complete=False)
            return False
        if first == ":" and cur.frames and self._rejoin(msg, glued_class(self.text, _GLUED_CLASS)):
            return True
        parsed = exception_line(msg)
        if parsed is not None and parsed[1].startswith("ray::") and _RAY_TASK.match(parsed[1]):
            # "RayTaskError(ValueError): ray::f() (pid=..)": the remote task's frames follow.
            self.context = msg.strip()
            self.pending_exc = (parsed[0], parsed[1])
            self._keep(msg)
            return True
        if self.flat and after_frame and (parsed is None or (not parsed[2] and bare_exception(msg) is None)):
            cur.set_source(stripped)  # the frame's source line, its indentation lost
            self._keep(msg)
            return True
        if parsed is None:
            return self._skip_foreign(out)
        cur.exc_type = parsed[0]
        cur.msg_lines = [parsed[1]]
        cur.absorb = parsed[2] and not parsed[1].strip()
        self.state = _AFTER_EXC
        self.provisional_due = True
        self._keep(msg)
        return True

    def _rejoin(self, msg: str, exc_type: Optional[str]) -> bool:
        """``": message"`` on a line of its own, its class printed above it: one exception line, which other
        writers' output split (interleaved.py)."""
        message = split_message(msg) if exc_type is not None else None
        if message is None:
            return False
        cur = self.cur
        assert cur is not None
        cur.exc_type, cur.msg_lines, cur.absorb = exc_type, [message], False
        self.basis = BASIS_INTERLEAVED
        self.state = _AFTER_EXC
        self.provisional_due = True
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
        if (self.hkey is not None and not same_record) or self.basis == BASIS_QUOTED:
            self._finish(out)  # (a quoted exception line ended at its closing quote)
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
            cur.absorb = False
            self._keep(msg)
            return True
        if msg[:1] == ":" and not any(line.strip() for line in cur.msg_lines) and self._rejoin(msg, cur.exc_type):
            return True  # the class alone, then its ": message" after another writer's line end
        if cur.absorb and len(cur.msg_lines) == 1 and msg[:1] in (" ", "\t"):
            cur.absorb = False  # "RuntimeError: " and an indented message: Python's own layout, read below
        if cur.absorb and msg[:1] not in (" ", "\t") and not self._starts_something(msg):
            # "RuntimeError:" and its message on the lines below it, up to a blank line.
            if len(cur.msg_lines) < MAX_MESSAGE_LINES:
                cur.msg_lines.extend([""] * cur.blank_run)
                cur.msg_lines.append(msg)
                cur.blank_run = 0
                self._keep(msg)
                return True
        if cur.exc_type and msg.startswith(_RAY_ACTOR_TAIL) and "Actor" in cur.exc_type:
            # Ray's ActorDiedError: its fields indented, then why the actor died on an unindented line of its own.
            if len(cur.msg_lines) < MAX_MESSAGE_LINES:
                cur.msg_lines.append(msg)
            cur.blank_run = 0
            self._keep(msg)
            return True
        if same_record or msg[:1] in (" ", "\t"):
            if _is_frame(msg.lstrip()) is not None and not same_record:
                self._finish(out)
                return False
            if len(cur.msg_lines) < MAX_MESSAGE_LINES:
                cur.msg_lines.extend([""] * cur.blank_run)
                cur.msg_lines.append(msg)
            cur.blank_run = 0
            self._keep(msg)
            return True
        self._finish(out)
        return False

    @staticmethod
    def _starts_own_failure(msg: str) -> bool:
        if msg.startswith(TB_START):
            return True
        bare = bare_exception(msg)
        return bare is not None and bare[3] == 0 and bare[2]

    @staticmethod
    def _starts_something(msg: str) -> bool:
        return msg.startswith(TRIGGERS) or _is_frame(msg) is not None or _PROCESS.match(msg) is not None

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
            self.provisional_due = True
            self._keep(msg)
            return True
        return self._skip_foreign(out)

    def _debugger_line(self, msg, level, source, out) -> bool:
        if self._foreign(msg, level, source):
            self._finish(out)
            return False
        cur = self.cur
        assert cur is not None
        found = _is_frame(msg.lstrip()) if 'File "' in msg else None
        if found is not None:
            cur.add_frame(_frame_from(found))
            self._keep(msg)
            return True
        stripped = msg.strip()
        if not cur.frames:
            if stripped and len(cur.msg_lines) < MAX_MESSAGE_LINES:
                cur.msg_lines.append(msg)
            self._keep(msg)
            return True
        if not stripped or msg[:1] in (" ", "\t") or _is_caret(stripped):
            if stripped and not _is_caret(stripped) and cur.frames and cur.frames[-1].source is None:
                cur.set_source(stripped)
            self._keep(msg)
            return True
        self._finish(out)
        return False

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
        self.provisional_due = True

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

    # ------------------------------------------------------------------ finishing

    def snapshot(self) -> Optional[TracebackEvent]:
        """The report as read so far, marked provisional (None when there is nothing to show yet)."""
        self.provisional_due = False
        cur = self.cur
        if cur is None or cur.exc_type is None:
            return None
        chain = [*self.chain, cur.record()]
        if self.reverse:
            last = chain[-1]
            chain[-1] = ExceptionRecord(last.exc_type, last.message, tuple(reversed(last.frames)),
                                        last.sub_exceptions, last.link)
        kind = self.kind
        if kind == KIND_FATAL:
            last = chain[-1]
            chain[-1] = ExceptionRecord(last.exc_type, last.message, tuple(_fatal_frames(self.stacks)),
                                        last.sub_exceptions, last.link)
        elif kind == KIND_ABORT and is_watchdog_message(chain[-1].message):
            kind = KIND_WATCHDOG
        return self._event(tuple(chain), kind, True, self._signal_of(chain), provisional=True)

    def _signal_of(self, chain: list[ExceptionRecord]) -> Optional[str]:
        if self.kind == KIND_FATAL and self.signal is None and chain:
            return _FATAL_SIGNALS.get(chain[-1].message.split(" (")[0].strip())
        return self.signal

    def _event(self, exceptions: tuple[ExceptionRecord, ...], kind: str, complete: bool, signal: Optional[str],
               provisional: bool = False) -> TracebackEvent:
        basis = self.basis
        if not complete:
            confidence, basis = GUESS, BASIS_CUT
        elif self.fragment or basis in (BASIS_BANNER, BASIS_JOINED, BASIS_INTERLEAVED) or BASIS_CHAIN_CUT in basis:
            confidence = LIKELY
        else:
            confidence = CERTAIN
        return TracebackEvent(
            lane=self.lane,
            kind=kind,
            exceptions=exceptions,
            line_no=self.line_no,
            level=self.level,
            time=self.time,
            source=self.source,
            origin=self.origin,
            context=self.context,
            text="\n".join(self.text),
            survived=self.survived,
            complete=complete,
            signal=signal,
            pid=self.pid,
            confidence=confidence,
            basis=basis,
            provisional=provisional,
        )

    def _finish(self, out: list[TracebackEvent], complete: bool = True) -> None:
        self.provisional_due = False
        cur = self.cur
        kind = self.kind
        if cur is not None:
            if cur.exc_type is None:
                if self.chain:
                    # "The above exception was the direct cause ..." and then the paste (or the log) ends:
                    # what was read stands.
                    cur = None
                    self.basis = f"{self.basis}; {BASIS_CHAIN_CUT}"
                    complete = True
                elif self.pending_exc is not None:
                    cur.exc_type, cur.msg_lines = self.pending_exc[0], [self.pending_exc[1]]
                    complete = True
                    if self.pending_basis is not None:
                        self.basis, self.fragment = self.pending_basis, True
                elif not cur.frames and kind == KIND_TRACEBACK:
                    # A "Traceback (most recent call last):" line and nothing of it: nothing to report.
                    self._reset()
                    return
                else:
                    complete = False
                    cur.exc_type = ""
                    cur.msg_lines = ["traceback ended before its exception line"]
            if cur is not None:
                if kind == KIND_FATAL:
                    cur.frames = _fatal_frames(self.stacks)
                if self.reverse:
                    cur.frames.reverse()
                self.chain.append(cur.record())
        if kind == KIND_ABORT and self.chain and is_watchdog_message(self.chain[-1].message):
            kind = KIND_WATCHDOG
            if self.origin is None and self.lane == "main":
                rank = _RANK_IN.search(self.chain[-1].message)
                self.origin = f"rank{rank.group(1)}" if rank else None
        out.append(self._event(tuple(self.chain), kind, complete, self._signal_of(self.chain)))
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


class StartRule(NamedTuple):
    """A way a report begins: the line holds one of ``triggers`` (or ``also`` says so), and the assembler's
    ``reader`` method, given the line, begins it (True) or finds it is not one after all."""

    name: str
    triggers: tuple[str, ...]
    reader: str
    at_any_level: bool = True  # False: a failure's start, which an INFO or DEBUG line never is
    also: Optional[Callable[[str], bool]] = None


def _lower_dotted(msg: str) -> bool:
    """A lowercase dotted class (pyarrow.lib.PlasmaStoreFull: ...) or a class name cut at the log's start."""
    return msg[:1].islower() and "." in msg[:60] and ": " in msg


# In order: the first rule whose reader begins a report wins. Every trigger goes into start_gate, the decoder's
# cheap test of whether a line may start one, so a rule cannot be forgotten there.
START_RULES: tuple[StartRule, ...] = (
    StartRule("traceback header", (TB_START,), "_start_header"),
    StartRule("exception group", (EG_MARK,), "_start_group"),
    StartRule("fatal Python error", (FATAL_START,), "_start_fatal"),
    StartRule("syntax error's frame", ('File "',), "_start_syntax_frame"),
    StartRule("Rust panic", ("panicked at",), "_start_panic"),
    StartRule("C++ abort", ("terminate called",), "_start_abort"),
    StartRule("fatal-signal banner", ("encountered", "*** SIG", "Caught signal"), "_start_banner"),
    StartRule("frame without a header", ('File "',), "_start_fragment"),
    StartRule("debugger's report", (DEBUGGER_START,), "_start_debugger"),
    StartRule("preflight check", ("[FAIL]", "[warn]", "preflight: FAILED"), "_start_check_line"),
    StartRule("header after a message", (TB_START[:-1],), "_start_inline_header"),
    StartRule("Ray task header", ("ray::",), "_start_ray_task"),
    StartRule("exception line", (*EXCEPTION_SUFFIXES, ".errors.", ".exceptions.", _STATE_DICT, "][FILE:"),
              "_start_bare", at_any_level=False, also=_lower_dotted),
    # After the exception line's rule, so that "grpc._channel._InactiveRpcError: <_InactiveRpcError of ..." stays
    # an exception line; this one reads the repr logged on its own, as code that caught the error prints it.
    StartRule("gRPC error repr", (RPC_TERMINATED,), "_start_rpc", at_any_level=False),
)
start_gate = make_gate(trigger for rule in START_RULES for trigger in rule.triggers)
# Each rule with its trigger test and its reader, looked up once.
_START_TESTS = tuple((rule, holds_any(rule.triggers), getattr(TracebackAssembler, rule.reader)) for rule in START_RULES)
