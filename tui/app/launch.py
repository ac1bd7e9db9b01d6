"""``eaglewatch launch HOST -- CMD...`` as the operator runs it: on a terminal, launch and open the dashboard on the
new run; otherwise (no terminal, ``--no-tui``, ``--json``, ``--attach``) exactly ``eaglewatch.tui.commands.launch``.

The dashboard builds on the host commands, never the other way round: this module imports the launch command, the
launch command imports nothing of the dashboard. Textual is imported only when the dashboard opens.
"""

from __future__ import annotations

import argparse

from eaglewatch.tui.commands import _common
from eaglewatch.tui.commands import launch as launch_command

HELP = launch_command.HELP
add_arguments = launch_command.add_arguments


def run(args: argparse.Namespace) -> int:
    from eaglewatch.tui.app.cli import interactive, open_run

    if args.no_tui or args.json or args.attach or not interactive():
        return launch_command.run(args)
    argv, env = launch_command.command_of(args)
    connection = _common.connect(args)
    try:
        summary = launch_command.start(connection, args, argv, env)
        return open_run(connection, summary["run"], args.host)
    finally:
        _common.close_quietly(connection)
