"""Logger headers: the level, time and source that loggers repeat at the start of every line.

Recognised, tried cheapest first:

* vLLM: ``INFO 11-30 01:28:09 [api_utils.py:286] msg`` (also with a year and milliseconds; before 0.6 without
  the opening bracket: ``ERROR 07-13 02:56:30 worker.py:120] msg``);
* glog / c10: ``[W1130 01:28:53.967426244 utils.cpp:68] msg`` and ``W1130 01:28:53.967 12 file.cc:68] msg``;
* Python ``logging`` with a time first: ``2026-11-30 03:06:58,935 - INFO - autotuner.py:651 - msg``,
  ``2024-01-01 12:00:00,123 - name - ERROR - msg``, ``2024-01-01 12:00:00 ERROR msg``, with a pid after the level
  (``... ERROR 56542 [file.py:64] msg``), a name before it (``[...] LMCache ERROR: msg``), Ray's
  ``... ERROR worker.py:433 -- msg``; loguru's
  ``2024-05-01 12:00:00.123 | ERROR    | module:func:42 - msg``;
* ``logging.basicConfig``: ``WARNING:root:msg``; uvicorn: ``INFO:     127.0.0.1:5000 - "POST /v1/completions"``;
* ``warnings``: ``/path/x.py:138: FutureWarning: msg`` (level WARNING, source ``x.py:138``);
* pytest's ``E`` column: ``E       RuntimeError: msg`` and each line of the message after it, ``E       more``
  (``E`` and at least three spaces, as pytest writes it, or an ``E`` alone for a blank line of the message): level
  ERROR, source ``pytest``, so that the lines of one exception are one record, as a logger's are. The column's
  spaces are all taken (pytest indents the exception like the source line above it).

``parse_header`` returns ``(level, time, source, offset)`` where ``offset`` is where the message starts (one
space after the header is consumed, the message's own indentation is kept), or None.
"""

from __future__ import annotations

import re
from typing import Optional

LEVELS = {
    "DEBUG": "DEBUG",
    "INFO": "INFO",
    "WARNING": "WARNING",
    "WARN": "WARNING",
    "ERROR": "ERROR",
    "CRITICAL": "CRITICAL",
    "FATAL": "CRITICAL",
}
_GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}

_LEVEL_ALT = "DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"
# vLLM's header in one match: level, time, source; the message starts at .end().
VLLM_HEADER = re.compile(
    r"(" + _LEVEL_ALT + r") ((?:\d{4}-)?\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?) \[([^\]\n]{1,200})\] ?"
)
# vLLM before 0.6 had no bracket before the source: "ERROR 07-13 02:56:30 multiproc_worker_utils.py:120] msg".
_VLLM_OLD = re.compile(
    r"(" + _LEVEL_ALT + r") ((?:\d{4}-)?\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?) ([\w.\-/]+:\d+)\] ?"
)
# torch's glog lines print the month without a leading zero: "[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607]".
_GLOG = re.compile(
    r"\[?(?P<lv>[IWEF])(?P<date>\d{3,4}) (?P<time>\d\d:\d\d:\d\d(?:\.\d+)?)\s+(?:\d+\s+)?(?P<src>[\w.\-/]+:\d+)\] ?"
)
# Older torch: "[E ProcessGroupNCCL.cpp:737] msg", "[W socket.cpp:601] msg" (no date, no time).
_GLOG_BARE = re.compile(r"\[(?P<lv>[IWEF]) (?P<src>[\w.\-/]+:\d+)\] ?")
_TIME_FIRST = re.compile(
    r"\[?(?P<time>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?"
    r"(?:"
    r"\s+-\s+(?:(?P<name1>[^\s]+)\s+-\s+)?(?P<lv1>" + _LEVEL_ALT + r")\s+-\s+(?:(?P<src1>[\w.\-/]+:\d+)\s+-\s+)?"
    r"|"
    # "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] msg" (a pid after the level),
    # "[2026-03-27 10:26:01,148] LMCache ERROR: msg" (a name before it),
    # "2025-12-03 18:28:56,195\tERROR worker.py:433 -- msg" (Ray's form)
    r"\s+(?:[A-Z][\w.\-]{1,30}\s+)??\[?(?P<lv2>" + _LEVEL_ALT + r")\]?:?\s+(?:\d{1,8}\s+(?=\[))?"
    # DeepSpeed's "[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] msg" names the function too
    r"(?:\[(?P<src2>[\w.\-/]+:\d+(?::[\w<>]+)?)\] ?|(?P<src4>[\w.\-/]+:\d+) -- )?"
    r"|"
    r" \| (?P<lv3>" + _LEVEL_ALT + r"|SUCCESS|TRACE) *\| (?P<src3>[\w.<>\-]+:[\w.<>\-]+:\d+) - "
    r")"
)
_BASIC = re.compile(r"(?P<lv>" + _LEVEL_ALT + r"):(?:(?P<name>[\w.\-]+):|\s{2,})")
_PYWARN = re.compile(r"(?P<path>[^\s:][^:]*\.py):(?P<line>\d+): (?P<cat>[A-Z]\w*Warning): ")

