"""``eaglewatch job ...`` as the operator runs it: ``watch`` opens the dashboard's fleet view on a job, and
``launch`` on a terminal launches, then opens it; everything else (and ``launch`` with ``--no-tui``, ``--json``, or
no terminal) is exactly ``eaglewatch.tui.commands.job``.

The dashboard builds on the host commands, never the other way round: this module imports the job command, the
job command imports nothing of the dashboard. Textual is imported only when the dashboard opens.
"""

from __future__ import annotations

import argparse
import sys

from eaglewatch.errors import UserError
from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common
from eaglewatch.tui.commands import job as job_command
from eaglewatch.tui.commands.job_hosts import HostPool
from eaglewatch.tui.commands.job_ops import JobOps
from eaglewatch.tui.commands.job_record import JobStore
from eaglewatch.tui.runstate.fleet import PENDING, RUNNING, FleetThresholds

HELP = job_command.HELP
add_arguments = job_command.add_arguments
DEFAULT_PENDING_AFTER_MIN = 10.0


def open_fleet(ops: JobOps, args: argparse.Namespace) -> int:
    """Run the dashboard on the job's fleet view until the operator leaves it; say what became of the job."""
    from eaglewatch.tui import config
    from eaglewatch.tui.app.app import DashboardApp
    from eaglewatch.tui.app.cli import run_app, thresholds_from

    cfg = config.load(args.config)
    pending_min = getattr(args, "pending_after", None) or DEFAULT_PENDING_AFTER_MIN
    # From here on the terminal is the dashboard's: a host connected later cannot ask about its key on it.
    ops.pool.interactive = False
    app = DashboardApp(str(ops.record.get("target") or "local"), job=ops,
                       read_only=bool(getattr(args, "read_only", False)),
                       thresholds=thresholds_from(cfg, getattr(args, "stall_after", None)),
                       fleet_thresholds=FleetThresholds(pending_after_s=pending_min * 60))
    code = run_app(app)
    result = app.return_value
    if isinstance(result, tuple) and len(result) == 4 and result[0] == "job":
        _, _, state, counts = result
        job = safe_text(ops.job)
        if state in (RUNNING, PENDING):
            print(f"eaglewatch: left the fleet view of job {job}; its ranks keep running. "
                  f"Watch again: {_common.hint_command('job', 'watch', ops.job)}", file=sys.stderr)
        else:
            print(f"eaglewatch: job {job} has ended ({counts}). "
                  f"Look again: {_common.hint_command('job', 'status', ops.job)}", file=sys.stderr)
    return code


def _connect_hosts(ops: JobOps) -> None:
    """Every host of the job, before the dashboard takes the terminal (an unknown host key is asked about here).
    A host that cannot be reached now does not keep the others from being watched: the view retries it."""
    for host in dict.fromkeys(ops.host_of(entry) for entry in ops.record.get("ranks") or []):
        try:
            ops.pool.get(host)
        except UserError as exc:
            print(f"eaglewatch: {safe_text(host)}: {exc}; its ranks show why, and it is tried again",
                  file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from eaglewatch.tui.app.cli import interactive

    if args.action == "watch":
        if not interactive():
            raise UserError("the fleet view needs a terminal; without one use "
                            f"`{_common.command_prefix()} job status JOB`")
        store = JobStore()
        ops, pool = job_command.open_ops(args, store)
        try:
            _connect_hosts(ops)
            return open_fleet(ops, args)
        finally:
            pool.close()
    if args.action == "launch" and not (args.no_tui or args.json) and interactive():
        argv, env = job_command.launch_request(args)
        store = JobStore()
        pool = HostPool(args)
        try:
            record = job_command.start(pool, store, args, argv, env)
            return open_fleet(JobOps(record, pool, store), args)
        finally:
            pool.close()
    return job_command.run(args)
