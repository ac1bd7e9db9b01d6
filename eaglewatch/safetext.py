"""Text that came from a run, a host or a log, made safe to show on the operator's terminal.

A run's name, its arguments, its log, an exit record, a host's error output: anyone who can start a run on a
shared host writes them, and a terminal obeys what they hold. ``ESC ] 52 ; c ; … BEL`` writes the operator's
clipboard, ``ESC ] 0 ; … BEL`` retitles the window, ``ESC [ 2 J`` clears the screen, an 8-bit ``CSI`` (U+009B) does
the same on terminals that read C1 controls, and a right-to-left override (U+202E) makes ``gpj.exe`` read as
``exe.jpg``. :func:`safe_text` is the one place that decides what of such text reaches a terminal: every command
and widget of the operator side shows host text through it. :class:`TerminalStream` applies the same rule to a
byte stream cut anywhere (``eaglewatch attach``), letting SGR colour through.

What is shown instead, visibly, so that an attempt is seen rather than hidden:

* ESC (U+001B) as ``␛``, so ``ESC ] 0 ; x BEL`` reads ``␛]0;x\\x07``;
* ``\\n``, ``\\r`` and ``\\t`` as those two-character escapes, unless the caller keeps them (a traceback keeps
  ``\\n``; ``attach`` keeps all three);
* every other C0 control, DEL and every C1 control (U+0080–U+009F) as ``\\xNN``;
* bidirectional embeddings, overrides, isolates and marks, the line and paragraph separators, and lone surrogates
  (which cannot even be encoded for output) as ``\\uXXXX``.

Everything else, including any letter of any script and emoji, passes unchanged. The result holds no ESC and no
control character except those kept, and applying it again changes nothing.

Standard library only: both the operator side and the agent (a bare Python on the host) import it.
"""

from __future__ import annotations

import codecs
import re
from functools import lru_cache
from typing import Any

ESC_SHOWN = "\u241b"  # ␛ SYMBOL FOR ESCAPE
KEEPABLE = "\n\r\t"

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": ESC_SHOWN}
# C0 but the keepable three, DEL, C1; ALM; LRM, RLM; LS, PS; LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI;
# surrogates.
_UNSAFE_CLASS = ("\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                 "\u2066-\u2069\ud800-\udfff")


@lru_cache(maxsize=None)
def _unsafe(keep: str) -> re.Pattern[str]:
    if any(char not in KEEPABLE for char in keep):
        raise ValueError(f"safe_text can keep only \\n, \\r and \\t, not {keep!r}")
    shown = "".join(re.escape(char) for char in KEEPABLE if char not in keep)
    return re.compile(f"[{_UNSAFE_CLASS}{shown}]")


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_text(value: object, keep: str = "") -> str:
    """``value`` (a string, or anything, which is shown as ``str(value)``; None as "") with every escape and
    control character shown visibly, as the module describes. ``keep``: which of ``\\n``, ``\\r``, ``\\t`` stay."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    pattern = _unsafe(keep)
    if pattern.search(text) is None:
        return text
    return pattern.sub(_shown, text)


# SGR (colour, bold, ...): ESC [ digits ; : ... m. Nothing else of the escape sequences is passed through.
_SGR = re.compile(r"\x1b\[[0-9;:]{0,64}m")
# What may still become an SGR sequence when the next chunk comes.
_SGR_PREFIX = re.compile(r"\x1b(?:\[[0-9;:]{0,64})?\Z")


class TerminalStream:
    """Bytes for a terminal, from bytes of a log, cut anywhere: UTF-8 text with ``\\n``, ``\\r``, ``\\t`` and SGR
    colour sequences (``ESC [ … m``) as they were; every other escape or control sequence shown by
    :func:`safe_text` (``ESC [ 2 J`` reads ``␛[2J``); bytes that are not UTF-8 as ``\\xNN``. A UTF-8 character or
    an SGR sequence cut by a chunk boundary waits for the next chunk (or :meth:`finish`)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")
        self._held = ""

    def feed(self, data: bytes) -> bytes:
        text = self._held + self._decoder.decode(data)
        self._held = ""
        cut = text.rfind("\x1b")
        if cut >= 0 and _SGR_PREFIX.match(text, cut):
            text, self._held = text[:cut], text[cut:]
        return self._render(text)

    def finish(self) -> bytes:
        """What is still held (a cut sequence, an incomplete character), made safe: the stream has ended."""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return self._render(text)

    @staticmethod
    def _render(text: str) -> bytes:
        if not text:
            return b""
        out: list[str] = []
        start = 0
        for match in _SGR.finditer(text):
            out.append(safe_text(text[start : match.start()], keep=KEEPABLE))
            out.append(match.group())
            start = match.end()
        out.append(safe_text(text[start:], keep=KEEPABLE))
        return "".join(out).encode("utf-8")


class SafeTextIO:
    """A text stream (``sys.stdout``, ``sys.stderr``) whose every write goes through :func:`safe_text`, keeping
    ``\n`` and ``\t``: the gate the CLI puts in front of the commands that print what files, configs, manifests
    and logs hold (``cli.GATED``). What a command forgot to pass through ``safe_text`` itself is still made safe."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(safe_text(text, keep="\n\t"))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        if name == "buffer":  # bytes would pass the gate: a command that writes bytes is not gated
            raise AttributeError("a gated stream has no byte buffer")
        return getattr(self._stream, name)


__all__ = ["ESC_SHOWN", "SafeTextIO", "TerminalStream", "safe_text"]
