"""``eaglewatch [dashboard] HOST [RUN]``: the dashboard. Textual is imported only when it opens."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Optional

from eaglewatch.errors import UserError
from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common

if TYPE_CHECKING:
    from eaglewatch.tui.app.app import DashboardApp
    from eaglewatch.tui.config import Config
    from eaglewatch.tui.connection import Connection
    from eaglewatch.tui.runstate import Thresholds

HELP = "open the dashboard: the runs on HOST (default: this machine), or one run live"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", metavar="HOST", nargs="?", default=None, help=_common.HOST_HELP)
    parser.add_argument("run", metavar="RUN", nargs="?", default=None,
                        help="attach to this run at once (id, unique prefix, or name)")
    parser.add_argument("--profile", default=None, help="launch this saved profile from the config file, then watch it")
    parser.add_argument("--read-only", action="store_true", help="refuse every key that would change a job")
    parser.add_argument("--stall-after", type=_common.positive, default=None, metavar="MIN",
                        help="alert when loading or extraction makes no progress for MIN minutes (default 5)")
    _common.add_connection_options(parser)  # --config among them


def interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def thresholds_from(cfg: "Config", stall_after_min: Optional[float]) -> "Thresholds":
    from eaglewatch.tui.runstate import Thresholds

    stall = stall_after_min * 60 if stall_after_min is not None else cfg.stall_after_s
    return Thresholds(stall_after_s=stall, low_disk_bytes=cfg.low_disk_bytes)


def run_app(app: "DashboardApp") -> int:
    """Run the dashboard; say what became of the run when it closes."""
    result = app.run()
    if isinstance(result, tuple):
        what, run, *rest = result
        host, run_id = safe_text(app.host), safe_text(run)
        if what == "detached" and run:
            print(f"eaglewatch: detached from {run_id} on {host}; it keeps running. "
                  f"Reattach: {_common.hint_command(app.host, run)}", file=sys.stderr)
        elif what == "left" and run:
            how = f" ({safe_text(rest[0])})" if rest and rest[0] else ""  # the run screen's RunView.exit_text
            print(f"eaglewatch: {run_id} on {host} has ended{how}. "
                  f"Look again: {_common.hint_command(app.host, run)}", file=sys.stderr)
        elif what == "stopped" and run:
            print(f"eaglewatch: stopped {run_id} on {host}", file=sys.stderr)
    return int(app.return_code or 0)


def open_run(connection: "Connection", run: str, host: str, read_only: bool = False,
             thresholds: "Optional[Thresholds]" = None) -> int:
    """Open the dashboard on ``run`` over an already connected ``connection`` (launch, demo); ``host`` is the name
    the operator gave it."""
    from eaglewatch.tui.app.app import DashboardApp
    from eaglewatch.tui.runstate import Thresholds

    app = DashboardApp(host, run=run, connection=connection, read_only=read_only,
                       thresholds=thresholds or Thresholds())
    return run_app(app)


def run(args: argparse.Namespace) -> int:
    from eaglewatch.tui import config

    if not interactive():
        raise UserError(f"the dashboard needs a terminal; without one use `{_common.command_prefix()} runs HOST` "
                        f"and `{_common.command_prefix()} attach HOST RUN`")
    cfg = config.load(args.config)
    launch = None
    host_name = args.host
    if args.profile:
        profile = cfg.profiles.get(args.profile)
        if profile is None:
            known = ", ".join(sorted(cfg.profiles)) or "none"
            where = cfg.path or "the config file"
            raise UserError(safe_text(f"no profile {args.profile!r} in {where} (known: {known})"))
        host_name = host_name or profile.host
        from eaglewatch.tui.app.app import LaunchRequest

        launch = LaunchRequest(profile.argv, profile.cwd, profile.env, profile.run_name or profile.name,
                               cfg.alerts_for(host_name or "local", profile))
    target = _common.resolve_host(args, host_name, cfg)
    from eaglewatch.tui.app.app import DashboardApp

    app = DashboardApp(target.name, target=target.spec, run=args.run, launch=launch,
                       connect_kwargs={"run_root": target.run_root, "ssh_options": target.ssh_options},
                       read_only=args.read_only, thresholds=thresholds_from(cfg, args.stall_after))
    return run_app(app)
