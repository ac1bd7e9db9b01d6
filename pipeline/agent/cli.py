"""``eaglewatch agent``: the host side of remote supervision.

``serve`` speaks the agent protocol on stdin/stdout (this is what the operator side starts over SSH, or as a local
subprocess); ``runs`` prints the runs under the run root for someone logged in on the host; ``supervise`` is the
internal entry of the per-run supervisor process.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

HELP = "host side of remote supervision: speak the agent protocol on stdio, or list runs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="agent_command", metavar="ACTION")
    serve = sub.add_parser("serve", help="speak the JSON-lines agent protocol on stdin/stdout")
    serve.add_argument("--run-root", default=None, help="folder holding the run directories "
                       "(default: $EAGLEWATCH_RUN_ROOT or ~/.eaglewatch/runs)")
    serve.add_argument("--protocol", type=int, default=None,
                       help="the protocol version the client speaks; refused when unknown")
    serve.add_argument("--idle-exit", type=float, default=None,
                       help="exit after this many seconds without a command (0: never)")
    runs = sub.add_parser("runs", help="list the runs under the run root")
    runs.add_argument("--run-root", default=None)
    supervise = sub.add_parser("supervise", help=argparse.SUPPRESS)
    supervise.add_argument("run_dir")


def run(args: argparse.Namespace) -> int:
    from eaglewatch import protocol as p
    from eaglewatch.pipeline.agent.rundir import resolve_run_root

    action = getattr(args, "agent_command", None)
    if action == "supervise":
        from eaglewatch.pipeline.agent.supervise import supervise

        return supervise(Path(args.run_dir))
    if action == "runs":
        from eaglewatch.pipeline.agent.jobs import list_runs

        from eaglewatch.safetext import safe_text

        for summary in list_runs(resolve_run_root(args.run_root)):
            exit_info = summary["exit"] if isinstance(summary["exit"], dict) else {}
            how = exit_info.get("signal_name") or exit_info.get("code")
            if how is None and summary.get("run_dir_gone"):
                how = "run directory gone"
            # Names and exit records are whatever the run's launcher wrote: never raw to the terminal.
            print("\t".join(safe_text(field) for field in (summary["run"], summary["state"], how, summary["name"])))
        return 0
    if action != "serve":
        print("eaglewatch agent: choose an action: serve, runs", file=sys.stderr)
        return 2
    if args.protocol is not None and args.protocol not in p.SUPPORTED_VERSIONS:
        print(
            f"eaglewatch agent: the client speaks protocol {args.protocol}, this agent reads "
            f"{sorted(p.SUPPORTED_VERSIONS)}; use the same eaglewatch version on both sides",
            file=sys.stderr,
        )
        return 3
    from eaglewatch.pipeline.agent.server import Server

    # The protocol owns fd 1. Anything else that prints (a library, a warning) goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    idle = p.AGENT_IDLE_EXIT_S if args.idle_exit is None else args.idle_exit
    server = Server(resolve_run_root(args.run_root), sys.stdin.buffer, out, idle_exit_s=idle)
    return server.serve()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry for ``python -m eaglewatch.pipeline.agent`` and for the uploaded zipapp."""
    parser = argparse.ArgumentParser(prog="eaglewatch agent", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(sys.argv[1:] if argv is None else list(argv)))
