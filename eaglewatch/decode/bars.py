"""tqdm progress bars, in general.

tqdm's default layout is ``{desc}: {percentage}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]``;
without a total it is ``{desc}: {n}{unit} [{elapsed}, {rate}{postfix}]``. vLLM's shard loader replaces the bar
with ``Completed |``. Counts may carry an SI suffix (``1.23k``, ``45.2M``) and the rate may be inverted
(``17.56s/it``) or use another unit (``toks/s``, ``MB/s``).
"""

from __future__ import annotations

import re
from typing import Optional

from eaglewatch.decode.events import BarUpdate

_NUMBER = r"\d+(?:\.\d+)?[kMGTPEZY]?"
_INTERVAL = r"(?:\d+d,? ?)?\d+:\d\d(?::\d\d)?"

_BAR = re.compile(
    r"\s*(?:(?P<desc>.*?):\s*)?"
    r"(?:(?P<pct>\d{1,3})%\s*(?:\|[^|]*\||[^\d|\[]*\|)?\s*)?"
    r"(?P<n>" + _NUMBER + r")(?:/(?P<total>" + _NUMBER + r"))?(?P<unit>[^\s\[\d/:]*)\s*"
    r"\[(?P<elapsed>" + _INTERVAL + r")(?:<(?P<remaining>" + _INTERVAL + r"|\?))?"
    r"(?:,\s*(?P<rate>\?|" + _NUMBER + r")\s*(?P<rate_unit>[^\s,\]]*/[^\s,\]]+))?"
    r"(?:,\s*(?P<postfix>[^\]]*))?\]"
)

# The common layouts (a description, a percentage, n/total, elapsed<remaining, a rate) in a cheaper
# expression; anything else goes to _BAR.
_FAST = re.compile(
    r"([^%\[|]*?): *(\d{1,3})%(?:\|[^|]*\|| Completed \|) *(" + _NUMBER + r")/(" + _NUMBER + r") "
    r"\[(\d+:\d\d(?::\d\d)?)<(\d+:\d\d(?::\d\d)?|\?), *(\?|" + _NUMBER + r")([^\s,\]]*/[^\s,\]]+)"
    r"(?:, ([^\]]*))?\]"
)

_SI = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}


def parse_number(text: str) -> float:
    """``"45"`` -> 45.0, ``"1.23k"`` -> 1230.0."""
    try:
        return float(text)
    except ValueError:
        return float(text[:-1]) * _SI[text[-1]]


_INTERVALS: dict[str, Optional[float]] = {}


def parse_interval(text: Optional[str]) -> Optional[float]:
    """tqdm's ``mm:ss`` / ``h:mm:ss`` (and a tolerated ``Nd, h:mm:ss``) in seconds; None for ``?``."""
    if not text:
        return None
    # Bars repeat the same few intervals over and over: remember them (a bounded table).
    seconds = _INTERVALS.get(text, -1.0)
    if seconds != -1.0:
        return seconds
    seconds = _interval(text)
    if len(_INTERVALS) >= 8192:
        _INTERVALS.clear()
    _INTERVALS[text] = seconds
    return seconds


def _interval(text: str) -> Optional[float]:
    if text == "?":
        return None
    days = 0
    if "d" in text:
        head, _, text = text.partition("d")
        days = int(head)
        text = text.lstrip(", ")
    seconds = 0
    for part in text.split(":"):
        seconds = seconds * 60 + int(part)
    return float(days * 86400 + seconds)


def parse_bar(text: str, lane: str) -> Optional[tuple[BarUpdate, int]]:
    """The bar at the start of ``text`` and the offset just after it, or None."""
    if "]" not in text:
        return None
    found = _FAST.match(text)
    if found is not None:
        desc, pct_text, n_text, total_text, elapsed, remaining, rate_text, rate_unit, postfix = found.groups()
        unit = None
    else:
        found = _BAR.match(text)
        if found is None:
            return None
        desc, pct_text, n_text, total_text, unit, elapsed, remaining, rate_text, rate_unit, postfix = found.groups()
    try:
        n = float(n_text)
    except ValueError:
        n = parse_number(n_text)
    total = parse_number(total_text) if total_text else None
    if pct_text is not None:
        percent: Optional[int] = int(pct_text)
    elif total:
        percent = int(100 * n / total)
    else:
        percent = None
    rate = None if rate_text is None or rate_text == "?" else parse_number(rate_text)
    if not unit:
        unit = _unit_from_rate(rate_unit) or "it"
    bar = BarUpdate(
        lane,
        desc.strip() if desc else "",
        n,
        total,
        percent,
        parse_interval(elapsed),
        parse_interval(remaining),
        rate,
        rate_unit,
        postfix.strip() if postfix else None,
        unit,
    )
    return bar, found.end()


def rewritten_at_once(text: str, after: str) -> bool:
    """Whether the ``\\r``-ended bar ``text`` is rewritten by ``after``, the next segment of the same chunk.

    tqdm rewrites a bar many times a second, and a log holds every rewrite on one physical line. A rewrite
    that the same bar (same lane prefix, same description) replaces in the same chunk reaches the decoder
    at the same moment as its replacement, so it says nothing the replacement does not: a terminal would
    never show it. A bar at 100 % is kept (it ends a pass, and the next bar of that name starts another).
    """
    pct = text.find("%|")
    if pct < 3 or "%|" not in after:
        return False
    desc = text.rfind(": ", 0, pct)
    return (desc > 0 and text[pct - 3:pct] != "100" and after.startswith(text[:desc + 2])
            and text.rstrip()[-1:] == "]" and "rror" not in text[:desc])  # nothing printed after the bar


_UNITS: dict[str, Optional[str]] = {}


def _unit_from_rate(rate_unit: Optional[str]) -> Optional[str]:
    if not rate_unit:
        return None
    cached = _UNITS.get(rate_unit, False)
    if cached is not False:
        return cached  # type: ignore[return-value]
    unit = _unit_of(rate_unit)
    if len(_UNITS) < 256:
        _UNITS[rate_unit] = unit
    return unit


def _unit_of(rate_unit: str) -> Optional[str]:
    if rate_unit.startswith("s/"):
        return rate_unit[2:] or None
    if rate_unit.endswith("/s"):
        return rate_unit[:-2] or None
    return None
