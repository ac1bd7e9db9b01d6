"""What a hostile run can put in its name, its arguments and its log, and the check that none of it reached the
operator's terminal as anything but visible text. Shared by tests/test_hostile_*.py."""

from __future__ import annotations

import re

# Each is something a terminal (or tmux, or the font's layout engine) obeys when written raw.
OSC52_CLIPBOARD = "\x1b]52;c;cHduZWQ=\x07"  # writes "pwned" to the clipboard
OSC0_TITLE = "\x1b]0;PW\x07"  # retitles the window
CSI_CLEAR = "\x1b[2J"  # clears the screen
CSI_ALT_SCREEN = "\x1b[?1049h"  # switches to the alternate screen
DCS = "\x1bP1$r\x1b\\"  # a device control string (DECRQSS reply)
C1_CSI = "\x9b2J"  # 8-bit CSI: clears the screen on terminals that read C1 controls
BIDI_OVERRIDE = "\u202e"  # right-to-left override: "gpj.exe" reads "exe.jpg"
NUL = "\x00"

HOSTILE = (OSC52_CLIPBOARD, OSC0_TITLE, CSI_CLEAR, DCS, C1_CSI, BIDI_OVERRIDE)

# How safe_text shows them.
SHOWN = {
    OSC52_CLIPBOARD: "␛]52;c;cHduZWQ=\\x07",
    OSC0_TITLE: "␛]0;PW\\x07",
    CSI_CLEAR: "␛[2J",
    CSI_ALT_SCREEN: "␛[?1049h",
    DCS: "␛P1$r␛\\",
    C1_CSI: "\\x9b2J",
    BIDI_OVERRIDE: "\\u202e",
    NUL: "\\x00",
}

# Bytes of a log that tries everything, between ordinary lines and SGR colour (which attach keeps).
HOSTILE_LOG = b"".join([
    b"plain line one\n",
    b"\x1b[1;31mred words\x1b[0m and \x1b[32mgreen\x1b[0m\n",
    OSC52_CLIPBOARD.encode(), b" clipboard\n",
    OSC0_TITLE.encode(), b" title\n",
    CSI_CLEAR.encode(), b" clear\n",
    CSI_ALT_SCREEN.encode(), b" alternate screen\n",
    DCS.encode(), b" dcs\n",
    b"\x9b2J raw 8-bit csi\n",
    C1_CSI.encode(), b" utf-8 c1 csi\n",
    BIDI_OVERRIDE.encode(), b"gpj.exe bidi\n",
    b"nul", NUL.encode(), b"byte\n",
    b"bell\x07 backspace\x08 tab\tend\n",
    b"progress 10%\rprogress 20%\rprogress 100%\n",
    b"plain last line\n",
])

SGR = re.compile(r"\x1b\[[0-9;:]*m")
_FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def unsafe_parts(data: bytes | str, allow_sgr: bool = False, allow_cr: bool = False) -> list[str]:
    """What of ``data`` a terminal would obey: ESC (outside SGR colour when ``allow_sgr``), other C0 controls but
    \\n and \\t (and \\r when ``allow_cr``), DEL, C1 controls, bidi controls; and bytes that are not UTF-8 (a lone
    0x9b is CSI to a terminal that reads 8-bit controls). Empty when it is safe."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return [f"not UTF-8: {exc}"]
    else:
        text = data
    if allow_sgr:
        text = SGR.sub("", text)
    if allow_cr:
        text = text.replace("\r", "")
    return [repr(match.group()) + f" at {match.start()}" for match in _FORBIDDEN.finditer(text)]


def assert_safe(data: bytes | str, allow_sgr: bool = False, allow_cr: bool = False, what: str = "output") -> None:
    parts = unsafe_parts(data, allow_sgr=allow_sgr, allow_cr=allow_cr)
    assert not parts, f"{what} holds what a terminal would obey: {parts[:8]}\n{data!r}"[:4000]
