"""Short human forms of sizes, durations, rates, bars and sparklines. Plain text, no Textual."""

from __future__ import annotations

import shlex
import time
from typing import Optional, Sequence

_SPARKS = " ▁▂▃▄▅▆▇█"
_BLOCKS = " ▏▎▍▌▋▊▉█"


def fmt_bytes(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def fmt_gb(value: Optional[float]) -> str:
    """Gibibytes, the one unit of the dashboard for memory and disk: nvidia-smi counts GPU memory in MiB and
    ``df -h``/``free -h`` count in binary units, so the figures read the same as theirs."""
    return "n/a" if value is None else f"{value / 2**30:.1f} GiB"


def fmt_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(max(0.0, seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def fmt_count(value: Optional[float]) -> str:
    if value is None:
        return "?"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def fmt_rate(per_second: Optional[float], unit: str = "it") -> str:
    if per_second is None:
        return "?"
    if per_second >= 1000:
        return f"{per_second / 1000:.1f}k {unit}/s"
    if per_second >= 1 or per_second == 0:
        return f"{per_second:.1f} {unit}/s"
    return f"{1 / per_second:.1f} s/{unit}"


def bar(fraction: Optional[float], width: int) -> str:
    """A bar of ``width`` cells with eighth-cell resolution; blank for an unknown fraction."""
    if width <= 0:
        return ""
    if fraction is None:
        return "·" * width
    fraction = min(1.0, max(0.0, fraction))
    eighths = int(round(fraction * width * 8))
    full, part = divmod(eighths, 8)
    text = "█" * full + (_BLOCKS[part] if part and full < width else "")
    return text.ljust(width)


def sparkline(values: Sequence[float], width: int, top: float = 1.0) -> str:
    """The last ``width`` values as block characters, scaled to ``top``."""
    if width <= 0:
        return ""
    values = list(values)[-width:]
    out = []
    for value in values:
        level = 0 if top <= 0 else int(round(min(1.0, max(0.0, value / top)) * (len(_SPARKS) - 1)))
        out.append(_SPARKS[level])
    return "".join(out).rjust(width)


def fmt_argv(argv: object) -> str:
    """A run's arguments as one shell-quoted line, whatever the host sent (a list of anything, or one string).
    The line is not yet safe for a terminal: show it through ``eaglewatch.safetext.safe_text``."""
    if isinstance(argv, (list, tuple)):
        return shlex.join(str(word) for word in argv)
    return "" if argv is None else str(argv)


def fmt_started(started_at: object, pattern: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A run's start (epoch seconds) in local time; "?" for anything that is not a time."""
    try:
        return time.strftime(pattern, time.localtime(float(started_at)))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def fmt_age(seconds: Optional[float]) -> str:
    """How long ago, in the one unit that matters, as k9s and ps print it: ``45s``, ``5m``, ``2h``, ``3d``; "?"
    for an unknown time."""
    if seconds is None:
        return "?"
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


GIB = 1024 ** 3


def fmt_gib_used(used: Optional[float], total: Optional[float]) -> str:
    """Used over total, both in GiB, whole numbers, the unit once: ``29/140 GiB``; "n/a" when either is unknown."""
    if used is None or not total:
        return "n/a"
    return f"{used / GIB:.0f}/{total / GIB:.0f} GiB"
