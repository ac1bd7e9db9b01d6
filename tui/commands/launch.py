"""``eaglewatch launch HOST -- CMD...``: start a job on the host, detached; print its run id.

Opening the dashboard on the new run (a terminal, no --no-tui) is the dashboard's part: ``eaglewatch launch`` is
routed to ``eaglewatch.tui.app.launch``, which uses :func:`command_of` and :func:`start` from here. This module
knows nothing of the dashboard."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, cast

from eaglewatch.errors import UserError
from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common
from eaglewatch.tui.messages import RunSummary

if TYPE_CHECKING:
    from eaglewatch.tui.connection import Connection

HELP = "start a command on a host as a supervised run that outlives this terminal"


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=None, help="a name for the run (any text; its id stays a safe file name)")
    parser.add_argument("--cwd", default=None, help="working directory on the host (default: the agent's, ~ over SSH)")
    parser.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment variable for the job; repeat for several")
    parser.add_argument("--installed", action="store_true",
                        help="run the host's installed eaglewatch (default: the copy that travels with the agent, "
                             "under the host's Python with vLLM)")
    parser.add_argument("--attach", action="store_true", help="stream the run's log until it ends")
    parser.add_argument("--json", action="store_true", help="print the run's summary as JSON")
    parser.add_argument("--no-tui", action="store_true",
                        help="print the run id and return, even on a terminal (where the dashboard opens otherwise)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common.add_host_arguments(parser)
    add_options(parser)
    parser.add_argument("cmd_argv", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the command and arguments")


def command_of(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command after ``--`` and the ``--env`` pairs, or a UserError before anything connects."""
    argv = _common.split_command(args, add_options)
    if not argv:
        raise UserError(f"give the command after --, e.g. {_common.command_prefix()} launch HOST -- eaglewatch extract "
                        "...")
    return argv, _common.parse_env(args.env)


def start(connection: "Connection", args: argparse.Namespace, argv: list[str], env: dict[str, str]) -> RunSummary:
    """Launch the run; its id (or, with --json, its summary) goes to stdout, where it runs to stderr."""
    target = _common.resolve_host(args)
    summary = _common.agent_call(connection.launch, argv, cwd=args.cwd, env=env, name=args.name,
                                 python=target.named_python, installed=bool(getattr(args, "installed", False)),
                                 alerts=target.alerts)
    if args.json:
        print(json.dumps(summary, ensure_ascii=True))
    else:
        print(safe_text(summary["run"]))
    print(f"eaglewatch: launched {safe_text(summary['run'])} on {safe_text(args.host)} "
          f"(pid {safe_text(summary.get('pid'))}, {safe_text(summary.get('run_dir'))})", file=sys.stderr)
    cwd = cast(dict[str, Any], summary).get("cwd")
    if cwd:
        # Where the command's relative paths start: the host's home unless --cwd said otherwise.
        why = "" if args.cwd else (" (no --cwd: the agent's, the home directory over SSH; the command's relative "
                                   "paths start there)")
        print(f"eaglewatch: it runs in {safe_text(cwd)}{why}", file=sys.stderr)
    dashboard_opens = not (args.no_tui or args.json or args.attach) and sys.stdin.isatty() and sys.stdout.isatty()
    if not args.attach and not dashboard_opens:
        follow_it = _common.hint_command("attach", args.host, summary["run"], *_common.where_options(args))
        print(f"eaglewatch: follow it: {follow_it}", file=sys.stderr)
    job: dict[str, Any] = cast(dict[str, Any], summary).get("job") or {}  # which Python and eaglewatch ran it
    if job.get("python"):
        print(f"eaglewatch: the job runs {safe_text(job.get('eaglewatch'))} eaglewatch with {safe_text(job['python'])} "
              f"({safe_text(job.get('python_found_by'))}: {safe_text(job.get('python_has'))})", file=sys.stderr)
    sys.stdout.flush()
    return summary


def run(args: argparse.Namespace) -> int:
    """Launch and print the run id; with --attach, stream its log until it ends."""
    argv, env = command_of(args)
    connection = _common.connect(args)
    try:
        summary = start(connection, args, argv, env)
        if args.attach:
            from eaglewatch.tui.commands.attach import follow

            return follow(connection, summary["run"], from_end=False, show_events=False, host=args.host,
                          hint_options=_common.where_options(args))
        return 0
    finally:
        _common.close_quietly(connection)
