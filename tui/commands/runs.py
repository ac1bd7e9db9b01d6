"""``eaglewatch runs HOST``: the runs under the host's run root, newest first, with their state.

Every field comes from the host, where anyone who can start a run wrote it: the table shows each through
``eaglewatch.safetext.safe_text``, and ``--json`` is pure ASCII (``\\u`` escapes), so neither can drive the terminal.
"""

from __future__ import annotations

import argparse
import json

from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common
from eaglewatch.tui.messages import RunSummary
from eaglewatch.tui.runend import DIR_GONE_TEXT
from eaglewatch.tui.runstate.fmt import fmt_argv, fmt_started

HELP = "list the runs on a host with their state"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common.add_host_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON summary per line (ASCII, \\u escapes)")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


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


def row(summary: RunSummary) -> str:
    started = fmt_started(summary.get("started_at"))
    name = _clip(safe_text(summary.get("name")), 20)
    command = _clip(safe_text(fmt_argv(summary.get("argv"))), 60)
    return (f"{safe_text(summary.get('run')):<36} {safe_text(summary.get('state')):<8} {result_of(summary):<18} "
            f"{started:<19} {name:<20} {command}")


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
    print(f"{'RUN':<36} {'STATE':<8} {'RESULT':<18} {'STARTED':<19} {'NAME':<20} COMMAND")
    for summary in runs:
        print(row(summary))
    return 0
