"""The ``eaglewatch`` command.

Each subcommand lives in its own module that exposes ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Those modules keep heavy imports (torch, transformers, vLLM, Textual, paramiko)
inside their functions, and only the chosen subcommand's module is imported, so that ``eaglewatch decode``
starts fast on a machine that has none of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import NoReturn, Sequence

from eaglewatch import __version__
from eaglewatch.errors import UserError
from eaglewatch.safetext import SafeTextIO, safe_text

COMMANDS: dict[str, str] = {
    "prepare": "eaglewatch.pipeline.prepare",
    "extract": "eaglewatch.pipeline.extract",
    "verify": "eaglewatch.pipeline.verify",
    "export": "eaglewatch.pipeline.export",
    "preflight": "eaglewatch.pipeline.preflight.cli",
    "make-tiny-model": "eaglewatch.pipeline.tiny_model",
    "decode": "eaglewatch.decode.cli",
    "demo": "eaglewatch.demo",
    "launch": "eaglewatch.tui.app.launch",  # the host command, plus the dashboard on a terminal
    "runs": "eaglewatch.tui.commands.runs",
    "attach": "eaglewatch.tui.commands.attach",
    "stop": "eaglewatch.tui.commands.stop",
    "restart": "eaglewatch.tui.commands.restart",
    "stacks": "eaglewatch.tui.commands.stacks",
    "job": "eaglewatch.tui.app.job",  # the job commands, plus the fleet view on a terminal
    "agent": "eaglewatch.pipeline.agent.cli",
    "dashboard": "eaglewatch.tui.app.cli",
}


# The commands that print what outside files hold (file and folder names, config and manifest fields, log lines)
# as plain lines: their stdout and stderr pass every write through the one gate (safetext.SafeTextIO).
GATED = frozenset({"verify", "export", "preflight", "decode", "runs", "stop", "restart", "stacks",
                   "make-tiny-model"})
# The others, each with why it is not behind the gate and how its outside text is made safe instead
# (tests/test_hostile_every_command.py checks that every command is in one of the two).
UNGATED: dict[str, str] = {
    "extract": "its stderr is the job's log, progress bars' \\r and all, which the decoder reads; its own lines "
               "quote outside data through safe_text",
    "prepare": "its stderr is a job's log too; skip reasons and errors quote the input through safe_text",
    "demo": "the dashboard on a terminal (Textual draws the screen); the job's log reaches it through the decoder",
    "launch": "the dashboard on a terminal; the host's words are printed through safe_text",
    "attach": "writes the log's bytes, through safetext.TerminalStream (SGR colour kept, every other sequence shown)",
    "job": "the fleet view on a terminal; job records and host words are printed through safe_text",
    "agent": "its stdout is the protocol channel to the operator side, which shows nothing unchecked",
    "dashboard": "Textual draws the screen; every outside string is shown through safe_text and markup escaping",
}


class _Parser(argparse.ArgumentParser):
    """argparse, with its error line (which quotes what was typed or pasted) through the gate, for every command."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {safe_text(message)}\n")


def _load(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="eaglewatch",
        description="Run, watch and restart EAGLE-3 hidden-state extraction jobs.",
    )
    parser.add_argument("--version", action="version", version=f"eaglewatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if only is not None and name != only:
            continue
        try:
            module = _load(name)
        except ImportError:
            # A module that is not there yet (or whose light imports fail) must not break the others.
            if only is not None:
                raise
            continue
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        # No arguments: the local demo, which opens the dashboard on it when this is a terminal.
        argv = ["demo"]
    elif argv[0] not in COMMANDS and not argv[0].startswith("-"):
        # `eaglewatch HOST [RUN]`: the dashboard on that host.
        argv = ["dashboard", *argv]
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    if chosen in GATED:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = SafeTextIO(sys.stdout), SafeTextIO(sys.stderr)
        try:
            return _main(argv, chosen)
        finally:
            sys.stdout, sys.stderr = saved
    return _main(argv, chosen)


def _main(argv: list[str], chosen: str | None) -> int:
    parser = build_parser(only=chosen)
    args = parser.parse_args(argv)
    if getattr(args, "_module", None) is None:
        # Only options and no subcommand: the local demo, with them.
        args = parser.parse_args(["demo", *argv])
    try:
        return int(args._module.run(args) or 0)
    except UserError as exc:
        # Error text quotes paths, config fields and engine output: through the gate, whatever the command.
        print(f"eaglewatch {args.command}: error: {safe_text(exc, keep=chr(10))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"eaglewatch {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
