"""``eaglewatch job ...``: data-parallel jobs, one run per rank, over plain SSH or under Slurm (docs/fleet.md).

::

    eaglewatch job launch --hosts H1,H2,... [--name N --cwd DIR -e K=V --installed --json] -- CMD...
    eaglewatch job launch --slurm TARGET --ranks N [--partition P --account A --time T --gpus-per-task G
                          --cpus-per-task C --mem M --sbatch-arg X ...] -- CMD...
    eaglewatch job list [--slurm TARGET] [--json]
    eaglewatch job status JOB [--slurm TARGET] [--json]
    eaglewatch job cancel JOB [--slurm TARGET]
    eaglewatch job restart JOB RANK [--slurm TARGET]
    eaglewatch job watch JOB          # the dashboard's fleet view: eaglewatch.tui.app.job

Rank r runs ``CMD --rank r --world-size n``. Hosts are read as every command reads HOST (named hosts of the config
file included). Opening the dashboard (``watch``, and ``launch`` on a terminal) is the dashboard's part: ``eaglewatch
job`` is routed to ``eaglewatch.tui.app.job``, which uses this module; this module knows nothing of the dashboard.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from eaglewatch.errors import UserError
from eaglewatch.safetext import safe_text
from eaglewatch.tui.commands import _common
from eaglewatch.tui.commands.job_hosts import HostPool
from eaglewatch.tui.commands.job_ops import SSH, JobOps, launch_slurm, launch_ssh, open_job
from eaglewatch.tui.commands.job_record import JobStore, Record
from eaglewatch.tui.runstate.fleet import FleetModel, FleetView, RankRow
from eaglewatch.tui.runstate.fmt import fmt_started

HELP = "data-parallel jobs: one run per rank on a list of SSH hosts, or under Slurm"
ACTIONS = ("launch", "list", "status", "cancel", "restart", "watch")
SLURM_HELP = "the host whose agent submits to Slurm (a login node): a named host, an ssh alias, user@host, local"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 or more")
    return value


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("where the ranks run (one of)")
    where.add_argument("--hosts", default=None, metavar="H1,H2,...",
                       help="one rank per host, rank r on the r-th; a host may repeat ('local' too)")
    where.add_argument("--slurm", default=None, metavar="TARGET", help=SLURM_HELP)
    slurm = parser.add_argument_group("Slurm (with --slurm)")
    slurm.add_argument("--ranks", type=_positive_int, default=None, help="number of ranks (Slurm tasks)")
    slurm.add_argument("--partition", default=None)
    slurm.add_argument("--account", default=None)
    slurm.add_argument("--time", default=None, help="time limit, as sbatch takes it (e.g. 4:00:00)")
    slurm.add_argument("--gpus-per-task", type=_positive_int, default=None)
    slurm.add_argument("--cpus-per-task", type=_positive_int, default=None)
    slurm.add_argument("--mem", default=None, help="memory per node, as sbatch takes it (e.g. 200G)")
    slurm.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                       help="one more sbatch argument (e.g. --sbatch-arg=--qos=high); repeat for several")
    run = parser.add_argument_group("the runs")
    run.add_argument("--name", default=None, help="a name for the job (its ranks' runs are NAME-rankR)")
    run.add_argument("--cwd", default=None, help="working directory on the hosts (default: the agent's, ~ over SSH)")
    run.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE",
                     help="environment variable for every rank; repeat for several")
    run.add_argument("--installed", action="store_true",
                     help="run the hosts' installed eaglewatch (default: the copy that travels with the agent)")
    run.add_argument("--json", action="store_true", help="print the job's record as JSON")
    run.add_argument("--no-tui", action="store_true",
                     help="print the job id and return, even on a terminal (where the fleet view opens otherwise)")


def _add_slurm_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slurm", default=None, metavar="TARGET",
                        help="ask this host's agent (a Slurm job launched elsewhere; default: the record here)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    launch = actions.add_parser("launch", help="start one run per rank", description="start one run per rank: "
                                "CMD --rank r --world-size n, on --hosts or under --slurm")
    add_launch_options(launch)
    _common.add_connection_options(launch)
    launch.add_argument("cmd_argv", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the command and arguments")

    listing = actions.add_parser("list", help="the jobs launched from here, newest first")
    _add_slurm_target(listing)
    listing.add_argument("--json", action="store_true", help="one JSON record per line (ASCII, \\u escapes)")
    _common.add_connection_options(listing)

    for name, text in (("status", "every rank of a job: where, state, phase, how it ended"),
                       ("cancel", "stop every rank of a job"),
                       ("restart", "run one rank again; it resumes from its files"),
                       ("watch", "open the dashboard's fleet view on a job")):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument("job", metavar="JOB", help="a job id, a unique prefix of one, or a job's name")
        if name == "restart":
            action.add_argument("rank", metavar="RANK", type=int, help="the rank to run again")
        _add_slurm_target(action)
        if name == "status":
            action.add_argument("--json", action="store_true", help="the job's snapshot as JSON (ASCII)")
        if name == "watch":
            action.add_argument("--read-only", action="store_true", help="refuse the keys that would change a job")
            action.add_argument("--stall-after", type=_common.positive, default=None, metavar="MIN",
                                help="alert when a rank makes no progress for MIN minutes (default 5)")
            action.add_argument("--pending-after", type=_common.positive, default=None, metavar="MIN",
                                help="alert when a rank is pending for MIN minutes (default 10)")
        _common.add_connection_options(action)


# ---------------------------------------------------------------------- launch

def hosts_of(text: str) -> list[str]:
    hosts = [host.strip() for host in text.split(",")]
    if not hosts or any(not host for host in hosts):
        raise UserError(safe_text(f"--hosts takes host names separated by commas, not {text!r}"))
    return hosts


def launch_request(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command after ``--`` and the ``--env`` pairs, checked before anything connects."""
    argv = _common.split_command(args, add_launch_options)
    if not argv:
        raise UserError("give the command after --, e.g. eaglewatch job launch --hosts h1,h2 -- eaglewatch extract …")
    if (args.hosts is None) == (args.slurm is None):
        raise UserError("say where the ranks run: --hosts H1,H2,... or --slurm TARGET --ranks N")
    if args.hosts is not None and args.ranks is not None and args.ranks != len(hosts_of(args.hosts)):
        raise UserError(f"--ranks {args.ranks} does not match the {len(hosts_of(args.hosts))} hosts of --hosts "
                        "(one rank per host)")
    if args.slurm is not None and args.ranks is None:
        raise UserError("--slurm needs --ranks N")
    return argv, _common.parse_env(args.env)


