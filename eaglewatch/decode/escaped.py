"""A log record whose message holds a whole report as one escaped string.

Servers that log ``repr(str(e))`` or JSON (Triton's glog lines, a gRPC status, a JSON error field) print a
traceback or a Ray task report as one line: ``"...execute_method()\\n  At least one of the input arguments ...:
\\nray.exceptions.RaySystemError: System error: ..."``, colour codes escaped too (``\\u001B[36m``). Read as one
line, its exception line is in the middle of a sentence; read as the lines it stands for, it is where a reader
looks for it, at the start of a line.
"""

from __future__ import annotations

import re
from typing import Optional

from eaglewatch.decode.traceback import TB_START, bare_exception

_ESCAPED_COLOUR = re.compile(r"\\(?:u001[bB]|x1[bB]|033|e)\[[0-9;]*m")


def escaped_lines(msg: str) -> Optional[list[str]]:
    """The lines an escaped message stands for, when one of them after the first starts a report; else None."""
    text = _ESCAPED_COLOUR.sub("", msg) if "\\" in msg else msg
    pieces = text.split("\\n")
    if len(pieces) < 2:
        return None
    if not any(p.startswith(TB_START) or (p[:1].isalpha() and bare_exception(p.rstrip("\"'")) is not None)
               for p in pieces[1:]):
        return None
    # The quotes around the whole string, and the quotes escaped inside it.
    first, last = pieces[0], pieces[-1].rstrip()
    if first[:1] in "\"'" and last[-1:] == first[:1]:
        pieces[0], pieces[-1] = first[1:], last[:-1]
    return [piece.replace('\\"', '"').replace("\\'", "'") for piece in pieces]
