"""Logger headers become the level, time and source of an event."""

from __future__ import annotations

import logging

import pytest

from eaglewatch.decode.header import parse_header


@pytest.mark.parametrize(
    ("line", "level", "time", "source", "message"),
    [
        ("INFO 11-30 01:28:09 [api_utils.py:286] non-default args", "INFO", "11-30 01:28:09", "api_utils.py:286",
         "non-default args"),
        ("ERROR 2026-05-14 05:25:28.876 [core.py:1123] EngineCore failed", "ERROR", "2026-05-14 05:25:28.876",
         "core.py:1123", "EngineCore failed"),
        ("WARN 11-30 01:29:02 [x.py:1] careful", "WARNING", "11-30 01:29:02", "x.py:1", "careful"),
        # The message's own indentation survives: traceback frames start with two spaces.
        ('ERROR 11-30 01:29:02 [multiproc_executor.py:1063]   File "a.py", line 1, in f', "ERROR",
         "11-30 01:29:02", "multiproc_executor.py:1063", '  File "a.py", line 1, in f'),
        ("ERROR 11-30 01:29:02 [multiproc_executor.py:1063] ", "ERROR", "11-30 01:29:02",
         "multiproc_executor.py:1063", ""),
        ("[W1130 01:28:53.967426244 utils.cpp:68] Warning: NUMA binding", "WARNING", "1130 01:28:53.967426244",
         "utils.cpp:68", "Warning: NUMA binding"),
        ("E0101 12:00:00.123456 4242 socket.cpp:99] connect failed", "ERROR", "0101 12:00:00.123456",
         "socket.cpp:99", "connect failed"),
        ("2026-11-30 03:06:58,935 - INFO - autotuner.py:651 - flashinfer.jit: start", "INFO",
         "2026-11-30 03:06:58,935", "autotuner.py:651", "flashinfer.jit: start"),
        ("2024-01-01 12:00:00,123 - mylogger - ERROR - boom", "ERROR", "2024-01-01 12:00:00,123", "mylogger",
         "boom"),
        ("2024-01-01T12:00:00Z ERROR boom", "ERROR", "2024-01-01T12:00:00Z", None, "boom"),
        ("WARNING:root:low disk", "WARNING", None, "root", "low disk"),
        ('INFO:     127.0.0.1:50312 - "POST /v1/completions HTTP/1.1" 200 OK', "INFO", None, None,
         '127.0.0.1:50312 - "POST /v1/completions HTTP/1.1" 200 OK'),
        ("2024-05-01 12:00:00.123 | ERROR    | eaglewatch.agent:run:42 - lost the job", "ERROR",
         "2024-05-01 12:00:00.123", "eaglewatch.agent:run:42", "lost the job"),
        ("/opt/venv/lib/python3.11/site-packages/x/y.py:138: FutureWarning: deprecated", "WARNING", None,
         "y.py:138", "FutureWarning: deprecated"),
    ],
)
def test_header_forms(line: str, level: str, time: str, source: str, message: str) -> None:
    header = parse_header(line)
    assert header is not None
    got_level, got_time, got_source, offset = header
    assert (got_level, got_time, got_source, line[offset:]) == (level, time, source, message)


@pytest.mark.parametrize(
    "line",
    ["INFO is not a header", "Traceback (most recent call last):", "Information: x", "[probe] took 1s",
     "  File \"x.py\", line 1, in f", "", "Exception: WorkerProc initialization failed"],
)
def test_lines_without_header(line: str) -> None:
    assert parse_header(line) is None


def test_real_logging_basicconfig_format() -> None:
    record = logging.LogRecord("eaglewatch.pipeline", logging.ERROR, "extract.py", 12, "disk full", None, None)
    line = logging.Formatter(logging.BASIC_FORMAT).format(record)
    level, _time, source, offset = parse_header(line)  # type: ignore[misc]
    assert (level, source, line[offset:]) == ("ERROR", "eaglewatch.pipeline", "disk full")
