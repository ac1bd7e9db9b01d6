"""Reports that are not Python's tracebacks, read line by line by the traceback assembler: a C++ exception that
ended in ``std::terminate``, a Rust panic, a fatal-signal banner (abseil's, Ray's), a gRPC error's multi-line repr
logged without a traceback, and eaglewatch's own preflight check lines. Their start rules are rows of
``traceback.START_RULES``; their readers are here, mixed into
:class:`~eaglewatch.decode.traceback.TracebackAssembler`, whose state they fill (the current exception, the
report's text, its kind and basis). ``traceback.py`` keeps Python's tracebacks, chains and groups.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Optional

from eaglewatch.decode.events import KIND_ABORT, KIND_CHECK, KIND_FATAL, Frame, TracebackEvent
from eaglewatch.decode.frames import frame_kind

ABORT_START = "terminate called "


class ReportLine(NamedTuple):
    """One line as the start rules read it."""

    msg: str
    stripped: str
    level: Optional[str]
    time: Optional[str]
    source: Optional[str]
    line_no: int
    prev_msg: Optional[str]
    prev_record: Optional[tuple[Optional[str], Optional[str], Optional[str]]]


BASIS_BANNER = "fatal-signal banner"
BASIS_ABORT = "C++ abort report"
BASIS_CHECK = "preflight check"
# Rust's panic report (tokenizers, Dynamo's frontend, anything with a Rust core): the message on the same line
# (older Rust: "panicked at 'msg', src/x.rs:1:2") or on the next (newer: "panicked at src/x.rs:1:2:").
_PANIC = re.compile(r"thread '(?P<thread>[^']*)' panicked at (?P<rest>.*)$")
RUST_PANIC = "Rust panic"
_ABORT_TYPE = re.compile(
    r"terminate called after throwing an instance of '(?P<type>[A-Za-z_][\w:<>]*?)(?=terminate|'|$)"
)
_RAISED_FROM = re.compile(
    r"Exception raised from (?P<func>.+?) at (?P<file>[^\s:]+):(?P<line>\d+) \(most recent call first\)"
)
_BANNER = re.compile(
    r"!{3,} ?(?P<what>Segfault|Segmentation fault|Bus error|Illegal instruction|Floating point exception|Abort)"
    r"\w* encountered ?!{3,}"
    r"|\*\*\* (?P<sig>SIG[A-Z]+) received at time="
    r"|Caught signal (?P<num>\d+) \((?P<what2>[^:)]+)"
)
_BANNER_SIGNALS = {"Segfault": "SIGSEGV", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
                   "Illegal instruction": "SIGILL", "Floating point exception": "SIGFPE", "Abort": "SIGABRT"}
_CHECK = re.compile(r"\s*\[(?P<mark>FAIL|warn)\] (?P<name>\S(?:.*?\S)?)(?: {2,}(?P<reason>\S.*))?$")
_PREFLIGHT_FAILED = re.compile(r"preflight: FAILED(?: \((?P<detail>[^)]*)\))?")
# grpc's RpcError as str() prints it (_InactiveRpcError, _MultiThreadedRendezvous): "<_X of RPC that terminated
# with:", then "\tstatus = StatusCode.UNKNOWN", "\tdetails = "..."", "\tdebug_error_string = "..."" and ">". The
# class is the repr's; the failure, often the server's own exception, is in ``details``.
RPC_TERMINATED = " of RPC that terminated with:"
BASIS_RPC = "gRPC error repr (no traceback of its own)"
_RPC_REPR = re.compile(r"<(?P<cls>_[A-Z]\w*)" + RPC_TERMINATED + r"\s*$")
_RPC_FIELD = re.compile(r"\s+(?P<key>status|details|debug_error_string) = (?P<value>.*?)\s*$")
_NUM_SIGNALS = {"4": "SIGILL", "6": "SIGABRT", "7": "SIGBUS", "8": "SIGFPE", "9": "SIGKILL", "11": "SIGSEGV"}


class NativeReports:
    """The readers of the reports above. The assembler provides what they use: its state, a fresh exception
    record (``_new_exc``), ``_begin``, ``_keep``, ``_finish``, where a new report would begin (``_starts_block``)
    and its state numbers."""

    STATE_FATAL: int
    STATE_ABORT: int
    STATE_CHECKLINE: int
    STATE_RPC: int
    fragment: bool
    MAX_MESSAGE_LINES: int
    cur: Any
    kind: str
    basis: str
    signal: Optional[str]
    state: int
    survived: bool
    provisional_due: bool
    abort_seen: set[str]
    abort_junk: int

    def _new_exc(self) -> Any:
        raise NotImplementedError

    def _begin(self, level, time, source, line_no, prev_msg, prev_record) -> None:
        raise NotImplementedError

    def _keep(self, msg: str) -> None:
        raise NotImplementedError

    def _finish(self, out: list[TracebackEvent], complete: bool = True) -> None:
        raise NotImplementedError

    @staticmethod
    def _starts_block(msg: str) -> bool:
        raise NotImplementedError

    def _start_panic(self, c: ReportLine) -> bool:
        found = _PANIC.search(c.msg)
        if found is None:
            return False
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.kind = KIND_ABORT
        self.basis = "Rust panic report"
        self.cur = self._new_exc()
        self.cur.exc_type = RUST_PANIC
        rest = found.group("rest").strip()
        self.cur.msg_lines = [rest]
        if not rest.endswith(":"):
            self.abort_seen.add("panic message")  # the old layout: the message is on this line
        self.state = self.STATE_ABORT
        self.provisional_due = True
        return True

    def _start_rpc(self, c: ReportLine) -> bool:
        found = _RPC_REPR.search(c.msg)
        if found is None:
            return False
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.basis = BASIS_RPC
        self.fragment = True  # no traceback: what it was raised from is not in the log
        self.cur = self._new_exc()
        self.cur.exc_type = found.group("cls")
        self.cur.msg_lines = [""]
        self.state = self.STATE_RPC
        return True

    def _rpc_line(self, msg: str, out: list[TracebackEvent]) -> bool:
        """A line of the repr; False (and the report ends) at any other."""
        found = _RPC_FIELD.match(msg)
        if found is None:
            closing = msg.strip() == ">"
            if closing:
                self._keep(msg)
            self._finish(out)
            return closing
        self._keep(msg)
        key, value = found.group("key"), found.group("value")
        if key == "details" or (key == "status" and not self.cur.msg_lines[0]):
            # The details say what failed; a status alone (details = None) is all there is.
            self.cur.msg_lines = [value[1:-1] if value[:1] == '"' and value[-1:] == '"' else value]
            self.provisional_due = key == "details"
        return True

    def _start_abort(self, c: ReportLine) -> bool:
        msg = c.msg
        found = _ABORT_TYPE.search(msg)
        if not (msg.startswith(ABORT_START) or found):
            return False
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.kind = KIND_ABORT
        self.basis = BASIS_ABORT
        self.cur = self._new_exc()
        self.cur.exc_type = found.group("type") if found and found.group("type") else "std::terminate"
        if not found:
            self.cur.msg_lines = [msg.strip()]
        self.state = self.STATE_ABORT
        self.provisional_due = True
        return True

    def _start_banner(self, c: ReportLine) -> bool:
        banner = _BANNER.search(c.msg)
        if banner is None:
            return False
        self._begin(c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)
        self.kind = KIND_FATAL
        self.basis = BASIS_BANNER
        self.cur = self._new_exc()
        what = banner.group("what") or banner.group("what2") or ""
        self.signal = banner.group("sig") or _BANNER_SIGNALS.get(what.strip().split(":")[0])
        if self.signal is None and banner.group("num"):
            self.signal = _NUM_SIGNALS.get(banner.group("num"))
        self.cur.exc_type = "Segmentation fault" if self.signal == "SIGSEGV" else "Fatal signal"
        self.cur.msg_lines = [c.stripped.strip()]
        self.state = self.STATE_FATAL
        self.provisional_due = True
        return True

    def _start_check_line(self, c: ReportLine) -> bool:
        return self._start_check(c.msg, c.level, c.time, c.source, c.line_no, c.prev_msg, c.prev_record)

    def _start_check(self, msg, level, time, source, line_no, prev_msg, prev_record) -> bool:
        found = _CHECK.match(msg)
        summary = None if found else _PREFLIGHT_FAILED.match(msg)
        if found is None and summary is None:
            return False
        self._begin(level, time, source, line_no, prev_msg, prev_record)
        self.kind = KIND_CHECK
        self.basis = BASIS_CHECK
        self.cur = self._new_exc()
        if found is not None:
            self.cur.exc_type = "PreflightCheckFailed" if found.group("mark") == "FAIL" else "PreflightWarning"
            self.survived = found.group("mark") == "warn"
            reason = found.group("reason") or ""
            self.cur.msg_lines = [f"{found.group('name')}: {reason}".rstrip(": ")]
        else:
            assert summary is not None
            self.cur.exc_type = "PreflightFailed"
            self.cur.msg_lines = [summary.group("detail") or "preflight failed"]
        self.state = self.STATE_CHECKLINE
        self.provisional_due = True
        return True

    def _abort_line(self, msg: str) -> bool:
        cur = self.cur
        assert cur is not None
        stripped = msg.strip()
        if cur.exc_type == RUST_PANIC:
            if stripped.startswith("note: run with") or stripped.startswith("stack backtrace:"):
                return True
            if stripped and "panic message" not in self.abort_seen:
                cur.msg_lines = [stripped, f"(at {cur.msg_lines[0].rstrip(':')})"]
                self.abort_seen.add("panic message")
                return True
            return False
        if stripped.startswith("what():"):
            cur.msg_lines = [msg[msg.index("what():") + len("what():"):].strip()]
            cur.raw_lens = [len(msg)]
            cur.wrapped = True
            self.abort_seen.add("what")
            self.provisional_due = True
            return True
        if "what" not in self.abort_seen and self.abort_junk < 20 and (
                "terminate called" in msg or "'" in msg or "::" in msg):
            # Several processes aborting at once write their lines into one another.
            self.abort_junk += 1
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
        if ("what" in self.abort_seen and "raised" not in self.abort_seen
                and len(cur.msg_lines) < self.MAX_MESSAGE_LINES and not self._starts_block(msg)):
            cur.msg_lines.append(msg)
            cur.raw_lens.append(len(msg))
            return True
        return False

    def _check_line(self, msg: str, level: Optional[str], out: list[TracebackEvent]) -> bool:
        """A preflight check's next line: its ``fix:`` (then the report ends), or anything else (it ended)."""
        stripped = msg.strip()
        if level is None and stripped.startswith("fix: "):
            cur = self.cur
            assert cur is not None
            cur.msg_lines.append(stripped)
            self._keep(msg)
            self._finish(out)
            return True
        self._finish(out)
        return False
