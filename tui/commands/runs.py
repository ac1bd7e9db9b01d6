"""``eaglewatch runs HOST``: the runs under the host's run root, newest first, with their state."""

from __future__ import annotations

import argparse
import json
import shlex
import time

from eaglewatch.tui.commands import _common

HELP = "list the runs on a host with their state"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common.add_host_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON summary per line")


def _clip(text: str, width: int) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def run(args: argparse.Namespace) -> int:
    connection = _common.connect(args)
    try:
        runs = _common.agent_call(connection.runs)
    finally:
        _common.close_quietly(connection)
    if args.json:
        for summary in runs:
            print(json.dumps(summary, ensure_ascii=False))
        return 0
    if not runs:
        print("no runs")
        return 0
    print(f"{'RUN':<36} {'STATE':<8} {'RESULT':<18} {'STARTED':<19} {'NAME':<20} COMMAND")
    for summary in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(summary.get("started_at") or 0))
        result = _common.describe_exit(summary) if summary.get("state") == "exited" else ""
        if summary.get("restart_of"):
            result = (result + " " if result else "") + "(restart)"
        command = shlex.join(summary.get("argv") or [])
        print(f"{summary['run']:<36} {summary['state']:<8} {result:<18} {started:<19} "
              f"{_clip(summary.get('name') or '', 20):<20} {_clip(command, 60)}")
    return 0
