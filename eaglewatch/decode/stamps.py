"""Loggers' timestamps as keys that sort in time, so that lines printed out of order can be put back in order.

Processes write to one log through their own buffers: a consequence (a worker that saw its peer die) can be
printed before the fatal line of the process that died first. Where the lines carry their times, the earlier
time is the earlier event. The forms read here are the loggers' own, as ``header.py`` and the one-line shapes
keep them: ``2022-06-21 19:14:10,710`` (Python logging, Ray's C++ logger), ``11-30 01:29:02`` (vLLM),
``1115 13:44:10.645040`` or ``321 02:07:08.40`` (glog: month and day, then the time). The year is left out
(vLLM and glog do not print it), and so is the zone: the key compares lines of one run.
"""

from __future__ import annotations

import re
from typing import Optional

TimeKey = tuple[int, int, int, int, int, float]

_DATED = re.compile(r"^(?:\d{4}-)?(?P<mo>\d\d)-(?P<d>\d\d)[ T](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d+))?")
_GLOG = re.compile(r"^(?P<mo>\d{1,2})(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?")


def time_key(stamp: Optional[str]) -> Optional[TimeKey]:
    """(month, day, hour, minute, second, fraction) of a logger's timestamp, or None for any other text."""
    if not stamp:
        return None
    found = _DATED.match(stamp) or _GLOG.match(stamp)
    if found is None:
        return None
    month, day = int(found.group("mo")), int(found.group("d"))
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    fraction = float(f"0.{found.group('f')}") if found.group("f") else 0.0
    return (month, day, int(found.group("h")), int(found.group("mi")), int(found.group("s")), fraction)
