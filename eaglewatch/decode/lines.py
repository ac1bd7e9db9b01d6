"""Bytes to text segments: split on ``\\n`` and ``\\r``, decode UTF-8, drop ANSI escape sequences.

A chunk may end anywhere: inside a line, inside a UTF-8 character or inside an escape sequence. Splitting
happens on the raw bytes, and ``\\r`` and ``\\n`` never occur inside a multi-byte UTF-8 character or an
escape sequence, so every complete segment can be decoded and cleaned on its own; the incomplete tail
waits in a buffer for the next chunk.
"""

from __future__ import annotations

import re

# CSI (colours, cursor moves), OSC (titles, hyperlinks) and the two-byte escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x1b")


def strip_ansi(text: str) -> str:
    """Remove terminal escape sequences from one complete segment."""
    if "\x1b" not in text:
        return text
    return _ANSI.sub("", text)


def decode_segment(raw: bytes) -> str:
    """UTF-8 (invalid bytes become U+FFFD), without escape sequences."""
    text = raw.decode("utf-8", "replace")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text


class LineSplitter:
    """Incremental splitter.

    ``feed`` returns ``(text, ends_line)`` pairs: ``ends_line`` is True for a segment closed by ``\\n`` (the end
    of a physical line) and False for one closed by ``\\r`` (the terminal will write over it). ``\\r\\n`` is a
    segment closed by ``\\r`` followed by an empty one closed by ``\\n``, which is the same thing to a reader
    that ignores empty segments, whatever the chunk boundaries.
    """

    __slots__ = ("_tail", "max_segment")

    def __init__(self, max_segment: int = 1 << 20) -> None:
        self._tail = b""
        # A run of bytes with no \r or \n longer than this is cut, so that memory stays bounded.
        self.max_segment = max_segment

    @property
    def pending(self) -> bytes:
        return self._tail

    def feed(self, data: bytes) -> list[tuple[str, bool]]:
        if self._tail:
            data = self._tail + data
        end = data.rfind(b"\n") + 1
        limit = self.max_segment
        if end and end <= limit and b"\x1b" not in data[:end]:
            # The common chunk: whole lines of plain text. Decoding them at once gives what decoding each
            # segment would (\r and \n end any invalid UTF-8 sequence before them), at a fraction of the calls.
            return self._finish_tail(data[end:], _plain_segments(data[:end].decode("utf-8", "replace")))
        out: list[tuple[str, bool]] = []
        append = out.append
        lines = data.split(b"\n")
        tail = lines.pop()
        for raw in lines:
            if b"\r" in raw:
                parts = raw.split(b"\r")
                last = parts.pop()
                for part in parts:
                    if len(part) > limit:
                        part = self._cut(part, out)
                    append((decode_segment(part), False))
                if len(last) > limit:
                    last = self._cut(last, out)
                append((decode_segment(last), True))
            else:
                if len(raw) > limit:
                    raw = self._cut(raw, out)
                text = raw.decode("utf-8", "replace")
                if "\x1b" in text:
                    text = _ANSI.sub("", text)
                append((text, True))
        return self._finish_tail(tail, out)

    def _finish_tail(self, tail: bytes, out: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
        """Keep what follows the last newline for the next chunk, less the ``\\r``-closed segments in it."""
        limit = self.max_segment
        append = out.append
        if b"\r" in tail:
            parts = tail.split(b"\r")
            tail = parts.pop()
            for part in parts:
                if len(part) > limit:
                    part = self._cut(part, out)
                append((decode_segment(part), False))
        if len(tail) > limit:
            # Cut at the same places as a complete segment would be, so chunking does not matter.
            tail = self._cut(tail, out)
        self._tail = tail
        return out

    def _cut(self, raw: bytes, out: list[tuple[str, bool]]) -> bytes:
        """Emit leading pieces of at most ``max_segment`` bytes; return what is left."""
        limit = self.max_segment
        while len(raw) > limit:
            cut = _safe_cut(raw, limit)
            out.append((decode_segment(raw[:cut]), False))
            raw = raw[cut:]
        return raw

    def finish(self) -> list[tuple[str, bool]]:
        """The last, unterminated segment (a file that does not end in a newline)."""
        tail, self._tail = self._tail, b""
        return [(decode_segment(tail), True)] if tail else []


def _plain_segments(text: str) -> list[tuple[str, bool]]:
    """Segments of decoded whole lines with no escape sequence: split on \\n, then on \\r."""
    lines = text.split("\n")
    lines.pop()  # the empty string after the last newline
    if "\r" not in text:
        return [(line, True) for line in lines]
    out: list[tuple[str, bool]] = []
    for line in lines:
        if "\r" in line:
            parts = line.split("\r")
            last = parts.pop()
            out.extend([(part, False) for part in parts])
            out.append((last, True))
        else:
            out.append((line, True))
    return out


def _safe_cut(raw: bytes, limit: int) -> int:
    """A cut point at or before ``limit`` that does not split a UTF-8 character."""
    cut = limit
    while cut > 0 and (raw[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut or limit
