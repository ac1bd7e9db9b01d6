"""``eaglewatch runs HOST``: the runs under the host's run root, newest first, with their phase, progress and age.

Every field comes from the host, where anyone who can start a run wrote it: the table shows each through
``eaglewatch.safetext.safe_text``, and ``--json`` is pure ASCII (``\\u`` escapes), so neither can drive the terminal.

The columns' contents (:func:`phase_of`, :func:`progress_of`, :func:`age_of`, :func:`result_of`) are the runs
list's in the dashboard too, so a run reads the same in both.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import Mapping, Optional

from rich.cells import cell_len

from eaglewatch import protocol as p
from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common
from eaglewatch.tui.messages import RunSummary
from eaglewatch.tui.runend import DIR_GONE_TEXT, STOPPED_PHASE, run_end
from eaglewatch.tui.runstate.fmt import fmt_age, fmt_argv, fmt_count

HELP = "list the runs on a host with their phase, progress and age"

DONE, FAILED, STOPPED, LOST = p.PHASE_DONE, p.PHASE_FAILED, STOPPED_PHASE, "lost"
# The order of the PHASE column when the list is sorted by it: a run's life from start to end.
PHASE_ORDER = (p.JOB_STARTING, p.PHASE_VALIDATING, p.PHASE_LOADING, p.PHASE_EXTRACTING, p.JOB_RUNNING, DONE, STOPPED,
               FAILED, LOST)
NAME_MAX = 20
RESULT_MAX = 40
COMMAND_MAX = 100  # into a pipe; on a terminal, what is left of its width (at least COMMAND_MIN)
COMMAND_MIN = 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common.add_host_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON summary per line (ASCII, \\u escapes)")


def _clip(text: str, width: int) -> str:
    if cell_len(text) <= width:
        return text
    while text and cell_len(text) > width - 1:
        text = text[:-1]
    return text + "…"


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - cell_len(text))


def _count(value: object) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    try:
        return int(value)
    except (OverflowError, ValueError):
        return None


def _reported(summary: RunSummary, field: str) -> object:
    """``phase`` or ``progress`` of a summary: None from an agent older than these fields."""
    fields: Mapping[str, object] = summary
    return fields.get(field)


def phase_of(summary: RunSummary) -> str:
    """The PHASE column, safe for the terminal: for a run that ended, ``done``, ``stopped`` (by the operator) or
    ``failed`` as ``eaglewatch.tui.runend.run_end`` judges its end, ``lost`` for one that vanished; for a live one
    the pipeline's last phase when the agent reports it (``phase``), else its state (``starting``, ``running``)."""
    state = summary.get("state")
    end = run_end(state, summary.get("exit"), bool(summary.get("run_dir_gone")))
    if end is not None:
        if state == p.JOB_LOST:
            return LOST
        if end.stopped:
            return STOPPED
        return FAILED if end.failed else DONE
    phase = _reported(summary, "phase")
    if state == p.JOB_RUNNING and isinstance(phase, str) and phase in p.PHASES:
        return phase
    return safe_text(state) if state else "?"


def phase_rank(phase: str) -> int:
    """Where a phase sorts: in the order of a run's life, anything unknown last."""
    return PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER)


def progress_of(summary: RunSummary) -> tuple[Optional[int], Optional[int]]:
    """Samples done and total, from the pipeline's last ``progress`` event when the agent reports it
    (``progress: {done, total}``); None for what is not known."""
    progress = _reported(summary, "progress")
    if not isinstance(progress, dict):
        return None, None
    return _count(progress.get("done")), _count(progress.get("total"))


def progress_text(summary: RunSummary) -> str:
    done, total = progress_of(summary)
    if done is None and total is None:
        return "—"
    return f"{fmt_count(done)}/{fmt_count(total)}"


def progress_fraction(summary: RunSummary) -> Optional[float]:
    """How far along, for sorting: done over total, or None when that is not known."""
    done, total = progress_of(summary)
    if done is None or not total:
        return None
    return done / total


def age_of(summary: RunSummary, now: float) -> Optional[float]:
    """Seconds since the run started, by ``now`` (the operator's clock; a host's skew shows as 0, not below);
    None when the summary has no start time."""
    started = summary.get("started_at")
    if isinstance(started, bool) or not isinstance(started, (int, float)) or started != started:
        return None
    return max(0.0, now - float(started))


def age_text(summary: RunSummary, now: float) -> str:
    return fmt_age(age_of(summary, now))


def result_of(summary: RunSummary) -> str:
    """The RESULT column: how an exited run ended, that a running one lost its directory, that it is a restart."""
    state = summary.get("state")
    if state == "exited":
        result = _common.describe_exit(summary)
    elif state == "running" and summary.get("run_dir_gone"):
        result = DIR_GONE_TEXT
    elif state == "lost" and summary.get("run_dir_gone"):
        result = "run directory deleted"
    else:
        result = ""
    if summary.get("restart_of"):
        result = (result + " " if result else "") + "(restart)"
    return result


HEADERS = ("RUN", "NAME", "PHASE", "PROGRESS", "AGE", "RESULT", "COMMAND")


def cells(summary: RunSummary, now: float) -> tuple[str, ...]:
    """One line's cells, each safe for the terminal: the name and the result cut with an ellipsis, the command
    whole (``table`` fits it to the line)."""
    return (safe_text(summary.get("run")), _clip(safe_text(summary.get("name")), NAME_MAX), phase_of(summary),
            progress_text(summary), age_text(summary, now), _clip(result_of(summary), RESULT_MAX),
            safe_text(fmt_argv(summary.get("argv"))))


def table(runs: list[RunSummary], now: float, line_width: Optional[int] = None) -> list[str]:
    """The header and one line per run, every column but the last as wide as its widest cell; the command, last,
    cut with an ellipsis where the line would pass ``line_width`` (a terminal's; at least COMMAND_MIN of it), or
    at COMMAND_MAX."""
    rows = [HEADERS, *(cells(summary, now) for summary in runs)]
    widths = [max(cell_len(row[index]) for row in rows) for index in range(len(HEADERS) - 1)]
    used = sum(widths) + len(widths)
    command = COMMAND_MAX if line_width is None else max(COMMAND_MIN, line_width - used)
    return [" ".join([*(_pad(cell, width) for cell, width in zip(row, widths)), _clip(row[-1], command)]).rstrip()
            for row in rows]


def run(args: argparse.Namespace) -> int:
    connection = _common.connect(args)
    try:
        runs = _common.agent_call(connection.runs)
    finally:
        _common.close_quietly(connection)
    if args.json:
        for summary in runs:
            print(json.dumps(summary, ensure_ascii=True))
        return 0
    if not runs:
        print("no runs")
        return 0
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    for line in table(runs, time.time(), width):
        print(line)
    return 0
