"""An exception line that other writers' output split in two.

CPython's printer of an uncaught exception writes the last line in pieces: the class, then ``": "``, then the
message, then the line end. Ranks that share one stream without a prefix of their own (a launcher that gathers
their stderr) write into one another's pieces, so a traceback waiting for its exception line can get the class
glued to another rank's source line and the message on a line of its own that starts with ``": "``, followed by
the other ranks' copies of it:

    super(_open_file, self).__init__(open(name, mode))FileNotFoundError:         super(_open_file, self).__init__(...
: [Errno 2] No such file or directory: '/tmp/x.pt'[Errno 2] No such file or directory: '/tmp/x.pt'super(...

A line that starts with ``": "`` is no line of Python's own, so with the class above it in the same traceback the
two are one exception line.
"""

from __future__ import annotations

import re
from typing import Optional

# How far back in the traceback the class may be: the ranks' pieces of one frame.
LOOK_BACK = 3
# A copy of the message begins where its first characters come again.
_PROBE = 12


def split_message(msg: str) -> Optional[str]:
    """The message on a line that starts with the ``": "`` of a class printed above it, up to where another
    writer's copy of it begins; None for any other line."""
    if not msg.startswith(": ") or not msg[2:].strip():
        return None
    text = msg[2:].strip()
    if len(text) >= 2 * _PROBE:
        again = text.find(text[:_PROBE], 1)
        if again > 0:
            text = text[:again].rstrip()
    return text


def glued_class(lines: list[str], names: re.Pattern[str]) -> Optional[str]:
    """The last exception class named in the last few ``lines``, glued to whatever other writers printed around
    it (``names`` finds a class followed by its colon, by spaces, or by the line's end), or None."""
    for line in reversed(lines[-LOOK_BACK:]):
        found = [match.group("type") for match in names.finditer(line)]
        if found:
            return found[-1]
    return None