Header = tuple[Optional[str], Optional[str], Optional[str], int]
PYTEST_SOURCE = "pytest"


def parse_header(text: str) -> Optional[Header]:
    first = text[:1]
    if not first:
        return None
    if first in "DIWECF":
        found = _vllm(text)
        if found is not None:
            return found
        basic = _BASIC.match(text)
        if basic:
            return LEVELS[basic.group("lv")], None, basic.group("name"), basic.end()
        glog = _GLOG.match(text)
        if glog:
            return _glog(glog)
        if first == "E" and (text[1:4] == "   " or (len(text) <= 8 and not text[1:].strip())):
            return _pytest(text)
        return _pywarn(text)
    if first == "[":
        glog = _GLOG.match(text)
        if glog:
            return _glog(glog)
        bare = _GLOG_BARE.match(text)
        if bare:
            return _GLOG_LEVELS[bare.group("lv")], None, bare.group("src"), bare.end()
        timed = _TIME_FIRST.match(text)
        if timed:
            return _timed(timed)
        return None
    if "0" <= first <= "9":
        timed = _TIME_FIRST.match(text)
        if timed:
            return _timed(timed)
        return None
    if "Warning: " in text:
        return _pywarn(text)
    return None


def _vllm(text: str) -> Optional[Header]:
    found = VLLM_HEADER.match(text)
    if found is None:
        found = _VLLM_OLD.match(text)
    if found is None:
        return None
    level, time, source = found.groups()
    return LEVELS[level], time, source, found.end()


def _glog(found: re.Match[str]) -> Header:
    time = f"{found.group('date')} {found.group('time')}"
    return _GLOG_LEVELS[found.group("lv")], time, found.group("src"), found.end()


_LOGURU_LEVELS = {"SUCCESS": "INFO", "TRACE": "DEBUG"}


def _timed(found: re.Match[str]) -> Header:
    level = found.group("lv1") or found.group("lv2") or found.group("lv3")
    source = (found.group("src1") or found.group("src2") or found.group("src3") or found.group("src4")
              or found.group("name1"))
    return LEVELS.get(level) or _LOGURU_LEVELS[level], found.group("time"), source, found.end()


def _pytest(text: str) -> Header:
    """pytest's ``E`` column in front of an exception's lines (``E   `` at least; nothing else starts so)."""
    start = 1
    while text[start:start + 1] == " ":
        start += 1
    return "ERROR", None, PYTEST_SOURCE, start


def _pywarn(text: str) -> Optional[Header]:
    if "Warning: " not in text:
        return None
    found = _PYWARN.match(text)
    if not found:
        return None
    source = f"{found.group('path').rsplit('/', 1)[-1]}:{found.group('line')}"
    # The category stays in the message: "FutureWarning: ..." says what kind of warning it is.
    return "WARNING", None, source, found.start("cat")
