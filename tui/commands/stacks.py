"""``eaglewatch stacks HOST RUN``: where every process of a run is, now: the Python stack of each thread, labelled
by rank and role, identical stacks grouped and the frame where the groups part marked.

The agent asks the run's processes (pipeline/agent/stacks.py: faulthandler on a signal, py-spy, /proc); grouping and
the text are decode/stackgroups.py's, the same the stall alert sends. ``--saved`` shows the stacks its supervisor
took when the run stalled, without asking again; ``--json`` prints what the agent sent."""

from __future__ import annotations

import argparse
import json

from eaglewatch.decode.stackgroups import report
from eaglewatch.tui.commands import _common

HELP = "print where every process of a run is (Python stacks of all threads, grouped by rank)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common.add_host_arguments(parser)
    parser.add_argument("run", metavar="RUN", help="run id, a unique prefix of it, or the run's name")
    parser.add_argument("--all-threads", action="store_true", help="print every thread's stack, not the main ones")
    parser.add_argument("--saved", action="store_true",
                        help="the stacks taken at the run's last stall (by its supervisor), not new ones")
    parser.add_argument("--json", action="store_true", help="the agent's record, as JSON")


def run(args: argparse.Namespace) -> int:
    connection = _common.connect(args)
    try:
        taken = _common.agent_call(connection.stacks, args.run, saved=args.saved)
    finally:
        _common.close_quietly(connection)
    if args.json:
        print(json.dumps(taken, indent=1))
        return 0
    for line in report(taken, all_threads=args.all_threads):
        print(line)
    return 0
