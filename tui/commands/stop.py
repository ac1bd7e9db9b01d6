"""``eaglewatch stop HOST RUN``: SIGTERM the run's process group, SIGKILL it after a grace period.

The agent records the stop as the operator's (``stop.json`` before the signal, ``stopped`` in exit.json), so the
line printed reads ``stopped by the operator (SIGTERM)``, not ``killed by SIGTERM`` as a kill from outside would."""

from __future__ import annotations

import argparse

from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common

HELP = "stop a run: SIGTERM its whole process group, then SIGKILL after a grace period"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common.add_host_arguments(parser)
    parser.add_argument("run", metavar="RUN", help="run id, a unique prefix of it, or the run's name")
    parser.add_argument("--grace", type=_common.seconds, default=10.0,
                        help="seconds between SIGTERM and SIGKILL (%(default)s)")


def run(args: argparse.Namespace) -> int:
    connection = _common.connect(args)
    try:
        summary = _common.agent_call(connection.stop, args.run, grace_s=args.grace)
    finally:
        _common.close_quietly(connection)
    print(f"{safe_text(summary['run'])}\t{_common.describe_exit(summary)}")
    return 0
