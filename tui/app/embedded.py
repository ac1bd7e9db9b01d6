"""The embedded default: ``eaglewatch`` (or ``eaglewatch demo``) on a terminal runs the demo as a supervised
local run and opens the dashboard on it. ``q`` leaves it running; ``eaglewatch local`` finds it again."""

from __future__ import annotations

import argparse
import os
import sys

from eaglewatch.errors import UserError


def demo_argv(args: argparse.Namespace) -> list[str]:
    """The job: the same demo, printing its steps, always fresh so that there is something to watch."""
    argv = [sys.executable, "-m", "eaglewatch", "demo", "--no-tui", "--fresh",
            "--workdir", os.path.abspath(os.path.expanduser(args.workdir)),
            "--engine", args.engine, "--tp-size", str(args.tp_size)]
    if args.fault:
        argv.append("--fault")
    return argv


def run_demo_dashboard(args: argparse.Namespace) -> int:
    from eaglewatch.tui.app.cli import open_run
    from eaglewatch.tui.connection import Connection, ConnectionFailed

    connection = Connection("local")
    try:
        connection.connect()
    except ConnectionFailed as exc:
        raise UserError(f"cannot start the local agent: {exc}") from None
    try:
        summary = connection.launch(demo_argv(args), cwd=os.getcwd(), name="demo-fault" if args.fault else "demo")
        return open_run(connection, summary["run"], "local")
    finally:
        connection.close()