def slurm_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"partition": args.partition, "account": args.account, "time": args.time,
            "gpus_per_task": args.gpus_per_task, "cpus_per_task": args.cpus_per_task, "mem": args.mem,
            "extra": list(args.sbatch_arg)}


def start(pool: HostPool, store: JobStore, args: argparse.Namespace, argv: list[str], env: dict[str, str]
          ) -> Record:
    """Launch the job; its id (or, with --json, its record) goes to stdout, each rank's run to stderr."""
    def say(line: str) -> None:
        print(f"eaglewatch: {line}", file=sys.stderr)

    if args.hosts is not None:
        record = launch_ssh(pool, store, hosts_of(args.hosts), argv, cwd=args.cwd, env=env, name=args.name,
                            installed=bool(args.installed), say=say)
    else:
        record = launch_slurm(pool, store, args.slurm, int(args.ranks), argv, cwd=args.cwd, env=env,
                              name=args.name, installed=bool(args.installed), slurm=slurm_options(args))
        if record.get("submit_note"):  # sbatch did not confirm the submission; squeue did (docs/slurm.md)
            say(safe_text(record["submit_note"]))
        say(f"submitted {safe_text(record.get('scheduler_job_id') or record['job'])} through "
            f"{safe_text(args.slurm)} ({record.get('world_size')} ranks)")
    if args.json:
        print(json.dumps(record, ensure_ascii=True))
    else:
        print(safe_text(record["job"]))
    sys.stdout.flush()
    return record


def failed_launches(record: Record) -> list[int]:
    return [entry["rank"] for entry in record["ranks"] if entry.get("error") and not entry.get("run")]


# ---------------------------------------------------------------------- reading

def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def rows_of(snapshot: dict[str, Any]) -> FleetView:
    """The job's rows as the fleet view has them, from the snapshot alone (no run's log is read)."""
    fleet = FleetModel()
    fleet.set_snapshot(snapshot)
    return fleet.snapshot()


def _row_line(row: RankRow) -> str:
    result = row.root_cause or row.end_text or ("" if row.reason is None else f"({row.reason})")
    return (f"{row.rank:<5} {_clip(safe_text(row.where), 16):<16} {_clip(safe_text(row.state), 12):<12} "
            f"{_clip(safe_text(row.phase), 10):<10} {_clip(safe_text(result), 40):<40} {safe_text(row.run or '—')}")


