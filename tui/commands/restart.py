"""``eaglewatch restart HOST RUN [-- NEW ARGS...]``: stop a run, wait for its processes and GPU memory to be
released, and launch the same command (or the new one) as a new run linked to the old."""

from __future__ import annotations

import argparse
import sys

from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common

HELP = "stop a run and start its command again as a new run (optionally with new arguments)"


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grace", type=_common.seconds, default=10.0,
                        help="seconds between SIGTERM and SIGKILL (%(default)s)")
    parser.add_argument("--gpu-timeout", type=_common.seconds, default=120.0,
                        help="how long to wait for the old run's GPU memory to be freed (%(default)s s)")
    parser.add_argument("--attach", action="store_true", help="stream the new run's log until it ends")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common.add_host_arguments(parser)
    parser.add_argument("run", metavar="RUN", help="run id, a unique prefix of it, or the run's name")
    add_options(parser)
    parser.add_argument("cmd_argv", nargs=argparse.REMAINDER, metavar="-- CMD...",
                        help="a replacement command line (default: the old run's)")


def run(args: argparse.Namespace) -> int:
    argv = _common.split_command(args, add_options) or None
    connection = _common.connect(args)
    try:
        result = _common.agent_call(connection.restart, args.run, argv, grace_s=args.grace,
                                    gpu_timeout_s=args.gpu_timeout)
        old, new = result["old"], result["new"]
        print(safe_text(new["run"]))
        print(f"eaglewatch: {safe_text(old['run'])} {_common.describe_exit(old)}; restarted as "
              f"{safe_text(new['run'])}", file=sys.stderr)
        sys.stdout.flush()
        if args.attach:
            from eaglewatch.tui.commands.attach import follow

            return follow(connection, new["run"], from_end=False, show_events=False)
        return 0
    finally:
        _common.close_quietly(connection)