def print_status(view: FleetView) -> None:
    created = fmt_started(view.created_at, "%m-%d %H:%M") if view.created_at else "?"
    name = f"  name: {safe_text(view.name)}" if view.name else ""
    sched = f" job {safe_text(view.scheduler_job_id)}" if view.scheduler_job_id else ""
    print(f"job {safe_text(view.job)} ({safe_text(view.scheduler)}{sched} on {safe_text(view.target)}, "
          f"{view.world_size} ranks, created {created}): {view.state}{name}")
    counts = ", ".join(f"{n} {outcome}" for outcome, n in view.counts)
    if counts:
        print(f"  {counts}" + (f"; output {safe_text(view.output_dir)}" if view.output_dir else ""))
    print(f"{'RANK':<5} {'HOST/NODE':<16} {'STATE':<12} {'PHASE':<10} {'RESULT':<40} RUN")
    for row in view.rows:
        print(_row_line(row))


def _list_line(record: Record) -> str:
    created = fmt_started(record.get("created_at"), "%m-%d %H:%M")
    return (f"{_clip(safe_text(record.get('job')), 40):<40} {safe_text(record.get('scheduler')):<6} "
            f"{safe_text(record.get('world_size')):>5}  {_clip(safe_text(record.get('target')), 30):<30} "
            f"{created:<12} {_clip(safe_text(record.get('name')), 30)}")


def run_list(args: argparse.Namespace, store: JobStore) -> int:
    problems: list[str] = []
    if args.slurm is not None:
        pool = HostPool(args)
        try:
            records = _common.agent_call(pool.get(args.slurm).jobs)
        finally:
            pool.close()
    else:
        records, problems = store.all()
    for problem in problems:
        print(f"eaglewatch job list: {problem}", file=sys.stderr)
    if args.json:
        for record in records:
            print(json.dumps(record, ensure_ascii=True))
        return 0
    if not records:
        print("no jobs")
        return 0
    print(f"{'JOB':<40} {'SCHED':<6} {'RANKS':>5}  {'WHERE':<30} {'CREATED':<12} NAME")
    for record in records:
        print(_list_line(record))
    return 0


# ---------------------------------------------------------------------- the entry point

def open_ops(args: argparse.Namespace, store: JobStore, interactive: bool = True) -> tuple[JobOps, HostPool]:
    pool = HostPool(args, interactive=interactive)
    try:
        return open_job(pool, store, args.job, args.slurm), pool
    except BaseException:
        pool.close()
        raise


def run_action(args: argparse.Namespace, store: Optional[JobStore] = None) -> int:
    """Every action but ``watch``, which is the dashboard's."""
    store = store or JobStore()
    if args.action == "launch":
        argv, env = launch_request(args)
        pool = HostPool(args)
        try:
            record = start(pool, store, args, argv, env)
        finally:
            pool.close()
        failed = failed_launches(record)
        if failed:
            ranks = ", ".join(map(str, failed))
            print(f"eaglewatch: rank(s) {ranks} did not start; once fixed: "
                  f"{_common.hint_command('job', 'restart', record['job'])} RANK "
                  f"(or {_common.hint_command('job', 'cancel', record['job'])})", file=sys.stderr)
            return 1
        return 0
    if args.action == "list":
        return run_list(args, store)
    if args.action == "watch":
        raise UserError(f"the fleet view needs a terminal; without one use `{_common.command_prefix()} job status JOB`")
    ops, pool = open_ops(args, store)
    try:
        if args.action == "status":
            snapshot = ops.snapshot()
            if args.json:
                print(json.dumps(snapshot, ensure_ascii=True))
            else:
                print_status(rows_of(snapshot))
            return 0
        if args.action == "cancel":
            snapshot = ops.cancel()
            print(f"eaglewatch: cancelled job {safe_text(ops.job)}", file=sys.stderr)
            print_status(rows_of(snapshot))
            return 0
        if args.action == "restart":
            started = ops.restart_rank(args.rank)
            if ops.scheduler == SSH:
                print(safe_text(started.get("run")))
                print(f"eaglewatch: rank {args.rank} of {safe_text(ops.job)} runs again as "
                      f"{safe_text(started.get('run'))} on {safe_text(ops.host_of(ops.entry(args.rank)))}",
                      file=sys.stderr)
            else:
                print(f"eaglewatch: rank {args.rank} of {safe_text(ops.job)} resubmitted", file=sys.stderr)
                print_status(rows_of(dict(started)))
            return 0
    finally:
        pool.close()
    raise UserError(f"unknown action {args.action!r} (one of {', '.join(ACTIONS)})")


def run(args: argparse.Namespace) -> int:
    return run_action(args)

